"""The chaos run's checker (ops/bench/chaos_check.py) finds each kind of violation in a
made-up history, and passes one that is sound; its Redis checks run on a real server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import redis

from codepool.common.codec import encode_result
from codepool.common.result import ExecResult
from codepool.common.settings import Settings
from codepool.ops.bench.chaos_check import (
    Report,
    check_history,
    check_keys,
    check_processes,
    check_redis,
    process_start,
)
from codepool.ops.bench.chaos_history import Recorder, read_history

SETTINGS = Settings()


def result(status: str = "ok", stdout: str = "6\n") -> ExecResult:
    return ExecResult(status == "ok", stdout, "", 0, False, 0.01, status=status)


def history(tmp_path: Path, calls: list[tuple[str, str, list[ExecResult]]]) -> list[dict[str, Any]]:
    """A history of one producer: per call its id, kind and the results it got."""
    recorder = Recorder(tmp_path / "p.jsonl", "p")
    for op_id, kind, results in calls:
        recorder.invoke(op_id, kind, "6\n", batch="b", index=int(op_id[1:]))
        for got in results:
            recorder.complete(op_id, got)
    recorder.close()
    return read_history(tmp_path)


def fault(t: float, kind: str) -> dict[str, Any]:
    return {"t": t, "kind": kind, "at_s": 0.0, "target": 0, "detail": ""}


def test_a_sound_history_passes(tmp_path: Path) -> None:
    events = history(tmp_path, [("c0", "batch", [result()]), ("c1", "lone", [result()])])
    report = Report()
    check_history(events, [], set(), SETTINGS, report)
    assert report.violations == []
    assert report.figures["statuses"] == {"batch:ok": 1, "lone:ok": 1}


def test_lost_doubled_wrong_and_unexplained_infra_are_each_found(tmp_path: Path) -> None:
    events = history(
        tmp_path,
        [
            ("c0", "batch", []),
            ("c1", "batch", [result(), result()]),
            ("c2", "lone", [result(stdout="7\n")]),
            ("c3", "ctx", [result("infra")]),
            ("c4", "http", [result("timeout")]),
        ],
    )
    report = Report()
    check_history(events, [], set(), SETTINGS, report)
    found = sorted(v.split(":")[0] for v in report.violations)
    assert found == ["duplicate", "infra", "lost", "wrong", "wrong status"], report.violations


def test_infra_is_allowed_past_the_reruns_and_a_killed_producer_owes_nothing(
    tmp_path: Path,
) -> None:
    events = history(tmp_path, [("c0", "batch", []), ("c1", "batch", [result("infra")])])
    t = float(events[0]["t"])
    losses = [fault(t, "host_kill") for _ in range(SETTINGS.max_reruns + 1)]
    report = Report()
    check_history(events, losses, {"p"}, SETTINGS, report)
    assert report.violations == []
    assert report.figures["infra allowed by the fault model"] == 1
    report = Report()
    check_history(events, losses[:-1], set(), SETTINGS, report)
    assert sorted(v.split(":")[0] for v in report.violations) == ["infra", "lost"]


def test_counters_unseen_results_and_keys_are_checked_in_redis(
    redis_url: str, tmp_path: Path
) -> None:
    conn = redis.Redis.from_url(redis_url)
    keys = SETTINGS.keys
    conn.hset(
        keys.batch_results("b"),
        mapping={"0": encode_result(result()), "1": encode_result(result())},
    )
    conn.expire(keys.batch_results("b"), 60)
    conn.hset(keys.stats(), mapping={"calls": 2, "ok": 2})
    events = history(tmp_path, [("c0", "batch", [result()]), ("c1", "batch", [result("infra")])])
    ops = check_history(events, [], set(), SETTINGS, Report())
    report = Report()
    check_redis(conn, SETTINGS, ops, report)
    check_keys(conn, SETTINGS, report)
    assert report.violations == [
        "unseen: c1 came back infra but its batch holds a counted ok result"
    ]
    conn.hincrby(keys.stats(), "calls", 1)  # counted once too often
    conn.set("rq:job:abc", "x")  # a job hash that never expires
    conn.set(keys.batch_done("b"), "x", ex=SETTINGS.batch_ttl_s * 1000)
    report = Report()
    check_redis(conn, SETTINGS, ops, report)
    check_keys(conn, SETTINGS, report)
    found = sorted(v.split(":")[0] for v in report.violations)
    assert found == ["TTL over 604800 s", "lone counters", "no TTL", "unseen"], report.violations
    conn.close()


def test_a_process_left_running_is_found() -> None:
    report = Report()
    mine = process_start(os.getpid())
    assert mine is not None
    check_processes({os.getpid(): mine, 2**22 + 1: "1"}, report)
    assert len(report.violations) == 1 and str(os.getpid()) in report.violations[0]
