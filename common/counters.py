"""The stats counters (plain integers in Redis hashes) and the metrics derived from them."""

from __future__ import annotations

from collections.abc import Mapping

from codepool.common.result import STATUSES, ExecResult

FIELDS = ("calls", *STATUSES, "latency_us", "exec_us", "queue_us")


def count(result: ExecResult) -> dict[str, int]:
    """The counter increments one result contributes."""
    return {
        "calls": 1,
        result.status: 1,
        "latency_us": int(result.latency * 1e6),
        "exec_us": int(result.exec_s * 1e6),
        "queue_us": int(result.queue_s * 1e6),
    }


def metrics(counters: Mapping[str, int]) -> dict[str, float]:
    """``sandbox/*`` metrics, as the reference sandbox names them, from raw counters."""
    calls = counters.get("calls", 0)
    out = {f"sandbox/{status}": float(counters.get(status, 0)) for status in STATUSES}
    out["sandbox/calls"] = float(calls)
    if calls == 0:
        out.update(
            {
                "sandbox/success_rate": 0.0,
                "sandbox/error_rate": 0.0,
                "sandbox/timeout_rate": 0.0,
                "sandbox/latency": 0.0,
            }
        )
        return out
    ok = counters.get("ok", 0)
    timeouts = counters.get("timeout", 0)
    out["sandbox/success_rate"] = ok / calls
    out["sandbox/error_rate"] = (calls - ok - timeouts) / calls
    out["sandbox/timeout_rate"] = timeouts / calls
    out["sandbox/latency"] = counters.get("latency_us", 0) / 1e6 / calls
    out["sandbox/exec_time"] = counters.get("exec_us", 0) / 1e6 / calls
    out["sandbox/queue_time"] = counters.get("queue_us", 0) / 1e6 / calls
    return out


def parse(raw: Mapping[bytes | str, bytes | str]) -> dict[str, int]:
    """Decode an HGETALL reply of counters (non-counter fields are skipped)."""
    out: dict[str, int] = {}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else key
        if name in FIELDS:
            out[name] = int(value)
    return out
