"""Agentic load on a simulated fleet: what lone calls (docs/agents.md) cost one Redis
when a thousand worker hosts keep their call channel open.

Each simulated host does what worker/call_server.py does on the wire, with no
processes: one connection blocked in BLMOVE on the call list (timeout 10 s) while it has
a free slot, a call "runs" for ``run_ms``, then one pipeline answers it (RPUSH to the
caller's inbox, its TTL, LREM from the in-flight list) and the
host's counters go out once a second (HINCRBY per field on the cluster, minute and
host hashes). Agents do what a blocking ``run_code`` does: RPUSH the call and BLPOP
their own inbox in one pipeline, then think. Real records (common/lone_calls.py).

Printed: hosts, agents, calls/s reached, Redis commands and CPU per call (less the
blocked fleet's own idle cost, also printed), and the share of one core that 10,000
calls/s would take at that cost per call. Python drives far fewer than 10,000 calls/s
here, so each host runs fewer calls a second than it would then and its once-a-second
counter flush is shared by fewer calls: the extrapolation is an upper bound. The hosts'
leases and RQ's idle traffic are ``fleet_sim``'s idle figures, not counted here.

    python -m codepool.ops.bench.fleet_sim --agentic [--hosts 10 1000]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio as aredis

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.limits import Limits
from codepool.common.lone_calls import INBOX_TTL_S, LoneCall, encode_reply
from codepool.common.result import ExecResult
from codepool.common.tally import count_hashes
from codepool.ops.bench.e2e import calls_between, redis_calls, redis_cpu_s
from codepool.ops.redis_server import RedisServer

TARGET_RATE = 10_000
TARGET_CORE = 0.50
BLOCK_S = 10
PROCESSES = 2
KEYS = Keys()
LIMITS = Limits().to_dict()


@dataclass
class Plan:
    url: str
    hosts: list[str]
    agents: int
    slots: int
    run_s: float
    think_s: float
    seconds: float


async def _host(conn: aredis.Redis, out: aredis.Redis, name: str, plan: Plan, end: float) -> None:
    room = asyncio.Semaphore(plan.slots + 1)
    inflight = KEYS.host_calls(name)
    tally: Counter[str] = Counter()
    running: set[asyncio.Future[None]] = set()

    async def finish(raw: bytes) -> None:
        call = LoneCall.decode(raw)
        await asyncio.sleep(plan.run_s)
        result = ExecResult(True, "", "", 0, False, plan.run_s, exec_s=plan.run_s, worker=name)
        tally.update(counters.count(result))
        async with out.pipeline(transaction=False) as pipe:
            pipe.rpush(call.inbox, encode_reply(call.id, result))
            pipe.lrem(inflight, 1, raw)  # type: ignore[arg-type]
            pipe.expire(call.inbox, INBOX_TTL_S)
            await pipe.execute()
        room.release()

    async def flush() -> None:  # the host's counters, once a second when it ran calls
        while True:
            await asyncio.sleep(1.0)
            if not tally:
                continue
            async with out.pipeline(transaction=False) as pipe:
                hashes = count_hashes(KEYS, name, "")
                for key in hashes:
                    for field, value in tally.items():
                        pipe.hincrby(key, field, value)
                pipe.expire(hashes[1], 2 * 86400)
                tally.clear()
                await pipe.execute()

    flusher = asyncio.ensure_future(flush())
    while time.monotonic() < end:
        await room.acquire()
        raw = await conn.blmove(KEYS.calls(), inflight, BLOCK_S, "LEFT", "RIGHT")
        if raw is None:
            room.release()
            continue
        task = asyncio.ensure_future(finish(cast(bytes, raw)))
        running.add(task)
        task.add_done_callback(running.discard)
    flusher.cancel()


async def _agent(conn: aredis.Redis, index: int, plan: Plan, end: float, done: list[float]) -> None:
    rng = random.Random(index)
    inbox = KEYS.inbox(f"sim.{os.getpid()}.{index}")
    while time.monotonic() < end:
        await asyncio.sleep(rng.uniform(0, plan.think_s))
        call = LoneCall(f"{index}.{len(done)}", inbox, "print(1)", LIMITS)
        began = time.monotonic()
        async with conn.pipeline(transaction=False) as pipe:
            pipe.rpush(KEYS.calls(), call.encode())
            pipe.blpop([inbox], timeout=30)
            await pipe.execute()
        done.append(time.monotonic() - began)


async def _run(plan: Plan, go: Any) -> list[float]:
    forever = float("inf")  # hosts serve until the agents are through
    # redis-py's default socket timeout (5 s) is shorter than the blocking waits.
    hosts = [aredis.Redis.from_url(plan.url, socket_timeout=BLOCK_S + 30) for _ in plan.hosts]
    out = aredis.Redis.from_url(plan.url, max_connections=256, socket_timeout=60)
    agents = [aredis.Redis.from_url(plan.url, socket_timeout=60) for _ in range(plan.agents)]
    done: list[float] = []
    tasks = [
        asyncio.ensure_future(_host(conn, out, name, plan, forever))
        for conn, name in zip(hosts, plan.hosts, strict=True)
    ]
    while not go.is_set():  # until every host of the fleet waits on the call list
        await asyncio.sleep(0.05)
    end = time.monotonic() + plan.seconds
    await asyncio.gather(*(_agent(c, i, plan, end, done) for i, c in enumerate(agents)))
    for task in tasks:
        task.cancel()
    return done


def _process(plan: Plan, go: Any, out: Any) -> None:
    try:
        out.put(asyncio.run(_run(plan, go)))
    except Exception as exc:
        out.put(exc)


@dataclass
class Row:
    hosts: int
    agents: int
    idle_cmds_s: float
    calls_s: float
    commands: float
    cpu_us: float
    p50_ms: float

    @property
    def core_at_target(self) -> float:
        return self.cpu_us * TARGET_RATE / 1e6


def measure(hosts: int, agents: int, *, seconds: float, run_ms: float, think_ms: float) -> Row:
    with RedisServer(extra_args=["--maxclients", "10000"]) as server:
        client = redis.Redis.from_url(server.url)
        names = [f"sim{h:04d}" for h in range(hosts)]
        context = multiprocessing.get_context("spawn")
        queue, go = context.Queue(), context.Event()
        plans = [
            Plan(
                server.url,
                names[p::PROCESSES],
                agents // PROCESSES,
                64,
                run_ms / 1e3,
                think_ms / 1e3,
                seconds,
            )
            for p in range(PROCESSES)
        ]
        processes = [context.Process(target=_process, args=(plan, go, queue)) for plan in plans]
        for process in processes:
            process.start()
        deadline = time.monotonic() + 300
        while int(client.info("clients")["blocked_clients"]) < hosts:
            if time.monotonic() > deadline:
                blocked = client.info("clients")["blocked_clients"]
                raise RuntimeError(f"{blocked} of {hosts} simulated hosts wait on the call list")
            time.sleep(0.2)
        idle0, idle_cpu0, t0 = redis_calls(client), redis_cpu_s(client), time.monotonic()
        time.sleep(2.5)  # the blocked fleet alone
        idle = sum(c for c, _ in calls_between(idle0, redis_calls(client)).values())
        idle_s = time.monotonic() - t0
        idle_cpu_s = (redis_cpu_s(client) - idle_cpu0) / idle_s
        before, cpu0, t1 = redis_calls(client), redis_cpu_s(client), time.monotonic()
        go.set()
        latencies: list[float] = []
        for _ in processes:
            got = queue.get(timeout=seconds + 300)
            if isinstance(got, Exception):
                raise got
            latencies += got
        elapsed = time.monotonic() - t1
        spent = calls_between(before, redis_calls(client))
        cpu = redis_cpu_s(client) - cpu0 - idle_cpu_s * elapsed
        for process in processes:
            process.join(timeout=BLOCK_S + 30)
        client.close()
    spent.pop("info", None)
    n = max(1, len(latencies))
    latencies.sort()
    return Row(
        hosts,
        agents,
        idle / idle_s,
        n / seconds,
        (sum(c for c, _ in spent.values()) - idle / idle_s * elapsed) / n,
        max(0.0, cpu) / n * 1e6,
        latencies[n // 2] * 1e3 if latencies else float("nan"),
    )


def report(rows: list[Row], *, run_ms: float, think_ms: float) -> bool:
    print(
        f"\nagentic load: lone calls of {run_ms} ms, agents thinking 0-{think_ms} ms, "
        f"one Redis; 10,000 calls/s target <= {TARGET_CORE:.0%} of a core"
    )
    print(
        f"{'hosts':>6}{'agents':>8}{'idle cmd/s':>12}{'calls/s':>9}{'cmd/call':>10}"
        f"{'CPU us/call':>13}{'core @10k/s':>13}{'p50 ms':>8}"
    )
    for r in rows:
        print(
            f"{r.hosts:>6}{r.agents:>8}{r.idle_cmds_s:>12.1f}{r.calls_s:>9.0f}{r.commands:>10.2f}"
            f"{r.cpu_us:>13.1f}{r.core_at_target:>12.0%}{r.p50_ms:>8.2f}"
        )
    biggest = max(rows, key=lambda r: r.hosts)
    good = biggest.core_at_target <= TARGET_CORE
    print(
        f"{'PASS' if good else 'FAIL'} 10,000 calls/s across {biggest.hosts} hosts at "
        f"{biggest.cpu_us:.1f} us each: {biggest.core_at_target:.0%} of a core "
        f"(<= {TARGET_CORE:.0%}; the rate reached here: {biggest.calls_s:.0f}/s)"
    )
    return good


def main(hosts: list[int], *, agents: int = 64, seconds: float = 10.0) -> bool:
    run_ms, think_ms = 5.0, 10.0
    rows = [measure(h, agents, seconds=seconds, run_ms=run_ms, think_ms=think_ms) for h in hosts]
    return report(rows, run_ms=run_ms, think_ms=think_ms)
