"""What codepool relies on in RQ, checked against the installed release and a real
redis-server: one test per assumption listed in worker/rq_worker.py (RQ's behaviour,
numbered there) and common/rq_records.py (RQ's records). A release of RQ that changes
one of them fails here; pyproject.toml bounds rq to the releases that pass."""

from __future__ import annotations

import fnmatch
import inspect
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Callback, Job
from rq.results import Result
from rq.suspension import is_suspended
from rq.worker import WorkerStatus

from codepool.common import rq_records
from codepool.common.codec import MsgpackSerializer
from codepool.common.queueing import announce, announcement
from codepool.common.settings import Settings
from codepool.common.wire import JOB_FUNCTION
from codepool.worker.rq_worker import (
    CUT_SIGNAL,
    DEQUEUE_TIMEOUT_S,
    WORKER_TTL_S,
    ClaimingQueue,
    CodepoolJob,
    RQWorker,
)

QUEUE = "contract"
CALLED: list[str] = []  # what a job's callback, if RQ ever ran it, would add to


def record_callback(*args: Any) -> None:
    CALLED.append("callback")


class StubRunner:
    """Stands in for BatchRunner: what a job's ``func`` resolves to."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def run(self, job: Job, payload: Any) -> dict[str, Any]:
        self.calls.append("perform")
        return {"batch": "stub"}


@pytest.fixture
def conn(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def signals() -> Iterator[None]:
    """RQ installs signal handlers; this process's are put back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, CUT_SIGNAL)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def queue_of(conn: redis.Redis, job_class: type[Job] = CodepoolJob) -> Queue:
    return Queue(QUEUE, connection=conn, serializer=MsgpackSerializer, job_class=job_class)


def worker_of(conn: redis.Redis, cls: type[SimpleWorker] = RQWorker, **kw: Any) -> Any:
    return cls(
        [queue_of(conn, kw.pop("job_class", CodepoolJob))],
        connection=conn,
        name=kw.pop("name", "contract"),
        serializer=MsgpackSerializer,
        job_class=kw.pop("job_class_w", CodepoolJob),
        worker_ttl=WORKER_TTL_S,
        **kw,
    )


def announced(conn: redis.Redis, count: int = 1) -> list[str]:
    settings = Settings(queue=QUEUE)
    return announce(queue_of(conn), settings, batch_id="ab" * 16, size=count, count=count)


# -- 1. dequeue_any reads each popped id through queue_class._fetch_dequeued_job ------


def test_fetch_dequeued_job_has_the_signature_claiming_queue_overrides() -> None:
    ours = inspect.signature(ClaimingQueue._fetch_dequeued_job)
    theirs = inspect.signature(Queue.__dict__["_fetch_dequeued_job"].__func__)
    assert list(theirs.parameters) == ["cls", *ours.parameters]
    assert isinstance(Queue.__dict__["_fetch_dequeued_job"], classmethod)


def test_dequeue_reads_through_the_claimer_and_skips_a_none(conn: redis.Redis) -> None:
    first, second = announced(conn, 2)
    plain = queue_of(conn).enqueue_call(JOB_FUNCTION, args=(b"plain",))
    asked: list[str] = []

    def claimer(job_id: str) -> Job | None:
        asked.append(job_id)
        if job_id == first:
            return None  # as if its hash were gone: RQ pops the next
        return CodepoolJob.fetch(job_id, connection=conn, serializer=MsgpackSerializer)

    worker = worker_of(conn)
    worker.claim_with(claimer)
    result = worker.dequeue_job_and_maintain_ttl(None)
    assert result is not None
    job, queue = result
    assert asked == [first, second]
    assert job.id == second and queue.name == QUEUE and isinstance(queue, ClaimingQueue)
    # An id that announce did not make is read as RQ reads it.
    result = worker.dequeue_job_and_maintain_ttl(None)
    assert result is not None and result[0].id == plain.id and asked == [first, second]


# -- 2. work() passes dequeue_timeout; the socket timeout outlasts it -----------------


class Recording(RQWorker):
    """An RQWorker that notes what RQ's loop calls, in order."""

    calls: list[str]
    stop_at_dequeue = False

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        self.calls.append(f"dequeue timeout={timeout}")
        if self.stop_at_dequeue:
            raise StopRequested
        return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)

    def run_maintenance_tasks(self) -> None:
        self.calls.append("maintenance")

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        self.calls.append("heartbeat" + (" piped" if pipeline is not None else ""))
        super().heartbeat(timeout, pipeline)

    def prepare_execution(self, job: Job) -> Any:
        self.calls.append("prepare_execution")
        return super().prepare_execution(job)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        self.calls.append(f"prepare_job_execution {remove_from_intermediate_queue}")
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        self.calls.append("execution_ended")
        super().handle_execution_ended(job, queue, heartbeat_ttl)

    def set_state(self, state: str, pipeline: Any = None) -> None:
        self.calls.append(f"state {getattr(state, 'value', state)}")
        super().set_state(state, pipeline)


def recording(conn: redis.Redis, **kw: Any) -> Recording:
    worker: Recording = worker_of(conn, Recording, **kw)
    worker.calls = []
    return worker


def test_work_waits_on_the_queue_for_dequeue_timeout(conn: redis.Redis, signals: None) -> None:
    worker = recording(conn)
    worker.stop_at_dequeue = True
    worker.work(burst=False)
    assert f"dequeue timeout={DEQUEUE_TIMEOUT_S}" in worker.calls
    timeout_s = conn.connection_pool.connection_kwargs["socket_timeout"]
    assert timeout_s is not None and timeout_s > DEQUEUE_TIMEOUT_S


# -- 3. should_run_maintenance_tasks gates run_maintenance_tasks ---------------------


@pytest.mark.parametrize("slot", [0, 1])
def test_only_slot_zero_runs_rq_maintenance(conn: redis.Redis, signals: None, slot: int) -> None:
    worker = recording(conn)
    worker.slot = slot
    worker.work(burst=True)
    assert ("maintenance" in worker.calls) == (slot == 0), worker.calls


# -- 4. subscribe/unsubscribe are RQ's only pub/sub ---------------------------------


def subscribers(conn: redis.Redis, name: str) -> int:
    return int(
        dict(conn.pubsub_numsub(rq_records.command_channel(name)))[
            rq_records.command_channel(name).encode()
        ]
    )


@pytest.mark.parametrize("cls", [SimpleWorker, RQWorker])
def test_no_pubsub_connection_but_rqs_own(conn: redis.Redis, signals: None, cls: type) -> None:
    seen: list[int] = []

    class Probe(cls):  # type: ignore[misc, valid-type]
        def run_maintenance_tasks(self) -> None:
            seen.append(subscribers(conn, self.name))
            seen.append(sum(int(c.get("sub", 0)) for c in conn.client_list()))

    worker_of(conn, Probe, name="probe").work(burst=True)
    # RQ's SimpleWorker subscribes (so the probe sees it); RQWorker has no pub/sub at all.
    assert seen and set(seen) == ({1} if cls is SimpleWorker else {0})


# -- 5. heartbeat: what it writes, on the pipeline; where RQ's loop beats ------------


def test_heartbeat_writes_on_the_pipeline_it_is_given(conn: redis.Redis) -> None:
    worker = worker_of(conn, SimpleWorker, name="beat")
    with conn.pipeline(transaction=False) as pipe:
        SimpleWorker.heartbeat(worker, pipeline=pipe)
        assert len(pipe) > 0 and not conn.exists(worker.key)
        pipe.execute()
    assert conn.hget(worker.key, "last_heartbeat")
    assert WORKER_TTL_S < conn.ttl(worker.key) <= WORKER_TTL_S + 60
    SimpleWorker.heartbeat(worker, 30)
    assert conn.ttl(worker.key) <= 30


def test_dequeue_beats_then_waits_then_beats(conn: redis.Redis) -> None:
    announced(conn)
    worker = recording(conn)
    calls = worker.calls

    class Waiting(Queue):
        @classmethod
        def dequeue_any(cls, queues: Any, timeout: int | None, **kw: Any) -> Any:
            calls.append(f"dequeue_any timeout={timeout}")
            return super().dequeue_any(queues, timeout, **kw)

    worker.queue_class = Waiting
    assert worker.dequeue_job_and_maintain_ttl(1) is not None
    start = calls.index("dequeue timeout=1")
    assert calls[start + 1 :] == [
        "state idle",
        "heartbeat",
        "maintenance",
        "dequeue_any timeout=1",
        "heartbeat",
    ]


def test_the_suspension_check_pipes_a_heartbeat(conn: redis.Redis) -> None:
    worker = recording(conn)
    is_suspended(conn, worker)
    assert worker.calls == ["heartbeat piped"]


# -- 6. set_state keeps _state and HSETs it ------------------------------------------


def test_set_state_keeps_it_and_writes_it(conn: redis.Redis) -> None:
    worker = worker_of(conn, SimpleWorker, name="state")
    with conn.pipeline() as pipe:
        SimpleWorker.set_state(worker, WorkerStatus.BUSY, pipeline=pipe)
        assert worker._state == WorkerStatus.BUSY == worker.get_state()
        assert conn.hget(worker.key, "state") is None
        pipe.execute()
    assert conn.hget(worker.key, "state") == b"busy"


# -- 7, 8. a job's course through RQ; callbacks and func are read as properties ------


def test_a_job_goes_through_rqs_steps_in_order(conn: redis.Redis, signals: None) -> None:
    calls: list[str] = []

    class StubJob(CodepoolJob):
        runner = StubRunner(calls)  # type: ignore[assignment]

    queue = queue_of(conn, StubJob)
    job = queue.enqueue_call(
        JOB_FUNCTION,
        args=(b"x",),
        on_success=Callback(record_callback),
        on_failure=Callback(record_callback),
    )
    worker = recording(conn, job_class=StubJob, job_class_w=StubJob)
    worker.calls = calls
    CALLED.clear()
    assert worker.work(burst=True, max_jobs=1)
    # Readied (in two steps, the second told the job is alone on its queue), performed,
    # ended, idle, then a beat: each override of worker/rq_worker.py has its place.
    steps = [
        "prepare_execution",
        "prepare_job_execution True",
        "perform",
        "execution_ended",
        "state idle",
        "heartbeat",
    ]
    at = [calls.index(step, calls.index("prepare_execution")) for step in steps]
    assert at == sorted(at), calls
    assert not CALLED  # the callbacks RQ stored were never run: CodepoolJob has none
    assert job.get_status(refresh=True) == "finished"


# -- 9. stopping ---------------------------------------------------------------------


def test_a_stop_raises_when_idle_and_waits_when_busy(conn: redis.Redis, signals: None) -> None:
    worker = worker_of(conn, name="stop")
    worker.set_state(WorkerStatus.IDLE)
    with pytest.raises(StopRequested):
        worker.request_stop(signal.SIGTERM, None)
    worker = worker_of(conn, name="stop2")
    worker.set_state(WorkerStatus.BUSY)
    worker.request_stop(signal.SIGTERM, None)
    assert worker.stop_requested and worker._stop_requested
    assert signal.getsignal(signal.SIGTERM) == worker.request_force_stop


def test_work_installs_its_handlers_and_obeys_the_cut(conn: redis.Redis, signals: None) -> None:
    announced(conn)
    worker = recording(conn, name="cut")
    worker.request_cut(CUT_SIGNAL, None)
    worker.work(burst=True)
    assert not [c for c in worker.calls if c.startswith("dequeue")]  # stopped before one
    assert signal.getsignal(CUT_SIGNAL) == worker.request_cut
    assert signal.getsignal(signal.SIGTERM) == worker.request_stop
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


# -- common/rq_records.py: RQ's key names, and retiring a worker ---------------------


def test_rqs_keys_are_where_rq_records_names_them(conn: redis.Redis) -> None:
    (job_id,) = announced(conn)
    assert conn.lrange(rq_records.queue_key(QUEUE), 0, -1) == [job_id.encode()]
    assert rq_records.queue_key(QUEUE).encode() in conn.smembers(rq_records.queues_key())
    assert conn.type(rq_records.job_key(job_id)) == b"hash"
    worker = worker_of(conn, name="keys")
    worker.register_birth()
    assert worker.key == rq_records.worker_key("keys")
    assert worker.key.encode() in conn.smembers(rq_records.workers_key())
    # RQ's reliable dequeue moves the id to the intermediate list.
    found = Queue.dequeue_any([queue_of(conn)], 1, connection=conn, serializer=MsgpackSerializer)
    assert found is not None
    intermediate = conn.lrange(rq_records.intermediate_queue_key(QUEUE), 0, -1)
    assert intermediate == [job_id.encode()]
    SimpleWorker.prepare_execution(worker, found[0])
    started = conn.zrange(rq_records.started_registry_key(QUEUE), 0, -1)
    assert [s.decode().split(":")[0] for s in started] == [job_id]
    assert conn.exists(rq_records.worker_executions_key("keys"))
    Result.create(found[0], Result.Type.SUCCESSFUL, ttl=60, return_value=1)
    assert conn.type(rq_records.result_stream_key(job_id)) == b"stream"
    keys = [k.decode() for k in conn.keys("*")]
    assert keys and all(fnmatch.fnmatch(k, rq_records.key_pattern()) for k in keys), keys


def test_rqs_command_channel_is_where_rq_records_names_it(conn: redis.Redis, signals: None) -> None:
    seen: list[int] = []

    class Probe(SimpleWorker):
        def run_maintenance_tasks(self) -> None:
            seen.append(subscribers(conn, self.name))

    worker_of(conn, Probe, name="channel").work(burst=True)
    assert seen and set(seen) == {1}


def test_retiring_a_lost_worker_takes_its_records_away(conn: redis.Redis) -> None:
    (job_id,) = announced(conn)
    worker = worker_of(conn, name="lost")
    worker.register_birth()
    job = CodepoolJob.fetch(job_id, connection=conn, serializer=MsgpackSerializer)
    worker.prepare_execution(job)
    assert conn.zcard(rq_records.started_registry_key(QUEUE)) == 1
    held = rq_records.retire_worker(
        conn, "lost", queue=QUEUE, serializer=MsgpackSerializer, job_ttl_s=77
    )
    assert held == job_id
    assert not conn.exists(rq_records.worker_key("lost"))
    assert not conn.smembers(rq_records.workers_key())
    assert conn.zcard(rq_records.started_registry_key(QUEUE)) == 0
    assert 0 < conn.ttl(rq_records.job_key(job_id)) <= 77
    assert (
        rq_records.retire_worker(
            conn, "lost", queue=QUEUE, serializer=MsgpackSerializer, job_ttl_s=1
        )
        is None
    )


# -- common/queueing.py: an announcement's enqueue rides the caller's pipeline -------


def test_enqueue_on_a_pipeline_waits_for_it(conn: redis.Redis) -> None:
    settings = Settings(queue=QUEUE)
    queue = queue_of(conn)
    made = announcement(queue, settings, "cd" * 16)
    with conn.pipeline(transaction=False) as pipe:
        ids = announce(
            queue, settings, batch_id="cd" * 16, size=2, count=2, pipeline=pipe, made=made
        )
        assert conn.llen(rq_records.queue_key(QUEUE)) == 0
        assert not conn.exists(rq_records.job_key(made.id))
        pipe.execute()
    assert [i.decode() for i in conn.lrange(rq_records.queue_key(QUEUE), 0, -1)] == ids
    assert made.id in ids
