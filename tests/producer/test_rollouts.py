"""Rollout records: each call's code and the recorded observation that answered it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from codepool.producer.rollouts import RecordedCall, RolloutError, calls_in_record


def _call(call_id: str, code: str, tool: str = "code_interpreter") -> dict[str, Any]:
    arguments = json.dumps({"code": code} if tool == "code_interpreter" else {"query": code})
    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}


def _qwen(code: str, name: str = "code_interpreter", param: str = "code") -> str:
    return (
        f"<tool_call>\n<function={name}>\n<parameter={param}>\n{code}\n</parameter>\n"
        "</function>\n</tool_call>"
    )


def _response(text: str) -> str:
    """A tool response as the Qwen chat template renders it: one newline each side."""
    return f"<tool_response>\n{text}\n</tool_response>"


def _recorded(record: dict[str, Any]) -> dict[str, str | None]:
    return {call.id: call.recorded for call in calls_in_record(record, 1)}


def test_chat_tool_messages_answer_by_tool_call_id() -> None:
    record = {
        "id": "c",
        "messages": [
            {"role": "user", "content": "?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("a", "print(1)"), _call("s", "x", tool="search")],
            },
            # Answered out of order; the search tool's answer belongs to no code call.
            {"role": "tool", "tool_call_id": "s", "content": "search results"},
            {"role": "tool", "tool_call_id": "a", "content": "1\n"},
            {"role": "tool", "tool_call_id": "a", "content": "a second answer is ignored"},
            {"role": "assistant", "content": "", "tool_calls": [_call("b", "print(2)")]},
            # Content parts are joined; an answer without an id takes the oldest waiting call.
            {"role": "tool", "content": [{"type": "text", "text": "2"}, {"text": "\n"}]},
            {"role": "assistant", "content": "", "tool_calls": [_call("c", "print(3)")]},
        ],
    }
    assert _recorded(record) == {"c:0": "1\n", "c:1": "2\n", "c:2": None}


def test_qwen_tool_responses_follow_their_calls() -> None:
    record = {
        "id": "q",
        "messages": [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": "Two at once.\n" + _qwen("a") + _qwen("b")},
            {"role": "user", "content": _response("A\n") + "\n" + _response("")},
            # A search call's response is not taken for the code call after it.
            {"role": "assistant", "content": _qwen("x", name="search", param="query")},
            {"role": "user", "content": _response("hits")},
            # Calls and responses in one assistant text (a rollout stored as one string).
            {"role": "assistant", "content": _qwen("c") + _response("C") + _qwen("d")},
        ],
    }
    assert [call.code for call in calls_in_record(record, 1)] == ["a", "b", "c", "d"]
    assert _recorded(record) == {"q:0": "A\n", "q:1": "", "q:2": "C", "q:3": None}


def test_a_new_turn_leaves_unanswered_calls_unrecorded() -> None:
    record = {
        "messages": [
            {"role": "assistant", "content": _qwen("first")},
            {"role": "assistant", "content": _qwen("second")},
            {"role": "user", "content": _response("2")},
        ]
    }
    assert _recorded(record) == {"1:0": None, "1:1": "2"}


def test_code_records_and_their_observation() -> None:
    assert calls_in_record({"id": 4, "code": "x", "observation": "7\n"}, 1) == [
        RecordedCall("4", "x", recorded="7\n")
    ]
    # A null id (a Parquet column with gaps) names the record by its number.
    assert calls_in_record({"id": None, "code": "x", "observation": None}, 9) == [
        RecordedCall("9", "x")
    ]


def test_malformed_answers_are_unreadable_not_fatal() -> None:
    record = {
        "id": "m",
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [_call("a", "1"), _call("b", "2"), _call("c", "3")],
            },
            {"role": "tool", "tool_call_id": "a", "content": {"text": "5"}},
            {"role": "tool", "tool_call_id": "b", "content": [{"type": "image_url"}]},
            {"role": "tool", "tool_call_id": "c"},
        ],
    }
    calls = calls_in_record(record, 1)
    assert [call.recorded for call in calls] == [None, None, None]
    assert [call.unreadable for call in calls] == [
        "the answering message's content is dict, not text",
        "the answering message's content holds a part that is not text",
        "the answering message has no content",
    ]
    bad_field = calls_in_record({"code": "x", "observation": 5}, 1)[0]
    assert bad_field.recorded is None and bad_field.unreadable == "'observation' is int, not text"
    with pytest.raises(RolloutError, match="row 3: neither"):
        calls_in_record({"text": "x"}, 3, unit="row")
