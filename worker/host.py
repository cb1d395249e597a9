"""``codepool worker``: one host's executor shared by K RQ dispatcher processes.

The host process owns the LocalExecutor (the zygote and its N slots) and starts K
dispatchers, each an RQ SimpleWorker on the queue that attaches to the zygote's socket.
A batch is announced to the host once: the dispatcher that joins it may use every slot
its siblings leave free (worker/host_window.py). A batch holding a straggler therefore
keeps one slot, not the host: the other dispatchers go on taking work. Dispatchers that
die, or stop because their lease was taken away, are restarted with fresh names, so a
kill -9 never leaves a stale name to crash-loop on.

Stopping (``drain_s``, the drain deadline): the first SIGTERM or SIGINT tells every
dispatcher to take no more work and to take back from the executor what has not
started; what runs may finish. CUT_BEFORE_S before the deadline (at most half of it)
each dispatcher is told to take back what still runs (killed); a dispatcher gives back
what it claimed and did not run once nothing of its batch runs, and exits. At the
deadline any dispatcher still there is killed (its lease lapses and the fleet re-runs
what it held, as after a crash). A second signal brings the cut forward to now. The
host then stops its executor and exits: within the deadline, whatever state Redis is
in, since nothing on the way waits on Redis for longer than HOST_REDIS_TIMEOUT_S.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import FrameType

import redis
from redis.sentinel import MasterNotFoundError

from codepool.common import failover
from codepool.common.connection import redis_client
from codepool.common.host_cpus import default_slots
from codepool.common.limits import Limits
from codepool.common.redis_url import redact
from codepool.common.settings import DEFAULT_DRAIN_S, Settings
from codepool.worker import host_window
from codepool.worker.call_server import CallServer
from codepool.worker.context_server import ContextServer
from codepool.worker.dispatcher import LEASE_FILE, WINDOW_FILE, DispatcherConfig
from codepool.worker.engine import leftovers
from codepool.worker.engine.executor import LocalExecutor
from codepool.worker.lease import HostLease
from codepool.worker.lease_board import LeaseBoard
from codepool.worker.rq_worker import CUT_SIGNAL

log = logging.getLogger(__name__)

# The host's record for `codepool stats` and admission (ops/stats_view.ALIVE_S: 30 s);
# its lease, which is its dispatchers' too, is renewed every beat by worker/lease.py.
HEARTBEAT_EVERY_S = 10.0
HOST_DIR_PREFIX = "codepool-worker-"
QUICK_EXIT_S = 10.0
# At most this long (and at most half the drain) is left to the dispatchers, after the
# cut, to give back what they held and deregister.
CUT_BEFORE_S = 2.0
# The host's own Redis calls (its heartbeat, its farewell) never hold up a stop longer.
HOST_REDIS_TIMEOUT_S = 2.0
# At start, Redis must answer within this (a compose file that starts both at once):
# else the worker says so in one line and exits non-zero. Once it has answered, a Redis
# lost later is ridden out.
START_WAIT_S = 5.0
POLL_S = 0.05


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
    drain_s: float = DEFAULT_DRAIN_S  # the drain deadline: first SIGTERM to exit, seconds
    max_contexts: int | None = None  # live interpreter contexts (None: by the host's memory)
    context_ttl_s: float = 300.0  # an idle context's life


class WorkerHost:
    def __init__(self, settings: Settings, options: WorkerOptions) -> None:
        self.settings = settings
        self.options = options
        self.name = options.name or f"{socket.gethostname()}.{os.getpid()}"
        self.dispatcher_count = options.dispatchers or max(2, options.concurrency)
        self.signals = 0
        self.stop_at: float | None = None  # the drain deadline (monotonic), once signalled
        self._cut_sent = False
        self._killed = False
        self.dispatchers: dict[int, subprocess.Popen[bytes]] = {}
        self._owners: dict[int, str] = {}  # slot -> the name of the dispatcher in it
        self._started_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._restart_at: dict[int, float] = {}
        # 0700, named by our pid; a host killed -9 leaves its dir for the next to sweep.
        leftovers.sweep(HOST_DIR_PREFIX, b"worker")
        self._dir = leftovers.make_dir(HOST_DIR_PREFIX)
        self._window_path = os.path.join(self._dir, WINDOW_FILE)
        self.executor: LocalExecutor | None = None
        self.contexts: ContextServer | None = None
        self.calls: CallServer | None = None
        # Short timeouts, no retries: a Redis that is gone must not hold up a stop.
        quick = settings.replace(
            socket_timeout_s=HOST_REDIS_TIMEOUT_S, connect_timeout_s=HOST_REDIS_TIMEOUT_S
        )
        self.conn: redis.Redis = redis_client(quick, retries=0)
        self.board = LeaseBoard(
            os.path.join(self._dir, LEASE_FILE), self.dispatcher_count, create=True
        )
        self.lease = HostLease(
            self.conn,
            settings,
            host=self.name,
            slots=options.concurrency,
            board=self.board,
            on_lost=self._lease_lost,
        )

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            unreachable = self._unreachable_redis()
            if unreachable is not None:
                log.error("worker %s: %s", self.name, unreachable)
                return 1
            self.executor = LocalExecutor(
                concurrency=self.options.concurrency,
                mode=self.options.mode,
                preload=self.options.preload,
                max_limits=self.options.max_limits,
                allow_weak_isolation=self.options.allow_weak_isolation,
                listen_path=os.path.join(self._dir, "zygote.sock"),
                name=self.name,
                max_contexts=self.options.max_contexts,
                context_ttl_s=self.options.context_ttl_s,
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
            # One watcher of a Sentinel's primary per host (its lease's client): the
            # host's other clients and its dispatchers follow it.
            failover.on_new_primary(self.conn, self._primary_moved)
            self.lease.start()
            self.calls = CallServer(
                self.settings,
                self.executor,
                host=self.name,
                slots=self.options.concurrency,
                start=self.lease.start_id,
            )
            self.calls.start()
            if self.executor.mode == "fork":  # contexts need fork mode
                self.contexts = ContextServer(
                    self.settings,
                    self.executor,
                    host=self.name,
                    ttl_s=self.options.context_ttl_s,
                )
                self.contexts.start()
            for slot in range(self.dispatcher_count):
                if not self.signals:  # a stop asked for while the executor started
                    self._start_dispatcher(slot)
            self._supervise()
        finally:
            self._stop_dispatchers()
            until = self.stop_at or time.monotonic() + self.options.drain_s
            if self.calls is not None:
                calls = self.calls
                self._before(until, "its lone calls", lambda: calls.stop(until=until))
            if self.contexts is not None:
                self._before(until, "its contexts", self.contexts.stop)
            self.lease.stop(until=until)
            self.board.close()
            if self.executor is not None:
                self.executor.close()
            if self.stop_at is None or time.monotonic() < self.stop_at:
                self._forget()
            shutil.rmtree(self._dir, ignore_errors=True)
        return 0

    def _unreachable_redis(self) -> str | None:
        """Why Redis cannot be reached now, after START_WAIT_S of tries (None: it
        answered)."""
        give_up = time.monotonic() + START_WAIT_S
        while True:
            try:
                self.conn.ping()
                return None
            except redis.RedisError as exc:
                if time.monotonic() >= give_up or self.signals:
                    url = redact(self.settings.redis_url)
                    # redis-py's no-primary error names the whole client in its text.
                    why = "no sentinel named its primary" if _no_primary(exc) else str(exc)
                    return f"cannot reach Redis at {url} within {START_WAIT_S:.0f} s: {why}"
            time.sleep(0.5)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        now = time.monotonic()
        if self.signals == 1:
            self.stop_at = now + self.options.drain_s
            if self.calls is not None:
                self.calls.halt()
            log.info(
                "worker %s: %s: taking no more work; in-flight snippets may finish for "
                "%.1f s, then what still runs is given back to run elsewhere",
                self.name,
                signal.Signals(signum).name,
                max(0.0, self.stop_at - self._cut_before_s() - now),
            )
            for process in self.dispatchers.values():
                _signal(process, signal.SIGTERM)
        elif self.stop_at is not None and self.stop_at - self._cut_before_s() > now:
            log.warning("worker %s: second signal: giving back what runs now", self.name)
            self.stop_at = now + self._cut_before_s()

    def _cut_before_s(self) -> float:
        return min(CUT_BEFORE_S, self.options.drain_s / 2)

    def _drain(self) -> None:
        """Past the cut, dispatchers take back what runs; past the deadline, they die."""
        if self.stop_at is None:
            return
        now = time.monotonic()
        if not self._cut_sent and now >= self.stop_at - self._cut_before_s():
            self._cut_sent = True
            for process in self.dispatchers.values():
                _signal(process, CUT_SIGNAL)
        if not self._killed and now >= self.stop_at and self.dispatchers:
            self._killed = True
            log.warning(
                "worker %s: drain deadline: killing %d dispatchers still there (their "
                "leases lapse and what they held runs again elsewhere)",
                self.name,
                len(self.dispatchers),
            )
            for process in self.dispatchers.values():
                _signal(process, signal.SIGKILL)

    def _start_dispatcher(self, slot: int) -> None:
        # Unique per start: RQ refuses a live name, and a killed one lingers until TTL.
        name = f"{self.name}.{slot}.{uuid.uuid4().hex[:8]}"
        self._owners[slot] = name
        self.lease.add(slot, name)  # the dispatcher waits for it before it takes work
        config = DispatcherConfig(
            settings=asdict(self.settings),
            socket_path=os.path.join(self._dir, "zygote.sock"),
            name=name,
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
            if not self.signals and time.monotonic() - last_beat > HEARTBEAT_EVERY_S:
                self._heartbeat()
                last_beat = time.monotonic()
            time.sleep(POLL_S)
            self._drain()
            for slot, process in list(self.dispatchers.items()):
                code = process.poll()
                if code is None:
                    continue
                del self.dispatchers[slot]
                # What it had in the executor is not the host's to count any more.
                host_window.clear(self._window_path, slot)
                self.lease.remove(slot, self._owners[slot], died=code != 0)
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

    def _before(self, until: float, what: str, stop: Callable[[], None]) -> None:
        """Run ``stop`` (a server's stop, which tells Redis what it gives back) until the
        drain deadline at most: a Redis that does not answer by then leaves what is left
        to the janitors (the host's lease lapses), and the host exits on time."""
        thread = threading.Thread(target=stop, name="codepool-stop", daemon=True)
        thread.start()
        thread.join(timeout=max(0.0, until - time.monotonic()))
        if thread.is_alive():
            log.warning(
                "worker %s: stopping %s met a Redis that did not answer before the drain "
                "deadline; a janitor gives back what is left once the lease lapses",
                self.name,
                what,
            )

    def _stop_dispatchers(self) -> None:
        """Whatever brought the host down (a signal or a fault of its own), no
        dispatcher outlives the drain deadline."""
        if not self.dispatchers:
            return
        if self.stop_at is None:
            self.stop_at = time.monotonic() + self.options.drain_s
            for process in self.dispatchers.values():
                _signal(process, signal.SIGTERM)
        for slot, process in list(self.dispatchers.items()):
            while process.poll() is None:
                self._drain()
                time.sleep(POLL_S)
            del self.dispatchers[slot]
            self.lease.remove(slot, self._owners[slot], died=process.returncode != 0)

    def _primary_moved(self) -> None:
        # From the watcher's thread: the dispatchers see the board, the servers' clients
        # are told here; each leaves the old primary and runs its own callbacks.
        self.board.primary_moved()
        servers = [self.calls, self.contexts]
        for client in [c for server in servers if server is not None for c in server.clients]:
            failover.recheck(client)

    def _lease_lost(self, slot: int) -> None:
        # From the lease's thread: the dispatcher stops as on SIGTERM (what it runs ends,
        # nothing more is written) and is started afresh under a new name.
        process = self.dispatchers.get(slot)
        if process is not None:
            _signal(process, signal.SIGTERM)

    def _heartbeat(self) -> None:
        keys = self.settings.keys
        now = time.time()
        try:
            with self.conn.pipeline(transaction=False) as pipe:
                pipe.zadd(keys.workers(), {self.name: now})
                pipe.hset(
                    keys.worker_stats(self.name),
                    mapping={
                        "heartbeat": int(now),
                        "slots": self.options.concurrency,
                        "dispatchers": self.dispatcher_count,
                        "contexts_live": self.contexts.live() if self.contexts else 0,
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
                pipe.execute()
        except redis.RedisError:
            pass


def _no_primary(exc: Exception) -> bool:
    return isinstance(exc, MasterNotFoundError)


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass
