"""The dispatcher's result writer: each finished snippet goes to Redis from this thread
as the executor hands it over, not when RQ's job thread gets round to it.

A Redis round trip costs the server far more CPU than the commands in it (about 25 us
against 2 us per result on the machines the bench runs on), so while results stream in
they are gathered: the writer writes at most once per ``write_gap_s``, one script call
per batch (and one pipeline) for everything gathered, and the producer blocked on the
done list gets it all in one pop. Nothing is held when holding cannot pay: a result
goes at once when the last write was longer ago than the gap (a lone snippet, the first
of a burst), or when its batch has no other snippet of this dispatcher still running
(nothing would join it: the end of a batch, a lone call). So a result waits at most one
gap, and only while others are on their way.

A result is the writer's from the moment it takes it: the dispatcher's window frees its
slot then (``BatchExecution.taken``), so a gathered result never idles a slot, while a
write that waits for Redis or for the lease takes nothing more and so holds the window
full, as before. First write wins (HSETNX), and only a first write pushes the done-list
entry and is counted, in the same script call (common/tally.py), so neither the done
list nor the counters ever hold an index twice. Nothing is written while the
dispatcher's lease may have lapsed (after a freeze or a partition) until a heartbeat
says it still holds; a dispatcher that lost its lease drops its late results, since
they were released to run elsewhere.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import defaultdict
from enum import Enum
from typing import Any, Protocol

import redis

from codepool.common import failover
from codepool.common.keys import Keys
from codepool.common.ledger import write_script
from codepool.common.result import ExecResult
from codepool.common.retry import retry_until
from codepool.common.settings import Settings
from codepool.common.tally import write_calls
from codepool.worker.lease import DispatcherLease
from codepool.worker.recent_writes import RecentWrites

log = logging.getLogger(__name__)

MAX_GROUP = 512
RETRY_FOR_S = 60.0


class ResultSource(Protocol):
    """What the writer needs of a batch's execution (job.BatchExecution, which imports
    this module): where its results go, and the counts it keeps as they are taken."""

    batch_id: str
    run: str

    def last_expected(self) -> bool: ...
    def expecting(self) -> bool: ...
    def taken(self, count: int) -> None: ...
    def written(self, count: int) -> None: ...
    def failed(self, exc: BaseException) -> None: ...


_Item = tuple[ResultSource, int, ExecResult]


class _Signal(Enum):
    NUDGE = "nudge"  # look at what is held again
    CLOSE = "close"  # write what is held and stop


_Groups = dict[ResultSource, list[tuple[int, ExecResult]]]


class ResultWriter:
    """One writer thread per dispatcher of worker host ``worker`` (its counter hash).

    write_gap_s: while results stream in, at most one write per this many seconds
        (0: write whatever has arrived as soon as the writer is free).
    rewrite_s: with a Sentinel-managed primary, the results written in the last this
        many seconds are written again when the primary moves.
    """

    def __init__(
        self,
        conn: redis.Redis,
        keys: Keys,
        batch_ttl_s: int,
        lease: DispatcherLease,
        *,
        worker: str,
        minute_ttl_s: int,
        write_gap_s: float,
        rewrite_s: float = 0.0,
    ) -> None:
        self.conn = conn
        self.keys = keys
        self.worker = worker
        self.minute_ttl_s = minute_ttl_s
        self.batch_ttl_s = batch_ttl_s
        self.lease = lease
        self.write_gap_s = write_gap_s
        self._queue: queue.SimpleQueue[_Item | _Signal] = queue.SimpleQueue()

        # With Sentinel: what was written lately, to write again when the primary moves
        # (worker/recent_writes.py); the nudge wakes an idle writer for it.
        self.recent: RecentWrites | None = None
        if failover.sentinel_of(conn) is not None:
            self.recent = RecentWrites(conn, rewrite_s)
            failover.on_new_primary(conn, self.nudge)
        write_script.load(conn)
        self._thread = threading.Thread(target=self._loop, name="codepool-writer", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(
        cls, conn: redis.Redis, settings: Settings, lease: DispatcherLease, *, worker: str
    ) -> ResultWriter:
        """The writer a dispatcher runs: every knob from ``settings``, so a real
        dispatcher and the fleet bench's simulated ones write alike."""
        return cls(
            conn,
            settings.keys,
            settings.batch_ttl_s,
            lease,
            worker=worker,
            minute_ttl_s=settings.minute_stats_ttl_s,
            write_gap_s=settings.write_gap_s,
            rewrite_s=settings.failover_rewrite_s,
        )

    def put(self, execution: ResultSource, index: int, result: ExecResult) -> None:
        if not (execution.last_expected() and self._write_here(execution, index, result)):
            self._queue.put((execution, index, result))

    def _write_here(self, execution: ResultSource, index: int, result: ExecResult) -> bool:
        """Write a result nothing else would join (its batch expects no other from this
        dispatcher) on the calling thread, the executor client's: one thread hand-off
        less between a lone call and its answer. One attempt, and only with the lease
        trusted; False leaves the result to the writer thread."""
        if not self.lease.confirm(0.0):
            return False
        try:
            self._write({execution: [(index, result)]}, taken=True)
        except redis.RedisError:
            return False  # the writer retries it (a first write that went through wins)
        return True

    def nudge(self) -> None:
        """An execution stopped expecting results: write what is held of it now."""
        self._queue.put(_Signal.NUDGE)

    def close(self) -> None:
        """Write what is held and stop."""
        self._queue.put(_Signal.CLOSE)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        last_write = -math.inf
        closing = False
        while not closing:
            held: _Groups = defaultdict(list)
            closing = self._take(held, timeout_s=None)
            while not closing and not self._due(held, last_write):
                due_s = last_write + self.write_gap_s - time.monotonic()
                closing = self._take(held, timeout_s=due_s)
            if held or (self.recent is not None and self.recent.moved()):
                last_write = time.monotonic()
                self._write_with_retry(held)

    def _take(self, held: _Groups, *, timeout_s: float | None) -> bool:
        """Move what has arrived into ``held``, waiting up to ``timeout_s`` (None: for
        ever) for the first item; True once close() was called."""
        try:
            item = self._queue.get(timeout=None if timeout_s is None else max(0.0, timeout_s))
        except queue.Empty:
            return False
        taken: defaultdict[ResultSource, int] = defaultdict(int)
        closing = False
        size = sum(len(results) for results in held.values())
        while True:
            if item is _Signal.CLOSE:
                closing = True
                break
            if not isinstance(item, _Signal):
                execution, index, result = item
                held[execution].append((index, result))
                taken[execution] += 1
                size += 1
                if size >= MAX_GROUP:
                    break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        for execution, count in taken.items():
            execution.taken(count)
        return closing

    def _due(self, held: _Groups, last_write: float) -> bool:
        """Write now: held is empty (woken by a nudge: nothing to wait for), a gap has
        passed since the last write, a batch in ``held`` expects nothing more from this
        dispatcher, or the group is full."""
        return (
            not held
            or time.monotonic() - last_write >= self.write_gap_s
            or any(not execution.expecting() for execution in held)
            or sum(len(results) for results in held.values()) >= MAX_GROUP
        )

    def _write_with_retry(self, groups: _Groups) -> None:
        deadline = time.monotonic() + RETRY_FOR_S

        def attempt() -> bool:
            if not self.lease.confirm(max(0.0, deadline - time.monotonic())):
                return False
            self._write(groups)
            return True

        try:
            wrote = retry_until(
                deadline,
                attempt,
                errors=(redis.RedisError,),
                pause_s=0.5,
                on_error=lambda exc: log.warning("writing results failed, retrying: %s", exc),
            )
        except redis.RedisError as exc:
            log.error("giving up writing %d results: %s", len(groups), exc)
            for execution in groups:
                execution.failed(exc)
            return
        if not wrote:
            self._drop(groups)

    def _calls(
        self, batch_id: str, run: str, results: list[tuple[int, ExecResult]]
    ) -> list[tuple[list[str], list[Any]]]:
        return write_calls(
            self.keys,
            batch_id,
            results,
            worker=self.worker,
            run=run,
            batch_ttl_s=self.batch_ttl_s,
            minute_ttl_s=self.minute_ttl_s,
        )

    def _drop(self, groups: _Groups) -> None:
        for execution, results in groups.items():
            log.info(
                "batch %s: dropped %d late results: this dispatcher's lease lapsed and its "
                "snippets were released to run elsewhere",
                execution.batch_id,
                len(results),
            )
            execution.written(len(results))

    def _write(self, groups: _Groups, *, taken: bool = False) -> None:
        """One pipeline for ``groups`` (after a failover, what was written lately goes
        first, again); taken: their executions learn the writer took them once it went
        through (the writer thread tells them as it takes them)."""
        calls_per_group: list[int] = []
        generation, rewrites = self.recent.pending() if self.recent else (0, {})
        with self.conn.pipeline(transaction=False) as pipe:
            rewrite_calls = 0
            for (batch_id, run), results in rewrites.items():
                for call_keys, args in self._calls(batch_id, run, results):
                    write_script.queue(pipe, call_keys, args)
                    rewrite_calls += 1
            for execution, results in groups.items():
                group_calls = self._calls(execution.batch_id, execution.run, results)
                for call_keys, args in group_calls:
                    write_script.queue(pipe, call_keys, args)
                calls_per_group.append(len(group_calls))
            try:
                replies = pipe.execute()
            except redis.exceptions.NoScriptError:
                write_script.load(self.conn)
                raise redis.RedisError("script was not loaded; loaded it again") from None
        if self.recent is not None:
            self.recent.written(
                generation,
                [
                    (execution.batch_id, execution.run, index, result)
                    for execution, results in groups.items()
                    for index, result in results
                ],
            )
        if rewrites:
            missing = sum(sum(reply) for reply in replies[:rewrite_calls])
            log.warning(
                "the redis primary moved: wrote %d recent results of %d batches again, "
                "%d of them missing on the new primary",
                sum(len(results) for results in rewrites.values()),
                len(rewrites),
                missing,
            )
        replies = replies[rewrite_calls:]
        position = 0
        for (execution, results), calls in zip(groups.items(), calls_per_group, strict=True):
            if taken:
                execution.taken(len(results))
            firsts = sum(sum(reply) for reply in replies[position : position + calls])
            position += calls
            late = len(results) - firsts
            if late:
                log.info(
                    "batch %s: %d late results dropped, already written (by another run, "
                    "or cancelled)",
                    execution.batch_id,
                    late,
                )
            execution.written(len(results))
