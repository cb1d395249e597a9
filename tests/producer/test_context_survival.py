"""Contexts survive what batches survive: a host restarted under its own name, a
supervisor killed. Each is rebuilt from its recorded calls on its next call (before: the
restarted host answered "no such context on this host", a killed supervisor's in-flight
call came back infra and later ones rejected: the trajectory was lost)."""

from __future__ import annotations

import os
import signal

from codepool.ops.bench.process_tree import descendants, worker_role
from codepool.producer import CodePool
from codepool.producer.context import host_lives
from tests.conftest import StartWorker, wait_until
from tests.reliability.test_worker_loss import _kill_host


def test_a_context_whose_host_restarts_under_its_name_is_rebuilt(
    redis_url: str, start_worker: StartWorker
) -> None:
    first = start_worker(name="again")
    pool = CodePool(redis_url)
    try:
        ctx = pool.context(timeout_s=10.0)
        assert ctx.run_code("x = 41").ok
        _kill_host(first)
        start_worker(name="again")
        after = ctx.run_code("print(x + 1)")
        assert (after.status, after.stdout, after.rebuilt) == ("ok", "42\n", True), after
        assert ctx.host == "again" and ctx.rebuilds == 1
        assert ctx.run_code("print(x)").stdout == "41\n"
        ctx.close()
    finally:
        pool.close()


def _supervisor_of(pid: int) -> int:
    found = [p for p in descendants(pid) if worker_role(p) == "supervisor"]
    assert len(found) == 1, found
    return found[0]


def test_a_context_outlives_its_hosts_supervisor(redis_url: str, start_worker: StartWorker) -> None:
    worker = start_worker(name="steady")
    pool = CodePool(redis_url)
    try:
        ctx = pool.context(timeout_s=10.0)
        assert ctx.run_code("y = 6").ok
        supervisor = _supervisor_of(worker.process.pid)
        os.kill(supervisor, signal.SIGKILL)
        # The host brings a supervisor back; the context's state went with the old one.
        wait_until(
            lambda: (
                [p for p in descendants(worker.process.pid) if worker_role(p) == "supervisor"]
                not in ([], [supervisor])
            ),
            timeout_s=60,
            what="a new supervisor",
        )
        after = ctx.run_code("print(y * 7)")
        assert (after.status, after.stdout, after.rebuilt) == ("ok", "42\n", True), after
        assert ctx.run_code("print(y)").stdout == "6\n"
        ctx.close()
    finally:
        pool.close()


def test_a_call_in_flight_when_the_supervisor_dies_is_rebuilt_and_run(
    redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(name="midcall")
    pool = CodePool(redis_url)
    try:
        ctx = pool.context(timeout_s=20.0)
        assert ctx.run_code("z = 2").ok
        supervisor = _supervisor_of(worker.process.pid)
        import threading

        killer = threading.Timer(1.0, lambda: os.kill(supervisor, signal.SIGKILL))
        killer.start()
        during = ctx.run_code("import time\ntime.sleep(3)\nprint(z * 21)")
        killer.join()
        assert (during.status, during.stdout, during.rebuilt) == ("ok", "42\n", True), during
        ctx.close()
    finally:
        pool.close()


def test_a_rebuild_waits_for_a_host_that_can_take_it(
    redis_url: str, start_worker: StartWorker
) -> None:
    """The context's only host is killed; another starts only while the next call is
    already rebuilding: the rebuild keeps asking (within the call's timeout and a
    margin) instead of giving up at once with "no live worker host". The dead host's
    request list, made anew by the rebuild's close, expires (before: no TTL)."""
    import threading

    import redis

    from codepool.common.keys import Keys

    first = start_worker(name="only")
    pool = CodePool(redis_url)
    try:
        ctx = pool.context(timeout_s=10.0)
        assert ctx.run_code("w = 3").ok
        _kill_host(first)
        wait_until(lambda: not host_lives(pool, "only"), timeout_s=30, what="its lease lapsed")
        later = threading.Timer(1.0, lambda: start_worker(name="next", wait=False))
        later.start()
        after = ctx.run_code("print(w * 14)")
        later.join()
        assert (after.status, after.stdout, after.rebuilt) == ("ok", "42\n", True), after
        assert ctx.host == "next"
        client = redis.Redis.from_url(redis_url)
        assert client.ttl(Keys().host_requests("only")) > 0
        client.close()
        ctx.close()
    finally:
        pool.close()
