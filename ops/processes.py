"""Looking at a worker host's process tree from outside (benchmarks, tests, operators)."""

from __future__ import annotations


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
    for name, module in (
        ("dispatcher", "codepool.worker.dispatcher"),
        ("supervisor", "codepool.worker.engine.supervisor"),
        ("zygote", "codepool.worker.engine.zygote"),
    ):
        if module in cmdline:
            return name
    return None
