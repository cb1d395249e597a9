"""One dispatcher process of ``codepool worker``: an RQ worker that joins announced
batches in process (no fork per job) and runs its claims on the host's shared executor,
holding a lease (worker/lease.py) while it lives. Its share of the executor's slots, and
what it may borrow of its siblings', come from worker/host_window.py; it waits on the
queue only in its host's turn (worker/listen_turn.py). Before it first waits there, it
joins the open batches (work nobody claimed yet) its host does not run: they were
announced to the hosts live before it, so no announcement brings it to them.

Run by the worker host as ``python -m codepool.worker.dispatcher`` with its JSON config
on stdin.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from dataclasses import asdict, dataclass
from typing import Any, cast

import redis
from rq import Queue
from rq.exceptions import StopRequested
from rq.job import Job
from rq.worker import WorkerStatus

from codepool.common import failover
from codepool.common.codec import MsgpackSerializer
from codepool.common.connection import redis_client
from codepool.common.errors import CodepoolError
from codepool.common.limits import Limits
from codepool.common.queueing import announced_batch
from codepool.common.settings import Settings
from codepool.common.wire import JOB_FUNCTION
from codepool.worker.engine import linux
from codepool.worker.engine.client import AttachedExecutor
from codepool.worker.finished_batches import FinishedBatches
from codepool.worker.host_window import HostWindow
from codepool.worker.job import BatchRunner
from codepool.worker.lease import DispatcherLease
from codepool.worker.lease_board import LeaseBoard
from codepool.worker.listen_turn import ListenTurn
from codepool.worker.rq_worker import (
    DEQUEUE_TIMEOUT_S,
    WORKER_TTL_S,
    CodepoolJob,
    RQWorker,
)
from codepool.worker.writer import ResultWriter

log = logging.getLogger(__name__)

# A dispatcher that does not wait on the queue beats this often (worker/listen_turn.py).
KEEPALIVE_S = WORKER_TTL_S // 2
# At most this long after a job's first snippets start, its dispatcher passes the listen
# turn on and lets RQ ready the job, even if no result is written yet (before_job).
QUIET_START_S = 0.005
FOLLOW_S = 0.1  # how often the host's count of a Sentinel primary's moves is looked at
# In the worker host's private dir: the dispatchers' shared counts and listen turn.
WINDOW_FILE = "window"
TURN_FILE = "listen-turn"
LEASE_FILE = "leases"  # the host's lease board (worker/lease_board.py)


@dataclass
class DispatcherConfig:
    settings: dict[str, Any]
    socket_path: str
    name: str
    host: str
    max_limits: dict[str, Any]
    slots: int = 2  # the host executor's concurrency
    dispatchers: int = 2  # dispatchers sharing it
    slot: int = 0  # this dispatcher's place among them
    host_dir: str = ""  # the host's private dir: its window counts and listen turn
    burst: bool = False
    log_level: str = "INFO"
    parent_pid: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DispatcherConfig:
        return cls(**json.loads(text))


class Dispatcher(RQWorker):
    """An RQ worker (worker/rq_worker.py) whose jobs can only be codepool batches, and
    which waits on the queue only in its host's turn (worker/listen_turn.py).

    Signals, all from its worker host: SIGTERM stops it taking work (RQ's warm
    shutdown: the job it runs finishes, having taken back from the executor what had
    not started); CUT_SIGNAL, at the host's drain deadline, has the job take back what
    runs too."""

    runner: BatchRunner | None = None
    turn: ListenTurn | None = None
    _waiting = 0  # announcements behind the job just read (_read_and_claim)
    _arrived = False  # has looked for open batches and found none left to join

    def wake_job(self) -> None:
        if self.runner is not None:
            self.runner.wake()

    def wait_turn(self) -> None:
        if self.turn is None:
            return
        while True:
            self.turn.take(keepalive=self.heartbeat, every_s=KEEPALIVE_S)
            try:
                # In the turn, so a sibling looking meanwhile leaves this batch to it.
                batch_id = None if self._arrived else self._open_batch()
                if batch_id is not None:
                    assert self.runner is not None
                    self.runner.window.running(batch_id)
            except BaseException:
                self.turn.give_back()
                raise
            if batch_id is None:
                return
            self.turn.give_back()
            self._join_open(batch_id)
            if self.stop_requested:
                raise StopRequested

    def pass_turn(self) -> None:
        if self.turn is not None:
            self.turn.give_back()

    def _open_batch(self) -> str | None:
        """The oldest open batch (unclaimed work) that no dispatcher of this host runs,
        in one round trip; None when there is none (the dispatcher has arrived: from now
        on every batch is announced counting its host) or Redis did not answer."""
        runner = self.runner
        if runner is None:
            self._arrived = True
            return None
        window = runner.window
        try:
            found = self.connection.zrange(runner.keys.open_batches(), 0, window.dispatchers)
        except redis.RedisError as exc:
            log.warning("dispatcher %s: could not look for open batches: %s", self.name, exc)
            return None
        hosted = window.hosted()
        for raw in cast(list[bytes], found):
            batch_id = raw.decode()
            if batch_id not in hosted:
                return batch_id
        self._arrived = True
        return None

    def _join_open(self, batch_id: str) -> None:
        """Run this dispatcher's part in open batch ``batch_id``, which no announcement
        brought it to: busy meanwhile (a SIGTERM waits for it, as for a job), with no RQ
        job of its own (nothing to beat, nothing for a janitor to retire: its lease and
        the batch's claims are all there is to recover)."""
        runner = self.runner
        assert runner is not None
        log.info("dispatcher %s: joining open batch %s", self.name, batch_id)
        # Never saved: it names the execution in logs, as an announcement's id would.
        job = self.job_class(
            f"{batch_id}-open", connection=self.connection, serializer=self.serializer
        )
        try:
            with self.connection.pipeline(transaction=False) as first:
                self.set_state(WorkerStatus.BUSY, pipeline=first)
                execution, _ = runner.prestart(
                    job, pipeline=first, batch_id=batch_id, announced=False
                )
        except redis.RedisError as exc:
            # Whether the claim went through is unknown: stop as a failed job start does.
            raise CodepoolError(f"open batch {batch_id}: its first claim failed: {exc}") from exc
        try:
            if execution is not None:
                execution.beats_job = False
                execution.finish()
        finally:
            self.set_state(WorkerStatus.IDLE)

    def before_job(self, job: Job) -> None:
        try:
            waiting = self._start_job(job)
            execution = job.execution if isinstance(job, CodepoolJob) else None
            if execution is not None and not waiting:
                # The sibling's wake-up to wait on the queue, and RQ's bookkeeping for
                # this job, would take a core from the first snippets: with no other
                # announcement waiting, both wait for their first results (a lone call
                # on an idle host). One that comes meanwhile waits at most this long.
                execution.settle(QUIET_START_S)
        finally:
            self.pass_turn()
        if isinstance(job, CodepoolJob) and job.unread is not None:
            # Its read, left by _read_and_claim until its first snippets had settled.
            job.restore(job.unread)
            job.unread = None
            if self._refused(job) and job.execution is not None:
                job.execution.finish()  # claimed as its id's batch: that runs all the same

    def claim_with_reads(self) -> None:
        """From now on, the round trip that reads a dequeued announcement also claims
        its batch's first snippets (_read_and_claim)."""
        self.claim_with(self._read_and_claim)

    def _read_and_claim(self, job_id: str) -> Job | None:
        """Read announcement ``job_id`` as RQ would, claiming and starting the first
        snippets of the batch its id names in the same round trip; None if the job's
        hash is gone (what was claimed then runs here). Busy, and the announcements
        behind it counted, as in _start_job."""
        runner = self.runner
        job = self.job_class(job_id, connection=self.connection, serializer=self.serializer)
        if runner is None or not isinstance(job, CodepoolJob):
            job.refresh()  # type: ignore[no-untyped-call]
            return job
        job.runner = runner
        try:
            with self.connection.pipeline(transaction=False) as first:
                first.hgetall(job.key)
                self.set_state(WorkerStatus.BUSY, pipeline=first)
                first.llen(self.queues[0].key)
                execution, replies = runner.prestart(
                    job, pipeline=first, batch_id=announced_batch(job_id)
                )
        except redis.RedisError as exc:
            # Whether the claim went through is unknown: stop as a failed job start
            # does, and the lease's lapse gives back whatever it took.
            message = f"job {job_id}: reading it and its first claim failed: {exc}"
            raise CodepoolError(message) from exc
        if not replies:  # the claim's script was loaded again: the rest went through
            replies = [self.connection.hgetall(job.key), None, 0]
        raw, self._waiting = replies[0], int(replies[-1])
        job.execution = execution
        if execution is not None and not self._waiting:
            execution.settle(QUIET_START_S)  # before RQ's own work on it: see before_job
        if not raw:
            log.error("job %s: its hash is gone; running what its batch gave it", job_id)
            if execution is not None:
                execution.beats_job = False
                execution.finish()
            self.set_state(WorkerStatus.IDLE)
            return None
        if execution is None:
            job.restore(raw)
        else:  # restored once its first snippets have settled (before_job): until
            job.unread = raw  # then RQ needs only the job's id
        return job

    def _refused(self, job: Job) -> bool:
        if job.func_name == JOB_FUNCTION:
            return False
        log.error(
            "refusing job %s: it names %r, not codepool's job function", job.id, job.func_name
        )
        return True

    def _start_job(self, job: Job) -> int:
        """Claim and start the job's first snippets (unless its read did:
        _read_and_claim); returns how many announcements wait on the queue behind it."""
        if isinstance(job, CodepoolJob) and job.execution is not None:
            return self._waiting
        if self._refused(job):
            return 0
        if isinstance(job, CodepoolJob) and self.runner is not None:
            job.runner = self.runner
            # Busy before the first claim: RQ answers a SIGTERM in any other state by
            # raising StopRequested wherever the dispatcher is; after a claim that skipped
            # the job's finish, and the clean exit then gave the lease up with the claimed
            # indices never run nor given back (the batch waited for its deadline). Busy,
            # the SIGTERM waits for the job, whose finish gives back what it claimed.
            # Redis learns it with the first claim, in one round trip.
            with self.connection.pipeline(transaction=False) as first:
                self.set_state(WorkerStatus.BUSY, pipeline=first)
                first.llen(self.queues[0].key)
                # Snippets start now and run while RQ does its per-job bookkeeping.
                job.execution, replies = self.runner.prestart(job, pipeline=first)
                return int(replies[-1]) if replies else 0
        return 0


def main(argv: list[str]) -> int:
    # Read from stdin (the host pipes it) so the Redis password is never in argv.
    config = DispatcherConfig.from_json(argv[1] if len(argv) > 1 else sys.stdin.read())
    # Die with the worker host even if it is killed -9; RQ re-runs what we held.
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host answers a Ctrl-C
    if config.parent_pid and os.getppid() != config.parent_pid:
        return 1
    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s {config.name} %(levelname)s %(name)s: %(message)s",
    )
    settings = Settings(**config.settings)
    # A Sentinel's primary is watched by the host, once for all its processes: this
    # one follows it on the lease board (below).
    conn = redis_client(settings, block_s=DEQUEUE_TIMEOUT_S, watch_s=None)
    executor = AttachedExecutor(config.socket_path, name=config.host)
    finished = FinishedBatches(
        conn, settings.keys, owner=config.name, flush_s=settings.stats_flush_s
    )
    window = HostWindow(
        os.path.join(config.host_dir, WINDOW_FILE),
        slot=config.slot,
        slots=config.slots,
        dispatchers=config.dispatchers,
    )
    queue = Queue(settings.queue, connection=conn, serializer=MsgpackSerializer)
    worker = Dispatcher(
        [queue],
        connection=conn,
        name=config.name,
        serializer=MsgpackSerializer,
        job_class=CodepoolJob,
        worker_ttl=WORKER_TTL_S,
        log_job_description=False,
    )
    worker.slot = config.slot
    worker.turn = ListenTurn(os.path.join(config.host_dir, TURN_FILE))
    worker.claim_with_reads()
    # The host holds the lease; a fenced dispatcher is stopped by it as on SIGTERM
    # (in-flight snippets end, nothing more is written) and started afresh.
    board = LeaseBoard(os.path.join(config.host_dir, LEASE_FILE), config.dispatchers)
    failover.follow(conn, board.primary_moves, FOLLOW_S)
    lease = DispatcherLease(conn, settings, owner=config.name, board=board, slot=config.slot)
    writer = ResultWriter.from_settings(conn, settings, lease, worker=config.host)
    worker.runner = BatchRunner(
        executor=executor,
        conn=conn,
        settings=settings,
        finished=finished,
        max_limits=Limits.from_dict(config.max_limits),
        stop_requested=lambda: worker.stop_requested,
        cut_requested=lambda: worker.cut,
        writer=writer,
        lease=lease,
        window=window,
    )
    if not lease.held():
        log.error("dispatcher %s: its host could not take its lease; exiting", config.name)
        executor.close()
        worker.turn.close()
        window.close()
        board.close()
        return 1
    finished.start()
    try:
        # RQ logs several INFO lines per job; one per batch (ours) is enough.
        rq_level = "DEBUG" if config.log_level == "DEBUG" else "WARNING"
        worker.work(burst=config.burst, logging_level=rq_level)
    except redis.ConnectionError as exc:  # RQ's teardown, with Redis gone: nothing to tidy
        log.warning("dispatcher %s: stopping without Redis: %s", config.name, exc)
    finally:
        worker.runner.close()
        writer.close()
        finished.stop()
        executor.close()
        worker.turn.close()
        window.close()
        board.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
