"""LocalExecutor: the host executor every worker runs; it starts and owns the
supervisor (which starts the zygotes) and is its first client.

Thread-safe: any number of threads may call ``run``/``submit`` at once. The supervisor
runs at most ``concurrency`` snippets at a time and queues the rest, so a straggler
holds one slot only. If the supervisor or a zygote dies, both are restarted; snippets
in flight are re-run once, then come back with ``status="infra"``.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from codepool.common.errors import ConfigError, ExecutorError
from codepool.common.host_cpus import default_slots
from codepool.common.host_memory import usable_mb
from codepool.common.limits import Limits
from codepool.common.reaping import wait_or_kill
from codepool.worker.engine.client import SupervisorClient
from codepool.worker.engine.config import ZygoteConfig, send_config

log = logging.getLogger(__name__)

MODES = ("fork", "spawn")
DEFAULT_PRELOAD = ("numpy", "sympy")
# BLAS pools would multiply threads per snippet and make the zygote multi-threaded.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_NUMEXPR_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def snippet_env(
    extra: Mapping[str, str] | None = None, pass_env: Iterable[str] = ()
) -> dict[str, str]:
    """The allow-listed environment a snippet sees: nothing of the worker's unless named."""
    bin_dir = os.path.dirname(sys.executable)
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
    }
    env.update({name: "1" for name in THREAD_VARS})
    for name in pass_env:
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(extra or {})
    return env


class LocalExecutor(SupervisorClient):
    """Runs snippets in isolated, resource-limited children of a warm zygote it owns.

    concurrency: snippets running at once (the host's slots); default the CPUs this
        process may use (its CPU affinity, capped by its cgroup's CPU quota:
        common/host_cpus.py).
    mode: ``"fork"`` (children forked from a zygote that preloaded ``preload``) or
        ``"spawn"`` (a fresh interpreter per snippet; same limits and isolation).
    limits: defaults for every call; per-call keywords override them.
    max_limits: the ceiling requests are clamped to (defaults to ``limits``).
    env / pass_env: extra variables for snippets, and names copied from this process.
    disk_mb: size of each snippet's private /tmp, /var/tmp and /dev/shm (tmpfs, MiB).
    uid_base: first uid of the per-slot snippet uids (root only).
    namespaces: use Linux namespaces where the host allows (False forces the fallback:
        rlimits, separate uids when root, kill and clean-up per snippet; see doctor).
    landlock: the second isolation layer in every child (Landlock: files, TCP, signal
        and abstract-socket scope; seccomp: socket families and dangerous syscalls);
        turn it off only to measure what it costs.
    light_zygote: in fork mode with a preload, snippets whose imports are all in the
        standard library fork from a second zygote that preloads nothing, and with two or
        more modules preloaded, those that import only the first from a third that
        preloads just it (much cheaper per snippet; ExecResult.zygote says which ran);
        off (one zygote) only to measure the gain.
    native_child: the zygote's clone loop and each child's set-up in C where the
        extension was built (about 1 ms less CPU per snippet; the report's "child
        set-up" line says which runs and why); off to measure or test the Python steps.
    allow_weak_isolation: run even where neither a PID namespace nor Landlock is to be
        had (snippets could then signal the worker's processes and reach its files);
        without it such an executor refuses to start, naming what is missing.
    listen_path: also accept other clients (AttachedExecutor) on this Unix socket.
    max_contexts: interpreter contexts (``context()``) alive at once; default one per
        256 MiB of the host's memory, 4 to 1024 (an idle context holds memory, no slot).
    context_ttl_s: an interpreter context idle this long is ended (its state gone).
    """

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        mode: str = "fork",
        preload: Iterable[str] = DEFAULT_PRELOAD,
        limits: Limits | None = None,
        max_limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Iterable[str] = (),
        disk_mb: int = 64,
        uid_base: int | None = None,
        namespaces: bool = True,
        landlock: bool = True,
        light_zygote: bool = True,
        native_child: bool = True,
        allow_weak_isolation: bool = False,
        listen_path: str | None = None,
        name: str | None = None,
        start_timeout_s: float = 120.0,
        max_contexts: int | None = None,
        context_ttl_s: float = 300.0,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        if concurrency is None:
            concurrency = default_slots()
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be a positive int, got {concurrency!r}")
        if max_contexts is None:
            max_contexts = default_max_contexts()
        if not isinstance(max_contexts, int) or not 1 <= max_contexts <= 1024:
            raise ConfigError(f"max_contexts must be an int from 1 to 1024, got {max_contexts!r}")
        if not context_ttl_s > 0:
            raise ConfigError(f"context_ttl_s must be positive, got {context_ttl_s!r}")
        if sys.platform != "linux":
            raise ExecutorError("the executor needs Linux (namespaces, rlimits, fork)")
        super().__init__(limits=limits, max_limits=max_limits, name=name)
        self.start_timeout_s = start_timeout_s
        self._env = snippet_env(env, pass_env)
        self._config = ZygoteConfig(
            mode=mode,
            concurrency=concurrency,
            preload=list(preload),
            uid_base=uid_base,
            disk_mb=disk_mb,
            env=self._env,
            namespaces=namespaces,
            landlock=landlock,
            light_zygote=light_zygote,
            native_child=native_child,
            max_contexts=max_contexts,
            context_ttl_s=context_ttl_s,
        )
        self._process: subprocess.Popen[bytes] | None = None
        self._listener: socket.socket | None = None
        if listen_path is not None:
            self._listener = _listen(listen_path)
        self._connect()
        missing = weak_isolation(self.report)
        if missing and not allow_weak_isolation:
            self.close()
            raise ExecutorError(
                f"refusing to run snippets with weak isolation: {missing}. Pass "
                "allow_weak_isolation=True (codepool worker --allow-weak-isolation) to run "
                "anyway, or give the worker namespaces or a kernel with Landlock"
            )

    @property
    def mode(self) -> str:
        return self._config.mode

    def _open(self) -> socket.socket:
        ours, theirs = socket.socketpair()
        self._config.owner_fd = theirs.fileno()
        fds = [theirs.fileno()]
        if self._listener is not None:
            self._config.listen_fd = self._listener.fileno()
            fds.append(self._listener.fileno())
        env = dict(self._env)
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        argv = [sys.executable, "-P", "-B", "-m", "codepool.worker.engine.supervisor"]
        try:
            # The config (the snippet environment included) goes on a pipe: every local
            # user can read a command line.
            self._process = subprocess.Popen(
                argv, pass_fds=fds, env=env, stdin=subprocess.PIPE, start_new_session=True
            )
            send_config(self._process, self._config)
        finally:
            theirs.close()
        ours.settimeout(self.start_timeout_s)
        return ours

    def _lost(self) -> None:
        if self._process is not None:
            self._process.wait()
            if not self._closing:
                log.error(
                    "zygote %d exited with %s; restarting it",
                    self._process.pid,
                    self._process.returncode,
                )

    def _shutdown(self) -> None:
        if self._process is not None:
            wait_or_kill(self._process)
        if self._listener is not None:
            path = self._listener.getsockname()
            self._listener.close()
            if isinstance(path, str) and path:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def _connect(self) -> None:
        try:
            super()._connect()
        except ExecutorError:
            if self._process is not None:
                self._process.kill()
                self._process.wait()
            raise

    def __enter__(self) -> LocalExecutor:
        return self


def default_max_contexts(*, proc_self: str = "/proc/self") -> int:
    """One live context per 256 MiB of the memory the host may use (its cgroup's limit
    where lower than its physical memory: a container's), from 4 to 1024: an idle
    context holds the pages it wrote since its fork (tens of MiB for a numpy session)."""
    total_mb = usable_mb(proc_self=proc_self)
    if total_mb is None:
        return 4
    return max(4, min(1024, total_mb // 256))


def weak_isolation(report: list[dict[str, Any]]) -> str:
    """What is missing when neither layer can keep a snippet off the worker: no PID
    namespace and no Landlock. Empty when isolation holds."""
    lines = {str(line["name"]): line for line in report}
    pidns = bool(lines.get("processes", {}).get("active"))
    landlock = lines.get("landlock", {})
    if pidns or landlock.get("active"):
        return ""
    return (
        f"no PID namespace ({lines.get('namespaces', lines.get('processes', {})).get('detail')}) "
        f"and no Landlock ({landlock.get('detail', 'not reported')})"
    )


def _listen(path: str) -> socket.socket:
    # Only the worker's own uid may connect: snippets run as other uids, and the
    # socket's directory is created 0700 by the caller (worker host) or here.
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    return listener
