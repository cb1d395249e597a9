"""Dirs named after their maker's pid are swept only by processes of the maker's PID
namespace: another namespace's pids say nothing about the maker (a worker run as a PID
namespace's init removed the live dirs of the workers beside it)."""

from __future__ import annotations

import os
import tempfile

from codepool.common.socket_dirs import owner_of, pid_namespace_tag, socket_bases
from codepool.worker.engine import leftovers

PREFIX = "codepool-sockettest-"
GONE = 4_000_000  # above pid_max's ceiling: never a live pid


def test_a_name_carries_its_pid_namespace() -> None:
    tag = pid_namespace_tag()
    assert tag.startswith("n") and tag.endswith("-")
    assert owner_of(f"{PREFIX}123-{tag}abcd1234", PREFIX) == "123"
    assert owner_of(f"{PREFIX}123-nffff-abcd1234", PREFIX) is None  # another namespace
    assert owner_of(f"{PREFIX}123-abcd1234", PREFIX) == "123"  # made before the tag


def test_a_sweep_leaves_another_namespaces_dirs_alone() -> None:
    base = socket_bases()[0]
    ours = tempfile.mkdtemp(prefix=f"{PREFIX}{GONE}-{pid_namespace_tag()}", dir=base)
    theirs = tempfile.mkdtemp(prefix=f"{PREFIX}{GONE}-nffff-", dir=base)
    try:
        assert leftovers.sweep(PREFIX, b"codepool") >= 1
        assert not os.path.exists(ours)
        assert os.path.isdir(theirs)
    finally:
        for path in (ours, theirs):
            if os.path.isdir(path):
                os.rmdir(path)
