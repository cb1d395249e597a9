"""`codepool replay --compare`, error types and Parquet input, against real workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from codepool.common.errors import InputError
from codepool.common.observation import truncation_marker
from codepool.ops.replay_command import summary_table
from codepool.ops.report import write_report
from codepool.producer import CodePool
from codepool.producer.replay import replay
from codepool.producer.rollout_files import COLUMNS, read_calls
from codepool.producer.rollouts import RecordedCall
from tests.conftest import StartWorker

# 5001 characters of output: the default 4096 are kept behind the truncation marker.
LONG_CODE = "print('x' * 5000)"
LONG_TAIL = "x" * 4095 + "\n"


def _tool_call(call_id: str, code: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "code_interpreter", "arguments": json.dumps({"code": code})},
    }


def _qwen_call(code: str) -> str:
    return (
        "<tool_call>\n<function=code_interpreter>\n<parameter=code>\n"
        f"{code}\n</parameter>\n</function>\n</tool_call>"
    )


CHAT = {
    "id": "chat",
    "messages": [
        {"role": "user", "content": "?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_tool_call("a", "print(2 + 3)"), _tool_call("b", "print(8)")],
        },
        {"role": "tool", "tool_call_id": "b", "content": "7\n"},  # changed
        {"role": "tool", "tool_call_id": "a", "content": "5\n"},  # same
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("c", "print(9)")]},
        {"role": "tool", "tool_call_id": "c", "content": "9"},  # stripped: changed
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("d", "print(10)")]},
    ],
}
QWEN = {
    "id": "qwen",
    "messages": [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": _qwen_call("print(pow(17, 23, 1000))")},
        {"role": "user", "content": "<tool_response>\n713\n\n</tool_response>"},  # same
        {"role": "assistant", "content": _qwen_call("print(6 * 7)")},
        {"role": "user", "content": "<tool_response>\n41\n\n</tool_response>"},  # changed
    ],
}
RECORDS: list[dict[str, Any]] = [
    CHAT,
    QWEN,
    # Cut by another count (another sandbox counted bytes, or the output varied): same.
    {"id": "long-same", "code": LONG_CODE, "observation": truncation_marker(12) + LONG_TAIL},
    # The same count but another tail: changed.
    {"id": "long-diff", "code": LONG_CODE, "observation": truncation_marker(905) + "y" * 4096},
    {"id": "plain", "code": "print(1)"},
    {"id": "zero", "code": "print(1 / 0)"},
    {"id": "name", "code": "print(undefined_name)"},
    {"id": "module", "code": "import no_such_module_here"},
    {"id": "syntax", "code": "x = ("},
    {"id": "exit", "code": "import sys\nsys.exit(3)"},
]
# An answer that is not text: counted as not recorded, and said so.
BAD_ANSWER = {
    "id": "bad-answer",
    "messages": [
        {"role": "assistant", "content": "", "tool_calls": [_tool_call("e", "print(11)")]},
        {"role": "tool", "tool_call_id": "e", "content": {"text": "11"}},
    ],
}
SAME = {"chat:0", "qwen:0", "long-same"}
CHANGED = {"chat:1", "chat:2", "qwen:1", "long-diff"}


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _read(path: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_compare_marks_same_changed_and_not_recorded(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker()
    source, out, report = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "r.html"
    _write_jsonl(source, [*RECORDS, BAD_ANSWER])
    summary = replay(CodePool(redis_url), str(source), str(out), timeout_s=5.0, compare=True)
    records = _read(out)
    assert len(records) == 15 == summary.ran
    matches = {call_id: record["match"] for call_id, record in records.items()}
    assert {k for k, v in matches.items() if v is True} == SAME
    assert {k for k, v in matches.items() if v is False} == CHANGED
    assert all(records[k]["recorded"] is None for k, v in matches.items() if v is None)
    assert records["long-same"]["observation"] == truncation_marker(905) + LONG_TAIL
    assert records["qwen:1"]["recorded"] == "41\n" and records["qwen:1"]["observation"] == "42\n"

    comparison = summary.comparison
    assert comparison is not None
    assert (comparison.same, comparison.changed, comparison.not_recorded) == (3, 4, 8)
    assert comparison.whitespace_only == 1  # chat:2, "9" against "9\n"
    assert comparison.unreadable == [
        "bad-answer:0: the answering message's content is dict, not text"
    ]
    table = summary_table(summary)
    assert (
        "compared   7 recorded: 3 same, 4 changed (1 only in leading/trailing whitespace); "
        "8 not recorded (1 unreadable)" in table
    )

    # Error types: parsed from real tracebacks, one row each in the summary.
    assert records["zero"]["error_type"] == "ZeroDivisionError"
    assert records["plain"]["error_type"] is None
    assert summary.error_types == {
        "ZeroDivisionError": 1,
        "NameError": 1,
        "ModuleNotFoundError": 1,
        "SyntaxError": 1,
        "exit 3": 1,
    }
    assert re.search(r"^ModuleNotFoundError +1$", table, re.M)

    # The report lists the changed ones, each with a side-by-side diff, and no others.
    write_report(str(out), str(report))
    page = report.read_text()
    headings = re.findall(r"<h3>([^<(]+?)(?: \(only [^)]*\))?</h3>", page)
    assert set(headings) == CHANGED and len(headings) == len(CHANGED)
    assert page.count('<table class="diff"') == len(CHANGED)
    qwen_section = page.split("<h3>qwen:1</h3>")[1].split("<h3>")[0]
    assert ">41<" in qwen_section and ">42<" in qwen_section
    assert "<h3>chat:2 (only leading/trailing whitespace differs)</h3>" in page
    assert "3 same, 4 changed" in page
    assert "<td>ModuleNotFoundError</td>" in page and "Error types" in page


def test_without_compare_lines_have_no_comparison(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker()
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_jsonl(source, [QWEN])
    summary = replay(CodePool(redis_url), str(source), str(out), timeout_s=5.0)
    assert summary.comparison is None and "compared" not in summary_table(summary)
    assert all("match" not in record for record in _read(out).values())


TIMINGS = ("latency_s", "exec_s", "queue_s")


def test_parquet_input_gives_the_jsonl_output(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra) is not installed")
    pq = pytest.importorskip("pyarrow.parquet")
    start_worker()
    jsonl, parquet = tmp_path / "in.jsonl", tmp_path / "in.parquet"
    _write_jsonl(jsonl, RECORDS)
    rows = [{name: record.get(name) for name in COLUMNS} for record in RECORDS]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.append_column("reward", pa.array([0.5] * len(rows))), parquet)
    pool = CodePool(redis_url)
    outputs = []
    for source in (jsonl, parquet):
        out = tmp_path / f"{source.name}.out.jsonl"
        summary = replay(pool, str(source), str(out), timeout_s=5.0, compare=True)
        assert summary.bad_lines == []
        outputs.append(
            {k: {f: v for f, v in r.items() if f not in TIMINGS} for k, r in _read(out).items()}
        )
    assert outputs[0] == outputs[1] and len(outputs[0]) == 14


def test_bad_parquet_files_give_clear_errors(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra) is not installed")
    pq = pytest.importorskip("pyarrow.parquet")
    columns = tmp_path / "columns.parquet"
    pq.write_table(pa.table({"prompt": ["a"], "answer": ["b"]}), columns)
    with pytest.raises(
        InputError, match=r"no 'code' or 'messages' column \(columns: prompt, answer"
    ):
        list(read_calls(str(columns)))
    typed = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"code": [1, 2]}), typed)
    with pytest.raises(InputError, match="column 'code' is int64, not a string"):
        list(read_calls(str(typed)))
    not_parquet = tmp_path / "rollouts.parquet"
    not_parquet.write_text('{"code": "print(1)"}\n')
    with pytest.raises(InputError, match="not a readable Parquet file"):
        list(read_calls(str(not_parquet)))
    # Rows without a call are skipped and counted, as bad JSONL lines are.
    sparse = tmp_path / "sparse.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "code": ["print(1)", None]}), sparse)
    items = list(read_calls(str(sparse)))
    assert items[0] == RecordedCall("a", "print(1)") and len(items) == 2
    assert str(items[1]) == "row 2: neither a 'code' string nor a 'messages' list"


def test_parquet_without_pyarrow_says_which_extra(tmp_path: Path) -> None:
    source = tmp_path / "rollouts.parquet"
    source.write_bytes(b"PAR1")  # never opened: pyarrow is missing
    # A None entry in sys.modules makes `import pyarrow` fail as if it were not installed.
    script = (
        "import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None\n"
        "from codepool.ops.cli import main\n"
        f"sys.exit(main(['replay', {str(source)!r}, '-o', {str(tmp_path / 'out.jsonl')!r}]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "codepool replay: reading Parquet needs pyarrow: pip install 'codepool[parquet]'"
    ]
    assert not (tmp_path / "out.jsonl").exists()
