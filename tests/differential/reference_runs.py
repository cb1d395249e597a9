"""The differential's reference: each case through ``python -B -c`` (tests/reference.py)
with a path's snippet environment, in a work dir of its own holding the case's files,
many at once; what the cases fetch read back after each ends."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tests.differential.corpus import Case
from tests.differential.paths import TIMEOUT_S, Outcome
from tests.reference import run_reference


def _one(case: Case, env: dict[str, str]) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="codepool-reference-") as cwd:
        for path, data in case.files.items():
            target = Path(cwd, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        own = {**env, "HOME": cwd, "TMPDIR": cwd}
        try:
            stdout, stderr, code = run_reference(case.code, env=own, cwd=cwd, timeout_s=TIMEOUT_S)
            returncode: int | None = code
        except subprocess.TimeoutExpired:
            stdout, stderr, returncode = "", "", None
        files = {}
        for path in case.fetch:
            target = Path(cwd, path)
            if target.is_file():
                files[path] = target.read_bytes()
        return Outcome(stdout, stderr, returncode, files)


class References:
    """Reference outcomes per snippet environment (paths that give the same one share
    them), started on demand and computed on a thread pool."""

    def __init__(self, cases: Sequence[Case]) -> None:
        self.cases = list(cases)
        self.pool = ThreadPoolExecutor(max(4, 2 * (os.cpu_count() or 1)))
        self.started: dict[tuple[tuple[str, str], ...], list[Future[Outcome]]] = {}

    def start(self, env: dict[str, str]) -> list[Future[Outcome]]:
        key = tuple(sorted((k, v) for k, v in env.items() if k not in ("HOME", "TMPDIR")))
        if key not in self.started:
            self.started[key] = [self.pool.submit(_one, c, env) for c in self.cases]
        return self.started[key]

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
