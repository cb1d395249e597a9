"""A child's done notice: how the supervisor learns that a snippet ended before the
exit's teardown of its image (a millisecond or more on a light image, several on a
heavy one) has run.

Children say it on a pipe (runtime.finish: exit code, CPU and peak RSS), in both modes. A
snippet can write one itself, or garble it: the first ends it there, as its own
os._exit would, and the second leaves the supervisor waiting for the exit, as before.
A notice is acted on only with a PID namespace, whose init the child is: killed, it
can run nothing more, and with no process of its own left, nothing of the snippet can.
Whether one is left the notice says when the namespace never gave out a pid but the
child's (a forged "never" lets the snippet's processes outlive its result by the
teardown, until the kernel kills them with it); otherwise /proc is asked.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from codepool.worker.engine import contract

_NOTICE = struct.Struct(contract.DONE_FORMAT)
assert _NOTICE.size == contract.DONE_SIZE


@dataclass(frozen=True)
class Notice:
    code: int
    cpu_s: float
    max_rss_kb: int
    made_none: bool  # its PID namespace gave out no pid but its own


def open_pipe() -> tuple[int, int]:
    """(read end, write end), neither blocking: a snippet that fills the pipe only
    loses its own notice."""
    return os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)


def read_notice(fd: int) -> Notice | None:
    """The notice waiting on ``fd``; None for anything else (nothing, end of file, or
    bytes that are not exactly one notice)."""
    try:
        data = os.read(fd, 4 * _NOTICE.size)
    except OSError:
        return None
    if len(data) != _NOTICE.size:
        return None
    code, magic, cpu_us, max_rss_kb, last_pid = _NOTICE.unpack(data)
    if magic != contract.DONE_MAGIC or not -64 <= code <= 255 or cpu_us < 0 or max_rss_kb < 0:
        return None
    return Notice(code, cpu_us / 1e6, max_rss_kb, last_pid == 1)


def alone(pid: int, notice: Notice) -> bool:
    """Whether process ``pid``, killed at ``notice``, has no child of its own (its PID
    namespace's orphans are its children too); False when that cannot be read."""
    if notice.made_none:
        return True
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                if f.read(1):
                    return False
    except OSError:
        return False
    return True
