"""Every "design/scheduling.md §N" / "design/notes.md §N" citation names a section that exists.

The code, the docs, the benchmarks and the tests cite the specification and the implementation notes by section
number. This test collects those citations and checks each against the headings of the cited file (a heading
``## 3. ...`` or ``### 3.1 ...`` defines §3 and §3.1), and that no citation of the old outside documents
(``seed §``, ``DESIGN §``) is left.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design"
SCANNED = ("lightning_hybrid_rollout", "docs", "benchmarks", "tests")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt"}
CITATION = re.compile(r"design/(scheduling|notes)\.md §(\d+(?:\.\d+)*)")
STALE = re.compile(r"\b(?i:seed|design) §")
HEADING = re.compile(r"^#{1,6}\s+(?:§\s*)?(\d+(?:\.\d+)*)\.?\s", re.M)


def sections(path: Path) -> set[str]:
    """The section numbers a Markdown file defines by its headings."""
    return set(HEADING.findall(path.read_text()))


def scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        files += [p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    return sorted(files)


def citations() -> list[tuple[str, int, str, str]]:
    """(file relative to the repository, line, cited document, section) for every citation."""
    found = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for doc, section in CITATION.findall(line):
                found.append((str(path.relative_to(REPO)), number, doc, section))
    return found


@pytest.mark.parametrize("doc", ["scheduling", "notes"])
def test_the_design_documents_number_their_sections(doc: str) -> None:
    numbered = sections(DESIGN / f"{doc}.md")
    assert {str(n) for n in range(1, 8)} <= numbered, f"docs/design/{doc}.md misses a top-level section"


def test_the_specification_keeps_verls_subsection_numbers() -> None:
    expected = {"3.1", "3.2", "3.3", "4.1", "4.2", "4.3", "4.4", "4.5"}
    missing = expected - sections(DESIGN / "scheduling.md")
    assert not missing, f"docs/design/scheduling.md misses §{', §'.join(sorted(missing))}"


def test_every_cited_section_exists() -> None:
    found = citations()
    assert found, "no design/*.md citation found: the scan looks in the wrong place"
    defined = {doc: sections(DESIGN / f"{doc}.md") for doc in ("scheduling", "notes")}
    broken = [f"{file}:{line}: design/{doc}.md §{sec}" for file, line, doc, sec in found if sec not in defined[doc]]
    assert not broken, "citations of sections that do not exist:\n" + "\n".join(broken)


def test_no_citation_of_the_outside_documents_is_left() -> None:
    stale = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}"
        for path in scanned_files()
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if STALE.search(line)
    ]
    assert not stale, "cite design/scheduling.md or design/notes.md instead:\n" + "\n".join(stale)
