"""The chaos run's checker (ops/bench/chaos.py), in Jepsen's spirit: it judges the recorded
history (ops/bench/chaos_history.py) against the fault log and what Redis holds at the end.

What it checks (docs/chaos.md has the fault model in prose):

- every operation of a producer that was never killed has exactly one outcome: one
  result, or the caller's own giving up (``abandon``); none twice;
- every ``ok`` result's stdout is what the snippet must print; a snippet of ours never
  errs, times out or is rejected, and it is ``cancelled`` only where its caller gave up;
- ``infra`` (and a call that raised) only where the fault model allows it: the call was in
  flight while more worker losses happened than its re-runs cover (``max_reruns`` + 1);
- a batch snippet the trainer saw as ``infra`` holds no other result in Redis (a result
  written after the trainer gave up is counted but was never seen);
- the counters (``codepool:stats``) equal the results hashes, status by status;
- no key without a TTL but the fleet's own records, and none with a TTL longer than the
  longest one codepool sets;
- no process of the fleet is left once the fleet has stopped.
"""

from __future__ import annotations

import fnmatch
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from codepool.common.codec import decode_result
from codepool.common.errors import WireError
from codepool.common.result import CANCELLED, STATUSES
from codepool.common.settings import Settings

# Faults that lose what a worker host (or part of it) was running.
WORKER_LOSSES = frozenset(
    {
        "host_kill",
        "host_same_name",
        "host_stop",
        "dispatcher_kill",
        "supervisor_kill",
        "zygote_kill",
        "link_cut",
    }
)
# A fault counts against a call from this long before it started (a lease that was
# already lapsing) to its end.
FAULT_REACH_S = 6.0
# Where a call's caller may be refused outright (no live host to open a context on) if a
# fault ended this shortly before.
REFUSAL_REACH_S = 10.0
# Keys codepool and RQ keep for good (the fleet's records and counters), under the
# prefix / under ``rq:``; every other key must expire.
LASTING = (
    "{p}stats",
    "{p}stats:worker:*",
    "{p}stats:run:*",
    "{p}hosts",
    "{p}leases",
    "{p}fenced",
    "{p}host_slots",
    "{p}fleet",
    "{p}workers",
    "{p}producers",
    "{p}open",
    "{p}calls",
    "rq:queues",
    "rq:queue:*",
    "rq:workers",
    "rq:workers:*",
    "rq:finished:*",
    "rq:failed:*",
    "rq:deferred:*",
    "rq:scheduled:*",
    "rq:canceled:*",
    "rq:wip:*",
)


# A worker host's record of its latest lease (Keys.host_start) lives a week.
HOST_START_TTL_S = 7 * 86400


@dataclass
class Report:
    """What the checker found: figures to print and every violation."""

    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def violate(self, what: str) -> None:
        self.violations.append(what)


@dataclass
class Operation:
    id: str
    producer: str
    kind: str
    expect: str
    may_cancel: bool
    start_t: float
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    abandoned: bool = False
    batch: str = ""  # a batch snippet's batch id and index: where Redis holds its result
    index: int = -1

    @property
    def end_t(self) -> float:
        return max([float(o["t"]) for o in self.outcomes], default=self.start_t)


def operations(events: Iterable[dict[str, Any]]) -> dict[str, Operation]:
    ops: dict[str, Operation] = {}
    for event in events:
        kind = event["op"]
        if kind == "invoke":
            ops[event["id"]] = Operation(
                event["id"],
                event["producer"],
                event["kind"],
                event["expect"],
                bool(event.get("may_cancel")),
                float(event["t"]),
                batch=str(event.get("batch", "")),
                index=int(event.get("index", -1)),
            )
        elif event["id"] in ops:
            if kind == "complete":
                ops[event["id"]].outcomes.append(event)
            elif kind == "abandon":
                ops[event["id"]].abandoned = True
    return ops


def _overlapping(op: Operation, faults: list[dict[str, Any]], reach_s: float) -> list[str]:
    return [f["kind"] for f in faults if op.start_t - reach_s <= float(f["t"]) <= op.end_t + 0.5]


def check_history(
    events: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    killed_producers: set[str],
    settings: Settings,
    report: Report,
) -> dict[str, Operation]:
    """Every operation accounted for once, with the right output, ``infra`` only where a
    fault allows it."""
    ops = operations(events)
    statuses: Counter[str] = Counter()
    infra_by_fault: Counter[str] = Counter()
    latencies: defaultdict[str, list[float]] = defaultdict(list)
    allowed_infra = 0
    for op in ops.values():
        if len(op.outcomes) > 1:
            report.violate(f"duplicate: {op.id} ({op.kind}) had {len(op.outcomes)} results")
        if not op.outcomes:
            if not op.abandoned and op.producer not in killed_producers:
                report.violate(f"lost: {op.id} ({op.kind}) never had a result")
            continue
        outcome = op.outcomes[0]
        status = str(outcome["status"])
        statuses[f"{op.kind}:{status}"] += 1
        if "latency" in outcome:
            latencies[op.kind].append(float(outcome["latency"]))
        near = _overlapping(op, faults, FAULT_REACH_S)
        losses = sum(kind in WORKER_LOSSES for kind in near)
        if status == "ok":
            if outcome["stdout"] != op.expect:
                report.violate(
                    f"wrong: {op.id} ({op.kind}) printed {outcome['stdout']!r}, "
                    f"must print {op.expect!r}"
                )
        elif status == CANCELLED and op.may_cancel:
            pass
        elif op.kind in ("ctx_open", "ctx_fork"):
            if not _overlapping(op, faults, REFUSAL_REACH_S):
                report.violate(f"refused: {op.id} ({op.kind}) with no fault near: {outcome}")
        elif status in ("infra", "raised", "http503", "http504"):
            for kind in set(near):
                infra_by_fault[kind] += 1
            if losses > settings.max_reruns:
                allowed_infra += 1
            else:
                report.violate(
                    f"{status}: {op.id} ({op.kind}) with {losses} worker losses in flight "
                    f"(faults near: {sorted(set(near)) or 'none'}): {outcome.get('message', '')}"
                )
        else:
            report.violate(f"wrong status: {op.id} ({op.kind}) is {status}: {outcome}")
    report.figures["operations"] = len(ops)
    report.figures["statuses"] = dict(sorted(statuses.items()))
    report.figures["infra allowed by the fault model"] = allowed_infra
    report.figures["infra or raised, by fault kind in flight"] = dict(infra_by_fault)
    report.figures["latency s (p50 / p99 / max)"] = {
        kind: _spread(values) for kind, values in sorted(latencies.items())
    }
    return ops


def _spread(values: list[float]) -> str:
    values = sorted(values)
    if not values:
        return "-"
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"{statistics.median(values):.3f} / {p99:.3f} / {values[-1]:.3f}"


def fault_costs(ops: dict[str, Operation], faults: list[dict[str, Any]]) -> list[list[str]]:
    """Per fault kind: how often, the calls in flight at it (or started while it held:
    a freeze, a restart), their latency and how many of them were not ``ok`` or
    ``cancelled``: the measured cost of that fault."""
    by_kind: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for fault in faults:
        by_kind[fault["kind"]].append(fault)
    ended = sorted((op for op in ops.values() if op.outcomes), key=lambda op: op.start_t)
    rows = []
    for kind, chosen in sorted(by_kind.items()):
        hit: dict[str, Operation] = {}
        for fault in chosen:
            t = float(fault["t"])
            held_until = t + float(fault.get("took_s", 0.0)) + float(fault.get("hold_s", 0.0))
            for op in ended:
                if op.start_t > held_until:
                    break
                if op.end_t >= t:
                    hit[op.id] = op
        latency = [
            float(op.outcomes[0].get("latency", op.end_t - op.start_t)) for op in hit.values()
        ]
        bad = sum(op.outcomes[0]["status"] not in ("ok", CANCELLED) for op in hit.values())
        rows.append([kind, str(len(chosen)), str(len(hit)), _spread(latency), str(bad)])
    return rows


def check_redis(
    conn: redis.Redis,
    settings: Settings,
    ops: dict[str, Operation],
    report: Report,
    *,
    unrecorded: int = 0,
) -> None:
    """Counters against the results: the results hashes (batches) plus the lone calls
    answered on the open work channel, which leave no result in Redis (each is matched
    by its unique stdout when it rode a batch instead); what the trainer saw against what
    the hashes hold. ``unrecorded``: calls made outside the history (client_disconnect)."""
    tally, stored, printed = _read_results(conn, settings, report)
    stats: dict[bytes, bytes] = conn.hgetall(settings.keys.stats())  # type: ignore[assignment]
    counters = {k.decode(): int(v) for k, v in stats.items()}
    results = sum(n for status, n in tally.items() if status != CANCELLED)
    report.figures["results in Redis"] = dict(tally)
    lone = [op for op in ops.values() if op.kind in ("lone", "http")]
    # An ``infra`` a caller saw may be its producer's own (never counted), or a host's.
    counted_statuses = tuple(status for status in (*STATUSES, CANCELLED) if status != "infra")
    channel: Counter[str] = Counter(
        str(op.outcomes[0]["status"])
        for op in lone
        if op.outcomes
        and op.outcomes[0]["status"] in counted_statuses
        and not (op.outcomes[0]["status"] == "ok" and op.expect in printed)
    )
    # Calls whose caller left (gave up, was killed) may have been counted either way.
    slack = unrecorded + sum(
        not op.outcomes or op.outcomes[0]["status"] not in counted_statuses for op in lone
    )
    extra = counters.get("calls", 0) + counters.get(CANCELLED, 0) - sum(tally.values())
    seen = sum(channel.values())
    report.figures["lone calls counted on the channel"] = (
        f"{extra} for {seen} seen and {slack} given up or unrecorded"
    )
    if not seen <= extra <= seen + slack:
        report.violate(
            f"lone counters: {extra} lone calls counted on the channel for {seen} results seen "
            f"and {slack} calls given up or unrecorded (calls {counters.get('calls', 0)}, "
            f"{results} results in batches)"
        )
    for status in (*STATUSES, CANCELLED):
        counted = counters.get(status, 0) - tally.get(status, 0)
        if counted < channel.get(status, 0):
            report.violate(
                f"lone counters: {status} {counters.get(status, 0)} < {tally.get(status, 0)} in "
                f"batches + {channel.get(status, 0)} lone calls seen"
            )
    for op in ops.values():
        held = stored.get((op.batch, op.index))
        if not op.outcomes and op.batch:
            report.figures.setdefault("lost, as Redis holds them", []).append(
                f"{op.id}: {held or _claims(conn, settings, op)}"
            )
        elif op.outcomes and op.outcomes[0]["status"] == "infra":
            if held not in (None, "infra", CANCELLED):
                report.violate(
                    f"unseen: {op.id} came back infra but its batch holds a counted {held} result"
                )


def _read_results(
    conn: redis.Redis, settings: Settings, report: Report
) -> tuple[Counter[str], dict[tuple[str, int], str], set[str]]:
    """Every results hash: statuses tallied, (batch, index) -> status, ok stdouts."""
    keys = settings.keys
    tally: Counter[str] = Counter()
    stored: dict[tuple[str, int], str] = {}
    printed: set[str] = set()
    names = list(conn.scan_iter(match=keys.batch_results("*"), count=1000))
    for start in range(0, len(names), 200):
        chunk = names[start : start + 200]
        with conn.pipeline(transaction=False) as pipe:
            for name in chunk:
                pipe.hgetall(name)
            hashes = pipe.execute()
        for name, fields in zip(chunk, hashes, strict=True):
            batch_id = name.decode()[len(keys.prefix) + len("batch:") : -len(":results")]
            for index, blob in fields.items():
                try:
                    result = decode_result(blob)
                except WireError:
                    report.violate(f"undecodable result: {name.decode()} [{index.decode()}]")
                    continue
                tally[result.status] += 1
                stored[(batch_id, int(index))] = result.status
                if result.status == "ok":
                    printed.add(result.stdout)
    return tally, stored, printed


def _claims(conn: redis.Redis, settings: Settings, op: Operation) -> str:
    """What a batch's state says of a snippet with no result: who claims it, or where
    the batch's claiming stands."""
    state: dict[bytes, bytes] = conn.hgetall(settings.keys.batch_state(op.batch))  # type: ignore[assignment]
    if not state:
        return "no result, no batch state"
    holders = [
        f"{name.decode()}={value.decode()[:80]}"
        for name, value in state.items()
        if name.startswith(b"c:") and _holds(value.decode().rsplit("|", 1)[-1], op.index)
    ]
    fields = {
        k.decode(): v.decode()[:40] for k, v in state.items() if k in (b"next", b"n", b"retry")
    }
    return f"no result; claims {holders or 'none'}; {fields}"


def _lasting(name: str, prefix: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern.format(p=prefix)) for pattern in LASTING)


def _holds(claim: str, index: int) -> bool:
    """Whether a claim's indices (``a-b`` or ``i,j,...``) hold ``index``."""
    if "-" in claim:
        first, last = claim.split("-", 1)
        return int(first) <= index <= int(last)
    return str(index) in claim.split(",")


def check_keys(conn: redis.Redis, settings: Settings, report: Report) -> None:
    """No key outlives its TTL: each has one (but the fleet's records), none over the
    longest codepool sets."""
    longest_s = max(
        settings.batch_ttl_s,
        settings.job_failure_ttl_s,
        settings.minute_stats_ttl_s,
        HOST_START_TTL_S,
    )
    unexpiring: Counter[str] = Counter()
    examples: dict[str, str] = {}
    too_long: Counter[str] = Counter()
    total = 0
    names = [n.decode() for n in conn.scan_iter(count=1000)]
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        with conn.pipeline(transaction=False) as pipe:
            for name in chunk:
                pipe.ttl(name)
            ttls = pipe.execute()
        for name, ttl in zip(chunk, ttls, strict=True):
            total += 1
            shape = _shape(name)
            if ttl == -1 and not _lasting(name, settings.keys.prefix):
                unexpiring[shape] += 1
                examples.setdefault(shape, name)
            elif ttl > longest_s:
                too_long[shape] += 1
    report.figures["keys at the end"] = total
    report.figures["lone calls left queued at the end"] = conn.llen(settings.keys.calls())
    for shape, count in sorted(unexpiring.items()):
        report.violate(f"no TTL: {count} key(s) like {shape} (e.g. {examples[shape]})")
    for shape, count in sorted(too_long.items()):
        report.violate(f"TTL over {longest_s} s: {count} key(s) like {shape}")


def _shape(name: str) -> str:
    """A key's name with its ids starred, to group keys of one kind."""
    parts = name.split(":")
    fixed = {"codepool", "rq", "batch", "host", "owner", "stats", "worker", "run", "minute"}
    fixed |= {"results", "done", "state", "retry", "owners", "requests", "batches", "job"}
    fixed |= {"ctx", "reply", "cancel", "wip", "queue", "workers", "producer"}
    fixed |= {"inbox", "calls", "start"}
    return ":".join(p if p in fixed else "*" for p in parts)


def check_processes(tracked: dict[int, str], report: Report) -> None:
    """Every process ever seen in the fleet's trees (pid -> its start time in
    /proc/pid/stat) is gone once the fleet has stopped."""
    left = []
    for pid, started in sorted(tracked.items()):
        now = process_start(pid)
        if now is not None and now == started:
            left.append(f"{pid} ({_cmdline(pid)[:80]})")
    report.figures["fleet processes seen"] = len(tracked)
    if left:
        report.violate(f"left running: {len(left)} process(es): {', '.join(left[:10])}")


def process_start(pid: int) -> str | None:
    """``pid``'s start time (clock ticks since boot), None once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
