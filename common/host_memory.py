"""How much memory this process may use: the host's physical memory, or less where the
process's cgroup (or an ancestor's: a parent's limit binds its children too) sets a
lower limit, as a container or a Kubernetes pod does (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``). What sizes a host's live interpreter contexts
(worker/engine/executor.py: default_max_contexts). Plain reads of /proc and the cgroup
files; off Linux the physical memory alone."""

from __future__ import annotations

import os

from codepool.common.host_cpus import cgroup_dirs

# cgroup v1 writes "no limit" as a huge number (page-rounded LONG_MAX).
NO_LIMIT_BYTES = 1 << 60


def physical_mb() -> int | None:
    """The host's physical memory (MiB); None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) >> 20
    except (ValueError, OSError, AttributeError):
        return None


def cgroup_limit_mb(*, proc_self: str = "/proc/self") -> int | None:
    """The smallest memory limit (MiB) over this process's cgroup and its ancestors;
    None where there is none."""
    best: int | None = None
    for version, dirs in cgroup_dirs("memory", proc_self=proc_self):
        name = "memory.max" if version == 2 else "memory.limit_in_bytes"
        for directory in dirs:
            try:
                with open(os.path.join(directory, name)) as f:
                    text = f.read().strip()
                limit = int(text)
            except (OSError, ValueError):  # "max", or no such file at this level
                continue
            if 0 < limit < NO_LIMIT_BYTES:
                best = limit if best is None else min(best, limit)
    return None if best is None else best >> 20


def usable_mb(*, proc_self: str = "/proc/self") -> int | None:
    """What this process may use (MiB): the cgroup's limit where it is lower than the
    physical memory, else the physical memory; None where neither is known."""
    sizes = [m for m in (physical_mb(), cgroup_limit_mb(proc_self=proc_self)) if m is not None]
    return min(sizes) if sizes else None
