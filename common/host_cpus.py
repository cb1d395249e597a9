"""How many CPUs this process may use: the default number of snippet slots.

Two limits count, as in a container or a Kubernetes pod: the CPU affinity mask
(``taskset``, cpusets) and the CPU quota of the process's own cgroup (cgroup v2
``cpu.max``, cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; the smallest quota
on the way up to the hierarchy's root, since a parent's quota binds its children too).
A quota of 6.5 CPUs gives 6 slots: a slot beyond the quota would only be throttled.

Plain reads of /proc and the cgroup files; off Linux (a trainer on macOS or Windows)
the OS's CPU count, so this module imports and answers anywhere.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

# A quota within this much of a whole number of CPUs counts as that number (6.0 from
# 599999/100000 is 6 slots, not 5).
ROUNDING_SLACK = 0.01


@dataclass(frozen=True)
class HostCpus:
    """The CPUs this process may use and where the figure came from.

    slots: the default number of snippet slots: the affinity, capped by the quota
        rounded down, at least 1.
    affinity: CPUs in this process's affinity mask (the OS's CPU count where there is
        no affinity call).
    quota: CPUs the cgroup quota allows (None: no quota found).
    quota_from: the file that set it ('' without one).
    """

    slots: int
    affinity: int
    quota: float | None = None
    quota_from: str = ""

    def describe(self) -> str:
        """``6 (CPU affinity 8, cgroup quota 6.0)``: the figure and its sources."""
        parts = [f"CPU affinity {self.affinity}"]
        parts.append("no cgroup quota" if self.quota is None else f"cgroup quota {self.quota:.1f}")
        return f"{self.slots} ({', '.join(parts)})"


def host_cpus(*, proc_self: str = "/proc/self") -> HostCpus:
    """The CPUs this process may use (``proc_self``: where its /proc entry is read; a
    test points it at a made-up tree)."""
    affinity = _affinity()
    found = cgroup_quota(proc_self=proc_self)
    if found is None:
        return HostCpus(slots=affinity, affinity=affinity)
    quota, source = found
    by_quota = max(1, math.floor(quota + ROUNDING_SLACK))
    return HostCpus(min(affinity, by_quota), affinity, quota, source)


def default_slots() -> int:
    """Snippet slots when none are asked for: see ``host_cpus``."""
    return host_cpus().slots


def _affinity() -> int:
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(1, len(getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def cgroup_quota(*, proc_self: str = "/proc/self") -> tuple[float, str] | None:
    """The smallest CPU quota (in CPUs) over this process's cgroup and its ancestors,
    v2 and v1 alike, and the file that set it; None where there is none (no quota, no
    cgroup file system, not Linux)."""
    try:
        with open(os.path.join(proc_self, "cgroup")) as f:
            memberships = f.read().splitlines()
        with open(os.path.join(proc_self, "mountinfo")) as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    best: tuple[float, str] | None = None
    for hierarchy in _cpu_hierarchies(memberships, mounts):
        for found in hierarchy.quotas():
            if best is None or found[0] < best[0]:
                best = found
    return best


@dataclass(frozen=True)
class _Hierarchy:
    """A cgroup hierarchy that can hold a CPU quota, as this process sits in it."""

    version: int  # 2: cpu.max; 1: cpu.cfs_quota_us and cpu.cfs_period_us
    mount_point: str
    directory: str  # this process's cgroup in it

    def quotas(self) -> list[tuple[float, str]]:
        """The quota (CPUs, file) of each cgroup from ours up to the mount point."""
        found = []
        directory = self.directory
        while True:
            quota = self._read(directory)
            if quota is not None:
                found.append(quota)
            if directory == self.mount_point or len(directory) <= len(self.mount_point):
                return found
            directory = os.path.dirname(directory)

    def _read(self, directory: str) -> tuple[float, str] | None:
        try:
            if self.version == 2:
                path = os.path.join(directory, "cpu.max")
                with open(path) as f:
                    quota_text, _, period_text = f.read().strip().partition(" ")
                if quota_text == "max":
                    return None
            else:
                path = os.path.join(directory, "cpu.cfs_quota_us")
                with open(path) as f:
                    quota_text = f.read().strip()
                with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
                    period_text = f.read().strip()
            quota_us, period_us = int(quota_text), int(period_text or "100000")
        except (OSError, ValueError):
            return None
        if quota_us <= 0 or period_us <= 0:  # v1 says -1 for none
            return None
        return quota_us / period_us, path


def cgroup_dirs(controller: str, *, proc_self: str = "/proc/self") -> list[tuple[int, list[str]]]:
    """Per cgroup hierarchy that can hold ``controller``'s limits (v2, and v1's
    ``controller`` hierarchy): its version and the cgroup directories from this
    process's own up to the mount point (common/host_memory.py reads memory limits
    there). Empty off Linux or without a cgroup file system."""
    try:
        with open(os.path.join(proc_self, "cgroup")) as f:
            memberships = f.read().splitlines()
        with open(os.path.join(proc_self, "mountinfo")) as f:
            mounts = f.read().splitlines()
    except OSError:
        return []
    found = []
    for hierarchy in _cpu_hierarchies(memberships, mounts, controller):
        directory, dirs = hierarchy.directory, []
        while True:
            dirs.append(directory)
            if directory == hierarchy.mount_point or len(directory) <= len(hierarchy.mount_point):
                break
            directory = os.path.dirname(directory)
        found.append((hierarchy.version, dirs))
    return found


def _cpu_hierarchies(
    memberships: list[str], mounts: list[str], controller: str = "cpu"
) -> list[_Hierarchy]:
    """The v2 hierarchy and v1's ``controller`` hierarchy, where mounted, with this
    process's cgroup in each (``/proc/self/cgroup`` against ``/proc/self/mountinfo``)."""
    paths: dict[int, str] = {}  # version -> the cgroup path of this process
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[2] = path
        elif controller in controllers.split(","):
            paths[1] = path
    found = []
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 4:
            continue
        mount_root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        fstype, options = fields[dash + 1], fields[dash + 3].split(",")
        if fstype == "cgroup2":
            version = 2
        elif fstype == "cgroup" and controller in options:
            version = 1
        else:
            continue
        if version not in paths:
            continue
        relative = os.path.relpath(paths[version], mount_root)
        if relative.startswith(".."):  # a cgroup outside this mount's view: not readable
            continue
        directory = os.path.normpath(os.path.join(mount_point, relative))
        found.append(_Hierarchy(version, mount_point, directory))
    return found


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field
