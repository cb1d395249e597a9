"""Interpreter contexts through Redis: real worker hosts, real Redis (producer/context.py,
worker/context_server.py)."""

from __future__ import annotations

import time

import redis

from codepool.common import counters
from codepool.common.errors import CodepoolError
from codepool.common.keys import Keys
from codepool.common.observation import format_tool_content
from codepool.producer import CodePool, RemoteSandbox
from tests.conftest import StartWorker, wait_until


def test_a_context_keeps_its_state_and_its_forks_are_their_own(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    client = redis.Redis.from_url(redis_url)
    with RemoteSandbox(redis_url, timeout=10) as sandbox:
        ctx = sandbox.context()
        assert client.hget(Keys().context(ctx.id), "host") is not None
        defined = "def f(x):\n    return x + 1\ndata = [1]\nopen('f.txt', 'w').write('p')"
        first = ctx.run_code(defined)
        assert first.status == "ok", first
        assert ctx.run_code("print(f(41), data)").stdout == "42 [1]\n"
        left, right = ctx.fork(2)
        assert left.run_code(
            "data.append(2); open('f.txt', 'w').write('l'); import math; math.x = 1"
        ).ok
        assert left.run_code("print(data, open('f.txt').read(), math.x)").stdout == "[1, 2] l 1\n"
        shown = right.run_code("import math; print(data, open('f.txt').read(), hasattr(math, 'x'))")
        assert shown.stdout == "[1] p False\n"
        assert ctx.run_code("print(data, open('f.txt').read())").stdout == "[1] p\n"
        # Each call's observation is its own, in the reference's format.
        error = ctx.run_code("f(undefined_name)")
        assert error.status == "error" and "NameError" in error.stderr
        assert "NameError" in format_tool_content(error)
        assert ctx.history[:2] == [defined, "print(f(41), data)"]
        for context in (ctx, left, right):
            context.close()
            context.close()  # twice is fine
        assert ctx.run_code("print(1)").status == "rejected"
        assert not client.exists(Keys().context(ctx.id))
        counted = counters.parse(client.hgetall(Keys().stats()))
        assert counted["contexts_opened"] == 1 and counted["contexts_forked"] == 2
        assert counted["context_calls"] == 7  # the call after close never left
    client.close()


def test_a_timeout_ends_only_its_context(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    try:
        ctx = pool.context(timeout_s=1.0)
        assert ctx.run_code("x = 5").ok
        (fork,) = ctx.fork()
        timed_out = ctx.run_code("while True: pass")
        assert timed_out.status == "timeout" and timed_out.timed_out
        after = ctx.run_code("print(x)")
        assert after.status == "rejected" and "ended" in after.stderr
        assert fork.run_code("print(x)").stdout == "5\n"
        fork.close()
    finally:
        pool.close()


def test_a_context_whose_host_is_lost_is_rebuilt_elsewhere_by_replay(
    redis_url: str, start_worker: StartWorker
) -> None:
    first = start_worker(name="ctx-a")
    pool = CodePool(redis_url)
    try:
        ctx = pool.context(timeout_s=10.0)
        kept = pool.context(timeout_s=10.0, rebuild=False)
        assert ctx.host == kept.host == "ctx-a"
        assert ctx.run_code("import random\nseed = 7\ndef f(x):\n    return x * 6").ok
        assert ctx.run_code("value = f(seed)").ok
        assert ctx.run_code("raise ValueError('not replayed')").status == "error"
        assert kept.run_code("y = 1").ok
        second = start_worker(name="ctx-b")
        first.process.kill()  # the host process, kill -9: its lease lapses
        first.process.wait()
        started = time.monotonic()
        rebuilt = ctx.run_code("print(value)")
        assert rebuilt.status == "ok" and rebuilt.stdout == "42\n" and rebuilt.rebuilt, rebuilt
        assert ctx.host == second.name and ctx.rebuilds == 1
        assert counters.parse(pool.conn.hgetall(Keys().stats()))["contexts_rebuilt"] == 1
        assert time.monotonic() - started < 30
        again = ctx.run_code("print(value + 1)")
        assert again.stdout == "43\n" and not again.rebuilt
        lost = kept.run_code("print(y)")
        assert lost.status == "infra" and "lost with its host" in lost.stderr
        ctx.close()
    finally:
        pool.close()


def test_a_host_without_room_says_so(redis_url: str, start_worker: StartWorker) -> None:
    start_worker("--max-contexts", "1")
    pool = CodePool(redis_url)
    try:
        ctx = pool.context()
        try:
            pool.context()
        except CodepoolError as exc:
            assert "context" in str(exc) and "1" in str(exc), exc
        else:
            raise AssertionError("a second context opened on a host capped at one")
        ctx.close()
        wait_until(lambda: _opens(pool), timeout_s=10, what="room again after a close")
    finally:
        pool.close()


def _opens(pool: CodePool) -> bool:
    try:
        pool.context().close()
    except CodepoolError:
        return False
    return True


def test_an_idle_context_ends_by_its_ttl_and_leaves_no_key(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker("--context-ttl", "1")
    pool = CodePool(redis_url)
    try:
        ctx = pool.context()
        assert ctx.ttl_s == 1.0 and ctx.run_code("x = 1").ok
        key = Keys().context(ctx.id)
        assert pool.conn.exists(key)
        wait_until(lambda: not pool.conn.exists(key), timeout_s=20, what="its record expired")
        ended = ctx.run_code("print(x)")
        assert ended.status == "rejected" and "ended" in ended.stderr, ended
        wait_until(
            lambda: counters.parse(pool.conn.hgetall(Keys().stats()))["contexts_ended_ttl"] == 1,
            timeout_s=40,
            what="the TTL end counted",
        )
    finally:
        pool.close()
