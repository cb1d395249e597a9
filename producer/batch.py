"""Batch: one submitted batch, as its producer sees it: its results collected once, in
order or as they complete, from its done list (BLMPOP, many per call), and the way to
give up on it (``cancel``: common/cancellation.py). While it waits, a batch has its pool
watch the dispatchers' leases (and recover a lapsed one's work), nudges a batch that
stalls with work unclaimed, and says so when no dispatcher is alive.

BLMPOP is destructive: a reply lost to a dropped connection (redis-py sends the pop
again, silently) loses what it popped. So the collection reconciles: after any
connection error of its client, when it stalls, and before it reports anything
``infra``, it reads the indices it is missing from the results hash, where every
result stays until the batch expires. A collection that stops waiting (its deadline,
the caller's ``timeout_s``, no live worker) cancels what it no longer waits for first,
so nothing of the batch runs on for nobody.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, cast

import redis

from codepool.common import codec, failover
from codepool.common.cancellation import CLOSED_MESSAGE, GAVE_UP_MESSAGE, cancel
from codepool.common.connection import connection_failures
from codepool.common.errors import ConfigError, RedisUnavailable
from codepool.common.limits import Limits
from codepool.common.result import ExecResult, cancelled, infra
from codepool.common.retry import pause
from codepool.common.wire import WHOLE_BATCH

if TYPE_CHECKING:
    from codepool.producer.pool_view import PoolView

log = logging.getLogger(__name__)

# How long one blocking read waits before the leases are looked at again.
POLL_BLOCK_S = 1.0
# No result for this long while dispatchers live: announce the batch again if it still
# has unclaimed work (an announcement lost, say, with a Redis that failed over).
STALL_S = 10.0
# No lingering once this few results are missing: the end of a batch comes at once.
LINGER_UNTIL_LEFT = 8
# Fields read from the results hash per HMGET when reconciling.
RECONCILE_CHUNK = 1000
DEADLINE_MESSAGE = "codepool: no result before the producer's deadline"
NO_WORKER_MESSAGE = (
    "codepool: no live worker on queue {queue!r} for {wait:.0f} s (no dispatcher heartbeat "
    "in Redis); is `codepool worker` running and pointed at this Redis?"
)


class Batch:
    """One submitted batch: collect its results once, in order or as they complete."""

    def __init__(
        self,
        pool: PoolView,
        batch_id: str,
        size: int,
        limits: Limits,
        *,
        deadline_s: float | None = None,
        run: str = "",
        announcements: tuple[str, ...] = (),
        spec: bytes = b"",
        reruns: int = 0,
    ) -> None:
        self.pool = pool
        self.id = batch_id
        self.size = size
        self.limits = limits
        self.run = run
        self.announcements = announcements  # its RQ jobs, made at submit
        # What was stored, to store it again if a failover lost it (pool.recover).
        self.spec = spec
        self.reruns = reruns
        self.deadline_s = deadline_s if deadline_s is not None else self.default_deadline_s()
        self.submitted = time.monotonic()
        self.duplicates = 0  # done-list entries for an index already seen (should stay 0)
        self._results: dict[int, ExecResult] = {}
        # Indices given up on here (cancel), and why: they come back cancelled even when
        # Redis could not be told.
        self._given_up: set[int] = set()
        self._give_up_message = GAVE_UP_MESSAGE
        # Indices read from the results hash (reconciled): their done entry, if it is
        # still on the list, is not a duplicate.
        self._reconciled: set[int] = set()

    def __len__(self) -> int:
        return self.size

    def default_deadline_s(self) -> float:
        """A generous backstop: every snippet's timeout, as if run one after another."""
        return min(3600.0, 60.0 + self.limits.timeout_s * max(1, self.size))

    def as_completed(self, timeout_s: float | None = None) -> Iterator[tuple[int, ExecResult]]:
        """Yield ``(index, result)`` as results arrive. What is missing when the batch's
        deadline or this call's own ``timeout_s`` passes, or after no dispatcher was
        alive for ``settings.no_worker_wait_s``, comes back as infra; what was cancelled
        (``cancel``, or its producer's lease lapsed) comes back with status
        ``cancelled``."""
        pool = self.pool
        end = self.submitted + self.deadline_s
        if timeout_s is not None:
            end = min(end, time.monotonic() + timeout_s)
        done_key = pool.keys.batch_done(self.id)
        message = DEADLINE_MESSAGE
        watch_at = time.monotonic() + POLL_BLOCK_S
        no_worker_since: float | None = None
        progress_at = time.monotonic()  # the last result, or the last nudge
        primary = failover.generation(pool.conn)  # moves of a Sentinel-managed primary
        while len(self._results) < self.size:
            now = time.monotonic()
            if now >= end:
                break
            if pool.closed:  # closed under this collection: it cancelled what is missing
                if not self._given_up:
                    self._give_up_message = CLOSED_MESSAGE
                self._given_up.update(range(self.size))
                break
            # Only what was given up on is missing: one last look for what Redis has
            # (the cancellations, or results written before them), then they are filled.
            last_look = bool(self._given_up) and self._given_up.issuperset(
                i for i in range(self.size) if i not in self._results
            )
            if last_look:
                watch_at = end
            elif now >= watch_at:
                watch_at = now + POLL_BLOCK_S
                moved_to = failover.generation(pool.conn)
                if moved_to != primary and pool.recover(self):
                    primary = moved_to
                live = pool.watch()
                if live == 0:
                    no_worker_since = now if no_worker_since is None else no_worker_since
                    wait_s = pool.settings.no_worker_wait_s
                    if now - no_worker_since >= wait_s:
                        message = NO_WORKER_MESSAGE.format(queue=pool.settings.queue, wait=wait_s)
                        log.error("batch %s: %s", self.id, message)
                        break
                elif live is not None:
                    no_worker_since = None
                    if now - progress_at >= STALL_S:
                        progress_at = now
                        pool.nudge(self.id, self.size)
                        yield from self._reconcile()
            block_s = 0.01 if last_look else max(0.01, min(end, watch_at) - now)
            failures = connection_failures(pool.collect)
            try:
                popped = pool.collect.blmpop(
                    block_s, 1, done_key, direction="LEFT", count=self.size
                )
            except (redis.RedisError, OSError, ValueError) as exc:
                if pool.closed:
                    continue  # closed under this read, whatever redis-py made of it
                if not isinstance(exc, redis.RedisError):
                    raise
                if last_look:
                    break
                # Redis restarting: wait a little and try again until the deadline; what
                # a reply lost on the way had popped is in the results hash.
                pause(end, 0.5)
                yield from self._reconcile()
                continue
            if connection_failures(pool.collect) != failures:
                yield from self._reconcile()  # a pop redis-py retried may have lost some
            entries = popped[1] if popped else []
            for entry in entries:
                index, result = codec.decode_done_entry(cast(bytes, entry))
                if index == WHOLE_BATCH:  # the worker could not use the batch at all
                    pool.lease.through(self.id)
                    for missing in range(self.size):
                        if missing not in self._results:
                            self._results[missing] = result
                            yield missing, result
                    return
                if index in self._reconciled:
                    continue  # read from the results hash before its entry came
                if index in self._results or not 0 <= index < self.size:
                    self.duplicates += 1
                    log.warning(
                        "batch %s: done-list entry %d seen twice or out of range", self.id, index
                    )
                    continue
                # latency as the caller sees it: from submit to collection.
                result = result.replace(latency=time.monotonic() - self.submitted)
                self._results[index] = result
                progress_at = time.monotonic()
                yield index, result
            if last_look:
                break
            left = self.size - len(self._results)
            if entries and left > LINGER_UNTIL_LEFT:
                # While results stream in, the next read waits for several: each read
                # costs Redis a round trip, and the worker hosts write in groups anyway.
                # Never longer than the rest should take at the pace so far, so the end
                # of a batch is not waited for.
                pace_s = (time.monotonic() - self.submitted) / max(1, len(self._results))
                time.sleep(min(pool.settings.collect_linger_s, left * pace_s))
        gave_up = not pool.closed and any(
            i not in self._results and i not in self._given_up for i in range(self.size)
        )
        if gave_up:  # nobody waits for the rest now: it must not run on for nobody
            self._stop_waiting(message)
        if not pool.closed:  # a closed pool's client is closed (and Redis maybe gone)
            yield from self._reconcile(stand_in=cancelled(message) if gave_up else None)
        pool.lease.through(self.id)
        pool.want_spare()  # nothing of this batch waits for it now
        for index in range(self.size):
            if index not in self._results:
                if index in self._given_up:
                    self._results[index] = cancelled(self._give_up_message)
                else:
                    self._results[index] = infra(message)
                yield index, self._results[index]

    def _reconcile(self, stand_in: ExecResult | None = None) -> Iterator[tuple[int, ExecResult]]:
        """Take what the results hash holds for the indices still missing here (their
        done entries were lost, or are still on the list). ``stand_in``: a result that
        stands for no result (the cancellation ``_stop_waiting`` wrote), left missing."""
        missing = [i for i in range(self.size) if i not in self._results]
        key = self.pool.keys.batch_results(self.id)
        for start in range(0, len(missing), RECONCILE_CHUNK):
            chunk = missing[start : start + RECONCILE_CHUNK]
            try:
                blobs = self.pool.collect.hmget(key, chunk)
            except redis.RedisError as exc:
                log.warning("batch %s: could not read its results hash: %s", self.id, exc)
                return
            for index, blob in zip(chunk, blobs, strict=True):
                if blob is None:
                    continue
                result = codec.decode_result(cast(bytes, blob))
                if result == stand_in:
                    continue
                result = result.replace(latency=time.monotonic() - self.submitted)
                self._results[index] = result
                self._reconciled.add(index)
                yield index, result

    def _stop_waiting(self, message: str) -> None:
        """Cancel what has no result yet (its result in Redis becomes the cancellation),
        and withdraw the batch's announcements: a collection that stops waiting. Best
        effort: a Redis that cannot be told leaves the batch to its TTL."""
        try:
            cancel(
                self.pool.collect,
                self.pool.settings,
                self.id,
                run=self.run,
                message=message,
                withdraw=self.announcements,
            )
        except redis.RedisError as exc:
            log.warning("batch %s: could not cancel what it stopped waiting for: %s", self.id, exc)

    def cancel(self, indices: Iterable[int] | None = None, *, message: str = "") -> int:
        """Give up on the whole batch (``indices`` None) or on some of its snippets. What
        has no result yet is cancelled: a snippet not started never starts, a running
        one is killed within about a second, neither is written nor counted but as
        ``cancelled``; they come back from ``results``/``as_completed`` with status
        ``cancelled`` (a result already written stays). Batch mates are not touched.
        Returns how many snippets were cancelled. ConfigError for an index out of
        range; RedisUnavailable if Redis could not be told (they still come back
        cancelled here, and run on there).
        """
        chosen = None if indices is None else sorted(set(indices))
        if chosen is not None and any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.size for i in chosen
        ):
            raise ConfigError(f"cancel: indices must be ints in [0, {self.size})")
        message = message or GAVE_UP_MESSAGE
        # Once nothing of the batch is wanted, its announcements still queued go too: a
        # dispatcher would take each, find nothing and end, and what comes after them
        # on the queue (the next caller's batch) would wait for it.
        wanted = {i for i in range(self.size) if i not in self._results}
        wanted -= self._given_up.union(range(self.size) if chosen is None else chosen)
        try:
            count = cancel(
                self.pool.conn,
                self.pool.settings,
                self.id,
                chosen,
                run=self.run,
                message=message,
                withdraw=() if wanted else self.announcements,
            )
        except redis.RedisError as exc:
            raise RedisUnavailable(f"cannot cancel batch {self.id}: {exc}") from exc
        finally:
            # After Redis: a collector that sees only these missing takes one last look
            # at the done list, where the cancellations are by then.
            self._give_up_message = message
            self._given_up.update(range(self.size) if chosen is None else chosen)
            if chosen is None:
                self.pool.lease.through(self.id)
        return max(0, count)

    async def acancel(self, indices: Iterable[int] | None = None, *, message: str = "") -> int:
        """``cancel`` for async callers (runs in a thread; any event loop)."""
        return await asyncio.to_thread(self.cancel, indices, message=message)

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
