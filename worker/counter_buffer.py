"""Counters aggregated in a dispatcher and flushed to Redis at least once per ``flush_s``.

Per-snippet HINCRBYs would cost more Redis commands than the snippet itself; instead every
first write is remembered here and a flusher sends them, one script call per batch
(``common.tally``). Counting is per index inside Redis, so a flush that failed, or that
redis-py retried after a dropped connection, can be sent again without counting twice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import redis

from codepool.common.keys import Keys
from codepool.common.result import ExecResult
from codepool.common.tally import BatchCounts, count_hashes, count_results

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    run: str
    results: list[tuple[int, ExecResult]] = field(default_factory=list)
    done: bool = False  # the dispatcher holds nothing more of this batch


class CounterBuffer:
    """Thread-safe pending counts per batch, and their flusher thread."""

    def __init__(
        self,
        conn: redis.Redis,
        keys: Keys,
        worker: str,
        *,
        owner: str,
        flush_s: float,
        minute_ttl_s: int,
        batch_ttl_s: int,
    ) -> None:
        self._conn = conn
        self._keys = keys
        self._worker = worker
        self._owner = owner
        self._flush_s = flush_s
        self._minute_ttl_s = minute_ttl_s
        self._batch_ttl_s = batch_ttl_s
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, batch_id: str, run: str, index: int, result: ExecResult) -> None:
        """Count a first write (at the next flush)."""
        with self._lock:
            self._pending.setdefault(batch_id, _Pending(run)).results.append((index, result))

    def batch_done(self, batch_id: str, run: str) -> None:
        """The dispatcher is through with this batch: once its counts are in, the batch
        leaves the dispatcher's set of batches a janitor would look at."""
        with self._lock:
            self._pending.setdefault(batch_id, _Pending(run)).done = True

    def flush(self) -> bool:
        """Send pending counts, one script call per run tag; returns False (and keeps
        what failed) if Redis failed."""
        with self._lock:
            pending, self._pending = self._pending, {}
        by_run: dict[str, list[BatchCounts]] = {}
        for batch_id, waiting in pending.items():
            by_run.setdefault(waiting.run, []).append(
                BatchCounts(batch_id, waiting.results, waiting.done)
            )
        ok = True
        for run, batches in by_run.items():
            try:
                count_results(
                    self._conn,
                    self._keys,
                    owner=self._owner,
                    hashes=count_hashes(self._keys, self._worker, run),
                    batches=batches,
                    batch_ttl_s=self._batch_ttl_s,
                    minute_ttl_s=self._minute_ttl_s,
                )
            except redis.RedisError as exc:
                ok = False
                log.warning("stats flush of %d batches failed, keeping it: %s", len(batches), exc)
                with self._lock:
                    for failed in batches:
                        merged = self._pending.setdefault(failed.batch_id, _Pending(run))
                        merged.results[:0] = failed.results
                        merged.done = merged.done or failed.done
        return ok

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="codepool-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush()
