"""Chaos run: mixed load on a small fleet under random faults from a seed, every call
recorded, and a checker over the history (docs/chaos.md):

    python -m codepool.ops.bench.chaos --minutes N --seed S [--hosts 3] [--slots 2]
        [--interval 7] [--rate 1.0] [--kinds a,b] [--dir DIR]

Starts its own Redis (AOF ``everysec``), ``--hosts`` worker hosts, ``codepool serve`` and
producer processes (ops/bench/chaos_load.py: batches, lone calls, contexts with forks,
HTTP clients; some give up), then applies the seed's fault schedule
(ops/bench/chaos_faults.py) until the N minutes are up. When the producers have
finished, the fleet is stopped and the checker (ops/bench/chaos_check.py) reads the
history, Redis and /proc. It prints the fault log, the figures, each fault kind's cost and
every violation, and exits 1 on a violation (0 otherwise). The same seed replays the same
schedule. Histories, fault log, logs and ``report.json`` stay in ``--dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from codepool.common.settings import Settings
from codepool.ops.arguments import split_names
from codepool.ops.bench.chaos_check import (
    Report,
    check_history,
    check_keys,
    check_processes,
    check_redis,
    fault_costs,
)
from codepool.ops.bench.chaos_faults import KINDS, NETNS_KINDS, SENTINEL_KINDS, Injector, plan
from codepool.ops.bench.chaos_fleet import ChaosFleet
from codepool.ops.bench.chaos_history import read_history
from codepool.ops.bench.chaos_redis import NetnsRedis, PlainRedis, SentinelRedis
from codepool.ops.bench.netns import Fleet

# Snippets a second each kind of producer asks for at --rate 1 (about 2,200 a minute;
# 1,400-1,500 a minute came through at a load average near 100: the 30-minute run
# must reach 50,000).
RATES = {"batch": 20.0, "lone": 11.0, "ctx": 3.0, "http": 3.0}
# A host that cannot reach Redis when it starts says so and exits (a systemd unit starts
# it again): not a violation when it starts during a Redis fault.
REDIS_AT_START = "cannot reach Redis"
# How long producers may take to finish their last calls after the end: a batch's
# backstop deadline (its timeouts plus a minute) and then some.
FINISH_S = 150.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2, help="slots per host")
    parser.add_argument("--interval", type=float, default=7.0, help="mean s between faults")
    parser.add_argument("--rate", type=float, default=1.0, help="scales the load")
    parser.add_argument(
        "--sleepy", type=float, default=0.1, help="share of snippets that sleep 0.1-0.5 s"
    )
    parser.add_argument(
        "--kinds", default="", help="fault kinds to draw from (default: every kind)"
    )
    parser.add_argument(
        "--sentinel",
        action="store_true",
        help="Redis as a primary, a replica and 3 sentinels; adds redis_failover",
    )
    parser.add_argument(
        "--netns",
        action="store_true",
        help="each host in a network namespace of its own (root); adds link_cut",
    )
    parser.add_argument("--dir", default="", help="where histories and logs go")
    args = parser.parse_args(argv)
    if args.sentinel and args.netns:
        parser.error("--sentinel and --netns do not go together")
    possible: tuple[str, ...] = KINDS + SENTINEL_KINDS if args.sentinel else KINDS
    if args.netns:
        possible = tuple(k for k in KINDS if k != "redis_restart") + NETNS_KINDS
    args.kinds = split_names(args.kinds) or possible
    unknown = set(args.kinds) - set(possible)
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    return args


def run(args: argparse.Namespace) -> Report:
    directory = Path(args.dir or tempfile.mkdtemp(prefix=f"codepool-chaos-{args.seed}-"))
    directory.mkdir(parents=True, exist_ok=True)
    schedule = plan(args.seed, args.minutes, args.interval, args.hosts, args.kinds)
    print(
        f"chaos: seed {args.seed}, {args.minutes} min, {len(schedule)} faults planned, "
        f"{args.hosts} hosts x {args.slots} slots; in {directory}\n"
        f"replay: python -m codepool.ops.bench.chaos --seed {args.seed} --minutes "
        f"{args.minutes} --hosts {args.hosts} --slots {args.slots} --interval {args.interval} "
        f"--rate {args.rate} --sleepy {args.sleepy}{' --sentinel' if args.sentinel else ''}"
        f"{' --netns' if args.netns else ''} "
        f"--kinds {','.join(args.kinds)}",
        flush=True,
    )
    rates = {role: rate * args.rate for role, rate in RATES.items()}
    fleet = ChaosFleet(directory, args.hosts, args.slots, args.seed, 0.0, rates, args.sleepy)
    if args.netns:
        fleet.store = NetnsRedis(Fleet(hosts=args.hosts))
    else:
        fleet.store = SentinelRedis() if args.sentinel else PlainRedis()
    injector = Injector(fleet, directory / "faults.jsonl")
    done = threading.Event()
    report = Report()
    try:
        fleet.start_base()
        started = time.time()
        fleet.until = started + args.minutes * 60
        fleet.start_load()
        tracker = threading.Thread(target=_track, args=(fleet, done), daemon=True)
        tracker.start()
        for fault in schedule:
            time.sleep(max(0.0, started + fault.at_s - time.time()))
            injector.apply(fault)
        time.sleep(max(0.0, fleet.until - time.time()))
        injector.settle()
        for name in fleet.wait_producers(FINISH_S):
            report.violate(f"hang: producer {name} had not finished {FINISH_S:.0f} s after the end")
        elapsed_s = time.time() - started
        # Janitors fence what the last faults left (a lease and a beat).
        time.sleep(Settings().lease_s + 2 * Settings().heartbeat_s)
        done.set()
        tracker.join()
        fleet.stop()
        _check(fleet, injector.log, directory, report)
        report.figures["load average at the end"] = os.getloadavg()
        report.figures["minutes"] = round(elapsed_s / 60, 2)
    finally:
        done.set()
        fleet.close()
    _print(report, injector.log, directory)
    return report


def _track(fleet: ChaosFleet, done: threading.Event) -> None:
    while not done.wait(1.0):
        fleet.track()


def _check(
    fleet: ChaosFleet, faults: list[dict[str, Any]], directory: Path, report: Report
) -> None:
    settings = Settings(redis_url=fleet.url)
    events = read_history(directory / "history")
    ops = check_history(events, faults, fleet.killed_producers, settings, report)
    report.figures["snippets"] = sum(
        1 for e in events if e["op"] == "invoke" and e["kind"] in ("batch", "lone", "ctx", "http")
    )
    report.figures["faults"] = dict(Counter(f["kind"] for f in faults))
    report.figures["fault costs"] = fault_costs(ops, faults)
    conn = fleet.direct()
    try:
        disconnects = sum(f["kind"] == "client_disconnect" for f in faults)
        check_redis(conn, settings, ops, report, unrecorded=disconnects)
        check_keys(conn, settings, report)
    finally:
        conn.close()
    check_processes(fleet.tracked, report)
    for name, status, t, said in fleet.exits:
        when = time.strftime("%H:%M:%S", time.gmtime(t))
        what = f"{name} exited by itself ({status}) at {when} UTC: {said[-200:]}"
        if REDIS_AT_START in said:  # as the README has it: said in one line, exit 1
            report.figures.setdefault("hosts that exited at start, Redis away", []).append(what)
        else:
            report.violate(f"host exit: {what}")


def _print(report: Report, faults: list[dict[str, Any]], directory: Path) -> None:
    print("\nfault log:")
    for fault in faults:
        print(f"  +{fault['at_s']:7.1f} s  {fault['kind']:<17} {fault['detail']}")
    costs = report.figures.pop("fault costs", [])
    print("\nfigures:")
    for name, value in report.figures.items():
        print(f"  {name}: {value}")
    print("\nfault costs (calls in flight at the fault; latency s p50 / p99 / max):")
    print(f"  {'fault':<17} {'count':>5} {'in flight':>9}  {'latency':<24} not ok")
    for kind, count, hit, latency, bad in costs:
        print(f"  {kind:<17} {count:>5} {hit:>9}  {latency:<24} {bad}")
    print(f"\nviolations: {len(report.violations)}")
    for violation in report.violations:
        print(f"  {violation}")
    with open(directory / "report.json", "w") as f:
        json.dump({**report.figures, "costs": costs, "violations": report.violations}, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    report = run(parse(argv))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
