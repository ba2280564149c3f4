"""The shipped agent configs' kubeadm upgrade commands leave CoreDNS and kube-proxy to KubeadmControlPlane.

Each `kubeadmUpgradeApply` / `kubeadmUpgradeNode` command of deploy/node/agent.yaml and of every
crates/agent/config-examples/*.yaml is run as the agent runs it (argv, no shell, templates filled in) against a
stand-in `kubeadm` that accepts exactly the phases kubeadm v1.32+ lists in its `--help` (copied from kubeadm's
generated reference) and records every invocation; a phase or flag it does not know fails the command, as
kubeadm's own flag parsing does.
"""

from __future__ import annotations

import pathlib
import stat
import subprocess

import pytest
import yaml

import deploylib as d

CONFIGS = [d.DEPLOY / "node" / "agent.yaml", *sorted((d.REPO / "crates" / "agent" / "config-examples").glob("*.yaml"))]
VERSION = "v1.34.2"

# `kubeadm upgrade apply --help` / `kubeadm upgrade node --help`, the lines that differ between releases.
HELP = {
    ("apply", "new"): """The "apply [version]" command executes the following phases:
preflight        Run preflight checks before upgrade
control-plane    Upgrade the control plane
upload-config    Upload the kubeadm and kubelet configurations to ConfigMaps
kubelet-config   Upgrade the kubelet configuration for this node
bootstrap-token  Configures bootstrap token and cluster-info RBAC rules
addon            Upgrade the default kubeadm addons
  /coredns         Upgrade the CoreDNS addon
  /kube-proxy      Upgrade the kube-proxy addon
post-upgrade     Run post upgrade tasks
      --skip-phases strings   List of phases to be skipped
  -y, --yes                   Perform the upgrade and do not prompt for confirmation (non-interactive mode).
""",
    ("apply", "old"): """Upgrade your Kubernetes cluster to the specified version
  -f, --force   Force upgrading although some requirements might not be met.
  -y, --yes     Perform the upgrade and do not prompt for confirmation (non-interactive mode).
""",
    ("node", "new"): """The "node" command executes the following phases:
preflight       Run upgrade node pre-flight checks
control-plane   Upgrade the control plane instance deployed on this node, if any
kubelet-config  Upgrade the kubelet configuration for this node
addon           Upgrade the default kubeadm addons
  /coredns        Upgrade the CoreDNS addon
  /kube-proxy     Upgrade the kube-proxy addon
post-upgrade    Run post upgrade tasks
      --skip-phases strings   List of phases to be skipped
""",
    ("node", "old"): """The "node" command executes the following phases:
preflight       Run upgrade node pre-flight checks
control-plane   Upgrade the control plane instance deployed on this node, if any
kubelet-config  Upgrade the kubelet configuration for this node
      --skip-phases strings   List of phases to be skipped
""",
}

STAND_IN = """#!/bin/sh
# kubeadm stand-in: records every call; `--skip-phases P` must name phases of $FAKE_DIR/help-<subcommand>.
printf '%s\\n' "$*" >> "$FAKE_DIR/calls"
sub="$2"; shift 2
while [ $# -gt 0 ]; do
  if [ "$1" = --skip-phases ]; then
    grep -q -e '--skip-phases' "$FAKE_DIR/help-$sub" || { echo "unknown flag: --skip-phases" >&2; exit 1; }
    for phase in $(echo "$2" | tr , ' '); do
      leaf="${phase#*/}"
      grep -q -E "^ *(/)?$leaf " "$FAKE_DIR/help-$sub" || { echo "unknown phase $phase" >&2; exit 1; }
    done
    shift
  fi
  shift
done
"""


def commands(config: pathlib.Path, step: str) -> list[list[str]]:
    """The step's argv lists with the templates filled in as the agent fills them."""
    sequence = yaml.safe_load(config.read_text())["kubernetes"][step]["commands"]
    return [[a.replace("{{version}}", VERSION) for a in c["run"]] for c in sequence]


def run_step(tmp_path: pathlib.Path, config: pathlib.Path, step: str, kubeadm: str) -> tuple[int, list[str], str]:
    """Runs the step's commands with the stand-in kubeadm of release `kubeadm` ("new": v1.32+, "old": v1.31):
    the first failing exit status (0 when all succeed), the recorded calls and the last stderr."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "kubeadm"
    fake.write_text(STAND_IN)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for sub in ("apply", "node"):
        (tmp_path / f"help-{sub}").write_text(HELP[(sub, kubeadm)])
    (tmp_path / "calls").unlink(missing_ok=True)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "FAKE_DIR": str(tmp_path)}
    status, stderr = 0, ""
    for argv in commands(config, step):
        assert argv[0] == "kubeadm", f"{config}: {argv} is not a plain kubeadm argv (the agent never runs a shell)"
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=d.BINARY_TIMEOUT_S, check=False)
        stderr = proc.stderr
        if proc.returncode != 0:
            status = proc.returncode
            break
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return status, calls, stderr


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(d.REPO)))
def test_upgrade_apply_skips_the_addon_phases(tmp_path, config):
    status, calls, stderr = run_step(tmp_path, config, "kubeadmUpgradeApply", "new")
    assert status == 0, stderr
    assert calls == [f"upgrade apply {VERSION} --yes --skip-phases addon/coredns,addon/kube-proxy"]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(d.REPO)))
def test_upgrade_node_skips_the_addon_phase(tmp_path, config):
    status, calls, stderr = run_step(tmp_path, config, "kubeadmUpgradeNode", "new")
    assert status == 0, stderr
    assert calls == ["upgrade node --skip-phases addon"]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(d.REPO)))
def test_a_target_older_than_v1_32_fails_the_step_loudly_as_documented(tmp_path, config):
    # The documented limit: kubeadm before v1.32 has no such phases, so the step fails (never silently runs the
    # addon phases); docs/operations.md says to drop the arguments for such targets.
    for step in ("kubeadmUpgradeApply", "kubeadmUpgradeNode"):
        status, _, stderr = run_step(tmp_path, config, step, "old")
        assert status != 0 and ("unknown" in stderr), (step, stderr)


def test_the_decision_is_documented():
    text = (d.REPO / "docs" / "operations.md").read_text()
    assert "## kubeadm upgrade apply and KubeadmControlPlane" in text
    for phrase in ("--skip-phases addon/coredns,addon/kube-proxy", "v1.32", "skip-coredns", "skip-kube-proxy",
                   "drop the\ntwo `--skip-phases` arguments"):
        assert phrase in text, phrase
    for config in CONFIGS:
        assert 'docs/operations.md, "kubeadm upgrade apply and KubeadmControlPlane"' in config.read_text(), config
