"""The embedded default: a private Redis (unix socket in a temp dir) and a local worker,
started for one command (``codepool replay`` or ``serve`` without ``--url``) and stopped
after it, or killed with it (ops/parent_death.py).

Each pool keeps its files (the server's socket and log, the worker's log) in one dir
named after its command's pid and start time: a command killed with SIGKILL tidies
nothing, so the next embedded pool on the host removes the dirs whose command is gone."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import redis
from rq import Worker

from codepool.common.errors import ConfigError
from codepool.common.process_start import start_ticks
from codepool.common.reaping import wait_or_kill
from codepool.common.socket_dirs import owner_of, pid_namespace_tag, socket_bases
from codepool.ops.arguments import cli_command
from codepool.ops.parent_death import die_with_parent
from codepool.ops.redis_server import RedisServer

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
# The embedded worker's drain deadline: once its command stops, nobody waits for what
# it runs, so it gives everything up at once.
WORKER_DRAIN_S = 1.0
# Stopping the embedded pool takes at most about this long; a command's own drain leaves
# it this much of its deadline.
STOP_S = 2.0
# An embedded pool's dir: {prefix}{command pid}.{its start ticks}-XXXX.
HOME_PREFIX = "codepool-embedded-"


def url_or_embedded(stack: ExitStack, url: str | None, concurrency: int | None) -> str:
    """``url``, or ``$REDIS_URL``, or else the embedded default, entered on ``stack`` (so
    it stops with it) and said on stderr: a command's ``--url`` rule in one place."""
    url = url or os.environ.get("REDIS_URL")
    if url is not None:
        return url
    print("no --url and no REDIS_URL: starting a private Redis and a local worker", file=sys.stderr)
    return stack.enter_context(embedded_pool(concurrency))


@contextmanager
def embedded_pool(
    concurrency: int | None, preload: tuple[str, ...] = ("numpy", "sympy")
) -> Iterator[str]:
    """Yield the URL of a private Redis with one ``codepool worker`` serving it, with
    ``concurrency`` slots (None: the worker's default, the CPUs it may use). The server
    binary is the first ``server_binary.find_server_binary`` finds (logged)."""
    me, ticks = os.getpid(), start_ticks(os.getpid())
    if ticks is not None:  # where /proc tells whether a command is gone
        sweep_leftovers()
    name = f"{HOME_PREFIX}{me}.{ticks or 0}-{pid_namespace_tag()}"
    home = tempfile.mkdtemp(prefix=name, dir=socket_bases()[0])
    try:
        with _pool_in(home, concurrency, preload) as url:
            yield url
    finally:
        shutil.rmtree(home, ignore_errors=True)


def sweep_leftovers() -> int:
    """Remove the dirs of embedded pools (of this PID namespace) whose command is gone
    (killed with SIGKILL: it tidied nothing); returns how many were removed."""
    removed = 0
    for base in socket_bases():
        for entry in os.scandir(base):
            if not entry.name.startswith(HOME_PREFIX):
                continue
            pid, _, ticks = (owner_of(entry.name, HOME_PREFIX) or "").partition(".")
            if pid.isdigit() and ticks.isdigit() and start_ticks(int(pid)) != int(ticks):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


@contextmanager
def _pool_in(home: str, concurrency: int | None, preload: tuple[str, ...]) -> Iterator[str]:
    # Both die with this process even when it is SIGKILLed (ops/parent_death.py); the
    # worker's own processes die with it in turn.
    redis_dir = os.path.join(home, "redis")
    os.mkdir(redis_dir, 0o700)
    server = RedisServer(unix_socket=True, die_with_parent=True, dir=redis_dir).start()
    if server.binary is not None:  # always, once started
        log.info("embedded: private Redis %s", server.binary.describe())
    log_file = open(os.path.join(home, "worker.log"), "wb")
    name = f"embedded-{os.getpid()}"
    worker = subprocess.Popen(
        die_with_parent(worker_argv(server.url, name, concurrency, preload)),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=log_file,
        start_new_session=True,
    )
    try:
        _wait_ready(server.url, name, worker, log_file.name)
        yield server.url
    finally:
        _stop(worker)
        server.close()
        log_file.close()


def worker_argv(
    url: str, name: str, concurrency: int | None, preload: tuple[str, ...]
) -> list[str]:
    """The embedded worker's command line: ``codepool worker`` with ``-c`` only when
    slots were asked for, so that without it the worker takes the default every command
    has (the CPUs it may use, common/host_cpus.py), in the process that runs the slots."""
    return cli_command(
        "worker",
        "--url",
        url,
        *(["-c", str(concurrency)] if concurrency else []),
        "--preload",
        ",".join(preload),
        "--name",
        name,
        "--drain-timeout",
        str(WORKER_DRAIN_S),
    )


def _wait_ready(url: str, name: str, worker: subprocess.Popen[bytes], log_path: str) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while not any(w.name.startswith(name + ".") for w in Worker.all(connection=client)):
            if worker.poll() is not None or time.monotonic() > deadline:
                with open(log_path, errors="replace") as f:
                    tail = f.read()[-2000:]
                raise ConfigError(f"the embedded worker did not start:\n{tail}")
            time.sleep(0.1)
    finally:
        client.close()


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    # Its own drain deadline bounds it; the margin is for a loaded host.
    wait_or_kill(worker, STOP_S - 0.5, group=True)
