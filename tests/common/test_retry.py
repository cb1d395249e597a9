"""retry_until: tries again after the errors it is told of, until its deadline."""

from __future__ import annotations

import time

import pytest

from codepool.common.retry import retry_until


def test_it_tries_again_until_the_attempt_succeeds() -> None:
    calls, seen = [], []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "done"

    deadline = time.monotonic() + 10
    out = retry_until(
        deadline, attempt, errors=(ConnectionError,), pause_s=0.0, on_error=seen.append
    )
    assert out == "done" and len(calls) == 3 and len(seen) == 2


def test_past_the_deadline_the_last_error_is_raised_and_others_at_once() -> None:
    def refuse() -> None:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        retry_until(time.monotonic() + 0.05, refuse, errors=(ConnectionError,), pause_s=0.01)

    def broken() -> None:
        raise KeyError("not one to retry")

    with pytest.raises(KeyError):
        retry_until(time.monotonic() + 10, broken, errors=(ConnectionError,), pause_s=1.0)
