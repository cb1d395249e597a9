"""Fleet benchmark: one pool over H worker hosts, each in a network namespace of its own.

Sleep-based snippets, so the numbers measure spreading and recovery, not the CPU. Prints:
time / ideal for one ``CodePool.submit`` batch and for a gather over
``RemoteSandbox.arun_code`` (median of ``--repeat`` runs); for a cold fleet, the first
batch of freshly started hosts (submitted once every host process has heartbeated, its
dispatchers still starting) and a batch during which a host starts (at a sixth of it):
time / ideal, what each host ran and when its first result came; seconds from a fault of
the busiest host (kill -9 of its whole process tree, SIGSTOP, its link cut) to the
batch's last result, with the producer's default settings; duplicate done-list entries;
counters against snippets submitted; Redis commands and Redis CPU per snippet. A report,
not a test: it exits 0 whatever the numbers say. Needs root (network namespaces).

    python ops/bench/fleet.py [--hosts 3] [--slots 2] [--snippets 120] [--sleep 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.ledger import leased_dispatchers
from codepool.common.settings import Settings
from codepool.ops.bench.netns import Fleet, netns_available
from codepool.producer import CodePool, RemoteSandbox

TARGET_RATIO = 1.3
TARGET_RECOVERY_S = 20.0
READY_TIMEOUT_S = 60.0
COLLECT_TIMEOUT_S = 600.0
STATS_SETTLE_S = 1.5
LEASE_S = Settings().lease_s


@dataclass
class Cost:
    """What Redis spent: commands served and CPU seconds used (from INFO)."""

    commands: int
    cpu_s: float

    @classmethod
    def read(cls, conn: redis.Redis) -> Cost:
        stats = conn.info("commandstats")
        cpu = conn.info("cpu")
        calls = sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_"))
        used = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        return cls(calls, used)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.commands - other.commands, self.cpu_s - other.cpu_s)


@dataclass
class Run:
    wall_s: float
    cost: Cost
    duplicates: int = 0
    counted: int = 0
    fault_to_end_s: float = 0.0
    victim: str = ""
    per_host: Counter[str] = field(default_factory=Counter)
    first_s: dict[str, float] = field(default_factory=dict)  # each host's first result
    joined_s: float = 0.0  # when the joining host was started (seconds after the submit)


class Bench:
    def __init__(self, fleet: Fleet, args: argparse.Namespace, logs: Path) -> None:
        self.fleet = fleet
        self.args = args
        self.logs = logs
        self.url = fleet.redis_unix_url
        self.conn = redis.Redis.from_url(self.url)
        self.keys = Keys()
        self.pool = CodePool(self.url)
        self.code = f"import time\ntime.sleep({args.sleep})\nprint('done')"

    @property
    def ideal_s(self) -> float:
        args = self.args
        return float(args.snippets * args.sleep / (args.hosts * args.slots))

    def start(self, index: int) -> None:
        self.fleet.start_worker(
            index,
            name=f"h{index}",
            log_path=self.logs / f"h{index}.log",
            concurrency=self.args.slots,
        )

    def wait_live(self, index: int) -> None:
        """Until host ``index`` has two dispatchers with a lease and one of them waits on
        the queue (one per host does, so each host takes one of a batch's announcements)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._live(index) < 2 or not self._listening(index):
            if time.monotonic() > deadline:
                raise RuntimeError(f"host h{index} did not come up; see {self.logs}/h{index}.log")
            time.sleep(0.05)

    def _live(self, index: int) -> int:
        return len(leased_dispatchers(self.conn, self.keys, f"h{index}", LEASE_S))

    def wait_heartbeats(self) -> None:
        """Until every host process has heartbeated (``codepool stats`` lists it): the
        moment an operator sees a fresh fleet up, its dispatchers still starting."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.conn.zcard(self.keys.workers()) < self.args.hosts:
            if time.monotonic() > deadline:
                raise RuntimeError(f"hosts did not heartbeat; see {self.logs}")
            time.sleep(0.01)

    def wait_gone(self, index: int) -> None:
        """Until host ``index`` has left the fleet (no dispatcher of it holds a lease)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._live(index):
            if time.monotonic() > deadline:
                raise RuntimeError(f"host h{index} did not leave; see {self.logs}/h{index}.log")
            time.sleep(0.05)

    def _listening(self, index: int) -> bool:
        addr = f"10.250.{index}.2:"
        clients = self.conn.client_list()
        return any(c["cmd"] == "blmove" and c["addr"].startswith(addr) for c in clients)

    def counted(self) -> int:
        return counters.parse(self.conn.hgetall(self.keys.stats())).get("calls", 0)

    def submit_run(
        self, fault: Callable[[int], object] | None = None, join: int | None = None
    ) -> Run:
        """One batch; at a sixth of its results, ``fault`` hits the busiest host, or host
        ``join`` is started."""
        n = self.args.snippets
        counted_before = self.counted()
        before = Cost.read(self.conn)
        started = time.monotonic()
        batch = self.pool.submit([self.code] * n, timeout_s=10.0)
        per_host: Counter[str] = Counter()
        first_s: dict[str, float] = {}
        faulted_at, victim, joined_s = 0.0, "", 0.0
        for done, (_, result) in enumerate(batch.as_completed(COLLECT_TIMEOUT_S), start=1):
            per_host[result.worker] += 1
            first_s.setdefault(result.worker, time.monotonic() - started)
            if fault is not None and done == n // 6:
                victim = per_host.most_common(1)[0][0]
                faulted_at = time.monotonic()
                fault(int(victim[1:]))
            if join is not None and done == n // 6:
                joined_s = time.monotonic() - started
                self.start(join)
        wall_s = time.monotonic() - started
        time.sleep(STATS_SETTLE_S)
        run = Run(wall_s, Cost.read(self.conn) - before, batch.duplicates)
        run.counted = self.counted() - counted_before
        run.per_host, run.first_s, run.joined_s = per_host, first_s, joined_s
        if fault is not None:
            run.fault_to_end_s = started + wall_s - faulted_at
            run.victim = victim
        return run

    def idle_cost(self, seconds: float) -> Cost:
        """What the fleet costs Redis doing nothing (heartbeats, RQ's loops), per second."""
        before = Cost.read(self.conn)
        time.sleep(seconds)
        spent = Cost.read(self.conn) - before
        return Cost(round(spent.commands / seconds), spent.cpu_s / seconds)

    def gather_run(self) -> Run:
        n = self.args.snippets
        before = Cost.read(self.conn)
        sandbox = RemoteSandbox(self.url, timeout=10.0)

        async def step() -> None:
            await asyncio.gather(*(sandbox.arun_code(self.code) for _ in range(n)))

        started = time.monotonic()
        asyncio.run(step())
        wall_s = time.monotonic() - started
        sandbox.close()
        time.sleep(STATS_SETTLE_S)
        return Run(wall_s, Cost.read(self.conn) - before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--snippets", type=int, default=120)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    reason = netns_available()
    if reason is not None:
        print(f"fleet bench needs network namespaces: {reason}", file=sys.stderr)
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="codepool-fleet-") as logs,
        Fleet(hosts=args.hosts) as fleet,
    ):
        bench = Bench(fleet, args, Path(logs))
        for index in range(args.hosts):
            bench.start(index)
        # The first batch, as a training run's first step meets a fleet just started
        # (also the warm-up: first forks, page cache, script loads).
        bench.wait_heartbeats()
        cold = bench.submit_run()
        for index in range(args.hosts):
            bench.wait_live(index)
        submits = [bench.submit_run() for _ in range(args.repeat)]
        gathers = [bench.gather_run() for _ in range(args.repeat)]
        idle = bench.idle_cost(bench.ideal_s)
        # A host that starts while a batch runs (autoscaling, a restart): the last one
        # leaves cleanly, and starts again at a sixth of the next batch.
        joiner = args.hosts - 1
        fleet.stop_worker(joiner)
        bench.wait_gone(joiner)
        joined = bench.submit_run(join=joiner)
        bench.wait_live(joiner)
        faults: list[tuple[str, Run]] = []

        def kill(index: int) -> None:
            fleet.kill_host(index)

        faults.append(("kill -9", bench.submit_run(kill)))
        restart = int(faults[-1][1].victim[1:])
        bench.start(restart)
        bench.wait_live(restart)
        faults.append(("SIGSTOP", bench.submit_run(fleet.freeze_host)))
        frozen = int(faults[-1][1].victim[1:])
        fleet.thaw_host(frozen)
        bench.wait_live(frozen)
        faults.append(("link cut", bench.submit_run(fleet.cut_link)))
        cut = int(faults[-1][1].victim[1:])
        fleet.restore_link(cut)
        bench.wait_live(cut)
        report(args, bench.ideal_s, submits, gathers, idle, faults, cold, joined, joiner)
    return 0


def report(
    args: argparse.Namespace,
    ideal_s: float,
    submits: list[Run],
    gathers: list[Run],
    idle: Cost,
    faults: list[tuple[str, Run]],
    cold: Run,
    joined: Run,
    joiner: int,
) -> None:
    n = args.snippets
    print(
        f"\nfleet: {args.hosts} hosts x {args.slots} slots, {n} snippets of sleep({args.sleep}); "
        f"ideal {ideal_s:.2f} s; median of {args.repeat}"
    )
    print(f"{'workload':<26}{'time s':>9}{'/ ideal':>9}{'cmds/snip':>11}{'redis us/snip':>15}")

    def row(name: str, wall: float, ideal: float, cost: tuple[float, float], verdict: str) -> None:
        cmds, cpu = cost
        print(f"{name:<26}{wall:>9.2f}{wall / ideal:>8.2f}x{cmds:>11.1f}{cpu:>15.1f}   {verdict}")

    for name, runs in (("CodePool.submit batch", submits), (f"gather of {n} arun_code", gathers)):
        wall = statistics.median(r.wall_s for r in runs)
        cmds = statistics.median(r.cost.commands / n for r in runs)
        cpu = statistics.median(r.cost.cpu_s * 1e6 / n for r in runs)
        row(name, wall, ideal_s, (cmds, cpu), _within(wall / ideal_s))
    hosts = [f"h{i}" for i in range(args.hosts)]
    idle_hosts = " ".join(h for h in hosts if not cold.per_host.get(h))
    verdict = _within(cold.wall_s / ideal_s) + (f", {idle_hosts} ran nothing" if idle_hosts else "")
    row("first batch, fresh hosts", cold.wall_s, ideal_s, _per_snippet(cold, n), verdict)
    # Its ideal counts the joiner from its start on: H - 1 hosts until then, H after.
    joiner_name, work_s = f"h{joiner}", n * args.sleep
    left_s = max(0.0, work_s - (args.hosts - 1) * args.slots * joined.joined_s)
    joined_ideal_s = joined.joined_s + left_s / (args.hosts * args.slots)
    fair = (n - n // 6) / args.hosts  # of what was left when it started
    ran = joined.per_host.get(joiner_name, 0)
    verdict = f"{joiner_name} ran {ran}: {'a' if ran >= fair / 2 else 'short of a'} share"
    label = f"{joiner_name} starts mid-batch"
    row(label, joined.wall_s, joined_ideal_s, _per_snippet(joined, n), verdict)
    print(
        f"{'idle fleet, per second':<26}{'':>18}{idle.commands:>11}{idle.cpu_s * 1e6:>15.0f}"
        "   (heartbeats, RQ's loops)"
    )
    print(
        "first batch: submitted once every host process had heartbeated, its dispatchers still "
        f"starting.\n{label}: started at a sixth of the results ({joined.joined_s:.2f} s), "
        f"its ideal counts it from then on; a fair share of what was left: {fair:.0f}."
    )
    print(f"\n{'who ran what (1st s)':<26}" + "".join(f"{h:>14}" for h in hosts))
    for name, run, joined_s in (
        ("first batch, fresh hosts", cold, 0.0),
        (label, joined, joined.joined_s),
    ):
        cells = []
        for h in hosts:
            first_s = run.first_s.get(h)
            start_s = joined_s if h == joiner_name else 0.0
            when = "-" if first_s is None else f"{first_s - start_s:.2f}"
            cells.append(f"{run.per_host.get(h, 0)} ({when})")
        print(f"{name:<26}" + "".join(f"{cell:>14}" for cell in cells))
    print(
        f"snippets each host ran (seconds to its first result from the submit; {joiner_name} "
        "mid-batch: from its start)"
    )
    clean_s = statistics.median(r.wall_s for r in submits)
    header = f"{'batch s':>9}{'extra s':>9}{'fault->end s':>14}{'dups':>6}{'counted':>9}"
    print(f"\n{'fault of the busiest host':<26}{header}")
    for name, run in faults:
        verdict = (
            "ok" if run.fault_to_end_s <= TARGET_RECOVERY_S else f"over {TARGET_RECOVERY_S:.0f} s"
        )
        exact = "ok" if run.counted == n and run.duplicates == 0 else "MISMATCH"
        label = f"{name} ({run.victim})"
        print(
            f"{label:<26}{run.wall_s:>9.2f}{run.wall_s - clean_s:>9.2f}{run.fault_to_end_s:>14.2f}"
            f"{run.duplicates:>6}{run.counted:>6}/{n}   {verdict}, {exact}"
        )
    print(
        "extra s: over the median clean batch; fault->end: from the fault to the batch's last "
        "result.\nSleep snippets' Redis cost is mostly per second, not per snippet: heartbeats, "
        "and each busy dispatcher's counter flush."
    )


def _within(ratio: float) -> str:
    return "ok" if ratio <= TARGET_RATIO else f"over {TARGET_RATIO}x"


def _per_snippet(run: Run, n: int) -> tuple[float, float]:
    """Redis commands and CPU microseconds per snippet of one run."""
    return run.cost.commands / n, run.cost.cpu_s * 1e6 / n


if __name__ == "__main__":
    sys.exit(main())
