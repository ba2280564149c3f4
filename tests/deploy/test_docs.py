"""The documentation pages held against the repository and the code: every relative link (and its #anchor)
resolves, every constant, annotation, setting and environment variable they name exists, the README stays a
front door, and the offline `inplace-updater` commands the pages show run as written.

The README's own commands are run by tests/integration/readme.rs; install.md's token, kustomization, clusterctl
and namespace blocks by test_binary.py, test_install_docs.py and test_clusterctl.py.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest

import deploylib as d

PAGES = [d.REPO / p for p in ("README.md", "CONTRIBUTING.md", "SECURITY.md", "deploy/README.md")] + sorted(
    (d.REPO / "docs").glob("*.md")) + sorted((d.REPO / "crates").glob("*/README.md"))
OPERATIONS = d.REPO / "docs" / "operations.md"
# The README is the front door (issue 27): what it is, two commands, a demo, the picture, links.
README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
# An identifier of the code in a doc's `code span`: SCREAMING_SNAKE with at least one underscore.
CONSTANT = re.compile(r"(?<![\w*])[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9](?![\w*])")
# Names in code spans that are not the code's: environment variables (checked below) and Linux capabilities.
NOT_CONSTANTS = re.compile(r"INPLACE_UPDATER_\w+|RUST_LOG|CAP_\w+|XDG_\w+|EXP_\w+|CARGO_\w+|CI_\w+|FUZZ_\w+")
SOURCES = [p for top in ("src", "crates", "examples", "benches") for p in (d.REPO / top).rglob("*.rs")]
ANNOTATION = re.compile(r"inplace-updater\.dev/[a-z]+(?:-[a-z]+)*")
ENV_NAME = re.compile(r"\bINPLACE_UPDATER_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")
# The subcommands whose --help lists every environment variable the binary reads.
SUBCOMMANDS = [["serve"], ["agent"], ["status"], ["retry"], ["diff"], ["token", "create"], ["certs"],
               ["policy", "check"], ["demo"]]


def rel(path: pathlib.Path) -> str:
    return str(path.relative_to(d.REPO))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (except - and _), spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


# ---------------------------------------------------------------- links


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        file = (page.parent / path_part).resolve() if path_part else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {rel(file)}")
    assert not broken, "\n".join(broken)


def test_the_link_check_can_fail(tmp_path):
    assert slug("2. Turn on the feature gates") == "2-turn-on-the-feature-gates"
    assert slug("What in-place-only stops, and what it cannot") == "what-in-place-only-stops-and-what-it-cannot"
    assert "bounds" in anchors(OPERATIONS) and "no-such-section" not in anchors(OPERATIONS)


def test_the_index_lists_every_page():
    index = (d.REPO / "docs" / "README.md").read_text()
    for page in (d.REPO / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not link {page.name}"
    assert "(../CONTRIBUTING.md)" in index


def test_the_readme_stays_a_front_door():
    readme = (d.REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "README.md grew past a front door: move detail to docs/"
    for page in ("docs/install.md", "docs/operations.md", "docs/compatibility.md", "docs/performance.md",
                 "docs/architecture.md", "CONTRIBUTING.md"):
        assert f"({page})" in readme, f"the README does not link {page}"


# ---------------------------------------------------------------- names of the code


def defined_constants() -> set[str]:
    names = set()
    for path in SOURCES:
        names.update(re.findall(r"\bconst ([A-Z][A-Z0-9_]*)\s*:", path.read_text()))
    return names


@pytest.mark.parametrize("page", [OPERATIONS, d.REPO / "docs" / "performance.md"], ids=rel)
def test_every_constant_a_page_names_is_in_the_code(page):
    named = {n for span in code_spans(page.read_text()) for n in CONSTANT.findall(span)
             if not NOT_CONSTANTS.fullmatch(n)}
    assert len(named) >= 10 or page != OPERATIONS, "the Bounds table names the constants"
    missing = sorted(named - defined_constants())
    assert not missing, f"{rel(page)} names constants the code does not define: {missing}"


def test_the_constant_check_can_fail():
    assert "MAX_BODY_BYTES" in defined_constants()
    assert "MAX_NO_SUCH_BOUND" not in defined_constants()


def test_every_annotation_the_docs_name_is_one_the_code_reads():
    code = "\n".join(p.read_text() for p in SOURCES)
    known = set(re.findall(r'"(inplace-updater\.dev/[a-z-]+)"', code))
    assert {"inplace-updater.dev/retry", "inplace-updater.dev/paused"} <= known
    unknown = {f"{rel(p)}: {a}" for p in PAGES for a in ANNOTATION.findall(p.read_text()) if a not in known}
    assert not unknown, sorted(unknown)


def setting_keys() -> list[str]:
    """The ExtensionConfig setting keys, in the order of inplace-core's SETTINGS table (settings/table.rs)."""
    src = d.REPO / "crates" / "core" / "src"
    text = "\n".join(p.read_text() for p in src.rglob("*.rs"))
    consts = dict(re.findall(r'pub const ([A-Z_]+): &str = "([^"]+)";', text))
    table = (src / "settings" / "table.rs").read_text().split("pub const SETTINGS", 1)[1].split("\n];", 1)[0]
    return [key.strip('"') if key.startswith('"') else consts[key.split("::")[-1]]
            for key in re.findall(r"^\s*key: (\"[^\"]+\"|[\w:]+),$", table, re.M)]


def test_the_settings_table_is_every_setting_the_code_knows():
    keys = setting_keys()
    assert "inPlace" in keys and "maintenanceWindow" in keys, keys
    section = OPERATIONS.read_text().split("## What goes in place: policy and settings", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert documented == keys, f"docs/operations.md settings {documented} vs the code's {keys}"


def test_every_environment_variable_the_docs_name_exists():
    helps = "\n".join(d.run_binary(*argv, "--help").stdout for argv in SUBCOMMANDS)
    known = set(re.findall(r"\[env: (INPLACE_UPDATER_[A-Z0-9_]+)", helps))
    assert "INPLACE_UPDATER_LISTEN" in known and "INPLACE_UPDATER_AGENT_SERVER" in known, "help shows env names"
    # Besides the binary's: the password that has no flag, clusterctl's variables, and the tests' own
    # INPLACE_UPDATER_BIN (the binary tests/ runs, deploylib.binary()).
    known |= d.SERVE_ENV_ONLY | d.AGENT_ENV_DEPRECATED | set(d.clusterctl_variables()) | {"INPLACE_UPDATER_BIN"}
    unknown = {f"{rel(p)}: {n}" for p in PAGES for n in ENV_NAME.findall(p.read_text()) if n not in known}
    assert not unknown, sorted(unknown)


# ---------------------------------------------------------------- commands, run


def offline_commands() -> list[tuple[pathlib.Path, str]]:
    """Every `inplace-updater policy …` / `inplace-updater diff …` line of a ```sh block in docs/: they need
    no cluster and no server, so they run here as written (from the repository root)."""
    found = []
    for page in sorted((d.REPO / "docs").glob("*.md")):
        for block in re.findall(r"^```sh\n(.*?)^```$", page.read_text(), re.M | re.S):
            for line in block.splitlines():
                if re.match(r"inplace-updater (policy|diff) ", line.strip()):
                    found.append((page, line.strip()))
    return found


def test_the_docs_show_offline_commands():
    assert len(offline_commands()) >= 2


@pytest.mark.parametrize("page,command", offline_commands(), ids=lambda v: v if isinstance(v, str) else rel(v))
def test_every_offline_command_runs_as_written(page, command, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "inplace-updater").symlink_to(d.binary())
    m = re.search(r"# exit (\d+)", command)
    expected = int(m.group(1)) if m else 0
    proc = subprocess.run(["sh", "-c", command], cwd=d.REPO, capture_output=True, text=True,
                          env={"PATH": f"{bindir}:{os.environ['PATH']}"}, timeout=d.BINARY_TIMEOUT_S, check=False)
    assert proc.returncode == expected, f"{rel(page)}: {command}\n{proc.stdout}\n{proc.stderr}"
