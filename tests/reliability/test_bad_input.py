"""Bad input at the queue boundary: a clear answer to the producer, a log line on the
worker, and a worker that keeps serving."""

from __future__ import annotations

import os
import time

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus

from codepool.common import codec
from codepool.common.codec import MsgpackSerializer
from codepool.common.ledger import submit_script
from codepool.common.limits import Limits
from codepool.common.queueing import announce, batch_queue
from codepool.common.settings import Settings
from codepool.common.wire import JOB_FUNCTION, BatchJob, new_batch_id
from codepool.producer import CodePool
from codepool.producer.pool import Batch
from tests.conftest import StartWorker, wait_until


def _store_raw(url: str, batch_id: str, spec: bytes, size: int, *, announced: bool = True) -> None:
    """Store a batch record as a producer would, whatever it holds, and announce it."""
    settings = Settings(redis_url=url)
    client = redis.Redis.from_url(url)
    submit_script(
        client,
        [settings.keys.batch_state(batch_id), settings.keys.hosts(), settings.keys.open_batches()],
        [spec, size, "", 2, settings.batch_ttl_s, settings.lease_s, batch_id],
    )
    if announced:
        announce(batch_queue(client, settings), settings, batch_id=batch_id, size=size)


def _announce_raw(url: str, payload: bytes) -> None:
    """Put an RQ job for codepool's job function with an arbitrary payload."""
    settings = Settings(redis_url=url)
    client = redis.Redis.from_url(url)
    batch_queue(client, settings).enqueue(JOB_FUNCTION, payload)


def _good(batch_id: str, codes: list[str]) -> dict[str, object]:
    return codec.loads(BatchJob.from_codes(batch_id, codes, Limits(), "", time.time()).encode())


def test_malformed_batches_are_rejected_promptly(redis_url: str, start_worker: StartWorker) -> None:
    worker = start_worker()
    pool = CodePool(redis_url)
    cases = {
        "schema": lambda bid: {**_good(bid, ["print(1)"] * 2), "v": 99},
        "codes-type": lambda bid: {**_good(bid, ["print(1)"] * 2), "codes": "print(1)"},
        "limits-type": lambda bid: {
            **_good(bid, ["print(1)"] * 2),
            "limits": {"timeout_s": "soon"},
        },
        "unknown-limit": lambda bid: {
            **_good(bid, ["print(1)"] * 2),
            "limits": {"no_such_limit": 1},
        },
    }
    for name, build in cases.items():
        batch_id = new_batch_id()
        _store_raw(redis_url, batch_id, codec.dumps(build(batch_id)), 2)
        started = time.monotonic()
        results = Batch(pool, batch_id, 2, Limits(), deadline_s=30).results(timeout_s=30)
        assert time.monotonic() - started < 10, name
        assert [r.status for r in results] == ["rejected", "rejected"], name
        assert "malformed batch" in results[0].stderr, name
    # An undecodable batch record still has an id: its producer is told.
    batch_id = new_batch_id()
    _store_raw(redis_url, batch_id, b"\xc1\xc1 not msgpack", 2)
    results = Batch(pool, batch_id, 2, Limits(), deadline_s=30).results(timeout_s=30)
    assert [r.status for r in results] == ["rejected", "rejected"]
    assert "undecodable msgpack payload" in results[0].stderr
    # An undecodable announcement: nobody can be told, but the worker logs it and keeps
    # serving.
    _announce_raw(redis_url, b"\xc1\xc1 not msgpack")
    deadline = time.monotonic() + 15
    while worker.log().count("refused malformed batch") < len(cases) + 2:
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.1)
    assert "undecodable msgpack payload" in worker.log()
    assert pool.submit(["print('still serving')"]).results(timeout_s=30)[0].ok


def test_hostile_code_entries_through_the_queue(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    codes = ["print(1)\0", "print('\udc80')", "#" * (256 * 1024 + 1), None, 42, "print(2)"]
    results = pool.submit(codes).results(timeout_s=60)  # type: ignore[arg-type]
    assert results[0].status == "error" and "null bytes" in results[0].stderr
    # A lone surrogate is worded as `python -c` words it (its command line cannot be
    # encoded), not as a decoding SyntaxError.
    assert results[1].status == "error" and "surrogates not allowed" in results[1].stderr
    assert results[2].status == "rejected" and "limit" in results[2].stderr
    assert [r.status for r in results[3:5]] == ["rejected", "rejected"]
    assert results[5].stdout == "2\n"


def test_oversize_batch_is_refused_by_the_producer_and_by_the_worker(
    redis_url: str, start_worker: StartWorker
) -> None:
    import pytest

    from codepool.common.errors import ConfigError

    pool = CodePool(redis_url, settings=Settings(redis_url=redis_url, max_batch_snippets=5))
    with pytest.raises(ConfigError):
        pool.submit(["print(1)"] * 6)
    start_worker(env={"CODEPOOL_MAX_BATCH_SNIPPETS": "3"})
    big = CodePool(redis_url).submit(["print(1)"] * 4).results(timeout_s=30)
    assert [r.status for r in big] == ["rejected"] * 4
    assert "over the worker's limit of 3" in big[0].stderr


def _store_unannounced(url: str, codes: list[str]) -> str:
    """Store a good batch as a producer would, without announcing it; its id."""
    batch_id = new_batch_id()
    spec = BatchJob.from_codes(batch_id, codes, Limits(), "", time.time()).encode()
    _store_raw(url, batch_id, spec, len(codes), announced=False)
    return batch_id


def _stdouts_soon(url: str, batch_id: str, size: int) -> list[str]:
    """A batch's outputs, collected for less time than the producer waits before it
    announces a stalled batch again (STALL_S): what did not run by then is infra."""
    return [r.stdout for r in Batch(CodePool(url), batch_id, size, Limits()).results(timeout_s=8)]


@pytest.mark.parametrize("job", ["naming another function", "with its hash gone"])
def test_what_the_read_of_an_announcement_claimed_runs_whatever_its_job(
    redis_url: str, start_worker: StartWorker, job: str
) -> None:
    # A dispatcher claims a batch's first snippets in the round trip that reads the job
    # its id names. A job that turns out to name another function is refused, one whose
    # hash is gone (expired, deleted) is skipped, and what was claimed runs all the same.
    worker = start_worker()
    client = redis.Redis.from_url(redis_url)
    # Two snippets: a batch of more is open (ledger.SUBMIT), and a dispatcher that has
    # not waited on the queue yet would join it without reading any job.
    batch_id = _store_unannounced(redis_url, ["print('claimed with the read')"] * 2)
    marker = f"/tmp/codepool-pwned-{os.getpid()}"
    queue = Queue("codepool", connection=client, serializer=MsgpackSerializer)
    if job == "naming another function":
        foreign = queue.enqueue("os.system", f"touch {marker}", job_id=f"{batch_id}-0badf00d")
    else:
        client.rpush(queue.key, f"{batch_id}-00000000")  # only its id on RQ's queue
    assert _stdouts_soon(redis_url, batch_id, 2) == ["claimed with the read\n"] * 2
    if job == "naming another function":
        wait_until(lambda: foreign.get_status(refresh=True) == JobStatus.FAILED, timeout_s=15)
        assert not os.path.exists(marker)
        assert "refusing job" in worker.log()
    else:
        assert "its hash is gone" in worker.log()
    assert CodePool(redis_url).submit(["print('still serving')"]).results(timeout_s=30)[0].ok


def test_a_long_batch_whose_job_hash_is_gone_leaves_no_job_hash(
    redis_url: str, start_worker: StartWorker
) -> None:
    # RQ's heartbeat of a running job (every HEARTBEAT_EVERY_S) would make the hash anew,
    # with no TTL, where it was gone.
    start_worker()
    client = redis.Redis.from_url(redis_url)
    batch_id = _store_unannounced(redis_url, ["import time\ntime.sleep(10.5)\nprint('long')"])
    job_id = f"{batch_id}-00000000"
    client.rpush(Queue("codepool", connection=client).key, job_id)
    results = Batch(CodePool(redis_url), batch_id, 1, Limits()).results(timeout_s=30)
    assert results[0].stdout == "long\n", results[0]
    assert not client.exists(Job.key_for(job_id))
