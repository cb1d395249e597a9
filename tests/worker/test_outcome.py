"""The one classification of a run: status and the limit that stopped it, from the
supervisor's facts (exit status, deadline, CPU used) and the final exception."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from codepool.common.result import LIMITS
from codepool.worker.engine.outcome import classify, exception_limit


def _traceback(last: str) -> str:
    return f'Traceback (most recent call last):\n  File "<sandbox>", line 1, in <module>\n{last}\n'


def _classify(**given: Any) -> tuple[str, str | None]:
    facts: dict[str, Any] = dict(
        returncode=1, timed_out=False, stderr="", truncated=False, cpu_s=0.1, cpu_rlimit_s=5
    )
    return classify(**(facts | given))


@pytest.mark.parametrize(
    ("last_line", "limit"),
    [
        ("MemoryError", "memory"),
        ("numpy._core._exceptions._ArrayMemoryError: Unable to allocate 74.5 GiB", "memory"),
        ("OSError: [Errno 12] Cannot allocate memory", "memory"),
        ("OSError: [Errno 27] File too large", "file_size"),
        ("OSError: [Errno 27] File too large: 'out.txt'", "file_size"),
        ("BlockingIOError: [Errno 11] Resource temporarily unavailable", "processes"),
        ("RuntimeError: can't start new thread", "processes"),
        ("ZeroDivisionError: division by zero", None),
        ("PermissionError: [Errno 13] Permission denied: '/etc/x'", None),
        ("ValueError: [Errno 27] not an OSError", None),
        ("RuntimeError: something else", None),
    ],
)
def test_the_final_exception_names_the_limit(last_line: str, limit: str | None) -> None:
    assert exception_limit(_traceback(last_line)) == limit
    status = "memory" if limit == "memory" else "error"
    assert _classify(stderr=_traceback(last_line)) == (status, limit)


def test_only_the_final_exception_counts() -> None:
    chained = (
        _traceback("MemoryError")
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + _traceback("KeyError: 'k'")
    )
    assert _classify(stderr=chained) == ("error", None)
    noted = _traceback("OSError: [Errno 27] File too large") + "a note added to it\n"
    assert _classify(stderr=noted) == ("error", "file_size")


def test_a_snippet_that_exits_0_was_stopped_by_no_limit() -> None:
    caught = "Traceback (most recent call last):\n" + _traceback("MemoryError")
    assert _classify(returncode=0, stderr=caught) == ("ok", None)


def test_the_wall_clock_wins_over_everything() -> None:
    got = _classify(
        returncode=None, timed_out=True, stderr=_traceback("MemoryError"), truncated=True
    )
    assert got == ("timeout", "wall_time")


@pytest.mark.parametrize("signum", [signal.SIGXCPU, signal.SIGKILL])
def test_a_kill_at_the_cpu_limit_is_the_cpu_limit(signum: int) -> None:
    assert _classify(returncode=-signum, cpu_s=5.0, cpu_rlimit_s=5) == ("signal", "cpu_time")
    # wait4 counts short of the kernel on a loaded host (0.90 s at a 1 s limit, seen).
    assert _classify(returncode=-signum, cpu_s=0.9, cpu_rlimit_s=1) == ("signal", "cpu_time")
    assert _classify(returncode=-signal.SIGSEGV, cpu_s=9.0, cpu_rlimit_s=5) == ("signal", None)


def test_a_sigkill_far_below_the_cpu_limit_came_from_elsewhere() -> None:
    assert _classify(returncode=-signal.SIGKILL, cpu_s=0.2, cpu_rlimit_s=5) == ("signal", None)


def test_the_output_cap_is_named_only_when_no_limit_stopped_the_snippet() -> None:
    assert _classify(returncode=0, truncated=True) == ("ok", "output")
    assert _classify(stderr=_traceback("KeyError: 'k'"), truncated=True) == ("error", "output")
    both = _classify(stderr=_traceback("OSError: [Errno 27] File too large"), truncated=True)
    assert both == ("error", "file_size")


def test_every_limit_has_its_name_in_limits() -> None:
    named = {
        _classify(returncode=None, timed_out=True)[1],
        _classify(returncode=-signal.SIGXCPU, cpu_s=5.0)[1],
        _classify(stderr=_traceback("MemoryError"))[1],
        _classify(returncode=0, truncated=True)[1],
        _classify(stderr=_traceback("OSError: [Errno 27] File too large"))[1],
        _classify(stderr=_traceback("RuntimeError: can't start new thread"))[1],
    }
    assert named == set(LIMITS)
