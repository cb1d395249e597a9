"""Counting results into the stats hashes, exactly once per snippet.

Dispatchers aggregate and call this at least once a second; a janitor calls it for what
a dead dispatcher wrote but never counted. Either way the batch's ``counted`` bitmap
decides, inside Redis, which indices are new, so a retried or repeated call adds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.ledger import COUNT_CHUNK, count_script
from codepool.common.result import ExecResult


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


def count_args(results: Sequence[tuple[int, ExecResult]]) -> list[Any]:
    args: list[Any] = []
    for index, result in results:
        args.append(index)
        args.extend(counters.terms(result))
    return args


def count_results(
    conn: redis.Redis,
    keys: Keys,
    *,
    batch_id: str,
    owner: str,
    hashes: Sequence[str],
    results: Sequence[tuple[int, ExecResult]],
    batch_ttl_s: int,
    minute_ttl_s: int,
    done: bool = False,
) -> int:
    """Count the not-yet-counted ``(index, result)`` pairs of one batch into ``hashes``
    (from ``count_hashes``); with ``done``, also drop the batch from ``owner``'s set.
    Returns how many were new."""
    counted = 0
    chunks = [results[p : p + COUNT_CHUNK] for p in range(0, len(results), COUNT_CHUNK)] or [[]]
    for position, chunk in enumerate(chunks):
        last = position == len(chunks) - 1
        counted += int(
            count_script(
                conn,
                [keys.batch_counted(batch_id), keys.owner_batches(owner), *hashes],
                [
                    batch_ttl_s,
                    minute_ttl_s,
                    2,
                    batch_id,
                    "1" if done and last else "0",
                    *count_args(chunk),
                ],
            )
        )
    return counted
