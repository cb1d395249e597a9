"""Spawn mode's child: a fresh ``python -B -c SPAWN_BOOT`` that reads its snippet from
fd 3 and runs it as runtime.py runs a forked child's (notebook cells through cells.py).

Its own module so that runtime.py, which cells.py builds on, imports neither.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from codepool.worker.engine import contract, runtime

CODE_FD = contract.REQUEST_FD  # the source, where a forked child's request socket is
# As the reference's, ``python -B -c``; the work dir, the snippet's own files, is not
# searched for the runner's modules.
SPAWN_BOOT = (
    "import sys; del sys.path[0]; from codepool.worker.engine import spawn_entry; "
    "spawn_entry.main()"
)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def main() -> NoReturn:
    """Source on fd 3 (notebook cells: a JSON list, records to fd 5), flags on the
    command line: ``--auto-print``, ``--rich-tracebacks``, ``--cells CELL_TIMEOUT_S``
    (empty: none)."""
    source = _read_all(CODE_FD)
    flags = sys.argv[1:]
    rich = "--rich-tracebacks" in flags
    # This interpreter's own streams and fresh __main__: made as the reference's are.
    fresh = runtime.Fresh(
        main=runtime.fresh_main(), stdin=sys.stdin, stdout=sys.stdout, stderr=sys.stderr
    )
    runtime.prepare(fresh)
    runtime.done_notice = runtime.say_done
    if "--cells" in flags:  # imported here: a plain snippet's start loads neither
        import json

        from codepool.worker.engine import cells

        timeout = flags[flags.index("--cells") + 1]
        cell_timeout_s = float(timeout) if timeout else None
        cells.run_cells(json.loads(source), cell_timeout_s, contract.RECORD_FD, rich=rich)
    runtime.run_snippet(source, auto_print="--auto-print" in flags, rich=rich)
