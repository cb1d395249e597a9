"""When a process started: with its pid, a name for one process that survives pid reuse.

Plain /proc reads; off Linux (no /proc) every process reads as gone."""

from __future__ import annotations


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot: with the pid it names one process
    even once the pid is reused. None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
