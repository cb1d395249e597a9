"""The CPUs a process may use, read from made-up /proc and cgroup trees: the quota of
the process's own cgroup or of an ancestor, v2 and v1, and none at all. (The real
thing, a process under taskset or in a cgroup of its own, is tests/ops/test_slots.py.)"""

from __future__ import annotations

import os
from pathlib import Path

from codepool.common.host_cpus import HostCpus, cgroup_quota, host_cpus


def make_tree(tmp_path: Path, cgroup: str, mounts: list[str], files: dict[str, str]) -> str:
    """A /proc/self with ``cgroup`` and ``mounts`` (mountinfo lines, ``{root}`` standing
    for tmp_path) and cgroup files under tmp_path; returns the /proc/self path."""
    proc_self = tmp_path / "proc-self"
    proc_self.mkdir()
    (proc_self / "cgroup").write_text(cgroup)
    lines = [line.format(root=tmp_path) for line in mounts]
    (proc_self / "mountinfo").write_text("\n".join(lines) + "\n")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(proc_self)


V2_MOUNT = "30 23 0:26 / {root}/cg2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"
V1_MOUNT = "32 31 0:29 / {root}/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct"


def test_v2_takes_the_smallest_quota_on_the_way_up(tmp_path: Path) -> None:
    proc_self = make_tree(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        [V2_MOUNT],
        {
            "cg2/kubepods/pod1/ctr/cpu.max": "max 100000\n",
            "cg2/kubepods/pod1/cpu.max": "650000 100000\n",  # the pod's limit binds
            "cg2/kubepods/cpu.max": "max 100000\n",
        },
    )
    quota, source = cgroup_quota(proc_self=proc_self) or (0.0, "")
    assert quota == 6.5 and source == str(tmp_path / "cg2/kubepods/pod1/cpu.max")
    cpus = host_cpus(proc_self=proc_self)
    assert cpus.quota == 6.5
    assert cpus.slots == min(cpus.affinity, 6)


def test_v1_quota_and_a_whole_number_just_under(tmp_path: Path) -> None:
    proc_self = make_tree(
        tmp_path,
        "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n",
        [V1_MOUNT.replace("/ {root}", "/docker/abc {root}")],  # the container's own view
        {"cpu/cpu.cfs_quota_us": "199999\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    assert cgroup_quota(proc_self=proc_self) == (1.99999, str(tmp_path / "cpu/cpu.cfs_quota_us"))
    assert host_cpus(proc_self=proc_self).slots == min(2, host_cpus().affinity)


def test_a_quota_under_one_cpu_still_gives_one_slot(tmp_path: Path) -> None:
    proc_self = make_tree(
        tmp_path, "0::/small\n", [V2_MOUNT], {"cg2/small/cpu.max": "25000 100000"}
    )
    assert host_cpus(proc_self=proc_self).slots == 1


def test_no_quota_anywhere(tmp_path: Path) -> None:
    proc_self = make_tree(
        tmp_path,
        "3:cpu,cpuacct:/\n0::/a\n",
        [V1_MOUNT, V2_MOUNT],
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    assert cgroup_quota(proc_self=proc_self) is None
    cpus = host_cpus(proc_self=proc_self)
    assert cpus == HostCpus(slots=cpus.affinity, affinity=cpus.affinity)
    assert cpus.describe() == f"{cpus.affinity} (CPU affinity {cpus.affinity}, no cgroup quota)"


def test_a_cgroup_outside_the_mounts_view_is_not_read(tmp_path: Path) -> None:
    mount = V2_MOUNT.replace("/ {root}", "/other {root}")
    proc_self = make_tree(tmp_path, "0::/mine\n", [mount], {"cg2/cpu.max": "100000 100000"})
    assert cgroup_quota(proc_self=proc_self) is None


def test_no_proc_at_all(tmp_path: Path) -> None:
    """Off Linux: the CPU count, no quota."""
    cpus = host_cpus(proc_self=str(tmp_path / "nothing"))
    assert cpus.quota is None and cpus.slots == cpus.affinity >= 1


def test_describe_names_the_sources() -> None:
    cpus = HostCpus(slots=6, affinity=8, quota=6.0, quota_from="/sys/fs/cgroup/x/cpu.max")
    assert cpus.describe() == "6 (CPU affinity 8, cgroup quota 6.0)"


def test_this_process(tmp_path: Path) -> None:
    cpus = host_cpus()
    assert 1 <= cpus.slots <= cpus.affinity == len(os.sched_getaffinity(0))
