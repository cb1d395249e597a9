"""`codepool worker` flags and `codepool run`, each seen to change what a snippet meets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from codepool.common.settings import Settings
from codepool.producer import CodePool
from tests.conftest import StartWorker


def test_queue_flag_serves_that_queue(redis_url: str, start_worker: StartWorker) -> None:
    start_worker("--queue", "flags-q", name="on-flags-q")
    pool = CodePool(settings=Settings.from_env(redis_url=redis_url).replace(queue="flags-q"))
    results = pool.submit(["print(6 * 7)"] * 3).results(timeout_s=30)
    assert [(r.stdout, r.worker) for r in results] == [("42\n", "on-flags-q")] * 3


def test_mode_spawn_runs_a_fresh_interpreter(redis_url: str, start_worker: StartWorker) -> None:
    start_worker("--mode", "spawn")
    # Spawned as the reference runs snippets (python -B -c), from no zygote.
    code = (
        "import sys\nprint('numpy' in sys.modules, 'codepool.worker.engine.zygote' in sys.modules)"
    )
    r = CodePool(redis_url).submit([code]).results(timeout_s=60)[0]
    assert (r.status, r.stdout, r.zygote) == ("ok", "False False\n", ""), r


def test_max_timeout_clamps_what_a_batch_asks(redis_url: str, start_worker: StartWorker) -> None:
    start_worker("--max-timeout", "1")
    r = CodePool(redis_url).submit(["while True: pass"], timeout_s=30).results(timeout_s=60)[0]
    assert r.timed_out and r.exec_s < 15, "30 s was asked for; the worker allows 1"


def test_max_cpu_s_clamps_the_cpu_limit(redis_url: str, start_worker: StartWorker) -> None:
    start_worker("--max-cpu-s", "1")
    batch = CodePool(redis_url).submit(["while True: pass"], timeout_s=60, cpu_s=30)
    r = batch.results(timeout_s=120)[0]
    assert (r.timed_out, r.limit) == (False, "cpu_time"), r
    assert r.cpu_s < 15, "30 s was asked for; the worker allows 1 (and SIGKILL at 2)"


def test_a_worker_starts_under_a_tmpdir_too_long_for_a_socket(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    long_tmp = tmp_path / ("d" * 80)
    long_tmp.mkdir()
    start_worker(env={"TMPDIR": str(long_tmp)})  # waits for its dispatchers
    assert CodePool(redis_url).submit(["print(1)"]).results(timeout_s=30)[0].stdout == "1\n"


def test_codepool_run_prints_the_tool_text() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "codepool.ops.cli", "run", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    ok = run("-c", "print(2 + 3)")
    header, output = ok.stdout.strip().splitlines()
    assert ok.returncode == 0 and "(ok," in header and output == "5", ok.stdout + ok.stderr
    failed = run("-c", "1/0")
    assert "ZeroDivisionError: division by zero" in failed.stdout, failed.stdout + failed.stderr
