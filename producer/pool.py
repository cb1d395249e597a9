"""CodePool: submit batches of snippets to the worker fleet and collect their results.

```python
pool = CodePool("redis://host:6379/0")
batch = pool.submit(codes, timeout_s=5.0, run="exp1")   # returns at once
results = batch.results(timeout_s=300)                  # list[ExecResult], input order
for i, r in batch.as_completed(): ...
pool.metrics(run="exp1")
```
Results are collected from the batch's done list (BLMPOP, many indices per call) and
its results hash (HMGET). What has no result by the deadline comes back as ``infra``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, cast

import redis

from codepool.common import codec, counters
from codepool.common.connection import redis_client
from codepool.common.errors import ConfigError, RedisUnavailable
from codepool.common.limits import Limits
from codepool.common.queueing import batch_queue, enqueue_batch
from codepool.common.result import ExecResult, infra
from codepool.common.settings import Settings
from codepool.common.wire import RUN_TAG_MAX_CHARS, WHOLE_BATCH, BatchJob, new_batch_id

log = logging.getLogger(__name__)

# How long one blocking read waits before the deadline is checked again.
POLL_BLOCK_S = 5.0
DEADLINE_MESSAGE = "codepool: no result before the producer's deadline"


class CodePool:
    """A producer's handle on the pool. Thread-safe; cheap to share.

    url: Redis URL (default: ``$REDIS_URL``). limits: defaults for every batch.
    settings: prefix, queue, TTLs (default: ``Settings.from_env()``).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        limits: Limits | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.settings = (settings or Settings.from_env()).replace(
            **({"redis_url": url} if url else {})
        )
        self.keys = self.settings.keys
        self.limits = limits or Limits()
        self.conn = redis_client(self.settings, block_s=POLL_BLOCK_S)
        self._queue = batch_queue(self.conn, self.settings)

    def submit(
        self,
        codes: Sequence[Any],
        *,
        run: str = "",
        deadline_s: float | None = None,
        requeue: bool = True,
        **limits: Any,
    ) -> Batch:
        """Enqueue ``codes`` as one batch and return at once. Keywords: Limits fields
        (``timeout_s``, ``memory_mb``, ...). Entries that are not str come back
        ``rejected``; a batch over the size limit raises ConfigError.

        deadline_s: how long the batch may take before what is missing counts as lost
            (default: every timeout end to end plus a minute, at most an hour).
        requeue: at the deadline, enqueue the missing snippets once more (a worker died
            with them) and wait one more deadline; without it, or after that, they come
            back as ``infra``. Results are first-write-wins, so a late original run and
            the re-run never both show up.
        """
        if isinstance(codes, (str, bytes)):
            raise ConfigError("submit takes a sequence of snippets, not one string")
        codes = list(codes)
        if len(codes) > self.settings.max_batch_snippets:
            raise ConfigError(
                f"batch of {len(codes)} snippets is over the limit of "
                f"{self.settings.max_batch_snippets}"
            )
        if not isinstance(run, str) or len(run) > RUN_TAG_MAX_CHARS:
            raise ConfigError(f"run must be a string of at most {RUN_TAG_MAX_CHARS} chars")
        effective = self.limits.with_overrides(**limits)
        batch_id = new_batch_id()
        job = BatchJob.from_codes(batch_id, codes, effective, run, time.time())
        payload = job.encode()
        try:
            if codes:
                enqueue_batch(
                    self._queue, self.settings, batch_id=batch_id, payload=payload, size=len(codes)
                )
        except redis.RedisError as exc:
            raise RedisUnavailable(f"cannot enqueue batch {batch_id}: {exc}") from exc
        return Batch(
            self,
            batch_id,
            len(codes),
            effective,
            payload=payload,
            deadline_s=deadline_s,
            requeue=requeue,
        )

    async def asubmit(self, codes: Sequence[Any], *, run: str = "", **limits: Any) -> Batch:
        """``submit`` for async callers (runs in a thread; any event loop)."""
        return await asyncio.to_thread(self.submit, codes, run=run, **limits)

    def counters(self, run: str | None = None) -> dict[str, int]:
        """Raw counters: cluster-wide, or of one run tag."""
        key = self.keys.run_stats(run) if run else self.keys.stats()
        return counters.parse(self.conn.hgetall(key))

    def metrics(self, run: str | None = None) -> dict[str, float]:
        """``sandbox/*`` metrics from Redis: cluster-wide, or of one run tag."""
        return counters.metrics(self.counters(run))

    def close(self) -> None:
        self.conn.close()


class Batch:
    """One submitted batch: collect its results once, in order or as they complete."""

    def __init__(
        self,
        pool: CodePool,
        batch_id: str,
        size: int,
        limits: Limits,
        *,
        payload: bytes = b"",
        deadline_s: float | None = None,
        requeue: bool = True,
    ) -> None:
        self.pool = pool
        self.id = batch_id
        self.size = size
        self.limits = limits
        self.payload = payload
        self.deadline_s = deadline_s if deadline_s is not None else self.default_deadline_s()
        self.requeues_left = 1 if requeue and payload else 0
        self.submitted = time.monotonic()
        self._results: dict[int, ExecResult] = {}

    def __len__(self) -> int:
        return self.size

    def default_deadline_s(self) -> float:
        """A generous wait: every snippet's timeout, as if run one after another, capped."""
        return min(3600.0, 60.0 + self.limits.timeout_s * max(1, self.size))

    def as_completed(self, timeout_s: float | None = None) -> Iterator[tuple[int, ExecResult]]:
        """Yield ``(index, result)`` as results arrive. At the batch's deadline what is
        missing is re-enqueued once (see ``submit``); after that, or once ``timeout_s``
        (this call's own limit) has passed, it comes back as infra."""
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        deadline = self.submitted + self.deadline_s
        keys = self.pool.keys
        done_key = keys.batch_done(self.id)
        while len(self._results) < self.size:
            now = time.monotonic()
            if now >= deadline and self.requeues_left and (give_up is None or now < give_up):
                self._requeue()
                deadline = now + self.deadline_s
            end = deadline if give_up is None else min(deadline, give_up)
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            try:
                popped = self.pool.conn.blmpop(
                    min(remaining, POLL_BLOCK_S), 1, done_key, direction="LEFT", count=self.size
                )
            except redis.RedisError:
                # Redis restarting: wait a little and try again until the deadline.
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            for entry in popped[1] if popped else ():
                index, result = codec.decode_done_entry(cast(bytes, entry))
                if index == WHOLE_BATCH:  # the worker could not use the batch at all
                    for missing in range(self.size):
                        if missing not in self._results:
                            self._results[missing] = result
                            yield missing, result
                    return
                if index in self._results or not 0 <= index < self.size:
                    continue
                # latency as the caller sees it: from submit to collection.
                result = result.replace(latency=time.monotonic() - self.submitted)
                self._results[index] = result
                yield index, result
        for index in range(self.size):
            if index not in self._results:
                self._results[index] = infra(DEADLINE_MESSAGE)
                yield index, self._results[index]

    def _requeue(self) -> None:
        """Enqueue the batch again; the worker skips indices that already have results."""
        self.requeues_left -= 1
        missing = self.size - len(self._results)
        log.warning(
            "batch %s: %d of %d results missing at the deadline; re-enqueued once",
            self.id,
            missing,
            self.size,
        )
        try:
            enqueue_batch(
                self.pool._queue,
                self.pool.settings,
                batch_id=self.id,
                payload=self.payload,
                size=self.size,
                at_front=True,
            )
        except redis.RedisError as exc:
            log.error("batch %s: could not re-enqueue: %s", self.id, exc)

    def results(self, timeout_s: float | None = None) -> list[ExecResult]:
        """All results in input order; what is missing at the deadline is ``infra``."""
        for _ in self.as_completed(timeout_s):
            pass
        return [self._results[i] for i in range(self.size)]

    async def aresults(self, timeout_s: float | None = None) -> list[ExecResult]:
        """``results`` for async callers (runs in a thread; any event loop)."""
        return await asyncio.to_thread(self.results, timeout_s)

    async def aas_completed(
        self, timeout_s: float | None = None
    ) -> AsyncIterator[tuple[int, ExecResult]]:
        """``as_completed`` for async callers."""
        iterator = self.as_completed(timeout_s)
        sentinel = object()
        while True:
            item = await asyncio.to_thread(next, iterator, sentinel)
            if item is sentinel:
                return
            yield item  # type: ignore[misc]
