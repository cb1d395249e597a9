"""HTTP benchmark: SandboxFusion-style requests against ``codepool serve`` on the
embedded default (its private Redis and one local worker).

Prints requests/s and latency for a burst of ``/run_code`` calls from many concurrent
clients (the issue's yardstick: 400 requests from 64 clients), a burst of small
notebooks on ``/run_jupyter``, and lone sequential calls; medians over rounds. Then the
abandon rounds: ``--abandoners`` clients post 10-s spinners and give up after 3 s (as a
client with a short read timeout does), and a lone request follows at once; its p50
over the rounds is set against the idle lone p50 (target: within 2x: what was given up
on is cancelled, not left to hold the slots). A report, not a test: it exits 0 whatever
the numbers say, non-zero only when something crashed or an answer was wrong.

    python ops/bench/serve.py [--requests 400] [--clients 64] [--rounds 3]
                              [--abandoners 20] [--abandon-rounds 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from codepool.common.quantile import nearest_rank
from codepool.ops.serve_command import LISTENING

BURST_TARGET_S = 5.0  # "within a few seconds"
ABANDON_TARGET = 2.0  # lone p50 right after an abandon, over the idle lone p50
SPINNER: dict[str, Any] = {"code": "while True: pass", "language": "python", "run_timeout": 10}
GIVE_UP_S = 3.0


@dataclass
class Row:
    workload: str
    n: int
    clients: int
    wall_s: float
    latencies: list[float]

    @property
    def per_s(self) -> float:
        return self.n / self.wall_s

    def line(self) -> str:
        p50 = nearest_rank(self.latencies, 0.5) * 1000
        p95 = nearest_rank(self.latencies, 0.95) * 1000
        return (
            f"{self.workload:<10} {self.n:>5} {self.clients:>8} {self.wall_s:>8.2f} "
            f"{self.per_s:>8.0f} {p50:>8.1f} {p95:>8.1f}"
        )


def start_serve() -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    process = subprocess.Popen(
        [sys.executable, "-m", "codepool.ops.cli", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    for line in process.stdout:
        match = LISTENING.search(line)
        if match:
            return process, match.group(1)
    raise SystemExit(f"codepool serve exited with {process.wait()}")


def burst(
    url: str,
    name: str,
    n: int,
    clients: int,
    request: Callable[[int], tuple[str, dict[str, Any]]],
    check: Callable[[int, dict[str, Any]], bool],
) -> Row:
    local = threading.local()

    def one(i: int) -> float:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        path, body = request(i)
        started = time.perf_counter()
        response = session.post(f"{url}{path}", json=body, timeout=120)
        took = time.perf_counter() - started
        if response.status_code != 200 or not check(i, response.json()):
            raise SystemExit(f"{name}: wrong answer to request {i}: {response.text[:300]}")
        return took

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as threads:
        latencies = list(threads.map(one, range(n)))
    return Row(name, n, clients, time.perf_counter() - started, latencies)


def run_code(i: int) -> tuple[str, dict[str, Any]]:
    return "/run_code", {"code": f"print({i} * 2)", "language": "python", "run_timeout": 10}


def run_code_ok(i: int, body: dict[str, Any]) -> bool:
    return bool(body["run_result"]["stdout"] == f"{i * 2}\n")


def jupyter(i: int) -> tuple[str, dict[str, Any]]:
    return "/run_jupyter", {"cells": [f"a = {i}", "a * 3"], "total_timeout": 10}


def jupyter_ok(i: int, body: dict[str, Any]) -> bool:
    return bool(body["cells"][1]["display"] == [{"text/plain": str(i * 3)}])


def abandon(url: str, abandoners: int, rounds: int) -> tuple[Row, int, int]:
    """Rounds of: ``abandoners`` clients post a spinner and give up after GIVE_UP_S
    (or take an early answer), then one lone request on a warm keep-alive connection.
    Returns the lone requests' row, and how many spinners were given up on and how many
    answered early (504)."""
    session = requests.Session()
    latencies: list[float] = []
    gave_up = early = 0

    def spin(_: int) -> str:
        try:
            response = requests.post(f"{url}/run_code", json=SPINNER, timeout=(10, GIVE_UP_S))
        except requests.exceptions.ReadTimeout:
            return "gave up"
        if response.status_code == 504 and "Retry-After" in response.headers:
            return "early"
        raise SystemExit(f"abandon: a spinner was answered {response.status_code}")

    started = time.perf_counter()
    for round_ in range(rounds):
        session.post(f"{url}/run_code", json=run_code(round_)[1], timeout=120)  # warm
        with ThreadPoolExecutor(abandoners) as threads:
            outcomes = list(threads.map(spin, range(abandoners)))
        gave_up += outcomes.count("gave up")
        early += outcomes.count("early")
        path, body = run_code(round_)
        sent = time.perf_counter()
        response = session.post(f"{url}{path}", json=body, timeout=120)
        latencies.append(time.perf_counter() - sent)
        if response.status_code != 200 or not run_code_ok(round_, response.json()):
            raise SystemExit(f"abandon: wrong answer to the lone request: {response.text[:300]}")
    row = Row("abandon", rounds, abandoners, time.perf_counter() - started, latencies)
    return row, gave_up, early


def median_row(rows: list[Row]) -> Row:
    ordered = sorted(rows, key=lambda row: row.wall_s)
    return ordered[len(ordered) // 2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--abandoners", type=int, default=20)
    parser.add_argument("--abandon-rounds", type=int, default=7)
    args = parser.parse_args(argv)
    print(
        f"codepool serve bench: python {platform.python_version()}, {os.cpu_count()} cpus, "
        f"serve on the embedded default (private Redis, one worker -c 2), clients on the "
        f"same host, rounds={args.rounds} (median by wall time)"
    )
    process, url = start_serve()
    try:
        burst(url, "warm-up", 40, 8, run_code, run_code_ok)
        plans = [
            ("run_code", args.requests, args.clients, run_code, run_code_ok),
            ("jupyter", args.requests // 2, args.clients, jupyter, jupyter_ok),
            ("lone", 50, 1, run_code, run_code_ok),
        ]
        rows = []
        for name, n, clients, request, check in plans:
            rounds = [burst(url, name, n, clients, request, check) for _ in range(args.rounds)]
            rows.append(median_row(rounds))
        abandoned, gave_up, early = abandon(url, args.abandoners, args.abandon_rounds)
        rows.append(abandoned)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    header = ("workload", "n", "clients", "wall s", "req/s", "p50 ms", "p95 ms")
    print(f"{header[0]:<10} {header[1]:>5} " + " ".join(f"{h:>8}" for h in header[2:]))
    for row in rows:
        print(row.line())
    first = rows[0]
    verdict = "PASS" if first.wall_s <= BURST_TARGET_S else "FAIL"
    print(
        f"target: {verdict} {first.n} requests from {first.clients} clients in "
        f"<= {BURST_TARGET_S:g} s: {first.wall_s:.2f} s ({first.per_s:.0f} req/s)"
    )
    idle = nearest_rank(rows[2].latencies, 0.5)
    after = nearest_rank(abandoned.latencies, 0.5)
    verdict = "PASS" if after <= ABANDON_TARGET * idle else "FAIL"
    print(
        f"abandon: {args.abandon_rounds} rounds of {args.abandoners} clients giving up on "
        f"10-s spinners after {GIVE_UP_S:g} s ({gave_up} given up, {early} answered 504 "
        "at once), each followed by one lone request (its p50/p95 in the row above)"
    )
    print(
        f"target: {verdict} lone p50 after an abandon <= {ABANDON_TARGET:g}x the idle lone "
        f"p50: {after * 1000:.1f} ms against {idle * 1000:.1f} ms ({after / idle:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
