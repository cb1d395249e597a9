"""The Grafana dashboard's queries, run by a real Prometheus against ``codepool exporter``.

A real worker runs a small mixed batch while Prometheus (Debian's package; ``.ci/run``
installs it) scrapes a real ``codepool exporter`` every second; then every query in
ops/deploy/grafana-dashboard.json, asked through Prometheus' HTTP API, must return
finite values, and the ones whose answer the batch fixes must return that answer.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.reaping import wait_or_kill
from codepool.ops.redis_server import free_port
from codepool.producer import CodePool
from tests.conftest import StartWorker, wait_until

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "deploy" / "grafana-dashboard.json"
SCRAPE_INTERVAL_S = 1
# Grafana's $__rate_interval is at least four scrape intervals; here it must also reach
# back to a scrape from before the batch, so the window covers the whole test.
RATE_WINDOW = "5m"
GRAFANA_VARIABLES = {"$__rate_interval": RATE_WINDOW, "$__interval": "1s", "$__range": "5m"}
CODES = ["print(1)"] * 3 + ["1/0", "while True: pass"]  # ok 3, error 1, timeout 1
# Queries whose value the batch fixes (shares over the window: every count went from 0
# to its total within it).
EXPECTED = {
    'sum(rate(codepool_snippets_total{status="ok"}[$__rate_interval])) / '
    "sum(rate(codepool_snippets_total[$__rate_interval]))": 3 / 5,
    'sum(rate(codepool_snippets_total{status="timeout"}[$__rate_interval])) / '
    "sum(rate(codepool_snippets_total[$__rate_interval]))": 1 / 5,
    'sum(rate(codepool_snippets_total{status="infra"}[$__rate_interval])) / '
    "sum(rate(codepool_snippets_total[$__rate_interval]))": 0.0,
    "min(codepool_redis_up)": 1.0,
    "max(codepool_workers_alive)": 1.0,
    "max(codepool_queue_depth)": 0.0,
}

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="no prometheus binary (Debian: apt-get install prometheus; .ci/run installs it)",
)


@dataclass
class Prometheus:
    """A Prometheus server on a free port, scraping the targets it was started with."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except (urllib.error.URLError, ConnectionError):
            return False


def dashboard_queries() -> list[str]:
    """Every ``expr`` in the dashboard, rows and nested panels included."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(DASHBOARD.read_text()))
    return found


def as_prometheus(expr: str) -> str:
    """The query as Grafana sends it: its variables filled in."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the test does not fill in: {expr}"
    return expr


@pytest.fixture
def exporter_port(redis_url: str) -> Iterator[int]:
    """A real ``codepool exporter`` process serving the session Redis."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        command = [sys.executable, "-m", "codepool.ops.cli", "exporter", "--port", str(port)]
        process = subprocess.Popen(
            [*command, "--addr", "127.0.0.1", "--url", redis_url],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )

        def serving() -> bool:
            if process.poll() is not None:
                log.seek(0)
                raise AssertionError(f"the exporter exited: {log.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
                    return True
            except (urllib.error.URLError, ConnectionError):
                return False

        try:
            wait_until(serving, 30, "the exporter serving /metrics")
            yield port
        finally:
            process.terminate()
            wait_or_kill(process)


@pytest.fixture
def prometheus(exporter_port: int) -> Iterator[Prometheus]:
    """A real Prometheus scraping the exporter every second; temp config and data dir."""
    binary = shutil.which("prometheus")
    assert binary is not None  # the module is skipped otherwise
    base = Path(tempfile.mkdtemp(prefix="codepool-prometheus-"))
    config = base / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
        f"  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
        "scrape_configs:\n  - job_name: codepool\n"
        f"    scrape_timeout: {SCRAPE_INTERVAL_S}s\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n"
    )
    port = free_port()
    log_path = base / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={base / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    server = Prometheus(port, process, log_path)
    try:
        wait_until(server.ready, 60, "prometheus ready")
        yield server
    finally:
        process.terminate()
        wait_or_kill(process)
        shutil.rmtree(base, ignore_errors=True)


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


def test_every_dashboard_query_returns_data(
    redis_url: str, start_worker: StartWorker, prometheus: Prometheus
) -> None:
    start_worker(name="prom")

    def scraped(expr: str, expected: float) -> bool:
        return _values(prometheus.query(expr)) == [expected]

    # A scrape from before the batch, with every count still 0: rates have a start.
    wait_until(lambda: scraped('up{job="codepool"}', 1.0), 30, "the exporter's target up")
    wait_until(lambda: scraped("sum(codepool_snippets_total)", 0.0), 30, "a scrape of zeros")
    pool = CodePool(redis_url)
    results = pool.submit(CODES, timeout_s=1.0).results(timeout_s=60)
    pool.close()
    assert [r.status for r in results] == ["ok"] * 3 + ["error", "timeout"]
    client = redis.Redis.from_url(redis_url)
    wait_until(
        lambda: counters.parse(client.hgetall(Keys().stats())).get("calls") == len(CODES),
        what="the counters flushed",
    )
    client.close()
    # ... and one from after it.
    wait_until(lambda: scraped("sum(codepool_snippets_total)", 5.0), 30, "a scrape of five")

    queries = dashboard_queries()
    assert len(queries) >= 12, queries
    assert set(EXPECTED) <= set(queries), set(EXPECTED) - set(queries)
    empty, not_finite, wrong = [], [], []
    for expr in queries:
        values = _values(prometheus.query(as_prometheus(expr)))
        if not values:
            empty.append(expr)
        elif not all(math.isfinite(v) for v in values):
            not_finite.append((expr, values))
        elif expr in EXPECTED and not all(math.isclose(v, EXPECTED[expr]) for v in values):
            wrong.append((expr, values, EXPECTED[expr]))
    assert not empty, f"queries that returned no data: {empty}"
    assert not not_finite, f"queries that returned NaN or Inf: {not_finite}"
    assert not wrong, f"queries with the wrong answer: {wrong}"
    # The rates and means have an answer the batch bounds.
    for expr, low, high in (
        ("sum(rate(codepool_snippets_total[$__rate_interval]))", 0.0, 5.0),
        # The timeout snippet ran its full second: at least a fifth of a second each.
        (
            "sum(rate(codepool_snippet_exec_seconds_total[$__rate_interval])) / "
            "sum(rate(codepool_snippets_total[$__rate_interval]))",
            0.2,
            2.0,
        ),
        ("max by (worker) (time() - codepool_worker_last_heartbeat_seconds)", -5.0, 30.0),
    ):
        assert expr in queries, expr
        values = _values(prometheus.query(as_prometheus(expr)))
        assert values and all(low < v <= high for v in values), (expr, values)
