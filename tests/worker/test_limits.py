"""Claims the README makes about every child that had no test of their own: its rlimits,
its IPC namespace, ``__main__`` and ``pass_env``."""

from __future__ import annotations

import os

import pytest

from codepool.worker import LocalExecutor
from tests.conftest import assert_nothing_left


def test_rlimits_are_the_ones_asked_for(executor: LocalExecutor) -> None:
    code = (
        "import resource as r\n"
        "print(r.getrlimit(r.RLIMIT_CPU), r.getrlimit(r.RLIMIT_NOFILE), r.getrlimit(r.RLIMIT_CORE))"
    )
    out = executor.run(code, cpu_s=2.0).stdout
    assert out == "(2, 3) (256, 256) (0, 0)\n", out
    assert_nothing_left(executor)


def test_a_cpu_hog_is_stopped_by_its_cpu_limit_before_its_timeout(
    executor: LocalExecutor,
) -> None:
    r = executor.run("while True: pass", cpu_s=1.0, timeout_s=20.0)
    assert not r.timed_out and r.status == "signal" and r.returncode in (-24, -9), r
    assert r.limit == "cpu_time"
    # SIGXCPU is the kernel's own word that the limit was reached: it holds RLIMIT_CPU to
    # the CPU it samples by ticks, which on a loaded machine runs ahead of the runtime
    # rusage reports (0.8 s at a 1-s limit at load 60). A SIGKILL says nothing by itself.
    assert r.returncode == -24 or r.cpu_s >= 0.9, r
    # A handler for SIGXCPU only defers the hard limit's SIGKILL, a second later.
    code = "import signal\nsignal.signal(signal.SIGXCPU, lambda *_: None)\nwhile True: pass"
    r = executor.run(code, cpu_s=1.0, timeout_s=20.0)
    assert (r.status, r.returncode, r.limit) == ("signal", -9, "cpu_time"), r
    assert_nothing_left(executor)


# -- which limit stopped it (ExecResult.limit, classified in worker/engine/outcome.py) ---


def test_the_wall_clock_is_named(executor: LocalExecutor) -> None:
    r = executor.run("import time\ntime.sleep(60)", timeout_s=0.5)
    assert (r.status, r.timed_out, r.limit) == ("timeout", True, "wall_time"), r
    assert_nothing_left(executor)


def test_the_memory_limit_is_named(executor: LocalExecutor) -> None:
    r = executor.run("x = bytearray(512 << 20)", memory_mb=128)
    assert (r.status, r.limit) == ("memory", "memory"), r
    # An address space too small for a mapping: ENOMEM, not a MemoryError.
    r = executor.run("import mmap\nm = mmap.mmap(-1, 512 << 20)", memory_mb=128)
    assert (r.status, r.limit) == ("memory", "memory"), r
    assert r.stderr.endswith("OSError: [Errno 12] Cannot allocate memory\n")
    assert_nothing_left(executor)


def test_the_file_size_limit_is_named(executor: LocalExecutor) -> None:
    r = executor.run("open('big', 'wb').write(b'x' * (2 << 20))", max_file_mb=1)
    assert (r.status, r.limit) == ("error", "file_size"), r
    # stdout is a file too: the cap on what is kept cut it, the file size stopped it.
    r = executor.run("import sys\nsys.stdout.write('x' * (2 << 20))", max_file_mb=1)
    assert (r.status, r.limit, r.truncated) == ("error", "file_size", True), r
    assert_nothing_left(executor)


# Children that wait until the snippet is gone (their pipe's write end closes with it).
FORKS = (
    "import os\nr, w = os.pipe()\nfor _ in range(64):\n"
    "    if os.fork() == 0:\n        os.close(w)\n        os.read(r, 1)\n        os._exit(0)"
)
THREADS = (
    "import threading\nhold = threading.Event()\nfor _ in range(64):\n"
    "    threading.Thread(target=hold.wait, daemon=True).start()"
)


@pytest.mark.parametrize("code", [FORKS, THREADS], ids=["fork", "thread"])
def test_the_process_cap_is_named(executor: LocalExecutor, code: str) -> None:
    r = executor.run(code, max_procs=4, memory_mb=1024)
    assert (r.status, r.limit) == ("error", "processes"), r
    assert_nothing_left(executor)


def test_the_output_cap_is_named_when_no_other_limit_stopped_it(executor: LocalExecutor) -> None:
    r = executor.run("print('x' * 5000)", max_output_chars=100)
    assert (r.status, r.truncated, r.limit) == ("ok", True, "output"), r
    r = executor.run("print('x' * 5000)\n1 / 0", max_output_chars=100)
    assert (r.status, r.truncated, r.limit) == ("error", True, "output"), r
    assert_nothing_left(executor)


def test_no_limit_is_named_when_none_was_reached(executor: LocalExecutor) -> None:
    for code in ("print(1)", "1 / 0", "import sys\nsys.exit(3)"):
        assert executor.run(code).limit is None, code
    # What a snippet caught and survived did not stop it.
    caught = "try:\n    x = bytearray(512 << 20)\nexcept MemoryError:\n    print('caught')"
    r = executor.run(caught, memory_mb=128)
    assert (r.status, r.stdout, r.limit) == ("ok", "caught\n", None), r


def test_open_files_are_capped(executor: LocalExecutor) -> None:
    code = (
        "fs = []\ntry:\n    for _ in range(1000):\n        fs.append(open('/dev/null'))\n"
        "except OSError as e:\n    print(len(fs), e.errno)"
    )
    opened, errno = executor.run(code).stdout.split()
    assert 240 <= int(opened) < 256 and errno == "24"  # EMFILE
    assert_nothing_left(executor)


def test_each_snippet_has_an_ipc_namespace_of_its_own(executor: LocalExecutor) -> None:
    if not executor.report or not any(
        line["name"] == "ipc" and line["active"] for line in executor.report
    ):
        pytest.skip("no IPC namespace on this host (doctor says so)")
    code = "import os\nprint(os.readlink('/proc/self/ns/ipc'))"
    first, second = executor.run(code).stdout, executor.run(code).stdout
    assert first != second and first.strip() != os.readlink("/proc/self/ns/ipc")
    assert_nothing_left(executor)


def test_the_snippet_is_main(executor: LocalExecutor) -> None:
    r = executor.run("if __name__ == '__main__':\n    print('main', __name__)")
    assert r.stdout == "main __main__\n"
    assert_nothing_left(executor)


def test_pass_env_copies_only_what_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEPOOL_PASSED", "yes")
    monkeypatch.setenv("CODEPOOL_NOT_PASSED", "no")
    with LocalExecutor(concurrency=1, preload=(), pass_env=("CODEPOOL_PASSED",)) as ex:
        code = (
            "import os\ne = os.environ\n"
            "print(e.get('CODEPOOL_PASSED'), e.get('CODEPOOL_NOT_PASSED'))"
        )
        assert ex.run(code).stdout == "yes None\n"
