"""What a forked child does between clone() and the user's first line.

The zygote clones a child ahead of demand (a "warm" child): it enters its private
tmpfs and /proc, arranges fds 0-3 and closes the rest, then blocks reading its request
on fd 3. On a request it applies the limits, drops to its own uid, sets the
environment, says "R" (ready: anything after this is the user's doing) and runs the
snippet — in this process (fork mode) or by exec'ing a fresh interpreter (spawn mode).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import struct
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, NoReturn

from codepool.common import codec
from codepool.common.limits import Limits
from codepool.common.snippet import Snippet, cell_from_wire, cell_to_wire
from codepool.worker.engine import (
    cells,
    context_child,
    contract,
    inputs,
    isolation,
    landlock,
    linux,
    runtime,
    seccomp,
    shm,
    spawn_entry,
)
from codepool.worker.engine.contract import MAX_OPEN_FILES, READY, REQUEST_FD


@dataclass(frozen=True)
class ChildPlan:
    """Everything a child needs that the zygote decided before cloning it."""

    state: isolation.IsolationState
    mode: str
    uid: int | None
    disk_mb: int
    env: dict[str, str]
    vm_baseline_bytes: int
    fallback_dir: str | None
    fresh: runtime.Fresh | None  # fork mode: made once in the zygote
    guard: landlock.Plan  # the second layer, whatever the namespaces: files, TCP, scope
    syscalls: seccomp.Filter  # and its syscall half
    # Processes of the snippet's uid that are not its own but count against its limit:
    # in a rootless user namespace the zygote and its other children share the uid.
    nproc_headroom: int = 0
    # The zygote's own environment is the snippets' (compared once, not per child).
    env_in_place: bool = False


def child_main(plan: ChildPlan, fds: list[int]) -> NoReturn:
    """Entry point in the cloned child, given the request socket, stdout, stderr and the
    done pipe (contract.DONE_FD); never returns."""
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        runtime.reference_signals()
        # fds first, so a setup failure lands in the snippet's stderr for the zygote to read.
        _arrange_fds(fds, keep=plan.guard.fd_range)
        cwd = isolation.setup_child(plan.state, plan.uid, plan.disk_mb, plan.fallback_dir)
        # Everything that does not depend on the request is done before it arrives, so
        # the request pays only for its limits. Once unprivileged, limits can only go down.
        if plan.uid is not None:
            _drop_privileges(plan.uid)  # setresuid away from 0 clears every capability
        else:
            linux.drop_capabilities()  # a user namespace's owner holds them all
        _reseed()
        env = plan.env if plan.state.pidns else {**plan.env, "HOME": cwd, "TMPDIR": cwd}
        if not plan.env_in_place:  # normally the zygote was started with exactly ``env``
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd)
        if plan.fresh is not None:
            runtime.prepare(plan.fresh)
        _restrict(plan, cwd)
        if plan.mode == "fork":
            runtime.warm_up()
        request = _read_request()
        if request is None:  # the zygote went away or discarded this warm child
            os._exit(0)
        record_fd = _start(plan, request, env)
    except BaseException:
        _setup_failed()
    _run(request, record_fd)


def native_child_main(plan: ChildPlan, payload: bytes, flags: int, *, reseeded: bool) -> NoReturn:
    """A child whose set-up _nativechild.serve did (see _nativechild.c): everything
    child_main does up to the request, and for a plain one (``flags`` >= 0: ``payload``
    is its code) its limits and "ready" too; a request with inputs (``flags`` -1:
    ``payload`` is the whole request) is finished here. The zygote prepared ``__main__``
    and the streams once (see zygote.serve_natively). ``reseeded``: the C set-up
    reseeded every generator _reseed would (native.generators)."""
    if flags >= 0 and plan.mode == "fork" and reseeded:
        # The common case, with nothing more to build: every object made or touched
        # here is pages the child copies.
        runtime.run_snippet(
            payload,
            auto_print=bool(flags & contract.FLAG_AUTO_PRINT),
            rich=bool(flags & contract.FLAG_RICH_TRACEBACKS),
        )
    try:
        if not reseeded:
            _reseed()
        if flags < 0:
            request = ChildRequest.decode(payload)
            record_fd = _start(plan, request, plan.env)
        else:
            auto_print = bool(flags & contract.FLAG_AUTO_PRINT)
            rich = bool(flags & contract.FLAG_RICH_TRACEBACKS)
            request = ChildRequest(payload, auto_print, 0, 0, 0, 0, rich)
            record_fd = None
            if plan.mode == "spawn":
                _exec_interpreter(request, None, plan.env)
    except BaseException:
        _setup_failed()
    _run(request, record_fd)


def _start(plan: ChildPlan, request: ChildRequest, env: dict[str, str]) -> int | None:
    """Inputs, limits, "ready"; spawn mode execs its interpreter here. Returns the
    cells' record fd."""
    inputs.write_files(request.files)  # before the limits: their size was checked
    if request.stdin is not None:
        inputs.give_stdin(request.stdin)
    _apply_limits(request, plan.vm_baseline_bytes, nproc_headroom=_nproc_headroom(plan))
    record_fd = inputs.say_ready(REQUEST_FD, READY, fetch=request.fetch, cells=request.cells)
    if plan.mode == "spawn":
        _exec_interpreter(request, record_fd, env)
    if not request.context:  # a context keeps it: its control socket
        os.close(REQUEST_FD)
    return record_fd


def _run(request: ChildRequest, record_fd: int | None) -> NoReturn:
    if request.context:
        context_child.serve(_reseed)
    if request.cells is not None:
        cells.run_cells(
            request.cells, request.cell_timeout_s, record_fd, rich=request.rich_tracebacks
        )
    runtime.run_snippet(request.code, auto_print=request.auto_print, rich=request.rich_tracebacks)


def _setup_failed() -> NoReturn:
    try:
        os.write(2, traceback.format_exc().encode("utf-8", "replace"))
    finally:
        os._exit(contract.SETUP_FAILED_EXIT)


# What a child may write and read besides the plan's read-only paths: with a PID
# namespace, the mounts it made itself (the zygote's fds would name what they cover).
WRITABLE = (*isolation.VOLATILE_ROOTS, "/dev/null")
READABLE = ("/proc",)


def _restrict(plan: ChildPlan, cwd: str) -> None:
    """The second layer: Landlock, then seccomp."""
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    if plan.state.pidns:
        landlock.restrict(plan.guard, list(WRITABLE), READABLE)
    else:
        # The host's /dev/shm, where sem_open and shm_open keep their files: usable by
        # name but not listable; what snippets leave there is swept after them (shm.py).
        landlock.restrict(plan.guard, [cwd, "/dev/null"], unlisted=(shm.DIRECTORY,))
    plan.syscalls.install()


def _arrange_fds(fds: list[int], *, keep: range) -> None:
    # Move our fds out of the way first so the dup2s below cannot clobber each other.
    request_fd, out_fd, err_fd, done_fd = (os.dup(fd) for fd in fds)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.dup2(request_fd, REQUEST_FD)
    os.dup2(done_fd, contract.DONE_FD)
    # Nothing of the zygote's (client sockets, other children's files) stays reachable;
    # the Landlock layer's fds (``keep``) are closed when it is in place.
    top = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    os.closerange(contract.DONE_FD + 1, keep.start if keep else top)
    if keep:
        os.closerange(keep.stop, top)


# What the supervisor sends a waiting child (contract.HEAD_FORMAT). Plain bytes and
# struct, not msgpack for all of it: every code path a child runs first is pages it
# faults in, and most snippets have no inputs.
_HEAD = struct.Struct(contract.HEAD_FORMAT)
assert _HEAD.size == contract.HEAD_SIZE
# The offsets the C set-up reads the fields at are where this format packs them.
assert list(contract.HEAD_OFFSETS.values()) == [
    struct.calcsize(contract.HEAD_FORMAT[: i + 1]) for i in range(len(contract.HEAD_OFFSETS))
]


@dataclass(frozen=True)
class ChildRequest:
    """A waiting child's request: the source, its inputs and its limits, already checked
    and reduced to what the child applies (no Limits to decode here)."""

    code: bytes
    auto_print: bool
    cpu_s: int
    memory_mb: int
    max_file_mb: int
    max_procs: int
    rich_tracebacks: bool = False
    stdin: bytes | None = None
    files: list[list[Any]] = field(default_factory=list)  # [path, content] pairs
    fetch: bool = False  # hand the supervisor the work dir, to read files back from
    cells: list[str] | None = None
    cell_timeout_s: float | None = None
    context: bool = False  # start an interpreter context (context_child.py), not a snippet

    @classmethod
    def encode(
        cls, code: bytes, limits: Limits, snippet: Snippet | None = None, *, context: bool = False
    ) -> bytes:
        extra = b""
        if snippet is not None and snippet.has_inputs:
            files = [list(pair) for pair in snippet.files]
            cells = None if snippet.cells is None else [cell_to_wire(c) for c in snippet.cells]
            fields = [snippet.stdin, files, bool(snippet.fetch_files), cells]
            extra = codec.dumps([*fields, snippet.cell_timeout_s])
        elif context:  # through the inputs path: the C set-up hands such requests to Python
            extra = codec.dumps([None, [], False, None, None, True])
        head = _HEAD.pack(
            len(code),
            len(extra),
            limits.cpu_rlimit_s,
            limits.memory_mb,
            limits.max_file_mb,
            limits.max_procs,
            limits.auto_print,
            limits.rich_tracebacks,
        )
        return head + code + extra

    @classmethod
    def decode(cls, data: bytes) -> ChildRequest:
        code_len, extra_len, cpu_s, memory_mb, max_file_mb, max_procs, auto, rich = (
            _HEAD.unpack_from(data)
        )
        code = data[_HEAD.size : _HEAD.size + code_len]
        request = cls(code, bool(auto), cpu_s, memory_mb, max_file_mb, max_procs, bool(rich))
        if not extra_len:
            return request
        stdin, files, fetch, cells, cell_timeout_s, *rest = codec.loads(
            data[_HEAD.size + code_len :]
        )
        return dataclasses.replace(
            request,
            stdin=stdin,
            files=files,
            fetch=fetch,
            cells=None if cells is None else [cell_from_wire(cell) for cell in cells],
            cell_timeout_s=cell_timeout_s,
            context=bool(rest and rest[0]),
        )


def _read_request() -> ChildRequest | None:
    data = bytearray()
    need = _HEAD.size
    while len(data) < need:
        chunk = os.read(REQUEST_FD, 1 << 20)
        if not chunk:
            return None
        data += chunk
        if need == _HEAD.size and len(data) >= need:
            code_len, extra_len = _HEAD.unpack_from(data)[:2]
            need += code_len + extra_len
    return ChildRequest.decode(bytes(data))


def _nproc_headroom(plan: ChildPlan) -> int:
    """What RLIMIT_NPROC adds to ``max_procs``: the tasks that count against the same
    limit but are not the snippet's."""
    if plan.uid is not None:
        return 0  # a uid of its own: counted per snippet
    if plan.state.userns:
        return plan.nproc_headroom  # counted per uid inside the user namespace only
    # The worker user's own uid, shared with the worker and whatever else that user runs:
    # counted now, as the snippet starts, so the snippet gets ``max_procs`` beyond it.
    return uid_tasks(os.getuid())


def uid_tasks(uid: int) -> int:
    """Tasks (threads included, as the kernel counts them for RLIMIT_NPROC) of ``uid``:
    one stat per process, since /proc/PID/task is owned by the task's uid and links one
    entry per thread. A non-dumpable process shows as root's and is missed, which only
    makes the snippet's limit tighter."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                tasks = os.stat(f"/proc/{name}/task")
            except OSError:
                continue  # gone meanwhile
            if tasks.st_uid == uid:
                count += max(tasks.st_nlink - 2, 1)
    return count


def _apply_limits(limits: ChildRequest, vm_baseline_bytes: int, *, nproc_headroom: int) -> None:
    cpu_s = limits.cpu_s
    # A context moves its soft CPU limit before each call (context_child.py): the hard
    # one stays open, since an unprivileged process can never raise it again.
    cpu_hard = resource.RLIM_INFINITY if limits.context else cpu_s + 1
    address_space = vm_baseline_bytes + (limits.memory_mb << 20)
    file_bytes = limits.max_file_mb << 20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_hard))
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_OPEN_FILES, MAX_OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Counted per uid (in the user namespace, when there is one).
    nproc = limits.max_procs + nproc_headroom
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # The uid change cleared these; dumpable keeps /proc/self readable by the snippet.
    linux.prctl(linux.PR_SET_DUMPABLE, 1)
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)


def _reseed() -> None:
    # The zygote forks without Python's after-fork hooks (see linux.fork_with_flags), so
    # `random` is reseeded here, as its hook would; numpy's never was.
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        # A full MT19937 key from the kernel: seed() without one costs several times
        # more (it runs SeedSequence in Python), and every child pays it.
        key = sys.modules["numpy"].frombuffer(os.urandom(2496), dtype="uint32")
        numpy_random.seed(key)


def _exec_interpreter(
    request: ChildRequest, record_fd: int | None, env: dict[str, str]
) -> NoReturn:
    source = json.dumps(request.cells).encode() if request.cells is not None else request.code
    source_fd = os.memfd_create("source", 0)
    os.write(source_fd, source)
    os.lseek(source_fd, 0, os.SEEK_SET)
    os.dup2(source_fd, spawn_entry.CODE_FD)
    os.close(source_fd)
    argv = [sys.executable, "-B", "-c", spawn_entry.SPAWN_BOOT]
    if request.auto_print:
        argv.append("--auto-print")
    if request.rich_tracebacks:
        argv.append("--rich-tracebacks")
    if request.cells is not None:
        assert record_fd is not None
        if record_fd != contract.RECORD_FD:
            os.dup2(record_fd, contract.RECORD_FD)
        os.set_inheritable(contract.RECORD_FD, True)
        argv += ["--cells", "" if request.cell_timeout_s is None else str(request.cell_timeout_s)]
    os.execve(sys.executable, argv, env)
