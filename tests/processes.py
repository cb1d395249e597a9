"""Looking at a worker host's process tree from outside, for the tests (the benches'
few needs are codepool.ops.bench.process_tree).

Plain /proc reads, not psutil: the few facts needed (owner, parent, command line,
environment) are one read each, and psutil would be a dependency for that alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from codepool.common.process_start import start_ticks
from codepool.ops.bench.process_tree import descendants


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    uid: int  # owner of /proc/PID: the effective uid (root for a non-dumpable process)
    ppid: int
    cmdline: str  # arguments joined by spaces

    def environ(self) -> list[bytes]:
        """Its environment entries (``NAME=value``); empty if it is gone or unreadable."""
        try:
            with open(f"/proc/{self.pid}/environ", "rb") as f:
                return f.read().split(b"\0")
        except OSError:
            return []


def processes() -> Iterator[ProcessInfo]:
    """Every live process this one may look at; those that end meanwhile are skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        yield ProcessInfo(int(entry), uid, ppid, cmdline)


def tree(pid: int) -> dict[int, int]:
    """``pid`` and every live process below it, each with its start ticks: taken before
    a kill, since the tree is reparented once its root dies."""
    found = {}
    for member in (pid, *descendants(pid)):
        ticks = start_ticks(member)
        if ticks is not None:
            found[member] = ticks
    return found


def still_running(snapshot: dict[int, int]) -> list[int]:
    """The processes of a ``tree`` snapshot that still run (not gone, not reused, not
    in their exit)."""
    return [
        pid for pid, ticks in snapshot.items() if start_ticks(pid) == ticks and not exiting(pid)
    ]


PF_EXITING = 0x4  # include/linux/sched.h: the task is in its exit


def exiting(pid: int) -> bool:
    """Whether ``pid`` is in its exit (tearing down, or a zombie): it runs nothing more.
    False for a live process, and for one that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] in ("Z", "X") or bool(int(fields[6]) & PF_EXITING)
