"""deploy/ against the real `inplace-updater` binary: every setting the manifests and agent.env use
exists and its value passes the binary's own parser, the shipped policy passes `policy check`, the
ExtensionConfig settings pass the server's settings parser (through `diff --setting`), and the token
commands of docs/install.md produce what the docs say.

The binary is $INPLACE_UPDATER_BIN or target/release/inplace-updater. Without it these tests are
skipped, except under CI=true, where they fail (CI builds the binary first).
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest
import yaml

import deploylib as d

POLICY = d.DEPLOY / "base" / "policy.yaml"
KUSTOMIZATIONS = [p for p in d.kustomization_dirs() if not d.is_component(p)]
SERVER_RENDERS = [p for p in KUSTOMIZATIONS if p not in (d.DEPLOY / "node", d.DEPLOY / "extension")]


def rel(p: pathlib.Path) -> str:
    return str(p.relative_to(d.REPO))


@pytest.fixture(scope="module")
def rendered() -> dict[pathlib.Path, list[dict]]:
    return {p: d.render(p) for p in KUSTOMIZATIONS}


def as_flags(subcommand: str, env: dict[str, str]) -> list[str]:
    """The command line equivalent to `env`: each variable as its flag (env-only ones are left out)."""
    options = d.cli_options(subcommand)
    by_env = {o["env"]: (flag, o["takes_value"]) for flag, o in options.items() if o["env"]}
    flags: list[str] = []
    for name, value in env.items():
        if name not in by_env:
            continue
        flag, takes_value = by_env[name]
        if takes_value:
            flags += [flag, value]
        elif value.lower() == "true":
            flags.append(flag)
    return flags


def parses(subcommand: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Has the binary parse these settings as flags. clap checks every value given before `--help`
    (addresses, durations, enums, store URLs, ranges) and then prints help instead of running."""
    return d.run_binary(subcommand, *as_flags(subcommand, env), "--help")


# ---------------------------------------------------------------- settings are the binary's


def test_the_offline_setting_lists_are_the_binarys():
    assert set(d.env_twins("serve")) == d.SERVE_ENV, "update deploylib.SERVE_ENV from src/cmd/cli/serve.rs"
    assert d.env_only_settings("serve") == d.SERVE_ENV_ONLY
    assert set(d.env_twins("agent")) == d.AGENT_ENV, "update deploylib.AGENT_ENV from crates/agent/src/cli"
    agent_help = d.run_binary("agent", "--help").stdout
    for name in d.AGENT_ENV_DEPRECATED:
        assert name in agent_help, f"`agent --help` does not say it still reads {name}"


def test_no_environment_variable_means_one_thing_to_serve_and_another_to_the_agent():
    """A server started with a node's environment (agent.env) must not take the agent's settings for its own
    (issue 43.8: both read INPLACE_UPDATER_AGENT_BINARY, the server handed out the node's path)."""
    serve = set(d.env_twins("serve")) | d.env_only_settings("serve")
    agent = set(d.env_twins("agent")) | d.AGENT_ENV_DEPRECATED
    shared = (serve & agent) - {"INPLACE_UPDATER_LOG_FORMAT"}
    assert not shared, f"read by both `serve` and `agent`: {sorted(shared)}"



def test_inplace_agent_takes_what_inplace_updater_agent_takes():
    """Nodes run `inplace-agent` (agent-start, the DaemonSet): the flags and env twins deploy/ sets are its too."""
    proc = subprocess.run([str(d.agent_binary()), "--help"], capture_output=True, text=True, timeout=d.BINARY_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    flags = set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", proc.stdout, re.M))
    assert set(re.findall(r"\[env: ([A-Z0-9_]+)=", proc.stdout)) == set(d.env_twins("agent"))
    assert flags - {"--version"} == set(d.cli_options("agent")) - {"--version"}


@pytest.mark.parametrize("directory", SERVER_RENDERS, ids=rel)
def test_the_server_accepts_every_setting_the_manifests_give_it(rendered, directory):
    dep, server = d.server_deployment(rendered[directory])
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][:1] == ["serve"]
    env = d.env_of(server)
    known = set(d.env_twins("serve")) | d.env_only_settings("serve")
    unknown = sorted(set(env) - known)
    assert not unknown, f"`inplace-updater serve` has no setting {unknown}"
    proc = parses("serve", {k: v for k, v in env.items() if v is not None})
    assert proc.returncode == 0, f"`serve` refuses a value of {rel(directory)}: {proc.stderr}"


def test_the_server_value_check_can_fail(rendered):
    _, server = d.server_deployment(rendered[d.DEPLOY])
    env = {**d.env_of(server), "INPLACE_UPDATER_LISTEN": "0.0.0.0:nine-four-four-three"}
    proc = parses("serve", env)
    assert proc.returncode != 0 and "--listen" in proc.stderr
    proc = parses("serve", {**d.env_of(server), "INPLACE_UPDATER_RETRY_AFTER_SECONDS": "600"})
    assert proc.returncode != 0 and "--retry-after-seconds" in proc.stderr


def test_the_agent_accepts_every_setting_of_agent_env():
    active, examples = d.read_env_file(d.DEPLOY / "node" / "agent.env")
    known = set(d.env_twins("agent"))
    unknown = sorted((set(active) | set(examples)) - known)
    assert not unknown, f"`inplace-updater agent` has no setting {unknown}"
    proc = parses("agent", active)
    assert proc.returncode == 0, proc.stderr
    # Each commented-out example, once uncommented, is accepted too (the Machine ones one at a time).
    for name, value in examples.items():
        proc = parses("agent", {**active, name: value})
        assert proc.returncode == 0, f"{name}={value}: {proc.stderr}"
    proc = parses("agent", {**active, "INPLACE_UPDATER_AGENT_MACHINE": "not-namespace-slash-name"})
    assert proc.returncode != 0 and "NAMESPACE/NAME" in proc.stderr, "the value check can fail"


# ---------------------------------------------------------------- the policy


def test_the_shipped_policy_is_the_builtin_one_and_checks():
    proc = d.run_binary("policy", "check", str(POLICY))
    assert proc.returncode == 0, proc.stderr
    rules = yaml.safe_load(POLICY.read_text())["rules"]
    assert proc.stdout.strip() == f"{POLICY}: {len(rules)} rules, valid"
    show = d.run_binary("policy", "show")
    assert show.returncode == 0 and show.stdout == POLICY.read_text(), \
        "deploy/base/policy.yaml is not `inplace-updater policy show`: refresh it (policy show > deploy/base/policy.yaml)"


def test_the_mounted_policy_checks(rendered, tmp_path):
    # What the Pod really reads: the generated ConfigMap's key at INPLACE_UPDATER_POLICY.
    objs = rendered[d.DEPLOY]
    _, server = d.server_deployment(objs)
    key = pathlib.PurePath(d.env_of(server)["INPLACE_UPDATER_POLICY"]).name
    cm = next(c for c in d.find(objs, "ConfigMap") if c["metadata"]["name"].startswith("inplace-updater-policy"))
    (tmp_path / key).write_text(cm["data"][key])
    assert d.run_binary("policy", "check", str(tmp_path / key)).returncode == 0


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("action: kubernetes-version\n", "action: kubernetes-versions\n", "kubernetes-versions"),
        ("    paths: [spec.failureDomain]\n", "    paths: [spec.failureDomain]\n    action: files\n", "failure-domain"),
        ("objects: [{kind: Machine, apiGroup: cluster.x-k8s.io}]", "object: {kind: Machine, apiGroup: cluster.x-k8s.io}", "object"),
        ("check: kubernetes-upgrade", "check: any-upgrade", "any-upgrade"),
    ],
    ids=["unknown-action", "two-verdicts", "old-guessed-shape", "unknown-check"],
)
def test_a_broken_policy_fails_the_check(tmp_path, old, new, message):
    text = POLICY.read_text()
    assert old in text, f"fixture out of date: {old!r}"
    broken = tmp_path / "policy.yaml"
    broken.write_text(text.replace(old, new, 1))
    proc = d.run_binary("policy", "check", str(broken))
    assert proc.returncode != 0, f"`policy check` accepted a broken policy:\n{proc.stdout}"
    assert message in proc.stderr, proc.stderr


# ---------------------------------------------------------------- ExtensionConfig settings


MACHINE = """apiVersion: cluster.x-k8s.io/v1beta2
kind: Machine
metadata: {name: my-cluster-control-plane-abcde, namespace: default}
spec: {clusterName: my-cluster, version: VERSION}
"""


def diff_with_settings(tmp_path: pathlib.Path, settings: dict[str, str]) -> subprocess.CompletedProcess:
    """`inplace-updater diff` of a patch upgrade under the shipped policy and these settings: the
    server's own settings parser and decision, without a server."""
    (tmp_path / "current.yaml").write_text(MACHINE.replace("VERSION", "v1.34.1"))
    (tmp_path / "desired.yaml").write_text(MACHINE.replace("VERSION", "v1.34.2"))
    args = ["diff", str(tmp_path / "current.yaml"), str(tmp_path / "desired.yaml"), "--policy", str(POLICY)]
    for key, value in settings.items():
        args += ["--setting", f"{key}={value}"]
    return d.run_binary(*args)


@pytest.mark.parametrize("directory", [p for p in KUSTOMIZATIONS if p != d.DEPLOY / "node"], ids=rel)
def test_the_server_accepts_the_extension_config_settings(rendered, tmp_path, directory):
    for ext in d.find(rendered[directory], "ExtensionConfig"):
        proc = diff_with_settings(tmp_path, ext["spec"].get("settings", {}))
        assert proc.returncode == 0, f"{d.describe(ext)}: {proc.stderr or proc.stdout}"
        assert proc.stdout.startswith("in place"), "the shipped install must upgrade Kubernetes in place"


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"inPlace": "true", "inplace": "true"}, 'unknown setting "inplace"'),
        ({"mode": "in-place"}, "setting mode: invalid value"),
        ({"disableActions": "files,kernel"}, "setting disableActions: invalid value"),
    ],
)
def test_the_server_refuses_unknown_settings(tmp_path, settings, message):
    proc = diff_with_settings(tmp_path, settings)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def test_disabling_the_action_makes_the_upgrade_a_rollout(tmp_path):
    proc = diff_with_settings(tmp_path, {"inPlace": "true", "disableActions": "kubernetes-version"})
    assert proc.returncode == 3 and "disabled" in proc.stdout, proc.stdout


# ---------------------------------------------------------------- agent tokens, as docs/install.md makes them


def test_the_docs_token_commands_make_a_token_and_its_line(tmp_path):
    d.run_docs_token_block(tmp_path)
    token = (tmp_path / "my-cluster.token").read_text()
    assert re.fullmatch(r"iu1_[A-Za-z0-9_-]{40,}\n", token), token
    assert (tmp_path / "my-cluster.token").stat().st_mode & 0o077 == 0, "the token file must be private"
    lines = [l for l in (tmp_path / "agent-tokens").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert len(lines) == 1 and d.TOKEN_LINE.fullmatch(lines[0]), lines
    assert " cluster=default/my-cluster " in lines[0] + " " and " expires=" in lines[0]
    assert token.strip() not in (tmp_path / "agent-tokens").read_text(), "the server file must hold hashes only"
    # Running it again (a second cluster, a rotation) appends; nothing is overwritten.
    d.run_docs_token_block(tmp_path)
    assert len((tmp_path / "agent-tokens").read_text().splitlines()) == 2


def test_token_create_prints_what_the_docs_say():
    proc = d.run_binary("token", "create", "--namespace", "default", "--cluster", "my-cluster")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [l for l in lines if l.startswith("iu1_")] and [l for l in lines if d.TOKEN_LINE.fullmatch(l)]
    assert " issued=" in proc.stdout and " expires=" in proc.stdout, "without --ttl: a year, rotated before it ends"
    proc = d.run_binary("token", "create", "--namespace", "default", "--machine", "my-cluster-md-0-abc", "--ttl", "0s")
    assert any(re.fullmatch(r"sha256:[0-9a-f]{64} machine=default/my-cluster-md-0-abc issued=\S+", l)
               for l in proc.stdout.splitlines()), proc.stdout
    assert "expires=" not in proc.stdout, "--ttl 0s: the token does not expire"
