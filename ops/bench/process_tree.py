"""A worker host's process tree seen from outside, for the benches (soak, the fleet's
hosts) and the tests: plain /proc reads, not psutil (a dependency for two facts)."""

from __future__ import annotations


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``'s main thread (none once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    found, frontier = [], [pid]
    while frontier:
        below = children(frontier.pop())
        found += below
        frontier += below
    return found


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


def process_state(pid: int) -> str | None:
    """``pid``'s one-letter state (R, S, T, Z ...), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
