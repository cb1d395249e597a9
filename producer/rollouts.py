"""Reading saved rollouts: which code each record asked the interpreter to run, and the
observation the policy was shown in answer (the recorded one), where the record holds it.

A record (a JSONL line, a Parquet row) is either ``{"id": ..., "code": "..."}`` with an
optional ``"observation"`` string (and optional inputs: ``"stdin"`` text, ``"files"``
mapping paths to text, ``"fetch_files"``), or a chat with ``messages`` whose assistant turns call
the code tool:

- OpenAI form: ``tool_calls`` with JSON ``arguments``; the answer is the ``tool`` message
  whose ``tool_call_id`` names the call (a ``tool`` message without one answers the
  oldest call of the turn still waiting).
- Qwen XML form: ``<tool_call><function=code_interpreter><parameter=code>...``; the answer
  is the ``<tool_response>`` that follows it (in a later message or the same content),
  without the one newline on each side the chat template adds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from codepool.common.errors import ConfigError
from codepool.common.snippet import Snippet

# Argument names that carry the code in OpenAI-style tool calls.
CODE_ARGUMENTS = ("code", "source", "python", "script")
# A Qwen call or response, in the order they appear in one text.
_QWEN_TAG = re.compile(
    r"<tool_call>\s*<function=(?P<name>[^>]+)>(?P<body>.*?)</function>\s*</tool_call>"
    r"|<tool_response>\n?(?P<response>.*?)\n?</tool_response>",
    re.S,
)
_QWEN_PARAM = re.compile(r"<parameter=(?P<name>[^>]+)>\n?(?P<value>.*?)\n?</parameter>", re.S)


@dataclass(frozen=True)
class RecordedCall:
    """One code execution a rollout asked for.

    ``recorded``: the observation the policy saw, ``None`` when the record holds none;
    ``unreadable``: why an answer the record does hold could not be read as text.
    """

    id: str
    code: str
    recorded: str | None = None
    unreadable: str = ""
    # A code record's stdin / files / fetch_files, as a Snippet (None: plain code).
    snippet: Snippet | None = None

    @property
    def runs(self) -> Snippet | str:
        """What to submit: the code, or the code with its inputs."""
        return self.snippet if self.snippet is not None else self.code


# What a code record may give its snippet besides the code.
INPUTS = ("stdin", "files", "fetch_files")


class RolloutError(ValueError):
    """Raised when a record is not valid JSON or holds no recognizable call."""


def calls_in_line(line: str, number: int) -> list[RecordedCall]:
    """The calls in one JSONL line (``number`` names lines without an ``id``)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RolloutError(f"line {number}: not JSON ({exc.msg})") from None
    return calls_in_record(record, number)


def calls_in_record(record: Any, number: int, *, unit: str = "line") -> list[RecordedCall]:
    """The calls in one decoded record; ``unit number`` names it in errors and ids."""
    if not isinstance(record, dict):
        raise RolloutError(f"{unit} {number}: not a JSON object")
    record_id = str(number) if record.get("id") is None else str(record["id"])
    if isinstance(record.get("code"), str):
        recorded, unreadable = _recorded_field(record.get("observation"))
        snippet = _inputs(record, f"{unit} {number}")
        return [RecordedCall(record_id, record["code"], recorded, unreadable, snippet)]
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise RolloutError(f"{unit} {number}: neither a 'code' string nor a 'messages' list")
    answered = _Conversation().walk(messages)
    return [
        RecordedCall(f"{record_id}:{k}", code, slot.recorded, slot.unreadable)
        for k, (code, slot) in enumerate(answered)
    ]


@dataclass
class _Slot:
    """A tool call of a chat; ``code`` is None for calls to other tools, which are kept
    only so that their answers are not taken for a code call's."""

    code: str | None
    recorded: str | None = None
    unreadable: str = ""
    answered: bool = False


@dataclass
class _Conversation:
    """Pairs each call with its answer while walking the messages in order."""

    slots: list[_Slot] = field(default_factory=list)
    by_id: dict[str, _Slot] = field(default_factory=dict)
    waiting: list[_Slot] = field(default_factory=list)  # this turn's calls not yet answered

    def walk(self, messages: list[Any]) -> list[tuple[str, _Slot]]:
        """Each code call's code and slot, in call order."""
        for message in messages:
            if not isinstance(message, dict):
                continue
            if message.get("role") == "assistant":
                self._assistant(message)
            else:
                self._answers(message)
        return [(slot.code, slot) for slot in self.slots if slot.code is not None]

    def _assistant(self, message: dict[str, Any]) -> None:
        tool_calls = message.get("tool_calls") or []
        content = message.get("content")
        if tool_calls or (isinstance(content, str) and "<tool_call>" in content):
            self.waiting = []  # calls of an earlier turn left unanswered stay unrecorded
        for call in tool_calls if isinstance(tool_calls, list) else []:
            slot = self._add(_openai_code(call))
            call_id = call.get("id") if isinstance(call, dict) else None
            if isinstance(call_id, str):
                self.by_id.setdefault(call_id, slot)
        if isinstance(content, str):
            for match in _QWEN_TAG.finditer(content):
                if match["response"] is not None:
                    self._answer_next(match["response"])
                else:
                    self._add(_qwen_code(match["body"]))

    def _answers(self, message: dict[str, Any]) -> None:
        content = message.get("content")
        text, _ = _message_text(content)
        tags = _QWEN_TAG.finditer(text or "")
        responses = [m["response"] for m in tags if m["response"] is not None]
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str) and call_id:
                if call_id in self.by_id:
                    self._record(self.by_id[call_id], content)
                return  # it answers a call this record does not make (another tool's)
            if not responses:
                if self.waiting:
                    self._record(self.waiting[0], content)
                return
        for response in responses:
            self._answer_next(response)

    def _add(self, code: str | None) -> _Slot:
        slot = _Slot(code)
        self.slots.append(slot)
        self.waiting.append(slot)
        return slot

    def _answer_next(self, text: str) -> None:
        if self.waiting:
            self._record(self.waiting[0], text)

    def _record(self, slot: _Slot, content: Any) -> None:
        if slot.answered:
            return  # the first answer is the one the policy went on from
        slot.answered = True
        if slot in self.waiting:
            self.waiting.remove(slot)
        slot.recorded, slot.unreadable = _message_text(content)


def _inputs(record: dict[str, Any], where: str) -> Snippet | None:
    """A code record's ``stdin`` (text), ``files`` (path -> text) and ``fetch_files``."""
    given = {name: record[name] for name in INPUTS if record.get(name) is not None}
    if not given:
        return None
    files = given.get("files", {})
    if isinstance(files, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in files):
        files = given["files"] = dict(files)  # a Parquet map column reads as pairs
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise RolloutError(f"{where}: files must map paths to text")
    try:
        return Snippet.make(record["code"], **given)
    except ConfigError as exc:
        raise RolloutError(f"{where}: {exc}") from None


def _message_text(content: Any) -> tuple[str | None, str]:
    """A message's text and, when it has none, why; content parts are joined."""
    if isinstance(content, str):
        return content, ""
    if isinstance(content, list):
        texts = [part.get("text") if isinstance(part, dict) else None for part in content]
        if all(isinstance(text, str) for text in texts):
            return "".join(str(text) for text in texts), ""
        return None, "the answering message's content holds a part that is not text"
    if content is None:
        return None, "the answering message has no content"
    return None, f"the answering message's content is {type(content).__name__}, not text"


def _recorded_field(value: Any) -> tuple[str | None, str]:
    if value is None or isinstance(value, str):
        return value, ""
    return None, f"'observation' is {type(value).__name__}, not text"


def _openai_code(call: Any) -> str | None:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return next((arguments[k] for k in CODE_ARGUMENTS if isinstance(arguments.get(k), str)), None)


def _qwen_code(body: str) -> str | None:
    params = {m["name"].strip(): m["value"] for m in _QWEN_PARAM.finditer(body)}
    return next((params[k] for k in CODE_ARGUMENTS if k in params), None)
