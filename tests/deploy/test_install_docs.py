"""What docs/install.md and docs/operations.md promise about the install, checked against deploy/ and the code.

Each test holds one claim a reviewer following only the docs relies on: the image is built and pointed at
before anything is applied, the Pod schedules on a control-plane-only management cluster and reports start-up
errors, its memory limit is the documented formula, the token Secret may be absent, the namespace label the
docs apply is the one the ExtensionConfig selects, and the limits of `mode: in-place-only` name the settings
that matter with the numbers the code uses.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

import deploylib as d
from test_deploy import SERVER_RENDERS, rel

DOCS = (d.REPO / "docs" / "install.md").read_text()
OPERATIONS = (d.REPO / "docs" / "operations.md").read_text()
PERFORMANCE = (d.REPO / "docs" / "performance.md").read_text()


@pytest.fixture(scope="module")
def rendered() -> dict:
    return {p: d.render(p) for p in SERVER_RENDERS}


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi)", quantity)
    assert m, f"not a binary memory quantity: {quantity}"
    return float(m.group(1)) * units[m.group(2)]


@pytest.mark.parametrize("directory", SERVER_RENDERS, ids=rel)
def test_the_pod_schedules_on_control_plane_nodes_and_reports_start_errors(rendered, directory):
    dep, manager = d.server_deployment(rendered[directory])
    tolerations = dep["spec"]["template"]["spec"]["tolerations"]
    for key in ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"):
        assert {"key": key, "effect": "NoSchedule"} in tolerations, f"no toleration for {key}"
    assert manager["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_memory_limit_is_the_documented_formula(rendered):
    memory = DOCS.split("### Memory", 1)[1].split("\n## ", 1)[0]
    base, per_agent = (float(x) for x in re.search(r"limit = (\d+) MiB \+ (\d+) KiB × agents", memory).groups())
    agents = int(re.search(r"for \*\*([\d ]+) agents\*\*", memory).group(1).replace(" ", ""))
    formula = base + per_agent * agents / 1024
    for directory, objs in rendered.items():
        limit = mebibytes(d.server_deployment(objs)[1]["resources"]["limits"]["memory"])
        assert formula <= limit < formula + 32, f"{rel(directory)}: {limit} MiB for the formula's {formula:.1f} MiB"
    # The per-agent figure covers every per-agent measurement the install and performance pages quote.
    quoted = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?) KiB per\s+(?:connected\s+)?agent", memory + PERFORMANCE)]
    assert quoted and max(quoted) <= per_agent, f"{per_agent} KiB per agent is below a measurement: {quoted}"
    worked = re.search(r"(\d+) agents: 64 MiB \+ 48 KiB × \1 = (\d+) MiB", memory.replace("\u202f", " ").replace(" 000", "000"))
    assert worked and round(base + per_agent * int(worked.group(1)) / 1024) == int(worked.group(2)), "the worked example"


def test_the_token_secret_is_optional_and_the_docs_say_what_happens_without_it(rendered):
    for directory, objs in rendered.items():
        dep, _ = d.server_deployment(objs)
        volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v.get("secret", {}).get("secretName") == "inplace-updater-agent-tokens")
        assert volume["secret"]["optional"] is True, rel(directory)
    for text in (DOCS, OPERATIONS):
        assert "no agent tokens: no agent can authenticate" in text


def test_the_namespace_the_docs_label_is_the_one_the_extension_config_selects():
    ext = d.one(d.render(d.DEPLOY / "extension"), "ExtensionConfig")
    selector = ext["spec"]["namespaceSelector"]
    (key, value), = re.findall(r"kubectl label namespace \S+ ([\w./-]+)=(\S+)", d.docs_block("kubectl label namespace"))
    assert d.labels_match(selector, {key: value}), f"{key}={value} does not match {selector}"
    assert not d.labels_match(selector, {}), "an unlabelled namespace must not be selected"
    assert f"kubectl label namespace NAMESPACE {key}={value}" in OPERATIONS, "the status hint names the same label"


def test_the_image_is_built_and_chosen_before_anything_is_applied(tmp_path):
    assert DOCS.index("docker push") < DOCS.index("kubectl apply -k"), "build and push come first"
    # The docs' override, run: a kustomization next to deploy/ that names the pushed image.
    (tmp_path / "deploy").symlink_to(d.DEPLOY)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "kubectl").symlink_to(d.kubectl())
    image = "registry.example.com:5000/platform/inplace-updater:v0.1.0"
    proc = subprocess.run(["sh", "-eu", "-c", d.docs_block("my-install/kustomization.yaml")], cwd=tmp_path,
                          env={"PATH": f"{bindir}:{os.environ['PATH']}", "IMAGE": image},
                          capture_output=True, text=True, timeout=d.KUSTOMIZE_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["image:", image], proc.stdout
    _, manager = d.server_deployment(d.render(tmp_path / "my-install"))
    assert manager["image"] == image


def test_the_in_place_only_limits_name_the_settings_and_bounds_the_code_uses():
    for claim in ("maxSurge: 0", "maxUnavailable", "24 hours", "cluster.x-k8s.io/paused",
                  "cluster.x-k8s.io/skip-remediation", "rollout.after", "preflight"):
        assert claim in OPERATIONS, claim
    # The MachineHealthCheck advice: timeouts longer than the longest step, as the step-kind table bounds it
    # (each kind's row has its timeout; osImage's is MAX_STEP_TIMEOUT_SECONDS, the advice's own subject).
    kinds = (d.REPO / "crates" / "agent-api" / "src" / "kinds.rs").read_text()
    longest = max(int(n.replace("_", "")) for n in re.findall(r"timeout_seconds: ([\d_]+),", kinds))
    flat = " ".join(OPERATIONS.split())
    assert f"steps time out after {longest} s" in flat, "the docs name the longest step's timeout"
    advised = int(re.search(r"`timeoutSeconds: (\d+)`", OPERATIONS).group(1))
    assert advised > longest, f"the advised MHC timeout {advised} s is not longer than the longest step {longest} s"
    assert f"`kubeadm upgrade` {longest} s" in OPERATIONS, "the Bounds table has the same step timeout"


def test_the_mhc_example_is_a_valid_annotation_pair():
    lines = [l.strip() for l in OPERATIONS.splitlines() if "annotate machinehealthcheck" in l]
    assert len(lines) == 2 and lines[0].endswith('cluster.x-k8s.io/paused=""') and lines[1].endswith("cluster.x-k8s.io/paused-")
