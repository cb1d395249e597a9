"""The batches a dispatcher is through with, taken out of its owner set at least once
per ``flush_s``.

A janitor looks at a lapsed dispatcher's owner set to find the batches it held claims
in. Once every result of a batch is written (and counted, in the same script call, see
common/tally.py) the dispatcher holds nothing of it, so the batch may leave the set;
the removals of many batches go in one round trip from this flusher thread rather than
one per batch from the job thread.
"""

from __future__ import annotations

import logging
import threading

import redis

from codepool.common.keys import Keys

log = logging.getLogger(__name__)


class FinishedBatches:
    """Thread-safe pending removals from ``owner``'s set, and their flusher thread."""

    def __init__(self, conn: redis.Redis, keys: Keys, *, owner: str, flush_s: float) -> None:
        self._conn = conn
        self._key = keys.owner_batches(owner)
        self._flush_s = flush_s
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def batch_done(self, batch_id: str) -> None:
        """The dispatcher holds nothing more of this batch (all of it written)."""
        with self._lock:
            self._pending.add(batch_id)

    def flush(self) -> bool:
        """Send pending removals; returns False (and keeps them) if Redis failed."""
        with self._lock:
            pending, self._pending = self._pending, set()
        if not pending:
            return True
        try:
            self._conn.srem(self._key, *pending)
        except redis.RedisError as exc:
            log.warning("removing %d finished batches failed, keeping them: %s", len(pending), exc)
            with self._lock:
                self._pending |= pending
            return False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="codepool-finished", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush()
