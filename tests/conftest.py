"""Shared fixtures: real executors (real zygotes, real namespaces), torn down after use."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from codepool.worker import LocalExecutor
from codepool.worker.zygote import FALLBACK_PREFIX

VOLATILE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


@pytest.fixture(scope="module", params=["fork", "spawn"])
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    with LocalExecutor(concurrency=2, mode=request.param, preload=("numpy",)) as ex:
        yield ex


def processes_of(uids: range, *, except_children_of: int = 0) -> list[str]:
    """Command lines of live processes running as any of ``uids``.

    ``except_children_of``: leave out direct children of this pid (the zygote's one
    waiting child already runs as its snippet uid).
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid not in uids:
                continue
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            if except_children_of and parent == except_children_of:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def zygote_children(executor: LocalExecutor) -> list[int]:
    pid = executor.zygote_pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def files_of(uids: range) -> list[str]:
    """Entries in the host's temp dirs owned by ``uids`` or left by the executor."""
    found = []
    for root in VOLATILE_DIRS:
        for name in os.listdir(root):
            path = os.path.join(root, name)
            try:
                owner = os.lstat(path).st_uid
            except FileNotFoundError:
                continue
            if owner in uids or name.startswith(FALLBACK_PREFIX):
                found.append(path)
    return found


def assert_nothing_left(executor: LocalExecutor) -> None:
    """No process and no file of any snippet outlives it (checked on the host)."""
    assert executor.snippet_uids, "the suite runs as root: snippets must get their own uids"
    # Between snippets the zygote has exactly one child: the one waiting for the next.
    assert len(zygote_children(executor)) <= 1
    assert processes_of(executor.snippet_uids, except_children_of=executor.zygote_pid) == []
    assert files_of(executor.snippet_uids) == []
