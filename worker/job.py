"""The RQ job boundary: codepool's only job function, and the runner behind it.

A dispatcher (an RQ worker process) fetches one job per batch. ``CodepoolJob`` refuses to
resolve any function but :data:`JOB_FUNCTION` (nothing else is ever imported) and hands
the payload to the dispatcher's :class:`BatchRunner`, which runs the snippets on the
host's shared executor and writes each result as it finishes (first write wins).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from datetime import UTC, datetime
from typing import Any

import redis
from rq.job import Job

from codepool.common import codec
from codepool.common.errors import CodepoolError, WireError
from codepool.common.limits import Limits
from codepool.common.queueing import batch_queue, enqueue_batch
from codepool.common.result import ExecResult, rejected
from codepool.common.settings import Settings
from codepool.common.wire import JOB_FUNCTION, BatchJob
from codepool.worker.client import ZygoteClient
from codepool.worker.stats import StatsBuffer

log = logging.getLogger(__name__)

# First write wins: HSETNX the result and push the done entry (index and result, so the
# trainer needs no second read) only if it was the first write: the done list never
# holds an index twice. TTLs are set per job execution (BatchExecution), not per snippet.
WRITE_RESULT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[3])
  return 1
end
return 0
"""
HEARTBEAT_EVERY_S = 10.0
HEARTBEAT_TTL_S = 60


class RefusedJob(CodepoolError):
    """Raised when an RQ job names a function other than codepool's job function."""


def run_batch(payload: bytes) -> None:
    """The name producers enqueue. It runs only inside ``codepool worker``, whose
    CodepoolJob routes it to the dispatcher's BatchRunner."""
    raise CodepoolError("run_batch runs only inside `codepool worker` dispatchers")


class CodepoolJob(Job):
    """An RQ job that resolves to the dispatcher's runner, and to nothing else."""

    runner: BatchRunner | None = None
    execution: BatchExecution | None = None

    @property
    def func(self) -> Callable[..., Any]:
        if self.func_name != JOB_FUNCTION:
            raise RefusedJob(f"refused: job {self.id} names {self.func_name!r}, not codepool's")
        if self.runner is None:
            raise CodepoolError("no batch runner attached to this job")
        runner = self.runner
        return lambda payload, *_, **__: runner.run(self, payload)

    # Callbacks are imported by name too; codepool sets none, so none are honoured.
    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None


class BatchRunner:
    """Runs batches for one dispatcher: executor in, Redis results and stats out."""

    def __init__(
        self,
        *,
        executor: ZygoteClient,
        conn: redis.Redis,
        settings: Settings,
        stats: StatsBuffer,
        max_limits: Limits,
        stop_requested: Callable[[], bool],
    ) -> None:
        self.executor = executor
        self.conn = conn
        self.settings = settings
        self.keys = settings.keys
        self.stats = stats
        self.max_limits = max_limits
        self.stop_requested = stop_requested
        self._script_sha = conn.script_load(WRITE_RESULT)

    def prestart(self, job: Job) -> BatchExecution | None:
        """Decode the batch and start its first snippets before RQ's own bookkeeping
        for the job, so the two overlap. None if the payload is bad (run() reports it)."""
        try:
            execution = BatchExecution(self, job, job.args[0] if job.args else None)
        except (WireError, IndexError):
            return None
        execution.fill()
        return execution

    def run(self, job: Job, payload: Any) -> dict[str, Any]:
        execution = getattr(job, "execution", None)
        if not isinstance(execution, BatchExecution):
            try:
                execution = BatchExecution(self, job, payload)
            except WireError as exc:
                log.error("job %s: refused malformed batch: %s", job.id, exc)
                raise
        return execution.finish()

    def write(
        self, batch: BatchJob, results: list[tuple[int, ExecResult]], *, expire: bool
    ) -> None:
        """Write results (first write wins) and count the ones that were first.
        ``expire``: (re)set both per-batch TTLs in the same round trip."""
        results_key = self.keys.batch_results(batch.batch_id)
        done_key = self.keys.batch_done(batch.batch_id)
        for attempt in range(2):
            try:
                with self.conn.pipeline(transaction=False) as pipe:
                    for index, result in results:
                        blob = codec.encode_result(result)
                        pipe.evalsha(
                            self._script_sha,
                            2,
                            results_key,
                            done_key,
                            index,
                            blob,
                            codec.encode_done_entry(index, blob),
                        )
                    if expire:
                        pipe.expire(results_key, self.settings.batch_ttl_s)
                        pipe.expire(done_key, self.settings.batch_ttl_s)
                    replies = pipe.execute()
                break
            except redis.exceptions.NoScriptError:
                # Redis restarted without our script; load it again and retry once.
                self._script_sha = self.conn.script_load(WRITE_RESULT)
                if attempt:
                    raise
        for (_, result), first in zip(results, replies, strict=False):
            if first:
                self.stats.record(result, batch.run)

    def _requeue(self, job: Job, payload: Any) -> None:
        batch = BatchJob.decode(payload)
        queue = batch_queue(self.conn, self.settings)
        enqueue_batch(
            queue,
            self.settings,
            batch_id=batch.batch_id,
            payload=payload,
            size=len(batch.codes),
            at_front=True,
        )


class BatchExecution:
    """One execution of one batch job: keeps up to ``window`` snippets in the executor
    (so a stop request leaves little in flight), writes each result as it finishes."""

    def __init__(self, runner: BatchRunner, job: Job, payload: Any) -> None:
        self.runner = runner
        self.job = job
        self.payload = payload
        self.batch = BatchJob.decode(payload)
        n = len(self.batch.codes)
        self.limits = self.batch.limits.clamp(runner.max_limits)
        self.in_flight: dict[Future[ExecResult], int] = {}
        self.window = max(1, runner.executor.concurrency) + 1
        self.written_any = False
        self.ran = 0
        self.todo: list[int] = []
        if n > runner.settings.max_batch_snippets:
            self.oversize = True
            return
        self.oversize = False
        done: set[int] = set()
        # A fresh job cannot have results yet; a re-run (a retried or re-enqueued job)
        # skips what is already written.
        if job.id != self.batch.batch_id or job.started_at is not None:
            key = runner.keys.batch_results(self.batch.batch_id)
            done = {int(i) for i in runner.conn.hkeys(key)}
        self.todo = [i for i in range(n) if i not in done]
        self.todo.reverse()  # pop() from the end runs them in input order

    def fill(self) -> None:
        runner = self.runner
        while self.todo and len(self.in_flight) < self.window and not runner.stop_requested():
            index = self.todo.pop()
            code = self.batch.codes[index]
            if code is None:
                future: Future[ExecResult] = Future()
                future.set_result(
                    rejected("rejected: code must be str", worker=runner.executor.name)
                )
            else:
                future = runner.executor.submit_limited(
                    code.decode("utf-8", "surrogatepass"), self.limits
                )
            self.in_flight[future] = index

    def finish(self) -> dict[str, Any]:
        runner, batch, job = self.runner, self.batch, self.job
        n = len(batch.codes)
        log.info("job %s: batch %s with %d snippets (run %r)", job.id, batch.batch_id, n, batch.run)
        if self.oversize:
            message = (
                f"rejected: batch of {n} snippets is over the worker's limit of "
                f"{runner.settings.max_batch_snippets}"
            )
            rejections = [(i, rejected(message, worker=runner.executor.name)) for i in range(n)]
            runner.write(batch, rejections, expire=True)
            return {"batch": batch.batch_id, "ran": 0, "rejected": n}
        last_beat = time.monotonic()
        while True:
            self.fill()
            if not self.in_flight:
                break
            finished, _ = wait(
                self.in_flight, timeout=HEARTBEAT_EVERY_S, return_when=FIRST_COMPLETED
            )
            results = [(self.in_flight.pop(f), f.result()) for f in finished]
            if results:
                self.fill()  # keep the slots busy while we talk to Redis
                # TTLs with the first write, and again with the last: the producer may
                # have drained (and so deleted) the done list in between.
                runner.write(batch, results, expire=not self.written_any or not self.in_flight)
                self.written_any = True
                self.ran += len(results)
            if time.monotonic() - last_beat > HEARTBEAT_EVERY_S:
                job.heartbeat(datetime.now(UTC), HEARTBEAT_TTL_S)
                last_beat = time.monotonic()
        if self.todo:
            log.info(
                "job %s: stopping with %d snippets of batch %s left; re-enqueued",
                job.id,
                len(self.todo),
                batch.batch_id,
            )
            runner._requeue(job, self.payload)
        return {"batch": batch.batch_id, "ran": self.ran}
