"""Comparing a replayed observation with the recorded one the policy saw in training.

Equal means equal text, with one exception: the count in the truncation marker that starts
a cut-off output (``[... truncated N chars ...]``) is ignored, since a program whose output
is a little longer or shorter this time is cut by a different count but shows the policy
the same tail. Whitespace is not normalized (the policy saw it), but a change that is only
in leading or trailing whitespace is counted apart: that is usually a framework that strips
outputs, not a changed sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codepool.common.observation import TRUNCATION_MARKER, truncation_marker


def normalized(text: str) -> str:
    """``text`` with the truncation marker's count (if it starts with one) set to 0."""
    return TRUNCATION_MARKER.sub(lambda _: truncation_marker(0), text, count=1)


def observation_match(recorded: str | None, observation: str) -> bool | None:
    """True when ``observation`` is what was recorded; None when nothing was recorded."""
    if recorded is None:
        return None
    return normalized(recorded) == normalized(observation)


def only_whitespace_differs(recorded: str, observation: str) -> bool:
    """True when the two differ, but only in leading or trailing whitespace."""
    a, b = normalized(recorded), normalized(observation)
    return a != b and a.strip() == b.strip()


@dataclass
class Comparison:
    """How many replayed observations equal the recorded ones.

    ``unreadable``: ``"id: reason"`` for answers present in the input but not text (they
    count as not recorded).
    """

    same: int = 0
    changed: int = 0
    whitespace_only: int = 0  # of the changed
    not_recorded: int = 0
    unreadable: list[str] = field(default_factory=list)

    @property
    def recorded(self) -> int:
        return self.same + self.changed

    def add(self, recorded: str | None, observation: str) -> bool | None:
        """Count one call; returns its match (see observation_match)."""
        match = observation_match(recorded, observation)
        if match is None:
            self.not_recorded += 1
        elif match:
            self.same += 1
        else:
            self.changed += 1
            assert recorded is not None
            self.whitespace_only += int(only_whitespace_differs(recorded, observation))
        return match

    def describe(self) -> str:
        """One line: ``12 recorded: 10 same, 2 changed; 20 not recorded``."""
        changed = f"{self.changed} changed"
        if self.whitespace_only:
            changed += f" ({self.whitespace_only} only in leading/trailing whitespace)"
        not_recorded = f"{self.not_recorded} not recorded"
        if self.unreadable:
            not_recorded += f" ({len(self.unreadable)} unreadable)"
        return f"{self.recorded} recorded: {self.same} same, {changed}; {not_recorded}"
