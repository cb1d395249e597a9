"""The zygote's clone loop and the child's set-up in C, where the extension was built.

A forked child pays a copy-on-write fault for every page it writes, and the Python
set-up (child.child_main) writes some 200 before the user's first line, while the
zygote's Python loop writes pages it shares with every live child. _nativechild.c does
the same steps, in the same order, writing its C stack and little else. It covers the
common case: a PID namespace (root, or a user namespace), a single-threaded zygote
whose environment is the snippets'. Elsewhere, or where no compiler was at install
time, the zygote runs the Python steps, and the report says which runs and why.
"""

from __future__ import annotations

import socket
from types import ModuleType

from codepool.worker.engine import child, isolation, landlock, linux
from codepool.worker.engine.child import ChildPlan

_module: ModuleType | None
try:
    from codepool.worker.engine import _nativechild

    _module = _nativechild
except ImportError:  # built where a compiler was; see setup.py
    _module = None


def unavailable(plan: ChildPlan, *, single_threaded: bool, wanted: bool) -> str | None:
    """Why this zygote's children cannot be set up in C; None when they can."""
    if not wanted:
        return "disabled by configuration (native_child=False)"
    if _module is None:
        return "the C extension was not built (no compiler at install time)"
    if not plan.state.pidns:
        return "no PID namespace here, which the C set-up assumes"
    if not single_threaded:
        return "the zygote has more than one thread"
    if not plan.env_in_place:
        return "the zygote's environment is not the snippets'"
    return None


def serve(control: socket.socket, clone_flags: int, plan: ChildPlan) -> tuple[bytes, int] | None:
    """The clone loop (see _nativechild.c): None in the zygote once the supervisor is
    gone; in each child, what child.native_child_main takes."""
    assert _module is not None
    guard = plan.guard
    handled_fs, handled_net, scoped, attr_size = guard.ruleset_attr() if guard.abi else (0,) * 4
    program = plan.syscalls.instructions
    result: tuple[bytes, int] | None = _module.serve(
        control=control.fileno(),
        clone_flags=clone_flags,
        spawn=plan.mode == "spawn",
        tmpfs_options=isolation.tmpfs_options(plan.disk_mb),
        roots=list(isolation.VOLATILE_ROOTS),
        binds=list(plan.state.volatile_binds),
        workdir=isolation.WORKDIR,
        last_cap=linux.last_capability(),
        nproc_headroom=plan.nproc_headroom,
        vm_baseline=plan.vm_baseline_bytes,
        abi=guard.abi,
        handled_fs=handled_fs,
        handled_net=handled_net,
        scoped=scoped,
        attr_size=attr_size,
        fs_access=handled_fs,
        read_only=landlock.READ_ONLY & handled_fs,
        file_only=landlock.FILE_ONLY,
        rules=[(rule.allowed_access, rule.parent_fd) for rule in guard.rules],
        fd_range=(guard.fd_range.start, guard.fd_range.stop),
        writable=list(child.WRITABLE),
        readable=list(child.READABLE),
        seccomp=bytes(program) if program is not None else b"",
    )
    return result
