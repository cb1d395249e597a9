"""The dispatcher's result writer: each finished snippet goes to Redis as soon as the
executor hands it over, from this thread, not when RQ's job thread gets round to it.

Writes that arrive together share one pipeline. First write wins (HSETNX), and only a
first write pushes the done-list entry, so the done list never holds an index twice.
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
from codepool.common.result import ExecResult
from codepool.worker.stats import StatsBuffer

if TYPE_CHECKING:
    from codepool.worker.job import BatchExecution

log = logging.getLogger(__name__)

# HSETNX the result; push the done entry (index and result, so the trainer needs no
# second read) only if that was the first write.
WRITE_RESULT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[3])
  return 1
end
return 0
"""
MAX_GROUP = 512
RETRY_FOR_S = 60.0

_Item = tuple["BatchExecution", int, ExecResult]


class ResultWriter:
    """One writer thread per dispatcher."""

    def __init__(self, conn: redis.Redis, keys: Keys, stats: StatsBuffer, batch_ttl_s: int):
        self.conn = conn
        self.keys = keys
        self.stats = stats
        self.batch_ttl_s = batch_ttl_s
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._sha = conn.script_load(WRITE_RESULT)
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
            # Decided once per group, so a retried write does not count twice.
            ttls = {
                execution: execution.needs_ttl(len(results))
                for execution, results in groups.items()
            }
            self._write_with_retry(groups, ttls)

    def _write_with_retry(
        self,
        groups: dict[BatchExecution, list[tuple[int, ExecResult]]],
        ttls: dict[BatchExecution, bool],
    ) -> None:
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                self._write(groups, ttls)
                return
            except redis.RedisError as exc:
                if time.monotonic() > deadline:
                    log.error("giving up writing %d results: %s", len(groups), exc)
                    for execution in groups:
                        execution.failed(exc)
                    return
                log.warning("writing results failed, retrying: %s", exc)
                time.sleep(0.5)

    def _write(
        self,
        groups: dict[BatchExecution, list[tuple[int, ExecResult]]],
        ttls: dict[BatchExecution, bool],
    ) -> None:
        with self.conn.pipeline(transaction=False) as pipe:
            for execution, results in groups.items():
                results_key = self.keys.batch_results(execution.batch.batch_id)
                done_key = self.keys.batch_done(execution.batch.batch_id)
                for index, result in results:
                    blob = codec.encode_result(result)
                    entry = codec.encode_done_entry(index, blob)
                    pipe.evalsha(self._sha, 2, results_key, done_key, index, blob, entry)
                if ttls[execution]:
                    # With the first write, and whenever the batch has nothing left in
                    # flight: the producer may have drained (deleted) the done list.
                    pipe.expire(results_key, self.batch_ttl_s)
                    pipe.expire(done_key, self.batch_ttl_s)
            try:
                replies = pipe.execute()
            except redis.exceptions.NoScriptError:
                self._sha = self.conn.script_load(WRITE_RESULT)
                raise redis.RedisError("script was not loaded; loaded it again") from None
        position = 0
        for execution, results in groups.items():
            for _, result in results:
                if replies[position]:
                    self.stats.record(result, execution.batch.run)
                position += 1
            if ttls[execution]:
                position += 2
            execution.written(len(results))
