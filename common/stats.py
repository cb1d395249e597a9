"""Thread-safe in-process counters behind the reference ``stats.metrics()`` API."""

from __future__ import annotations

import threading

from codepool.common.result import ExecResult


class SandboxStats:
    """Counts results and reports the reference sandbox's ``sandbox/*`` metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._calls = 0
        self._latency_s = 0.0

    def record(self, result: ExecResult) -> None:
        with self._lock:
            self._calls += 1
            self._counts[result.status] = self._counts.get(result.status, 0) + 1
            self._latency_s += result.latency

    def metrics(self) -> dict[str, float]:
        """``sandbox/success_rate``, ``error_rate``, ``timeout_rate``, mean ``latency`` (s)."""
        with self._lock:
            calls = self._calls
            counts = dict(self._counts)
            latency_s = self._latency_s
        if calls == 0:
            return {
                "sandbox/success_rate": 0.0,
                "sandbox/error_rate": 0.0,
                "sandbox/timeout_rate": 0.0,
                "sandbox/latency": 0.0,
                "sandbox/calls": 0.0,
            }
        ok = counts.get("ok", 0)
        timeouts = counts.get("timeout", 0)
        return {
            "sandbox/success_rate": ok / calls,
            "sandbox/error_rate": (calls - ok - timeouts) / calls,
            "sandbox/timeout_rate": timeouts / calls,
            "sandbox/latency": latency_s / calls,
            "sandbox/calls": float(calls),
        }

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._calls = 0
            self._latency_s = 0.0
