"""Explicit configuration: one frozen dataclass, read from the environment on request."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from codepool.common.errors import ConfigError
from codepool.common.keys import DEFAULT_PREFIX, DEFAULT_QUEUE, Keys
from codepool.common.redis_url import is_sentinel_url, parse_sentinel_url

DEFAULT_URL = "redis://localhost:6379/0"
# The drain deadline of worker, serve and replay when none is given: from the first
# SIGTERM or SIGINT to the exit, in seconds (--drain-timeout).
DEFAULT_DRAIN_S = 10.0


@dataclass(frozen=True)
class Settings:
    """Where Redis is and how codepool uses it. Times in seconds.

    batch_ttl_s: lifetime of a batch's results hash and done list.
    job_result_ttl_s / job_failure_ttl_s: RQ's own records of finished / failed jobs.
    socket_timeout_s: redis-py socket timeout for ordinary commands (blocking reads
        add their own block time to it).
    stats_flush_s: dispatchers take the batches they are through with out of their
        owner set at least this often (counters go with the results, in one write).
    write_gap_s: while a dispatcher's results stream in, it writes them to Redis at
        most once per this many seconds, each write carrying all that gathered (a
        result after a quieter spell, or one nothing else would join, goes at once);
        0 writes each as soon as the writer is free.
    collect_linger_s: while a batch's results stream in, a producer reads its done list
        at most once per this many seconds (not once the batch's last few are missing).
    minute_stats_ttl_s: lifetime of the per-minute counters.
    max_batch_snippets: largest batch a producer may submit / a worker accepts.
    max_batch_bytes: largest stored batch (code, stdin and files of all its snippets).
    heartbeat_s: how often each worker host renews its lease (its dispatchers').
    lease_s: a worker host silent this long is lapsed; its dispatchers' unfinished
        snippets are released to run elsewhere (fleet-wide: workers and producers must
        agree).
    max_reruns: how often one snippet is run again after its dispatcher was lost, before
        it comes back ``infra``.
    no_worker_wait_s: a producer with no live dispatcher for this long answers ``infra``.
    failover_rewrite_s: with a Sentinel-managed primary, a dispatcher keeps the results
        it wrote during this many seconds of contact with the primary, and writes them
        again when the primary moves (what the new one lacks is written and counted
        then; what it has is left as it is).
    """

    redis_url: str = DEFAULT_URL
    prefix: str = DEFAULT_PREFIX
    queue: str = DEFAULT_QUEUE
    batch_ttl_s: int = 3600
    job_result_ttl_s: int = 60
    job_failure_ttl_s: int = 3600
    socket_timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    stats_flush_s: float = 1.0
    write_gap_s: float = 0.1
    collect_linger_s: float = 0.05
    minute_stats_ttl_s: int = 2 * 86400
    max_batch_snippets: int = 10_000
    max_batch_bytes: int = 256 << 20
    heartbeat_s: float = 1.0
    lease_s: float = 5.0
    max_reruns: int = 2
    no_worker_wait_s: float = 15.0
    failover_rewrite_s: float = 10.0

    def __post_init__(self) -> None:
        if is_sentinel_url(self.redis_url):
            parse_sentinel_url(self.redis_url)  # ConfigError now, not at the first command

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """``REDIS_URL`` and ``CODEPOOL_<FIELD>`` (upper case) override the defaults;
        keyword ``overrides`` that are not None override both."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if "REDIS_URL" in env:
            values["redis_url"] = env["REDIS_URL"]
        for field in dataclasses.fields(cls):
            name = f"CODEPOOL_{field.name.upper()}"
            if name in env:
                values[field.name] = _parse(field.name, field.type, env[name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse(name: str, kind: Any, raw: str) -> Any:
    try:
        if kind in ("int", int):
            return int(raw)
        if kind in ("float", float):
            return float(raw)
    except ValueError as exc:
        raise ConfigError(f"CODEPOOL_{name.upper()}={raw!r} is not a number") from exc
    return raw
