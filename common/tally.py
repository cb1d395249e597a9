"""Counting results into the stats hashes, exactly once per snippet.

Dispatchers aggregate and call this at least once a second; a janitor calls it for what
a dead dispatcher wrote but never counted. Either way the batch's ``counted`` bitmap
decides, inside Redis, which indices are new, so a retried or repeated call adds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass
class BatchCounts:
    """One batch's results to count; ``done``: the owner holds nothing more of it."""

    batch_id: str
    results: Sequence[tuple[int, ExecResult]]
    done: bool = False


def count_results(
    conn: redis.Redis,
    keys: Keys,
    *,
    owner: str,
    hashes: Sequence[str],
    batches: Sequence[BatchCounts],
    batch_ttl_s: int,
    minute_ttl_s: int,
) -> int:
    """Count the not-yet-counted results of ``batches`` into ``hashes`` (from
    ``count_hashes``); a batch marked done leaves ``owner``'s set. One script call for
    up to COUNT_CHUNK results. Returns how many were new."""
    counted = 0
    for piece in _pieces(batches):
        call_keys = [keys.owner_batches(owner), *hashes]
        args: list[Any] = [batch_ttl_s, minute_ttl_s, len(hashes)]
        for item in piece:
            call_keys.append(keys.batch_counted(item.batch_id))
            args += [item.batch_id, "1" if item.done else "0", len(item.results)]
            for index, result in item.results:
                args.append(index)
                args.extend(counters.terms(result))
        counted += int(count_script(conn, call_keys, args))
    return counted


def _pieces(batches: Sequence[BatchCounts]) -> list[list[BatchCounts]]:
    """Split into calls of at most COUNT_CHUNK results; a split batch is done only in
    its last part."""
    pieces: list[list[BatchCounts]] = [[]]
    size = 0
    for item in batches:
        results = list(item.results)
        while True:
            room = COUNT_CHUNK - size
            head, results = results[:room], results[room:]
            pieces[-1].append(BatchCounts(item.batch_id, head, item.done and not results))
            size += len(head)
            if not results:
                break
            pieces.append([])
            size = 0
    return pieces
