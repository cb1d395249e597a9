"""The docs are maps: every module path ARCHITECTURE.md and the READMEs name must exist
in the tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w/.])((?:common|producer|worker|ops|tests)/[\w/]+\.(?:py|c|md|json))\b")
DOCS = ("ARCHITECTURE.md", "README.md", "ops/deploy/README.md")


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc: str) -> None:
    named = set(PATH.findall((ROOT / doc).read_text()))
    assert named, f"{doc} names no module: the pattern is wrong"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert missing == [], f"{doc} names paths that do not exist: {missing}"
