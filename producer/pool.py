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
dies, its batches are cancelled. ``Batch`` (producer/batch.py) collects a batch and
gives up on it; closing the pool gives up on what is in flight.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from rq.job import Job

from codepool.common import counters, failover
from codepool.common.cancellation import CLOSED_MESSAGE, cancel
from codepool.common.connection import redis_client
from codepool.common.errors import ConfigError, RedisUnavailable
from codepool.common.janitor import Janitor
from codepool.common.ledger import host_beat, submit_script
from codepool.common.limits import Limits
from codepool.common.queueing import announce, announcement, announcements_for, batch_queue
from codepool.common.settings import Settings
from codepool.common.snippet import INPUT_KEYWORDS
from codepool.common.wire import RUN_TAG_MAX_CHARS, BatchJob, new_batch_id
from codepool.producer.batch import POLL_BLOCK_S, Batch
from codepool.producer.calls import CallChannel
from codepool.producer.context import RemoteContext, open_context
from codepool.producer.lease import ProducerLease, producer_name
from codepool.producer.pool_view import Stored

__all__ = ["Batch", "CodePool"]  # Batch lives in producer/batch.py

log = logging.getLogger(__name__)

# Distinct (defaults, overrides) pairs whose Limits are remembered.
LIMITS_CACHED = 64
# What a close waits for Redis at most (seconds): a Redis that is gone must not hold it up.
CLOSE_TIMEOUT_S = 2.0
# The socket timeout of the client a collection reads with (beyond its blocking read): a
# Redis that stops answering costs a collection this long per read, not the 30-s
# default times redis-py's retries, so its deadline holds within seconds.
COLLECT_TIMEOUT_S = 5.0


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
        # Collections read with a client of their own: short timeouts and no retries of
        # redis-py's (a collection's own loop retries, and reconciles what a lost reply
        # had popped), so no read of theirs outlasts their deadline by more than seconds.
        self.collect = redis_client(
            self.settings.replace(
                socket_timeout_s=COLLECT_TIMEOUT_S,
                connect_timeout_s=min(COLLECT_TIMEOUT_S, self.settings.connect_timeout_s),
            ),
            block_s=POLL_BLOCK_S,
            retries=0,
        )
        self._queue = batch_queue(self.conn, self.settings)
        self.name = producer_name()
        self.janitor = Janitor(self.conn, self.settings, name=self.name)
        self.lease = ProducerLease(self.conn, self.settings, name=self.name)
        self._live: int | None = None  # live hosts, as the last submit saw them
        self._fleet_slots = 0  # their registered slots, as the last submit saw them
        # The next batch's id and first announcement, made on a thread of the pool's
        # once a batch's results are in (want_spare): what RQ takes to make one is then
        # neither before a submit's round trip nor beside the work it starts.
        self._spare_lock = threading.Lock()
        self._spare: tuple[str, Job] | None = None
        self._spare_wanted = threading.Event()
        self._spare_maker: threading.Thread | None = None
        self._closed = False
        self._watch_lock = threading.Lock()
        self._watched_at = -1e9
        self._watched: int | None = None
        self._calls: CallChannel | None = None

    @property
    def calls(self) -> CallChannel:
        """This producer's lone calls (producer/calls.py): one snippet at a time on the
        fleet's open work channels, no RQ job."""
        with self._watch_lock:
            if self._calls is None:
                self._calls = CallChannel(
                    self.conn, self.settings, name=self.name, watch=self.watch
                )
            return self._calls

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
                # A primary being elected or demoted refuses the whole round trip:
                # sent again once the sentinels name the primary (finding 6).
                announced = failover.following(
                    self.conn,
                    lambda: self._store_and_announce(batch_id, spec, len(codes), run, reruns, made),
                )
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
            spec=spec,
            reruns=reruns,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def want_spare(self) -> None:
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

    def _fleet_seen(self, reply: Any) -> None:
        """What a store says of the fleet: its live hosts and registered slots."""
        self._live, self._fleet_slots = int(reply[0]), int(reply[1])

    def _announcements(self, n: int) -> int:
        return announcements_for(n, self._live or 0, self._fleet_slots)

    def _store_and_announce(
        self, batch_id: str, spec: bytes, n: int, run: str, reruns: int, made: Job | None = None
    ) -> list[str]:
        """One round trip when the live host count is known (from the previous
        submit), two for a pool's first batch: that one also loads the script if the
        server lacks it, so a fresh Redis does not see the first batch announced twice
        (an announcement in a MULTI whose script was missing goes out regardless).
        When the store finds more live hosts than the previous submit did (hosts that
        started or joined since), the announcements they were not counted for follow at
        once, in one round trip more. Returns the announcements' job ids."""
        settings = self.settings
        store_keys = [
            self.keys.batch_state(batch_id),
            self.keys.hosts(),
            self.keys.open_batches(),
            self.keys.producers(),
            self.keys.producer_batches(self.name),
            self.keys.fleet(),
            self.keys.batch_spec(batch_id),
        ]
        store_args = [spec, n, run, reruns, settings.batch_ttl_s, settings.lease_s]
        store_args += [batch_id, self.name]

        def announce_for_fleet(pipeline: redis.client.Pipeline | None = None) -> list[str]:
            """As many announcements as the fleet known at this moment asks for."""
            count = self._announcements(n)
            return announce(
                self._queue,
                settings,
                batch_id=batch_id,
                size=n,
                count=count,
                pipeline=pipeline,
                made=made,
            )

        if self._live is None:
            self._fleet_seen(submit_script(self.conn, store_keys, store_args))
            return announce_for_fleet()
        # One MULTI/EXEC (RQ turns a pipeline into one anyway): the batch is stored
        # before any dispatcher can see its announcement.
        with self.conn.pipeline(transaction=True) as pipe:
            pipe.multi()
            submit_script.queue(pipe, store_keys, store_args)
            announced = announce_for_fleet(pipe)
            try:
                self._fleet_seen(pipe.execute()[0])
            except redis.exceptions.NoScriptError:
                # The announcement went out; store the batch and announce it again (a
                # dispatcher that found no batch yet has let its announcement go).
                self._fleet_seen(submit_script(self.conn, store_keys, store_args))
                announced += announce(self._queue, settings, batch_id=batch_id, size=n)
        missing = self._announcements(n) - len(announced)
        if missing > 0:
            announced += announce(self._queue, settings, batch_id=batch_id, size=n, count=missing)
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

    def recover(self, batch: Stored) -> bool:
        """After a failover (common/failover.py): store ``batch`` again if the new
        primary lacks it (its submit was not replicated: nobody would ever run it), or
        announce it again if it has work nobody has claimed (its announcements, or
        claims made on the old primary, may be lost). True once Redis answered."""
        try:
            if self.conn.exists(self.keys.batch_state(batch.id)):
                self.nudge(batch.id, batch.size)
                return True
            self._store_and_announce(batch.id, batch.spec, batch.size, batch.run, batch.reruns)
        except redis.RedisError as exc:
            log.warning("batch %s: could not look for it after a failover: %s", batch.id, exc)
            return False
        log.warning("batch %s: missing after a failover of Redis; stored it again", batch.id)
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
                beat = host_beat(
                    self.collect, self.keys, host="", lease_s=self.settings.lease_s, janitor=True
                )
            except redis.RedisError:
                self.janitor.in_contact(False)
                self._watched = None
                return None
            live = beat.live or 0
            trusted = self.janitor.in_contact(True, sent_at=now, server_time=beat.server_time)
            if trusted and beat.lapsed:
                self.janitor.sweep(beat.lapsed, live)
            if trusted and beat.lapsed_producers:
                self.janitor.abandon(beat.lapsed_producers)
            self._watched = live
            return live

    def context(self, *, rebuild: bool = True, **limits: Any) -> RemoteContext:
        """Open an interpreter context on a worker host of the fleet (producer/context.py):
        state kept across its calls, forkable; rebuilt on another host by replaying its
        successful calls if its host is lost (``rebuild=False``: such a call comes back
        ``infra`` instead). Keywords: Limits fields, its defaults. Raises CodepoolError
        when no live host can take it (none live, or all at their cap)."""
        effective = self.limits.with_overrides(**limits)
        return open_context(self, effective.to_dict(), rebuild=rebuild)

    async def acontext(self, *, rebuild: bool = True, **limits: Any) -> RemoteContext:
        return await asyncio.to_thread(functools.partial(self.context, rebuild=rebuild, **limits))

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
        from a closed pool; collections going on end), give the lease up and disconnect.
        Redis gets one try of at most CLOSE_TIMEOUT_S for it, so a Redis that is gone
        or frozen does not hold a close up: the lease is then left to lapse, and a
        janitor cancels the batches within it."""
        if self._closed:
            return
        self._closed = True
        self._spare_wanted.set()
        if self._calls is not None:
            self._calls.close()
        quick = redis_client(
            self.settings.replace(
                socket_timeout_s=CLOSE_TIMEOUT_S, connect_timeout_s=CLOSE_TIMEOUT_S
            ),
            retries=0,
        )
        try:
            for batch_id, run in self.lease.in_flight().items():
                cancel(quick, self.settings, batch_id, run=run, message=CLOSED_MESSAGE)
                self.lease.through(batch_id)
            self.lease.close(quick)
        except redis.RedisError as exc:
            log.warning(
                "producer %s: could not give its batches up on close (%s); its lease is "
                "left to lapse, and a janitor cancels them then",
                self.name,
                exc,
            )
            self.lease.stop(wait=False)
        finally:
            quick.close()
        self.conn.close()
        self.collect.close()
