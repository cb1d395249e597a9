"""The docs are maps: every module path ARCHITECTURE.md, the READMEs and docs/ name must
exist in the tree, and every relative link they hold must lead to a file that exists and
to a heading it has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w/.])((?:common|producer|worker|ops|tests)/[\w/]+\.(?:py|c|md|json))\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS = sorted(
    {"ARCHITECTURE.md", "README.md", "ops/deploy/README.md"}
    | {str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md")}
)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (those outside code fences)."""
    found, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def broken_links(doc: Path) -> list[str]:
    broken = []
    for link in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(link)
    return broken


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc: str) -> None:
    named = set(PATH.findall((ROOT / doc).read_text()))
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == [], f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_a_doc_holds_leads_somewhere(doc: str) -> None:
    assert broken_links(ROOT / doc) == []


def test_the_checks_see_what_is_missing(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n[a](#title) [b](#nothing) [c](gone.md) [d](https://x.org)\n")
    assert broken_links(page) == ["#nothing", "gone.md"]
    assert PATH.findall("see worker/nothing_here.py and common/keys.py") == [
        "worker/nothing_here.py",
        "common/keys.py",
    ]
