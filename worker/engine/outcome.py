"""How a finished child's run is classified: its ``status`` and the ``limit`` that
stopped it (ExecResult), in one place; and the result it makes (``finished_record``),
the same for a snippet and a context's call.

What the supervisor knows of a run is what the reference sandbox would know (the exit
status, whether the deadline killed it, the output) plus the CPU time wait4 counted.
A limit that makes a system call fail (address space, file size, processes) shows only
as the exception the snippet died of, so those are read off the final exception of its
traceback, as the ``memory`` status always was; the wall clock and the CPU limit are
read off the supervisor's own facts.
"""

from __future__ import annotations

import builtins
import errno
import re
import signal
from typing import Any

from codepool.common.error_types import final_exception
from codepool.common.limits import Limits
from codepool.common.result import LIMITS
from codepool.worker.engine import readback

WALL_TIME, CPU_TIME, MEMORY, OUTPUT, FILE_SIZE, PROCESSES = LIMITS
# An OSError's errno as Python words it: "[Errno 27] File too large".
_ERRNO = re.compile(r"\[Errno (\d+)\]")
_ERRNO_LIMITS = {errno.ENOMEM: MEMORY, errno.EFBIG: FILE_SIZE, errno.EAGAIN: PROCESSES}
# What threading says when the thread cannot be created (clone's EAGAIN at the process
# cap; glibc says the same when the stack's mapping does not fit the address space).
_NO_THREAD = "can't start new thread"
# wait4's CPU seconds fall short of the kernel's count that fired the limit (0.98 s at a
# 1 s limit, seen here; 0.90 s on a host loaded five times over), and the hard limit's
# SIGKILL comes a second after the soft one: at least this share of the soft limit.
_CPU_SHARE_AT_LIMIT = 0.5


def classify(
    *,
    returncode: int | None,
    timed_out: bool,
    stderr: str,
    truncated: bool,
    cpu_s: float,
    cpu_rlimit_s: int,
) -> tuple[str, str | None]:
    """``(status, limit)`` of a run that got as far as running the snippet.

    returncode: the exit code, ``-N`` when killed by signal N (``None`` when timed out);
    truncated: the output cap cut stdout or stderr; cpu_s: CPU seconds it used (wait4
    or its done notice); cpu_rlimit_s: its RLIMIT_CPU soft limit, in seconds.
    """
    limit = _stopping_limit(returncode, timed_out, stderr, cpu_s, cpu_rlimit_s)
    if limit is None and truncated:
        limit = OUTPUT
    return _status(returncode, timed_out, limit), limit


def finished_record(
    *,
    out_fd: int,
    err_fd: int,
    limits: Limits,
    returncode: int,
    timed_out: bool,
    cpu_s: float,
    max_rss_kb: int,
    queue_s: float,
    exec_s: float,
) -> dict[str, Any]:
    """The result (ExecResult's fields) of a run that got as far as running its code, a
    snippet's or a context's call alike: its output files read back, each cut to its
    last ``limits.max_output_chars``, and its end classified.

    returncode: the exit code, ``-N`` when killed by signal N; cpu_s: CPU seconds it
    used; queue_s, exec_s: seconds it waited for a slot and ran.
    """
    stdout, out_cut = readback.read_tail(out_fd, limits.max_output_chars)
    stderr, err_cut = readback.read_tail(err_fd, limits.max_output_chars)
    rc = None if timed_out else returncode
    status, limit = classify(
        returncode=rc,
        timed_out=timed_out,
        stderr=stderr,
        truncated=out_cut or err_cut,
        cpu_s=cpu_s,
        cpu_rlimit_s=limits.cpu_rlimit_s,
    )
    return {
        "ok": rc == 0,
        "stdout": stdout,
        "stderr": stderr,
        "returncode": rc,
        "timed_out": timed_out,
        "latency": queue_s + exec_s,
        "status": status,
        "signal": -returncode if returncode < 0 and not timed_out else None,
        "truncated": out_cut or err_cut,
        "exec_s": exec_s,
        "queue_s": queue_s,
        "cpu_s": cpu_s,
        "max_rss_kb": max_rss_kb,
        "limit": limit,
    }


def _stopping_limit(
    returncode: int | None, timed_out: bool, stderr: str, cpu_s: float, cpu_rlimit_s: int
) -> str | None:
    if timed_out:
        return WALL_TIME
    if returncode is None or returncode == 0:
        return None
    # SIGXCPU at the soft limit; SIGKILL at the hard one, a second later, where SIGXCPU
    # is caught or ignored, and always for a PID namespace's init (the kernel spares it
    # SIGXCPU). For a SIGKILL, the CPU used tells the limit's from any other.
    if returncode == -signal.SIGXCPU:
        return CPU_TIME
    if returncode == -signal.SIGKILL and cpu_s >= cpu_rlimit_s * _CPU_SHARE_AT_LIMIT:
        return CPU_TIME
    return exception_limit(stderr)


def exception_limit(stderr: str) -> str | None:
    """The limit the final exception of ``stderr`` says was reached, or ``None``:
    a MemoryError (numpy's too) or ENOMEM is the memory limit, EFBIG the file size
    limit, EAGAIN (a fork refused) or a thread that cannot start the process cap."""
    final = final_exception(stderr)
    if final is None:
        return None
    name, message = final
    if "MemoryError" in name:
        return MEMORY
    if name == "RuntimeError" and message.startswith(_NO_THREAD):
        return PROCESSES
    match = _ERRNO.match(message)
    if match is None or not _is_os_error(name):
        return None
    return _ERRNO_LIMITS.get(int(match[1]))


def _is_os_error(name: str) -> bool:
    kind = getattr(builtins, name, None)
    return isinstance(kind, type) and issubclass(kind, OSError)


def _status(returncode: int | None, timed_out: bool, limit: str | None) -> str:
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    if limit == MEMORY:
        return "memory"
    if returncode is not None and returncode < 0:
        return "signal"
    return "error"
