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

import os
import socket
import struct
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from codepool.worker.engine import child, contract, isolation, landlock, linux, runtime
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
    why_not = unavailable_here()
    if why_not is not None:
        return why_not
    if not plan.state.pidns:
        return "no PID namespace here, which the C set-up assumes"
    if not single_threaded:
        return "the zygote has more than one thread"
    if not plan.env_in_place:
        return "the zygote's environment is not the snippets'"
    return None


def unavailable_here() -> str | None:
    """Why this install has no usable C set-up at all; None when it has one."""
    if _module is None:
        return "the C extension was not built (no compiler at install time)"
    differs = contract_differences()
    if differs:
        return (
            "the C extension is a stale build or disagrees with contract.py "
            f"({'; '.join(differs)}): reinstall codepool (pip install -e .)"
        )
    return None


def contract_differences() -> list[str]:
    """Each constant of contract.SHARED that the built C module defines otherwise."""
    assert _module is not None
    theirs = getattr(_module, "CONTRACT", {})
    return [
        f"{name}: C {theirs.get(name)!r}, Python {ours!r}"
        for name, ours in contract.SHARED.items()
        if theirs.get(name) != ours
    ]


_TEST_KEY = bytes(range(256)) * 9 + bytes(range(192))  # 624 words, no two alike nearby


def generators() -> tuple[list[tuple[int, int]], bool]:
    """The MT19937 generators a fresh interpreter would have seeded from the kernel and a
    forked child inherits as they are: ``random``'s and numpy's legacy global one, each
    as (key address, position address), for _nativechild.c to reseed in every child.
    Each address is checked first by writing a test key there and reading it back with
    the library's own getstate; a layout this build does not know is left to child._reseed
    (the second value: False when anything is). Leaves both freshly seeded."""
    found: list[tuple[int, int]] = []
    complete = True
    random = sys.modules.get("random")
    if random is not None:
        instance = random._inst
        # CPython's RandomObject: the object header, int index, uint32_t state[624].
        header = object.__basicsize__
        key, position = id(instance) + header + 4, id(instance) + header
        if _writes_as_expected(key, position, lambda: random.getstate()[1]):
            found.append((key, position))
        else:
            complete = False
        random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            # numpy's mt19937_state: uint32_t key[624], then int pos.
            key = int(numpy_random.mtrand._rand._bit_generator.ctypes.state_address)
        except (AttributeError, TypeError):
            complete = False
        else:
            position = key + 4 * contract.MT_WORDS

            def legacy_state() -> tuple[int, ...]:
                _, words, pos, *_ = numpy_random.get_state()
                return (*(int(w) for w in words), int(pos))

            if _writes_as_expected(key, position, legacy_state):
                found.append((key, position))
            else:
                complete = False
        np = sys.modules["numpy"]
        numpy_random.seed(np.frombuffer(os.urandom(4 * contract.MT_WORDS), dtype="uint32"))
    return found, complete


def _writes_as_expected(key: int, position: int, state: Callable[[], tuple[int, ...]]) -> bool:
    assert _module is not None
    # Only ever addresses inside live objects: a wrong guess about their layout writes
    # garbage into the generator's own state, which the reseeds after this replace.
    expected = (*struct.unpack(f"={contract.MT_WORDS}I", _TEST_KEY), contract.MT_WORDS)
    _module.write_state(key, position, _TEST_KEY)
    try:
        return tuple(state()) == expected
    except Exception:
        return False


def serve(
    control: socket.socket,
    clone_flags: int,
    plan: ChildPlan,
    seeds: list[tuple[int, int]],
) -> tuple[bytes, int] | None:
    """The clone loop (see _nativechild.c): None in the zygote once the supervisor is
    gone; in each child, what child.native_child_main takes. ``seeds``: generators()."""
    assert _module is not None
    runtime.done_notice = _module.say_done
    result: tuple[bytes, int] | None = _module.serve(
        **serve_arguments(control.fileno(), clone_flags, plan, seeds), warm=runtime.warm_up
    )
    return result


def serve_arguments(
    control_fd: int, clone_flags: int, plan: ChildPlan, seeds: list[tuple[int, int]]
) -> dict[str, Any]:
    """_nativechild.serve's keywords: ints, strings, bytes and lists of them (what
    marshal carries to the bare zygote's image, see bare.py)."""
    guard = plan.guard
    handled_fs, handled_net, scoped, attr_size = guard.ruleset_attr() if guard.abi else (0,) * 4
    program = plan.syscalls.instructions
    return dict(
        control=control_fd,
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
        read_only=landlock.READ_ONLY & handled_fs,
        file_only=landlock.FILE_ONLY,
        rules=[(rule.allowed_access, rule.parent_fd) for rule in guard.rules],
        fd_range=(guard.fd_range.start, guard.fd_range.stop),
        writable=list(child.WRITABLE),
        readable=list(child.READABLE),
        seccomp=bytes(program) if program is not None else b"",
        generators=seeds,
    )
