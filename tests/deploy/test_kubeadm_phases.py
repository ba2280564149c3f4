"""The shipped agent configs' kubeadm upgrade commands leave CoreDNS and kube-proxy to KubeadmControlPlane.

Each `kubeadmUpgradeApply` / `kubeadmUpgradeNode` command of deploy/node/agent.yaml and of every
crates/agent/config-examples/*.yaml is run as the agent runs it (argv, no shell of the agent's own, templates
filled in) against a stand-in `kubeadm` that answers `--help` as kubeadm v1.32+ or as v1.31 does and records
every other invocation. The stand-in's help texts carry the lines the commands look for, copied from kubeadm's
generated reference (`kubeadm upgrade apply` / `kubeadm upgrade node`, v1.31 and v1.34).
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
# kubeadm stand-in: `upgrade apply|node --help` prints $FAKE_DIR/help-<subcommand>; anything else is recorded.
case "$*" in
  *--help*) cat "$FAKE_DIR/help-$2"; exit 0 ;;
esac
printf '%s\\n' "$*" >> "$FAKE_DIR/calls"
"""


def commands(config: pathlib.Path, step: str) -> list[list[str]]:
    """The step's argv lists with the templates filled in as the agent fills them."""
    sequence = yaml.safe_load(config.read_text())["kubernetes"][step]["commands"]
    return [[a.replace("{{version}}", VERSION) for a in c["run"]] for c in sequence]


def run_step(tmp_path: pathlib.Path, config: pathlib.Path, step: str, kubeadm: str) -> list[str]:
    """Runs the step's commands with the stand-in kubeadm of release `kubeadm` ("new" or "old"); its calls."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "kubeadm"
    fake.write_text(STAND_IN)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for sub in ("apply", "node"):
        (tmp_path / f"help-{sub}").write_text(HELP[(sub, kubeadm)])
    (tmp_path / "calls").unlink(missing_ok=True)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "FAKE_DIR": str(tmp_path)}
    for argv in commands(config, step):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=d.BINARY_TIMEOUT_S, check=False)
        assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return (tmp_path / "calls").read_text().splitlines()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(d.REPO)))
def test_upgrade_apply_skips_the_addon_phases_where_kubeadm_can(tmp_path, config):
    assert run_step(tmp_path, config, "kubeadmUpgradeApply", "new") == [
        f"upgrade apply {VERSION} --yes --skip-phases addon/coredns,addon/kube-proxy"
    ]
    assert run_step(tmp_path, config, "kubeadmUpgradeApply", "old") == [f"upgrade apply {VERSION} --yes"]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(d.REPO)))
def test_upgrade_node_skips_the_addon_phase_where_kubeadm_has_one(tmp_path, config):
    assert run_step(tmp_path, config, "kubeadmUpgradeNode", "new") == ["upgrade node --skip-phases addon"]
    assert run_step(tmp_path, config, "kubeadmUpgradeNode", "old") == ["upgrade node"]


def test_a_failing_kubeadm_fails_the_step(tmp_path):
    # `exec`: the step's exit status is kubeadm's, so a failed upgrade is reported, never swallowed by sh.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "kubeadm"
    fake.write_text("#!/bin/sh\ncase \"$*\" in *--help*) echo '--skip-phases'; exit 0 ;; esac\necho boom >&2\nexit 3\n")
    fake.chmod(0o755)
    for argv in commands(CONFIGS[0], "kubeadmUpgradeApply"):
        proc = subprocess.run(argv, env={"PATH": f"{bindir}:/usr/bin:/bin"}, capture_output=True, text=True,
                              timeout=d.BINARY_TIMEOUT_S, check=False)
        assert proc.returncode == 3 and "boom" in proc.stderr


def test_the_decision_is_documented():
    text = (d.REPO / "docs" / "install.md").read_text()
    assert "kubeadm upgrade apply and KubeadmControlPlane" in text
    for phrase in ("--skip-phases addon/coredns,addon/kube-proxy", "v1.32", "skip-coredns", "skip-kube-proxy"):
        assert phrase in text, phrase
    for config in CONFIGS:
        assert "kubeadm upgrade apply and KubeadmControlPlane" in config.read_text(), config
