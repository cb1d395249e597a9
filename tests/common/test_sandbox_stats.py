"""SandboxStats: reference metric names, exact under concurrent recording."""

from __future__ import annotations

import threading

from codepool.common import ExecResult, SandboxStats


def _r(status: str, latency: float) -> ExecResult:
    return ExecResult(
        ok=status == "ok",
        stdout="",
        stderr="",
        returncode=0,
        timed_out=False,
        latency=latency,
        status=status,
    )


def test_metrics_are_exact_under_threads() -> None:
    stats = SandboxStats()
    assert stats.metrics()["sandbox/success_rate"] == 0.0

    def work() -> None:
        for _ in range(1000):
            stats.record(_r("ok", 0.002))
            stats.record(_r("error", 0.004))
            stats.record(_r("timeout", 0.006))
            stats.record(_r("ok", 0.0))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = stats.metrics()
    assert m["sandbox/calls"] == 32_000
    assert m["sandbox/success_rate"] == 0.5
    assert m["sandbox/error_rate"] == 0.25
    assert m["sandbox/timeout_rate"] == 0.25
    assert abs(m["sandbox/latency"] - 0.003) < 1e-9


def test_latency_buckets_give_percentiles() -> None:
    from collections import Counter

    from codepool.common import counters

    totals: Counter[str] = Counter()
    for latency_s in (0.003, 0.004, 0.02, 0.3, 0.3, 0.3, 2.0, 40.0):
        totals.update(counters.count(_r("ok", latency_s)))
    assert sum(totals[f] for f in counters.BUCKET_FIELDS) == totals["calls"] == 8
    buckets = counters.cumulative_buckets(totals)
    assert buckets[0] == (0.005, 2) and buckets[-1] == (float("inf"), 8)
    assert counters.latency_percentile_ms(totals, 0.5) == 500
    assert counters.latency_percentile_ms(totals, 0.99) == float("inf")
    assert counters.latency_percentile_ms({}, 0.5) is None


def test_reset_starts_a_new_window() -> None:
    """A trainer logs ``stats.metrics()`` each step and resets: the next step's rates
    are its own."""
    stats = SandboxStats()
    stats.record(_r("error", 0.01))
    stats.reset()
    stats.record(_r("ok", 0.01))
    metrics = stats.metrics()
    assert metrics["sandbox/calls"] == 1 and metrics["sandbox/success_rate"] == 1.0


def test_each_limit_has_a_counter_and_a_metric() -> None:
    from codepool.common import LIMITS, counters

    stats = SandboxStats()
    for limit in (*LIMITS, "wall_time", None, "a_limit_of_a_later_version"):
        stats.record(_r("error", 0.01).replace(limit=limit))
    metrics = stats.metrics()
    assert metrics["sandbox/calls"] == len(LIMITS) + 3
    assert {name: metrics[f"sandbox/limit_{name}"] for name in LIMITS} == {
        name: 2.0 if name == "wall_time" else 1.0 for name in LIMITS
    }
    assert counters.count(_r("ok", 0.01)).keys().isdisjoint(counters.LIMIT_FIELDS)
