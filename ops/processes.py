"""Looking at a worker host's process tree from outside (benchmarks, tests, operators).

Plain /proc reads, not psutil: the few facts needed (owner, parent, command line,
environment) are one read each, and psutil would be a dependency for that alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from codepool.common.process_start import start_ticks


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


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        found += children
        frontier += children
    return found


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


def worker_role(pid: int) -> str | None:
    """``dispatcher``, ``supervisor`` or ``zygote`` for those processes of a worker host;
    None for anything else, snippets included (they share the zygote's command line but
    live in PID namespaces of their own: two NSpid entries)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/status") as f:
            nspid = next(line for line in f if line.startswith("NSpid:")).split()[1:]
    except (OSError, StopIteration):
        return None
    if len(nspid) > 1:
        return None
    for name, marks in (
        ("dispatcher", ("codepool.worker.dispatcher",)),
        ("supervisor", ("codepool.worker.engine.supervisor",)),
        # Zygotes start as ``python -B -c`` (supervisor.ZYGOTE_BOOT, bare.BOOT).
        ("zygote", ("codepool.worker.engine import zygote", "codepool.worker.engine import bare")),
    ):
        if any(mark in cmdline for mark in marks):
            return name
    return None
