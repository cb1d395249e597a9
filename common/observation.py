"""Observation text: what the policy sees of a result (tail truncation, sanitizing)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from codepool.common.result import ExecResult

# Exactly the reference sandbox's replacements (ChatML / Qwen tool templates).
DEFAULT_MARKERS: Mapping[str, str] = {
    "<|im_start|>": "< im_start >",
    "<|im_end|>": "< im_end >",
    "<tool_response>": "< tool_response >",
    "</tool_response>": "< /tool_response>",
}

INFRA_MESSAGE = "Error: the code execution service could not run this code."


def truncation_marker(dropped_chars: int) -> str:
    return f"[... truncated {dropped_chars} chars ...]\n"


# The marker above with any count; it only ever starts a text (truncate_tail, decode_tail).
TRUNCATION_MARKER = re.compile(r"\A\[\.\.\. truncated (?P<dropped>\d+) chars \.\.\.\]\n")


def truncate_tail(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the last ``max_chars`` characters, prefixed by the truncation marker."""
    if len(text) <= max_chars:
        return text, False
    return truncation_marker(len(text) - max_chars) + text[-max_chars:], True


def decode_tail(data: bytes, total_bytes: int, max_chars: int) -> tuple[str, bool]:
    """Decode the tail ``data`` of a stream of ``total_bytes`` bytes and keep ``max_chars``.

    Only the tail is ever read, so characters dropped before it are counted as bytes
    (exact for ASCII output). Bad UTF-8 becomes U+FFFD, never an exception.
    """
    text = data.decode("utf-8", errors="replace")
    skipped = total_bytes - len(data)
    if skipped <= 0:
        return truncate_tail(text, max_chars)
    if len(text) > max_chars:
        skipped += len(text) - max_chars
        text = text[-max_chars:]
    elif text and text[0] == "\ufffd":
        # The cut may split a multibyte character; drop the broken first char.
        text = text[1:]
        skipped += 1
    return truncation_marker(skipped) + text, True


def sanitize(text: str, markers: Mapping[str, str] = DEFAULT_MARKERS) -> str:
    """Replace chat-template markers so a snippet cannot close or forge a turn."""
    for marker, replacement in markers.items():
        if marker in text:
            text = text.replace(marker, replacement)
    return text


def format_tool_content(
    result: ExecResult,
    *,
    timeout_s: float | None = None,
    markers: Mapping[str, str] = DEFAULT_MARKERS,
) -> str:
    """The tool message for ``result``, as the reference sandbox words it.

    ``timeout_s`` is the limit the call ran under (seconds); without it the measured
    execution time stands in for it in the timeout message.
    """
    if result.status == "infra":
        return INFRA_MESSAGE
    if result.timed_out:
        limit = timeout_s if timeout_s is not None else (result.exec_s or result.latency)
        return f"Error: execution timed out after {limit:.0f} seconds."
    if result.ok:
        return sanitize(result.stdout, markers)
    if result.stderr:
        return sanitize(result.stderr, markers)
    return f"Error: process exited with code {result.returncode}."
