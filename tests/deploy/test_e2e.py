"""deploy/ run for real: the server started exactly as the rendered Deployment configures it (its env,
its volumes laid out in a temporary directory, only the listen ports moved to free loopback ones),
with a token made by the docs' commands, answering CAPI's discovery and an agent; the node agent
started by agent-start with agent.env's settings and the shipped agent.yaml.

Real processes, real TLS (certificates from `inplace-updater certs`); waits are on log lines and
answers, with deadlines. Needs the binary (see deploylib.binary).
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import re
import ssl
import subprocess
from urllib.parse import urlparse

import pytest

import deploylib as d
import procs

DISCOVERY = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery"
INVENTORY = "/agent/v1/inventory"
MACHINE = {"namespace": "default", "name": "my-cluster-md-0-abcde-xyz12"}
# The overlay agents come in through: base + the agent Service and the agent name in the certificate.
AGENT_OVERLAY = d.DEPLOY / "overlays" / "agent-loadbalancer"
# Bound on one HTTPS call to the sandboxed server.
HTTP_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def objs() -> list[dict]:
    return d.render(AGENT_OVERLAY)


@pytest.fixture(scope="module")
def certs(objs, tmp_path_factory) -> pathlib.Path:
    """A CA, a serving certificate for every dnsName of the rendered Certificate, a client certificate."""
    out = tmp_path_factory.mktemp("certs")
    names = d.one(objs, "Certificate", "inplace-updater-serving-cert")["spec"]["dnsNames"]
    proc = d.run_binary("certs", "--out", str(out), *[a for n in names for a in ("--dns", n)])
    assert proc.returncode == 0, proc.stderr
    return out


class Server:
    """The server of the rendered Deployment, in a sandbox."""

    def __init__(self, objs: list[dict], root: pathlib.Path, certs: pathlib.Path, tokens: str | None, extra_env: dict[str, str]):
        dep, container = d.server_deployment(objs)
        pod = dep["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.mounts = {m["mountPath"]: root / "volumes" / m["name"] for m in container["volumeMounts"]}
        serving_secret = d.one(objs, "Certificate", "inplace-updater-serving-cert")["spec"]["secretName"]
        # What each Secret holds in a real cluster: cert-manager's serving Secret, and the token Secret of
        # docs/install.md step 4.
        secrets = {
            serving_secret: {k: (certs / k).read_text() for k in ("tls.crt", "tls.key", "ca.crt")},
        }
        if tokens is not None:
            secrets["inplace-updater-agent-tokens"] = {"tokens": tokens}
        for m in container["volumeMounts"]:
            target = self.mounts[m["mountPath"]]
            target.mkdir(parents=True)
            volume = volumes[m["name"]]
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                # A Secret that does not exist: the kubelet starts the Pod with an empty directory only when
                # the volume is optional; otherwise the Pod never starts.
                assert name in secrets or volume["secret"].get("optional"), f"Secret {name} missing and not optional"
                files = secrets.get(name, {})
            elif "configMap" in volume:
                files = d.one(objs, "ConfigMap", volume["configMap"]["name"])["data"]
            elif "persistentVolumeClaim" in volume or "emptyDir" in volume:
                files = {}
            else:
                raise AssertionError(f"volume {m['name']}: no sandbox for {sorted(volume)}")
            for key, text in files.items():
                (target / key).write_text(text)
        self.tokens_file = self.path(d.env_of(container)["INPLACE_UPDATER_AGENT_TOKENS"])
        env = {name: self.translate(value) for name, value in d.env_of(container).items()}
        # The kubelet gives a Pod its API server's address and ServiceAccount token at fixed paths; this sandbox has
        # no API server, so the server runs without its management-cluster client (the guard and Events are
        # tested against the fake management API in tests/integration/e2e_guard.rs and e2e_events.rs).
        assert env.pop("INPLACE_UPDATER_MANAGEMENT_IN_CLUSTER", None) == "true", "the Pod uses its ServiceAccount"
        env.update({k: self.translate(v) for k, v in extra_env.items()})
        self.proc = procs.Proc([str(d.binary()), *container["args"]], env={"PATH": os.environ["PATH"], **env}, cwd=str(root))
        listening = self.proc.wait_for_json("listening")["fields"]
        self.hooks, self.health = listening["hooks"], listening["health"]
        procs.wait_until(lambda: self.ready(), "the server reports /readyz")

    def path(self, in_pod: str) -> pathlib.Path:
        for mount in sorted(self.mounts, key=len, reverse=True):
            if in_pod == mount or in_pod.startswith(mount.rstrip("/") + "/"):
                return self.mounts[mount] / in_pod[len(mount):].lstrip("/")
        raise AssertionError(f"{in_pod} is on no volume of the Pod")

    def translate(self, value: str) -> str:
        """A Pod value in the sandbox: mounted paths moved, listen addresses on free loopback ports."""
        if re.fullmatch(r"0\.0\.0\.0:\d+", value):
            return "127.0.0.1:0"
        if value.startswith("file:/"):
            return "file:" + str(self.path(value.removeprefix("file:")))
        if value.startswith("/"):
            return str(self.path(value))
        return value

    def ready(self) -> bool:
        conn = http.client.HTTPConnection(*split(self.health), timeout=HTTP_TIMEOUT_S)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        code = self.proc.stop()
        assert code == 0, f"the server did not stop cleanly on SIGTERM ({code}):\n{self.proc.output()}"


def split(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def post(server: Server, certs: pathlib.Path, path: str, body: dict, token: str | None = None,
         client_cert: bool = False) -> tuple[int, dict]:
    """An HTTPS POST to the hook port, verifying the server against the CA the way CAPI and agents do."""
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    conn = http.client.HTTPSConnection(*split(server.hooks), context=ctx, timeout=HTTP_TIMEOUT_S)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        text = response.read().decode()
        return response.status, json.loads(text) if text else {}
    finally:
        conn.close()


def inventory(machine: dict = MACHINE) -> dict:
    return {"agent": {"machine": machine}, "agentVersion": "tests/deploy"}


@pytest.fixture
def token_files(tmp_path) -> tuple[str, str]:
    """(the token, the server's token file text), made by the docs' commands."""
    d.run_docs_token_block(tmp_path)
    return (tmp_path / "my-cluster.token").read_text().strip(), (tmp_path / "agent-tokens").read_text()


@pytest.fixture
def start_server(objs, certs, tmp_path):
    started: list[Server] = []

    def start(tokens: str | None, **extra_env: str) -> Server:
        root = tmp_path / f"server-{len(started)}"
        root.mkdir()
        started.append(Server(objs, root, certs, tokens, extra_env))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def test_the_deployed_server_answers_capi_and_agents_with_the_docs_token(start_server, certs, token_files):
    token, tokens_text = token_files
    server = start_server(tokens_text)
    status, body = post(server, certs, DISCOVERY, {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"})
    assert status == 200 and body["status"] == "Success", body
    # CAPI names them <handler>.<ExtensionConfig name>: the three of docs/install.md step 6.
    assert sorted(h["name"] for h in body["handlers"]) == ["can-update-machine", "can-update-machineset", "update-machine"]

    assert post(server, certs, INVENTORY, inventory(), token=token)[0] == 200
    assert post(server, certs, INVENTORY, inventory())[0] == 401, "no token, no agent API"
    assert post(server, certs, INVENTORY, inventory(), token="iu1_" + "A" * 43)[0] == 401
    other = {"namespace": "team-b", "name": "their-machine"}
    assert post(server, certs, INVENTORY, inventory(other), token=token)[0] == 403, "a token covers its cluster only"


def test_the_example_token_secret_is_a_token_file_the_server_loads(start_server, certs, token_files):
    token, tokens_text = token_files
    example = d.load_yaml_docs(d.DEPLOY / "examples" / "agent-tokens-secret.yaml")[0]
    text = example["stringData"]["tokens"] + tokens_text
    server = start_server(text)
    assert server.proc.wait_for_json("loaded")["fields"]["agent_tokens"] == len(
        [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    )
    assert post(server, certs, INVENTORY, inventory(), token=token)[0] == 200


def test_removing_a_tokens_line_revokes_it(start_server, certs, token_files):
    token, tokens_text = token_files
    # The file is re-checked every --tls-reload-interval (10 s in the Deployment); shortened here.
    server = start_server(tokens_text, INPLACE_UPDATER_TLS_RELOAD_INTERVAL="200ms")
    assert post(server, certs, INVENTORY, inventory(), token=token)[0] == 200
    server.tokens_file.write_text("# revoked my-cluster\n")
    procs.wait_until(lambda: post(server, certs, INVENTORY, inventory(), token=token)[0] == 401, "revocation")


def test_client_ca_guards_the_hook_paths_and_not_the_agent_api(start_server, certs, token_files):
    # docs/install.md "Hardening": with --client-ca, hook calls need CAPI's client certificate, on the same
    # port where agents keep authenticating with their bearer tokens and no certificate.
    token, tokens_text = token_files
    server = start_server(tokens_text, INPLACE_UPDATER_CLIENT_CA="/tmp/k8s-webhook-server/serving-certs/ca.crt")
    discovery = {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}
    assert post(server, certs, DISCOVERY, discovery)[0] == 401
    assert post(server, certs, DISCOVERY, discovery, client_cert=True)[0] == 200
    assert post(server, certs, INVENTORY, inventory(), token=token)[0] == 200
    assert post(server, certs, INVENTORY, inventory())[0] == 401


def test_without_the_token_secret_the_server_starts_warns_and_picks_it_up_later(start_server, certs, token_files):
    # docs/install.md: the Secret is optional; hooks work without it, agents cannot get in until it exists.
    token, tokens_text = token_files
    server = start_server(None, INPLACE_UPDATER_TLS_RELOAD_INTERVAL="200ms")
    warning = json.loads(server.proc.wait_for_line(
        lambda l: (procs.json_message(l) or "").startswith("no agent tokens: no agent can authenticate"), "the warning"))
    assert warning["level"] == "WARN" and "does not exist" in warning["fields"]["reason"], warning
    discovery = {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}
    assert post(server, certs, DISCOVERY, discovery)[1]["status"] == "Success"
    assert post(server, certs, INVENTORY, inventory(), token=token)[0] == 401
    # What the kubelet does once the Secret is created: the file appears in the mounted directory.
    server.tokens_file.write_text(tokens_text)
    procs.wait_until(lambda: post(server, certs, INVENTORY, inventory(), token=token)[0] == 200, "the new token file")
    assert "agent token file not reloaded" not in server.proc.output(), "an absent file is not an error"


def test_status_explains_a_server_that_capi_never_called(start_server, certs, token_files):
    # The server cannot see namespaces; `status` says what decides whether CAPI calls it at all.
    _, tokens_text = token_files
    server = start_server(tokens_text)

    def status(*args: str) -> subprocess.CompletedProcess:
        return d.run_binary("status", "--server", f"http://{server.health}", *args)

    before = status()
    assert before.returncode == 0, before.stderr
    assert "no CanUpdateMachine, CanUpdateMachineSet or UpdateMachine call answered" in before.stdout
    assert "namespaceSelector" in before.stdout and "inplace-updater/enabled=true" in before.stdout
    as_json = status("--output", "json")
    assert json.loads(as_json.stdout) == [] and "namespaceSelector" in as_json.stderr, "JSON stays JSON"
    discovery = {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}
    post(server, certs, DISCOVERY, discovery)
    assert "namespaceSelector" in status().stdout, "discovery is called whatever the namespaces"
    request = json.loads((d.REPO / "tests" / "fixtures" / "can-update-machine-kcp-version.json").read_text())
    assert post(server, certs, "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine", request)[0] == 200
    after = status()
    assert after.returncode == 0 and "namespaceSelector" not in after.stdout + after.stderr, after.stdout


# ---------------------------------------------------------------- the node agent


def agent_env(tmp_path: pathlib.Path, certs: pathlib.Path, server_url: str, token: str, config: pathlib.Path) -> dict[str, str]:
    """agent.env's settings with the node paths moved into tmp_path (what the bootstrap files place)."""
    settings, _ = d.read_env_file(d.DEPLOY / "node" / "agent.env")
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "root").mkdir(exist_ok=True)
    # The URL of agent.env points at the agent Service; here that is the sandboxed hook port, checked
    # against the certificate under agent.env's host name.
    settings.update({
        "INPLACE_UPDATER_AGENT_SERVER": server_url,
        "INPLACE_UPDATER_AGENT_TLS_SERVER_NAME": urlparse(settings["INPLACE_UPDATER_AGENT_SERVER"]).hostname,
        "INPLACE_UPDATER_AGENT_CA_FILE": str(certs / "ca.crt"),
        "INPLACE_UPDATER_AGENT_TOKEN_FILE": str(tmp_path / "token"),
        "INPLACE_UPDATER_AGENT_CONFIG": str(config),
        "INPLACE_UPDATER_AGENT_STATE_DIR": str(tmp_path / "state"),
        "INPLACE_UPDATER_AGENT_ROOT": str(tmp_path / "root"),
        "INPLACE_UPDATER_AGENT_MACHINE": f"{MACHINE['namespace']}/{MACHINE['name']}",
        "INPLACE_UPDATER_LOG_FORMAT": "json",
    })
    return {"PATH": os.environ["PATH"], "AGENT_START_BIN": str(d.agent_binary()), **settings}


def start_agent(env: dict[str, str]) -> procs.Proc:
    return procs.Proc(["sh", str(d.DEPLOY / "node" / "agent-start")], env=env)


def test_agent_start_runs_the_agent_with_agent_env_and_the_shipped_config(start_server, certs, token_files, tmp_path):
    token, tokens_text = token_files
    server = start_server(tokens_text)
    url = f"https://{server.hooks}"
    agent = start_agent(agent_env(tmp_path / "good", certs, url, token, d.DEPLOY / "node" / "agent.yaml"))
    try:
        started = agent.wait_for_json("agent started")["fields"]
        assert started["agent"] == f"machine {MACHINE['namespace']}/{MACHINE['name']}"
        assert started["state_dir"] == str(tmp_path / "good" / "state")
    finally:
        # Exit status not checked: a SIGTERM this early can land before the agent has installed its
        # signal handler (it does so in a spawned task) and end it by the signal instead.
        agent.stop()

    # Through agent.env's CA file and server name the agent reaches the server (a TLS failure would be
    # logged as a "tls: ..." line), which authenticates the docs' token and then holds it to its
    # scope: a node claiming a Machine of another namespace is told so, by name.
    outsider = agent_env(tmp_path / "outsider", certs, url, token, d.DEPLOY / "node" / "agent.yaml")
    outsider["INPLACE_UPDATER_AGENT_MACHINE"] = "team-b/their-machine"
    agent = start_agent(outsider)
    try:
        agent.wait_for_line(
            lambda l: "scoped to cluster default/my-cluster; it does not cover machine team-b/their-machine" in l,
            "the server's scope refusal, as the agent logs it",
        )
    finally:
        agent.stop()
    # A token the server's file does not hold is refused as such.
    stranger = start_agent(agent_env(tmp_path / "stranger", certs, url, "iu1_" + "B" * 43, d.DEPLOY / "node" / "agent.yaml"))
    try:
        refusal = stranger.wait_for_json("auth: the server refused the token: it is not in the server's token file")["fields"]
        assert "unknown or revoked token" in refusal["error"] and refusal["class"] == "auth", refusal
    finally:
        stranger.stop()


def shipped_configs(objs_node: list[dict]) -> dict[str, str]:
    """Every copy of agent.yaml a node can get: the file, the DaemonSet's ConfigMap, each snippet's."""
    copies = {"deploy/node/agent.yaml": (d.DEPLOY / "node" / "agent.yaml").read_text()}
    cm = next(c for c in d.find(objs_node, "ConfigMap") if c["metadata"]["name"].startswith("inplace-updater-agent-files"))
    copies["DaemonSet ConfigMap"] = cm["data"]["agent.yaml"]
    snippets = {
        "kubeadmconfigtemplate.yaml": lambda o: o["spec"]["template"]["spec"],
        "kubeadmcontrolplane.yaml": lambda o: o["spec"]["kubeadmConfigSpec"],
    }
    for name, spec in snippets.items():
        files = spec(d.load_yaml_docs(d.DEPLOY / "node" / name)[0])["files"]
        copies[name] = next(d.file_text(f) for f in files if f["path"] == "/etc/inplace-updater/agent.yaml")
    return copies


@pytest.mark.parametrize("copy", ["deploy/node/agent.yaml", "DaemonSet ConfigMap", "kubeadmconfigtemplate.yaml", "kubeadmcontrolplane.yaml"])
def test_the_agent_loads_every_shipped_copy_of_its_config(certs, tmp_path, copy):
    # The agent reads and validates --config before anything else; an unusable one ends it at once.
    config = tmp_path / "agent.yaml"
    config.write_text(shipped_configs(d.render(d.DEPLOY / "node"))[copy])
    # No server needed: the agent starts, then keeps retrying an address where nothing listens.
    agent = start_agent(agent_env(tmp_path, certs, "https://127.0.0.1:9", "iu1_x", config))
    try:
        agent.wait_for_json("agent started")
    finally:
        agent.stop()


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("kubelet:\n  flagsFile:", "kubelett:\n  flagsFile:", "unknown field `kubelett`"),
        ('"kubeadm={{bareVersion}}-*"', '"kubeadm={{semver}}-*"', "unknown variable {{semver}}"),
        ("  kubeadmUpgradeNode:\n    commands:\n      - run: [", "  kubeadmUpgradeNode:\n    commands:\n      - run: []\n      - run: [",
         "kubernetes.kubeadmUpgradeNode: commands[0]: argv needs a program"),
        ("  installKubeadm:\n", "  upgradeFirstControlPlane:\n", "unknown field `upgradeFirstControlPlane`"),
    ],
    ids=["unknown-section", "unknown-template", "empty-argv", "old-guessed-shape"],
)
def test_the_agent_refuses_a_broken_config_at_start(certs, tmp_path, old, new, message):
    text = (d.DEPLOY / "node" / "agent.yaml").read_text()
    assert old in text, f"fixture out of date: {old!r}"
    config = tmp_path / "agent.yaml"
    config.write_text(text.replace(old, new, 1))
    agent = start_agent(agent_env(tmp_path, certs, "https://127.0.0.1:9", "iu1_x", config))
    assert agent.wait_exit() != 0
    assert message in agent.output() and "agent started" not in agent.output(), agent.output()
