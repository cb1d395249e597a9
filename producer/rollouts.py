"""Reading saved rollouts: which code each JSONL line asked the interpreter to run.

A line is either ``{"id": ..., "code": "..."}`` or a chat with ``messages`` whose assistant
turns call the code tool, in the OpenAI form (``tool_calls`` with JSON ``arguments``) or
the Qwen XML form (``<tool_call><function=code_interpreter><parameter=code>...``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Argument names that carry the code in OpenAI-style tool calls.
CODE_ARGUMENTS = ("code", "source", "python", "script")
_QWEN_CALL = re.compile(
    r"<tool_call>\s*<function=(?P<name>[^>]+)>(?P<body>.*?)</function>\s*</tool_call>", re.S
)
_QWEN_PARAM = re.compile(r"<parameter=(?P<name>[^>]+)>\n?(?P<value>.*?)\n?</parameter>", re.S)


@dataclass(frozen=True)
class Call:
    """One code execution a rollout asked for."""

    id: str
    code: str


class RolloutError(ValueError):
    """Raised when a line is not valid JSON or holds no recognizable call."""


def calls_in_line(line: str, number: int) -> list[Call]:
    """The calls in one JSONL line (``number`` names lines without an ``id``)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RolloutError(f"line {number}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise RolloutError(f"line {number}: not a JSON object")
    line_id = str(record.get("id", number))
    if isinstance(record.get("code"), str):
        return [Call(line_id, record["code"])]
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise RolloutError(f"line {number}: neither a 'code' string nor a 'messages' list")
    codes = [code for message in messages for code in _codes_in_message(message)]
    return [Call(f"{line_id}:{k}", code) for k, code in enumerate(codes)]


def read_calls(path: str) -> Iterator[Call | RolloutError]:
    """Every call in a JSONL file, in order; bad lines come back as RolloutError."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield from calls_in_line(line, number)
            except RolloutError as exc:
                yield exc


def _codes_in_message(message: Any) -> list[str]:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return []
    codes = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                continue
        if isinstance(arguments, dict):
            code = next(
                (arguments[k] for k in CODE_ARGUMENTS if isinstance(arguments.get(k), str)), None
            )
            if code is not None:
                codes.append(code)
    content = message.get("content")
    if isinstance(content, str) and "<tool_call>" in content:
        for match in _QWEN_CALL.finditer(content):
            params = {m["name"].strip(): m["value"] for m in _QWEN_PARAM.finditer(match["body"])}
            code = next((params[k] for k in CODE_ARGUMENTS if k in params), None)
            if code is not None:
                codes.append(code)
    return codes
