"""`codepool stats` and `codepool exporter` report what real workers ran, read from Redis."""

from __future__ import annotations

import argparse
import os
import time
import urllib.error
import urllib.request

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.result import LIMITS
from codepool.common.settings import Settings
from codepool.ops import exporter, stats_view
from codepool.ops.redis_server import free_port
from codepool.producer import CodePool
from tests.conftest import StartWorker, wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

CODES = ["print(1)"] * 3 + ["1/0", "while True: pass"]
EXPECTED = {"calls": 5, "ok": 3, "error": 1, "timeout": 1, "limit_wall_time": 1}


def _run_mixed_batch(redis_url: str, start_worker: StartWorker) -> str:
    """Run ok, error and timeout snippets on a real worker; wait for the counters to
    reach Redis (flushed at least once a second); return the worker's name."""
    worker = start_worker(name=f"stats-{os.getpid()}")
    pool = CodePool(redis_url)
    results = pool.submit(CODES, run="t", timeout_s=1.0).results(timeout_s=60)
    pool.close()
    assert [r.status for r in results] == ["ok"] * 3 + ["error", "timeout"]
    client = redis.Redis.from_url(redis_url)
    keys = Keys()

    def flushed() -> bool:
        # Each dispatcher flushes its own share, hash by hash: wait for all of them.
        hashes = (keys.stats(), keys.run_stats("t"), keys.worker_stats(worker.name))
        return all(
            {k: counters.parse(client.hgetall(key)).get(k, 0) for k in EXPECTED} == EXPECTED
            for key in hashes
        )

    wait_until(flushed)
    client.close()
    return worker.name


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _scrape_once(redis_url: str) -> tuple[Samples, int]:
    """One scrape of an exporter started for it, and the port it listened on (it is
    stopped since)."""
    running = exporter.serve(redis_url, free_port(), "127.0.0.1")
    try:
        return _scrape(running.port), running.port
    finally:
        running.stop()


def _sample(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_snapshot_and_render_show_what_ran(
    redis_url: str, start_worker: StartWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    name = _run_mixed_batch(redis_url, start_worker)
    settings = Settings.from_env(redis_url=redis_url)
    conn = redis.Redis.from_url(redis_url)
    for run in ("t", None):
        snap = stats_view.snapshot(conn, settings, run)
        assert {k: snap["counters"][k] for k in EXPECTED} == EXPECTED
        assert snap["shares"]["ok"] == 3 / 5
        assert snap["shares"]["error"] == snap["shares"]["timeout"] == 1 / 5
        assert snap["calls_this_minute"] + snap["calls_last_minute"] == 5
        # The timeout snippet alone ran for its full second.
        assert snap["mean_ms"]["exec"] >= 1000 / 5
        assert snap["mean_ms"]["latency"] >= snap["mean_ms"]["exec"]
        assert snap["queue_depth"] == 0
    assert snap["workers_alive"] == 1
    [worker] = snap["workers"]
    assert worker["name"] == name and worker["alive"] and worker["calls"] == 5
    assert worker["slots"] == 2 and worker["mode"] == "fork"
    assert 0 <= worker["heartbeat_age_s"] <= stats_view.ALIVE_S
    conn.close()

    view = stats_view.render(snap)
    assert "calls    5" in view
    assert "ok 3 (60.0%)" in view and "error 1 (20.0%)" in view
    assert "timeout 1 (20.0%)" in view
    assert "\nlimits   wall_time 1\n" in view
    assert "1 alive, 0 stale" in view
    assert any(line.split()[0] == name and "alive" in line for line in view.splitlines())

    assert stats_view.main(redis_url, "t", watch=False) == 0
    out = capsys.readouterr().out
    assert "codepool stats - run t" in out and "ok 3 (60.0%)" in out
    assert stats_view.CLEAR_SCREEN not in out


def test_exporter_serves_the_counters(redis_url: str, start_worker: StartWorker) -> None:
    name = _run_mixed_batch(redis_url, start_worker)
    samples, port = _scrape_once(redis_url)
    assert _sample(samples, "codepool_redis_up") == 1
    for status in ("ok", "error", "timeout", "memory", "signal", "rejected", "infra"):
        expected = EXPECTED.get(status, 0)
        assert _sample(samples, "codepool_snippets_total", status=status) == expected, status
    for limit in LIMITS:
        expected = EXPECTED.get(f"limit_{limit}", 0)
        assert _sample(samples, "codepool_snippet_limits_total", limit=limit) == expected, limit
    assert _sample(samples, "codepool_snippet_latency_seconds_count") == 5
    assert _sample(samples, "codepool_snippet_latency_seconds_bucket", le="+Inf") == 5
    # The 1 s timeout lands above 0.5 s; the quick snippets below it.
    assert _sample(samples, "codepool_snippet_latency_seconds_bucket", le="0.5") == 4
    client = redis.Redis.from_url(redis_url)
    totals = {f: int(client.hget(Keys().stats(), f) or 0) for f in ("latency_us", "queue_us")}
    client.close()
    assert _sample(samples, "codepool_snippet_latency_seconds_sum") == totals["latency_us"] / 1e6
    assert _sample(samples, "codepool_snippet_exec_seconds_total") >= 1.0  # the timeout
    # Each snippet waits for a slot a little (queue_us > 0), and the exporter says so.
    assert totals["queue_us"] > 0
    assert _sample(samples, "codepool_snippet_queue_seconds_total") == totals["queue_us"] / 1e6
    assert _sample(samples, "codepool_queue_depth") == 0
    assert _sample(samples, "codepool_workers_alive") >= 1
    beat_s = _sample(samples, "codepool_worker_last_heartbeat_seconds", worker=name)
    assert abs(time.time() - beat_s) <= stats_view.ALIVE_S
    with pytest.raises(urllib.error.URLError):
        _scrape(port)


def test_a_waiting_announcement_shows_as_queue_depth(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = CodePool(redis_url)
    pool.submit(["print(1)"])  # no worker: it stays queued
    pool.close()
    samples, _ = _scrape_once(redis_url)
    assert _sample(samples, "codepool_queue_depth") == 1
    assert _sample(samples, "codepool_workers_alive") == 0
    assert _sample(samples, "codepool_snippet_latency_seconds_count") == 0

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(stats_view.time, "sleep", interrupt)
    assert stats_view.main(redis_url, None, watch=True, interval_s=0.1) == 0
    out = capsys.readouterr().out
    assert out.startswith(stats_view.CLEAR_SCREEN)
    assert "1 announcements waiting" in out and "0 alive, 0 stale" in out
    assert "limits   none reached" in out


def test_unreachable_redis_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    running = exporter.serve(dead_url, free_port(), "127.0.0.1")
    try:
        started = time.monotonic()
        samples = _scrape(running.port)
        assert time.monotonic() - started < exporter.SCRAPE_TIMEOUT_S * 2
    finally:
        running.stop()
    assert samples == {("codepool_redis_up", ()): 0}

    assert stats_view.main(dead_url, None, watch=False) == 1
    assert "Redis unreachable" in capsys.readouterr().err


def test_subcommands_register_and_dispatch(redis_url: str) -> None:
    parser = argparse.ArgumentParser(prog="codepool")
    commands = parser.add_subparsers(dest="command", required=True)
    stats_view.register(commands)
    exporter.register(commands)
    args = parser.parse_args(["stats", "--url", redis_url, "--run", "t", "--interval", "0.5"])
    assert (args.url, args.run, args.watch, args.interval) == (redis_url, "t", False, 0.5)
    assert stats_view.run_command(args) == 0
    args = parser.parse_args(["exporter", "--port", "9150"])
    assert (args.port, args.addr, args.url) == (9150, "0.0.0.0", None)
    with pytest.raises(SystemExit):
        parser.parse_args(["exporter"])  # --port is required
