"""Writing results and counting them, in one script call (``ledger.WRITE``).

A result is counted where it is written, and only if its write was the first for its
index, so the counters hold every snippet exactly once however often it is written:
the result writer retrying after a dropped connection, a rerun after a lost
dispatcher, a janitor giving up on one. Dispatchers call it from their result writer
(many results per call), a janitor for what it gives up on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from codepool.common import codec, counters
from codepool.common.keys import Keys
from codepool.common.result import ExecResult

# Results per WRITE call: keeps Lua's unpack() well inside its stack limit.
WRITE_CHUNK = 128


def count_hashes(keys: Keys, worker: str, run: str, now: float | None = None) -> list[str]:
    """The counter hashes a result adds to (no worker hash for ``worker=""``); the
    minute hash is always the second."""
    minute = int((time.time() if now is None else now) // 60)
    hashes = [keys.stats(), keys.minute_stats(minute)]
    if worker:
        hashes.append(keys.worker_stats(worker))
    if run:
        hashes.append(keys.run_stats(run))
    return hashes


def write_calls(
    keys: Keys,
    batch_id: str,
    results: Sequence[tuple[int, ExecResult]],
    *,
    worker: str,
    run: str,
    batch_ttl_s: int,
    minute_ttl_s: int,
) -> list[tuple[list[str], list[Any]]]:
    """The WRITE calls (keys, args) that write and count ``results`` of one batch."""
    call_keys = [
        keys.batch_results(batch_id),
        keys.batch_done(batch_id),
        *count_hashes(keys, worker, run),
    ]
    calls = []
    for start in range(0, len(results), WRITE_CHUNK):
        args: list[Any] = [batch_ttl_s, minute_ttl_s]
        for index, result in results[start : start + WRITE_CHUNK]:
            blob = codec.encode_result(result)
            args += [index, blob, codec.encode_done_entry(index, blob), *counters.terms(result)]
        calls.append((call_keys, args))
    return calls
