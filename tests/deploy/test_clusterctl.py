"""deploy/clusterctl: the clusterctl RuntimeExtensionProvider `inplace-updater`, checked offline.

The components are processed as clusterctl processes them (cmd/clusterctl/client/repository/components.go):
variables substituted the way drone/envsubst does (`${VAR}`, `${VAR:=default}`; an unset variable without a
default is an error), the target namespace taken from the one Namespace object, then every object validated
strictly against the Kubernetes and CRD schemas and the references checked. The docs' local-repository
commands are run and the result checked against clusterctl's local repository rules (repository_local.go).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest
import yaml

import deploylib as d

COMPONENTS = d.CLUSTERCTL / "runtime-extension-components.yaml"
METADATA = d.CLUSTERCTL / "metadata.yaml"
PROVIDER_NAME = "inplace-updater"
# clusterctl's ManifestLabel(name, RuntimeExtensionProvider).
PROVIDER_LABEL = f"runtime-extension-{PROVIDER_NAME}"
IMAGE = "registry.example.com/platform/inplace-updater:v0.1.0"
# Kinds clusterctl treats as cluster-scoped (cmd/clusterctl/internal/util/objs.go IsResourceNamespaced); it
# sets the target namespace on every other object.
CLUSTER_SCOPED = {
    "Namespace", "Node", "PersistentVolume", "PodSecurityPolicy", "CertificateSigningRequest", "ClusterRoleBinding",
    "ClusterRole", "VolumeAttachment", "StorageClass", "CSIDriver", "CSINode", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "CustomResourceDefinition", "PriorityClass", "RuntimeClass",
}
# drone/envsubst's forms that clusterctl documents: ${VAR}, ${VAR:=default}, ${VAR=default}, ${VAR:-default}.
VARIABLE = re.compile(r"\$\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:(:?[=-])([^}]*))?\}")


def crate_version() -> str:
    cargo = (d.REPO / "Cargo.toml").read_text()
    return re.search(r'^\[workspace\.package\][^\[]*?^version = "([^"]+)"', cargo, re.M | re.S).group(1)


def envsubst(text: str, env: dict[str, str]) -> str:
    """clusterctl's variable substitution; an unset variable without a default fails as clusterctl does."""
    missing = sorted({m.group(1) for m in VARIABLE.finditer(text) if m.group(2) is None and not env.get(m.group(1))})
    if missing:
        raise ValueError(f"value for variables [{', '.join(missing)}] is not set")
    return VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(3) or ""), text)


def install(env: dict[str, str]) -> tuple[str, list[dict]]:
    """What `clusterctl init` creates: (target namespace, objects), after its namespace and label fixes."""
    objs = [o for o in yaml.safe_load_all(envsubst(COMPONENTS.read_text(), env)) if o]
    namespaces = [o for o in objs if o["kind"] == "Namespace"]
    assert len(namespaces) == 1, "clusterctl wants exactly one Namespace object (its default target namespace)"
    target = namespaces[0]["metadata"]["name"]
    for o in objs:
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"].get("namespace", target) == target, d.describe(o)
    return target, objs


def test_the_components_are_what_deploy_renders_to():
    proc = subprocess.run(
        ["python3", str(d.CLUSTERCTL / "render.py"), "--check"], env={**os.environ, "KUBECTL": d.kubectl()},
        capture_output=True, text=True, timeout=d.KUSTOMIZE_TIMEOUT_S, check=False,
    )
    assert proc.returncode == 0, proc.stderr or proc.stdout


def test_the_renderer_refuses_a_value_that_moved():
    render = d.clusterctl_render_module()
    with pytest.raises(SystemExit, match="matched 0 times"):
        render.substitute("memory: 256Mi\n", r"^(\s*memory: )544Mi$", "x", 1)


def test_metadata_maps_this_release_series_to_the_v1beta2_contract():
    meta = yaml.safe_load(METADATA.read_text())
    # clusterctl v1.11+ validates exactly these (clusterctl provider contract, "Validation Rules").
    assert meta["apiVersion"] == "clusterctl.cluster.x-k8s.io/v1alpha3" and meta["kind"] == "Metadata"
    major, minor, _ = (int(x) for x in crate_version().split("."))
    series = {(s["major"], s["minor"]): s["contract"] for s in meta["releaseSeries"]}
    assert series.get((major, minor)) == "v1beta2", f"no release series {major}.{minor} with contract v1beta2: {series}"


def test_every_variable_is_known_and_documented():
    variables = d.clusterctl_variables()
    text = COMPONENTS.read_text()
    used = {}
    for m in VARIABLE.finditer(text):
        used.setdefault(m.group(1), set()).add(m.group(3))
    assert set(used) == set(variables), f"used {sorted(used)}, render.py declares {sorted(variables)}"
    docs = (d.REPO / "docs" / "install.md").read_text().split("## Installing with clusterctl", 1)[1]
    for name, (default, _) in variables.items():
        assert used[name] == {default}, f"{name}: defaults in the file {used[name]} vs render.py {default!r}"
        row = next((l for l in docs.splitlines() if l.startswith(f"| `{name}` |")), None)
        assert row, f"docs/install.md does not document the clusterctl variable {name}"
        assert (f"`{default}`" if default else "required") in row, row
        assert name not in d.SERVE_ENV | d.SERVE_ENV_ONLY | d.AGENT_ENV, f"{name} would read as a server setting"


def test_the_image_is_required():
    with pytest.raises(ValueError, match=r"\[INPLACE_UPDATER_IMAGE\] is not set"):
        install({})


@pytest.mark.parametrize("namespace", [None, "capi-inplace-updater"])
def test_clusterctl_installs_valid_objects_that_reference_each_other(namespace):
    env = {"INPLACE_UPDATER_IMAGE": IMAGE, **({"INPLACE_UPDATER_NAMESPACE": namespace} if namespace else {})}
    target, objs = install(env)
    assert target == (namespace or "inplace-updater-system")
    errors = [e for o in objs for e in d.validation_errors(o)]
    assert not errors, "\n".join(errors)
    for o in objs:
        assert o["metadata"]["labels"]["cluster.x-k8s.io/provider"] == PROVIDER_LABEL, d.describe(o)
    if namespace:
        assert "inplace-updater-system" not in yaml.safe_dump_all(objs), "a reference kept the default namespace"
    ext = d.one(objs, "ExtensionConfig", "inplace-updater")
    assert ext["spec"]["clientConfig"]["service"]["namespace"] == target
    cert = d.one(objs, "Certificate", "inplace-updater-serving-cert")
    inject = ext["metadata"]["annotations"]["runtime.cluster.x-k8s.io/inject-ca-from-secret"]
    assert inject == f"{target}/{cert['spec']['secretName']}"
    assert f"{ext['spec']['clientConfig']['service']['name']}.{target}.svc" in cert["spec"]["dnsNames"]
    dep, manager = d.server_deployment(objs)
    assert manager["name"] == "manager", "clusterctl waits for the container named manager"
    assert manager["image"] == IMAGE
    assert manager["resources"]["limits"]["memory"] == d.clusterctl_variables()["INPLACE_UPDATER_MEMORY_LIMIT"][0]
    assert not d.find(objs, "PersistentVolumeClaim"), "clusterctl upgrade would delete the store with it"


def test_the_docs_local_repository_is_one_clusterctl_reads(tmp_path):
    block = d.docs_block("runtime-extension-inplace-updater/$version")
    proc = subprocess.run(["sh", "-eu", "-c", block], cwd=d.REPO, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "IMAGE": IMAGE},
                          timeout=d.BINARY_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load((tmp_path / "inplace-updater-clusterctl" / "clusterctl.yaml").read_text())
    assert config["INPLACE_UPDATER_IMAGE"] == IMAGE
    (provider,) = config["providers"]
    assert (provider["name"], provider["type"]) == (PROVIDER_NAME, "RuntimeExtensionProvider")
    # repository_local.go: an absolute path {basepath}/{provider label}/{version}/{components file}.
    path = pathlib.Path(provider["url"].removeprefix("file://"))
    assert path.is_absolute() and path.is_file(), path
    assert path.parent.parent.name == PROVIDER_LABEL
    assert path.parent.name == f"v{crate_version()}", "the version folder is the release's semantic version"
    assert path.read_text() == COMPONENTS.read_text()
    assert (path.parent / "metadata.yaml").read_text() == METADATA.read_text()
    docs = (d.REPO / "docs" / "install.md").read_text()
    assert f"--runtime-extension {PROVIDER_NAME}\n" in docs, "the init line names the provider of the config"
    assert re.search(rf"upgrade apply .*\n\s+--runtime-extension {PROVIDER_NAME}:v\d+\.\d+\.\d+\n", docs)
