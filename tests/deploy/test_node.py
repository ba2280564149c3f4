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
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

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
        assert d.file_text(files[path]) == render_module().embedded_text(source), \
            f"{path} differs from deploy/node/{source}"
        assert files[path]["permissions"] == mode
    token = files["/etc/inplace-updater/token"]
    assert token["permissions"] == "0600" and token["owner"] == "root:root"
    assert token["contentFrom"]["secret"]["key"] == "token" and "content" not in token
    ca = files["/etc/inplace-updater/ca.crt"]
    assert ca["contentFrom"]["secret"] == {"name": token["contentFrom"]["secret"]["name"], "key": "ca.crt"}

    pre = spec["preKubeadmCommands"]
    install = [shlex.split(c) for c in pre if "install-agent.sh" in c]
    assert len(install) == 1 and install[0][0] in files, "the installer must be a bootstrap file"
    url, *digests = install[0][1:]
    assert url.startswith("https://") and "{arch}" in url, "one URL for every architecture"
    assert {pair.split("=")[0] for pair in digests} == {"amd64", "arm64"}
    assert all(len(pair.split("=")[1]) == 64 for pair in digests)
    post = spec["postKubeadmCommands"]
    assert "systemctl enable --now inplace-updater-agent.service" in post
    assert post.index("systemctl daemon-reload") < post.index("systemctl enable --now inplace-updater-agent.service")


# Jinja's delimiters: the kubeadm bootstrap provider's cloud-init user-data starts with `## template: jinja`,
# so cloud-init renders every string of it (file contents, commands) before anything runs.
JINJA = re.compile(r"\{\{|\{%|\{#")


@pytest.mark.parametrize("name", SNIPPETS)
def test_snippet_survives_cloud_inits_jinja_pass(name):
    spec = bootstrap_spec(name)
    texts = {f"files[{f['path']}]": f.get("content", "") for f in spec["files"]}
    texts |= {f"{key}[{i}]": c for key in ("preKubeadmCommands", "postKubeadmCommands") for i, c in enumerate(spec[key])}
    rendered = {k: v for k, v in texts.items() if JINJA.search(v)}
    assert not rendered, f"cloud-init's Jinja would rewrite {sorted(rendered)}: base64-encode them (render-snippets.py)"
    # The agent config needs its {{templates}} intact, so it is the one file that must be encoded.
    config = files_by_path(spec)["/etc/inplace-updater/agent.yaml"]
    assert config["encoding"] == "base64" and JINJA.search(d.file_text(config))


def test_the_jinja_check_can_fail():
    assert JINJA.search((NODE / "agent.yaml").read_text())
    assert JINJA.search('[ "${#sum}" -eq 64 ]'), "a shell length expansion opens a Jinja comment"
    assert not JINJA.search("jsonpath='{.status.userInfo.username}' ${INPLACE_UPDATER_AGENT_SERVER:-}")


def test_unit_start_script_env_file_and_installer_agree_on_paths():
    files = files_by_path(bootstrap_spec("kubeadmconfigtemplate.yaml"))
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((NODE / "inplace-updater-agent.service").read_text())
    exec_start = unit["Service"]["ExecStart"]
    assert exec_start in files and files[exec_start]["permissions"] == "0755"
    env_file = unit["Service"]["EnvironmentFile"].lstrip("-")
    assert d.file_text(files[env_file]) == (NODE / "agent.env").read_text()
    assert env_file in (NODE / "agent-start").read_text(), "agent-start names another env file in its messages"
    assert unit["Service"]["Restart"] == "always"
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"
    assert "multi-user.target" in unit["Install"]["WantedBy"]
    start = (NODE / "agent-start").read_text()
    installer = (NODE / "install-agent.sh").read_text()
    assert (
        "${AGENT_START_BIN:-${INPLACE_UPDATER_AGENT_SELF_BINARY:-${INPLACE_UPDATER_AGENT_BINARY:-/usr/local/bin/inplace-agent}}}"
        in start
    )
    assert "${INSTALL_AGENT_DEST:-/usr/local/bin/inplace-agent}" in installer
    env, _ = d.read_env_file(NODE / "agent.env")
    # The binary the agent replaces when it upgrades itself is the one the installer installs and the unit runs.
    assert env["INPLACE_UPDATER_AGENT_SELF_BINARY"] == "/usr/local/bin/inplace-agent"
    assert "INPLACE_UPDATER_AGENT_BINARY" not in env, "the deprecated name (serve used to read it too)"
    # The files the agent reads are the ones the bootstrap snippets write.
    for key in ("INPLACE_UPDATER_AGENT_CA_FILE", "INPLACE_UPDATER_AGENT_TOKEN_FILE", "INPLACE_UPDATER_AGENT_CONFIG"):
        assert env[key] in files, f"{key}={env[key]} is written by no bootstrap file"
    assert files[env["INPLACE_UPDATER_AGENT_TOKEN_FILE"]]["contentFrom"]["secret"]["key"] == "token"
    assert files[env["INPLACE_UPDATER_AGENT_CA_FILE"]]["contentFrom"]["secret"]["key"] == "ca.crt"
    assert d.file_text(files[env["INPLACE_UPDATER_AGENT_CONFIG"]]) == render_module().embedded_text("agent.yaml")
    assert env["INPLACE_UPDATER_AGENT_STATE_DIR"] == "/var/lib/" + unit["Service"]["StateDirectory"], \
        "systemd creates a different state directory than the agent uses"
    assert unit["Service"]["StateDirectoryMode"] == "0700"


def test_agent_env_holds_only_agent_settings():
    active, examples = d.read_env_file(NODE / "agent.env")
    unknown = sorted((set(active) | set(examples)) - d.AGENT_ENV)
    assert not unknown, f"agent.env sets what `inplace-updater agent` does not read: {unknown}"
    for required in ("INPLACE_UPDATER_AGENT_SERVER", "INPLACE_UPDATER_AGENT_CA_FILE", "INPLACE_UPDATER_AGENT_TOKEN_FILE"):
        assert active.get(required), f"{required} is a required agent setting"
    assert not {"INPLACE_UPDATER_AGENT_MACHINE", "INPLACE_UPDATER_AGENT_PROVIDER_ID"} & set(active), \
        "one agent.env serves every node: the Machine must be discovered, not set"
    assert active["INPLACE_UPDATER_AGENT_SERVER"].startswith("https://")


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
    """A sandbox node: agent.env's settings pointing into tmp_path, a fake agent that records its argv and
    INPLACE_UPDATER_* environment, a fake kubectl."""
    conf = tmp_path / "etc"
    conf.mkdir()
    settings, _ = d.read_env_file(NODE / "agent.env")
    for key in ("INPLACE_UPDATER_AGENT_CA_FILE", "INPLACE_UPDATER_AGENT_TOKEN_FILE", "INPLACE_UPDATER_AGENT_CONFIG"):
        settings[key] = str(conf / pathlib.PurePath(settings[key]).name)
        pathlib.Path(settings[key]).write_text(key)
    settings["INPLACE_UPDATER_AGENT_STATE_DIR"] = str(tmp_path / "state")
    record = tmp_path / "agent-call"
    agent = fake(tmp_path / "inplace-agent", f"""
{{ for a in "$@"; do printf 'arg %s\\n' "$a"; done; env | grep '^INPLACE_UPDATER_' | sed 's/^/env /'; }} > {record}
""")
    kubeconfig = tmp_path / "kubelet.conf"
    kubeconfig.write_text("kubeconfig")
    kubectl_log = tmp_path / "kubectl-calls"
    env = {"PATH": os.environ["PATH"], "AGENT_START_BIN": str(agent), "AGENT_START_KUBECONFIG": str(kubeconfig), **settings}

    def with_kubectl(whoami: str, annotations: str) -> None:
        env["AGENT_START_KUBECTL"] = str(fake(tmp_path / "kubectl", f"""
echo "$*" >> {kubectl_log}
case "$*" in
  *"auth whoami"*) printf '%s' '{whoami}' ;;
  *"get node"*) printf '%s' '{annotations}' ;;
  *) exit 1 ;;
esac
"""))

    def run(**extra):
        proc = subprocess.run(["sh", str(NODE / "agent-start")], env={**env, **extra}, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
        if not record.exists():
            return proc, None
        lines = record.read_text().splitlines()
        args = [l.removeprefix("arg ") for l in lines if l.startswith("arg ")]
        agent_env = dict(l.removeprefix("env ").split("=", 1) for l in lines if l.startswith("env "))
        return proc, (args, agent_env)

    return type("Node", (), {"env": env, "settings": settings, "conf": conf, "run": staticmethod(run),
                             "kubectl": staticmethod(with_kubectl), "kubectl_log": kubectl_log})


def test_agent_start_with_an_explicit_machine(node):
    proc, call = node.run(INPLACE_UPDATER_AGENT_MACHINE="default/my-cluster-md-0-abc")
    assert proc.returncode == 0, proc.stderr
    args, agent_env = call
    assert args == [], "every setting goes to the agent as its env twin, none as a flag"
    assert agent_env == {**node.settings, "INPLACE_UPDATER_AGENT_MACHINE": "default/my-cluster-md-0-abc"}


def test_agent_start_with_a_provider_id(node):
    proc, call = node.run(INPLACE_UPDATER_AGENT_PROVIDER_ID="docker:////my-cluster-md-0-abc", INPLACE_UPDATER_AGENT_MACHINE="")
    assert proc.returncode == 0, proc.stderr
    _, agent_env = call
    assert agent_env["INPLACE_UPDATER_AGENT_PROVIDER_ID"] == "docker:////my-cluster-md-0-abc"
    # The agent counts even an empty variable as given (and refuses --machine with --provider-id).
    assert "INPLACE_UPDATER_AGENT_MACHINE" not in agent_env


def test_agent_start_finds_its_machine_from_the_node_annotations(node):
    node.kubectl("system:node:worker-7", "team-a/my-cluster-md-0-xyz")
    proc, call = node.run()
    assert proc.returncode == 0, proc.stderr
    assert call[1]["INPLACE_UPDATER_AGENT_MACHINE"] == "team-a/my-cluster-md-0-xyz"
    calls = node.kubectl_log.read_text()
    assert "get node worker-7" in calls and "cluster\\.x-k8s\\.io/machine" in calls


def test_agent_start_uses_a_given_node_name_without_asking(node):
    node.kubectl("should-not-be-asked", "ns/m")
    proc, call = node.run(AGENT_START_NODE_NAME="cp-1")
    assert proc.returncode == 0, proc.stderr
    assert "whoami" not in node.kubectl_log.read_text() and "get node cp-1" in node.kubectl_log.read_text()
    assert call[1]["INPLACE_UPDATER_AGENT_MACHINE"] == "ns/m"


@pytest.mark.parametrize(
    "whoami,annotations,extra,message",
    [
        ("system:node:worker-7", "/", {}, "no Cluster API machine annotations yet"),
        ("admin", "ns/m", {}, "not a node; set INPLACE_UPDATER_AGENT_MACHINE"),
        ("system:node:w", "ns/m", {"INPLACE_UPDATER_AGENT_SERVER": ""}, "INPLACE_UPDATER_AGENT_SERVER is not set (see /etc/inplace-updater/agent.env)"),
        ("system:node:w", "ns/m", {"AGENT_START_BIN": "/nonexistent/inplace-agent"}, "missing or not executable"),
        ("system:node:w", "ns/m", {"AGENT_START_KUBECONFIG": "/nonexistent"}, "node not joined"),
        ("system:node:w", "ns/m", {"INPLACE_UPDATER_AGENT_CONFIG": "/nonexistent/agent.yaml"}, "INPLACE_UPDATER_AGENT_CONFIG: /nonexistent/agent.yaml is missing"),
        ("system:node:w", "ns/m", {"INPLACE_UPDATER_AGENT_CA_FILE": ""}, "INPLACE_UPDATER_AGENT_CA_FILE is not set"),
        ("system:node:w", "ns/m", {"INPLACE_UPDATER_AGENT_MACHINE": "a/b", "INPLACE_UPDATER_AGENT_PROVIDER_ID": "p"}, "not both"),
    ],
)
def test_agent_start_refuses_clearly_and_does_not_start(node, whoami, annotations, extra, message):
    node.kubectl(whoami, annotations)
    proc, call = node.run(**extra)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert call is None, "the agent must not start without a known Machine and its files"


def test_agent_start_refuses_without_a_token(node):
    pathlib.Path(node.settings["INPLACE_UPDATER_AGENT_TOKEN_FILE"]).unlink()
    proc, call = node.run(INPLACE_UPDATER_AGENT_MACHINE="ns/m")
    assert proc.returncode != 0 and "INPLACE_UPDATER_AGENT_TOKEN_FILE" in proc.stderr and call is None


# ---------------------------------------------------------------- install-agent.sh, run for real


def uname_shim(tmp_path, machine: str) -> str:
    """A PATH whose `uname -m` says `machine` (the rest of PATH as it is)."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "uname").write_text(f'#!/bin/sh\necho "{machine}"\n')
    (shim / "uname").chmod(0o755)
    return f"{shim}:{os.environ['PATH']}"


def install(tmp_path, payload: bytes, digest: str, dest: pathlib.Path, *, machine: str = "x86_64",
            args: list[str] | None = None, name: str = "download"):
    src = tmp_path / name
    src.write_bytes(payload)
    return subprocess.run(
        ["sh", str(NODE / "install-agent.sh"), f"file://{src}", *(args if args is not None else [digest])],
        env={"PATH": uname_shim(tmp_path, machine), "INSTALL_AGENT_DEST": str(dest)},
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


def per_arch_install(tmp_path, machine: str, digests: dict[str, bytes]):
    """install-agent.sh URL-with-{arch} ARCH=SHA256..., with a download per architecture."""
    dest = tmp_path / "inplace-agent"
    for arch in ("amd64", "arm64"):
        (tmp_path / f"agent-{arch}").write_bytes(f"binary for {arch}".encode())
    args = [f"{arch}={hashlib.sha256(content).hexdigest()}" for arch, content in digests.items()]
    proc = subprocess.run(
        ["sh", str(NODE / "install-agent.sh"), f"file://{tmp_path}/agent-{{arch}}", *args],
        env={"PATH": uname_shim(tmp_path, machine), "INSTALL_AGENT_DEST": str(dest)},
        capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S,
    )
    return proc, dest


BOTH = {"amd64": b"binary for amd64", "arm64": b"binary for arm64"}


@pytest.mark.parametrize("machine,arch", [("x86_64", "amd64"), ("aarch64", "arm64")])
def test_installer_picks_the_binary_of_the_nodes_architecture(tmp_path, machine, arch):
    proc, dest = per_arch_install(tmp_path, machine, BOTH)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == BOTH[arch]
    assert f"agent-{arch}" in proc.stdout


@pytest.mark.parametrize("machine", ["armv7l", "riscv64", "ppc64le"])
def test_installer_refuses_an_architecture_without_a_build(tmp_path, machine):
    proc, dest = per_arch_install(tmp_path, machine, BOTH)
    assert proc.returncode == 3 and machine in proc.stderr and "aarch64 (arm64)" in proc.stderr
    assert not dest.exists()


def test_installer_refuses_a_node_whose_architecture_has_no_digest(tmp_path):
    proc, dest = per_arch_install(tmp_path, "aarch64", {"amd64": BOTH["amd64"]})
    assert proc.returncode == 3 and "arm64=" in proc.stderr
    assert not dest.exists()


def test_installer_checks_the_digest_of_the_architecture_it_downloads(tmp_path):
    # The arm64 digest is the amd64 binary's: the arm64 node must refuse, not install the other build.
    proc, dest = per_arch_install(tmp_path, "aarch64", {"amd64": BOTH["amd64"], "arm64": BOTH["amd64"]})
    assert proc.returncode == 1 and "sha256 mismatch" in proc.stderr and "arm64" in proc.stderr
    assert not dest.exists()


def test_installer_refuses_an_unknown_architecture_name(tmp_path):
    dest = tmp_path / "inplace-agent"
    proc = install(tmp_path, b"x", "", dest, args=[f"sparc={hashlib.sha256(b'x').hexdigest()}"])
    assert proc.returncode == 2 and "sparc=" in proc.stderr and not dest.exists()


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
    files_cm = next(c for c in d.find(objs, "ConfigMap") if c["metadata"]["name"].startswith("inplace-updater-agent-files"))
    assert files_cm["data"]["agent-start"] == (NODE / "agent-start").read_text()
    assert files_cm["data"]["agent.yaml"] == (NODE / "agent.yaml").read_text()
    env_cm = next(c for c in d.find(objs, "ConfigMap") if c["metadata"]["name"].startswith("inplace-updater-agent-env"))
    settings, _ = d.read_env_file(NODE / "agent.env")
    assert env_cm["data"] == settings, "the DaemonSet's settings are agent.env's"
    assert [e["configMapRef"]["name"] for e in container["envFrom"]] == [env_cm["metadata"]["name"]]
    assert {e["name"] for e in container.get("env", [])} == {"AGENT_START_NODE_NAME"}
    # What the script copies onto the host is where agent.env (read after nsenter, on the host) looks.
    volumes = {v["name"]: v for v in pod["volumes"]}
    host_dirs = {m["mountPath"]: volumes[m["name"]]["hostPath"]["path"] for m in container["volumeMounts"] if "hostPath" in volumes[m["name"]]}

    def on_host(path_in_container: str) -> str:
        for mount, host in host_dirs.items():
            if path_in_container.startswith(mount + "/"):
                return host + path_in_container[len(mount):]
        raise AssertionError(f"{path_in_container} is on no hostPath volume")

    installed = {on_host(m.group(1)) for m in re.finditer(r"^\s*install -m \d+ \S+ (\S+)$", script, re.M)}
    for key in ("INPLACE_UPDATER_AGENT_CA_FILE", "INPLACE_UPDATER_AGENT_TOKEN_FILE", "INPLACE_UPDATER_AGENT_CONFIG"):
        assert settings[key] in installed, f"{key}={settings[key]} is not written by the DaemonSet"
    bin_path = re.search(r"AGENT_START_BIN=(\S+)", script).group(1)
    assert bin_path in {on_host(p) for p in re.findall(r"mv -f \S+ (\S+)", script)}
    assert re.search(r"^\s*(/\S+/agent-start)$", script, re.M).group(1) in installed
    ns = d.one(objs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    secret = volumes["credentials"]["secret"]["secretName"]
    assert f"create secret generic {secret}" in (NODE / "kustomization.yaml").read_text(), "the comment names another Secret"
    assert (NODE / "daemonset" / "README.md").exists(), "trade-offs live next to the DaemonSet"


# ---------------------------------------------------------------- agent.yaml, the agent's driver config

# `DriverConfig` (crates/agent/src/config/mod.rs): its sections and their keys; unknown keys are errors.
DRIVER_CONFIG = {
    "path": None, "env": None, "pins": None,
    "kubernetes": {"installKubeadm", "kubeadmUpgradeApply", "kubeadmUpgradeNode", "installKubelet"},
    "kubelet": {"flagsFile", "restart"},
    "ntp": {"flavor", "configFile", "restart"},
    "etcd": {"manifest"},
    "inventory": {"kubeletVersion", "kubeadmVersion"},
    # crates/agent/src/config/node.rs: the node's kubeconfig and name for drainNode/waitNodeReady/uncordonNode.
    "node": {"kubeconfig", "name", "pollIntervalMillis", "evictionRetryMillis"},
    # crates/agent/src/config/reboot.rs: reboot and osImage steps (issue 30).
    "reboot": {"command", "bootIdFile", "required"},
    "osImage": {"apply", "current", "currentJsonPointer"},
    # crates/agent/src/config/control_plane.rs: the control-plane preflight (issue 30).
    "controlPlane": {"checkEtcd", "etcdEndpoint", "etcdCaFile", "etcdCertFile", "etcdKeyFile"},
    # crates/agent/src/config/artifact.rs: how `fetch` commands reach registries (issue 31).
    "artifacts": {"mirrors", "credentialsFile", "caFile", "maxBytes", "layerMediaType"},
}
SEQUENCE_KEYS = {"skipIf", "onResume", "commands", "retry", "record", "undo"}
RETRY_KEYS = {"attempts", "initialDelaySeconds", "maxDelaySeconds"}
CHECK_KEYS = {"run", "stdoutEquals", "stdoutContains"}
COMMAND_KEYS = {"run": None, "writeFile": {"path", "content", "mode"}, "verifySha256": {"path", "sha256"},
                "fetch": {"source", "sha256", "to", "mode"}}
# crates/agent/src/sequence/undo.rs: `record:` entries and `undo:` (rollback, issue 28).
RECORD_KEYS = {"name", "run", "map", "absentOnExit"}
UNDO_KEYS = {"onResume", "retry", "commands"}
# crates/agent/src/sequence/template.rs KNOWN_VARIABLES, plus pin.<name> (and record.<name>[.minor] in undo: only).
TEMPLATE_VARIABLES = {"version", "bareVersion", "minor", "root"}


def agent_config() -> dict:
    return yaml.safe_load((NODE / "agent.yaml").read_text())


def strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def test_agent_config_is_the_agents_apt_example():
    # The agent's own shipped example is parsed by the agent's tests; deploy/ must not drift from it.
    example = d.REPO / "crates" / "agent" / "config-examples" / "apt.yaml"
    assert agent_config() == yaml.safe_load(example.read_text()), \
        f"deploy/node/agent.yaml differs from {example.relative_to(d.REPO)}: copy it, then run render-snippets.py"


def config_problems(config: dict) -> list[str]:
    """What the agent's config loader would refuse, as far as shapes and templates go (offline)."""
    problems = []
    for section, value in config.items():
        if section not in DRIVER_CONFIG:
            problems.append(f"unknown section {section}")
        elif DRIVER_CONFIG[section] is not None:
            problems += [f"{section}.{k}: unknown key" for k in set(value) - DRIVER_CONFIG[section]]
    for kind, sequence in (config.get("kubernetes") or {}).items():
        problems += [f"kubernetes.{kind}.{k}: unknown key" for k in set(sequence) - SEQUENCE_KEYS]
        problems += [f"kubernetes.{kind}.skipIf.{k}: unknown key" for k in set(sequence.get("skipIf", {})) - CHECK_KEYS]
        retry = sequence.get("retry")
        if retry is not None:
            problems += [f"kubernetes.{kind}.retry.{k}: unknown key" for k in set(retry) - RETRY_KEYS]
            problems += [f"kubernetes.{kind}.retry.{k}: missing" for k in RETRY_KEYS - set(retry)]
        for list_key in ("onResume", "commands"):
            problems += command_problems(f"kubernetes.{kind}.{list_key}", sequence.get(list_key, []), retry, None)
        records = []
        for i, record in enumerate(sequence.get("record", [])):
            problems += [f"kubernetes.{kind}.record[{i}].{k}: unknown key" for k in set(record) - RECORD_KEYS]
            records.append(record.get("name"))
        undo = sequence.get("undo")
        if (records or undo is not None) and kind.startswith("kubeadmUpgrade"):
            problems.append(f"kubernetes.{kind}: kubeadm upgrade is not undone")
        if undo is not None:
            problems += [f"kubernetes.{kind}.undo.{k}: unknown key" for k in set(undo) - UNDO_KEYS]
            for list_key in ("onResume", "commands"):
                where = f"kubernetes.{kind}.undo.{list_key}"
                problems += command_problems(where, undo.get(list_key, []), undo.get("retry"), records)
                for text in strings(undo.get(list_key, [])):
                    for name in re.findall(r"{{\s*record\.([^}]*?)\s*}}", text):
                        if name.removesuffix(".minor") not in records:
                            problems.append(f"{where}: {{{{record.{name}}}}} names no record")
    undos = [s.get("undo") for s in (config.get("kubernetes") or {}).values()]
    for text in strings({k: v for k, v in config.items() if k != "kubernetes"}) + [
        t for s in (config.get("kubernetes") or {}).values() for k, v in s.items() if k != "undo" for t in strings(v)
    ]:
        for name in re.findall(r"{{\s*([^}]*?)\s*}}", text):
            if name not in TEMPLATE_VARIABLES and not re.fullmatch(r"pin\.[A-Za-z0-9_-]+", name):
                problems.append(f"unknown template variable {{{{{name}}}}} in {text!r}")
    for text in strings(undos):
        for name in re.findall(r"{{\s*([^}]*?)\s*}}", text):
            known = name in TEMPLATE_VARIABLES or re.fullmatch(r"(pin|record)\.[A-Za-z0-9_.-]+", name)
            if not known:
                problems.append(f"unknown template variable {{{{{name}}}}} in {text!r}")
    return problems


def command_problems(where: str, commands: list, retry, records) -> list[str]:
    """A list of sequence commands; `records` is the undo's record names (None: a forward list)."""
    problems = []
    for i, entry in enumerate(commands):
        at = f"{where}[{i}]"
        command = dict(entry)
        # `retryable: true` sits beside a `run` (crates/agent/src/sequence/command.rs SequenceCommand).
        if command.pop("retryable", None) is not None:
            if "run" not in command:
                problems.append(f"{at}: retryable applies to run commands only")
            if retry is None:
                problems.append(f"{at}: retryable, but the sequence has no retry")
        for condition in ("ifRecorded", "ifNotRecorded"):
            name = command.pop(condition, None)
            if name is not None and (records is None or name not in records):
                problems.append(f"{at}.{condition}: {name!r} is no record of this sequence's undo")
        if len(command) != 1:
            problems.append(f"{at}: needs exactly one of {sorted(COMMAND_KEYS)}")
            continue
        (name, body), = command.items()
        if name not in COMMAND_KEYS:
            problems.append(f"{at}: unknown command {name}")
        elif COMMAND_KEYS[name] is None:
            if not (isinstance(body, list) and body and all(isinstance(a, str) for a in body)):
                problems.append(f"{at}.run: not an argv list of strings")
        elif set(body) - COMMAND_KEYS[name]:
            problems.append(f"{at}.{name}: unknown keys {set(body) - COMMAND_KEYS[name]}")
    return problems


def test_agent_config_has_the_agents_shape():
    config = agent_config()
    assert config_problems(config) == []
    kubernetes = config["kubernetes"]
    assert set(kubernetes) == DRIVER_CONFIG["kubernetes"], "every Kubernetes step kind needs its commands"
    for kind in ("installKubeadm", "installKubelet"):
        check = kubernetes[kind]["skipIf"]
        assert "{{version}}" in check.get("stdoutEquals", ""), f"{kind}: an upgraded node must be a no-op"
        # A resumed install runs again; apt refuses to, after an interrupted one, until dpkg finishes.
        assert {"run": ["dpkg", "--configure", "-a"]} in kubernetes[kind].get("onResume", []), kind
    sources = [c["writeFile"] for c in kubernetes["installKubeadm"]["commands"] if "writeFile" in c]
    assert any("https://pkgs.k8s.io/core:/stable:/{{minor}}/deb/" in f["content"] for f in sources)
    installs = [c["run"] for k in ("installKubeadm", "installKubelet") for c in kubernetes[k]["commands"] if "run" in c]
    assert ["apt-get", "install", "-y", "-q", "kubeadm={{bareVersion}}-*"] in installs
    # A failed update is rolled back (issue 28): the package steps put back the exact versions recorded.
    for kind in ("installKubeadm", "installKubelet"):
        undo = [c["run"] for c in kubernetes[kind]["undo"]["commands"] if "run" in c]
        tool = kind.removeprefix("install").lower()
        assert ["apt-get", "install", "-y", "-q", "--allow-downgrades", f"{tool}={{{{record.{tool}}}}}"] in undo, kind


@pytest.mark.parametrize(
    "breakage,problem",
    [
        (lambda c: c.__setitem__("kubernetesVersion", {}), "unknown section kubernetesVersion"),
        (lambda c: c["kubelet"].__setitem__("flagsEnv", "/x"), "kubelet.flagsEnv: unknown key"),
        (lambda c: c["kubernetes"]["installKubelet"]["commands"].append({"shell": "x"}), "unknown command shell"),
        (lambda c: c["kubernetes"]["kubeadmUpgradeNode"]["commands"].append({"run": "kubeadm upgrade node"}), "not an argv list"),
        (lambda c: c["kubernetes"]["installKubelet"]["onResume"].append({"shell": "x"}), "onResume[1]: unknown command shell"),
        (lambda c: c["kubernetes"]["installKubeadm"]["skipIf"].__setitem__("stdoutEquals", "{semver}{{verison}}"), "{{verison}}"),
        (lambda c: c["kubernetes"]["installKubeadm"]["retry"].__setitem__("attemps", 3), "retry.attemps: unknown key"),
        (lambda c: c["kubernetes"]["installKubeadm"].pop("retry"), "retryable, but the sequence has no retry"),
        (lambda c: c["kubernetes"]["installKubelet"]["record"][0].__setitem__("stdout", 1), "record[0].stdout: unknown key"),
        (lambda c: c["kubernetes"]["installKubelet"]["undo"]["commands"][3].__setitem__("ifRecorded", "kubelt"), "'kubelt' is no record"),
        (lambda c: c["kubernetes"]["installKubelet"]["undo"]["commands"].append({"run": ["x", "{{record.kubelt}}"]}), "names no record"),
        (lambda c: c["kubernetes"]["kubeadmUpgradeNode"].__setitem__("undo", {"commands": []}), "kubeadm upgrade is not undone"),
    ],
)
def test_the_agent_config_check_can_fail(breakage, problem):
    config = agent_config()
    breakage(config)
    assert any(problem in p for p in config_problems(config)), config_problems(config)


def test_only_the_node_daemonset_is_privileged():
    for directory in d.kustomization_dirs():
        if d.is_component(directory) or directory == NODE:
            continue
        for obj in d.render(directory):
            spec = obj.get("spec", {}).get("template", {}).get("spec", {})
            assert not spec.get("hostPID") and not spec.get("hostNetwork"), d.describe(obj)
            for c in spec.get("containers", []):
                assert not c.get("securityContext", {}).get("privileged"), d.describe(obj)
