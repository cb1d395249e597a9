"""The differential's notebook-cell path (tests/differential/paths.py): each case as the
one cell of a notebook, on a fork-mode LocalExecutor. A cell's error is its record's, not
stderr, and ends the cell, not the process: the runner puts what the record says Python
printed (through ``sys.excepthook``) on stderr, frames ``<cell 1>`` named ``<sandbox>``,
and takes the exit status python -c would have had from it (SystemExit ends the
notebook with python -c's status itself)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from codepool.common.snippet import Snippet
from tests.differential.corpus import Case
from tests.differential.paths import ENV_PROBE, TIMEOUT_S, Outcome


def _sandbox(text: str) -> str:
    """Frames are named <cell N> (docs/contexts-and-cells.md): in tracebacks, in dumps
    and in what a hook prints anywhere."""
    return text.replace('File "<cell 1>"', 'File "<sandbox>"')


def _outcome(result: Any) -> Outcome:
    if result.timed_out or not result.cells:
        return Outcome(
            _sandbox(result.stdout),
            _sandbox(result.stderr),
            None if result.timed_out else result.returncode,
            dict(result.files),
        )
    cell = result.cells[0]
    stderr, code = cell["stderr"], result.returncode
    for error in cell["error"]:  # SystemExit is none: it ends the notebook, its returncode
        stderr += "".join(line + "\n" for line in error["traceback"])
        if code == 0:  # else the cell's excepthook raised SystemExit
            code = -2 if error["ename"] == "KeyboardInterrupt" else 1
    return Outcome(_sandbox(cell["stdout"]), _sandbox(stderr), code, dict(result.files))


class CellRunner:
    def __init__(self, executor: Any) -> None:
        self.executor = executor

    def run(self, cases: Sequence[Case]) -> list[Outcome]:
        futures = [
            self.executor.submit(
                Snippet.make(cells=[c.code], files=dict(c.files), fetch_files=list(c.fetch)),
                timeout_s=TIMEOUT_S,
            )
            for c in cases
        ]
        return [_outcome(f.result(timeout=TIMEOUT_S * 20)) for f in futures]

    def environment(self) -> dict[str, str]:
        r = self.executor.run("", cells=[ENV_PROBE])
        env: dict[str, str] = json.loads(r.cells[0]["stdout"])
        return env


@contextmanager
def cell_path() -> Iterator[CellRunner]:
    from codepool.worker import LocalExecutor

    with LocalExecutor(concurrency=2, preload=("numpy",)) as ex:
        yield CellRunner(ex)
