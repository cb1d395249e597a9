"""The differential's context paths (tests/differential/paths.py): each case as a
context's first call, as a later call (after one that set some state), and as the first
call of a fork of a context, on a fork-mode LocalExecutor. A context call takes no files:
a case's files are written by a call before it, and what it fetches is read back by a
call after it (the context's work dir persists between calls)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from tests.differential.corpus import Case
from tests.differential.paths import ENV_PROBE, TIMEOUT_S, Outcome

SETUP = "import os as _os\n_state = [1]"
WRITE = (
    "import base64 as _b, os as _o\n"
    "for _p, _d in {files!r}.items():\n"
    "    _o.makedirs(_o.path.dirname(_p) or '.', exist_ok=True)\n"
    "    open(_p, 'wb').write(_b.b64decode(_d))\n"
    "del _b, _o, _p, _d"
)
READ = (  # on fd 1 itself: the case may have rebound or closed sys.stdout
    "import base64 as _b, json as _j, os as _o\n"
    "_o.write(1, _j.dumps({{_p: _b.b64encode(open(_p, 'rb').read()).decode()\n"
    "    for _p in {paths!r} if _o.path.isfile(_p)}}).encode() + b'\\n')"
)


class ContextRunner:
    """``how``: ``first`` (a fresh context's first call), ``later`` (after a call) or
    ``fork`` (the first call of a fork of a context that ran a call)."""

    def __init__(self, executor: Any, how: str) -> None:
        self.executor, self.how = executor, how

    def _open(self) -> tuple[Any, list[Any]]:
        ctx = self.executor.context(timeout_s=TIMEOUT_S)
        if self.how == "first":
            return ctx, [ctx]
        assert ctx.run_code(SETUP).ok
        if self.how == "later":
            return ctx, [ctx]
        (fork,) = ctx.fork()
        return fork, [ctx, fork]

    def _one(self, case: Case) -> Outcome:
        ctx, opened = self._open()
        try:
            if case.files:
                files = {p: base64.b64encode(d).decode() for p, d in case.files.items()}
                assert ctx.run_code(WRITE.format(files=files)).ok
            r = ctx.run_code(case.code)
            fetched: dict[str, bytes] = {}
            if case.fetch and ctx.ended is None:
                back = ctx.run_code(READ.format(paths=list(case.fetch)), max_output_chars=1 << 24)
                try:
                    got = json.loads(back.stdout.strip().splitlines()[-1])
                    fetched = {p: base64.b64decode(d) for p, d in got.items()}
                except (IndexError, ValueError):
                    pass  # nothing read back: the files are missing
            return Outcome(r.stdout, r.stderr, r.returncode, fetched)
        finally:
            for each in opened:
                each.close()

    def run(self, cases: Sequence[Case]) -> list[Outcome]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(self._one, cases))

    def environment(self) -> dict[str, str]:
        with self.executor.context() as ctx:
            env: dict[str, str] = json.loads(ctx.run_code(ENV_PROBE).stdout)
        return env


@contextmanager
def context_path(how: str) -> Iterator[ContextRunner]:
    from codepool.worker import LocalExecutor

    with LocalExecutor(concurrency=2, preload=("numpy",), max_contexts=32) as ex:
        yield ContextRunner(ex, how)
