"""seccomp: the syscall half of the second isolation layer, in every child.

A classic BPF filter, built once in the zygote and installed by each child just before
its request: sockets of no family but AF_UNIX (so no UDP or raw packets even where
there is no network namespace, which Landlock's TCP rules do not cover); none of ptrace,
process_vm_*, keyctl, bpf, perf_event_open, io_uring, userfaultfd, module or kexec
loading, mount and the new mount API, unshare, setns, and no clone() into new
namespaces; without a PID namespace also no setsid/setpgid, so nothing leaves the
snippet's process group. Refused calls fail with EPERM (sockets: EAFNOSUPPORT);
clone3 with ENOSYS, so the C library falls back to clone(), whose flags a filter can see.

Plain ctypes and hand-written BPF: no compiler and no libseccomp at install time.
"""

from __future__ import annotations

import ctypes
import errno
import platform
from dataclasses import dataclass

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data; arg0's low half (LE)
AF_UNIX = 1
CLONE_NEW_ANY = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

# Calls added since Linux 5.1 have one number on every architecture.
_UNIFIED = {
    "clone3": 435,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
# name -> number, per architecture (x86_64 numbers; aarch64's generic table).
_ARCHES = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "socketpair": 53,
            "clone": 56,
            "setsid": 112,
            "setpgid": 109,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "unshare": 272,
            "setns": 308,
            "userfaultfd": 323,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "open_by_handle_at": 304,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "socketpair": 199,
            "clone": 220,
            "setsid": 157,
            "setpgid": 154,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "unshare": 97,
            "setns": 268,
            "userfaultfd": 282,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "open_by_handle_at": 265,
        },
    ),
}
_GROUP_CALLS = ("setsid", "setpgid")
_SPECIAL = ("socket", "socketpair", "clone", "clone3", *_GROUP_CALLS)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_void_p,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


@dataclass(frozen=True, eq=False)
class Filter:
    """A built filter; ``program`` None where this CPU architecture has no table."""

    program: _Program | None
    instructions: ctypes.Array[_Filter] | None
    detail: str

    def install(self) -> None:
        """Apply to this process for good (needs no-new-privileges); OSError on failure."""
        if self.program is None:
            return
        if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(self.program), 0, 0):
            code = ctypes.get_errno()
            raise OSError(code, f"seccomp filter: {errno.errorcode.get(code, code)}")


def build(*, group_calls: bool, sockets: bool = True) -> Filter:
    """The filter; ``group_calls``: also refuse setsid/setpgid (no PID namespace);
    ``sockets``: refuse every socket family but AF_UNIX (without it the filter is close
    to a container runtime's default profile, which tests run the worker under)."""
    arch = platform.machine()
    if arch not in _ARCHES:
        return Filter(None, None, f"no syscall table for {arch}: not installed")
    audit_arch, own = _ARCHES[arch]
    numbers = {**own, **_UNIFIED}
    denied = [n for name, n in numbers.items() if name not in _SPECIAL]
    if group_calls:
        denied += [numbers[name] for name in _GROUP_CALLS]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    code: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 1, 0, audit_arch),
        (_RET_K, 0, 0, _RET_KILL_PROCESS),  # another ABI (x32, 32-bit): no way around
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch == "x86_64":
        code += [(_JGE_K, 0, 1, 0x40000000), (_RET_K, 0, 0, eperm)]  # x32 numbers
    # Each check: if nr == N jump to its verdict, else fall through to the next check.
    tail: list[tuple[int, int, int, int]] = []
    checks: list[tuple[int, list[tuple[int, int, int, int]]]] = [
        (n, [(_RET_K, 0, 0, eperm)]) for n in denied
    ]
    checks.append((numbers["clone3"], [(_RET_K, 0, 0, enosys)]))
    family = [
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JEQ_K, 1, 0, AF_UNIX),
        (_RET_K, 0, 0, _RET_ERRNO | errno.EAFNOSUPPORT),
        (_RET_K, 0, 0, _RET_ALLOW),
    ]
    if sockets:
        checks.append((numbers["socket"], family))
        checks.append((numbers["socketpair"], family))
    checks.append(
        (
            numbers["clone"],
            [
                (_LD_W_ABS, 0, 0, _OFF_ARG0),
                (_JSET_K, 0, 1, CLONE_NEW_ANY),
                (_RET_K, 0, 0, eperm),
                (_RET_K, 0, 0, _RET_ALLOW),
            ],
        )
    )
    # Verdict blocks go after all the comparisons; jumps are forward offsets.
    compare_count = len(checks)
    offset_to_tail = compare_count + 1  # +1: the ALLOW after the last comparison
    for position, (number, verdict) in enumerate(checks):
        jump = offset_to_tail - position - 1 + len(tail)
        code.append((_JEQ_K, jump, 0, number))
        tail += verdict
    code.append((_RET_K, 0, 0, _RET_ALLOW))
    code += tail
    if any(jt > 255 for _, jt, _, _ in code):
        raise ValueError("seccomp filter too long for 8-bit jumps")
    instructions = (_Filter * len(code))(*(_Filter(*i) for i in code))
    program = _Program(len(code), instructions)
    scope = "no ptrace, bpf, io_uring, mount, unshare/setns, namespaces"
    if sockets:
        scope = "sockets AF_UNIX only; " + scope
    if group_calls:
        scope += "; no setsid/setpgid"
    return Filter(program, instructions, scope)
