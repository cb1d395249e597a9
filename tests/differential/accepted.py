"""Differences from ``python -B -c`` that codepool keeps on purpose, each with its
reason; docs/runtime.md lists every reason (a test checks it). A case that differs
without an entry here fails the differential."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Accepted:
    cases: tuple[str, ...]  # fnmatch patterns over case names
    paths: str  # fnmatch pattern over path names
    why: str  # as docs/runtime.md words it

    def covers(self, case: str, path: str) -> bool:
        return fnmatchcase(path, self.paths) and any(fnmatchcase(case, p) for p in self.cases)


ACCEPTED: list[Accepted] = [
    Accepted(
        ("finalisation/asyncio-loop-left-*", "files/in-cycle-*"),
        "*",
        "the collector finalises a cycle's objects in an order that depends on the whole heap",
    ),
    Accepted(
        (
            "finalisation/asyncio-*",
            "forks/subprocess-*",
            "threads/executor*",
            "files/tempfile",
        ),
        "no-namespaces",
        "without a mount namespace a snippet's uid reads the interpreter's files only where "
        "every directory above them is world-searchable",
    ),
    Accepted(
        ("interpreter/modules-with-inputs",),
        "*",
        "a child set up in Python is cloned from an image that imported them",
    ),
    *(
        Accepted(
            ("interpreter/modules",),
            path,  # children set up in Python (without namespaces, the C set-up is not used)
            "a child set up in Python is cloned from an image that imported them",
        )
        for path in ("fork-python", "no-namespaces")
    ),
]


def accepted(case: str, path: str) -> Accepted | None:
    for entry in ACCEPTED:
        if entry.covers(case, path):
            return entry
    return None
