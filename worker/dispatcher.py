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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any, ClassVar, cast

import redis
from redis import Redis
from redis.client import Pipeline
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.utils import now as now_utc
from rq.worker import WorkerStatus

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
from codepool.worker.job import BatchRunner, CodepoolJob
from codepool.worker.lease import DispatcherLease
from codepool.worker.lease_board import LeaseBoard
from codepool.worker.listen_turn import ListenTurn
from codepool.worker.writer import ResultWriter

log = logging.getLogger(__name__)

# An idle dispatcher's cost to Redis is RQ's: the one waiting on the queue (one a host,
# worker/listen_turn.py) blocks in BLMOVE for DEQUEUE_TIMEOUT_S and beats between two
# waits; the others beat every KEEPALIVE_S. RQ's worker key lives WORKER_TTL_S + 60 s.
# (Liveness that matters, the lease, is the worker host's: worker/lease.py.)
WORKER_TTL_S = 600
DEQUEUE_TIMEOUT_S = 60
KEEPALIVE_S = WORKER_TTL_S // 2
# A heartbeat RQ sends within this long of the last is not sent.
HEARTBEAT_REPEAT_S = 10.0
# At most this long after a job's first snippets start, its dispatcher passes the listen
# turn on and lets RQ ready the job, even if no result is written yet (execute_job).
QUIET_START_S = 0.005
# In the worker host's private dir: the dispatchers' shared counts and listen turn.
WINDOW_FILE = "window"
TURN_FILE = "listen-turn"
LEASE_FILE = "leases"  # the host's lease board (worker/lease_board.py)
# From the worker host at its drain deadline: take back what runs, give it back, exit.
CUT_SIGNAL = signal.SIGUSR1


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


class _ClaimingQueue(Queue):
    """The dispatcher's queue class: RQ reads a dequeued announcement through
    ``claimer``, which claims the first snippets of its batch in the same round trip
    (Dispatcher._read_and_claim). Jobs whose ids ``announce`` did not make are read as
    RQ reads them. (Where RQ has no ``_fetch_dequeued_job``, every job is, and the
    first claim goes a round trip later, in Dispatcher._start_job.)"""

    claimer: ClassVar[Callable[[str], Job | None] | None] = None

    @classmethod
    def _fetch_dequeued_job(
        cls,
        connection: Redis,
        queue_key: str,
        job_id: str,
        job_class: type[Job] | None = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[Job, Queue] | None:
        claimer = cls.claimer
        if claimer is None or announced_batch(job_id) is None:
            return super()._fetch_dequeued_job(
                connection,
                queue_key,
                job_id,
                job_class=job_class,
                serializer=serializer,
                death_penalty_class=death_penalty_class,
            )
        job = claimer(job_id)
        if job is None:  # its hash is gone: RQ dequeues the next
            return None
        queue = cls.from_queue_key(
            queue_key,
            connection=connection,
            job_class=job_class,
            serializer=serializer,
            death_penalty_class=death_penalty_class,
        )
        return job, queue


class Dispatcher(SimpleWorker):
    """An RQ SimpleWorker whose jobs can only be codepool batches, and which waits on
    the queue only in its host's turn (worker/listen_turn.py).

    Signals, all from its worker host: SIGTERM stops it taking work (RQ's warm
    shutdown: the job it runs finishes, having taken back from the executor what had
    not started); CUT_SIGNAL, at the host's drain deadline, has the job take back what
    runs too. SIGINT is ignored: a Ctrl-C reaches every process of the terminal's group,
    and the host answers it for all of them."""

    runner: BatchRunner | None = None
    turn: ListenTurn | None = None
    slot = 0  # this dispatcher's place among its host's
    cut = False  # the host's drain deadline came
    _waiting = 0  # announcements behind the job just read (_read_and_claim)
    _beat_sent_at = -1e9  # monotonic time of the last heartbeat of RQ's default TTL
    _state_unsent = False  # the state changed to IDLE and Redis has not been told yet
    _beat_rides_next = False  # a job just ended: RQ's suspension check beats next
    _prepared: str | None = None  # the job whose start prepare_execution already sent
    _arrived = False  # has looked for open batches and found none left to join

    # Redis CPU goes by round trips rather than commands. RQ sends the three commands
    # of a worker heartbeat one round trip each, three times a job within milliseconds
    # (after the job, and twice around the next dequeue), and sets IDLE at the end of a
    # job and again before its next dequeue. Here a heartbeat is one pipeline that also
    # says the worker's state, none goes within HEARTBEAT_REPEAT_S of the last (the
    # worker's key lives worker_ttl + 60 s; RQ beats every worker_ttl - 15 s while it
    # waits) unless a state is to be told, a state that did not change is not sent
    # again, and IDLE rides with the next heartbeat (RQ's suspension check, which pipes
    # one, comes next in its loop, as does the beat right after a job): fourteen round
    # trips a job less with prepare_execution's below; Redis holds the same.
    @property
    def dequeue_timeout(self) -> int:
        return DEQUEUE_TIMEOUT_S

    @property
    def should_run_maintenance_tasks(self) -> bool:
        # RQ's registry cleaning takes a lock per queue: one dispatcher a host tries.
        return self.slot == 0 and bool(super().should_run_maintenance_tasks)

    def subscribe(self) -> None:
        # RQ's per-worker command channel (its own pub/sub connection): dispatchers are
        # stopped by their worker host's signals, so the connection would only idle.
        self.pubsub = None

    def unsubscribe(self) -> None:
        pass

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            self._say_state(pipeline)
            return
        if timeout is None and self._beat_rides_next:
            # RQ beats right after a job and again, pipelined, in the suspension check
            # that comes next in its loop: the second one says the state.
            self._beat_rides_next = False
            return
        now = time.monotonic()
        if timeout is None:
            if now - self._beat_sent_at < HEARTBEAT_REPEAT_S and not self._state_unsent:
                return
            self._beat_sent_at = now
        with self.connection.pipeline(transaction=False) as own:
            super().heartbeat(timeout, pipeline=own)
            self._say_state(own)
            own.execute()

    def _say_state(self, pipeline: Pipeline) -> None:
        # Always: a key that expired is made anew by the heartbeat, with the state in it.
        pipeline.hset(self.key, "state", self._state)
        self._state_unsent = False

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(CUT_SIGNAL, self.request_cut)

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.runner is not None:
            self.runner.wake()  # the job takes back what has not started, now
        # Raises StopRequested unless busy; later SIGTERMs and SIGINTs go to
        # request_force_stop, which leaves the timing to the host.
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        # RQ's cold stop would raise SystemExit wherever the job is, skipping the give-
        # back of its claims; the host says when to cut (request_cut).
        self.log.debug("Worker %s: stopping already; the host cuts at its deadline", self.name)

    def request_cut(self, signum: int, frame: FrameType | None) -> None:
        self.cut = True
        self._stop_requested = True
        if self.runner is not None:
            self.runner.wake()

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        # RQ heartbeats the job here to keep it alive through its success or failure
        # callback; codepool jobs have none (CodepoolJob), so the round trip goes.
        job.ended_at = now_utc()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        if self.turn is None:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
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
                break
            self.turn.give_back()
            self._join_open(batch_id)
            if self._stop_requested:
                raise StopRequested
        try:
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        except BaseException:
            self.turn.give_back()
            raise
        if result is None:
            self.turn.give_back()
        # With a job, the turn passes on once its first snippets have started
        # (execute_job): the sibling's wake-up then does not compete with them.
        return result

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

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None:
            if state == self._state:
                return
            if state == WorkerStatus.IDLE:
                self._state, self._state_unsent = state, True
                return
        super().set_state(state, pipeline=pipeline)

    def execute_job(self, job: Job, queue: Queue) -> None:
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
            if self.turn is not None:
                self.turn.give_back()
        if isinstance(job, CodepoolJob) and job.unread is not None:
            # Its read, left by _read_and_claim until its first snippets had settled.
            job.restore(job.unread)
            job.unread = None
            if self._refused(job) and job.execution is not None:
                job.execution.finish()  # claimed as its id's batch: that runs all the same
        super().execute_job(job, queue)
        self._beat_rides_next = True

    # RQ readies a job in two round trips: its execution record (prepare_execution),
    # then the worker's and the job's heartbeats and the job's start (in perform_job).
    # Here both go in one, while the job's first snippets run.
    def prepare_execution(self, job: Job) -> Execution:
        with self.connection.pipeline() as pipeline:
            heartbeat_ttl = self.get_heartbeat_ttl(job)
            execution = Execution.create(
                job, heartbeat_ttl, pipeline=pipeline, worker_name=self.name
            )
            self.executions[execution.id] = execution
            self._state = WorkerStatus.BUSY  # told by the heartbeat's own state, next
            self.heartbeat(heartbeat_ttl, pipeline=pipeline)
            job.heartbeat(now_utc(), heartbeat_ttl, pipeline=pipeline)
            job.prepare_for_execution(self.name, pipeline=pipeline)
            pipeline.persist(job.key)
            if len(self.queues) == 1:
                intermediate = Queue(job.origin, connection=self.connection).intermediate_queue_key
                pipeline.lrem(intermediate, 1, job.id)
            pipeline.execute()
        self._prepared = job.id
        return execution

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        if self._prepared == job.id:
            self._prepared = None
            return
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    def claim_with_reads(self) -> None:
        """From now on, the round trip that reads a dequeued announcement also claims
        its batch's first snippets (_read_and_claim)."""
        self.queue_class = cast(
            type[Queue],
            type(
                "DispatcherQueue",
                (_ClaimingQueue,),
                {"claimer": staticmethod(self._read_and_claim)},
            ),
        )

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
            execution.settle(QUIET_START_S)  # before RQ's own work on it: see execute_job
        if not raw:
            log.error("job %s: its hash is gone; running what its batch gave it", job_id)
            if execution is not None:
                execution.beats_job = False
                execution.finish()
            self.set_state(WorkerStatus.IDLE)
            return None
        if execution is None:
            job.restore(raw)
        else:  # restored once its first snippets have settled (execute_job): until
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
    conn = redis_client(settings, block_s=DEQUEUE_TIMEOUT_S)
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
    lease = DispatcherLease(conn, settings, owner=config.name, board=board, slot=config.slot)
    writer = ResultWriter(
        conn,
        settings.keys,
        settings.batch_ttl_s,
        lease,
        worker=config.host,
        minute_ttl_s=settings.minute_stats_ttl_s,
        write_gap_s=settings.write_gap_s,
        rewrite_s=settings.failover_rewrite_s,
    )
    worker.runner = BatchRunner(
        executor=executor,
        conn=conn,
        settings=settings,
        finished=finished,
        max_limits=Limits.from_dict(config.max_limits),
        stop_requested=lambda: bool(worker._stop_requested),
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
