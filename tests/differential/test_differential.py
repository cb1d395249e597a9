"""The broad differential: every case of tests/differential/corpus.py through every path
of tests/differential/paths.py, each path's batch at once, against ``python -B -c`` with
that path's snippet environment (tests/differential/reference_runs.py). Two things are
made alike first, both documented: the snippet's file ``<string>`` is named
``<sandbox>``, and object addresses are masked. A difference not listed in
tests/differential/accepted.py (and docs/runtime.md) fails."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.differential.accepted import ACCEPTED, accepted
from tests.differential.corpus import CASES
from tests.differential.paths import PATHS, STRIDE, Outcome
from tests.differential.reference_runs import References

_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")
_REFCOUNT = re.compile(r"object refcount : \d+")
# A comma-separated list of case-name prefixes, to run part of the corpus while working
# on it; the suite runs all of it.
ONLY = [p for p in os.environ.get("CODEPOOL_DIFFERENTIAL_ONLY", "").split(",") if p]
SELECTED = [c for c in CASES if not ONLY or any(c.name.startswith(p) for p in ONLY)]
DOCS = [
    Path(__file__).resolve().parents[2] / "docs" / n
    for n in ("runtime.md", "contexts-and-cells.md")
]


def alike(outcome: Outcome, *, reference: bool) -> Outcome:
    def text(t: str) -> str:
        if reference:
            t = t.replace("<string>", "<sandbox>")
        return _REFCOUNT.sub("object refcount : N", _ADDRESS.sub("0x", t))

    return Outcome(text(outcome.stdout), text(outcome.stderr), outcome.returncode, outcome.files)


@pytest.fixture(scope="module")
def references() -> Iterator[References]:
    refs = References(SELECTED)
    yield refs
    refs.close()


def describe(name: str, got: Outcome, want: Outcome) -> str:
    lines = [f"--- {name}"]
    for part in ("returncode", "stdout", "stderr", "files"):
        g, w = getattr(got, part), getattr(want, part)
        if g != w:
            lines.append(f"  {part}: got {g!r}\n  {' ' * len(part)}  want {w!r}")
    return "\n".join(lines)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", PATHS)
def test_every_case_answers_as_python_c(path: str, references: References) -> None:
    stride = STRIDE.get(path, 1)
    cases = SELECTED[::stride]
    with PATHS[path]() as runner:
        want_futures = references.start(runner.environment())[::stride]
        got = runner.run(cases)
    report = []
    for case, mine, future in zip(cases, got, want_futures, strict=True):
        g, w = alike(mine, reference=False), alike(future.result(), reference=True)
        if g != w and accepted(case.name, path) is None:
            report.append(describe(case.name, g, w))
    assert not report, f"{len(report)} of {len(cases)} cases differ on {path}:\n" + "\n".join(
        report
    )


def test_the_corpus_is_broad() -> None:
    families = {c.family for c in CASES}
    assert len(CASES) >= 300
    assert families >= {
        "output",
        "finalisation",
        "exit",
        "exceptions",
        "hooks",
        "signals",
        "forks",
        "threads",
        "encodings",
        "files",
    }


def test_every_accepted_difference_is_documented() -> None:
    text = " ".join(" ".join(doc.read_text().split()) for doc in DOCS)
    missing = [entry.why for entry in ACCEPTED if entry.why not in text]
    assert not missing, f"docs/runtime.md and docs/contexts-and-cells.md lack: {missing}"
