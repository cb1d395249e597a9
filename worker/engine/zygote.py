"""The zygote: preloads modules once, enters the isolation namespaces, and clones.

It never runs user code and does nothing per snippet but one clone: the supervisor
sends the child's four file descriptors (request socket, stdout and stderr files, the
write end of its done pipe) with its uid, the zygote clones a child into fresh PID,
mount and IPC namespaces with ``CLONE_PARENT`` (so the supervisor is its parent) and
answers with the pid. Keeping the loop this small matters: after each fork the zygote
shares its pages with the child, and every page it then writes must be copied again.
Single-threaded by construction.

Run by the supervisor as ``python -B -c`` ZYGOTE_BOOT (supervisor.py: as the reference
runs snippets, so its children's sys.flags are the reference's), its config (JSON) on
stdin.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import logging
import os
import socket
import sys
from dataclasses import dataclass

from codepool.common import codec
from codepool.worker.engine import (
    bare,
    isolation,
    landlock,
    linux,
    native,
    protections,
    runtime,
    seccomp,
)
from codepool.worker.engine.child import ChildPlan, child_main, native_child_main
from codepool.worker.engine.config import ZygoteConfig, enter
from codepool.worker.engine.protocol import CLONE_REPLY, CLONE_REQUEST
from codepool.worker.engine.warmup import warm_up

CLONE_PARENT = 0x00008000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """What the zygote set up once, before its first clone."""

    report: list[dict[str, object]]
    single_threaded: bool
    plan: ChildPlan  # every child's, but for its uid and fallback dir (state, layers)
    native_unavailable: str | None  # why children are set up in Python; None: in C
    seeds: list[tuple[int, int]]  # generators the C set-up reseeds (native.generators)
    reseeded: bool  # ... which are all those child._reseed would


def serve(config: ZygoteConfig, control: socket.socket) -> None:
    ready = prepare(config)
    control.sendall(
        codec.dumps(
            {
                "pid": os.getpid(),
                "report": ready.report,
                "root": ready.plan.state.root,
                "pidns": ready.plan.state.pidns,
                "separate_uid": ready.plan.state.separate_uid,
                "native": ready.native_unavailable is None,
            }
        )
    )
    clone_on_request(config, control, ready)


def prepare(config: ZygoteConfig) -> Prepared:
    """Preload, freeze the heap, enter the namespaces and plan the second layer."""
    report = _preload(config.preload if config.mode == "fork" else [])
    # Preloaded objects are never freed; keep the collector from touching their pages
    # so forked children share them instead of copying.
    gc.collect()
    gc.freeze()
    if config.mode == "fork":
        collapsed, refused = linux.collapse_anonymous_memory()
        report.append(
            {
                "name": "huge pages",
                "active": True,  # a speed-up, not a protection: never a failing line
                "detail": f"{collapsed} MiB of the zygote's heap in 2 MiB pages "
                f"({refused} MiB refused): cheaper fork and exit",
            }
        )
    state = isolation.setup_zygote(namespaces=config.namespaces)
    if config.landlock:
        guard = landlock.plan(isolation.needed_paths())
        state.note("landlock", *guard.describe())
        syscalls = seccomp.build(group_calls=not state.pidns)
        state.note("seccomp", syscalls.program is not None, syscalls.detail)
        protections.note_shared_memory(state, landlock=guard.abi > 0)
    else:
        guard, syscalls = landlock.Plan(0, ()), seccomp.Filter(None, None, "disabled")
        state.note("landlock", False, "disabled by configuration (landlock=False)")
        state.note("seccomp", False, "disabled by configuration (landlock=False)")
        protections.note_shared_memory(state, landlock=False)
    report += state.report()
    threads = len(os.listdir("/proc/self/task"))
    report.append(
        {
            "name": "zygote threads",
            "active": threads == 1,
            "detail": f"{threads} thread(s)"
            + ("" if threads == 1 else ": forking a multi-threaded zygote is unsafe"),
        }
    )
    plan = ChildPlan(
        state,
        config.mode,
        None,
        config.disk_mb,
        config.env,
        bare.vm_size_bytes(),
        None,
        runtime.Fresh.create() if config.mode == "fork" else None,
        guard,
        syscalls,
        # The zygote, two waiting children and the other running snippets.
        nproc_headroom=config.concurrency + 3,
        # Without a PID namespace each child's HOME and TMPDIR are its own work dir.
        env_in_place=state.pidns and dict(os.environ) == config.env,
    )
    why_not = native.unavailable(plan, single_threaded=threads == 1, wanted=config.native_child)
    seeds: list[tuple[int, int]] = []
    reseeded = False
    if why_not is None:
        detail = "in C (_nativechild): the clone loop and each child's set-up"
        seeds, reseeded = native.generators()
        if not reseeded:
            detail += "; the random generators reseeded in Python (a layout it does not know)"
    else:
        detail = f"in Python, about 1 ms more CPU per snippet: {why_not}"
    # A speed-up, not a protection: never a failing line.
    report.append({"name": "child set-up", "active": True, "detail": detail})
    return Prepared(report, threads == 1, plan, why_not, seeds, reseeded)


def clone_on_request(config: ZygoteConfig, control: socket.socket, ready: Prepared) -> None:
    """The loop: one clone per request from the supervisor, until it goes away."""
    plan = ready.plan
    state = plan.state
    flags = isolation.clone_flags(state) | CLONE_PARENT
    if ready.native_unavailable is None:
        if config.bare:
            # Nothing preloaded, so nothing to reseed: the bare image imports no generator.
            arguments = native.serve_arguments(control.fileno(), flags, plan, [])
            try:
                bare.become(arguments, [control.fileno(), *plan.guard.fd_range])
            except OSError as exc:  # it serves from this image instead, only slower
                log.warning("the bare zygote serves from its full image: %s", exc)
        serve_natively(control, flags, ready)
        return
    runtime.done_notice = runtime.say_done
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 4096, 4)
        except OSError:
            message, fds = b"", []
        if len(message) < CLONE_REQUEST.size or len(fds) != 4:
            return  # the supervisor is gone
        (uid,) = CLONE_REQUEST.unpack_from(message)
        fallback_dir = message[CLONE_REQUEST.size :].decode() or None
        ours = dataclasses.replace(plan, uid=None if uid < 0 else uid, fallback_dir=fallback_dir)
        # Without Python's at-fork hooks where that is sound (see fork_with_flags).
        pid = linux.fork_with_flags(flags, hooks=not ready.single_threaded)
        if pid == 0:
            control.close()
            if not state.pidns:
                os.setsid()
            child_main(ours, fds)
        for fd in fds:
            os.close(fd)
        try:
            control.sendall(CLONE_REPLY.pack(pid))
        except OSError:
            return  # the supervisor is gone


def serve_natively(control: socket.socket, flags: int, ready: Prepared) -> None:
    """The clone loop in C (native.serve); in each child it returns the request."""
    plan = ready.plan
    if plan.fresh is not None:
        # Once here rather than in every child: the children are copies of this state,
        # and the zygote runs no Python that reads it until the loop ends.
        runtime.prepare(plan.fresh)
    runtime.reference_signals()  # the children's; serve() ignores SIGINT here
    got = native.serve(control, flags, plan, ready.seeds)
    if got is None:
        return  # the supervisor is gone
    native_child_main(plan, *got, reseeded=ready.reseeded)


def _preload(names: list[str]) -> list[dict[str, object]]:
    loaded, failed = [], []
    for name in names:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # a missing optional package must not stop the pool
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    if not names:
        return []
    warmed = warm_up(loaded)
    detail = "imported " + (", ".join(loaded) or "nothing")
    if warmed:
        detail += "; warmed up " + ", ".join(warmed)
    if failed:
        detail += "; failed: " + "; ".join(failed)
    return [{"name": "preload", "active": not failed, "detail": detail}]


def main() -> None:
    config, control = enter("zygote")
    if not linux.clone_supported():
        sys.exit("codepool: the zygote needs clone(2) flags, unsupported on this CPU")
    serve(config, control)


if __name__ == "__main__":
    main()
