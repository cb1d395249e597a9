"""CodePool: submit batches of snippets to the worker fleet and collect their results.

```python
pool = CodePool("redis://host:6379/0")
batch = pool.submit(codes, timeout_s=5.0, run="exp1")   # returns at once
results = batch.results(timeout_s=300)                  # list[ExecResult], input order
for i, r in batch.as_completed(): ...
pool.metrics(run="exp1")
```
A batch is stored once in Redis and announced to as many live worker hosts as can share
it; one dispatcher of each claims runs of its indices (see ``common/ledger.py``).
Results are collected from the batch's done list (BLMPOP, many per call). While it
waits, the producer also watches the dispatchers' leases: it recovers the work of a
lapsed one (like any live dispatcher would), and says so when no dispatcher is alive.
A producer with batches in flight holds a lease of its own (producer/lease.py): if it
dies, its batches are cancelled. ``Batch.cancel`` gives up on a batch or some of its
snippets (common/cancellation.py); closing the pool gives up on what is in flight.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, cast

import redis
from rq.job import Job

from codepool.common import codec, counters
from codepool.common.cancellation import CLOSED_MESSAGE, GAVE_UP_MESSAGE, cancel
from codepool.common.connection import redis_client
from codepool.common.errors import ConfigError, RedisUnavailable
from codepool.common.janitor import Janitor
from codepool.common.ledger import heartbeat_script, submit_script
from codepool.common.limits import Limits
from codepool.common.queueing import announce, announcement, announcements_for, batch_queue
from codepool.common.result import ExecResult, cancelled, infra
from codepool.common.retry import pause
from codepool.common.settings import Settings
from codepool.common.snippet import INPUT_KEYWORDS
from codepool.common.wire import RUN_TAG_MAX_CHARS, WHOLE_BATCH, BatchJob, new_batch_id
from codepool.producer.lease import ProducerLease, producer_name

log = logging.getLogger(__name__)

# How long one blocking read waits before the leases are looked at again.
POLL_BLOCK_S = 1.0
# No result for this long while dispatchers live: announce the batch again if it still
# has unclaimed work (an announcement lost, say, with a Redis that failed over).
STALL_S = 10.0
# No lingering once this few results are missing: the end of a batch comes at once.
LINGER_UNTIL_LEFT = 8
# Distinct (defaults, overrides) pairs whose Limits are remembered.
LIMITS_CACHED = 64
DEADLINE_MESSAGE = "codepool: no result before the producer's deadline"
NO_WORKER_MESSAGE = (
    "codepool: no live worker on queue {queue!r} for {wait:.0f} s (no dispatcher heartbeat "
    "in Redis); is `codepool worker` running and pointed at this Redis?"
)


@functools.lru_cache(maxsize=LIMITS_CACHED)
def _limits_with(defaults: Limits, overrides: tuple[tuple[str, Any], ...]) -> Limits:
    return defaults.with_overrides(**dict(overrides))


class CodePool:
    """A producer's handle on the pool. Thread-safe; cheap to share.

    url: Redis URL (default: ``$REDIS_URL``). limits: defaults for every batch.
    settings: prefix, queue, TTLs, lease and no-worker wait (default:
    ``Settings.from_env()``).
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
        self.name = producer_name()
        self.janitor = Janitor(self.conn, self.settings, name=self.name)
        self.lease = ProducerLease(self.conn, self.settings, name=self.name)
        self._live: int | None = None  # live hosts, as the last submit saw them
        # The next batch's id and first announcement, made on a thread of the pool's
        # once a batch's results are in (_want_spare): what RQ takes to make one is then
        # neither before a submit's round trip nor beside the work it starts.
        self._spare_lock = threading.Lock()
        self._spare: tuple[str, Job] | None = None
        self._spare_wanted = threading.Event()
        self._spare_maker: threading.Thread | None = None
        self._closed = False
        self._watch_lock = threading.Lock()
        self._watched_at = -1e9
        self._watched: int | None = None

    def submit(
        self,
        codes: Sequence[Any],
        *,
        run: str = "",
        deadline_s: float | None = None,
        max_reruns: int | None = None,
        **limits: Any,
    ) -> Batch:
        """Store ``codes`` as one batch, announce it, and return at once. Entries are
        str, or Snippet for code with stdin, files, fetch_files or notebook cells.
        Keywords: Limits fields (``timeout_s``, ``memory_mb``, ...). Entries that are
        neither come back ``rejected``; a batch over the size limits raises ConfigError.

        deadline_s: a backstop: what has no result by then comes back ``infra``
            (default: every timeout end to end plus a minute, at most an hour). Lost
            workers are recovered long before it, through their leases.
        max_reruns: how often a snippet whose worker was lost is run again before it
            comes back ``infra`` (default: ``settings.max_reruns``, 2).
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
        reruns = self.settings.max_reruns if max_reruns is None else max_reruns
        if isinstance(reruns, bool) or not isinstance(reruns, int) or reruns < 0:
            raise ConfigError(f"max_reruns must be a non-negative int, got {reruns!r}")
        per_snippet = sorted(set(limits).intersection(INPUT_KEYWORDS))
        if per_snippet:
            raise ConfigError(
                f"{per_snippet[0]}= belongs to one snippet: submit Snippet.make(code, "
                f"{per_snippet[0]}=...) entries"
            )
        try:  # most producers pass the same overrides to every submit
            effective = _limits_with(self.limits, tuple(sorted(limits.items())))
        except TypeError:  # an unhashable value: with_overrides says what is wrong
            effective = self.limits.with_overrides(**limits)
        with self._spare_lock:
            spare, self._spare = self._spare, None
        batch_id, made = spare if spare is not None else (new_batch_id(), None)
        spec = BatchJob.from_codes(batch_id, codes, effective, run, time.time()).encode()
        if len(spec) > self.settings.max_batch_bytes:
            raise ConfigError(
                f"batch of {len(spec)} bytes is over the limit of {self.settings.max_batch_bytes}"
            )
        announced: list[str] = []
        try:
            if codes:
                announced = self._store_and_announce(batch_id, spec, len(codes), run, reruns, made)
        except redis.RedisError as exc:
            raise RedisUnavailable(f"cannot enqueue batch {batch_id}: {exc}") from exc
        if codes:
            self.lease.submitted(batch_id, run)
        return Batch(
            self,
            batch_id,
            len(codes),
            effective,
            deadline_s=deadline_s,
            run=run,
            announcements=tuple(announced),
        )

    def _want_spare(self) -> None:
        """Have the spare thread make the next batch's id and announcement, unless there
        is one. Called when a batch's results are in: on a 2-core host, making it right
        after the submit took the core that Redis and the worker needed for the claim."""
        with self._spare_lock:
            if self._spare is not None or self._closed:
                return
            if self._spare_maker is None:
                self._spare_maker = threading.Thread(
                    target=self._make_spares, name="codepool-spare", daemon=True
                )
                self._spare_maker.start()
        self._spare_wanted.set()

    def _make_spares(self) -> None:
        while True:
            self._spare_wanted.wait()
            self._spare_wanted.clear()
            if self._closed:
                return
            batch_id = new_batch_id()
            job = announcement(self._queue, self.settings, batch_id)
            with self._spare_lock:
                if self._spare is None:
                    self._spare = (batch_id, job)

    def _store_and_announce(
        self, batch_id: str, spec: bytes, n: int, run: str, reruns: int, made: Job | None = None
    ) -> list[str]:
        """One round trip when the live host count is known (from the previous
        submit), two for a pool's first batch: that one also loads the script if the
        server lacks it, so a fresh Redis does not see the first batch announced twice
        (an announcement in a MULTI whose script was missing goes out regardless).
        Returns the announcements' job ids."""
        settings = self.settings
        store_keys = [
            self.keys.batch_state(batch_id),
            self.keys.hosts(),
            self.keys.producers(),
            self.keys.producer_batches(self.name),
        ]
        store_args = [spec, n, run, reruns, settings.batch_ttl_s, settings.lease_s]
        store_args += [self.name, batch_id]
        if self._live is None:
            self._live = int(submit_script(self.conn, store_keys, store_args))
            return announce(
                self._queue,
                settings,
                batch_id=batch_id,
                size=n,
                count=announcements_for(n, self._live),
                made=made,
            )
        # One MULTI/EXEC (RQ turns a pipeline into one anyway): the batch is stored
        # before any dispatcher can see its announcement.
        with self.conn.pipeline(transaction=True) as pipe:
            pipe.multi()
            submit_script.queue(pipe, store_keys, store_args)
            announced = announce(
                self._queue,
                settings,
                batch_id=batch_id,
                size=n,
                count=announcements_for(n, self._live or 1),
                pipeline=pipe,
                made=made,
            )
            try:
                self._live = int(pipe.execute()[0])
            except redis.exceptions.NoScriptError:
                # The announcement went out; store the batch and announce it again (a
                # dispatcher that found no batch yet has let its announcement go).
                self._live = int(submit_script(self.conn, store_keys, store_args))
                announced += announce(self._queue, settings, batch_id=batch_id, size=n)
        return announced

    def nudge(self, batch_id: str, size: int) -> bool:
        """Announce a batch once more if it has work nobody has claimed; True if it did.
        A spare announcement costs one RQ job: whoever takes it finds nothing and ends."""
        try:
            n, nxt, retry = self.conn.hmget(self.keys.batch_state(batch_id), "n", "next", "retry")
            if n is None or (int(nxt or 0) >= int(n) and int(retry or 0) <= 0):
                return False
            announce(self._queue, self.settings, batch_id=batch_id, size=size)
        except redis.RedisError as exc:
            log.warning("batch %s: could not announce it again: %s", batch_id, exc)
            return False
        log.warning("batch %s: no progress with work unclaimed; announced it again", batch_id)
        return True

    def watch(self) -> int | None:
        """Live worker hosts now (at most one look at Redis a second for the whole pool);
        recovers lapsed ones on the way. None if Redis could not be asked."""
        with self._watch_lock:
            now = time.monotonic()
            if now - self._watched_at < POLL_BLOCK_S:
                return self._watched
            self._watched_at = now
            try:
                reply = heartbeat_script(
                    self.conn,
                    [self.keys.leases(), self.keys.hosts(), self.keys.producers()],
                    ["", self.settings.lease_s, "0", ""],
                )
            except redis.RedisError:
                self.janitor.in_contact(False)
                self._watched = None
                return None
            live, lapsed, gone = int(reply[1]), list(reply[2]), list(reply[3])
            trusted = self.janitor.in_contact(True)
            if trusted and lapsed:
                self.janitor.sweep(lapsed, live)
            if trusted and gone:
                self.janitor.abandon(gone)
            self._watched = live
            return live

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
        """Give up on the batches in flight (they are cancelled: nobody can collect them
        from a closed pool), give the lease up and disconnect."""
        if self._closed:
            return
        self._closed = True
        self._spare_wanted.set()
        for batch_id, run in self.lease.in_flight().items():
            try:
                cancel(self.conn, self.settings, batch_id, run=run, message=CLOSED_MESSAGE)
            except redis.RedisError as exc:
                log.warning("batch %s: could not cancel it on close: %s", batch_id, exc)
            self.lease.through(batch_id)
        self.lease.close()
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
        deadline_s: float | None = None,
        run: str = "",
        announcements: tuple[str, ...] = (),
    ) -> None:
        self.pool = pool
        self.id = batch_id
        self.size = size
        self.limits = limits
        self.run = run
        self.announcements = announcements  # its RQ jobs, made at submit
        self.deadline_s = deadline_s if deadline_s is not None else self.default_deadline_s()
        self.submitted = time.monotonic()
        self.duplicates = 0  # done-list entries for an index already seen (should stay 0)
        self._results: dict[int, ExecResult] = {}
        # Indices given up on here (cancel), and why: they come back cancelled even when
        # Redis could not be told.
        self._given_up: set[int] = set()
        self._give_up_message = GAVE_UP_MESSAGE

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
        while len(self._results) < self.size:
            now = time.monotonic()
            if now >= end:
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
            block_s = 0.01 if last_look else max(0.01, min(end, watch_at) - now)
            try:
                popped = pool.conn.blmpop(block_s, 1, done_key, direction="LEFT", count=self.size)
            except redis.RedisError:
                if last_look:
                    break
                # Redis restarting: wait a little and try again until the deadline.
                pause(end, 0.5)
                continue
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
        pool.lease.through(self.id)
        pool._want_spare()  # nothing of this batch waits for it now
        for index in range(self.size):
            if index not in self._results:
                if index in self._given_up:
                    self._results[index] = cancelled(self._give_up_message)
                else:
                    self._results[index] = infra(message)
                yield index, self._results[index]

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
