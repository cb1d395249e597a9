"""The stats counters (plain integers in Redis hashes) and the metrics derived from them."""

from __future__ import annotations

from collections.abc import Mapping

from codepool.common.result import CANCELLED, LIMITS, STATUSES, ExecResult

# Latency histogram: one counter per bucket (not cumulative), so dashboards can show
# percentiles from integer counters alone. Upper edges in ms; the last bucket is +Inf.
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
BUCKET_FIELDS = (*(f"latency_le_{ms}ms" for ms in LATENCY_BUCKETS_MS), "latency_le_inf")
# Snippets each zygote ran (fork mode), so operators see the bare/light/mid/heavy mix.
ZYGOTE_FIELDS = ("zygote_bare", "zygote_light", "zygote_mid", "zygote_heavy")
# Snippets each limit stopped (ExecResult.limit): limit_wall_time, limit_cpu_time, ...
LIMIT_FIELDS = tuple(f"limit_{name}" for name in LIMITS)
# ``cancelled``: snippets given up on before they had a result (``ledger.CANCEL`` counts
# them); they are not ``calls``, so no rate below counts them as errors.
# Interpreter contexts of the fleet (producer/context.py, worker/context_server.py):
# opened, forks made, calls run, ended by a call's limit or by their idle TTL, and
# rebuilt on another host after theirs was lost. (Live contexts are a gauge per host,
# ``contexts_live`` in its stats hash.)
CONTEXT_FIELDS = (
    "contexts_opened",
    "contexts_forked",
    "context_calls",
    "contexts_ended_limit",
    "contexts_ended_ttl",
    "contexts_rebuilt",
)
FIELDS = (
    "calls",
    *STATUSES,
    CANCELLED,
    "latency_us",
    "exec_us",
    "queue_us",
    *BUCKET_FIELDS,
    *ZYGOTE_FIELDS,
    *LIMIT_FIELDS,
    *CONTEXT_FIELDS,
)


def bucket_field(latency_ms: float) -> str:
    for edge_ms, field in zip(LATENCY_BUCKETS_MS, BUCKET_FIELDS, strict=False):
        if latency_ms <= edge_ms:
            return field
    return BUCKET_FIELDS[-1]


def zygote_field(result: ExecResult) -> str:
    """The zygote counter a result adds to, or "" (spawn mode, or it never ran)."""
    field = f"zygote_{result.zygote}"
    return field if field in ZYGOTE_FIELDS else ""


def limit_field(result: ExecResult) -> str:
    """The limit counter a result adds to, or "" (no limit named, or one this version
    does not know)."""
    field = f"limit_{result.limit}"
    return field if field in LIMIT_FIELDS else ""


def count(result: ExecResult) -> dict[str, int]:
    """The counter increments one result contributes."""
    out = {
        "calls": 1,
        result.status: 1,
        "latency_us": int(result.latency * 1e6),
        "exec_us": int(result.exec_s * 1e6),
        "queue_us": int(result.queue_s * 1e6),
        bucket_field(result.latency * 1e3): 1,
    }
    if zygote := zygote_field(result):
        out[zygote] = 1
    if limit := limit_field(result):
        out[limit] = 1
    return out


def terms(result: ExecResult) -> tuple[str, int, int, int, str, str, str]:
    """What the Redis-side counting (``ledger.WRITE``) adds up for one result: status,
    latency_us, exec_us, queue_us, the latency bucket, the zygote field and the limit
    field ("" for none); the same sums as ``count``."""
    return (
        result.status,
        int(result.latency * 1e6),
        int(result.exec_s * 1e6),
        int(result.queue_s * 1e6),
        bucket_field(result.latency * 1e3),
        zygote_field(result),
        limit_field(result),
    )


def cumulative_buckets(counters: Mapping[str, int]) -> list[tuple[float, int]]:
    """Prometheus-style (upper edge in s, cumulative count); the last edge is +inf."""
    edges = [ms / 1e3 for ms in LATENCY_BUCKETS_MS] + [float("inf")]
    running, out = 0, []
    for edge, field in zip(edges, BUCKET_FIELDS, strict=True):
        running += counters.get(field, 0)
        out.append((edge, running))
    return out


def latency_percentile_ms(counters: Mapping[str, int], q: float) -> float | None:
    """The upper edge (ms) of the bucket holding the q-quantile; None with no data, and
    inf when it falls in the last (open) bucket."""
    buckets = cumulative_buckets(counters)
    total = buckets[-1][1]
    if total == 0:
        return None
    rank = q * total
    return next(edge * 1e3 for edge, cumulative in buckets if cumulative >= rank)


def metrics(counters: Mapping[str, int]) -> dict[str, float]:
    """``sandbox/*`` metrics, as the reference sandbox names them, from raw counters."""
    calls = counters.get("calls", 0)
    out = {f"sandbox/{status}": float(counters.get(status, 0)) for status in STATUSES}
    out.update({f"sandbox/{field}": float(counters.get(field, 0)) for field in LIMIT_FIELDS})
    out["sandbox/calls"] = float(calls)
    out["sandbox/cancelled"] = float(counters.get(CANCELLED, 0))
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
    out["sandbox/bare_zygote_share"] = counters.get("zygote_bare", 0) / calls
    out["sandbox/light_zygote_share"] = counters.get("zygote_light", 0) / calls
    out["sandbox/mid_zygote_share"] = counters.get("zygote_mid", 0) / calls
    return out


def parse(raw: Mapping[bytes | str, bytes | str]) -> dict[str, int]:
    """Decode an HGETALL reply of counters (non-counter fields are skipped)."""
    out: dict[str, int] = {}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else key
        if name in FIELDS:
            out[name] = int(value)
    return out
