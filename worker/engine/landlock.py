"""Landlock: the second isolation layer, which needs neither root nor namespaces.

Each child, after its mounts and before the request, restricts itself: read (and run)
only the interpreter's files and a few system paths, write only its own work dir (and
/dev/null), no TCP bind or connect (ABI >= 4), no signals to and no abstract unix
sockets of anything outside the snippet (ABI >= 6). What the kernel's ABI cannot give
is said in the report, never skipped silently.

Plain ctypes against the three syscalls: no compiler at install time, no package that
may lag the kernel. The syscall numbers are the same on every architecture.
"""

from __future__ import annotations

import ctypes
import os
import resource
import stat
from dataclasses import dataclass

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_FILE, MAKE_REG, TRUNCATE = 1 << 5, 1 << 8, 1 << 14
_FS_V1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_BY_ABI = {1: _FS_V1, 2: _FS_V1 | 1 << 13, 3: _FS_V1 | 3 << 13, 5: _FS_V1 | 7 << 13}
FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | 1 << 14 | 1 << 15  # + TRUNCATE, IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ_ONLY = EXECUTE | READ_FILE | READ_DIR
# Beneath an unlisted directory (the host's /dev/shm, see shm.py): make, open, resize and
# remove regular files (what sem_open and shm_open do: sem_open links a temporary file
# to its name, which needs no more within one directory), but not list what is there,
# nor make directories, symlinks, sockets or devices, nor link a file in from elsewhere
# (that needs REFER, never granted).
UNLISTED = READ_FILE | WRITE_FILE | TRUNCATE | MAKE_REG | REMOVE_FILE
# System paths a Python program reads besides its own prefix (missing ones are skipped).
SYSTEM_PATHS = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/proc",
    "/sys/devices/system/cpu",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/mime.types",
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI; 0 when Landlock is missing or disabled."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(0, int(version))


# The zygote keeps the read-only paths open from here up, so children skip the lookups.
FD_BASE = 900


@dataclass(frozen=True, eq=False)
class Plan:
    """What a child may touch; made once in the zygote. ``abi`` 0: no Landlock.

    rules: one prepared path_beneath rule per read-only path, whose O_PATH fd the zygote
    holds open at ``FD_BASE`` and up (children keep those fds until they restrict).
    """

    abi: int
    read_only: tuple[str, ...]
    rules: tuple[_PathBeneath, ...] = ()

    def ruleset_attr(self) -> tuple[int, int, int, int]:
        """What the child's ruleset handles: (fs, net, scoped) access and the size of the
        attribute struct this ABI reads."""
        net = NET_BIND_TCP | NET_CONNECT_TCP if self.abi >= 4 else 0
        scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if self.abi >= 6 else 0
        size = 24 if self.abi >= 6 else 16 if self.abi >= 4 else 8
        return _fs_access(self.abi), net, scoped, size

    @property
    def fd_range(self) -> range:
        return range(FD_BASE, FD_BASE + len(self.rules))

    def describe(self) -> tuple[bool, str]:
        """The report line: active, and what is held (and what this kernel cannot)."""
        if not self.abi:
            return False, "Landlock is not available in this kernel (or disabled at boot)"
        held = ["files: read-only system and interpreter paths, writes only in the work dir"]
        missing: list[str] = []
        (held if self.abi >= 4 else missing).append("TCP bind/connect denied")
        (held if self.abi >= 6 else missing).append("signals and abstract unix sockets scoped")
        detail = f"ABI {self.abi}; " + "; ".join(held)
        if missing:
            detail += f"; this kernel's ABI cannot give: {', '.join(missing)}"
        return True, detail


def plan(needed: list[str]) -> Plan:
    """Open the read-only paths (outermost only, symlinks resolved) at FD_BASE and up."""
    abi = abi_version()
    paths: list[str] = []
    for path in sorted(
        {os.path.realpath(p) for p in (*needed, *SYSTEM_PATHS) if os.path.exists(p)}
    ):
        if not any(path == o or path.startswith(o.rstrip("/") + "/") for o in paths):
            paths.append(path)
    if not abi:
        return Plan(0, tuple(paths))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FD_BASE + len(paths) + 1:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, FD_BASE + 256), hard))
    fs = _fs_access(abi)
    rules = []
    for number, path in enumerate(paths, start=FD_BASE):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        access = READ_ONLY & fs
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= FILE_ONLY
        os.dup2(fd, number, inheritable=False)
        os.close(fd)
        rules.append(_PathBeneath(access, number))
    return Plan(abi, tuple(paths), tuple(rules))


def restrict(
    plan: Plan,
    writable: list[str],
    readable: tuple[str, ...] = (),
    unlisted: tuple[str, ...] = (),
) -> None:
    """Restrict this process (and what it starts) for good, then close the plan's fds;
    raises OSError on failure. ``writable`` and ``readable``: paths the child mounted
    itself (the zygote's fds would name what they cover); ``unlisted``: directories whose
    files it may make, use and remove by name (UNLISTED) but not list. Needs
    no-new-privileges (or CAP_SYS_ADMIN), which the caller sets."""
    if not plan.abi:
        return
    fs, net, scoped, size = plan.ruleset_attr()
    attr = _RulesetAttr(fs, net, scoped)
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        _raise("landlock_create_ruleset")
    try:
        for rule in plan.rules:
            if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) < 0:
                _raise(f"landlock_add_rule(fd {rule.parent_fd})")
        for path in writable:
            _allow(ruleset, path, fs)
        for path in readable:
            _allow(ruleset, path, READ_ONLY & fs)
        for path in unlisted:
            _allow(ruleset, path, UNLISTED & fs)
        if _libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) < 0:
            _raise("landlock_restrict_self")
    finally:
        os.close(ruleset)
        os.closerange(plan.fd_range.start, plan.fd_range.stop)


def _fs_access(abi: int) -> int:
    return _FS_BY_ABI[max(a for a in _FS_BY_ABI if a <= abi)]


def _allow(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= FILE_ONLY
        rule = _PathBeneath(access, fd)
        if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) < 0:
            _raise(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _raise(what: str) -> None:
    errno = ctypes.get_errno()
    raise OSError(errno, f"{what}: {os.strerror(errno)}")
