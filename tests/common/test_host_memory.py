"""The memory a host may use, read from made-up /proc and cgroup trees: a container's
cgroup limit (v2 and v1, on the process's own cgroup or an ancestor) sizes the host's
live contexts when it is lower than the physical memory (before, the physical memory
alone did: a 2-GiB pod on a 256-GiB machine allowed 1,024 contexts)."""

from __future__ import annotations

from pathlib import Path

from codepool.common.host_memory import cgroup_limit_mb, physical_mb, usable_mb
from codepool.worker.engine.executor import default_max_contexts
from tests.common.test_host_cpus import make_tree

V2_MOUNT = "30 23 0:26 / {root}/cg2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"
V1_MOUNT = "33 31 0:30 / {root}/mem rw,relatime - cgroup cgroup rw,memory"
GIB = 1 << 30


def test_a_pods_v2_limit_sizes_the_contexts(tmp_path: Path) -> None:
    proc_self = make_tree(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        [V2_MOUNT],
        {
            "cg2/kubepods/pod1/ctr/memory.max": "max\n",
            "cg2/kubepods/pod1/memory.max": f"{2 * GIB}\n",  # the pod's limit binds
            "cg2/kubepods/memory.max": f"{64 * GIB}\n",
        },
    )
    assert cgroup_limit_mb(proc_self=proc_self) == 2048
    assert usable_mb(proc_self=proc_self) == min(2048, physical_mb() or 2048)
    assert default_max_contexts(proc_self=proc_self) == 8  # 2 GiB / 256 MiB


def test_v1_limit_and_v1s_no_limit(tmp_path: Path) -> None:
    limited = make_tree(
        tmp_path,
        "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
        [V1_MOUNT.replace("/ {root}", "/docker/abc {root}")],
        {"mem/memory.limit_in_bytes": f"{GIB}\n"},
    )
    assert cgroup_limit_mb(proc_self=limited) == 1024
    assert default_max_contexts(proc_self=limited) == 4
    unlimited = tmp_path / "none"
    unlimited.mkdir()
    none = make_tree(
        unlimited,
        "4:memory:/\n",
        [V1_MOUNT],
        {"mem/memory.limit_in_bytes": "9223372036854771712\n"},
    )
    assert cgroup_limit_mb(proc_self=none) is None
    assert usable_mb(proc_self=none) == physical_mb()


def test_no_cgroup_file_system_is_the_physical_memory(tmp_path: Path) -> None:
    assert cgroup_limit_mb(proc_self=str(tmp_path / "nowhere")) is None
    assert usable_mb(proc_self=str(tmp_path / "nowhere")) == physical_mb()
