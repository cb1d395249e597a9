"""``codepool exporter``: Prometheus metrics read from Redis at scrape time.

The exporter keeps no state of its own: every scrape reads the same counter hashes as
``codepool stats`` (via ``stats.snapshot``), so any number of exporters agree and a
restart loses nothing.

The latency histogram comes from the per-bucket counters the dispatchers keep
(``latency_le_*`` fields, see ``common/counters.py``), so ``histogram_quantile`` works on
it; its sum is ``latency_us`` and its count ``calls``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry

from codepool.common import counters
from codepool.common.connection import redis_client
from codepool.common.errors import CodepoolError
from codepool.common.result import LIMITS, STATUSES
from codepool.common.settings import Settings
from codepool.ops.stats_view import snapshot

log = logging.getLogger(__name__)

# Prometheus times a scrape out after 10 s by default: a dead Redis must answer
# "redis_up 0" well within that, not after redis-py's retries and 5 s connect timeout.
SCRAPE_TIMEOUT_S = 2.0


class PoolCollector(Collector):
    """Reads the pool's counters from Redis on each ``collect()``; never raises for an
    unreachable Redis, it reports ``codepool_redis_up 0`` and nothing else."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings.replace(
            socket_timeout_s=min(settings.socket_timeout_s, SCRAPE_TIMEOUT_S),
            connect_timeout_s=min(settings.connect_timeout_s, SCRAPE_TIMEOUT_S),
        )
        self.conn = redis_client(self.settings)
        # One attempt per scrape: the next scrape is the retry.
        self.conn.set_retry(Retry(NoBackoff(), 0))

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("codepool_redis_up", "1 if Redis answered this scrape, else 0")
        try:
            snap = snapshot(self.conn, self.settings)
        except redis.RedisError as exc:
            log.warning("exporter: Redis unreachable, reporting codepool_redis_up 0: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        totals = snap["counters"]

        snippets = CounterMetricFamily(
            "codepool_snippets", "Snippets finished, by result status", labels=["status"]
        )
        for status in STATUSES:
            snippets.add_metric([status], totals[status])
        yield snippets
        limits = CounterMetricFamily(
            "codepool_snippet_limits",
            "Snippets each limit stopped (output: cut by the output cap and stopped by none)",
            labels=["limit"],
        )
        for name in LIMITS:
            limits.add_metric([name], totals[f"limit_{name}"])
        yield limits
        yield CounterMetricFamily(
            "codepool_snippets_cancelled",
            "Snippets given up on by their callers before they had a result",
            value=totals["cancelled"],
        )
        yield HistogramMetricFamily(
            "codepool_snippet_latency_seconds",
            "Snippet latency on the worker, hand-off to result",
            buckets=[
                ("+Inf" if edge == float("inf") else repr(edge), count)
                for edge, count in counters.cumulative_buckets(totals)
            ],
            sum_value=totals["latency_us"] / 1e6,
        )
        yield CounterMetricFamily(
            "codepool_snippet_exec_seconds",
            "Total time snippets ran in their sandbox",
            value=totals["exec_us"] / 1e6,
        )
        yield CounterMetricFamily(
            "codepool_snippet_queue_seconds",
            "Total time snippets waited in a worker for a sandbox process",
            value=totals["queue_us"] / 1e6,
        )
        yield GaugeMetricFamily(
            "codepool_queue_depth",
            "Batch announcements waiting in the RQ queue",
            value=snap["queue_depth"],
        )
        yield GaugeMetricFamily(
            "codepool_workers_alive",
            "Worker hosts with a heartbeat in the last 30 s",
            value=snap["workers_alive"],
        )
        events = CounterMetricFamily(
            "codepool_contexts",
            "Interpreter contexts: opened, forked, calls run, ended by a limit or their idle "
            "TTL, rebuilt after their host was lost",
            labels=["event"],
        )
        for field in counters.CONTEXT_FIELDS:
            events.add_metric(
                [field.replace("contexts_", "").replace("context_", "")], totals[field]
            )
        yield events
        yield GaugeMetricFamily(
            "codepool_contexts_live",
            "Interpreter contexts held by the live worker hosts (their last heartbeats)",
            value=sum(w["contexts_live"] for w in snap["workers"] if w["alive"]),
        )
        beats = GaugeMetricFamily(
            "codepool_worker_last_heartbeat_seconds",
            "Unix time of each worker host's last heartbeat (hosts seen in the last hour)",
            labels=["worker"],
        )
        for worker in snap["workers"]:
            beats.add_metric([worker["name"]], worker["heartbeat_s"])
        yield beats

    def close(self) -> None:
        self.conn.close()


@dataclass
class RunningExporter:
    """An exporter serving ``/metrics`` from a background thread; ``stop()`` ends it."""

    server: WSGIServer
    thread: threading.Thread
    collector: PoolCollector

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5.0)
        self.collector.close()


def serve(url: str | None, port: int, addr: str = "0.0.0.0") -> RunningExporter:
    """Serve the pool's metrics on ``addr:port`` (``/metrics``) from a daemon thread.

    url: Redis URL (default ``$REDIS_URL``). The registry holds only this collector, so
    the exporter's own process metrics do not mix with the pool's.
    """
    collector = PoolCollector(Settings.from_env(redis_url=url))
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr, registry=registry)
    except OSError:
        collector.close()
        raise
    running = RunningExporter(server, thread, collector)
    log.info("exporter: serving metrics on http://%s:%d/metrics", addr, running.port)
    return running


def main(url: str | None, port: int, addr: str = "0.0.0.0") -> int:
    """Serve metrics until SIGTERM or Ctrl-C; returns 0."""
    running = serve(url, port, addr)
    stopping = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        # A timed wait so the main thread wakes up to run signal handlers promptly.
        while not stopping.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        running.stop()
        log.info("exporter: stopped")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("exporter", help="serve Prometheus metrics read from Redis")
    parser.add_argument("--port", type=int, required=True, help="TCP port for /metrics")
    parser.add_argument("--addr", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--url", default=None, help="Redis URL (default: $REDIS_URL)")
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        return main(args.url, args.port, args.addr)
    except (CodepoolError, OSError) as exc:  # bad settings, port taken
        print(f"codepool exporter: {exc}", file=sys.stderr)
        return 2
