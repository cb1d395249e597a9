"""A producer's lease: while it has batches in flight, a producer renews a heartbeat in
Redis (``producers``, server time) and keeps its batches in a set of its own, so that
when it dies (kill -9, a lost node) a janitor (any live dispatcher, or another
producer that waits) cancels them once its lease lapses: work nobody waits for does not
run on.

A submit adds its batch to the set in the same script call (``ledger.SUBMIT``), and the
first batch of a spell takes the lease there, so a producer pays no round trip per batch
for it; a thread renews the lease once per ``heartbeat_s`` while batches are in flight,
and takes the batches the producer is through with out of its set in the same call (the
lease goes once the set is empty). With nothing in flight it sends nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

import redis

from codepool.common.ledger import producer_beat_script
from codepool.common.settings import Settings

log = logging.getLogger(__name__)
# While beats keep failing, one warning this often (the first is said at once).
FAILURE_LOG_EVERY_S = 60.0


def producer_name() -> str:
    """A name unique per producer (several pools may share a process)."""
    return f"producer:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ProducerLease:
    """The lease of producer ``name``: batches in flight in, heartbeats out. Thread-safe."""

    def __init__(self, conn: redis.Redis, settings: Settings, *, name: str) -> None:
        self.conn = conn
        self.settings = settings
        self.name = name
        self._lock = threading.Lock()
        self._in_flight: dict[str, tuple[str, float]] = {}  # batch -> (run tag, submitted)
        self._through: set[str] = set()  # out of flight, still in Redis's set
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing_since: float | None = None  # monotonic time of a failed run's first
        self._said_at = 0.0  # when a failed run was last logged

    def submitted(self, batch_id: str, run: str) -> None:
        """The batch is in flight (the submit put it in Redis's set)."""
        with self._lock:
            self._in_flight[batch_id] = (run, time.monotonic())
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._loop, name="codepool-producer-lease", daemon=True
                )
                self._thread.start()

    def through(self, batch_id: str) -> None:
        """Nobody here waits for the batch any more (collected, or cancelled)."""
        with self._lock:
            if self._in_flight.pop(batch_id, None) is not None:
                self._through.add(batch_id)

    def in_flight(self) -> dict[str, str]:
        """Batches in flight -> their run tags."""
        with self._lock:
            return {batch_id: run for batch_id, (run, _) in self._in_flight.items()}

    def stop(self, *, wait: bool = True) -> None:
        """Stop renewing, sending nothing more. ``wait``: for a beat under way to end
        first (so that a last beat sent next comes after it); not with a Redis that
        failed to answer, where that beat may hang for the socket timeout (the thread
        is a daemon, and its beat fails once the pool's connections close)."""
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(timeout=5)

    def close(self, conn: redis.Redis | None = None) -> None:
        """Stop renewing; what is through leaves Redis's set (and the lease with it), on
        ``conn`` if given."""
        self.stop()
        self.beat(conn)

    def beat(self, conn: redis.Redis | None = None) -> None:
        """Renew the lease and drop what this producer is through with (one call, on
        ``conn`` if given)."""
        stale_s = self.settings.batch_ttl_s
        with self._lock:
            now = time.monotonic()
            for batch_id, (_, since) in list(self._in_flight.items()):
                if now - since > stale_s:  # expired in Redis too: never collected
                    del self._in_flight[batch_id]
                    self._through.add(batch_id)
            through = sorted(self._through)
            self._through.clear()
            idle = not self._in_flight
        if idle and not through:
            return
        keys = self.settings.keys
        try:
            producer_beat_script(
                conn or self.conn,
                [keys.producers(), keys.producer_batches(self.name)],
                [self.name, self.settings.batch_ttl_s, *through],
            )
        except (redis.RedisError, OSError, ValueError) as exc:
            # OSError, ValueError: what redis-py raises for a socket closed under it. The
            # thread must outlive any of them: a lease no longer renewed lapses, and a
            # janitor cancels the batches a live producer still waits for.
            self._failed(exc)
            with self._lock:
                self._through.update(through)
            return
        if self._failing_since is not None:
            down_s = time.monotonic() - self._failing_since
            log.info("producer %s: heartbeat back after %.0f s", self.name, down_s)
            self._failing_since = None

    def _failed(self, exc: Exception) -> None:
        """Say a failed beat once, then once every FAILURE_LOG_EVERY_S while they go on:
        a producer whose Redis is gone beats every second."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = self._said_at = now
            log.warning("producer %s: heartbeat failed: %s", self.name, exc)
        elif now - self._said_at >= FAILURE_LOG_EVERY_S:
            self._said_at = now
            down_s = now - self._failing_since
            log.warning("producer %s: heartbeat failing for %.0f s: %s", self.name, down_s, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            self.beat()
