"""``codepool worker``: one host's executor shared by K RQ dispatcher processes.

The host process owns the LocalExecutor (the zygote and its N slots) and starts K
dispatchers, each an RQ SimpleWorker on the queue that attaches to the zygote's socket.
A batch is announced to the host once: the dispatcher that joins it may use every slot
its siblings leave free (worker/host_window.py). A batch holding a straggler therefore
keeps one slot, not the host: the other dispatchers go on taking work. Signals: the
first SIGTERM/SIGINT asks dispatchers to finish their in-flight snippets (what they
claimed and never started is given back) and exit; the second kills them at once.
Dispatchers that die, or stop because their lease was taken away, are restarted with
fresh names, so a kill -9 never leaves a stale name to crash-loop on.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from types import FrameType

import redis

from codepool.common.connection import redis_client
from codepool.common.host_cpus import default_slots
from codepool.common.limits import Limits
from codepool.common.settings import Settings
from codepool.worker import host_window
from codepool.worker.dispatcher import WINDOW_FILE, DispatcherConfig
from codepool.worker.engine import leftovers
from codepool.worker.engine.executor import LocalExecutor
from codepool.worker.engine.reaping import wait_or_kill

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 5.0
FORGET_HOSTS_AFTER_S = 3600.0
HOST_DIR_PREFIX = "codepool-worker-"
QUICK_EXIT_S = 10.0
STOP_GRACE_S = 600.0


@dataclass(frozen=True)
class WorkerOptions:
    """What ``codepool worker`` was asked for."""

    concurrency: int = field(default_factory=default_slots)  # snippet slots
    dispatchers: int = 0  # 0: one per slot, at least 2
    mode: str = "fork"
    preload: tuple[str, ...] = ("numpy", "sympy")
    burst: bool = False
    name: str = ""
    max_limits: Limits = field(default_factory=Limits)
    log_level: str = "INFO"
    allow_weak_isolation: bool = False


class WorkerHost:
    def __init__(self, settings: Settings, options: WorkerOptions) -> None:
        self.settings = settings
        self.options = options
        self.name = options.name or f"{socket.gethostname()}.{os.getpid()}"
        self.dispatcher_count = options.dispatchers or max(2, options.concurrency)
        self.signals = 0
        self.dispatchers: dict[int, subprocess.Popen[bytes]] = {}
        self._started_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._restart_at: dict[int, float] = {}
        # 0700, named by our pid; a host killed -9 leaves its dir for the next to sweep.
        leftovers.sweep(HOST_DIR_PREFIX, b"worker")
        self._dir = leftovers.make_dir(HOST_DIR_PREFIX)
        self._window_path = os.path.join(self._dir, WINDOW_FILE)
        self.executor: LocalExecutor | None = None
        self.conn: redis.Redis = redis_client(settings)

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.executor = LocalExecutor(
                concurrency=self.options.concurrency,
                mode=self.options.mode,
                preload=self.options.preload,
                max_limits=self.options.max_limits,
                allow_weak_isolation=self.options.allow_weak_isolation,
                listen_path=os.path.join(self._dir, "zygote.sock"),
                name=self.name,
            )
            log.info(
                "worker %s: %d slots (%s mode), %d dispatchers on queue %r",
                self.name,
                self.options.concurrency,
                self.options.mode,
                self.dispatcher_count,
                self.settings.queue,
            )
            host_window.create(self._window_path, self.dispatcher_count)
            for slot in range(self.dispatcher_count):
                self._start_dispatcher(slot)
            self._supervise()
        finally:
            self._stop_dispatchers()
            if self.executor is not None:
                self.executor.close()
            self._forget()
            shutil.rmtree(self._dir, ignore_errors=True)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info(
                "worker %s: %s: finishing in-flight snippets, then exiting",
                self.name,
                signal.Signals(signum).name,
            )
            for process in self.dispatchers.values():
                _signal(process, signal.SIGTERM)
        else:
            log.warning("worker %s: second signal: stopping now", self.name)
            for process in self.dispatchers.values():
                _signal(process, signal.SIGKILL)

    def _start_dispatcher(self, slot: int) -> None:
        config = DispatcherConfig(
            settings=asdict(self.settings),
            socket_path=os.path.join(self._dir, "zygote.sock"),
            # Unique per start: RQ refuses a live name, and a killed one lingers until TTL.
            name=f"{self.name}.{slot}.{uuid.uuid4().hex[:8]}",
            parent_pid=os.getpid(),
            host=self.name,
            max_limits=self.options.max_limits.to_dict(),
            slots=self.options.concurrency,
            dispatchers=self.dispatcher_count,
            slot=slot,
            host_dir=self._dir,
            burst=self.options.burst,
            log_level=self.options.log_level,
        )
        # The config (Redis URL and password included) goes through a pipe, not argv:
        # a command line is visible to every local user.
        process = subprocess.Popen(
            [sys.executable, "-m", "codepool.worker.dispatcher"], stdin=subprocess.PIPE
        )
        assert process.stdin is not None
        process.stdin.write(config.to_json().encode())
        process.stdin.close()
        self.dispatchers[slot] = process
        self._started_at[slot] = time.monotonic()

    def _supervise(self) -> None:
        last_beat = 0.0
        while self.dispatchers or (self._restart_at and not self.signals):
            if time.monotonic() - last_beat > HEARTBEAT_EVERY_S:
                self._heartbeat()
                last_beat = time.monotonic()
            time.sleep(0.2)
            for slot, process in list(self.dispatchers.items()):
                code = process.poll()
                if code is None:
                    continue
                del self.dispatchers[slot]
                # What it had in the executor is not the host's to count any more.
                host_window.clear(self._window_path, slot)
                if self.signals or self.options.burst:
                    continue
                # One that dies young (Redis down, say) waits longer each time.
                quick = time.monotonic() - self._started_at[slot] < QUICK_EXIT_S
                self._failures[slot] = self._failures.get(slot, 0) + 1 if quick else 0
                delay_s = min(30.0, 0.5 * 2 ** self._failures[slot]) if quick else 0.0
                log.error(
                    "worker %s: dispatcher %d exited with %s; restarting it in %.1f s",
                    self.name,
                    slot,
                    code,
                    delay_s,
                )
                self._restart_at[slot] = time.monotonic() + delay_s
            for slot, when in list(self._restart_at.items()):
                if time.monotonic() >= when and not self.signals:
                    del self._restart_at[slot]
                    self._start_dispatcher(slot)

    def _stop_dispatchers(self) -> None:
        for process in self.dispatchers.values():
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.dispatchers.values():
            wait_or_kill(process, max(0.1, deadline - time.monotonic()))

    def _heartbeat(self) -> None:
        keys = self.settings.keys
        now = time.time()
        try:
            with self.conn.pipeline(transaction=False) as pipe:
                pipe.zadd(keys.workers(), {self.name: now})
                # Hosts killed and never back (the scores are Redis server time; an
                # hour is far beyond any clock skew).
                pipe.zremrangebyscore(keys.hosts(), "-inf", now - FORGET_HOSTS_AFTER_S)
                pipe.hset(
                    keys.worker_stats(self.name),
                    mapping={
                        "heartbeat": int(now),
                        "slots": self.options.concurrency,
                        "dispatchers": self.dispatcher_count,
                        "mode": self.options.mode,
                    },
                )
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("worker %s: heartbeat failed: %s", self.name, exc)

    def _forget(self) -> None:
        keys = self.settings.keys
        try:
            with self.conn.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.workers(), self.name)
                pipe.zrem(keys.hosts(), self.name)
                pipe.execute()
        except redis.RedisError:
            pass


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass
