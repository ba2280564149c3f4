"""The README's first command, run the way a new user runs it: read from README.md, started from a directory of
its own (the command's relative path reaches the repository's scripts through a symlink, so ./certs and ./data
land there), with a plain environment, until /readyz answers; then a hook call with the generated CA, and a
clean stop on SIGTERM.

`.ci/run` builds the binary as `cargo run --release` builds it before these tests, so the command finds it
built; run alone on a stale tree, the first test waits for the build (READY_DEADLINE_S).

The other tests take away what a fresh machine may lack and check that the command says what to install
instead of failing half-way through a build.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import ssl
import subprocess
import tempfile

import pytest

import deploylib as d
import procs

# Longest the command may take to answer /readyz: a no-op `cargo run` takes seconds; a build from a stale
# tree takes minutes on 2 cores.
READY_DEADLINE_S = 900
# The command runs as written, but on free ports: `serve --dev`'s fixed ones (9443, 9440, 8080; README, Quick
# start) are overridden through the flags' environment twins, so a `./scripts/serve-dev` left running on this
# machine does not collide with it. The ports it got are read from its JSON `listening` line.
FREE_PORTS = {"INPLACE_UPDATER_LISTEN": "127.0.0.1:0", "INPLACE_UPDATER_HEALTH_LISTEN": "127.0.0.1:0",
              "INPLACE_UPDATER_METRICS_LISTEN": "127.0.0.1:0", "INPLACE_UPDATER_LOG_FORMAT": "json"}


def first_command() -> str:
    """The first line of the README's first ```sh block, without its comment."""
    block = re.search(r"^```sh\n(.*?)^```$", (d.REPO / "README.md").read_text(), re.M | re.S).group(1)
    return block.splitlines()[0].split("#", 1)[0].strip()


@pytest.fixture
def user_dir():
    """A directory as a user's clone would be for the command: scripts/ there, nothing else. World-readable,
    so that a non-root user can use it too."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="readme-first-"))
    path.chmod(0o755)
    (path / "scripts").symlink_to(d.REPO / "scripts")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plain_env(path: str) -> dict[str, str]:
    """What a login shell of a new user with rustup has: PATH, HOME and rustup's own variables, no more; and the
    build cache's two settings when set (.ci/run sets both), so the first command reuses the build CI made
    instead of compiling the workspace again (CARGO_INCREMENTAL is part of what cargo compares)."""
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    for name in ("CARGO_HOME", "RUSTUP_HOME", "CARGO_TARGET_DIR", "CARGO_INCREMENTAL"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def test_the_first_command_is_the_dev_server_script():
    # The README's choice (Quick start): a script that installs what the build needs, then `cargo run`.
    assert first_command() == "./scripts/serve-dev"
    script = (d.REPO / "scripts" / "serve-dev").read_text()
    assert "exec cargo run --release" in script and "serve --dev" in script
    quick_start = (d.REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for reason in ("protoc", "make", "etcd-client", "jemalloc"):
        assert reason in quick_start, f"the README's Quick start does not say why ({reason})"


def test_the_first_command_starts_the_dev_server(user_dir):
    cargo = shutil.which("cargo")
    assert cargo, "cargo is not on PATH"
    env = {**plain_env(f"{pathlib.Path(cargo).parent}:/usr/local/bin:/usr/bin:/bin"), **FREE_PORTS}
    proc = procs.Proc(["sh", "-c", f"exec {first_command()}"], env=env, cwd=str(user_dir))
    try:
        listening = proc.wait_for_json("listening", timeout=READY_DEADLINE_S)["fields"]
        hooks = listening["hooks"].rsplit(":", 1)
        for name in ("hooks", "health", "metrics"):
            assert listening[name].startswith("127.0.0.1:"), f"--dev listens on loopback only: {listening}"
        procs.wait_until(lambda: health(listening["health"]) == 200 or proc.popen.poll() is not None,
                         "the README's first command serving /readyz", timeout=procs.START_DEADLINE_S, every=0.2)
        assert proc.popen.poll() is None, f"the command exited:\n{proc.output()}"
        # What the README shows next: discovery with the CA the command generated in ./certs.
        ctx = ssl.create_default_context(cafile=str(user_dir / "certs" / "ca.crt"))
        conn = http.client.HTTPSConnection(hooks[0], int(hooks[1]), context=ctx, timeout=10)
        conn.request("POST", "/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery",
                     body=(d.REPO / "tests" / "fixtures" / "discovery-request.json").read_bytes())
        answer = json.loads(conn.getresponse().read())
        conn.close()
        assert answer["status"] == "Success", answer
        assert (user_dir / "data").is_dir(), "the default store is ./data"
        assert "no agent tokens: no agent can authenticate" in proc.output(), "serve --dev has no token file"
    finally:
        # `cargo run` replaces itself with the server, which stops cleanly on SIGTERM.
        if proc.popen.poll() is None:
            os.kill(proc.popen.pid, signal.SIGTERM)
        code = proc.stop()
    assert code == 0, f"the server did not stop cleanly ({code}):\n{proc.output()}"


def health(address: str) -> int | None:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=2)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def bare_path(tmp: pathlib.Path, tools: list[str]) -> str:
    """A PATH of one directory holding only `tools` (symlinks to this machine's): a machine without the rest."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    bindir.chmod(0o755)
    for tool in tools:
        found = shutil.which(tool)
        assert found, f"{tool} is not on this machine"
        (bindir / tool).symlink_to(found)
    return str(bindir)


# What the script itself needs (the rest are shell builtins).
SCRIPT_TOOLS = ["bash", "readlink", "dirname", "id"]


def test_without_apt_get_it_names_what_to_install(user_dir):
    env = plain_env(bare_path(user_dir, SCRIPT_TOOLS + ["cargo"]))
    proc = subprocess.run(["./scripts/serve-dev"], cwd=user_dir, env=env, capture_output=True, text=True,
                          timeout=d.BINARY_TIMEOUT_S, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "missing gcc make protobuf-compiler" in proc.stderr and "no apt-get" in proc.stderr, proc.stderr
    assert "apt-get install -y gcc make protobuf-compiler" in proc.stderr, "the message says what to run"
    assert not (user_dir / "certs").exists(), "nothing started"


def test_as_a_user_without_sudo_it_names_what_to_install(user_dir):
    # A non-root user with apt-get but no sudo: the script cannot install, and says so.
    env = plain_env(bare_path(user_dir, SCRIPT_TOOLS + ["apt-get"]))
    argv = ["./scripts/serve-dev"]
    if os.getuid() == 0:
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("running as root without setpriv (util-linux): no way to run as another user")
        if not all(os.stat(p).st_mode & 0o001 for p in [*d.REPO.parents, d.REPO, d.REPO / "scripts"]):
            pytest.skip(f"{d.REPO} is not reachable for other users")
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    proc = subprocess.run(argv, cwd=user_dir, env=env, capture_output=True, text=True,
                          timeout=d.BINARY_TIMEOUT_S, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not root and no sudo" in proc.stderr and "protobuf-compiler" in proc.stderr, proc.stderr
