"""The RQ job boundary: codepool's only job function, and the runner behind it.

A dispatcher (an RQ worker process) fetches one job per batch. ``CodepoolJob`` refuses to
resolve any function but :data:`JOB_FUNCTION` (nothing else is ever imported) and hands
the payload to the dispatcher's :class:`BatchRunner`, which runs the snippets on the
host's shared executor and writes each result as it finishes (first write wins).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
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
from codepool.common.wire import JOB_FUNCTION, WHOLE_BATCH, BatchJob, peek_batch_id
from codepool.worker.client import ZygoteClient
from codepool.worker.stats import StatsBuffer
from codepool.worker.writer import ResultWriter

log = logging.getLogger(__name__)

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
        writer: ResultWriter,
    ) -> None:
        self.executor = executor
        self.conn = conn
        self.settings = settings
        self.keys = settings.keys
        self.stats = stats
        self.max_limits = max_limits
        self.stop_requested = stop_requested
        self.writer = writer

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
                batch_id = peek_batch_id(payload)
                if batch_id is None:
                    raise  # nobody can be waiting for a batch without an id
                self._reject_batch(batch_id, f"rejected: malformed batch: {exc}")
                return {"batch": batch_id, "rejected": "whole batch"}
        return execution.finish()

    def _reject_batch(self, batch_id: str, message: str) -> None:
        """Tell the producer at once that none of this batch will run."""
        done_key = self.keys.batch_done(batch_id)
        entry = codec.encode_done_entry(
            WHOLE_BATCH, codec.encode_result(rejected(message, worker=self.executor.name))
        )
        with self.conn.pipeline(transaction=False) as pipe:
            pipe.rpush(done_key, entry)
            pipe.expire(done_key, self.settings.batch_ttl_s)
            pipe.execute()

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
    """One execution of one batch job. Keeps up to ``window`` snippets in the executor
    (so a stop request leaves little in flight); each result is written by the
    dispatcher's ResultWriter the moment it exists, and this job thread only refills."""

    def __init__(self, runner: BatchRunner, job: Job, payload: Any) -> None:
        self.runner = runner
        self.job = job
        self.payload = payload
        self.batch = BatchJob.decode(payload)
        n = len(self.batch.codes)
        self.limits = self.batch.limits.clamp(runner.max_limits)
        self.window = max(1, runner.executor.concurrency) + 1
        self.todo: list[int] = []
        self.in_flight = 0  # submitted and not yet written (job thread's count)
        self.ran = 0
        self._notes: queue.SimpleQueue[int | BaseException] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding = 0  # submitted and not yet written (writer's count)
        self._ttl_set = False
        self.oversize = n > runner.settings.max_batch_snippets
        if self.oversize:
            return
        done: set[int] = set()
        # A fresh job cannot have results yet; a re-run (a retried or re-enqueued job)
        # skips what is already written.
        if job.id != self.batch.batch_id or job.started_at is not None:
            key = runner.keys.batch_results(self.batch.batch_id)
            done = {int(i) for i in runner.conn.hkeys(key)}
        self.todo = [i for i in range(n) if i not in done]
        self.todo.reverse()  # pop() from the end runs them in input order

    # -- called by the writer thread ------------------------------------------------

    def needs_ttl(self, count: int) -> bool:
        """Account ``count`` results about to be written; True if this write should
        (re)set the batch's TTLs: its first write, or nothing is left in flight."""
        with self._lock:
            self._outstanding -= count
            first, self._ttl_set = not self._ttl_set, True
            return first or self._outstanding == 0

    def written(self, count: int) -> None:
        self._notes.put(count)

    def failed(self, exc: BaseException) -> None:
        self._notes.put(exc)

    # -- job thread -----------------------------------------------------------------

    def fill(self) -> None:
        runner = self.runner
        while self.todo and self.in_flight < self.window and not runner.stop_requested():
            index = self.todo.pop()
            code = self.batch.codes[index]
            with self._lock:
                self._outstanding += 1
            self.in_flight += 1
            if code is None:
                runner.writer.put(
                    self, index, rejected("rejected: code must be str", worker=runner.executor.name)
                )
                continue
            future = runner.executor.submit_limited(
                code.decode("utf-8", "surrogatepass"), self.limits
            )
            future.add_done_callback(functools.partial(self._finished, index))

    def _finished(self, index: int, future: Future[ExecResult]) -> None:
        self.runner.writer.put(self, index, future.result())

    def finish(self) -> dict[str, Any]:
        runner, batch, job = self.runner, self.batch, self.job
        n = len(batch.codes)
        log.info("job %s: batch %s with %d snippets (run %r)", job.id, batch.batch_id, n, batch.run)
        if self.oversize:
            message = (
                f"rejected: batch of {n} snippets is over the worker's limit of "
                f"{runner.settings.max_batch_snippets}"
            )
            self.todo = list(range(n))
            for index in self.todo:
                with self._lock:
                    self._outstanding += 1
                runner.writer.put(self, index, rejected(message, worker=runner.executor.name))
            self.in_flight, self.todo = n, []
        last_beat = time.monotonic()
        while True:
            self.fill()
            if not self.in_flight:
                break
            try:
                note = self._notes.get(timeout=HEARTBEAT_EVERY_S)
            except queue.Empty:
                note = 0
            if isinstance(note, BaseException):
                raise note
            self.in_flight -= note
            self.ran += note
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
