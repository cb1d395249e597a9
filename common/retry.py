"""Trying again until a deadline: the one way codepool rides out a restarting Redis or a
supervisor socket that is not there yet. No library: the loops need a deadline they share
with other waits and a hook to log each failure, which is a dozen lines here."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def pause(deadline: float, pause_s: float) -> None:
    """Sleep ``pause_s``, but never past ``deadline`` (a ``time.monotonic()`` value)."""
    time.sleep(min(pause_s, max(0.0, deadline - time.monotonic())))


def retry_until(
    deadline: float,
    attempt: Callable[[], T],
    *,
    errors: tuple[type[Exception], ...],
    pause_s: float,
    on_error: Callable[[Exception], None] | None = None,
) -> T:
    """Call ``attempt`` until it returns; after one of ``errors`` pause and try again,
    until ``deadline`` has passed: then the last error is raised."""
    while True:
        try:
            return attempt()
        except errors as exc:
            if time.monotonic() >= deadline:
                raise
            if on_error is not None:
                on_error(exc)
            pause(deadline, pause_s)
