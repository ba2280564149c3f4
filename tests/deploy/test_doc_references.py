"""Every test or function the docs cite as `path.rs::[module::]name` exists there, so a claim's evidence can be found."""
import pathlib
import re

import deploylib as d

DOCS = ["README.md", "CONTRIBUTING.md", "SECURITY.md", *sorted(str(p.relative_to(d.REPO)) for p in (d.REPO / "docs").glob("*.md")),
        "crates/agent/README.md", "crates/store/README.md"]
CITATION = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.rs)::((?:\w+::)*\w+)`")


def citations():
    for doc in DOCS:
        for path, name in CITATION.findall((d.REPO / doc).read_text()):
            yield doc, path, name


def test_the_docs_cite_tests_at_all():
    assert sum(1 for _ in citations()) >= 10


def test_every_cited_function_is_in_the_cited_file():
    missing = []
    for doc, path, name in citations():
        file = d.REPO / path
        # A file path may be given from its crate's root (crates/agent/README.md cites src/...).
        candidates = [file, *(d.REPO / "crates" / c / path for c in ("agent", "store", "core"))]
        found = next((f for f in candidates if f.is_file()), None)
        function = name.split("::")[-1]
        if found is None or not re.search(rf"\b(fn|mod) {re.escape(function)}\b", found.read_text()):
            missing.append(f"{doc}: {path}::{name}")
    assert not missing, "cited but not found:\n" + "\n".join(missing)
