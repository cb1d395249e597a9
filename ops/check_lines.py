"""How ``codepool doctor`` prints its checks: the executor's protections (doctor.py) and
Redis's set-up (redis_checks.py) share this one format."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def format_lines(lines: list[dict[str, Any]], cannot: Collection[str] = ()) -> str:
    """One ``[ok]``/``[--]``/``[!!]`` line per check, names aligned: ``[--]`` for a check
    in ``cannot`` (what this environment cannot give), ``[!!]`` for any other not passed."""
    width = max(len(str(line["name"])) for line in lines)

    def mark(line: dict[str, Any]) -> str:
        return "ok" if line["active"] else "--" if line["name"] in cannot else "!!"

    return "\n".join(
        f"[{mark(line)}] {str(line['name']).ljust(width)}  {line['detail']}" for line in lines
    )
