"""Lints the Dockerfile without a Docker daemon (no image is built in CI).

Rules, hadolint-like: multi-stage; every base image pinned by tag or digest and never `latest`; no
ADD (and certainly no ADD of URLs); `COPY --from` names an earlier stage; `cargo build --locked`;
the final (default) stage is distroless or scratch, runs as a numeric non-root USER and has an
exec-form ENTRYPOINT on the binary it copied in. Each rule is shown to fire on a broken Dockerfile.
The build stage runs scripts/build-release (which `.ci/run` also runs, without Docker): the script's
`cargo build` is held to the same rules as one written in a RUN line.
"""

from __future__ import annotations

import json
import re

import pytest

import deploylib as d

DOCKERFILE = d.REPO / "Dockerfile"
BUILD_SCRIPT = d.REPO / "scripts" / "build-release"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    out, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def stages(text: str) -> list[dict]:
    result: list[dict] = []
    for ins, args in instructions(text):
        if ins == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2].lower() if len(words) >= 3 and words[1].lower() == "as" else None
            result.append({"image": words[0], "name": name, "body": []})
        elif result:
            result[-1]["body"].append((ins, args))
    return result


def script_builds(script: str) -> list[str]:
    """The `cargo build` and `cargo rustc` command lines of the build script (comments left out)."""
    return [line.strip() for line in script.splitlines() if line.strip().startswith(("cargo build", "cargo rustc"))]


def lint(text: str, script: str | None = None) -> list[str]:
    """Every rule the Dockerfile breaks, as readable sentences; empty when clean. `script`: the text of
    scripts/build-release, which a RUN line may call instead of running cargo itself."""
    script = BUILD_SCRIPT.read_text() if script is None else script
    problems: list[str] = []
    all_stages = stages(text)
    if len(all_stages) < 2:
        problems.append("not multi-stage: build and runtime must be separate stages")
    args = {m.group(1): m.group(2) for m in re.finditer(r"^ARG (\w+)=(\S+)", text, re.M)}
    seen: list[str] = []
    for stage in all_stages:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), stage["image"])
        if image.lower() not in seen and image != "scratch":
            ref = image.split("@", 1)
            name_tag = ref[0].rsplit("/", 1)[-1]
            if len(ref) == 1 and ":" not in name_tag:
                problems.append(f"FROM {image}: no tag or digest")
            elif name_tag.endswith(":latest"):
                problems.append(f"FROM {image}: `latest` tag")
        for ins, rest in stage["body"]:
            if ins == "ADD":
                kind = "a URL" if re.search(r"(https?|ftp|git)://|git@", rest) else "a local file (use COPY)"
                problems.append(f"ADD of {kind}: {rest}")
            if ins == "COPY":
                m = re.search(r"--from=(\S+)", rest)
                if m and m.group(1).lower() not in seen:
                    problems.append(f"COPY --from={m.group(1)}: no earlier stage of that name")
            if ins == "RUN" and "cargo build" in rest and "--locked" not in rest:
                problems.append("cargo build without --locked: the image would not build from Cargo.lock")
            if ins == "RUN" and "scripts/build-release" in rest:
                builds = script_builds(script)
                if not builds:
                    problems.append("scripts/build-release runs no cargo build")
                for build in builds:
                    if "--locked" not in build:
                        problems.append("cargo build without --locked in scripts/build-release: the image would not build from Cargo.lock")
        if stage["name"]:
            seen.append(stage["name"])
    if not all_stages:
        return problems + ["no FROM"]

    final = all_stages[-1]
    if not re.match(r"^(gcr\.io/distroless/|scratch$)", final["image"]):
        problems.append(f"final stage {final['image']}: not distroless or scratch")
    users = [rest for ins, rest in final["body"] if ins == "USER"]
    if not users:
        problems.append("final stage has no USER: it would run as root")
    elif not re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", users[-1]):
        problems.append(f"final USER {users[-1]!r}: must be a numeric non-root uid (runAsNonRoot checks numbers)")
    entrypoints = [rest for ins, rest in final["body"] if ins == "ENTRYPOINT"]
    if not entrypoints:
        problems.append("final stage has no ENTRYPOINT")
    else:
        try:
            argv = json.loads(entrypoints[-1])
        except json.JSONDecodeError:
            argv = None
        if not isinstance(argv, list) or not argv:
            problems.append(f"ENTRYPOINT {entrypoints[-1]}: not exec form (signals would go to a shell)")
        else:
            copied = [rest.split()[-1] for ins, rest in final["body"] if ins == "COPY"]
            if argv[0] not in copied or not argv[0].endswith("/inplace-updater"):
                problems.append(f"ENTRYPOINT {argv[0]}: not the inplace-updater binary copied into this stage")
    return problems


def test_the_dockerfile_is_clean():
    assert lint(DOCKERFILE.read_text()) == []


def test_the_default_stage_is_the_server_and_the_agent_image_exists():
    all_stages = stages(DOCKERFILE.read_text())
    names = [s["name"] for s in all_stages]
    assert names[-1] == "server" and "node-agent" in names and "binary" in names
    final_cmd = [rest for ins, rest in all_stages[-1]["body"] if ins == "CMD"]
    assert json.loads(final_cmd[-1]) == ["serve"]
    deployment_user = 65532
    assert f"USER {deployment_user}:{deployment_user}" in DOCKERFILE.read_text(), "deploy/base runs as 65532"
    build = next(s for s in all_stages if s["name"] == "build")
    run = " ".join(rest for ins, rest in build["body"] if ins == "RUN")
    assert "scripts/build-release" in run, "the image must ship what scripts/build-release builds and checks (CI runs it)"
    script = BUILD_SCRIPT.read_text()
    assert 'target="$arch-unknown-linux-musl"' in script, "the binary must be static so that it runs on any node"
    assert any("--target \"$target\"" in b for b in script_builds(script))


BROKEN = {
    "`latest` tag": ("FROM gcr.io/distroless/static-debian12:nonroot AS server", "FROM gcr.io/distroless/static-debian12:latest AS server"),
    "no tag or digest": ("FROM debian:bookworm-slim AS node-agent", "FROM debian AS node-agent"),
    "ADD of a URL": ("WORKDIR /src", "WORKDIR /src\nADD https://example.com/tool.tar.gz /tmp/"),
    "must be a numeric non-root uid": ("USER 65532:65532", "USER root"),
    "would run as root": ("USER 65532:65532\n", ""),
    "not exec form": ('ENTRYPOINT ["/usr/local/bin/inplace-updater"]\nCMD ["serve"]', "ENTRYPOINT /usr/local/bin/inplace-updater serve"),
    "no earlier stage": ("COPY --from=build /out/inplace-agent /inplace-agent", "COPY --from=builder /out/inplace-agent /inplace-agent"),
    "cargo build without --locked in scripts/build-release": ("cargo build --release --locked", "cargo build --release"),
    "not distroless or scratch": ("FROM gcr.io/distroless/static-debian12:nonroot AS server", "FROM debian:bookworm-slim AS server"),
    "not multi-stage": (None, "FROM gcr.io/distroless/static-debian12:nonroot\nCOPY inplace-updater /usr/local/bin/inplace-updater\nUSER 65532\nENTRYPOINT [\"/usr/local/bin/inplace-updater\"]\n"),
}


@pytest.mark.parametrize("rule", BROKEN)
def test_each_rule_fires_on_a_broken_dockerfile(rule):
    old, new = BROKEN[rule]
    text = DOCKERFILE.read_text()
    script = BUILD_SCRIPT.read_text()
    if old is None:
        broken = new
    elif old in text:
        broken = text.replace(old, new, 1)
    else:
        # A rule about the build the Dockerfile delegates: break the script instead.
        assert old in script, f"test fixture out of date: {old!r} in neither the Dockerfile nor the build script"
        broken, script = text, script.replace(old, new, 1)
    problems = lint(broken, script)
    assert any(rule in p for p in problems), problems


def test_dockerignore_keeps_keys_and_build_output_out():
    ignored = [l.strip() for l in (d.REPO / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    for pattern in ("target/", ".git/", "certs/*.key"):
        assert pattern in ignored, pattern
    for needed in ("Cargo.lock", "Cargo.toml", "src", "crates"):
        assert not any(p.rstrip("/") == needed for p in ignored), f"{needed} is needed by the build"
