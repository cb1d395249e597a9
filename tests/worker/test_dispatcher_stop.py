"""A SIGTERM that lands while a dispatcher joins a batch (between RQ's dequeue and the
job's start) must wait for the job, whose finish gives back what was claimed, instead of
raising RQ's StopRequested in the middle of the claim."""

from __future__ import annotations

import signal

import pytest
import redis
from rq import Queue
from rq.exceptions import StopRequested

from codepool.common.codec import MsgpackSerializer
from codepool.common.wire import JOB_FUNCTION
from codepool.worker.dispatcher import Dispatcher
from codepool.worker.rq_worker import CodepoolJob


class Joined(Exception):
    """Raised by the stand-in runner once the SIGTERM has been handled."""


class SigtermWhileJoining:
    """A runner whose join receives the SIGTERM, as a real one may mid-claim."""

    def __init__(self, worker: Dispatcher) -> None:
        self.worker = worker

    def prestart(self, job: CodepoolJob, **_: object) -> None:
        self.worker.request_stop(signal.SIGTERM, None)
        raise Joined

    def wake(self) -> None:
        """No job runs yet to look at the stop."""


def test_a_sigterm_while_joining_waits_for_the_job(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    queue = Queue("codepool", connection=conn, serializer=MsgpackSerializer)
    worker = Dispatcher(
        [queue], connection=conn, serializer=MsgpackSerializer, job_class=CodepoolJob
    )
    worker.runner = SigtermWhileJoining(worker)  # type: ignore[assignment]
    job = CodepoolJob.create(JOB_FUNCTION, connection=conn, serializer=MsgpackSerializer)
    # RQ's stop handler installs its force-stop handlers: this process's are put back.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(Joined):  # not StopRequested: the stop waits for the job
            worker.execute_job(job, queue)
    except StopRequested:
        pytest.fail("the SIGTERM interrupted the join instead of waiting for the job")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert worker._stop_requested
    conn.close()
