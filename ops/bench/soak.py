"""Soak: ~20 000 mixed snippets over ~10 minutes through one worker; does anything grow?

Starts its own redis-server and one ``codepool worker -c 2``, paces batches of mixed
snippets (print, numpy, sympy, errors, 1 % timeouts) and prints, at the start, middle and
end and once more after the batch TTL has passed: the RSS of the worker host, of its
dispatchers, supervisor and zygote, their open file descriptors, and Redis ``used_memory``.
A benchmark, not a test (not in CI):

    python ops/bench/soak.py [--snippets 20000] [--minutes 10] [--ttl 30]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import redis

from codepool.common.settings import Settings
from codepool.ops.bench.process_tree import descendants, worker_role
from codepool.ops.redis_server import RedisServer
from codepool.producer import CodePool

SNIPPETS = [
    ("print(2 + 3)", 50),
    ("import numpy as np\nprint(np.arange(100).reshape(10, 10).sum(axis=0)[:3])", 20),
    ("import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 4, x))", 10),
    ("print(sum(i * i for i in range(10000)))", 10),
    ("print(1 / 0)", 9),
    ("while True: pass", 1),
]


def mixed(n: int, rng: random.Random) -> list[str]:
    codes, weights = zip(*SNIPPETS, strict=True)
    return rng.choices(codes, weights=weights, k=n)


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def sample(label: str, worker: subprocess.Popen[bytes], client: redis.Redis) -> str:
    rss: Counter[str] = Counter({"host": rss_kb(worker.pid)})
    open_fds: Counter[str] = Counter({"host": fds(worker.pid)})
    for pid in descendants(worker.pid):
        name = worker_role(pid)
        if name:
            rss[name] += rss_kb(pid)
            open_fds[name] += fds(pid)
    used = int(client.info("memory")["used_memory"])
    keys = int(client.dbsize())
    return (
        f"{label:<12} host {rss['host'] / 1024:6.1f} MB  dispatchers "
        f"{rss['dispatcher'] / 1024:6.1f} MB  supervisor {rss['supervisor'] / 1024:5.1f} MB"
        f"  zygote {rss['zygote'] / 1024:6.1f} MB | fds host {open_fds['host']} disp "
        f"{open_fds['dispatcher']} sup {open_fds['supervisor']} zyg {open_fds['zygote']}"
        f" | redis used_memory {used / 1e6:6.2f} MB, {keys} keys"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snippets", type=int, default=20_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--ttl", type=int, default=30, help="batch TTL (s) for this run")
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    rng = random.Random(7)
    server = RedisServer().start()
    env = {**os.environ, "CODEPOOL_BATCH_TTL_S": str(args.ttl)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "codepool.ops.cli", "worker", "--url", server.url, "-c", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    client = redis.Redis.from_url(server.url)
    try:
        pool = CodePool(server.url, settings=Settings(redis_url=server.url, batch_ttl_s=args.ttl))
        pool.submit(["print(1)"] * 10).results(timeout_s=120)  # worker up and warm
        lines = [sample("start", worker, client)]
        batches = max(1, args.snippets // args.batch)
        pace_s = args.minutes * 60 / batches
        statuses: Counter[str] = Counter()
        started = time.monotonic()
        for number in range(batches):
            batch_started = time.monotonic()
            results = pool.submit(mixed(args.batch, rng), timeout_s=1.0).results(timeout_s=300)
            statuses.update(r.status for r in results)
            if number == batches // 2:
                lines.append(sample("middle", worker, client))
            time.sleep(max(0.0, pace_s - (time.monotonic() - batch_started)))
        elapsed = time.monotonic() - started
        lines.append(sample("end", worker, client))
        time.sleep(args.ttl + 5)
        lines.append(sample(f"end + {args.ttl + 5} s", worker, client))
        print(
            f"soak: {sum(statuses.values())} snippets in {elapsed / 60:.1f} min "
            f"({sum(statuses.values()) / elapsed:.0f}/s), statuses {dict(statuses)}"
        )
        print("\n".join(lines))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        client.close()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
