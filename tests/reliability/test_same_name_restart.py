"""A host's identity is per start: a worker host killed -9 and restarted at once under
the same ``--name`` (a container restart, a systemd unit, a pod's hostname.pid) is a new
lease, and the dead start's lease is fenced at once, so what its dispatchers had
claimed runs again in seconds. (Before, the new start's first beat renewed the dead
start's lease and nobody ever fenced its dispatchers: their claims came back ``infra``
at the producer's deadline, minutes later.)"""

from __future__ import annotations

import redis

from codepool.common.keys import Keys
from codepool.producer import CodePool
from tests.conftest import StartWorker, sleeping_below, wait_until
from tests.reliability.test_worker_loss import _kill_host

# Far below the producer's deadline (minutes) and far above the few seconds a rerun
# takes: a batch that needs the deadline fails here.
WAIT_S = 60.0


def test_a_host_restarted_under_its_own_name_frees_what_it_held(
    redis_url: str, start_worker: StartWorker
) -> None:
    first = start_worker(concurrency=2, name="phoenix")
    pool = CodePool(redis_url)
    n = 12
    batch = pool.submit(
        [f"import time\ntime.sleep(0.5)\nprint({i})" for i in range(n)], timeout_s=10.0
    )
    seen: list[int] = []
    iterator = batch.as_completed(timeout_s=WAIT_S)
    for index, _ in iterator:  # the host holds claims now
        seen.append(index)
        if len(seen) == 2:
            break
    _kill_host(first)
    start_worker(concurrency=2, name="phoenix")
    seen += [index for index, _ in iterator]
    results = batch.results()
    assert sorted(seen) == list(range(n)), "every index exactly once"
    assert [r.status for r in results] == ["ok"] * n, [r.stderr for r in results]
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    # The dead start's lease and its dispatchers are gone; the new start's live.
    wait_until(lambda: client.zcard(keys.fenced()) == 0, what="the dead start forgotten")
    assert client.zcard(keys.hosts()) == 1
    client.close()
    pool.close()


def test_a_lone_call_in_flight_through_a_same_name_restart_is_answered(
    redis_url: str, start_worker: StartWorker
) -> None:
    from codepool.producer import RemoteSandbox

    first = start_worker(concurrency=1, name="loner")
    with RemoteSandbox(redis_url, timeout=10.0, run="loner") as sandbox:
        assert sandbox.run_code("pass").worker == "loner"
        future = sandbox.submit("import time\ntime.sleep(1.5)\nprint('done')")
        wait_until(lambda: bool(sleeping_below(first.process.pid)), what="the call running")
        _kill_host(first)
        start_worker(concurrency=1, name="loner")
        result = future.result(timeout=WAIT_S)
        assert (result.status, result.stdout) == ("ok", "done\n"), result
        assert sandbox.pool.calls.waiting() == 0
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    assert client.llen(keys.calls()) == 0
    assert [k for k in client.scan_iter(keys.host_calls("loner*")) if client.llen(k)] == []
    client.close()
