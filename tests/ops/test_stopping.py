"""``codepool serve`` and ``codepool replay`` on the embedded default end, whatever is
queued: a SIGTERM drains for at most the drain deadline and every process below the
command (its Redis, its worker, the worker's dispatchers, supervisor, zygotes and
snippets) is gone soon after, with its files; a SIGKILL takes every one of them down
within seconds, and the next embedded pool sweeps the files it left. Real processes
throughout; the tree is recorded before the signal, since once its root dies it is
reparented."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from codepool.common.socket_dirs import socket_bases
from codepool.ops.embedded import HOME_PREFIX, sweep_leftovers
from codepool.worker.host import HOST_DIR_PREFIX
from tests.conftest import wait_until
from tests.ops.test_serve import Serve, health, start_serve
from tests.processes import processes, still_running, tree

BACKLOG = 20  # requests of `while True: pass`, 10 s each, on 2 slots: 100 s of work
MARGIN_S = 10.0  # beyond the drain deadline, for a loaded machine
# The deadline serve and replay are given here: the default (10 s) works alike, only
# later; a shorter one also shows the flag is obeyed.
DRAIN_S = 3.0
KILLED_WITHIN_S = 15.0  # "within seconds" of a SIGKILL, generously


def busy(server: Serve) -> requests.Response | Exception:
    body = {"code": "while True: pass", "language": "python", "run_timeout": 10}
    try:
        return requests.post(f"{server.url}/run_code", json=body, timeout=300)
    except requests.RequestException as exc:
        return exc


@contextmanager
def serve_with_a_backlog(tmp_path: Path) -> Iterator[tuple[Serve, list[Future[object]]]]:
    server = start_serve(tmp_path / "serve.log", "-c", "2", "--drain-timeout", str(DRAIN_S))
    snapshot = tree(server.process.pid)
    try:
        with ThreadPoolExecutor(BACKLOG) as threads:
            calls: list[Future[object]] = [threads.submit(busy, server) for _ in range(BACKLOG)]
            wait_until(
                lambda: health(server, {})["in_flight"] == BACKLOG,
                timeout_s=60,
                what="the whole backlog waiting on the pool",
            )
            yield server, calls
    finally:
        snapshot.update(tree(server.process.pid))
        clean_up(snapshot, server.process)


def clean_up(snapshot: dict[int, int], process: subprocess.Popen[Any]) -> None:
    """Whatever a failed test left: processes, and the dirs they made."""
    for pid in still_running(snapshot):
        os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)
    for path in dirs_of(snapshot):
        shutil.rmtree(path, ignore_errors=True)


def dirs_of(snapshot: dict[int, int]) -> list[str]:
    """The temp dirs the processes of ``snapshot`` made: their embedded pool's, their
    worker host's (named by the pid that made them)."""
    found = []
    for base in socket_bases():
        for entry in os.scandir(base):
            for prefix in (HOME_PREFIX, HOST_DIR_PREFIX):
                if entry.name.startswith(prefix):
                    owner = entry.name[len(prefix) :].split("-", 1)[0].split(".")[0]
                    if owner.isdigit() and int(owner) in snapshot:
                        found.append(entry.path)
    return found


def assert_swept(snapshot: dict[int, int], command_pid: int) -> None:
    """A command killed with SIGKILL left its embedded pool's dir; the next pool's sweep
    removes it (and only dirs whose command is gone)."""
    left = [path for path in dirs_of({command_pid: 0}) if HOME_PREFIX in path]
    assert len(left) == 1, left
    assert sweep_leftovers() >= 1
    assert not os.path.exists(left[0])


def names(pids: list[int]) -> list[str]:
    return [p.cmdline[:100] for p in processes() if p.pid in pids]


def assert_all_gone(snapshot: dict[int, int], by: float, what: str) -> None:
    wait_until(
        lambda: not still_running(snapshot),
        timeout_s=max(0.1, by - time.monotonic()),
        what=f"{what}: {names(still_running(snapshot))}",
    )


def test_serve_sigterm_with_a_backlog_answers_everyone_and_ends(tmp_path: Path) -> None:
    with serve_with_a_backlog(tmp_path) as (server, calls):
        snapshot = tree(server.process.pid)
        roles = " ".join(names(list(snapshot)))
        assert "redis-server" in roles or "valkey-server" in roles, roles
        assert "codepool.worker.dispatcher" in roles and "engine.supervisor" in roles, roles
        by = time.monotonic() + DRAIN_S + MARGIN_S
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=by - time.monotonic()) == 0, server.log()
        assert_all_gone(snapshot, by, "left after serve's drain deadline")
        assert [p for p in dirs_of({server.process.pid: 0}) if HOME_PREFIX in p] == []
        # Every request got an answer: a result, or a 503 saying to retry; none was
        # dropped on the floor, none was a 500.
        answers = [call.result(timeout=30) for call in calls]
    statuses = sorted(
        a.status_code if isinstance(a, requests.Response) else type(a).__name__ for a in answers
    )
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(503) >= BACKLOG - 4, statuses  # 2 slots: few if any ran
    for answer in answers:
        assert isinstance(answer, requests.Response)
        if answer.status_code == 503:
            assert "retry" in answer.json()["detail"]
    assert "Exception in ASGI application" not in server.log()


def test_serve_sigkill_with_a_backlog_takes_its_whole_tree_along(tmp_path: Path) -> None:
    with serve_with_a_backlog(tmp_path) as (server, _):
        snapshot = tree(server.process.pid)
        assert len(snapshot) > 5, names(list(snapshot))  # Redis, worker, its processes
        by = time.monotonic() + KILLED_WITHIN_S
        server.process.kill()
        server.process.wait()
        assert_all_gone(snapshot, by, f"left {KILLED_WITHIN_S} s after serve's SIGKILL")
        assert_swept(snapshot, server.process.pid)


def replay_backlog(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with open(source, "w") as f:
        for i in range(BACKLOG):
            code = f"print({i})" if i < 2 else "while True: pass"
            f.write(json.dumps({"id": str(i), "code": code}) + "\n")
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    log = tmp_path / "replay.log"
    command = [sys.executable, "-m", "codepool.ops.cli", "replay", str(source)]
    drain = ["--drain-timeout", str(DRAIN_S)]
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*command, "-o", str(output), "--timeout", "10", "-c", "2", *drain],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=environ,
        )
    return process, output, log


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_replay_stopped_with_a_backlog_ends_its_tree(tmp_path: Path, how: str) -> None:
    process, output, log = replay_backlog(tmp_path)
    snapshot: dict[int, int] = {}
    try:
        # Two results are written: the pool runs, the rest waits on 2 slots. (Which two
        # is the executor's order: a `while True` may take a slot before `print(1)`.)
        wait_until(lambda: len(lines(output)) >= 2, timeout_s=60, what="the first results")
        snapshot = tree(process.pid)
        assert len(snapshot) > 5, names(list(snapshot))
        if how == "sigterm":
            by = time.monotonic() + DRAIN_S + MARGIN_S
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=by - time.monotonic())
            assert code == 128 + signal.SIGTERM, log.read_text()
            assert "stopped by SIGTERM" in log.read_text() and "resume" in log.read_text()
            assert [p for p in dirs_of({process.pid: 0}) if HOME_PREFIX in p] == []
        else:
            by = time.monotonic() + KILLED_WITHIN_S
            process.kill()
            process.wait()
        assert_all_gone(snapshot, by, f"left after replay's {how}")
        if how == "sigkill":
            assert_swept(snapshot, process.pid)
        # What was written is whole lines, once each: a rerun resumes from them.
        ids = [json.loads(line)["id"] for line in lines(output)]
        assert len(ids) == len(set(ids)) >= 2, (lines(output), log.read_text())
        assert set(ids) <= {str(i) for i in range(BACKLOG)}
    finally:
        snapshot.update(tree(process.pid))
        clean_up(snapshot, process)


def test_replay_run_in_process_leaves_the_callers_signal_handlers(tmp_path: Path) -> None:
    """Handlers are process-wide, and SIG_IGN is inherited across exec: a replay run in
    a trainer's (or pytest's) process must hand them back as it found them."""
    from codepool.ops.cli import build_parser

    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)
    before = {signum: signal.getsignal(signum) for signum in stops}
    args = build_parser().parse_args(["replay", str(tmp_path / "none.jsonl"), "-o", "out"])
    assert args.handler(args) == 2  # no such input: refused before anything starts
    assert {signum: signal.getsignal(signum) for signum in stops} == before
