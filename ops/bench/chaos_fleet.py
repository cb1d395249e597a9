"""The processes of a chaos run (ops/bench/chaos.py): its Redis, worker hosts, ``codepool
serve`` and producer processes, started, killed, frozen and replaced by the faults
(ops/bench/chaos_faults.py), each logging to the run's directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from codepool.common.errors import ConfigError
from codepool.common.keys import Keys
from codepool.ops.arguments import cli_command
from codepool.ops.bench.chaos_check import process_start
from codepool.ops.bench.chaos_redis import NetnsRedis, PlainRedis, SentinelRedis
from codepool.ops.bench.process_tree import descendants
from codepool.ops.serve_command import LISTENING

READY_TIMEOUT_S = 90.0
READY_S = 30.0  # what a fault waits for its host to start, at most
STOP_TIMEOUT_S = 30.0


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


@dataclass
class Host:
    """Worker host number ``index`` of the fleet; ``name`` changes when it is restarted
    under a new name."""

    index: int
    name: str
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    started_at: float = 0.0  # unix time of its last start

    def tree(self) -> list[int]:
        if self.process is None or self.process.poll() is not None:
            return []
        return [self.process.pid, *descendants(self.process.pid)]


@dataclass
class Producer:
    role: str
    name: str
    process: subprocess.Popen[bytes]


@dataclass
class ChaosFleet:
    """Everything a chaos run starts; ``tracked`` is every fleet process ever seen (pid ->
    start time), for the check that none is left."""

    directory: Path
    hosts_n: int
    slots: int
    seed: int
    until: float
    rates: dict[str, float]
    sleepy: float = 0.1
    store: PlainRedis | SentinelRedis | NetnsRedis = field(default_factory=PlainRedis)
    hosts: list[Host] = field(default_factory=list)
    producers: list[Producer] = field(default_factory=list)
    killed_producers: set[str] = field(default_factory=set)
    serve: subprocess.Popen[str] | None = None
    serve_url: str = ""
    tracked: dict[int, str] = field(default_factory=dict)
    # Hosts that exited by themselves (name, exit status, when, its log's last error);
    # each is started again, as systemd's Restart=always would.
    exits: list[tuple[str, int, float, str]] = field(default_factory=list)
    # Held by whatever kills and restarts a host, so ``track`` never takes that for an exit.
    hosts_lock: threading.RLock = field(default_factory=threading.RLock)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def redis_pid(self) -> int:
        """The pid of the primary now."""
        if isinstance(self.store, NetnsRedis):
            return self.store.pid()
        process = self.store.primary().process
        assert process is not None
        return process.pid

    def direct(self) -> redis.Redis:
        """A plain client of the primary now (RedisError when there is none)."""
        try:
            url = self.store.direct_url()
        except ConfigError as exc:
            raise redis.ConnectionError(str(exc)) from exc
        return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)

    def start_base(self) -> None:
        """Redis, the hosts (until each has beaten) and serve."""
        (self.directory / "history").mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        self.store.start()
        self.hosts = [Host(i, f"h{i}") for i in range(self.hosts_n)]
        for host in self.hosts:
            self.start_host(host)
        self.wait_hosts()
        self.start_serve()

    def start_load(self) -> None:
        """The producers, which stop by themselves at ``until``."""
        for role, rate in self.rates.items():
            count = 2 if role in ("batch", "lone") else 1
            for number in range(count):
                self.start_producer(role, f"{role}{number}", rate / count)

    # -- hosts ---------------------------------------------------------------------

    def start_host(self, host: Host) -> None:
        host.starts += 1
        host.started_at = time.time()
        if isinstance(self.store, NetnsRedis):  # in its own network namespace
            host.process = self.store.fleet.start_worker(
                host.index,
                name=host.name,
                log_path=self.directory / "logs" / f"{host.name}.log",
                concurrency=self.slots,
            )
            return
        log = open(self.directory / "logs" / f"{host.name}.log", "ab")
        host.process = subprocess.Popen(
            cli_command("worker", "--url", self.url, "-c", str(self.slots), "--name", host.name),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def wait_hosts(self) -> None:
        """Until every host has beaten (its lease is in ``hosts``)."""
        conn = self.direct()
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while conn.zcard(Keys().hosts()) < self.hosts_n:
                if time.monotonic() > deadline:
                    raise ConfigError(f"hosts did not come up; see {self.directory}/logs")
                time.sleep(0.2)
        finally:
            conn.close()

    def ready(self, host: Host, timeout_s: float = READY_S) -> float:
        """Until ``host`` has beaten since its last start (its executor is up by then);
        the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            try:
                conn = self.direct()
                try:
                    # Its lease is per start (``name~token``), named by its start record.
                    lease = conn.get(Keys().host_start(host.name))
                    beat = conn.zscore(Keys().hosts(), lease) if lease else None
                finally:
                    conn.close()
            except redis.RedisError:
                beat = None
            if beat is not None and beat > host.started_at:
                break
            time.sleep(0.2)
        return time.monotonic() - started

    def track(self) -> None:
        """Remember every process now in the hosts' trees, and start again a host that
        exited by itself (called about once a second while the load runs)."""
        with self.hosts_lock:
            for host in self.hosts:
                if host.process is not None and host.process.poll() is not None:
                    said = self.last_error(host.name)
                    self.exits.append((host.name, host.process.returncode, time.time(), said))
                    self.start_host(host)
        self.remember()

    def last_error(self, name: str) -> str:
        """The last line of host ``name``'s log that says ERROR or Error."""
        try:
            with open(self.directory / "logs" / f"{name}.log", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return next((line for line in reversed(lines) if "ERROR" in line or "Error" in line), "")

    def remember(self) -> None:
        """Remember every process now in the hosts' trees."""
        for host in list(self.hosts):
            for pid in host.tree():
                started = process_start(pid)
                if started is not None:
                    with self._lock:
                        self.tracked.setdefault(pid, started)

    # -- serve and producers -------------------------------------------------------

    def start_serve(self) -> None:
        log = open(self.directory / "logs" / "serve.log", "w")
        self.serve = subprocess.Popen(
            cli_command("serve", "--url", self.url, "--port", "0", "--run", "chaos"),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        log.close()
        assert self.serve.stdout is not None
        for line in self.serve.stdout:
            match = LISTENING.search(line)
            if match:
                self.serve_url = match.group(1)
                return
        raise ConfigError(f"serve exited; see {self.directory}/logs/serve.log")

    def start_producer(self, role: str, name: str, rate: float) -> None:
        log = open(self.directory / "logs" / f"{name}.log", "ab")
        argv = [
            sys.executable,
            "-m",
            "codepool.ops.bench.chaos_load",
            role,
            "--url",
            self.url,
            "--history",
            str(self.directory / "history" / f"{name}.jsonl"),
            "--name",
            name,
            "--seed",
            str(self.seed),
            "--until",
            str(self.until),
            "--rate",
            str(rate),
            "--serve",
            self.serve_url,
            "--sleepy",
            str(self.sleepy),
        ]
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        self.producers.append(Producer(role, name, process))

    def kill_producer(self, number: int) -> str:
        """kill -9 producer ``number`` (of those running) and start another of its role."""
        running = [p for p in self.producers if p.process.poll() is None]
        if not running:
            return "no producer running"
        victim = running[number % len(running)]
        victim.process.kill()
        victim.process.wait()
        self.killed_producers.add(victim.name)
        generation = sum(p.role == victim.role for p in self.producers)
        rate = self.rates[victim.role] / (2 if victim.role in ("batch", "lone") else 1)
        self.start_producer(victim.role, f"{victim.role}{generation}", rate)
        return victim.name

    def wait_producers(self, timeout_s: float) -> list[str]:
        """Until every producer has stopped by itself; the names of those that did not
        (they are killed)."""
        deadline = time.monotonic() + timeout_s
        stuck = []
        for producer in self.producers:
            try:
                producer.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stuck.append(producer.name)
                producer.process.send_signal(signal.SIGUSR1)  # its stacks, to its log
                time.sleep(1.0)
                producer.process.kill()
                producer.process.wait()
        return stuck

    # -- the end -------------------------------------------------------------------

    def stop(self) -> None:
        """Stop producers, serve and hosts (SIGTERM, then SIGKILL), keep Redis."""
        for producer in self.producers:
            if producer.process.poll() is None:
                producer.process.kill()
                producer.process.wait()
        if self.serve is not None and self.serve.poll() is None:
            self.serve.terminate()
            _wait(self.serve)
        self.remember()
        for host in self.hosts:
            if host.process is not None and host.process.poll() is None:
                os.killpg(host.process.pid, signal.SIGCONT)  # a frozen one must hear it
                host.process.terminate()
        for host in self.hosts:
            if host.process is not None:
                _wait(host.process)

    def close(self) -> None:
        self.stop()
        self.store.close()


def _wait(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
