"""SandboxFusion's HTTP API as codepool reads and answers it: a ``/run_code`` or
``/run_jupyter`` request body becomes a Snippet and Limits overrides, and an ExecResult
becomes the response body, field for field as SandboxFusion's models have them.

Only Python runs here; a request naming another language is answered ``SandboxError``
with a message saying so. Malformed bodies raise BadRequest (the server answers 4xx with
its reason), never a half-built snippet.

Statuses are the ones SandboxFusion's own server gives the same run: a run stopped by
the wall clock is ``TimeLimitExceeded`` (and ``Failed``); every other limit shows as the
process shows it there, ``Finished`` with its exit code (a MemoryError's 1, a CPU
limit's -24 or -9, ``Failed`` unless 0), since SandboxFusion has no status for them.
Which limit it was goes in one more field, ``limit`` (ExecResult.limit, or null), which
SandboxFusion's clients ignore (their models drop unknown keys).
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass
from typing import Any

from codepool.common.errors import ConfigError
from codepool.common.result import CANCELLED, ExecResult
from codepool.common.snippet import Snippet

LANGUAGES = ("python",)
# Results codepool could not produce: answered SandboxError.
NOT_RUN = ("infra", "rejected", CANCELLED)
KERNELS = ("python3",)
DEFAULT_RUN_TIMEOUT_S = 10.0  # SandboxFusion's defaults
DEFAULT_COMPILE_TIMEOUT_S = 10.0
DEFAULT_TOTAL_TIMEOUT_S = 45.0


class BadRequest(Exception):
    """A request the server answers with ``status`` and this message."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RequestedRun:
    """What a request asks to run: the snippet and its Limits overrides; or, for a
    language codepool does not run, the SandboxError to answer at once. ``compile_s``:
    its compile budget (SandboxFusion's ``compile_timeout``), which a Python snippet
    spends waiting for a slot, if anything (ops/admission.py)."""

    snippet: Snippet | None
    limits: dict[str, Any]
    refusal: str = ""
    compile_s: float = DEFAULT_COMPILE_TIMEOUT_S


def run_code_call(body: Any) -> RequestedRun:
    """The RequestedRun a ``POST /run_code`` body asks for."""
    fields = json_object(body)
    code = field_of(fields, "code", str, required=True)
    language = field_of(fields, "language", str, required=True)
    if language not in LANGUAGES:
        return RequestedRun(None, {}, refusal=_unsupported("language", language, LANGUAGES))
    # Nothing compiles: the compile budget is what the request may wait for a slot (0 or
    # less: SandboxFusion's default).
    compile_s = field_of(fields, "compile_timeout", (int, float))
    if compile_s is None or not math.isfinite(compile_s) or compile_s <= 0:
        compile_s = DEFAULT_COMPILE_TIMEOUT_S
    limits = {"timeout_s": seconds_of(fields, "run_timeout", DEFAULT_RUN_TIMEOUT_S)}
    limits.update(memory_limits(fields))
    stdin = field_of(fields, "stdin", str)
    snippet = _snippet(fields, code=code, stdin=stdin)
    return RequestedRun(snippet, limits, compile_s=float(compile_s))


def run_jupyter_call(body: Any) -> RequestedRun:
    """The RequestedRun a ``POST /run_jupyter`` body asks for: the cells in one child."""
    fields = json_object(body)
    cells = field_of(fields, "cells", list, required=True)
    if not all(isinstance(cell, str) for cell in cells):
        raise BadRequest("cells: every cell must be a string")
    kernel = field_of(fields, "kernel", str) or KERNELS[0]
    if kernel not in KERNELS:
        raise BadRequest(_unsupported("kernel", kernel, KERNELS))
    cell_timeout = field_of(fields, "cell_timeout", (int, float)) or 0
    if not math.isfinite(cell_timeout) or cell_timeout < 0:
        raise BadRequest("cell_timeout: must be a non-negative number of seconds (0: none)")
    limits = {"timeout_s": seconds_of(fields, "total_timeout", DEFAULT_TOTAL_TIMEOUT_S)}
    limits.update(memory_limits(fields))
    snippet = _snippet(fields, cells=cells, cell_timeout_s=cell_timeout or None)
    return RequestedRun(snippet, limits)


def run_code_response(result: ExecResult) -> dict[str, Any]:
    """SandboxFusion's RunCodeResponse for ``result``."""
    if result.status in NOT_RUN:
        return _sandbox_error(result.stderr)
    failed = result.timed_out or result.returncode != 0
    return {
        "status": "Failed" if failed else "Success",
        "message": "",
        "compile_result": None,
        "run_result": _command_result(result),
        "executor_pod_name": result.worker or None,
        "files": _encode_files(result.files),
        "limit": result.limit,
    }


def run_jupyter_response(result: ExecResult) -> dict[str, Any]:
    """SandboxFusion's RunJupyterResponse for ``result`` (cells that ran, even when the
    whole ran out of time)."""
    if result.status in NOT_RUN:
        return {**_sandbox_error(result.stderr), "driver": None, "cells": []}
    finished = not result.timed_out and result.returncode == 0
    return {
        "status": "Success" if finished else "Failed",
        "message": "",
        "driver": _command_result(result),
        "cells": result.cells,
        "executor_pod_name": result.worker or None,
        "files": _encode_files(result.files),
        "limit": result.limit,
    }


def refusal_response(message: str, *, jupyter: bool = False) -> dict[str, Any]:
    body = _sandbox_error(message)
    return {**body, "driver": None, "cells": []} if jupyter else body


def _sandbox_error(message: str) -> dict[str, Any]:
    return {
        "status": "SandboxError",
        "message": message,
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": None,
        "files": {},
        "limit": None,
    }


def _command_result(result: ExecResult) -> dict[str, Any]:
    return {
        "status": "TimeLimitExceeded" if result.timed_out else "Finished",
        "execution_time": result.exec_s,
        "return_code": result.returncode,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }


def _encode_files(files: dict[str, bytes]) -> dict[str, str]:
    return {path: base64.b64encode(data).decode("ascii") for path, data in files.items()}


def _unsupported(what: str, value: str, supported: tuple[str, ...]) -> str:
    return f"{what} {value[:40]!r} is not supported by codepool; supported: {', '.join(supported)}"


def json_object(body: Any) -> dict[str, Any]:
    """``body`` if it is a JSON object; BadRequest otherwise."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return body


def field_of(fields: dict[str, Any], name: str, kind: Any, *, required: bool = False) -> Any:
    """Field ``name`` of ``fields`` if it is of ``kind`` (a type or a tuple; a bool is
    never a number), None if absent or null; BadRequest otherwise."""
    value = fields.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name}: field required")
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BadRequest(f"{name}: must be {names}, got {type(value).__name__}")
    return value


def seconds_of(fields: dict[str, Any], name: str, default: float) -> float:
    """Field ``name`` as a positive, finite number of seconds (``default`` if absent)."""
    value = field_of(fields, name, (int, float))
    value = default if value is None else float(value)
    if not math.isfinite(value) or value <= 0:
        raise BadRequest(f"{name}: must be a positive number of seconds, got {value!r}")
    return value


def memory_limits(fields: dict[str, Any]) -> dict[str, Any]:
    """The Limits override ``memory_limit_MB`` asks for: ``{"memory_mb": M}``, or none."""
    megabytes = field_of(fields, "memory_limit_MB", (int, float))
    if megabytes is None or megabytes <= 0:  # SandboxFusion's -1: no limit of the request's
        return {}
    return {"memory_mb": max(1, int(megabytes))}


def _snippet(fields: dict[str, Any], **given: Any) -> Snippet:
    files = field_of(fields, "files", dict) or {}
    decoded: dict[str, bytes] = {}
    for path, content in files.items():
        if content is None:  # SandboxFusion skips these
            continue
        if not isinstance(content, str):
            raise BadRequest(f"files[{path!r}]: must be base64 text")
        try:
            decoded[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequest(f"files[{path!r}]: not base64: {exc}") from None
    fetch = field_of(fields, "fetch_files", list) or []
    try:
        return Snippet.make(files=decoded, fetch_files=fetch, **given)
    except ConfigError as exc:
        raise BadRequest(str(exc)) from None
