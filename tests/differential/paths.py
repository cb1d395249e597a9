"""The paths a snippet can take, each as a Runner: one call runs a whole batch of cases.

PATHS maps a path's name to a context manager that builds its runner (an executor, a
worker behind Redis, serve...). Another path is one more entry: a context's first call,
its later calls and its forks, notebook cells, as long as it answers ``run`` with one
Outcome per case, in order.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from codepool.common.reaping import wait_or_kill
from codepool.common.result import ExecResult
from tests.differential.corpus import Case

# Long enough for the slowest case (an alarm after 1 s, threads that sleep) under load;
# a case that needs it all is a difference anyway.
TIMEOUT_S = 20.0
ENV_PROBE = "import os, json\nprint(json.dumps(dict(os.environ)))"


@dataclass(frozen=True)
class Outcome:
    """What a run of one case shows: its output, return code (None: timed out) and the
    fetched files."""

    stdout: str
    stderr: str
    returncode: int | None
    files: dict[str, bytes] = field(default_factory=dict)


class Runner(Protocol):
    def run(self, cases: Sequence[Case]) -> list[Outcome]:
        """One Outcome per case, in order."""

    def environment(self) -> dict[str, str]:
        """The environment this path gives a snippet."""


def outcome_of(result: ExecResult) -> Outcome:
    return Outcome(result.stdout, result.stderr, result.returncode, dict(result.files))


class SubmittingRunner:
    """A runner over anything with ``submit(code, **inputs) -> Future[ExecResult]``
    (LocalExecutor, RemoteSandbox): the whole batch submitted at once."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def run(self, cases: Sequence[Case]) -> list[Outcome]:
        futures: list[Future[ExecResult]] = [
            self.target.submit(
                c.code, timeout_s=TIMEOUT_S, files=dict(c.files), fetch_files=list(c.fetch)
            )
            if c.files or c.fetch
            else self.target.submit(c.code, timeout_s=TIMEOUT_S)
            for c in cases
        ]
        return [outcome_of(f.result(timeout=TIMEOUT_S * 20)) for f in futures]

    def environment(self) -> dict[str, str]:
        env: dict[str, str] = json.loads(self.target.submit(ENV_PROBE).result().stdout)
        return env


@contextmanager
def _local(path: str) -> Iterator[Runner]:
    from tests.conftest import executor_on

    with executor_on(path) as ex:
        yield SubmittingRunner(ex)


@contextmanager
def _through_redis() -> Iterator[Runner]:
    """A real ``codepool worker`` behind a private redis-server, and a RemoteSandbox."""
    from codepool.ops.redis_server import RedisServer
    from codepool.producer import RemoteSandbox
    from tests.conftest import WorkerProcess, wait_for_dispatchers

    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        name = f"diff-{os.getpid()}"
        log_path = os.path.join(tmp, "worker.log")
        command = [
            sys.executable,
            "-m",
            "codepool.ops.cli",
            "worker",
            "-c",
            "2",
            "--preload",
            "numpy",
            "--name",
            name,
            "--url",
            server.url,
        ]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        worker = WorkerProcess(name, process, log_path)
        try:
            wait_for_dispatchers(server.url, name, worker)
            sandbox = RemoteSandbox(server.url)
            try:
                yield SubmittingRunner(sandbox)
            finally:
                sandbox.close()
        finally:
            worker.stop()


class ServeRunner:
    """``codepool serve`` over HTTP (SandboxFusion's /run_code), its own Redis and worker."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _one(self, case: Case) -> Outcome:
        import requests

        body: dict[str, Any] = {"code": case.code, "language": "python", "run_timeout": TIMEOUT_S}
        if case.files:
            body["files"] = {p: base64.b64encode(d).decode() for p, d in case.files.items()}
        if case.fetch:
            body["fetch_files"] = list(case.fetch)
        reply = requests.post(f"{self.url}/run_code", json=body, timeout=TIMEOUT_S * 20).json()
        run = reply.get("run_result") or {}
        if run.get("status") == "TimeLimitExceeded":
            code = None
        else:
            code = run.get("return_code")
        files = {p: base64.b64decode(d) for p, d in (reply.get("files") or {}).items()}
        return Outcome(
            run.get("stdout", ""), run.get("stderr", reply.get("message", "")), code, files
        )

    def run(self, cases: Sequence[Case]) -> list[Outcome]:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(self._one, cases))

    def environment(self) -> dict[str, str]:
        env: dict[str, str] = json.loads(self._one(Case("env", "env", ENV_PROBE)).stdout)
        return env


@contextmanager
def _serve() -> Iterator[Runner]:
    from tests.ops.test_serve import start_serve

    with tempfile.TemporaryDirectory() as tmp:
        server = start_serve(Path(tmp) / "serve.log")
        try:
            yield ServeRunner(server.url)
        finally:
            server.process.send_signal(signal.SIGTERM)
            wait_or_kill(server.process, 30)


# Paths that run every n-th case only: spawn mode starts an interpreter per snippet (some
# 25 ms of CPU each), and its runtime is the fork paths' code.
STRIDE = {"spawn": 2}

PATHS: dict[str, Callable[[], AbstractContextManager[Runner]]] = {
    "fork": lambda: _local("fork"),
    "fork-python": lambda: _local("fork-python"),
    "spawn": lambda: _local("spawn"),
    "no-namespaces": lambda: _local("no-namespaces"),
    "redis": _through_redis,
    "serve": _serve,
}


def _context(how: str) -> AbstractContextManager[Runner]:
    from tests.differential.context_paths import context_path

    return context_path(how)


PATHS.update(
    {
        "context-first": lambda: _context("first"),
        "context-later": lambda: _context("later"),
        "context-fork": lambda: _context("fork"),
    }
)


def _cells() -> AbstractContextManager[Runner]:
    from tests.differential.cell_paths import cell_path

    return cell_path()


PATHS["cell"] = _cells
