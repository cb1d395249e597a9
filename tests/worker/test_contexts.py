"""Interpreter contexts on a LocalExecutor: real processes, no mocks."""

from __future__ import annotations

import os

import pytest

from codepool.common.errors import ContextError
from codepool.common.observation import format_tool_content
from codepool.worker.engine.executor import LocalExecutor
from tests.conftest import poll_until, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def executor():
    with LocalExecutor(concurrency=2, max_contexts=6, context_ttl_s=3.0) as ex:
        yield ex


@pytest.fixture(scope="module")
def patient():
    """An executor whose idle TTL outlasts any wait for a spare on a loaded host."""
    with LocalExecutor(concurrency=2, max_contexts=6, context_ttl_s=300.0) as ex:
        yield ex


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def test_state_persists_and_each_call_has_its_own_output(executor):
    with executor.context() as ctx:
        first = ctx.run_code("x = 41\nprint('first')")
        second = ctx.run_code("x += 1\nprint(x)")
        assert (first.stdout, second.stdout) == ("first\n", "42\n")
        assert second.ok and second.status == "ok"
        assert ctx.history == ["x = 41\nprint('first')", "x += 1\nprint(x)"]
        failed = ctx.run_code("1/0")
        assert failed.status == "error" and "ZeroDivisionError" in failed.stderr
        assert "ZeroDivisionError" in format_tool_content(failed)
        assert format_tool_content(ctx.run_code("print(x)")) == "42\n"
        big = ctx.run_code("print('y' * 10000)", max_output_chars=100)
        assert big.truncated and "truncated" in big.stdout and len(big.stdout) < 200
        assert ctx.run_code("print(1)").stdout == "1\n"  # the cut output does not linger


def test_fork_is_isolated_from_parent_and_siblings(executor):
    with executor.context() as parent:
        setup = "import json, os\nx = [1]\nopen('f.txt', 'w').write('parent')\njson.tag = 'p'"
        parent.run_code(setup)
        a, b = parent.fork(2)
        with a, b:
            change = "x.append(2)\nopen('f.txt', 'w').write('a')\njson.tag = 'a'"
            a.run_code(change)
            probe = "print(x, open('f.txt').read(), json.tag, sorted(os.listdir('.')))"
            assert a.run_code(probe).stdout == "[1, 2] a a ['f.txt']\n"
            assert b.run_code(probe).stdout == "[1] parent p ['f.txt']\n"
            assert parent.run_code(probe).stdout == "[1] parent p ['f.txt']\n"
            # A fork starts from its parent's calls and records only its own after them.
            assert a.history[:2] == [setup, change] and b.history == [setup, probe]


def test_timeout_ends_only_that_context(executor):
    with executor.context() as parent:
        parent.run_code("x = 7")
        (child,) = parent.fork()
        with child:
            result = parent.run_code("import time\ntime.sleep(30)", timeout_s=1)
            assert result.status == "timeout" and result.timed_out
            assert format_tool_content(result, timeout_s=1) == (
                "Error: execution timed out after 1 seconds."
            )
            assert parent.ended and "timed out" in parent.ended
            again = parent.run_code("print(x)")
            assert again.status == "rejected" and "timed out" in again.stderr
            assert child.run_code("print(x)").stdout == "7\n"
            wait_until(lambda: _gone(parent.pid), 30, "the timed-out context's process gone")


def test_memory_limit_ends_only_that_context(executor):
    with executor.context(memory_mb=256) as ctx:
        ctx.run_code("x = 1")
        (sibling,) = ctx.fork()
        with sibling:
            result = ctx.run_code("y = bytearray(1024 << 20)")
            assert result.status == "memory"
            assert ctx.ended and "memory" in ctx.ended
            assert ctx.run_code("print(x)").status == "rejected"
            assert sibling.run_code("print(x)").stdout == "1\n"


def test_ttl_ends_an_idle_context_leaving_no_process_or_dir(executor):
    keeper = executor.context()
    with keeper:
        keeper.run_code("import os")
        (idle,) = keeper.fork()
        work_dir = idle.run_code("import os\nprint(os.getcwd())").stdout.strip()
        assert keeper.run_code(f"print(os.path.isdir({work_dir!r}))").stdout == "True\n"
        pid = idle.pid
        assert not _gone(pid)
        # The keeper stays busy past the TTL; the fork sits idle.
        keeper.run_code("import time\ntime.sleep(4.5)", timeout_s=10)
        wait_until(lambda: idle.ended is not None, 30, "the idle fork ended")
        assert "TTL" in idle.ended
        wait_until(lambda: _gone(pid), 30, "its process gone")
        probe = f"print(os.path.exists({work_dir!r}))"
        wait_until(lambda: keeper.run_code(probe).stdout == "False\n", 10, "its work dir gone")
        assert idle.run_code("print(1)").status == "rejected"


def test_cap_on_live_contexts_says_so(executor):
    opened = []
    try:
        while len(opened) < 6:
            opened.append(executor.context())
        with pytest.raises(ContextError, match="cap"):
            executor.context()
        with pytest.raises(ContextError, match="cap"):
            opened[0].fork()
    finally:
        for ctx in opened:
            ctx.close()
    with executor.context() as again:  # room again once closed
        assert again.run_code("print(2)").stdout == "2\n"


def test_close_twice_and_use_after_close(executor):
    ctx = executor.context()
    pid = ctx.pid
    ctx.close()
    ctx.close()
    with pytest.raises(ContextError):
        ctx.run_code("print(1)")
    wait_until(lambda: _gone(pid), 30, "its process gone")


def test_leftover_processes_of_a_call_are_killed(executor):
    with executor.context() as ctx:
        out = ctx.run_code(
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(p.pid)"
        )
        assert out.ok
        # Killed when the call ended; the kill lands a moment later, and the process may
        # stay a zombie until the interpreter that started it reaps it.
        probe = (
            "import time\n"
            "def state(pid):\n"
            "    try:\n"
            "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0]\n"
            "    except OSError:\n"
            "        return 'gone'\n"
            f"pid, deadline = {out.stdout.strip()}, time.monotonic() + 10\n"
            "while state(pid) not in ('gone', 'Z') and time.monotonic() < deadline:\n"
            "    time.sleep(0.01)\n"
            "print(state(pid) in ('gone', 'Z'))"
        )
        assert ctx.run_code(probe).stdout == "True\n"


def _spare_made(parent, *others) -> bool:
    """Wait until ``parent``'s spare fork exists: a child of the family's reaper that
    is none of the contexts (forks are made with CLONE_PARENT)."""
    with open(f"/proc/{parent.pid}/status") as f:
        reaper = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
    known = {str(ctx.pid) for ctx in (parent, *others)}

    def spare() -> bool:
        children = set()
        try:
            for task in os.listdir(f"/proc/{reaper}/task"):
                with open(f"/proc/{reaper}/task/{task}/children") as f:
                    children |= set(f.read().split())
        except OSError:
            return False  # the family ended
        return bool(children - known)

    return poll_until(spare, 30.0)


def test_a_fork_after_a_call_sees_that_call(patient):
    # A fork order may be handed the spare made after the last one: a call between them
    # must end that spare, or the fork would start from the state before the call.
    with patient.context() as parent:
        parent.run_code("x = 1\nopen('f.txt', 'w').write('1')")
        first = parent.fork()
        assert _spare_made(parent, *first)
        parent.run_code("x = 2\nopen('f.txt', 'w').write('2')")
        second = parent.fork()
        assert _spare_made(parent, *first, *second)
        third = parent.fork()  # no call since the last order: the spare's turn
        probe = "print(x, open('f.txt').read())"
        for fork, seen in ((first, "1 1\n"), (second, "2 2\n"), (third, "2 2\n")):
            with fork[0] as ctx:
                assert ctx.run_code(probe).stdout == seen


def test_forks_do_not_share_random_streams(patient):
    with patient.context() as parent:
        parent.run_code("import random\nimport numpy as np")
        forks = parent.fork()
        assert _spare_made(parent, *forks)
        forks += parent.fork()  # the spare
        forks += parent.fork(2)  # the spare made after that one (if made yet) and a fork
        draw = "print(random.random(), np.random.random())"
        try:
            draws = [ctx.run_code(draw).stdout.split() for ctx in [parent, *forks]]
            for stream in zip(*draws, strict=True):  # random's, then numpy's
                assert len(set(stream)) == len(forks) + 1, stream
        finally:
            for fork in forks:
                fork.close()
