"""Worker loss: a batch whose worker host is killed -9 still completes, once per index,
through the lapsed dispatchers' leases (the producer's deadline is left at its default,
far beyond these tests' waits)."""

from __future__ import annotations

import glob
import os
import signal
import tempfile

from codepool.common.settings import Settings
from codepool.ops.bench.process_tree import descendants, worker_role
from codepool.producer import CodePool
from codepool.worker.host import HOST_DIR_PREFIX
from tests.conftest import StartWorker, WorkerProcess, wait_until


def _kill_host(worker: WorkerProcess) -> None:
    """SIGKILL every process of a worker host at once: host, dispatchers, supervisor,
    zygote and snippets, as a lost machine would."""
    for pid in [worker.process.pid, *descendants(worker.process.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.process.wait()


def test_batch_survives_its_worker_host_being_killed(
    redis_url: str, start_worker: StartWorker
) -> None:
    doomed = start_worker(concurrency=2, name="doomed")
    pool = CodePool(redis_url)
    n = 200
    batch = pool.submit(
        [f"import time\ntime.sleep(0.02)\nprint({i})" for i in range(n)], timeout_s=5.0
    )
    seen: list[int] = []
    iterator = batch.as_completed(timeout_s=120)
    for index, _ in iterator:  # let the first worker get a few done
        seen.append(index)
        if len(seen) == 20:
            break
    doomed_dirs = glob.glob(f"{tempfile.gettempdir()}/{HOST_DIR_PREFIX}{doomed.process.pid}-*")
    assert doomed_dirs  # its zygote socket dir, which a kill -9 leaves behind
    _kill_host(doomed)
    start_worker(concurrency=2, name="survivor")
    # The next host on the machine sweeps what the killed one left.
    assert not any(os.path.exists(d) for d in doomed_dirs)
    seen += [index for index, _ in iterator]
    results = batch.results()
    assert sorted(seen) == list(range(n)), "every index exactly once"
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    assert {r.worker for r in results} == {"doomed", "survivor"}
    # Counted exactly once each: what the killed host wrote was counted with its write,
    # and the reruns of what it had not finished add only their own first writes.
    wait_until(lambda: pool.counters().get("calls", 0) >= n, timeout_s=30, what="all counted")
    assert pool.counters()["calls"] == n


def _dispatcher_running(url: str, batch_id: str) -> int:
    """The pid of the dispatcher whose current job is this batch."""
    import redis
    from rq import Worker

    client = redis.Redis.from_url(url)
    found: list[int] = []

    def picked() -> bool:
        for worker in Worker.all(connection=client):
            job_id = worker.get_current_job_id() or ""
            if job_id.startswith(batch_id) and worker.pid:
                found.append(int(worker.pid))
                return True
        return False

    wait_until(picked, what="a dispatcher to pick the batch up")
    return found[0]


def test_batch_survives_a_lone_dispatcher_kill(redis_url: str, start_worker: StartWorker) -> None:
    worker = start_worker(concurrency=2)
    pool = CodePool(redis_url)
    n = 20
    batch = pool.submit([f"import time\ntime.sleep(0.2)\nprint({i})" for i in range(n)])
    os.kill(_dispatcher_running(redis_url, batch.id), signal.SIGKILL)
    results = batch.results(timeout_s=60)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    assert "dispatcher" in worker.log() and "restarting it" in worker.log()
    assert worker.process.poll() is None


def test_batch_survives_a_zygote_kill(redis_url: str, start_worker: StartWorker) -> None:
    worker = start_worker(concurrency=2)
    pool = CodePool(redis_url)
    n = 20
    batch = pool.submit([f"import time\ntime.sleep(0.2)\nprint({i})" for i in range(n)])
    _dispatcher_running(redis_url, batch.id)
    # The bare zygote (these plain snippets' own) and the light one.
    zygotes = [pid for pid in descendants(worker.process.pid) if worker_role(pid) == "zygote"]
    assert len(zygotes) == 2
    for pid in zygotes:
        os.kill(pid, signal.SIGKILL)
    results = batch.results(timeout_s=60)
    # In-flight snippets are re-run once by the executor; none is lost or doubled.
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    assert worker.process.poll() is None


def test_no_live_worker_at_all_is_said_as_such(redis_url: str) -> None:
    """No dispatcher heartbeats: after ``no_worker_wait_s`` the producer says so, with its
    own message, long before the batch's deadline or the call's own limit. (The default,
    15 s, works alike, only later.)"""
    pool = CodePool(redis_url, settings=Settings.from_env().replace(no_worker_wait_s=2.0))
    batch = pool.submit(["print(1)"] * 3, timeout_s=30.0)
    assert batch.deadline_s > 120
    results = batch.results(timeout_s=120)
    assert [r.status for r in results] == ["infra"] * 3
    assert "no live worker on queue 'codepool'" in results[0].stderr


def test_a_lost_announcement_is_made_again(redis_url: str, start_worker: StartWorker) -> None:
    """The batch is stored but its announcement is gone (a Redis that failed over, say):
    the waiting producer sees live dispatchers, no progress and unclaimed work, and
    announces it again."""
    import redis

    from codepool.common.queueing import batch_queue

    pool = CodePool(redis_url)
    batch = pool.submit(["print('found')"] * 3)
    batch_queue(redis.Redis.from_url(redis_url), pool.settings).empty()
    start_worker()
    results = batch.results(timeout_s=60)
    assert [r.stdout for r in results] == ["found\n"] * 3
