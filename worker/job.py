"""The RQ job boundary: codepool's only job function, and the runner behind it.

A dispatcher (an RQ worker process) fetches announcements: small jobs that name a batch
stored in Redis. ``CodepoolJob`` (worker/rq_worker.py) refuses to resolve any function
but :data:`JOB_FUNCTION` (nothing else is ever imported) and hands the announcement to
the dispatcher's :class:`BatchRunner`, which claims runs of the batch's indices
(``ledger.CLAIM``) as its share of the host's executor frees up, and hands each result
to the writer. Several
dispatchers on several hosts work on one batch at once; the job ends when nothing is
left to claim and nothing of its own is in flight.

A dispatcher that stops (SIGTERM: its host drains) claims nothing more and takes back
from the executor what has not started; when the host's drain deadline comes (the cut)
it takes back what runs too, killing it. Either way the job then gives back every
index it claimed and has no result for (``Janitor.release``, graceful: no re-run is
counted), announced to run elsewhere; results it wrote stay, first write wins.

A cancellation heard meanwhile (worker/cancels.py) drops what was claimed and not
started, and kills what runs; such a snippet is never written.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any, cast

import redis
from redis.client import Pipeline
from rq.job import Job

from codepool.common import codec
from codepool.common.errors import CodepoolError, WireError
from codepool.common.ledger import claim_script, parse_indices
from codepool.common.limits import Limits
from codepool.common.queueing import announce, batch_queue
from codepool.common.result import CANCELLED, ExecResult, infra, rejected
from codepool.common.settings import Settings
from codepool.common.wire import (
    WHOLE_BATCH,
    BatchJob,
    decode_announcement,
    peek_batch_id,
)
from codepool.worker.cancels import CancelBook, CancelListener
from codepool.worker.engine.client import SupervisorClient
from codepool.worker.finished_batches import FinishedBatches
from codepool.worker.host_window import HostWindow
from codepool.worker.lease import DispatcherLease
from codepool.worker.writer import ResultWriter

log = logging.getLogger(__name__)

# RQ's own job heartbeat (its started registry); the lease is what recovery relies on.
HEARTBEAT_EVERY_S = 10.0
HEARTBEAT_TTL_S = 60
# Most indices one claim takes (the first claims of a big batch are the largest).
MAX_CLAIM = 64
# A claim takes at most what its dispatcher finishes in this long at its pace in the
# batch so far (before its first result, what it can start at once): what is left
# unclaimed is there for a host that joins meanwhile (a cold fleet, autoscaling).
CLAIM_AHEAD_S = 1.0
# A note from the executor's side: one snippet was taken back, it will have no result.
_BACK = "back"


class _Dropped:
    """A note: one started snippet ended cancelled, and is not written."""


_DROPPED = _Dropped()


def run_batch(payload: bytes) -> None:
    """The name producers enqueue. It runs only inside ``codepool worker``, whose
    CodepoolJob (worker/rq_worker.py) routes it to the dispatcher's BatchRunner."""
    raise CodepoolError("run_batch runs only inside `codepool worker` dispatchers")


class BatchRunner:
    """Runs announced batches for one dispatcher: claims in, Redis results (and their
    counts) out.

    window: this dispatcher's view of the host's slots: how many snippets it may keep
        in the executor at once (its share, plus what its siblings leave free).
    """

    def __init__(
        self,
        *,
        executor: SupervisorClient,
        conn: redis.Redis,
        settings: Settings,
        finished: FinishedBatches,
        max_limits: Limits,
        stop_requested: Callable[[], bool],
        writer: ResultWriter,
        lease: DispatcherLease,
        window: HostWindow,
        cut_requested: Callable[[], bool] = lambda: False,
    ) -> None:
        self.executor = executor
        self.conn = conn
        self.settings = settings
        self.keys = settings.keys
        self.finished = finished
        self.max_limits = max_limits
        self.stop_requested = stop_requested
        self.cut_requested = cut_requested
        self.current: BatchExecution | None = None  # the job this dispatcher runs now
        self.writer = writer
        self.lease = lease
        self.window = window
        self.queue = batch_queue(conn, settings)
        # Cancellations heard, and the executions they may concern (worker/cancels.py).
        self.cancels = CancelBook()
        self._active_lock = threading.Lock()
        self._active: dict[str, BatchExecution] = {}
        self.listener = CancelListener(
            conn,
            self.keys.cancel_channel(lease.owner),
            on_cancel=self.on_cancel,
            on_subscribed=self.reconcile,
        )
        self.listener.start()

    def close(self) -> None:
        self.listener.close()

    def on_cancel(self, batch_id: str, indices: frozenset[int] | None) -> None:
        """Listener thread: ``indices`` of the batch (None: all) were cancelled."""
        self.cancels.add(batch_id, indices)
        with self._active_lock:
            execution = self._active.get(batch_id)
        if execution is not None:
            execution.cancel(indices)

    def reconcile(self) -> None:
        """Listener thread, once (re)subscribed: what was cancelled while it was not
        is found in Redis, for every execution running."""
        with self._active_lock:
            executions = list(self._active.values())
        for execution in executions:
            execution.reconcile()

    def joined(self, execution: BatchExecution) -> None:
        with self._active_lock:
            self._active[execution.batch_id] = execution

    def left(self, execution: BatchExecution) -> None:
        with self._active_lock:
            if self._active.get(execution.batch_id) is execution:
                del self._active[execution.batch_id]

    def prestart(
        self, job: Job, *, pipeline: Pipeline, batch_id: str | None = None, announced: bool = True
    ) -> tuple[BatchExecution | None, list[Any]]:
        """Claim and start the first snippets before RQ's own bookkeeping for the job,
        so the two overlap; the first claim goes with what ``pipeline`` holds, which is
        sent in any case. The batch is the one ``batch_id`` names (the job's id, before
        its data is read), else its payload's. Returns the execution (None if the
        announcement is bad: run() reports it) and the replies to what ``pipeline``
        held (none if the claim's script had to be loaded again). announced: False
        for an open batch joined with no announcement (see BatchExecution)."""
        try:
            payload = job.args[0] if batch_id is None and job.args else None
            execution: BatchExecution | None = BatchExecution(
                self, job, payload, batch_id=batch_id, announced=announced
            )
        except (WireError, IndexError):
            execution = None
        if execution is not None:
            execution.fill(pipeline=pipeline)
        if len(pipeline):  # no claim was made: what it holds goes on its own
            return execution, pipeline.execute()
        return execution, execution.before_claim if execution is not None else []

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
                self.reject_batch(batch_id, f"rejected: malformed batch: {exc}")
                return {"batch": batch_id, "rejected": "whole batch"}
        return execution.finish()

    def wake(self) -> None:
        """Have the running job look at the stop and cut flags now (signal-handler
        safe: a SimpleQueue put is reentrant)."""
        current = self.current
        if current is not None:
            current.wake()

    def reject_batch(self, batch_id: str, message: str) -> None:
        """Tell the producer at once that none of this batch will run."""
        done_key = self.keys.batch_done(batch_id)
        entry = codec.encode_done_entry(
            WHOLE_BATCH, codec.encode_result(rejected(message, worker=self.executor.name))
        )
        with self.conn.pipeline(transaction=False) as pipe:
            pipe.rpush(done_key, entry)
            pipe.expire(done_key, self.settings.batch_ttl_s)
            pipe.zrem(self.keys.open_batches(), batch_id)  # nobody is to join it
            pipe.execute()


class BatchExecution:
    """This dispatcher's part in one batch. Claims indices while the host's window has
    room for it; each result goes to the dispatcher's ResultWriter the moment it exists,
    and this job thread only claims and refills. A snippet holds its place in the window
    until the writer takes its result, and the job ends once everything it started is
    written or taken back (stopping: see the module's note)."""

    def __init__(
        self,
        runner: BatchRunner,
        job: Job,
        payload: Any,
        *,
        batch_id: str | None = None,
        announced: bool = True,
    ) -> None:
        self.runner = runner
        self.job = job
        self.batch_id = batch_id if batch_id is not None else decode_announcement(payload)
        # Joined from an announcement (False: from the open batches, with none taken).
        self.announced = announced
        runner.window.running(self.batch_id)
        self.batch: BatchJob | None = None  # read with the first claim
        self.run = ""
        self.limits = Limits()
        self.todo: list[int] = []  # claimed, not started; pop() gives input order
        self.drained = False  # nothing left to claim (or the batch is unusable)
        self.lost = False  # our lease was taken away: claim nothing more
        self.oversize = False
        self.unwritten = 0  # started and not yet written (job thread's count)
        self.ran = 0
        self._first_start: float | None = None  # monotonic time of the first snippet's start
        self._taken = 0  # results the writer took (its thread adds)
        self.taken_back = 0  # started, then taken back from the executor (stopping)
        self.dropped = 0  # started, then cancelled: not written
        self._took_back_waiting = False  # asked the executor for what has not started
        self._took_back_running = False  # ... and, at the cut, for what runs
        # Started and not yet taken by the writer: the job thread adds, the writer takes.
        self._running = 0
        self._running_lock = threading.Lock()
        self._futures: dict[int, Future[ExecResult]] = {}  # in the executor, by index
        # Written counts (0 only wakes the job thread: the writer took results).
        # _BACK: one taken back from the executor; _DROPPED: one cancelled.
        self._notes: queue.SimpleQueue[int | str | BaseException | _Dropped] = queue.SimpleQueue()
        self._nudged = False  # told the writer this execution expects no more
        self._first_claim_with: Pipeline | None = None
        self.before_claim: list[Any] = []  # replies to what that pipeline held before it
        self._joined_unlogged = False
        self._settled = False
        self._failure: BaseException | None = None  # the writer's, raised by finish()
        # RQ's heartbeat of the job while it runs (not where its hash is gone: a beat
        # would make a partial one anew, with no TTL).
        self.beats_job = True
        runner.current = self
        runner.joined(self)

    # -- called by the writer thread ------------------------------------------------

    def expecting(self) -> bool:
        """More results may come soon: snippets are started and not yet taken by the
        writer (running, waiting for a slot, or on the way), or the job thread will
        start more (it has claimed ones, or may claim some)."""
        if self._running > 0:
            return True
        return bool(self.todo or not self.drained) and not self._stopping()

    def last_expected(self) -> bool:
        """Only one result is still to come (from a caller of the writer about to hand
        it over): nothing else of this execution could join its write."""
        return self._running == 1 and not (self.todo or not self.drained)

    def taken(self, count: int) -> None:
        """The writer holds ``count`` more results: their places in the window are free."""
        with self._running_lock:
            self._running -= count
            self._taken += count
            self.runner.window.publish(self._running)
        self._notes.put(0)

    def written(self, count: int) -> None:
        self._notes.put(count)

    def failed(self, exc: BaseException) -> None:
        self._notes.put(exc)

    def wake(self) -> None:
        self._notes.put(0)

    # -- called by the cancel listener's thread ---------------------------------------

    def cancel(self, indices: frozenset[int] | None) -> None:
        """``indices`` (None: all) were cancelled: what runs of them is killed, and the
        job thread, woken, drops what it has not started (``runner.cancels`` has them)."""
        if indices is None:
            self.drained = True  # nothing left to claim
        with self._running_lock:
            running = [f for i, f in self._futures.items() if indices is None or i in indices]
        if running:  # in one message: none takes a slot another of them frees
            self.runner.executor.cancel_many(running)
        self._notes.put(0)

    def reconcile(self) -> None:
        """Look up this execution's unfinished indices in Redis: those whose result is
        a cancellation are cancelled here too."""
        with self._running_lock:
            indices = [*self._futures, *self.todo]
        if not indices:
            return
        blobs = self.runner.conn.hmget(self.runner.keys.batch_results(self.batch_id), indices)
        found = set()
        for index, blob in zip(indices, blobs, strict=True):
            try:
                if blob is not None and codec.decode_result(cast(bytes, blob)).status == CANCELLED:
                    found.add(index)
            except WireError:
                continue
        if found:
            self.runner.cancels.add(self.batch_id, frozenset(found))
            self.cancel(frozenset(found))

    # -- job thread -----------------------------------------------------------------

    def _stopping(self) -> bool:
        return self.lost or self.runner.stop_requested() or self.runner.lease.is_lost()

    def _claim(self, room: int) -> None:
        runner, keys = self.runner, self.runner.keys
        first = self.batch is None
        claim_keys = [
            keys.batch_state(self.batch_id),
            keys.batch_retry(self.batch_id),
            keys.leases(),
            keys.owner_batches(runner.lease.owner),
            keys.open_batches(),
            keys.batch_results(self.batch_id),
            keys.batch_spec(self.batch_id),
        ]
        args = [
            runner.lease.owner,
            self.batch_id,
            room,
            self._claim_cap(room),
            runner.settings.lease_s,
            "1" if first else "0",
            runner.window.dispatchers,
        ]
        pipeline, self._first_claim_with = self._first_claim_with, None
        if pipeline is None:
            reply = claim_script(runner.conn, claim_keys, args)
        else:
            claim_script.queue(pipeline, claim_keys, args)
            try:
                *self.before_claim, reply = pipeline.execute()
            except redis.exceptions.NoScriptError:
                # What came before the claim went through; the claim is made again.
                claim_script.load(runner.conn)
                reply = claim_script(runner.conn, claim_keys, args)
        status = reply[0]
        if status == -2:
            self.lost = self.drained = True
            if first and self.announced:
                # Fenced before it could join: pass the announcement on, so a batch whose
                # only announcement this was still gets a dispatcher.
                announce(runner.queue, runner.settings, batch_id=self.batch_id, size=1)
            return
        if status == -1:
            log.info(
                "job %s: batch %s is gone (expired or never stored)", self.job.id, self.batch_id
            )
            self.drained = True
            return
        if first and not self._read_batch(reply[2]):
            self.drained = True
            return
        if status == 0:
            self.drained = True
            return
        self.todo = parse_indices(reply[1].decode())[::-1]
        # The batch's last claim: no claim round trip to learn that nothing is left.
        self.drained = int(reply[3]) == 1

    def _claim_cap(self, room: int) -> int:
        """The most the next claim may take: ``room`` until a result of this execution
        is in, then what it finishes in CLAIM_AHEAD_S at its pace so far; at most
        MAX_CLAIM. Sized by the batch at hand, never by history: a claim made while no
        other host is live yet holds about a second's work, not the batch."""
        if not self._taken or self._first_start is None:
            return min(room, MAX_CLAIM)
        pace = self._taken / max(1e-3, time.monotonic() - self._first_start)
        return min(MAX_CLAIM, max(room, math.ceil(pace * CLAIM_AHEAD_S)))

    def _read_batch(self, spec: Any) -> bool:
        runner = self.runner
        try:
            self.batch = BatchJob.decode(spec)
            self.limits = self.batch.limits.clamp(runner.max_limits)
        except WireError as exc:
            log.error("job %s: refused malformed batch %s: %s", self.job.id, self.batch_id, exc)
            runner.reject_batch(self.batch_id, f"rejected: malformed batch: {exc}")
            return False
        self.run = self.batch.run
        self.oversize = len(self.batch.codes) > runner.settings.max_batch_snippets
        self._joined_unlogged = True
        return True

    def fill(self, *, pipeline: Pipeline | None = None) -> None:
        """Start what there is room for, claiming as needed (the first claim in
        ``pipeline``, with what it holds)."""
        self._first_claim_with = pipeline
        self._refill()
        self._first_claim_with = None
        if self._joined_unlogged and self.batch is not None:
            # Logged once the first snippets run: not between them and their claim.
            self._joined_unlogged = False
            log.info(
                "job %s: joined batch %s of %d snippets (run %r)",
                self.job.id,
                self.batch_id,
                len(self.batch.codes),
                self.run,
            )
        if not self._nudged and not self.expecting():
            # The writer may hold results of ours waiting for company that will not come.
            self._nudged = True
            self.runner.writer.nudge()

    def _refill(self) -> None:
        while not self._stopping():
            room = self.runner.window.room(self._running)
            if not self.todo:
                if self.drained or room <= 0:
                    return
                self._claim(room)
                continue
            if room <= 0:
                return
            index = self.todo.pop()
            if not self.runner.cancels.cancelled(self.batch_id, index):
                self._start(index)

    def _start(self, index: int) -> None:
        runner, batch = self.runner, self.batch
        assert batch is not None
        if self._first_start is None:
            self._first_start = time.monotonic()
        self.unwritten += 1
        with self._running_lock:
            self._running += 1
            runner.window.publish(self._running)
        code = batch.codes[index]
        if self.oversize:
            message = (
                f"rejected: batch of {len(batch.codes)} snippets is over the worker's limit "
                f"of {runner.settings.max_batch_snippets}"
            )
            runner.writer.put(self, index, rejected(message, worker=runner.executor.name))
        elif code is None:
            runner.writer.put(
                self, index, rejected("rejected: code must be str", worker=runner.executor.name)
            )
        else:
            try:
                snippet = batch.snippet(index)
            except WireError as exc:
                message = f"rejected: malformed snippet inputs: {exc}"
                runner.writer.put(self, index, rejected(message, worker=runner.executor.name))
                return
            future = runner.executor.submit_limited(snippet, self.limits)
            with self._running_lock:
                self._futures[index] = future
            future.add_done_callback(functools.partial(self._finished, index))
            if runner.cancels.cancelled(self.batch_id, index):  # heard while it started
                runner.executor.cancel(future)

    def _finished(self, index: int, future: Future[ExecResult]) -> None:
        with self._running_lock:
            self._futures.pop(index, None)
        if future.cancelled():  # taken back: it runs elsewhere, once this job gives it back
            with self._running_lock:
                self._running -= 1
                self.runner.window.publish(self._running)
            self._notes.put(_BACK)
            return
        try:
            result = future.result()
        except Exception as exc:  # the executor's own failure: the snippet is not lost
            result = infra(f"codepool: executor failed: {exc}", worker=self.runner.executor.name)
        if result.status == CANCELLED or self.runner.cancels.cancelled(self.batch_id, index):
            # Its result is the cancellation, in Redis already: nothing to write.
            self.taken(1)
            self._notes.put(_DROPPED)
            return
        self.runner.writer.put(self, index, result)

    def _take_note(self, timeout_s: float) -> None:
        """Count the writer's next note, waiting up to ``timeout_s``; a failure it
        reports is kept for finish() to raise."""
        try:
            note = self._notes.get(timeout=timeout_s)
        except queue.Empty:
            return
        if isinstance(note, BaseException):
            self._failure = note
        elif isinstance(note, str):  # _BACK
            self.unwritten -= 1
            self.taken_back += 1
        elif isinstance(note, _Dropped):
            self.unwritten -= 1
            self.dropped += 1
        else:
            self.unwritten -= note
            self.ran += note

    def settle(self, timeout_s: float) -> None:
        """Wait until the first results are written, at most ``timeout_s``, starting
        more as the writer takes results (finish() then goes on from here). Once only:
        a second call returns at once."""
        if self._settled:
            return
        self._settled = True
        end = time.monotonic() + timeout_s
        while self.unwritten and not self.ran and self._failure is None:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._take_note(left)
            self.fill()

    def _take_back(self) -> None:
        """Stopping: ask the executor back for what has not started, and once the cut
        comes for what runs too (each once)."""
        cut = self.runner.cut_requested()
        if self._took_back_running or (self._took_back_waiting and not cut):
            return
        self._took_back_waiting = True
        self._took_back_running = cut
        with self._running_lock:
            futures = list(self._futures.values())
        if futures:
            self.runner.executor.withdraw(futures, running=cut)
            log.info(
                "job %s: %s of its %d snippets in the executor (batch %s)",
                self.job.id,
                "drain deadline: taking back all"
                if cut
                else "stopping: taking back those not started",
                len(futures),
                self.batch_id,
            )

    def finish(self) -> dict[str, Any]:
        try:
            return self._finish()
        finally:
            self.runner.window.running(None)
            self.runner.left(self)

    def _finish(self) -> dict[str, Any]:
        runner, job = self.runner, self.job
        last_beat = time.monotonic()
        while True:
            if self._failure is not None:
                raise self._failure
            self.fill()
            if self._stopping():
                self._take_back()
            if not self.unwritten:
                break
            self._take_note(HEARTBEAT_EVERY_S)
            if self.beats_job and time.monotonic() - last_beat > HEARTBEAT_EVERY_S:
                job.heartbeat(datetime.now(UTC), HEARTBEAT_TTL_S)
                last_beat = time.monotonic()
        if runner.current is self:
            runner.current = None
        if not self.lost and not runner.lease.is_lost() and self.batch is not None:
            if self.todo or not self.drained or self.taken_back:
                # Stopping (SIGTERM): give back what was claimed and never ran here.
                released = runner.lease.janitor.release(
                    self.batch_id,
                    runner.lease.owner,
                    runner.lease.live,
                    graceful=True,
                    announce_anyway=True,
                )
                log.info(
                    "job %s: stopping; gave back %d snippets of batch %s",
                    job.id,
                    released,
                    self.batch_id,
                )
            runner.finished.batch_done(self.batch_id)
        return {"batch": self.batch_id, "ran": self.ran, "cancelled": self.dropped}
