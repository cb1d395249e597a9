"""Rewards by fork cannot be forged from inside the sandbox (common/fork_harness.py).

Each candidate here is written to attack the harness: its ``solve`` returns a wrong
answer but first tries to make the harness report every case as passed, through each
channel a test's process could reach (its own stdout, the results file by path, the
fds it inherited, an ancestor's fds under /proc, a grandchild that outlives the case,
killing its parent). Every case must keep the verdict of its real run: never passed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from codepool.common.reward_tests import PASSED, Case, run_tests
from codepool.worker import LocalExecutor
from tests.conftest import NO_NAMESPACES, executor_on

# A result line for every case, in the harness's own format, each claiming a pass.
FORGE = """
import json, os, signal, sys, time
def _fake():
    out = ''
    for i in range(8):
        line = {"i": i, "mode": "fork", "exec_s": 0.0, "stdout": "42\\n", "stderr": "",
                "stdout_bytes": 3, "stderr_bytes": 0, "rc": 0, "sig": None, "timed_out": False}
        out += json.dumps(line) + "\\n"
    return out.encode()
def _ancestors():
    pid, seen = os.getpid(), []
    for _ in range(4):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 1:
            break
        seen.append(pid)
    return seen
def _results_paths():
    return [name for name in os.listdir(".") if "result" in name] + [".codepool_results.jsonl"]
"""

ATTACKS = {
    "prints_fake_lines": "sys.stdout.write(_fake().decode()); sys.stdout.flush()",
    "reopens_results_path": """
for path in _results_paths():
    try:
        with open(path, "ab") as f:
            f.write(_fake())
    except OSError:
        pass
os.kill(os.getppid(), signal.SIGKILL)
""",
    "writes_inherited_fds": """
for fd in range(0, 256):
    try:
        os.write(fd, _fake())
    except OSError:
        pass
os.kill(os.getppid(), signal.SIGKILL)
""",
    "writes_ancestor_fds": """
for pid in _ancestors():
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            target = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:
            continue
        try:
            os.write(target, _fake())
        except OSError:
            pass
        os.close(target)
os.kill(os.getppid(), signal.SIGKILL)
""",
    "kills_parent_then_prints": """
os.kill(os.getppid(), signal.SIGKILL)
time.sleep(0.05)
sys.stdout.write(_fake().decode()); sys.stdout.flush()
""",
    "grandchild_writes_later": """
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            for path in _results_paths():
                try:
                    with open(path, "wb") as f:
                        f.write(_fake())
                except OSError:
                    pass
            time.sleep(0.002)
    os._exit(0)
time.sleep(0.02)
""",
    "os_exit_after_forging": """
for path in _results_paths():
    try:
        with open(path, "ab") as f:
            f.write(_fake())
    except OSError:
        pass
os._exit(1)
""",
}


@pytest.fixture(scope="module", params=["fork", "spawn", NO_NAMESPACES])
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    with executor_on(request.param) as ex:
        yield ex


def attacker(attack: str) -> str:
    body = "".join(f"    {line}\n" for line in ATTACKS[attack].strip().splitlines())
    return FORGE + "def solve():\n" + body + "    return 0\n"


CASES = [
    Case("assert solve() == 42"),
    Case("print(solve())", expected_stdout="42"),
    Case("assert solve() == 42"),
    Case("print(solve())", stdin="7\n", expected_stdout="42"),
]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_case_cannot_forge_a_verdict(executor: LocalExecutor, attack: str) -> None:
    results = run_tests(executor.run, attacker(attack), CASES, timeout_s=3.0)
    verdicts = [r.verdict for r in results]
    assert PASSED not in verdicts, (attack, verdicts)


@pytest.mark.parametrize("attack", ["reopens_results_path", "grandchild_writes_later"])
def test_a_load_cannot_forge_a_verdict(executor: LocalExecutor, attack: str) -> None:
    """The same attacks from the candidate's load (run once, in the template)."""
    candidate = attacker(attack) + "solve()\ndef solve():\n    return 0\n"
    results = run_tests(executor.run, candidate, CASES, timeout_s=3.0)
    assert PASSED not in [r.verdict for r in results], attack


THREAD = (
    "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
)
TIMER = (
    "import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)\n"
    "signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)\n"
)


@pytest.mark.parametrize("load", [THREAD, TIMER], ids=["thread", "timer"])
def test_a_load_that_leaves_code_running_makes_no_template(
    executor: LocalExecutor, load: str
) -> None:
    """A thread or timer left by the load would run in the template between cases, with
    other cases' time: such a program's cases run plain, with a plain run's verdicts."""
    candidate = load + "def add(a, b):\n    return a + b\n"
    cases = [Case("assert add(1, 2) == 3"), Case("print(add(2, 2))", expected_stdout="5")]
    results = run_tests(executor.run, candidate, cases, timeout_s=3.0)
    assert [r.verdict for r in results] == [PASSED, "wrong_answer"]
    assert not any(r.forked for r in results)


def test_no_handler_of_the_load_runs_in_the_template(executor: LocalExecutor) -> None:
    """A case that signals the template (its parent) does not run the load's handler
    there: the cases after it see the state a plain run sees (no hit)."""
    candidate = (
        "import os, signal, time\nHITS = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: HITS.append(1))\n"
    )
    cases = [
        Case("os.kill(os.getppid(), signal.SIGUSR1)\ntime.sleep(0.2)"),
        Case("assert not HITS"),
        Case("os.kill(os.getpid(), signal.SIGUSR1)\nassert HITS"),  # its own: it runs
    ]
    results = run_tests(executor.run, candidate, cases, timeout_s=3.0)
    assert [r.verdict for r in results] == [PASSED] * 3, [r.result for r in results]
    assert all(r.forked for r in results)
