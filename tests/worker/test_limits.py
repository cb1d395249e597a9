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
    assert r.cpu_s >= 0.9
    assert_nothing_left(executor)


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
