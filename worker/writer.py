"""The dispatcher's result writer: each finished snippet goes to Redis as soon as the
executor hands it over, from this thread, not when RQ's job thread gets round to it.

Results that arrive together share one script call per batch (and one pipeline): a Redis
round trip costs far more than a command, and Redis then wakes once for many results.
Nothing waits for a group to fill: each result goes as soon as the writer is free.
First write wins (HSETNX), and only a
first write pushes the done-list entry and is counted, so neither the done list nor the
counters ever hold an index twice. Nothing is written while the dispatcher's lease may
have lapsed (after a freeze or a partition) until a heartbeat says it still holds; a
dispatcher that lost its lease drops its late results, since they were released to run
elsewhere.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING

import redis

from codepool.common import codec
from codepool.common.keys import Keys
from codepool.common.ledger import write_script
from codepool.common.result import ExecResult
from codepool.common.retry import retry_until
from codepool.worker.counter_buffer import CounterBuffer
from codepool.worker.lease import LeaseKeeper

if TYPE_CHECKING:
    from codepool.worker.job import BatchExecution

log = logging.getLogger(__name__)

MAX_GROUP = 512
WRITE_CHUNK = 128  # results per script call (Lua's unpack stays well inside its stack)
RETRY_FOR_S = 60.0

_Item = tuple["BatchExecution", int, ExecResult]
_Groups = dict["BatchExecution", list[tuple[int, ExecResult]]]


class ResultWriter:
    """One writer thread per dispatcher."""

    def __init__(
        self,
        conn: redis.Redis,
        keys: Keys,
        stats: CounterBuffer,
        batch_ttl_s: int,
        lease: LeaseKeeper,
    ) -> None:
        self.conn = conn
        self.keys = keys
        self.stats = stats
        self.batch_ttl_s = batch_ttl_s
        self.lease = lease
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()

        write_script.load(conn)
        self._thread = threading.Thread(target=self._loop, name="codepool-writer", daemon=True)
        self._thread.start()

    def put(self, execution: BatchExecution, index: int, result: ExecResult) -> None:
        self._queue.put((execution, index, result))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            items = [item]
            while len(items) < MAX_GROUP:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                items.append(more)
            groups: defaultdict[BatchExecution, list[tuple[int, ExecResult]]] = defaultdict(list)
            for execution, index, result in items:
                groups[execution].append((index, result))
            # Decided once per group, so a retried write sets it too.
            ttls = {execution: execution.first_write() for execution in groups}
            self._write_with_retry(groups, ttls)

    def _write_with_retry(self, groups: _Groups, ttls: dict[BatchExecution, bool]) -> None:
        deadline = time.monotonic() + RETRY_FOR_S

        def attempt() -> bool:
            if not self.lease.confirm(max(0.0, deadline - time.monotonic())):
                return False
            self._write(groups, ttls)
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

    def _drop(self, groups: _Groups) -> None:
        for execution, results in groups.items():
            log.info(
                "batch %s: dropped %d late results: this dispatcher's lease lapsed and its "
                "snippets were released to run elsewhere",
                execution.batch_id,
                len(results),
            )
            execution.written(len(results))

    def _write(self, groups: _Groups, ttls: dict[BatchExecution, bool]) -> None:
        with self.conn.pipeline(transaction=False) as pipe:
            for execution, results in groups.items():
                results_key = self.keys.batch_results(execution.batch_id)
                done_key = self.keys.batch_done(execution.batch_id)
                for start in range(0, len(results), WRITE_CHUNK):
                    args: list[object] = []
                    for index, result in results[start : start + WRITE_CHUNK]:
                        blob = codec.encode_result(result)
                        args += [index, blob, codec.encode_done_entry(index, blob)]
                    write_script.queue(pipe, [results_key, done_key], args)
                if ttls[execution]:
                    # The done list gets its TTL when the execution ends (the producer
                    # drains it meanwhile, and a drained list is gone, TTL and all).
                    pipe.expire(results_key, self.batch_ttl_s)
            try:
                replies = pipe.execute()
            except redis.exceptions.NoScriptError:
                write_script.load(self.conn)
                raise redis.RedisError("script was not loaded; loaded it again") from None
        position = 0
        for execution, results in groups.items():
            firsts: list[int] = []
            for _ in range(0, len(results), WRITE_CHUNK):
                firsts += replies[position]
                position += 1
            late = 0
            for (index, result), first in zip(results, firsts, strict=True):
                if first:
                    self.stats.record(execution.batch_id, execution.run, index, result)
                else:
                    late += 1
            if late:
                log.info(
                    "batch %s: %d late results dropped, already written by another run",
                    execution.batch_id,
                    late,
                )
            if ttls[execution]:
                position += 1
            execution.written(len(results))
