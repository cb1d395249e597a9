"""The hostile corpus (tests/hostile.py) on every child path the product can take: the C
set-up with the bare and the full image, the Python set-up, spawn."""

from __future__ import annotations

import pytest

from codepool.worker import LocalExecutor
from tests.conftest import assert_nothing_left
from tests.hostile import HOSTILE, check

# A snippet that imports numpy is cloned by the preloading zygote (the full image).
IMAGES = {"plain": "", "preloaded": "import numpy\n"}


@pytest.mark.parametrize("image", IMAGES)
def test_hostile_snippets_are_contained_on_every_path(executor: LocalExecutor, image: str) -> None:
    corpus = {name: IMAGES[image] + code for name, code in HOSTILE.items()}
    # The fork bomb runs alone: its 32 processes take all but a 33rd of the CPU from a
    # snippet beside them (no CPU share per snippet), and a spawned interpreter that
    # imports numpy, on a busy 2-core host, can then miss the 3 s deadline.
    alone = {"fork-bomb": corpus.pop("fork-bomb")}
    results = {}
    for batch in filter(None, (corpus, alone)):
        outcomes = executor.run_many(list(batch.values()), timeout_s=3.0)
        results.update(zip(batch, outcomes, strict=True))
    check(results)
    assert_nothing_left(executor)
