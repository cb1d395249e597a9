"""What an idle worker host costs Redis: real ``codepool worker`` hosts, one at a time,
against a private Redis, measured with INFO commandstats and INFO cpu over a window
minus what the empty server spends on its own.

    python -m codepool.ops.bench.idle            # -c 2 and -c 16, 20 s each
    python -m codepool.ops.bench.idle -c 2 16 64 --window 30

Target (issue 23): at most 5 commands/s per host, and the -c 16 host within 2x of the
-c 2 host (idle cost per host, not per slot).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from codepool.common import rq_records
from codepool.ops.bench.e2e import calls_between, redis_calls, redis_cpu_s, stop_worker
from codepool.ops.redis_server import RedisServer

TARGET_COMMANDS_S = 5.0
TARGET_SPREAD = 2.0
READY_TIMEOUT_S = 120.0
SETTLE_S = 5.0  # after every dispatcher holds its lease: start-up traffic is over
FLOOR_S = 5.0


@dataclass
class Idle:
    slots: int
    commands_s: float
    cpu_ms_s: float
    per_command: dict[str, float]  # calls/s by command
    connections: int  # the host's Redis connections


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--slots", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per host")
    args = parser.parse_args(argv)
    rows: list[Idle] = []
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        floor = _floor_rate(client)
        for slots in args.slots:
            rows.append(_measure(server.url, client, slots, args.window, floor))
            client.flushall()
    _print(rows)
    return 0 if _targets_pass(rows) else 1


def _floor_rate(client: redis.Redis) -> float:
    started, before = time.monotonic(), redis_cpu_s(client)
    time.sleep(FLOOR_S)
    return (redis_cpu_s(client) - before) / (time.monotonic() - started)


def _measure(url: str, client: redis.Redis, slots: int, window_s: float, floor: float) -> Idle:
    workdir = tempfile.mkdtemp(prefix="codepool-idle-")
    log_path = os.path.join(workdir, "worker.log")
    command = [sys.executable, "-m", "codepool.ops.cli", "worker", "--url", url]
    command += ["-c", str(slots), "--preload", ""]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": workdir},
            start_new_session=True,
        )
    try:
        _wait_dispatchers(process, client, slots, log_path)
        time.sleep(SETTLE_S)
        before, cpu_before = redis_calls(client), redis_cpu_s(client)
        started = time.monotonic()
        time.sleep(window_s)
        cpu_after = redis_cpu_s(client)
        elapsed = time.monotonic() - started
        connections = int(client.info("clients")["connected_clients"]) - 1  # not ours
        per = calls_between(before, redis_calls(client))
        calls, _ = per.pop("info", (0, 0))
        if calls > 3:  # the INFO calls inside the window are ours
            per["info"] = (calls - 3, 0)
        rates = {name: n / elapsed for name, (n, _) in per.items()}
        cpu_ms_s = max(0.0, (cpu_after - cpu_before) / elapsed - floor) * 1000
        return Idle(slots, sum(rates.values()), cpu_ms_s, rates, connections)
    finally:
        stop_worker(process)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_dispatchers(
    process: subprocess.Popen[bytes], client: redis.Redis, slots: int, log_path: str
) -> None:
    """Until RQ lists every dispatcher of the host (one per slot, at least two)."""
    want = max(2, slots)
    deadline = time.monotonic() + READY_TIMEOUT_S
    workers_key = rq_records.workers_key()
    while client.scard(workers_key) < want:
        if process.poll() is not None or time.monotonic() > deadline:
            with open(log_path, errors="replace") as f:
                tail = "".join(f.readlines()[-30:])
            raise RuntimeError(f"worker -c {slots} not ready:\n{tail}")
        time.sleep(0.2)


def _print(rows: list[Idle]) -> None:
    print("\nidle worker host against its own Redis (per second, minus an empty server)")
    print(f"{'host':<24}{'commands/s':>12}{'Redis CPU ms/s':>16}{'connections':>13}")
    for row in rows:
        name = f"codepool worker -c {row.slots}"
        print(f"{name:<24}{row.commands_s:>12.1f}{row.cpu_ms_s:>16.2f}{row.connections:>13}")
    names = sorted({name for row in rows for name in row.per_command})
    print("\nby command (calls/s)")
    print(f"{'command':<20}" + "".join(f"{'-c ' + str(row.slots):>10}" for row in rows))
    for name in names:
        print(f"{name:<20}" + "".join(f"{row.per_command.get(name, 0.0):>10.2f}" for row in rows))


def _targets_pass(rows: list[Idle]) -> bool:
    ok = True
    for row in rows:
        good = row.commands_s <= TARGET_COMMANDS_S
        ok &= good
        verdict = "PASS" if good else "FAIL"
        print(f"{verdict} -c {row.slots}: {row.commands_s:.1f} commands/s (<= {TARGET_COMMANDS_S})")
    if len(rows) > 1:
        low = min(row.commands_s for row in rows)
        high = max(row.commands_s for row in rows)
        spread = high / low if low else float("inf")
        good = spread <= TARGET_SPREAD
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} spread {spread:.2f}x (<= {TARGET_SPREAD}x)")
    return ok


if __name__ == "__main__":
    sys.exit(main())
