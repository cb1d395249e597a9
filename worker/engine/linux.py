"""Thin ctypes wrappers for the Linux calls Python 3.11's ``os`` lacks.

unshare(2), mount(2), prctl(2) and a ``clone(2)`` that makes the child
the first process of new namespaces in one step (os.fork cannot pass clone flags).
"""

from __future__ import annotations

import ctypes
import os
import platform

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522

SIGCHLD = 17

_SYS_CLONE = {"x86_64": 56, "aarch64": 220, "ppc64le": 120, "s390x": 120, "riscv64": 220}

_libc = ctypes.CDLL(None, use_errno=True)
# A PyDLL call keeps the GIL, exactly like os.fork does around fork(2).
_libc_gil = ctypes.PyDLL(None, use_errno=True)
_libc_gil.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


def clone_supported() -> bool:
    return platform.machine() in _SYS_CLONE


def fork_with_flags(flags: int, *, hooks: bool = True) -> int:
    """fork(2) with extra clone flags; returns 0 in the child, like os.fork.

    With ``hooks`` it runs Python's own before/after-fork hooks, so the child is as
    sound as after os.fork. Without them the child skips re-initialising what only
    other threads could have left held (the import lock, the runtime's and threading's
    and logging's locks) and the stdlib's at-fork callbacks, ``random``'s reseed among
    them: in a process that has one thread and holds no lock while it forks (the zygote)
    the child's copies are sound as they are, and the caller reseeds. That is most of
    what a bare child costs: some 250 copied pages and 0.9 ms of CPU per fork here.
    Only safe in a single-threaded process (the zygote).
    """
    api = ctypes.pythonapi
    if hooks:
        api.PyOS_BeforeFork()
    pid = _libc_gil.syscall(
        _SYS_CLONE[platform.machine()], ctypes.c_ulong(flags | SIGCHLD), None, None, None, None
    )
    if pid == 0:
        if hooks:
            api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    if hooks:
        api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
_HUGE_PAGE = 2 << 20
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def collapse_anonymous_memory() -> tuple[int, int]:
    """Back this process's anonymous memory with 2 MiB pages where the kernel can.

    fork() copies, and exit() frees, one page-table entry per 4 KiB page; with huge
    pages both touch 512 times fewer entries. Returns (MiB collapsed, MiB refused).
    """
    collapsed = refused = 0
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    for line in lines:
        parts = line.split()
        if not parts[1].startswith("rw") or (len(parts) > 5 and parts[5] != "[heap]"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        start = (start + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
        end &= ~(_HUGE_PAGE - 1)
        if end <= start:
            continue
        _libc.madvise(start, end - start, MADV_HUGEPAGE)
        if _libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += (end - start) >> 20
        else:
            refused += (end - start) >> 20
    return collapsed, refused


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def last_capability() -> int:
    """The highest capability number this kernel knows."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 63


def drop_capabilities() -> None:
    """Drop every capability of this process for good: the bounding set (while
    CAP_SETPCAP still allows it), the ambient set, then effective, permitted and
    inheritable."""
    for cap in range(last_capability() + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: none to drop
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def keep_capabilities_across_exec() -> None:
    """Keep this process's capabilities through its next execve although its uid is not
    0 (a user namespace's owner): each becomes inheritable and ambient. Whatever it
    starts then drops them (drop_capabilities clears the ambient set too)."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "capget")
    for word in data:
        word.inheritable = word.permitted
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    for cap in range(last_capability() + 1):
        if data[cap // 32].permitted & (1 << (cap % 32)):
            _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0), "prctl")
