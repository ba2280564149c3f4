#!/usr/bin/env python3
"""Renders deploy/clusterctl/runtime-extension-components.yaml, the components YAML of the clusterctl
RuntimeExtensionProvider `inplace-updater`, from deploy/ (`kubectl kustomize deploy/clusterctl`), and puts
clusterctl variables where an installation differs (clusterctl substitutes `${VAR}` and `${VAR:=default}` from
the environment or its config file when it installs the provider).

    python3 deploy/clusterctl/render.py           # writes the file
    python3 deploy/clusterctl/render.py --check   # exit 1 if the file is not what deploy/ renders to

Needs kubectl 1.27 or newer (kustomize v5); $KUBECTL names another one. Only the standard library.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
OUTPUT = HERE / "runtime-extension-components.yaml"
# Bound on one `kubectl kustomize` run; it takes well under a second.
KUSTOMIZE_TIMEOUT_S = 60

NAMESPACE = "inplace-updater-system"
MEMORY_LIMIT = "544Mi"

# Every clusterctl variable of the components: name -> (default or None when required, what it sets).
# docs/install.md documents each (tests/deploy/test_clusterctl.py checks that it does).
VARIABLES = {
    "INPLACE_UPDATER_NAMESPACE": (NAMESPACE, "the namespace of every object, and the references to it"),
    "INPLACE_UPDATER_IMAGE": (None, "the server image (no default: no image is published)"),
    "INPLACE_UPDATER_MEMORY_LIMIT": (MEMORY_LIMIT, "the server container's memory limit"),
}


def var(name: str) -> str:
    default = VARIABLES[name][0]
    return "${%s}" % name if default is None else "${%s:=%s}" % (name, default)


def substitute(text: str, pattern: str, replacement: str, expected: int) -> str:
    """Replaces every match of `pattern`; fails unless there were exactly `expected` of them, so a change in
    deploy/ that moves a value cannot silently leave it fixed."""
    new, count = re.subn(pattern, replacement, text, flags=re.M)
    if count != expected:
        raise SystemExit(f"render.py: {pattern!r} matched {count} times, expected {expected}: update render.py")
    return new


def render() -> str:
    kubectl = os.environ.get("KUBECTL", "kubectl")
    proc = subprocess.run(
        [kubectl, "kustomize", str(HERE)], capture_output=True, text=True, timeout=KUSTOMIZE_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"render.py: {kubectl} kustomize {HERE}: {proc.stderr.strip()}")
    text = proc.stdout
    # The namespace: object namespaces, the Namespace itself, the Service and Secret references of the
    # ExtensionConfig and the certificate's DNS names (clusterctl's --target-namespace rewrites only some of
    # these, hence a variable).
    count = text.count(NAMESPACE)
    if count < 10:
        raise SystemExit(f"render.py: {NAMESPACE} appears only {count} times: update render.py")
    text = substitute(text, re.escape(NAMESPACE), var("INPLACE_UPDATER_NAMESPACE").replace("\\", "\\\\"), count)
    text = substitute(text, r"^(\s+image: )inplace-updater:v\S+$", r"\g<1>" + var("INPLACE_UPDATER_IMAGE"), 1)
    text = substitute(
        text, r"^(\s+memory: )" + re.escape(MEMORY_LIMIT) + "$", r"\g<1>" + var("INPLACE_UPDATER_MEMORY_LIMIT"), 1
    )
    header = [
        "# inplace-updater: components of the clusterctl RuntimeExtensionProvider `inplace-updater`.",
        "# Generated from deploy/ by `python3 deploy/clusterctl/render.py`; do not edit. clusterctl variables:",
    ]
    for name, (default, what) in VARIABLES.items():
        header.append(f"#   {name}: {what}" + ("; required" if default is None else f" (default {default})"))
    header.append("# Install and upgrade: docs/install.md, \"Installing with clusterctl\".")
    return "\n".join(header) + "\n" + text


def main() -> int:
    text = render()
    if sys.argv[1:] == ["--check"]:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(HERE.parents[1])} is stale: run python3 deploy/clusterctl/render.py", file=sys.stderr)
            return 1
        return 0
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(HERE.parents[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
