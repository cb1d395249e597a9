"""HTTP benchmark: SandboxFusion-style requests against ``codepool serve`` on the
embedded default (its private Redis and one local worker).

Prints requests/s and latency for a burst of ``/run_code`` calls from many concurrent
clients (the issue's yardstick: 400 requests from 64 clients), a burst of small
notebooks on ``/run_jupyter``, and lone sequential calls; medians over rounds. A report,
not a test: it exits 0 whatever the numbers say, non-zero only when something crashed
or an answer was wrong.

    python ops/bench/serve.py [--requests 400] [--clients 64] [--rounds 3]
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


def median_row(rows: list[Row]) -> Row:
    ordered = sorted(rows, key=lambda row: row.wall_s)
    return ordered[len(ordered) // 2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
