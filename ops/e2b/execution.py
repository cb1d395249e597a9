"""One E2B execution on a context: the calls serve makes (ops/e2b/kernel.py runs them in
the sandbox) and the reading of their output into E2B's streamed events.

A context call's stdout ends with ``\\n<nonce><total>:<piece>``: the first ``piece`` of
``total`` characters of the events' JSON. What comes before the nonce is output the
execution wrote to fd 1 itself (a subprocess); the call's stderr is the same for fd 2.
The nonce is the call's own random one, so nothing the user prints can pass for it.
"""

from __future__ import annotations

import datetime
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codepool.common.result import ExecResult
from codepool.ops.e2b import kernel

# The largest events' JSON one execution may bring back (a few big figures fit).
MAX_EVENTS_CHARS = 32 << 20
# Room left in a call's output for the nonce and sizes beside its piece.
HEAD_CHARS = 64
# E2B's names for the MIME types of a display's data; the rest go to ``extra``.
FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


def install_code(env_vars: dict[str, str], cwd: str | None) -> str:
    """The call that makes ``kernel`` the context's module and sets the sandbox up; it
    prints ``{"cwd", "ipython"}``. Nothing lands in the user's namespace."""
    boot = (
        "import sys, types\n"
        f"module = types.ModuleType({kernel.NAME!r})\n"
        f"exec(compile(SOURCE, {kernel.FILENAME!r}, 'exec'), module.__dict__)\n"
        f"sys.modules[{kernel.NAME!r}] = module\n"
        "module.setup(ENV, CWD)\n"
    )
    scope = {"__name__": "_codepool_e2b_boot", "SOURCE": _source(), "ENV": env_vars, "CWD": cwd}
    return f"exec({boot!r}, {scope!r})\n"


def _source() -> str:
    return Path(kernel.__file__).read_text(encoding="utf-8")


def piece_chars(limits: dict[str, Any]) -> int:
    """How much of the events one call brings back, under the context's output cap."""
    return max(256, int(limits.get("max_output_chars", 4096)) - HEAD_CHARS)


def new_nonce() -> str:
    return f"\x1e{secrets.token_hex(12)}:"


def run_call(code: str, env_vars: dict[str, str] | None, nonce: str, piece: int) -> str:
    arguments = f"{code!r}, {env_vars!r}, {nonce!r}, {piece}"
    return f"__import__('sys').modules[{kernel.NAME!r}].run({arguments})\n"


def more_call(nonce: str, offset: int, piece: int) -> str:
    return f"__import__('sys').modules[{kernel.NAME!r}].more({nonce!r}, {offset}, {piece})\n"


@dataclass
class Piece:
    raw: str  # what came before the nonce: the call's own fd 1 output
    total: int  # characters of the whole events' JSON
    text: str  # this piece of it


def read_piece(result: ExecResult, nonce: str) -> Piece | None:
    """The piece a call printed; None when it printed none (the kernel did not run)."""
    at = result.stdout.rfind("\n" + nonce)
    if at < 0:
        return None
    head, _, text = result.stdout[at + 1 + len(nonce) :].partition(":")
    if not head.isdigit() or int(head) > MAX_EVENTS_CHARS:
        return None
    return Piece(raw=result.stdout[:at], total=int(head), text=text)


def events_of(payload: str, raw_out: str, raw_err: str) -> list[dict[str, Any]]:
    """E2B's events from the kernel's JSON and the raw fd output (first), each checked:
    whatever the sandbox printed, serve sends well-formed events or none."""
    events: list[dict[str, Any]] = []
    for name, text in (("stdout", raw_out), ("stderr", raw_err)):
        if text:
            events.append({"type": name, "text": text, "timestamp": now()})
    try:
        told = json.loads(payload)
    except ValueError:
        told = None
    if not isinstance(told, list):
        return [*events, error_event("SystemError", "codepool: the notebook's answer was cut")]
    for event in told:
        checked = _checked(event)
        if checked is not None:
            events.append(checked)
    return events


def _checked(event: Any) -> dict[str, Any] | None:
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind in ("stdout", "stderr") and isinstance(event.get("text"), str):
        return {"type": kind, "text": event["text"], "timestamp": str(event.get("timestamp"))}
    if kind == "display" and isinstance(event.get("data"), dict):
        return result_event(event["data"], main=bool(event.get("main")))
    if kind == "error":
        return error_event(
            str(event.get("name")), str(event.get("value")), str(event.get("traceback") or "")
        )
    if kind == "number_of_executions" and isinstance(event.get("execution_count"), int):
        return {"type": kind, "execution_count": event["execution_count"]}
    return None


def result_event(data: dict[str, Any], *, main: bool) -> dict[str, Any]:
    """A display's MIME bundle as E2B's ``result`` event (its server's mapping: known
    types get their field, a quoted ``text/plain`` loses its quotes, the rest is
    ``extra``)."""
    event: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        field = FIELDS.get(str(mime))
        if field is None:
            extra[str(mime)] = value
        else:
            event[field] = value
    text = event.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        event["text"] = text[1:-1]
    if extra:
        event["extra"] = extra
    return event


def error_event(name: str, value: str, traceback: str = "") -> dict[str, Any]:
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()
