"""Observation text: truncation, decoding, sanitizing, the reference tool messages."""

from __future__ import annotations

from codepool.common import ExecResult, format_tool_content, sanitize, truncate_tail
from codepool.common.observation import (
    INFRA_MESSAGE,
    TRUNCATION_MARKER,
    decode_tail,
    truncation_marker,
)


def _result(**fields: object) -> ExecResult:
    base: dict[str, object] = dict(
        ok=True, stdout="", stderr="", returncode=0, timed_out=False, latency=0.01
    )
    base.update(fields)
    return ExecResult(**base)  # type: ignore[arg-type]


def test_truncate_tail_keeps_the_end_with_marker() -> None:
    assert truncate_tail("abc", 3) == ("abc", False)
    text, cut = truncate_tail("0123456789", 4)
    assert cut and text == "[... truncated 6 chars ...]\n6789"


def test_decode_tail_counts_skipped_bytes_and_replaces_bad_utf8() -> None:
    assert decode_tail(b"a\xffb", 3, 10) == ("a\ufffdb", False)
    text, cut = decode_tail(b"56789", 10, 3)
    assert cut and text == "[... truncated 7 chars ...]\n789"
    # A tail that starts inside a multibyte character drops the broken half.
    text, cut = decode_tail("é!".encode()[1:], 3, 10)
    assert cut and text == "[... truncated 2 chars ...]\n!"


def test_sanitize_matches_reference_replacements() -> None:
    raw = "<|im_start|>x<|im_end|><tool_response>y</tool_response>"
    assert sanitize(raw) == "< im_start >x< im_end >< tool_response >y< /tool_response>"
    assert sanitize("<|eot_id|>", {"<|eot_id|>": "< eot_id >"}) == "< eot_id >"


def test_format_tool_content_cases() -> None:
    assert format_tool_content(_result(stdout="<|im_end|>\n")) == "< im_end >\n"
    assert format_tool_content(_result(stdout="")) == ""
    error = _result(ok=False, returncode=1, stderr="Traceback...\nValueError: x\n", status="error")
    assert format_tool_content(error) == "Traceback...\nValueError: x\n"
    silent = _result(ok=False, returncode=3, status="error")
    assert format_tool_content(silent) == "Error: process exited with code 3."
    timeout = _result(ok=False, returncode=None, timed_out=True, status="timeout", exec_s=5.2)
    assert (
        format_tool_content(timeout, timeout_s=5.0) == "Error: execution timed out after 5 seconds."
    )
    assert format_tool_content(timeout) == "Error: execution timed out after 5 seconds."
    down = _result(ok=False, returncode=None, status="infra", stderr="zygote died")
    assert format_tool_content(down) == INFRA_MESSAGE


def test_truncation_marker_pattern_matches_the_marker_at_the_start_only() -> None:
    text, _ = truncate_tail("x" * 50, 10)
    match = TRUNCATION_MARKER.match(text)
    assert match is not None and match["dropped"] == "40"
    assert TRUNCATION_MARKER.fullmatch(truncation_marker(123))
    assert TRUNCATION_MARKER.search("ok\n" + truncation_marker(5)) is None
