"""The report lines for what each snippet gets once the zygote's namespaces are set up:
doctor's wording, kept apart from the mount and namespace mechanics in isolation.py."""

from __future__ import annotations

from typing import Protocol


class IsolationReport(Protocol):
    """What these lines are drawn from and added to: isolation.IsolationState (which
    imports this module), as the zygote left it."""

    userns: bool
    pidns: bool
    separate_uid: bool

    def note(self, name: str, active: bool, detail: str) -> None: ...


def note_per_snippet(state: IsolationReport) -> None:
    """Add the per-snippet protection lines (uid, capabilities, processes, limits, ...)
    that follow from what ``state`` holds."""
    if state.separate_uid:
        state.note("uid", True, "each running snippet has its own unprivileged uid")
    else:
        state.note("uid", False, "not root: snippets keep the worker's uid")
    state.note(
        "capabilities",
        True,
        "none effective, permitted, inheritable or ambient before user code, and "
        "no_new_privs: no exec can grant one"
        + (", and no uid 0 inside the user namespace" if state.userns else ""),
    )
    if state.pidns:
        state.note(
            "processes",
            True,
            "PID namespace per snippet: its processes die with it, "
            "the executor is invisible and unkillable from inside",
        )
        state.note("ipc", True, "IPC namespace per snippet: no SysV/POSIX IPC survives it")
    elif state.separate_uid:
        state.note(
            "processes",
            False,
            "no PID namespace: after each snippet every process of its uid is killed and "
            "its files in /tmp, /var/tmp and /dev/shm removed; the executor is visible",
        )
    else:
        state.note(
            "processes",
            False,
            "no PID namespace and no separate uid: what a snippet starts is killed with "
            "its process group, which seccomp keeps it in (no setsid, no setpgid); "
            "the executor is visible",
        )
    state.note("rlimits", True, "CPU, address space, file size, open files, core")
    if state.separate_uid:
        state.note("process limit", True, "RLIMIT_NPROC per snippet, each on a uid of its own")
    elif state.userns:
        state.note(
            "process limit",
            True,
            "RLIMIT_NPROC counted inside the user namespace: a fork bomb starves at most "
            "the snippets running beside it, never the worker",
        )
    else:
        state.note(
            "process limit",
            True,
            "RLIMIT_NPROC on the worker user's own uid, set as each snippet starts to that "
            "user's task count plus max_procs: a fork bomb is capped, and starves at most "
            "the snippets starting beside it, never the worker",
        )
    state.note("environment", True, "allow-list only")
    state.note(
        "file descriptors",
        True,
        "all closed but stdio and the pipe its end is told on (fd 4; notebook cells "
        "add their record fd, 5)",
    )


def note_shared_memory(state: IsolationReport, *, landlock: bool) -> None:
    """Without a PID namespace (so without a /dev/shm of its own): what keeps a snippet's
    POSIX semaphores and shared memory, in the host's /dev/shm, from the others' (shm.py)."""
    if state.pidns:
        return  # the "ipc" line: a tmpfs of its own
    where = "POSIX semaphores and shared memory in the host's /dev/shm: "
    listing = "usable by name, not listable (Landlock)" if landlock else "listable (no Landlock)"
    if state.separate_uid:
        state.note(
            "shared memory",
            landlock,
            where + listing + "; a snippet's are 0600 and its own uid's, removed after it",
        )
    else:
        state.note(
            "shared memory",
            False,
            where + listing + "; removed once the snippets running beside the one that made "
            "them have ended; all are the worker's uid, so a snippet that knows or guesses "
            "another's random name can open it",
        )
