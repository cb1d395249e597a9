"""RQ as codepool changes it: every subclass and override of RQ's worker, queue and job
behaviour, in one module. worker/dispatcher.py builds codepool's dispatcher on
:class:`RQWorker` through its hooks (``wait_turn``, ``pass_turn``, ``before_job``,
``wake_job``); common/rq_records.py names the RQ records read from outside a worker.

What this relies on in RQ (the installed release is checked against each point by
tests/worker/test_rq_contract.py; pyproject.toml bounds rq to the releases that pass):

1. ``Queue.dequeue_any`` pops a job id, then calls the classmethod
   ``cls._fetch_dequeued_job(connection, queue_key, job_id, job_class=, serializer=,
   death_penalty_class=)`` on the worker's ``queue_class``, and pops the next id when
   it returns None.
2. ``work()`` passes the ``dequeue_timeout`` property to
   ``dequeue_job_and_maintain_ttl`` as its timeout; ``connection_timeout`` (the socket
   timeout RQ sets) follows it.
3. ``work()`` and ``dequeue_job_and_maintain_ttl`` run ``run_maintenance_tasks`` only
   when the ``should_run_maintenance_tasks`` property says so.
4. ``subscribe()`` (at bootstrap) and ``unsubscribe()`` (at teardown) are RQ's only
   uses of pub/sub in a worker.
5. ``heartbeat(timeout, pipeline)`` writes the worker hash's ``last_heartbeat`` and its
   expiry (``worker_ttl + 60`` when timeout is None) on ``pipeline`` when given;
   ``dequeue_job_and_maintain_ttl`` beats before and after its dequeue, ``work()``
   after each job, and ``is_suspended`` pipelines one with its check.
6. ``set_state(state, pipeline)`` keeps the state in ``_state`` (what ``get_state``
   returns) and HSETs it on the worker's key.
7. ``SimpleWorker.execute_job`` is ``prepare_execution(job)`` (an ``Execution`` in
   ``self.executions``, the worker BUSY), then ``perform_job``, which calls
   ``prepare_job_execution(job, len(queues) == 1)`` before ``job.perform()``, then
   ``set_state(IDLE)``.
8. ``handle_execution_ended(job, queue, ttl)`` only stamps ``ended_at`` and beats the
   job (for its callbacks); a job's callbacks are read through its
   ``success_callback``/``failure_callback``/``stopped_callback`` properties, and
   ``job.perform()`` calls what its ``func`` property returns.
9. ``request_stop`` raises ``StopRequested`` unless the worker is BUSY, else sets
   ``_stop_requested``, which ``work()`` reads before each dequeue; it rebinds SIGINT
   and SIGTERM to ``request_force_stop``. ``work()`` installs its handlers through
   ``_install_signal_handlers`` after bootstrap.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar, cast

from redis import Redis
from redis.client import Pipeline
from rq import Queue, SimpleWorker
from rq.executions import Execution
from rq.job import Job
from rq.utils import now as now_utc
from rq.worker import WorkerStatus

from codepool.common.errors import CodepoolError
from codepool.common.queueing import announced_batch
from codepool.common.wire import JOB_FUNCTION

if TYPE_CHECKING:
    from codepool.worker.job import BatchExecution, BatchRunner

# An idle dispatcher's cost to Redis is RQ's: the one waiting on the queue (one a host,
# worker/listen_turn.py) blocks in BLMOVE for DEQUEUE_TIMEOUT_S and beats between two
# waits; the others beat every KEEPALIVE_S. RQ's worker key lives WORKER_TTL_S + 60 s.
# (Liveness that matters, the lease, is the worker host's: worker/lease.py.)
WORKER_TTL_S = 600
DEQUEUE_TIMEOUT_S = 60
# A heartbeat RQ sends within this long of the last is not sent.
HEARTBEAT_REPEAT_S = 10.0
# From the worker host at its drain deadline: take back what runs, give it back, exit.
CUT_SIGNAL = signal.SIGUSR1


class RefusedJob(CodepoolError):
    """Raised when an RQ job names a function other than codepool's job function."""


class CodepoolJob(Job):
    """An RQ job that resolves to the dispatcher's runner, and to nothing else."""

    runner: BatchRunner | None = None
    execution: BatchExecution | None = None
    unread: dict[bytes, bytes] | None = None  # its hash, read and not yet restored

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


class ClaimingQueue(Queue):
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


class RQWorker(SimpleWorker):
    """RQ's SimpleWorker (jobs run in process, no fork) with fewer round trips per job,
    no command channel, and signals as a worker host's dispatcher takes them. A
    subclass adds codepool's work through the hooks; each does nothing here.

    Signals: SIGTERM stops it taking work (RQ's warm shutdown: the job it runs
    finishes); CUT_SIGNAL, at the host's drain deadline, sets ``cut`` and stops it too.
    SIGINT is ignored: a Ctrl-C reaches every process of the terminal's group, and the
    host answers it for all of them."""

    slot = 0  # this worker's place among its host's; slot 0 runs RQ's maintenance
    cut = False  # the host's drain deadline came
    _beat_sent_at = -1e9  # monotonic time of the last heartbeat of RQ's default TTL
    _state_unsent = False  # the state changed to IDLE and Redis has not been told yet
    _beat_rides_next = False  # a job just ended: RQ's suspension check beats next
    _prepared: str | None = None  # the job whose start prepare_execution already sent

    # -- hooks ---------------------------------------------------------------------

    def wait_turn(self) -> None:
        """Before RQ's dequeue: wait until this worker may wait on the queue."""

    def pass_turn(self) -> None:
        """RQ's dequeue ended with no job, or failed; or the job's first snippets run."""

    def before_job(self, job: Job) -> None:
        """A job was dequeued and RQ is about to ready and perform it."""

    def wake_job(self) -> None:
        """A stop or cut was asked for: have the running job look at it now (called
        from a signal handler)."""

    # -- stopping ------------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """A SIGTERM or the cut came: no job is dequeued after the one running."""
        return bool(self._stop_requested)

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(CUT_SIGNAL, self.request_cut)

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.wake_job()  # the job takes back what has not started, now
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
        self.wake_job()

    # -- fewer round trips ---------------------------------------------------------

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

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None:
            if state == self._state:
                return
            if state == WorkerStatus.IDLE:
                self._state, self._state_unsent = state, True
                return
        super().set_state(state, pipeline=pipeline)

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        # RQ heartbeats the job here to keep it alive through its success or failure
        # callback; codepool jobs have none (CodepoolJob), so the round trip goes.
        job.ended_at = now_utc()

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

    # -- the hooks' places in RQ's loop --------------------------------------------

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        self.wait_turn()
        try:
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        except BaseException:
            self.pass_turn()
            raise
        if result is None:
            self.pass_turn()
        # With a job, before_job passes the turn on once its first snippets have started.
        return result

    def execute_job(self, job: Job, queue: Queue) -> None:
        self.before_job(job)
        super().execute_job(job, queue)
        self._beat_rides_next = True

    def claim_with(self, claimer: Callable[[str], Job | None]) -> None:
        """From now on, RQ reads each dequeued announcement through ``claimer``
        (ClaimingQueue)."""
        self.queue_class = cast(
            type[Queue],
            type("DispatcherQueue", (ClaimingQueue,), {"claimer": staticmethod(claimer)}),
        )
