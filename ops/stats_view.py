"""``codepool stats``: the pool's counters, rates, queue and workers, read from Redis.

Everything shown is derived from the counter hashes the dispatchers flush (plain integer
sums and latency-bucket counts, see README "Redis layout"): means come from the sums,
percentiles from the buckets (as the bucket's upper edge). Latency is the worker's view
(executor hand-off to result); time a batch waits in the RQ queue is not counted in it,
which is why the queue depth is shown beside it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import TypedDict

import redis

from codepool.common import counters
from codepool.common.connection import redis_client
from codepool.common.errors import CodepoolError
from codepool.common.queueing import batch_queue
from codepool.common.result import LIMITS, STATUSES
from codepool.common.settings import Settings

log = logging.getLogger(__name__)

# Workers heartbeat every 5 s; six missed beats is dead, not merely slow.
ALIVE_S = 30.0
# A worker killed with SIGKILL never leaves the workers zset, and default names
# (HOST.PID) change on every restart: older entries are dropped from every view.
FORGET_AFTER_S = 3600.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"
# Shown even when zero, because they are what a training run watches.
MAIN_STATUSES = ("ok", "error", "timeout")


class WorkerView(TypedDict):
    """One worker host: zset score plus fields of its worker hash."""

    name: str
    heartbeat_s: float  # unix seconds of the last heartbeat
    heartbeat_age_s: float
    alive: bool
    slots: int | None
    mode: str
    calls: int
    contexts_live: int  # interpreter contexts it holds, as of its last heartbeat


class Snapshot(TypedDict):
    """What ``snapshot`` reads; shares are fractions of calls, means in milliseconds."""

    scope: str
    taken_at_s: float
    counters: dict[str, int]
    metrics: dict[str, float]
    shares: dict[str, float]
    calls_this_minute: int
    calls_last_minute: int
    minute_elapsed_s: float
    mean_ms: dict[str, float]
    queue_depth: int
    workers_alive: int
    workers: list[WorkerView]


def snapshot(
    conn: redis.Redis, settings: Settings, run: str | None = None, *, now_s: float | None = None
) -> Snapshot:
    """Read the counters of the cluster (or of run tag ``run``), the per-minute rate,
    the RQ queue depth and the workers seen in the last hour.

    now_s: the wall clock (unix seconds) to judge heartbeats and minute buckets by.
    Raises redis.RedisError when Redis cannot be reached.
    """
    now = time.time() if now_s is None else now_s
    keys = settings.keys
    minute = int(now // 60)
    with conn.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.run_stats(run) if run else keys.stats())
        # Minute buckets are only kept cluster-wide, so the rate ignores ``run``.
        pipe.hget(keys.minute_stats(minute), "calls")
        pipe.hget(keys.minute_stats(minute - 1), "calls")
        pipe.zrangebyscore(keys.workers(), now - FORGET_AFTER_S, "+inf", withscores=True)
        raw, this_minute, last_minute, seen = pipe.execute()
    workers = _workers(conn, settings, seen, now)
    queue_depth = int(batch_queue(conn, settings).count)

    totals = {field: 0 for field in counters.FIELDS} | counters.parse(raw)
    calls = totals["calls"]
    return Snapshot(
        scope=f"run {run}" if run else "cluster",
        taken_at_s=now,
        counters=totals,
        metrics=counters.metrics(totals),
        shares={s: totals[s] / calls if calls else 0.0 for s in STATUSES},
        calls_this_minute=int(this_minute or 0),
        calls_last_minute=int(last_minute or 0),
        minute_elapsed_s=now - minute * 60,
        mean_ms={
            name: totals[f"{name}_us"] / 1e3 / calls if calls else 0.0
            for name in ("latency", "exec", "queue")
        },
        queue_depth=queue_depth,
        workers_alive=sum(w["alive"] for w in workers),
        workers=workers,
    )


def _workers(
    conn: redis.Redis, settings: Settings, seen: list[tuple[bytes, float]], now: float
) -> list[WorkerView]:
    names = [member.decode() for member, _ in seen]
    with conn.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hmget(
                settings.keys.worker_stats(name), ["slots", "mode", "calls", "contexts_live"]
            )
        fields = pipe.execute() if names else []
    views = []
    for name, (_, beat_s), (slots, mode, calls, live) in zip(names, seen, fields, strict=True):
        views.append(
            WorkerView(
                name=name,
                heartbeat_s=float(beat_s),
                heartbeat_age_s=max(0.0, now - float(beat_s)),
                alive=now - float(beat_s) <= ALIVE_S,
                slots=int(slots) if slots is not None else None,
                mode=mode.decode() if mode is not None else "?",
                calls=int(calls or 0),
                contexts_live=int(live or 0),
            )
        )
    views.sort(key=lambda w: (not w["alive"], w["name"]))
    return views


def _edge(ms: float | None) -> str:
    if ms is None:
        return "-"
    return "> 30 s" if ms == float("inf") else f"<= {ms:g} ms"


def render(snap: Snapshot) -> str:
    """A compact plain-text view of ``snap`` (fits 80 columns for short worker names)."""
    totals = snap["counters"]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap["taken_at_s"]))
    shown = [s for s in STATUSES if s in MAIN_STATUSES or totals[s]]
    shares = "  ".join(f"{s} {totals[s]} ({snap['shares'][s]:.1%})" for s in shown)
    reached = "  ".join(f"{n} {totals[f'limit_{n}']}" for n in LIMITS if totals[f"limit_{n}"])
    means = snap["mean_ms"]
    stale = len(snap["workers"]) - snap["workers_alive"]
    lines = [
        f"codepool stats - {snap['scope']} - {stamp}",
        f"calls    {totals['calls']}   {shares}"
        + (f"   (cancelled {totals['cancelled']}, not calls)" if totals["cancelled"] else ""),
        f"limits   {reached or 'none reached'}",
        f"rate     {snap['calls_last_minute']} calls last minute, "
        f"{snap['calls_this_minute']} this minute ({snap['minute_elapsed_s']:.0f} s in)"
        " [cluster]",
        f"mean     latency {means['latency']:.1f} ms  exec {means['exec']:.1f} ms  "
        f"queue {means['queue']:.1f} ms",
        f"latency  p50 {_edge(counters.latency_percentile_ms(totals, 0.5))}  "
        f"p95 {_edge(counters.latency_percentile_ms(totals, 0.95))}  "
        f"p99 {_edge(counters.latency_percentile_ms(totals, 0.99))}",
        f"queue    {snap['queue_depth']} announcements waiting",
        f"workers  {snap['workers_alive']} alive, {stale} stale",
    ]
    if snap["workers"]:
        width = max(6, *(len(w["name"]) for w in snap["workers"]))
        lines.append(f"  {'worker'.ljust(width)}  {'age_s':>7}  slots  mode   {'calls':>8}  state")
        for w in snap["workers"]:
            slots = "?" if w["slots"] is None else str(w["slots"])
            lines.append(
                f"  {w['name'].ljust(width)}  {w['heartbeat_age_s']:7.1f}  {slots:>5}  "
                f"{w['mode']:<5}  {w['calls']:>8}  {'alive' if w['alive'] else 'stale'}"
            )
    return "\n".join(lines)


def main(url: str | None, run: str | None, watch: bool, interval_s: float = 2.0) -> int:
    """Print one view, or with ``watch`` redraw it every ``interval_s`` seconds until
    Ctrl-C. Returns 0, 1 when Redis is unreachable (once), 2 on a configuration error."""
    try:
        settings = Settings.from_env(redis_url=url)
    except CodepoolError as exc:
        print(f"codepool stats: {exc}", file=sys.stderr)
        return 2
    conn = redis_client(settings)
    try:
        while True:
            try:
                view, failed = render(snapshot(conn, settings, run)), False
            except redis.RedisError as exc:
                # Watching keeps going: Redis coming back should show without a restart.
                view, failed = f"codepool stats: Redis unreachable: {exc}", True
                log.debug("stats snapshot failed: %s", exc)
            if not watch:
                print(view, file=sys.stderr if failed else sys.stdout)
                return 1 if failed else 0
            sys.stdout.write(CLEAR_SCREEN + view + "\n")
            sys.stdout.flush()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0
    finally:
        conn.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="Redis URL (default: $REDIS_URL)")
    parser.add_argument("--run", default=None, help="show the counters of this run tag")
    parser.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between redraws (--watch)"
    )


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("stats", help="show counters, rates, queue depth and workers")
    add_arguments(parser)
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    return main(args.url, args.run, args.watch, args.interval)


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m codepool.ops.stats_view", description=__doc__)
    add_arguments(_parser)
    sys.exit(run_command(_parser.parse_args()))
