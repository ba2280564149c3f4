"""The test runner's settings (.config/nextest.toml) still name the tests they were written for.

nextest reads a filter that matches nothing without a word: a renamed slow test would lose its priority (or the
resume tests their two slots) and CI would only get slower. So every test an override names exactly must still
be a test function, every module it names by prefix must still be a module with tests, and `.ci/run` must run
the profile and parse the version the file requires.
"""

from __future__ import annotations

import re
import tomllib

import deploylib as d

CONFIG = d.REPO / ".config" / "nextest.toml"
CI_RUN = d.REPO / ".ci" / "run"


def TEST_FN(name: str) -> re.Pattern[str]:
    """A test function called `name` (a regular expression): `#[test]` or `#[tokio::test(...)]`, other
    attributes after it, then `fn` or `async fn`."""
    return re.compile(
        r"#\[(?:tokio::)?test(?:\([^)]*\))?\]\s*(?:#\[[^\]]*\]\s*)*(?:async\s+)?fn " + name + r"\("
    )


# Every Rust file a test can live in (the target directories are outside these roots).
RUST_FILES = [path for root in ("src", "tests", "crates") for path in (d.REPO / root).rglob("*.rs")]
CONFIG_DATA = tomllib.loads(CONFIG.read_text(encoding="utf-8"))
OVERRIDES = CONFIG_DATA["profile"]["ci"]["overrides"]


def test_every_test_an_override_names_exists() -> None:
    sources = [path.read_text(encoding="utf-8") for path in RUST_FILES]
    exact = [name for o in OVERRIDES for name in re.findall(r"test\(=([\w:]+)\)", o["filter"])]
    assert exact, "the overrides name no test exactly: the check below would prove nothing"
    for name in exact:
        function = name.rsplit("::", 1)[-1]
        assert any(TEST_FN(function).search(text) for text in sources), (
            f".config/nextest.toml names the test {name}, but no test fn {function} exists: rename it there"
        )


def test_every_module_an_override_names_has_tests() -> None:
    prefixes = [p for o in OVERRIDES for p in re.findall(r"test\(/\^(\w+)::/\)", o["filter"])]
    assert prefixes, "the overrides name no module: the check below would prove nothing"
    for module in prefixes:
        found = [p for p in RUST_FILES if p.stem == module or (p.name == "mod.rs" and p.parent.name == module)]
        assert found, f".config/nextest.toml names the module {module}::, and there is no {module}.rs"
        assert any(TEST_FN(r"\w+").search(p.read_text(encoding="utf-8")) for p in found), (
            f"{module}.rs holds no test, but .config/nextest.toml orders its tests"
        )


def test_ci_runs_the_profile_and_reads_the_required_version() -> None:
    required = CONFIG_DATA["nextest-version"]["required"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", required), required
    # .ci/run finds the version with a sed over this exact line; another layout would install nextest every run.
    line = f'nextest-version = {{ required = "{required}" }}'
    assert line in CONFIG.read_text(encoding="utf-8").splitlines(), f"expected the line {line!r}"
    ci = CI_RUN.read_text(encoding="utf-8")
    assert "cargo nextest run --release --workspace --profile ci" in ci
    assert CONFIG_DATA["profile"]["ci"]["test-threads"] >= 1
    slow = CONFIG_DATA["profile"]["ci"]["slow-timeout"]
    assert slow["terminate-after"] >= 1, "a hung test must be ended, not left to CI's 90 minutes"
