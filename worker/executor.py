"""LocalExecutor: the host executor every worker runs (client side of the zygote).

Thread-safe: any number of threads may call ``run``/``submit`` at once. The zygote
runs at most ``concurrency`` snippets at a time and queues the rest, so a straggler
holds one slot only. If the zygote dies it is restarted; snippets in flight are re-run
once, then come back with ``status="infra"``.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from codepool.common.errors import ConfigError, ExecutorError
from codepool.common.limits import Limits
from codepool.common.result import ExecResult, infra, rejected
from codepool.worker.protocol import FrameReader, encode_frame, recv_one
from codepool.worker.zygote import ZygoteConfig

log = logging.getLogger(__name__)

MODES = ("fork", "spawn")
DEFAULT_PRELOAD = ("numpy", "sympy")
MAX_ATTEMPTS = 2
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


@dataclass
class _Pending:
    future: Future[ExecResult]
    code: bytes
    limits: Limits
    submitted: float
    attempts: int = 0
    generation: int = -1  # which zygote it was last sent to


class LocalExecutor:
    """Runs snippets in isolated, resource-limited children of a warm zygote.

    concurrency: snippets running at once (the host's slots).
    mode: ``"fork"`` (children forked from a zygote that preloaded ``preload``) or
        ``"spawn"`` (a fresh interpreter per snippet; same limits and isolation).
    limits: defaults for every call; per-call keywords override them.
    max_limits: the ceiling; requests are clamped to it (defaults to ``limits``'s
        values raised to the stock defaults, i.e. ``Limits()`` or above).
    env / pass_env: extra variables for snippets, and names copied from this process.
    disk_mb: size of each snippet's private /tmp, /var/tmp and /dev/shm (tmpfs, MiB).
    uid_base: first uid of the per-slot snippet uids (root only).
    namespaces: use Linux namespaces where the host allows (False forces the fallback:
        rlimits, separate uids when root, kill and clean-up per snippet; see doctor).
    """

    def __init__(
        self,
        *,
        concurrency: int = 2,
        mode: str = "fork",
        preload: Iterable[str] = DEFAULT_PRELOAD,
        limits: Limits | None = None,
        max_limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Iterable[str] = (),
        disk_mb: int = 64,
        uid_base: int | None = None,
        namespaces: bool = True,
        name: str | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"concurrency must be a positive int, got {concurrency!r}")
        if sys.platform != "linux":
            raise ExecutorError("the executor needs Linux (namespaces, rlimits, fork)")
        self.limits = limits or Limits()
        self.max_limits = max_limits or self.limits
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
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
        )
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._closing = False
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._generation = 0
        self._restarting = False
        self.report: list[dict[str, Any]] = []
        self.zygote_pid = 0
        self.snippet_uids: range = range(0)  # uids snippets run as (empty: worker's own)
        self.restarts = 0
        self._start_zygote()

    # -- public API ------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._config.mode

    @property
    def concurrency(self) -> int:
        return self._config.concurrency

    def submit(self, code: Any, **limits: Any) -> Future[ExecResult]:
        """Queue one snippet; the future resolves to its ExecResult. Never raises for bad
        code (that is a ``rejected`` result); raises ConfigError for bad limit keywords."""
        effective = self.limits.with_overrides(**limits).clamp(self.max_limits)
        future: Future[ExecResult] = Future()
        if not isinstance(code, str):
            future.set_result(
                rejected(f"rejected: code must be str, got {type(code).__name__}", worker=self.name)
            )
            return future
        # surrogatepass keeps lone surrogates; the child's compile() reports them as
        # Python reports undecodable source.
        data = code.encode("utf-8", "surrogatepass")
        if len(data) > effective.max_code_bytes:
            future.set_result(
                rejected(
                    f"rejected: code is {len(data)} bytes, over the {effective.max_code_bytes} "
                    "byte limit",
                    worker=self.name,
                )
            )
            return future
        pending = _Pending(future, data, effective, time.monotonic())
        with self._lock:
            if self._closing:
                raise ExecutorError("executor is closed")
            request_id = next(self._ids)
            self._pending[request_id] = pending
            sock, generation, restarting = self._sock, self._generation, self._restarting
        if sock is not None:
            self._send(sock, generation, request_id, pending)
        elif not restarting:
            self._finish(
                request_id, infra("codepool: the executor's zygote is down", worker=self.name)
            )
        # else: the restart re-sends everything still pending
        return future

    def run(self, code: Any, **limits: Any) -> ExecResult:
        """Run one snippet and wait for its result. Keywords: Limits fields."""
        return self.submit(code, **limits).result()

    def run_many(self, codes: Iterable[Any], **limits: Any) -> list[ExecResult]:
        """Run snippets concurrently (up to ``concurrency``); results in input order."""
        futures = [self.submit(code, **limits) for code in codes]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the zygote and every snippet; pending calls come back as infra."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            sock, process, reader = self._sock, self._process, self._reader
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if process is not None:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=10)
        if sock is not None:
            sock.close()
        self._fail_all("codepool: executor closed before this snippet finished")

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- zygote lifecycle ------------------------------------------------------------

    def _start_zygote(self) -> None:
        ours, theirs = socket.socketpair()
        self._config.owner_fd = theirs.fileno()
        env = dict(self._env)
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        argv = [sys.executable, "-P", "-B", "-m", "codepool.worker.zygote", self._config.to_json()]
        try:
            process = subprocess.Popen(
                argv,
                pass_fds=[theirs.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        ours.settimeout(self.start_timeout_s)
        try:
            hello = recv_one(ours, FrameReader())
        except (OSError, ValueError) as exc:
            hello = None
            log.error("zygote did not start: %s", exc)
        if hello is None or hello.get("t") != "hello":
            process.kill()
            process.wait()
            ours.close()
            raise ExecutorError("the zygote failed to start; see its stderr above")
        ours.settimeout(None)
        self.report = list(hello["report"])
        self.zygote_pid = int(hello["pid"])
        uids = hello.get("uids")
        self.snippet_uids = range(uids[0], uids[1]) if uids else range(0)
        reader = threading.Thread(
            target=self._read_results,
            args=(ours, process),
            name="codepool-executor-reader",
            daemon=True,
        )
        with self._lock:
            self._sock, self._process, self._reader = ours, process, reader
            self._generation += 1
            generation = self._generation
            # Taken with the swap, so a concurrent submit is never sent twice.
            unsent = [(i, p) for i, p in self._pending.items() if p.generation < generation]
            self._restarting = False
        reader.start()
        for request_id, pending in unsent:
            if pending.attempts >= MAX_ATTEMPTS:
                self._finish(
                    request_id,
                    infra(
                        "codepool: the executor failed twice while running this snippet",
                        worker=self.name,
                    ),
                )
            else:
                self._send(ours, generation, request_id, pending)

    def _read_results(self, sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
        reader = FrameReader()
        while True:
            try:
                data = sock.recv(1 << 20)
                messages = reader.feed(data) if data else None
            except (OSError, ValueError) as exc:
                log.error("lost the zygote connection: %s", exc)
                messages = None
            if messages is None:
                break
            for message in messages:
                if message.get("t") == "result":
                    self._on_result(message["id"], message["r"])
        process.wait()
        with self._lock:
            if self._closing:
                return
            self._sock = None
            self._restarting = True
        log.error("zygote %d exited with %s; restarting it", process.pid, process.returncode)
        self._restart()

    def _restart(self) -> None:
        self.restarts += 1
        try:
            self._start_zygote()
        except ExecutorError as exc:
            with self._lock:
                self._restarting = False
            self._fail_all(f"codepool: zygote restart failed: {exc}")

    def _send(
        self, sock: socket.socket, generation: int, request_id: int, pending: _Pending
    ) -> None:
        pending.attempts += 1
        pending.generation = generation
        frame = encode_frame(
            {"t": "run", "id": request_id, "code": pending.code, "limits": pending.limits.to_dict()}
        )
        try:
            with self._send_lock:
                sock.sendall(frame)
        except OSError:
            pass  # the reader sees the zygote die and re-sends or fails this request

    def _on_result(self, request_id: int, record: dict[str, Any]) -> None:
        with self._lock:
            pending = self._pending.get(request_id)
        if pending is None:
            return
        record = dict(record, latency=time.monotonic() - pending.submitted, worker=self.name)
        self._finish(request_id, ExecResult.from_dict(record))

    def _finish(self, request_id: int, result: ExecResult) -> None:
        with self._lock:
            pending = self._pending.pop(request_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_result(result)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            ids = list(self._pending)
        for request_id in ids:
            self._finish(request_id, infra(message, worker=self.name))
