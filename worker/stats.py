"""Counters aggregated in a dispatcher and flushed to Redis with HINCRBY (DESIGN §5).

Per-snippet HINCRBYs would cost more Redis commands than the snippet itself; instead
every result adds to in-process counters and a flusher writes the sums at least once
per ``flush_s``. The counts stay exact: a flush that fails is kept and retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict

import redis

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.result import ExecResult

log = logging.getLogger(__name__)


class StatsBuffer:
    """Thread-safe pending increments per stats hash, and their flusher thread."""

    def __init__(
        self, conn: redis.Redis, keys: Keys, worker: str, *, flush_s: float, minute_ttl_s: int
    ) -> None:
        self._conn = conn
        self._keys = keys
        self._worker = worker
        self._flush_s = flush_s
        self._minute_ttl_s = minute_ttl_s
        self._lock = threading.Lock()
        self._pending: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._expiring: set[str] = set()  # minute buckets get a TTL when flushed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, result: ExecResult, run: str) -> None:
        increments = counters.count(result)
        minute = self._keys.minute_stats(int(time.time() // 60))
        hashes = [self._keys.stats(), self._keys.worker_stats(self._worker), minute]
        if run:
            hashes.append(self._keys.run_stats(run))
        with self._lock:
            self._expiring.add(minute)
            for key in hashes:
                self._pending[key].update(increments)

    def flush(self) -> bool:
        """Write pending increments; returns False (and keeps them) if Redis failed."""
        with self._lock:
            pending, self._pending = self._pending, defaultdict(Counter)
            expiring, self._expiring = self._expiring, set()
        if not pending:
            return True
        try:
            with self._conn.pipeline(transaction=False) as pipe:
                for key, fields in pending.items():
                    for field, amount in fields.items():
                        if amount:
                            pipe.hincrby(key, field, amount)
                    if key in expiring:
                        pipe.expire(key, self._minute_ttl_s)
                pipe.execute()
            return True
        except redis.RedisError as exc:
            log.warning(
                "stats flush failed, keeping %d hashes for the next one: %s", len(pending), exc
            )
            with self._lock:
                self._expiring |= expiring
                for key, fields in pending.items():
                    self._pending[key].update(fields)
            return False

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
