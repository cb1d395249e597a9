"""A thousand worker hosts on a 2-core machine: what a fleet costs one Redis.

Each simulated host runs the real lease code (worker/lease.py: its beat renews all its
dispatchers' leases in one script call, and it is the fleet's janitor now and then)
plus RQ's idle traffic as a real dispatcher sends it (the one dispatcher a host has
waiting on the queue, and the others' keepalives, at the real intervals) and the host's
own record for ``codepool stats``. No child processes: the busy phase runs the real
claim and write code (worker/job.py's BatchRunner, worker/writer.py's ResultWriter) on a
stand-in executor whose snippets end after ``--run-ms``, fed by a real producer
(CodePool.submit and Batch.results) at a fixed snippet rate; the dispatchers that take
the announcements belong to the simulated hosts, so every claim sees the whole fleet.

    python -m codepool.ops.bench.fleet_sim                  # 10, 100, 1000 hosts x 64
    python -m codepool.ops.bench.fleet_sim --hosts 10 1000 --rate 500
    python -m codepool.ops.bench.fleet_sim --agentic        # lone calls: fleet_agents.py

Printed per fleet size: idle Redis commands/s and CPU per host; busy Redis CPU per
snippet (minus the idle fleet's own cost meanwhile) and commands per snippet;
announcements per batch; claim latency (from an announcement's dequeue to its first
snippet's start, p50/p99). RQ's own bookkeeping of each announcement job (about 20
commands in two round trips on a real dispatcher, see ops/bench/e2e.py) is not in the
busy figures: it is charged per announcement, which the table shows.

Targets (issue 23): at 1,000 hosts x 64 slots, idle Redis CPU <= 10 % of one core, and
busy CPU per snippet within 1.5x of the 10-host figure.
"""

from __future__ import annotations

import argparse
import heapq
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue
from rq.exceptions import DequeueTimeout

from codepool.common import rq_records
from codepool.common.codec import MsgpackSerializer
from codepool.common.limits import Limits
from codepool.common.queueing import announced_batch, announcements_for
from codepool.common.result import ExecResult
from codepool.common.settings import Settings
from codepool.ops.bench import fleet_agents
from codepool.ops.bench.e2e import calls_between, redis_calls, redis_cpu_s
from codepool.ops.redis_server import RedisServer
from codepool.producer import CodePool
from codepool.worker import host_window
from codepool.worker.dispatcher import KEEPALIVE_S
from codepool.worker.finished_batches import FinishedBatches
from codepool.worker.host import HEARTBEAT_EVERY_S
from codepool.worker.host_window import HostWindow
from codepool.worker.job import BatchRunner
from codepool.worker.lease import DispatcherLease, HostLease
from codepool.worker.lease_board import LeaseBoard
from codepool.worker.rq_worker import DEQUEUE_TIMEOUT_S, WORKER_TTL_S, CodepoolJob
from codepool.worker.writer import ResultWriter

TARGET_IDLE_CORE = 0.10
TARGET_BUSY_RATIO = 1.5
BEAT_THREADS = 4
SETTLE_S = 8.0  # every lease taken, the first janitor's rounds over
IDLE_QUEUE = Queue("sim-idle", connection=redis.Redis())  # only its key names are used


class StandInExecutor:
    """The executor's interface with no processes: a snippet ends ``run_s`` after it
    starts, printing nothing, on a timer thread."""

    def __init__(self, name: str, run_s: float) -> None:
        self.name = name
        self.run_s = run_s
        self.started: list[float] = []  # monotonic start times (claim latency)
        self._heap: list[tuple[float, int, Future[ExecResult]]] = []
        self._count = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def submit_limited(self, code: Any, limits: Limits) -> Future[ExecResult]:
        future: Future[ExecResult] = Future()
        future.set_running_or_notify_cancel()
        now = time.monotonic()
        with self._cond:
            self.started.append(now)
            self._count += 1
            heapq.heappush(self._heap, (now + self.run_s, self._count, future))
            self._cond.notify()
        return future

    def cancel(self, future: Future[ExecResult]) -> bool:
        return False

    def cancel_many(self, futures: Iterable[Future[ExecResult]]) -> int:
        return 0

    def withdraw(self, futures: Iterable[Future[ExecResult]], *, running: bool = False) -> None:
        return None

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._stop:
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, future = self._heap[0]
                wait_s = due - time.monotonic()
                if wait_s > 0:
                    self._cond.wait(wait_s)
                    continue
                heapq.heappop(self._heap)
                result = ExecResult(True, "", "", 0, False, self.run_s, exec_s=self.run_s)
                future.set_result(result)


@dataclass
class SimHost:
    name: str
    lease: HostLease
    board: LeaseBoard
    owners: list[str]
    next_keepalive: float = 0.0
    next_listen: float = 0.0
    next_record: float = 0.0


@dataclass
class Figures:
    hosts: int
    idle_commands_s: float = 0.0
    idle_cpu_s: float = 0.0  # Redis CPU seconds per second, the whole idle fleet
    busy_cpu_us: float = 0.0  # per snippet, minus the idle fleet's meanwhile
    busy_commands: float = 0.0  # per snippet, idle traffic included
    announcements: float = 0.0  # per batch
    snippets: int = 0
    claim_ms: list[float] = field(default_factory=list)


class Fleet:
    """N simulated hosts x S slots against the Redis at ``url``."""

    def __init__(self, url: str, hosts: int, slots: int, workdir: str) -> None:
        self.settings = Settings(redis_url=url)
        self.conn = redis.Redis.from_url(url, max_connections=64)
        self.slots = slots
        self.workdir = workdir
        self.hosts: list[SimHost] = []
        now = time.monotonic()
        for h in range(hosts):
            name = f"sim{h:04d}"
            board = LeaseBoard(os.path.join(workdir, f"{name}.leases"), slots, create=True)
            lease = HostLease(
                self.conn, self.settings, host=name, slots=slots, board=board, on_lost=_ignore
            )
            owners = [f"{name}.{slot}.sim" for slot in range(slots)]
            for slot, owner in enumerate(owners):
                lease.add(slot, owner)
            # Phases spread like real hosts' start times.
            spread = (h / max(1, hosts)) * 1.0
            self.hosts.append(
                SimHost(
                    name,
                    lease,
                    board,
                    owners,
                    next_keepalive=now + spread * KEEPALIVE_S,
                    next_listen=now + spread * DEQUEUE_TIMEOUT_S,
                    next_record=now + spread * HEARTBEAT_EVERY_S,
                )
            )
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._drive, args=(self.hosts[i::BEAT_THREADS],), daemon=True)
            for i in range(BEAT_THREADS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        for host in self.hosts:
            host.board.close()

    def _drive(self, hosts: list[SimHost]) -> None:
        while not self._stop.is_set():
            soonest = time.monotonic() + 0.2
            for host in hosts:
                soonest = min(soonest, host.lease.tick(), self._rq_idle(host))
            self._stop.wait(max(0.0, soonest - time.monotonic()))

    def _rq_idle(self, host: SimHost) -> float:
        """RQ's idle traffic of one host, as its dispatchers send it: the listener's
        heartbeat and queue wait every DEQUEUE_TIMEOUT_S (the wait as a non-blocking
        LMOVE: the driver threads must not block), each dispatcher's keepalive every
        KEEPALIVE_S, and the host's record every HEARTBEAT_EVERY_S."""
        now = time.monotonic()
        keys = self.settings.keys
        if now >= host.next_listen:
            host.next_listen = now + DEQUEUE_TIMEOUT_S
            with self.conn.pipeline(transaction=False) as pipe:
                _rq_beat(pipe, host.owners[0])
                pipe.execute()
            self.conn.lmove(IDLE_QUEUE.key, IDLE_QUEUE.intermediate_queue_key)
        if now >= host.next_keepalive:
            host.next_keepalive = now + KEEPALIVE_S
            for owner in host.owners[1:]:
                with self.conn.pipeline(transaction=False) as pipe:
                    _rq_beat(pipe, owner)
                    pipe.execute()
        if now >= host.next_record:
            host.next_record = now + HEARTBEAT_EVERY_S
            with self.conn.pipeline(transaction=False) as pipe:
                pipe.zadd(keys.workers(), {host.name: time.time()})
                pipe.hset(keys.worker_stats(host.name), mapping={"slots": self.slots})
                pipe.execute()
        return min(host.next_listen, host.next_keepalive, host.next_record)


def _rq_beat(pipe: Any, owner: str) -> None:
    """An RQ worker heartbeat as the dispatcher sends it (one pipeline)."""
    key = rq_records.worker_key(owner)
    pipe.hset(key, "last_heartbeat", "2026-01-01T00:00:00.000000Z")
    pipe.expire(key, WORKER_TTL_S + 60)
    pipe.expire(rq_records.worker_executions_key(owner), WORKER_TTL_S + 60)
    pipe.hset(key, "state", "idle")


def _ignore(slot: int) -> None:
    return None


class ActiveDispatcher:
    """A simulated host's dispatcher that takes announcements and runs them with the
    real claim and write code on the stand-in executor."""

    def __init__(self, fleet: Fleet, host: SimHost, run_s: float) -> None:
        settings = fleet.settings
        self.conn = redis.Redis.from_url(settings.redis_url)
        owner = host.owners[0]
        window_path = os.path.join(fleet.workdir, f"{host.name}.window")
        host_window.create(window_path, fleet.slots)
        self.window = HostWindow(window_path, slot=0, slots=fleet.slots, dispatchers=fleet.slots)
        self.executor = StandInExecutor(host.name, run_s)
        self.finished = FinishedBatches(self.conn, settings.keys, owner=owner, flush_s=1.0)
        lease = DispatcherLease(self.conn, settings, owner=owner, board=host.board, slot=0)
        self.writer = ResultWriter.from_settings(self.conn, settings, lease, worker=host.name)
        self.runner = BatchRunner(
            executor=self.executor,  # type: ignore[arg-type]
            conn=self.conn,
            settings=settings,
            finished=self.finished,
            max_limits=Limits(),
            stop_requested=lambda: False,
            writer=self.writer,
            lease=lease,
            window=self.window,
        )
        self.queue = Queue(settings.queue, connection=self.conn, serializer=MsgpackSerializer)
        self.claim_ms: list[float] = []
        self.jobs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.finished.start()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                found = Queue.dequeue_any(
                    [self.queue],
                    1,
                    connection=self.conn,
                    job_class=CodepoolJob,
                    serializer=MsgpackSerializer,
                )
            except DequeueTimeout:
                continue
            if found is None:
                continue
            job, _ = found
            self.jobs += 1
            taken = time.monotonic()
            before = len(self.executor.started)
            with self.conn.pipeline(transaction=False) as first:
                execution, _ = self.runner.prestart(
                    job, pipeline=first, batch_id=announced_batch(job.id)
                )
            if len(self.executor.started) > before:
                self.claim_ms.append((self.executor.started[before] - taken) * 1000)
            if execution is not None:
                execution.beats_job = False
                execution.finish()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.runner.close()
        self.writer.close()
        self.finished.stop()
        self.executor.close()
        self.window.close()
        self.conn.close()


def measure(args: argparse.Namespace, hosts: int) -> Figures:
    figures = Figures(hosts)
    workdir = tempfile.mkdtemp(prefix="codepool-fleet-sim-")
    with RedisServer(extra_args=["--maxclients", "10000"]) as server:
        client = redis.Redis.from_url(server.url)
        floor = _rate(client, 3.0)
        fleet = Fleet(server.url, hosts, args.slots, workdir)
        fleet.start()
        try:
            time.sleep(SETTLE_S)
            before, cpu_before, t0 = redis_calls(client), redis_cpu_s(client), time.monotonic()
            time.sleep(args.idle_window)
            cpu, elapsed = redis_cpu_s(client) - cpu_before, time.monotonic() - t0
            calls = _calls(calls_between(before, redis_calls(client)))
            figures.idle_commands_s = calls / elapsed
            figures.idle_cpu_s = max(0.0, cpu / elapsed - floor)
            _busy(args, fleet, client, figures)
        finally:
            fleet.stop()
            client.close()
    shutil.rmtree(workdir, ignore_errors=True)
    return figures


def _busy(args: argparse.Namespace, fleet: Fleet, client: redis.Redis, figures: Figures) -> None:
    step = max(1, len(fleet.hosts) // args.active)
    active = [ActiveDispatcher(fleet, host, args.run_ms / 1000) for host in fleet.hosts[::step]][
        : args.active
    ]
    pool = CodePool(fleet.settings.redis_url)
    batches_s = args.rate / args.batch
    total = int(batches_s * args.busy_window)
    collected: list[int] = []
    collectors: list[threading.Thread] = []
    try:
        pool.submit(["print(1)"] * args.batch).results(timeout_s=30)  # warm-up
        before, cpu_before, t0 = redis_calls(client), redis_cpu_s(client), time.monotonic()
        jobs_before = sum(a.jobs for a in active)
        for i in range(total):
            due = t0 + i / batches_s
            time.sleep(max(0.0, due - time.monotonic()))
            batch = pool.submit([f"print({i})"] * args.batch)
            thread = threading.Thread(
                target=lambda b=batch: collected.append(len(b.results(timeout_s=120))),
                daemon=True,
            )
            thread.start()
            collectors.append(thread)
        for thread in collectors:
            thread.join()
        time.sleep(1.5)  # the last writes' counters and owner-set flushes
        cpu, elapsed = redis_cpu_s(client) - cpu_before, time.monotonic() - t0
        calls = _calls(calls_between(before, redis_calls(client)))
        figures.snippets = sum(collected)
        idle_cpu = figures.idle_cpu_s * elapsed
        figures.busy_cpu_us = max(0.0, cpu - idle_cpu) / figures.snippets * 1e6
        figures.busy_commands = calls / figures.snippets
        figures.announcements = (sum(a.jobs for a in active) - jobs_before) / total
        figures.claim_ms = [ms for a in active for ms in a.claim_ms]
    finally:
        pool.close()
        for dispatcher in active:
            dispatcher.close()


def _calls(per_command: dict[str, tuple[int, int]]) -> int:
    per_command.pop("info", None)
    return sum(calls for calls, _ in per_command.values())


def _rate(client: redis.Redis, seconds: float) -> float:
    started, before = time.monotonic(), redis_cpu_s(client)
    time.sleep(seconds)
    return (redis_cpu_s(client) - before) / (time.monotonic() - started)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(args: argparse.Namespace, rows: list[Figures]) -> bool:
    print(
        f"\nfleet simulator: hosts x {args.slots} slots, one Redis; busy: {args.rate} "
        f"snippets/s in batches of {args.batch}, {args.run_ms} ms each"
    )
    head = (
        f"{'hosts':>6}{'idle cmd/s':>12}{'per host':>10}{'idle CPU %':>12}"
        f"{'CPU us/host/s':>15}{'busy us/snip':>14}{'cmd/snip':>10}{'ann/batch':>11}"
        f"{'claim p50 ms':>14}{'p99':>8}"
    )
    print(head)
    for r in rows:
        print(
            f"{r.hosts:>6}{r.idle_commands_s:>12.0f}{r.idle_commands_s / r.hosts:>10.2f}"
            f"{r.idle_cpu_s * 100:>12.2f}{r.idle_cpu_s / r.hosts * 1e6:>15.1f}"
            f"{r.busy_cpu_us:>14.1f}{r.busy_commands:>10.2f}{r.announcements:>11.2f}"
            f"{_pct(r.claim_ms, 0.5):>14.2f}{_pct(r.claim_ms, 0.99):>8.2f}"
        )
    ok = True
    biggest, smallest = max(rows, key=lambda r: r.hosts), min(rows, key=lambda r: r.hosts)
    good = biggest.idle_cpu_s <= TARGET_IDLE_CORE
    ok &= good
    print(
        f"{'PASS' if good else 'FAIL'} idle at {biggest.hosts} hosts: "
        f"{biggest.idle_cpu_s * 100:.1f} % of a core (<= {TARGET_IDLE_CORE * 100:.0f} %)"
    )
    if biggest is not smallest and smallest.busy_cpu_us > 0:
        ratio = biggest.busy_cpu_us / smallest.busy_cpu_us
        good = ratio <= TARGET_BUSY_RATIO
        ok &= good
        print(
            f"{'PASS' if good else 'FAIL'} busy per snippet at {biggest.hosts} hosts: "
            f"{ratio:.2f}x the {smallest.hosts}-host figure (<= {TARGET_BUSY_RATIO}x)"
        )
    print(
        "announcements per batch (queueing.announcements_for; fewer when a batch is "
        "done before its last ones are taken): "
        + ", ".join(f"{announcements_for(args.batch, r.hosts, r.hosts * args.slots)}" for r in rows)
    )
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--idle-window", type=float, default=20.0)
    parser.add_argument("--busy-window", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=1000, help="snippets per second")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--run-ms", type=float, default=50.0)
    parser.add_argument("--active", type=int, default=8, help="hosts taking announcements")
    parser.add_argument("--agentic", action="store_true", help="lone calls (fleet_agents.py)")
    args = parser.parse_args(argv)
    if args.agentic:
        return 0 if fleet_agents.main(args.hosts, seconds=args.busy_window) else 1
    rows = []
    for hosts in args.hosts:
        rows.append(measure(args, hosts))
        print(f"  {hosts} hosts measured", file=sys.stderr)
    return 0 if report(args, rows) else 1


if __name__ == "__main__":
    sys.exit(main())
