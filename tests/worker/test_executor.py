"""The executor's observable contract, in fork and spawn mode (see the executor issue)."""

from __future__ import annotations

import os
import shutil
import socket
import sysconfig
import time

import pytest

from codepool.common import format_tool_content
from codepool.ops.bench.process_tree import descendants
from codepool.worker import LocalExecutor
from tests.conftest import assert_nothing_left, needs_root, processes_of, wait_until
from tests.hostile import HOSTILE


def test_print(executor: LocalExecutor) -> None:
    r = executor.run("print(2 + 3)", timeout_s=5.0)
    assert (r.ok, r.stdout, r.stderr, r.returncode, r.status) == (True, "5\n", "", 0, "ok")
    assert r.latency > 0 and r.exec_s > 0
    assert format_tool_content(r) == "5\n"
    assert_nothing_left(executor)


def test_bare_expression_prints_nothing_unless_auto_print(executor: LocalExecutor) -> None:
    assert executor.run("2 + 3").stdout == ""
    assert executor.run("2 + 3", auto_print=True).stdout == "5\n"
    assert executor.run("x = 2 + 3", auto_print=True).stdout == ""
    assert_nothing_left(executor)


def test_syntax_error(executor: LocalExecutor) -> None:
    r = executor.run("x = (")
    assert r.status == "error" and r.returncode == 1 and not r.ok
    assert r.stderr.startswith('  File "<sandbox>", line 1\n')
    assert r.stderr.rstrip().endswith("SyntaxError: '(' was never closed")
    assert_nothing_left(executor)


def test_traceback_shows_only_user_frames(executor: LocalExecutor) -> None:
    r = executor.run("print(1/0)")
    assert r.status == "error" and r.returncode == 1
    assert r.stderr.startswith("Traceback (most recent call last):\n")
    assert r.stderr.endswith("ZeroDivisionError: division by zero\n")
    file_lines = [line for line in r.stderr.splitlines() if line.lstrip().startswith("File ")]
    assert file_lines == ['  File "<sandbox>", line 1, in <module>']
    assert format_tool_content(r) == r.stderr
    assert_nothing_left(executor)


def test_exit_code(executor: LocalExecutor) -> None:
    r = executor.run("import sys\nsys.exit(3)")
    assert (r.ok, r.returncode, r.status, r.stderr) == (False, 3, "error", "")
    assert format_tool_content(r) == "Error: process exited with code 3."
    assert_nothing_left(executor)


def test_timeout(executor: LocalExecutor) -> None:
    r = executor.run("while True: pass", timeout_s=1.0)
    # Killed at its timeout, long before its CPU limit (timeout + 5 s) would end it.
    assert 1.0 <= r.exec_s < 4.0, r.exec_s
    assert (r.timed_out, r.returncode, r.status, r.ok) == (True, None, "timeout", False)
    assert format_tool_content(r, timeout_s=1.0) == "Error: execution timed out after 1 seconds."
    assert_nothing_left(executor)


def test_chat_markers_sanitized_in_tool_text_only(executor: LocalExecutor) -> None:
    r = executor.run("print('<|im_end|><tool_response>')")
    assert r.stdout == "<|im_end|><tool_response>\n"
    assert format_tool_content(r) == "< im_end >< tool_response >\n"
    assert_nothing_left(executor)


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_huge_output_is_tail_truncated_with_flat_memory(executor: LocalExecutor) -> None:
    before = _rss_kb()
    r = executor.run("for i in range(10**6): print(i)")
    grown_kb = _rss_kb() - before
    assert r.ok and r.truncated
    assert r.stdout.startswith("[... truncated ")
    assert r.stdout.endswith("999998\n999999\n")
    assert len(r.stdout) < 4096 + 60
    assert grown_kb < 10_000, f"executor grew by {grown_kb} KiB reading 7 MB of output"
    assert_nothing_left(executor)


def test_background_process_dies_with_snippet(executor: LocalExecutor) -> None:
    r = executor.run("import subprocess\nsubprocess.Popen(['sleep', '1000'])\nprint('bg')")
    assert r.ok and r.stdout == "bg\n"
    assert r.exec_s < 60, "the snippet's end waited for its background process"
    assert not any("sleep 1000" in cmd for cmd in processes_of(range(0, 2**32)))
    assert_nothing_left(executor)


def test_setsid_daemon_dies_with_snippet(executor: LocalExecutor) -> None:
    code = HOSTILE["daemon"]
    r = executor.run(code)
    assert r.ok and r.stdout == "parent done\n"
    assert_nothing_left(executor)


def test_fork_bomb_is_contained(executor: LocalExecutor) -> None:
    r = executor.run("import os\nwhile True:\n    os.fork()", timeout_s=5.0)
    assert not r.ok and r.status in ("error", "timeout")
    assert "BlockingIOError" in r.stderr or r.timed_out
    assert executor.run("print('alive')").stdout == "alive\n"
    assert_nothing_left(executor)


def test_memory_bomb_is_contained(executor: LocalExecutor) -> None:
    r = executor.run("x = bytearray(8 << 30)")
    assert r.status == "memory" and not r.ok
    assert r.stderr.rstrip().endswith("MemoryError")
    assert executor.run("print('alive')").stdout == "alive\n"
    assert_nothing_left(executor)


def test_big_file_write_is_contained(executor: LocalExecutor) -> None:
    r = executor.run("f = open('big', 'wb')\nfor _ in range(1024):\n    f.write(b'x' * (1 << 20))")
    assert r.status == "error" and "File too large" in r.stderr
    assert executor.run("print('alive')").stdout == "alive\n"
    assert_nothing_left(executor)


def test_environment_is_allow_listed() -> None:
    os.environ["REDIS_URL"] = "redis://:hunter2@example:6379/0"
    os.environ["CODEPOOL_TEST_SECRET"] = "hunter2"
    try:
        for mode in ("fork", "spawn"):
            with LocalExecutor(
                concurrency=1, mode=mode, preload=(), env={"ASKED_FOR": "yes"}
            ) as ex:
                r = ex.run("import os\nfor k in sorted(os.environ): print(k, os.environ[k])")
                names = {line.split(" ", 1)[0] for line in r.stdout.splitlines()}
                assert r.ok
                assert "hunter2" not in r.stdout
                assert names <= set(ex._env), names - set(ex._env)
                assert "ASKED_FOR yes" in r.stdout
                assert "OPENBLAS_NUM_THREADS 1" in r.stdout
                environ = ex.run("print(open('/proc/1/environ', 'rb').read())")
                assert "hunter2" not in environ.stdout
    finally:
        del os.environ["REDIS_URL"], os.environ["CODEPOOL_TEST_SECRET"]


def test_no_network_even_to_the_host(executor: LocalExecutor) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        r = executor.run(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)\nprint('connected')"
        )
        assert r.status == "error" and "connected" not in r.stdout
        # Landlock refuses the connect (PermissionError) before the empty network
        # namespace would (OSError: network unreachable).
        assert "PermissionError" in r.stderr or "OSError" in r.stderr
    finally:
        listener.close()
    assert_nothing_left(executor)


def test_threads_and_forks_work_in_a_child(executor: LocalExecutor) -> None:
    """The zygote forks without Python's at-fork hooks: threading, locks, a fork and the
    interpreter's exit (which joins non-daemon threads) must still behave."""
    code = (
        "import os, threading, queue\n"
        "q = queue.Queue()\n"
        "ts = [threading.Thread(target=q.put, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "late = threading.Thread(target=lambda: print('late'))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(sorted(q.queue), os.waitstatus_to_exitcode(status),\n"
        "      threading.current_thread() is threading.main_thread())\n"
        "late.start()"
    )
    r = executor.run(code, timeout_s=10.0)
    assert (r.status, r.stdout) == ("ok", "[0, 1, 2, 3] 7 True\nlate\n"), r.stderr
    assert_nothing_left(executor)


def test_exit_waits_for_threads_and_runs_atexit_as_python_does(executor: LocalExecutor) -> None:
    """The child skips threading's shutdown only when it has nothing to do: a thread
    still running is waited for, concurrent.futures' exit hook and the user's atexit
    functions run, a daemon thread does not hold the exit, and a snippet that never
    touched threads exits as plainly as python -c."""
    cases = {
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('late'))).start()\n"
        "print('main')": "main\nlate\n",
        "import atexit, concurrent.futures as cf\n"
        "atexit.register(lambda: print('at exit'))\n"
        "pool = cf.ThreadPoolExecutor(2)\n"
        "print(list(pool.map(abs, [-1, -2])))": "[1, 2]\nat exit\n",
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print('daemon left')": "daemon left\n",
        "import atexit\natexit.register(print, 'bye')\nprint('hi')": "hi\nbye\n",
    }
    for code, expected in cases.items():
        r = executor.run(code, timeout_s=10.0)
        assert (r.status, r.stdout) == ("ok", expected), r.stderr
        assert r.exec_s < 5.0  # the daemon thread's sleep was not waited for
    assert_nothing_left(executor)


def test_randomness_is_fresh_per_snippet(executor: LocalExecutor) -> None:
    plain = "import random\nprint(random.random())"
    # The preloading zygote imported random and numpy.random: each child reseeds both
    # (their cached gaussians too), as a fresh interpreter would have seeded them.
    preloaded = (
        "import numpy, random\n"
        "print(random.random(), random.gauss(0, 1), numpy.random.random(),"
        " numpy.random.standard_normal())"
    )
    for code in (plain, preloaded):
        results = executor.run_many([code] * 5)
        outputs = [r.stdout for r in results]
        assert all(r.ok for r in results) and len(set(outputs)) == 5, outputs
    assert_nothing_left(executor)


def test_the_waiting_childs_warm_up_leaves_no_trace(executor: LocalExecutor) -> None:
    # A forked child compiles and runs a small snippet while it waits for its request
    # (runtime.warm_up); the snippet then finds what a fresh interpreter would (spawn
    # mode runs none), whichever zygote it comes from.
    code = (
        "import sys, builtins\n"
        "print(sorted(globals()), 'value' in vars(builtins), len(sys.modules['linecache'].cache))"
    )
    fresh = "['__annotations__', '__builtins__', '__doc__', '__loader__', '__name__', '__package__'"
    fresh += ", '__spec__'"
    plain, heavy = executor.run_many([code, "import numpy\n" + code])
    assert plain.stdout == fresh + ", 'builtins', 'sys'] False 0\n", plain
    assert heavy.stdout == fresh + ", 'builtins', 'numpy', 'sys'] False 0\n", heavy


def test_generators_are_reseeded_in_c_where_their_layout_checks_out() -> None:
    with LocalExecutor(concurrency=1, mode="fork", preload=("numpy",)) as ex:
        line = _child_setup_line(ex)
        if not line.startswith("in C"):
            pytest.skip(f"children are set up in Python here: {line}")
        assert "reseeded in Python" not in line, line


def test_files_do_not_survive_the_snippet(executor: LocalExecutor) -> None:
    write = (
        "import os\n"
        "for path in ('here.txt', '/tmp/t.txt', '/var/tmp/v.txt', '/dev/shm/s.txt'):\n"
        "    open(path, 'w').write('x')\n"
        "print(sorted(os.listdir('.')))"
    )
    assert executor.run(write).stdout == "['here.txt']\n"
    check = (
        "import os\n"
        "print([os.path.exists(p) for p in ('here.txt', '/tmp/t.txt', '/var/tmp/v.txt', "
        "'/dev/shm/s.txt')], os.listdir('.'))"
    )
    assert executor.run(check).stdout == "[False, False, False, False] []\n"
    for path in ("/tmp/t.txt", "/var/tmp/v.txt", "/dev/shm/s.txt"):
        assert not os.path.exists(path)
    r = executor.run("open('/etc/codepool-was-here', 'w')")
    assert r.status == "error" and not os.path.exists("/etc/codepool-was-here")
    assert_nothing_left(executor)


def test_input_sees_eof(executor: LocalExecutor) -> None:
    r = executor.run("input()")
    assert r.status == "error" and r.stderr.endswith("EOFError: EOF when reading a line\n")
    assert_nothing_left(executor)


def test_segfault_is_a_signal(executor: LocalExecutor) -> None:
    r = executor.run("import ctypes\nctypes.string_at(0)")
    assert (r.returncode, r.status, r.signal, r.ok) == (-11, "signal", 11, False)
    assert executor.run("print('alive')").stdout == "alive\n"
    assert_nothing_left(executor)


def test_invalid_utf8_output_is_replaced(executor: LocalExecutor) -> None:
    r = executor.run("import sys\nsys.stdout.buffer.write(b'a\\xff\\xfeb\\n')")
    assert r.ok and r.stdout == "a\ufffd\ufffdb\n"
    assert_nothing_left(executor)


def test_executor_is_unreachable_from_the_snippet(executor: LocalExecutor) -> None:
    code = (
        "import os, signal\n"
        "print(os.getppid(), os.getpid())\n"
        "for target in (os.getppid(), 0, -1):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__)\n"
    )
    pids_before = (executor.supervisor_pid, executor.zygote_pid)
    restarts_before = executor.restarts  # the executor is the module's: others ran on it
    r = executor.run(code)
    assert r.stdout.startswith("0 1\n")
    for pid in pids_before:
        os.kill(pid, 0)  # still alive
    assert (executor.supervisor_pid, executor.zygote_pid) == pids_before
    assert executor.restarts == restarts_before
    assert executor.run("print('alive')").stdout == "alive\n"
    pids = executor.run(
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    assert pids.stdout == "[1]\n"
    assert_nothing_left(executor)


def test_only_stdio_and_the_done_pipe_are_open(executor: LocalExecutor) -> None:
    r = executor.run(
        "import os, stat\n"
        "fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
        "print(fds)\n"
        "if 4 in fds:\n"
        "    print(stat.S_ISFIFO(os.fstat(4).st_mode), os.get_blocking(4))\n"
        "    os.read(4, 1)\n"
    )
    # listdir itself holds one fd open while it reads the directory. fd 4 is the done
    # pipe's write end (worker/engine/done.py), which cannot be read.
    assert r.stdout == "[0, 1, 2, 3, 4]\nTrue False\n"
    assert r.stderr.rstrip().endswith("OSError: [Errno 9] Bad file descriptor")
    assert_nothing_left(executor)


@needs_root
def test_runs_as_unprivileged_uid(executor: LocalExecutor) -> None:
    r = executor.run("import os\nprint(os.getuid(), os.geteuid(), os.getgroups())")
    uid, euid, groups = r.stdout.split(" ", 2)
    assert int(uid) in executor.snippet_uids and int(euid) == int(uid)
    assert groups.strip() == "[]"
    assert executor.run("import os\nos.listdir('/root')\nopen('/root/x', 'w')").status == "error"
    assert_nothing_left(executor)


def test_stdlib_and_venv_imports_work(executor: LocalExecutor) -> None:
    r = executor.run("import json, decimal, fractions, sqlite3, msgpack\nprint(json.dumps([1]))")
    assert r.ok, r.stderr
    assert r.stdout == "[1]\n"
    assert_nothing_left(executor)


def test_bad_input_is_rejected_or_an_error(executor: LocalExecutor) -> None:
    for bad in (b"print(1)", None, 42, ["print(1)"]):
        r = executor.run(bad)
        assert r.status == "rejected" and "code must be str" in r.stderr
    oversize = executor.run("#" * (256 * 1024 + 1))
    assert oversize.status == "rejected" and "limit" in oversize.stderr
    nul = executor.run("print(1)\0")
    assert nul.status == "error" and "null bytes" in nul.stderr
    surrogate = executor.run("print('\udc80')")
    # As ``python -c`` words a command that is no UTF-8 (tests/differential has the rest).
    assert surrogate.status == "error" and "surrogates not allowed" in surrogate.stderr
    assert executor.run("print('alive')").stdout == "alive\n"
    assert_nothing_left(executor)


def test_run_many_keeps_order_and_concurrency_cap(executor: LocalExecutor) -> None:
    codes = [f"import time\ntime.sleep(0.3)\nprint({i})" for i in range(6)]
    started = time.monotonic()
    results = executor.run_many(codes)
    elapsed = time.monotonic() - started
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert elapsed >= 0.9, "6 x 0.3 s on 2 slots cannot finish in under 0.9 s"
    assert_nothing_left(executor)


def test_straggler_holds_one_slot_only(executor: LocalExecutor) -> None:
    slow = executor.submit("import time\ntime.sleep(3)\nprint('slow')")
    fast = executor.run_many(["print('fast')"] * 10)
    assert all(r.stdout == "fast\n" for r in fast)
    assert not slow.done(), "the fast ones waited for the straggler's slot"
    assert slow.result().stdout == "slow\n"
    assert_nothing_left(executor)


def test_cancel_drops_a_waiting_snippet_and_kills_a_running_one(executor: LocalExecutor) -> None:
    sleeper = "import time\ntime.sleep(60)"
    running = [executor.submit(sleeper, timeout_s=120) for _ in range(executor.concurrency)]
    waiting = executor.submit(sleeper, timeout_s=120)
    wait_until(lambda: len(sleeping(executor)) == executor.concurrency, what="the slots full")
    assert executor.cancel(waiting) and executor.cancel(running[0])
    assert waiting.result(timeout=30).status == "cancelled"
    assert running[0].result(timeout=30).status == "cancelled"
    # Its slot is free at once: the next snippet runs while the other sleepers sleep.
    assert executor.run("print('next')", timeout_s=30).stdout == "next\n"
    for future in running[1:]:
        assert executor.cancel(future)
        assert future.result(timeout=30).status == "cancelled"
    assert not executor.cancel(running[0])  # resolved already
    assert_nothing_left(executor)


def sleeping(executor: LocalExecutor) -> list[int]:
    """Snippet processes below the supervisor in a timed sleep."""
    return [pid for pid in descendants(executor.supervisor_pid) if "nanosleep" in wchan(pid)]


def wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read()
    except OSError:
        return ""


def test_many_threads_at_once(executor: LocalExecutor) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: executor.run(f"print({i} * 2)"), range(64)))
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(64)]
    assert_nothing_left(executor)


def test_cpu_rusage_is_reported(executor: LocalExecutor) -> None:
    r = executor.run("x = 0\nfor i in range(3 * 10**6):\n    x += i")
    assert r.ok and r.cpu_s > 0.05 and r.max_rss_kb > 0
    assert_nothing_left(executor)


def test_limits_are_clamped_and_validated() -> None:
    import pytest

    from codepool.common import ConfigError, Limits

    with LocalExecutor(
        concurrency=1, mode="fork", preload=(), max_limits=Limits(timeout_s=1.0)
    ) as ex:
        r = ex.run("while True: pass", timeout_s=60.0)
        assert r.timed_out and r.exec_s < 30, "the 60 s asked for was not clamped to 1 s"
        with pytest.raises(ConfigError):
            ex.run("print(1)", timeout_s=-1)
        with pytest.raises(ConfigError):
            ex.run("print(1)", no_such_limit=1)


@pytest.mark.parametrize("victim", ["zygote", "supervisor"])
def test_zygote_death_reruns_in_flight_snippets(victim: str) -> None:
    with LocalExecutor(concurrency=2, mode="fork", preload=()) as ex:
        first = ex.zygote_pid if victim == "zygote" else ex.supervisor_pid
        future = ex.submit("import time\nprint('started', flush=True)\ntime.sleep(1)")
        wait_until(lambda: _snippet_output_started(ex), what="the snippet running")
        os.kill(first, 9)
        r = future.result(timeout=30)
        assert r.stdout == "started\n" and r.ok
        assert ex.restarts == 1 and first not in (ex.zygote_pid, ex.supervisor_pid)
        assert ex.run("print(2 + 3)").stdout == "5\n"
        assert processes_of(ex.snippet_uids, except_children_of=ex.supervisor_pid) == []


def test_snippet_killing_zygote_twice_gets_infra() -> None:
    # A snippet in flight during two zygote deaths is given up on, not retried forever.
    with LocalExecutor(concurrency=1, mode="fork", preload=()) as ex:
        future = ex.submit("import time\nprint('started', flush=True)\ntime.sleep(5)")
        for _ in range(2):
            wait_until(lambda: _snippet_output_started(ex), what="the snippet running")
            before = ex.restarts
            os.kill(ex.zygote_pid, 9)
            wait_until(lambda n=before: ex._sock is not None and ex.restarts > n, timeout_s=30)
        r = future.result(timeout=30)
        assert r.status == "infra" and not r.ok
        assert ex.run("print('ok')").stdout == "ok\n"


def _snippet_output_started(ex: LocalExecutor) -> bool:
    """True once a running snippet has written to its stdout file (a memfd the
    supervisor holds): it is past its set-up and running user code."""
    fd_dir = f"/proc/{ex.supervisor_pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False  # the supervisor is gone or not yet there
    for fd in fds:
        try:
            if "memfd:stdout" in os.readlink(f"{fd_dir}/{fd}"):
                if os.stat(f"{fd_dir}/{fd}").st_size > 0:
                    return True
        except OSError:
            continue  # closed meanwhile
    return False


def test_closed_executor_leaves_no_zygote() -> None:
    ex = LocalExecutor(concurrency=1, mode="fork", preload=())
    pids = (ex.supervisor_pid, ex.zygote_pid)
    ex.close()
    wait_until(
        lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids),
        what="the supervisor and zygote gone",
    )


def test_no_fd_leak_across_many_snippets(executor: LocalExecutor) -> None:
    before = len(os.listdir("/proc/self/fd"))
    executor.run_many(["print(1)"] * 50)
    assert len(os.listdir("/proc/self/fd")) <= before + 2
    assert_nothing_left(executor)


def _child_setup_line(ex: LocalExecutor) -> str:
    (line,) = [p["detail"] for p in ex.report if p["name"] == "child set-up"]
    return str(line)


def test_children_are_set_up_in_c_where_a_compiler_was() -> None:
    """The C set-up is what a user gets by default wherever the install could build it
    (CI has a compiler): a silently failed build would otherwise cost every snippet."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if not (compiler and headers):
        pytest.skip("no C compiler or Python headers here: the Python steps are expected")
    with LocalExecutor(concurrency=1, mode="fork", preload=()) as ex:
        assert _child_setup_line(ex).startswith("in C"), _child_setup_line(ex)
        assert ex.run("print(2 + 3)").stdout == "5\n"
    with LocalExecutor(concurrency=1, mode="fork", preload=(), native_child=False) as ex:
        assert _child_setup_line(ex) == (
            "in Python, about 1 ms more CPU per snippet: "
            "disabled by configuration (native_child=False)"
        )
        assert ex.run("print(2 + 3)").stdout == "5\n"
