"""The node side of deploy/: bootstrap snippets, systemd unit, start and install scripts, DaemonSet.

The two shell scripts are run for real (POSIX sh) in a temporary directory, with stand-ins for
`kubectl` and the agent binary that record how they were called.
"""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import os
import pathlib
import shlex
import shutil
import subprocess

import pytest

import deploylib as d

NODE = d.DEPLOY / "node"
SNIPPETS = {
    "kubeadmconfigtemplate.yaml": lambda o: o["spec"]["template"]["spec"],
    "kubeadmcontrolplane.yaml": lambda o: o["spec"]["kubeadmConfigSpec"],
}
# Bound on one script run in these tests (they take milliseconds).
SCRIPT_TIMEOUT_S = 30


def bootstrap_spec(name: str) -> dict:
    return SNIPPETS[name](d.load_yaml_docs(NODE / name)[0])


def files_by_path(spec: dict) -> dict[str, dict]:
    return {f["path"]: f for f in spec["files"]}


def render_module():
    spec = importlib.util.spec_from_file_location("render_snippets", NODE / "render-snippets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- bootstrap snippets


@pytest.mark.parametrize("name", SNIPPETS)
def test_snippet_is_what_render_snippets_writes(name):
    expected = render_module().SNIPPETS[name]()
    assert (NODE / name).read_text() == expected, f"run: python3 deploy/node/render-snippets.py ({name} is stale)"


@pytest.mark.parametrize("name", SNIPPETS)
def test_snippet_installs_agent_config_and_token(name):
    spec = bootstrap_spec(name)
    files = files_by_path(spec)
    for path, mode, source in render_module().EMBEDDED:
        assert files[path]["content"] == (NODE / source).read_text(), f"{path} differs from deploy/node/{source}"
        assert files[path]["permissions"] == mode
    token = files["/etc/inplace-updater/token"]
    assert token["permissions"] == "0600" and token["owner"] == "root:root"
    assert token["contentFrom"]["secret"]["key"] == "token" and "content" not in token
    ca = files["/etc/inplace-updater/ca.crt"]
    assert ca["contentFrom"]["secret"] == {"name": token["contentFrom"]["secret"]["name"], "key": "ca.crt"}

    pre = spec["preKubeadmCommands"]
    install = [shlex.split(c) for c in pre if "install-agent.sh" in c]
    assert len(install) == 1 and install[0][0] in files, "the installer must be a bootstrap file"
    url, digest = install[0][1:]
    assert url.startswith("https://") and len(digest) == 64
    post = spec["postKubeadmCommands"]
    assert "systemctl enable --now inplace-updater-agent.service" in post
    assert post.index("systemctl daemon-reload") < post.index("systemctl enable --now inplace-updater-agent.service")


def test_unit_start_script_and_installer_agree_on_paths():
    files = files_by_path(bootstrap_spec("kubeadmconfigtemplate.yaml"))
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((NODE / "inplace-updater-agent.service").read_text())
    exec_start = unit["Service"]["ExecStart"]
    assert exec_start in files and files[exec_start]["permissions"] == "0755"
    assert unit["Service"]["EnvironmentFile"].lstrip("-") in files
    assert unit["Service"]["Restart"] == "always"
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"
    assert "multi-user.target" in unit["Install"]["WantedBy"]
    start = (NODE / "agent-start").read_text()
    installer = (NODE / "install-agent.sh").read_text()
    assert "/usr/local/bin/inplace-updater" in start and "/usr/local/bin/inplace-updater" in installer
    for name in ("token", "ca.crt", "agent.yaml"):
        assert f"/etc/inplace-updater/{name}" in files, name
    assert "${INPLACE_UPDATER_CONF_DIR:-/etc/inplace-updater}" in start
    state_dir = "/var/lib/" + unit["Service"]["StateDirectory"]
    assert "${INPLACE_UPDATER_STATE_DIR:-%s}" % state_dir in start, "systemd creates a different state dir"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_unit(tmp_path):
    def verify(text: str) -> list[str]:
        unit = tmp_path / "inplace-updater-agent.service"
        unit.write_text(text)
        proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
        # The start script is not installed on this machine; everything else must be clean.
        return [
            line for line in proc.stderr.splitlines()
            if line.strip() and "is not executable" not in line and "not found" not in line
        ]

    text = (NODE / "inplace-updater-agent.service").read_text()
    assert verify(text) == []
    assert verify(text.replace("KillMode=mixed", "KillMode=gently")), "systemd-analyze let a bad unit through"


# ---------------------------------------------------------------- agent-start, run for real


def fake(path: pathlib.Path, body: str) -> pathlib.Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def node(tmp_path):
    """A sandbox node: config dir with token/CA/config, a fake agent that records its argv, a fake kubectl."""
    conf = tmp_path / "etc"
    conf.mkdir()
    for name in ("token", "ca.crt", "agent.yaml"):
        (conf / name).write_text(name)
    argv_file = tmp_path / "agent-argv"
    agent = fake(tmp_path / "inplace-updater", f'for a in "$@"; do printf "%s\\n" "$a"; done > {argv_file}\n')
    kubeconfig = tmp_path / "kubelet.conf"
    kubeconfig.write_text("kubeconfig")
    kubectl_log = tmp_path / "kubectl-calls"
    env = {
        "PATH": os.environ["PATH"],
        "INPLACE_UPDATER_CONF_DIR": str(conf),
        "INPLACE_UPDATER_BIN": str(agent),
        "INPLACE_UPDATER_KUBELET_KUBECONFIG": str(kubeconfig),
        "INPLACE_UPDATER_STATE_DIR": str(tmp_path / "state"),
        "INPLACE_UPDATER_SERVER": "https://inplace-updater.mgmt.example.com",
    }

    def with_kubectl(whoami: str, annotations: str) -> None:
        env["INPLACE_UPDATER_KUBECTL"] = str(fake(tmp_path / "kubectl", f"""
echo "$*" >> {kubectl_log}
case "$*" in
  *"auth whoami"*) printf '%s' '{whoami}' ;;
  *"get node"*) printf '%s' '{annotations}' ;;
  *) exit 1 ;;
esac
"""))

    def run(**extra):
        proc = subprocess.run(["sh", str(NODE / "agent-start")], env={**env, **extra}, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
        argv = argv_file.read_text().splitlines() if argv_file.exists() else None
        return proc, argv

    return type("Node", (), {"env": env, "conf": conf, "run": staticmethod(run), "kubectl": staticmethod(with_kubectl),
                             "kubectl_log": kubectl_log})


def test_agent_start_with_an_explicit_machine(node):
    proc, argv = node.run(INPLACE_UPDATER_MACHINE="default/my-cluster-md-0-abc")
    assert proc.returncode == 0, proc.stderr
    c = str(node.conf)
    assert argv == [
        "agent", "--server", "https://inplace-updater.mgmt.example.com",
        "--ca-file", f"{c}/ca.crt", "--token-file", f"{c}/token",
        "--machine", "default/my-cluster-md-0-abc",
        "--config", f"{c}/agent.yaml", "--state-dir", node.env["INPLACE_UPDATER_STATE_DIR"], "--root", "/",
    ]


def test_agent_start_with_a_provider_id(node):
    proc, argv = node.run(INPLACE_UPDATER_PROVIDER_ID="docker:////my-cluster-md-0-abc")
    assert proc.returncode == 0, proc.stderr
    assert argv[argv.index("--provider-id") + 1] == "docker:////my-cluster-md-0-abc"
    assert "--machine" not in argv


def test_agent_start_finds_its_machine_from_the_node_annotations(node):
    node.kubectl("system:node:worker-7", "team-a/my-cluster-md-0-xyz")
    proc, argv = node.run()
    assert proc.returncode == 0, proc.stderr
    assert argv[argv.index("--machine") + 1] == "team-a/my-cluster-md-0-xyz"
    calls = node.kubectl_log.read_text()
    assert "get node worker-7" in calls and "cluster\\.x-k8s\\.io/machine" in calls


def test_agent_start_uses_a_given_node_name_without_asking(node):
    node.kubectl("should-not-be-asked", "ns/m")
    proc, argv = node.run(INPLACE_UPDATER_NODE_NAME="cp-1")
    assert proc.returncode == 0, proc.stderr
    assert "whoami" not in node.kubectl_log.read_text()


@pytest.mark.parametrize(
    "whoami,annotations,extra,message",
    [
        ("system:node:worker-7", "/", {}, "no Cluster API machine annotations yet"),
        ("admin", "ns/m", {}, "not a node"),
        ("system:node:w", "ns/m", {"INPLACE_UPDATER_SERVER": ""}, "INPLACE_UPDATER_SERVER is not set"),
        ("system:node:w", "ns/m", {"INPLACE_UPDATER_BIN": "/nonexistent/inplace-updater"}, "missing or not executable"),
        ("system:node:w", "ns/m", {"INPLACE_UPDATER_KUBELET_KUBECONFIG": "/nonexistent"}, "node not joined"),
    ],
)
def test_agent_start_refuses_clearly_and_does_not_start(node, whoami, annotations, extra, message):
    node.kubectl(whoami, annotations)
    proc, argv = node.run(**extra)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert argv is None, "the agent must not start without a known Machine and config"


def test_agent_start_refuses_without_a_token(node):
    (node.conf / "token").unlink()
    proc, argv = node.run(INPLACE_UPDATER_MACHINE="ns/m")
    assert proc.returncode != 0 and "token is missing" in proc.stderr and argv is None


# ---------------------------------------------------------------- install-agent.sh, run for real


def install(tmp_path, payload: bytes, digest: str, dest: pathlib.Path):
    src = tmp_path / "download"
    src.write_bytes(payload)
    return subprocess.run(
        ["sh", str(NODE / "install-agent.sh"), f"file://{src}", digest],
        env={"PATH": os.environ["PATH"], "INPLACE_UPDATER_BIN": str(dest)},
        capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S,
    )


def test_installer_installs_a_verified_binary(tmp_path):
    dest = tmp_path / "bin" / "inplace-updater"
    dest.parent.mkdir()
    payload = b"\x7fELF pretend binary"
    proc = install(tmp_path, payload, hashlib.sha256(payload).hexdigest(), dest)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == payload and dest.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in dest.parent.iterdir()) == ["inplace-updater"], "temp file left behind"


def test_installer_refuses_a_mismatching_download_and_keeps_the_old_binary(tmp_path):
    dest = tmp_path / "inplace-updater"
    dest.write_bytes(b"old")
    proc = install(tmp_path, b"tampered", hashlib.sha256(b"expected").hexdigest(), dest)
    assert proc.returncode == 1 and "sha256 mismatch" in proc.stderr
    assert dest.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("inplace-updater.")] == []


@pytest.mark.parametrize("digest", ["", "abc", "Z" * 64, hashlib.sha256(b"x").hexdigest().upper()])
def test_installer_refuses_a_malformed_digest(tmp_path, digest):
    dest = tmp_path / "inplace-updater"
    proc = install(tmp_path, b"x", digest, dest)
    assert proc.returncode != 0 and not dest.exists()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
def test_scripts_pass_shellcheck(tmp_path):
    ds = d.one(d.render(NODE), "DaemonSet", "inplace-updater-agent")
    ds_script = tmp_path / "daemonset-command.sh"
    ds_script.write_text(ds["spec"]["template"]["spec"]["containers"][0]["command"][-1])
    proc = subprocess.run(
        ["shellcheck", "--shell=sh", str(NODE / "agent-start"), str(NODE / "install-agent.sh"), str(ds_script)],
        capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout


# ---------------------------------------------------------------- DaemonSet alternative


def test_daemonset_runs_the_same_files_in_the_host_namespaces():
    objs = d.render(NODE)
    ds = d.one(objs, "DaemonSet", "inplace-updater-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    assert container["securityContext"]["privileged"] is True
    script = container["command"][-1]
    assert "nsenter --target 1 --mount --uts --ipc --net" in script
    assert "/opt/inplace-updater/bin/agent-start" in script
    files_cm = next(c for c in d.find(objs, "ConfigMap") if c["metadata"]["name"].startswith("inplace-updater-agent-files"))
    assert files_cm["data"]["agent-start"] == (NODE / "agent-start").read_text()
    assert files_cm["data"]["agent.yaml"] == (NODE / "agent.yaml").read_text()
    env_cm = next(c for c in d.find(objs, "ConfigMap") if c["metadata"]["name"].startswith("inplace-updater-agent-env"))
    assert env_cm["data"]["INPLACE_UPDATER_SERVER"].startswith("https://")
    ns = d.one(objs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert (NODE / "daemonset" / "README.md").exists(), "trade-offs live next to the DaemonSet"


def test_only_the_node_daemonset_is_privileged():
    for directory in d.kustomization_dirs():
        if d.is_component(directory) or directory == NODE:
            continue
        for obj in d.render(directory):
            spec = obj.get("spec", {}).get("template", {}).get("spec", {})
            assert not spec.get("hostPID") and not spec.get("hostNetwork"), d.describe(obj)
            for c in spec.get("containers", []):
                assert not c.get("securityContext", {}).get("privileged"), d.describe(obj)
