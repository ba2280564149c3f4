"""deploy/ renders, validates offline, and wires together the way the server and CAPI need.

Every kustomization is rendered with `kubectl kustomize`; every object it yields and every plain
manifest is validated against Kubernetes' own JSON schemas (kubernetes-validate, strict) or the CRD
schemas in deploy/schemas/. Then the facts that schemas cannot see: names that must agree across
objects, ports, mounts, security contexts, and what each overlay changes.
"""

from __future__ import annotations

import copy
import pathlib
import re
import subprocess
from urllib.parse import urlparse

import pytest
import yaml

import deploylib as d

NAMESPACE = "inplace-updater-system"
SERVICE = "inplace-updater-webhook-service"
EXTENSION_CONFIG = "inplace-updater"
CERT_MOUNT = "/tmp/k8s-webhook-server/serving-certs"

KUSTOMIZATIONS = [p for p in d.kustomization_dirs() if not d.is_component(p)]
COMPONENTS = [p for p in d.kustomization_dirs() if d.is_component(p)]
# Renders that install the server on a management cluster (deploy/node targets workload clusters).
SERVER_RENDERS = [p for p in KUSTOMIZATIONS if p not in (d.DEPLOY / "node", d.DEPLOY / "extension")]


def rel(p: pathlib.Path) -> str:
    return str(p.relative_to(d.REPO))


@pytest.fixture(scope="module")
def rendered() -> dict[pathlib.Path, list[dict]]:
    return {p: d.render(p) for p in KUSTOMIZATIONS}


server_deployment = d.server_deployment
env_of = d.env_of


# ---------------------------------------------------------------- rendering and schemas


def test_kubectl_is_a_current_release():
    out = subprocess.run([d.kubectl(), "version", "--client", "-o", "json"], capture_output=True, text=True, check=True)
    info = yaml.safe_load(out.stdout)
    minor = int(re.match(r"\d+", info["clientVersion"]["minor"]).group())
    assert minor >= 30, f"kubectl {info['clientVersion']['gitVersion']} is too old for these kustomizations"
    assert info["kustomizeVersion"].startswith("v5"), info["kustomizeVersion"]


def test_the_expected_kustomizations_exist():
    names = {rel(p) for p in KUSTOMIZATIONS}
    for expected in ["deploy", "deploy/base", "deploy/overlays/ha-etcd", "deploy/node"]:
        assert expected in names, f"{expected} has no kustomization.yaml"


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=rel)
def test_every_rendered_object_validates(rendered, directory):
    objs = rendered[directory]
    assert objs, f"{rel(directory)} rendered nothing"
    errors = [e for o in objs for e in d.validation_errors(o)]
    assert not errors, "\n".join(errors)


def test_every_component_is_used_by_a_rendered_overlay():
    used = set()
    for p in KUSTOMIZATIONS:
        used |= {x for x in d.referenced_files(p)["dirs"]}
    for c in COMPONENTS:
        assert c.resolve() in used, f"component {rel(c)} is rendered by no overlay, so nothing validates it"


def plain_manifests() -> list[pathlib.Path]:
    """YAML under deploy/ that no kustomization references: each must be a complete, valid manifest."""
    referenced: set[pathlib.Path] = set()
    for p in d.kustomization_dirs():
        refs = d.referenced_files(p)
        referenced |= refs["resources"] | refs["patches"] | refs["inputs"]
    files = [f for f in sorted(d.DEPLOY.rglob("*.y*ml")) if f.name not in d.KUSTOMIZATION_FILES]
    # clusterctl's files hold ${VAR} placeholders (components) or are no Kubernetes object (metadata):
    # test_clusterctl.py validates them after clusterctl's substitution.
    files = [f for f in files if f.resolve() not in d.CLUSTERCTL_FILES]
    return [f for f in files if f.resolve() not in referenced]


def test_plain_manifests_are_the_bootstrap_snippets_and_the_secret_examples():
    names = {rel(p) for p in plain_manifests()}
    assert names == {
        "deploy/node/kubeadmconfigtemplate.yaml", "deploy/node/kubeadmcontrolplane.yaml",
        "deploy/examples/agent-tokens-secret.yaml", "deploy/examples/agent-credentials-secret.yaml",
    }, names


def test_the_token_secret_example_is_what_the_server_mounts(rendered):
    secret = d.load_yaml_docs(d.DEPLOY / "examples" / "agent-tokens-secret.yaml")[0]
    for directory in SERVER_RENDERS:
        dep, server = server_deployment(rendered[directory])
        tokens_path = pathlib.PurePath(env_of(server)["INPLACE_UPDATER_AGENT_TOKENS"])
        mount = next(m for m in server["volumeMounts"] if pathlib.PurePath(m["mountPath"]) == tokens_path.parent)
        volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        assert (secret["metadata"]["namespace"], secret["metadata"]["name"]) == (NAMESPACE, volume["secret"]["secretName"])
        assert set(secret["stringData"]) == {tokens_path.name}
    lines = [l for l in secret["stringData"]["tokens"].splitlines() if l.strip() and not l.lstrip().startswith("#")]
    assert lines and all(d.TOKEN_LINE.fullmatch(l) for l in lines), lines
    assert all(re.search(r"sha256:0{64} ", l) for l in lines), "an example must not hold a real token's hash"


def test_the_credentials_secret_example_is_what_the_bootstrap_snippets_read():
    secret = d.load_yaml_docs(d.DEPLOY / "examples" / "agent-credentials-secret.yaml")[0]
    for name, spec_of in (("kubeadmconfigtemplate.yaml", lambda o: o["spec"]["template"]["spec"]),
                          ("kubeadmcontrolplane.yaml", lambda o: o["spec"]["kubeadmConfigSpec"])):
        snippet = d.load_yaml_docs(d.DEPLOY / "node" / name)[0]
        refs = [f["contentFrom"]["secret"] for f in spec_of(snippet)["files"] if "contentFrom" in f]
        assert {r["name"] for r in refs} == {secret["metadata"]["name"]}, name
        assert snippet["metadata"]["namespace"] == secret["metadata"]["namespace"], "contentFrom reads the Cluster's namespace"
        assert {r["key"] for r in refs} == set(secret["stringData"]) == {"token", "ca.crt"}
    assert "clusterctl.cluster.x-k8s.io/move" in secret["metadata"]["labels"]
    assert not secret["stringData"]["token"].startswith("iu1_"), "an example must not hold a token"


@pytest.mark.parametrize("path", plain_manifests(), ids=rel)
def test_every_plain_manifest_validates(path):
    docs = d.load_yaml_docs(path)
    assert docs, f"{rel(path)} is empty"
    errors = [e for o in docs for e in d.validation_errors(o)]
    assert not errors, "\n".join(errors)


def test_every_crd_schema_is_exercised(rendered):
    kinds = {(o["apiVersion"], o["kind"]) for objs in rendered.values() for o in objs}
    kinds |= {(o["apiVersion"], o["kind"]) for p in plain_manifests() for o in d.load_yaml_docs(p)}
    assert d.crd_kinds() <= kinds, f"schemas never used: {d.crd_kinds() - kinds}"


# ---------------------------------------------------------------- the validators can fail


@pytest.mark.parametrize(
    "kind,name,breakage,expected",
    [
        pytest.param("Deployment", "inplace-updater", lambda o: o["spec"].__setitem__("replicas", "two"),
                     "is not of type", id="deployment-replicas-not-a-number"),
        pytest.param("Deployment", "inplace-updater", lambda o: o["spec"].__setitem__("replica", 1),
                     "'replica' was unexpected", id="deployment-misspelt-field"),
        pytest.param("Service", SERVICE, lambda o: o["spec"]["ports"][0].pop("port"),
                     "'port' is a required property", id="service-port-missing"),
        pytest.param("ExtensionConfig", EXTENSION_CONFIG, lambda o: o["metadata"].__setitem__("namespace", NAMESPACE),
                     "metadata", id="extensionconfig-namespaced"),
        pytest.param("ExtensionConfig", EXTENSION_CONFIG, lambda o: o["spec"].pop("clientConfig"),
                     "'clientConfig' is a required", id="extensionconfig-no-client-config"),
        pytest.param("ExtensionConfig", EXTENSION_CONFIG, lambda o: o["spec"]["clientConfig"].__setitem__("url", "http://x"),
                     "clientConfig", id="extensionconfig-url-and-service-plain-http"),
        pytest.param("ExtensionConfig", EXTENSION_CONFIG, lambda o: o["metadata"].__setitem__("name", "In.Place"),
                     "does not match", id="extensionconfig-name-not-dns-label"),
        pytest.param("Certificate", "inplace-updater-serving-cert", lambda o: o["spec"].pop("issuerRef"),
                     "'issuerRef' is a required", id="certificate-no-issuer"),
        pytest.param("Certificate", "inplace-updater-serving-cert", lambda o: o["spec"].__setitem__("duration", "90 days"),
                     "does not match", id="certificate-duration-not-go-syntax"),
        pytest.param("Issuer", "inplace-updater-ca-issuer", lambda o: o["spec"].__setitem__("selfSigned", {}),
                     "spec", id="issuer-two-kinds-at-once"),
    ],
)
def test_a_broken_object_is_rejected(rendered, kind, name, breakage, expected):
    obj = copy.deepcopy(d.one(rendered[d.DEPLOY], kind, name))
    assert d.validation_errors(obj) == []
    breakage(obj)
    errors = d.validation_errors(obj)
    assert errors, f"broken {kind} passed validation"
    assert any(expected in e for e in errors), errors


def test_a_broken_bootstrap_file_entry_is_rejected():
    snippet = d.load_yaml_docs(d.DEPLOY / "node" / "kubeadmconfigtemplate.yaml")[0]
    files = snippet["spec"]["template"]["spec"]["files"]
    files[0]["content"] = "inline and from a secret at once"
    assert any("files.0" in e for e in d.validation_errors(snippet))
    files[0].pop("content")
    files[0]["permissions"] = 600
    assert any("is not of type 'string'" in e for e in d.validation_errors(snippet))


def test_an_unknown_kind_is_an_error_not_a_pass():
    errors = d.validation_errors({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    assert errors and "no schema" in errors[0]


def test_a_broken_kustomization_is_refused(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - missing.yaml\n")
    with pytest.raises(d.RenderError, match="missing.yaml"):
        d.render(tmp_path)


# ---------------------------------------------------------------- the default install wires together


def test_extension_config_points_at_the_service_and_its_certificate(rendered):
    objs = rendered[d.DEPLOY]
    ext = d.one(objs, "ExtensionConfig", EXTENSION_CONFIG)
    assert "namespace" not in ext["metadata"], "ExtensionConfig is cluster-scoped"
    svc_ref = ext["spec"]["clientConfig"]["service"]
    assert (svc_ref["namespace"], svc_ref["name"]) == (NAMESPACE, SERVICE)
    svc = d.one(objs, "Service", SERVICE)
    assert svc["metadata"]["namespace"] == NAMESPACE
    port = next(p for p in svc["spec"]["ports"] if p["port"] == svc_ref.get("port", 443))
    _, server = server_deployment(objs)
    assert d.container_port(server, port["targetPort"]) == 9443
    assert env_of(server)["INPLACE_UPDATER_LISTEN"].endswith(":9443")

    cert = d.one(objs, "Certificate", "inplace-updater-serving-cert")
    inject = ext["metadata"]["annotations"]["runtime.cluster.x-k8s.io/inject-ca-from-secret"]
    assert inject == f"{NAMESPACE}/{cert['spec']['secretName']}"
    assert f"{SERVICE}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert f"{SERVICE}.{NAMESPACE}.svc.cluster.local" in cert["spec"]["dnsNames"]
    assert "caBundle" not in ext["spec"]["clientConfig"], "CAPI injects it; a stale one would be kept"
    assert ext["spec"].get("namespaceSelector") is not None


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=rel)
def test_extension_config_settings_are_real_keys_and_values(rendered, directory):
    # The server answers Failure to every hook call whose settings hold an unknown key or value.
    for ext in d.find(rendered[directory], "ExtensionConfig"):
        settings = ext["spec"].get("settings", {})
        unknown = sorted(set(settings) - set(d.SETTINGS))
        assert not unknown, f"{d.describe(ext)}: unknown settings {unknown} (known: {sorted(d.SETTINGS)})"
        for key, value in settings.items():
            assert isinstance(value, str), f"settings.{key}: ExtensionConfig settings are strings"
            assert d.SETTINGS[key].fullmatch(value), f"settings.{key}: {value!r} is not a value the server accepts"


def test_the_settings_check_can_fail():
    assert not d.SETTINGS["mode"].fullmatch("in-place")
    assert not d.SETTINGS["disableActions"].fullmatch("files,kernel")
    assert d.SETTINGS["disableActions"].fullmatch("files, ssh-keys")
    assert "inplace" not in d.SETTINGS, "keys are case-sensitive"


# Every INPLACE_UPDATER_* name anywhere in deploy/ (manifests, env file, scripts, unit, comments) and in
# docs/install.md: an operator who copies one must get a setting that exists.
SETTING_NAME = re.compile(r"\bINPLACE_UPDATER_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")


def text_files() -> list[pathlib.Path]:
    files = [p for p in sorted(d.DEPLOY.rglob("*")) if p.is_file() and p.suffix != ".json"]
    return files + [d.REPO / "docs" / "install.md"]


@pytest.mark.parametrize("path", text_files(), ids=rel)
def test_every_setting_name_in_deploy_and_docs_is_real(path):
    known = d.SERVE_ENV | d.SERVE_ENV_ONLY | d.AGENT_ENV | d.AGENT_ENV_DEPRECATED | set(d.clusterctl_variables())
    unknown = sorted(set(SETTING_NAME.findall(path.read_text())) - known)
    assert not unknown, f"{rel(path)} names settings the binary does not have: {unknown}"


def test_the_setting_name_check_can_fail():
    assert SETTING_NAME.findall("INPLACE_UPDATER_SERVER=x, INPLACE_UPDATER_AGENT_* and INPLACE_UPDATER_*") == [
        "INPLACE_UPDATER_SERVER"
    ]


def test_certificate_issuers_form_a_chain(rendered):
    objs = rendered[d.DEPLOY]
    issuers = {i["metadata"]["name"]: i for i in d.find(objs, "Issuer")}
    certs = {c["spec"]["secretName"]: c for c in d.find(objs, "Certificate")}
    for cert in certs.values():
        assert cert["spec"]["issuerRef"]["name"] in issuers, f"{cert['metadata']['name']}: issuer missing"
    for issuer in issuers.values():
        if "ca" in issuer["spec"]:
            ca_cert = certs.get(issuer["spec"]["ca"]["secretName"])
            assert ca_cert is not None and ca_cert["spec"].get("isCA") is True
    serving = d.one(objs, "Certificate", "inplace-updater-serving-cert")
    assert "ca" in issuers[serving["spec"]["issuerRef"]["name"]]["spec"], "serving cert must come from the CA"


@pytest.mark.parametrize("directory", SERVER_RENDERS, ids=rel)
def test_server_mounts_and_env_agree(rendered, directory):
    objs = rendered[directory]
    dep, server = server_deployment(objs)
    env = env_of(server)
    assert len(env) == len(server["env"]), "duplicate env names"
    known = d.SERVE_ENV | d.SERVE_ENV_ONLY
    assert set(env) <= known, f"not `serve` settings: {sorted(set(env) - known)}"
    pod = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    for m in mounts.values():
        assert m["name"] in volumes, f"mount of unknown volume {m['name']}"

    def mount_for(path: str) -> dict:
        best = [m for p, m in mounts.items() if path == p or path.startswith(p.rstrip("/") + "/")]
        assert best, f"{path} is on no volume (root filesystem is read-only)"
        return max(best, key=lambda m: len(m["mountPath"]))

    cert_mount = mounts[CERT_MOUNT]
    cert = d.one(objs, "Certificate", "inplace-updater-serving-cert")
    assert volumes[cert_mount["name"]]["secret"]["secretName"] == cert["spec"]["secretName"]
    for key in ("INPLACE_UPDATER_TLS_CERT", "INPLACE_UPDATER_TLS_KEY"):
        assert mount_for(env[key]) is cert_mount
    policy_cm = volumes[mount_for(env["INPLACE_UPDATER_POLICY"])["name"]]["configMap"]["name"]
    cm = d.one(objs, "ConfigMap", policy_cm)
    assert pathlib.PurePath(env["INPLACE_UPDATER_POLICY"]).name in cm["data"]
    assert "secret" in volumes[mount_for(env["INPLACE_UPDATER_AGENT_TOKENS"])["name"]]

    store = env["INPLACE_UPDATER_STORE"]
    if store.startswith("file:"):
        m = mount_for(store.removeprefix("file:"))
        assert not m.get("readOnly"), "the embedded store needs a writable volume"
        claim = volumes[m["name"]]["persistentVolumeClaim"]["claimName"]
        if directory == d.CLUSTERCTL:
            # clusterctl upgrade deletes the provider's objects: the claim is created outside it
            # (docs/install.md, "Installing with clusterctl"), from deploy/base/store-pvc.yaml.
            assert not d.find(objs, "PersistentVolumeClaim")
            assert d.load_yaml_docs(d.DEPLOY / "base" / "store-pvc.yaml")[0]["metadata"]["name"] == claim
        else:
            d.one(objs, "PersistentVolumeClaim", claim)
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    else:
        assert store.startswith("etcd://")
        for key in ("INPLACE_UPDATER_ETCD_CA", "INPLACE_UPDATER_ETCD_CERT", "INPLACE_UPDATER_ETCD_KEY"):
            assert "secret" in volumes[mount_for(env[key])["name"]]
        assert not d.find(objs, "PersistentVolumeClaim")
        assert "store" not in volumes


@pytest.mark.parametrize("directory", SERVER_RENDERS, ids=rel)
def test_security_context_resources_and_probes(rendered, directory):
    dep, server = server_deployment(rendered[directory])
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    sc = server["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert not sc.get("privileged")
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(server["resources"][kind]), f"resources.{kind}"
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = server[probe]["httpGet"]
        assert get["path"] == path
        assert d.container_port(server, get["port"]) == 9440
        assert env_of(server)["INPLACE_UPDATER_HEALTH_LISTEN"].endswith(":9440")
    assert not re.search(r":latest$|^[^:]+$", server["image"]), f"untagged image {server['image']}"


@pytest.mark.parametrize("directory", SERVER_RENDERS, ids=rel)
def test_selectors_reach_the_server_pods(rendered, directory):
    objs = rendered[directory]
    dep, server = server_deployment(objs)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert d.labels_match(dep["spec"]["selector"], labels)
    for svc in d.find(objs, "Service"):
        assert d.labels_match({"matchLabels": svc["spec"]["selector"]}, labels), svc["metadata"]["name"]
        for port in svc["spec"]["ports"]:
            d.container_port(server, port["targetPort"])
    for pdb in d.find(objs, "PodDisruptionBudget"):
        assert d.labels_match(pdb["spec"]["selector"], labels)
    policies = d.find(objs, "NetworkPolicy")
    assert policies and all(d.labels_match(p["spec"]["podSelector"], labels) for p in policies)
    hook_rules = [r for p in policies for r in p["spec"].get("ingress", []) if any(x["port"] == 9443 for x in r["ports"])]
    assert hook_rules, "no NetworkPolicy lets CAPI reach the hook port"
    for sm in d.find(objs, "ServiceMonitor"):
        targets = [s for s in d.find(objs, "Service") if d.labels_match(sm["spec"]["selector"], s["metadata"].get("labels", {}))]
        assert targets, "ServiceMonitor selects no Service"
        for ep in sm["spec"]["endpoints"]:
            assert all(any(p.get("name") == ep["port"] for p in t["spec"]["ports"]) for t in targets)


# What the server may do on the management cluster (deploy/base/rbac.yaml): the remediation guard patches
# Machines' annotation after reading it, and Events are created and their series patched. Nothing else.
MANAGEMENT_GRANTS = {
    ("cluster.x-k8s.io", "machines"): ["get", "patch"],
    ("events.k8s.io", "events"): ["create", "patch"],
}


def test_rbac_is_least_privilege(rendered):
    for directory in SERVER_RENDERS:
        objs = rendered[directory]
        rbac = [o for o in objs if o["apiVersion"].startswith("rbac.authorization.k8s.io/")]
        assert sorted(o["kind"] for o in rbac) == ["ClusterRole", "ClusterRoleBinding"], d.describe(rbac)
        role = d.one(objs, "ClusterRole")
        grants = {(g, r): rule["verbs"] for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
        assert grants == MANAGEMENT_GRANTS
        assert all("*" not in rule["verbs"] and not rule.get("resourceNames") for rule in role["rules"])
        binding = d.one(objs, "ClusterRoleBinding")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}
        sa = d.one(objs, "ServiceAccount", "inplace-updater")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "inplace-updater", "namespace": sa["metadata"]["namespace"]}]
        # The token reaches the server's Pod only (not every Pod naming the ServiceAccount), and the server uses it.
        assert sa["automountServiceAccountToken"] is False
        dep, server = server_deployment(objs)
        assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
        assert env_of(server)["INPLACE_UPDATER_MANAGEMENT_IN_CLUSTER"] == "true"


def test_ha_overlay_runs_two_replicas_on_etcd(rendered):
    objs = rendered[d.DEPLOY / "overlays" / "ha-etcd"]
    dep, server = server_deployment(objs)
    assert dep["spec"]["replicas"] >= 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    hosts = env_of(server)["INPLACE_UPDATER_STORE"].removeprefix("etcd://").split(",")
    assert all(re.fullmatch(r"[a-z0-9.-]+:\d+", h) for h in hosts), hosts
    assert d.one(objs, "PodDisruptionBudget")["spec"] == {
        "minAvailable": 1, "selector": dep["spec"]["selector"],
    }
    egress = [r for p in d.find(objs, "NetworkPolicy") for r in p["spec"].get("egress", [])]
    assert any(x["port"] == 2379 for r in egress for x in r.get("ports", []))
    spread = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert any(c["topologyKey"] == "kubernetes.io/hostname" for c in spread)


@pytest.mark.parametrize("component", ["agent-loadbalancer", "agent-nodeport"])
def test_agent_access_overlays_expose_the_tls_port_under_a_certified_name(rendered, component):
    objs = rendered[d.DEPLOY / "overlays" / component]
    svc = d.one(objs, "Service", "inplace-updater-agent")
    assert svc["spec"]["type"] in ("LoadBalancer", "NodePort")
    _, server = server_deployment(objs)
    assert [d.container_port(server, p["targetPort"]) for p in svc["spec"]["ports"]] == [9443]
    assert d.one(objs, "Service", SERVICE)["spec"]["type"] == "ClusterIP", "the base Service stays ClusterIP"
    names = d.one(objs, "Certificate", "inplace-updater-serving-cert")["spec"]["dnsNames"]
    agent_env, _ = d.read_env_file(d.DEPLOY / "node" / "agent.env")
    server_url = urlparse(agent_env["INPLACE_UPDATER_AGENT_SERVER"])
    assert server_url.scheme == "https" and server_url.hostname in names, "agents would fail the TLS name check"
    if svc["spec"]["type"] == "LoadBalancer":
        # agent.env's URL is the LoadBalancer's (the NodePort one adds :<nodePort>, as its comment says).
        assert (server_url.port or 443) in [p["port"] for p in svc["spec"]["ports"]]
    else:
        assert all(p["nodePort"] == 30443 for p in svc["spec"]["ports"]), "agent.env's comment names :30443"
    ingress = [r for p in d.find(objs, "NetworkPolicy") for r in p["spec"].get("ingress", [])]
    assert any("ipBlock" in f for r in ingress for f in r.get("from", [])), "agent traffic is not admitted"


def test_policy_configmap_is_the_shipped_policy(rendered):
    # The offline half; test_binary.py has the binary check the policy for real.
    cm = next(c for c in d.find(rendered[d.DEPLOY], "ConfigMap") if c["metadata"]["name"].startswith("inplace-updater-policy"))
    assert cm["data"]["policy.yaml"] == (d.DEPLOY / "base" / "policy.yaml").read_text()
    rules = yaml.safe_load(cm["data"]["policy.yaml"])["rules"]
    assert rules and all({"name", "objects", "paths"} <= set(r) for r in rules)
    assert all(("action" in r) + ("accept" in r) + ("reject" in r) == 1 for r in rules), "one verdict per rule"
    assert len({r["name"] for r in rules}) == len(rules), "rule names must be unique"
    assert any(r.get("action") == "kubernetes-version" for r in rules)


def test_image_tag_follows_the_crate_version():
    cargo = (d.REPO / "Cargo.toml").read_text()
    version = re.search(r'^\[workspace\.package\][^\[]*?^version = "([^"]+)"', cargo, re.M | re.S).group(1)
    for k in (d.DEPLOY / "base", d.DEPLOY / "node"):
        for image in d.kustomization(k)["images"]:
            assert image["newTag"] == f"v{version}", f"{rel(k)}: {image['name']} tag vs Cargo version {version}"


def test_docs_reference_existing_paths():
    text = (d.REPO / "docs" / "install.md").read_text()
    paths = set(re.findall(r"\b(deploy/[A-Za-z0-9_./-]*[A-Za-z0-9_-])", text))
    assert paths, "docs/install.md names no deploy/ path"
    missing = sorted(p for p in paths if not (d.REPO / p).exists())
    assert not missing, f"docs/install.md names paths that do not exist: {missing}"
