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


# A context call is an interactive statement, not a process's end
# (docs/contexts-and-cells.md says each).
ACCEPTED += [
    Accepted(
        (
            "finalisation/*",
            "files/left-open-*",
            "files/in-func-*",
            "files/buffered-big-*",
            "forks/fork-atexit",
            "threads/non-daemon-after-*",
            "threads/executor-unjoined",
            "threads/atexit-in-thread-order",
        ),
        "context-*",
        "a context call ends as an interactive statement does: the session's objects, open "
        "files, threads and atexit hooks live on, and there is no exit status 120",
    ),
    Accepted(
        ("interpreter/modules*", "interpreter/fatal-segv*", "interpreter/fatal-abort*"),
        "context-*",
        "a context's interpreter is cloned from the preloading image, set up in Python: "
        "numpy (listed in a fatal error's extension modules), ctypes and json are in "
        "sys.modules",
    ),
    Accepted(
        ("files/*-os-exit",),
        "context-*",
        "a context call takes no files: the differential reads them back with a later call, "
        "which a call that ended its interpreter does not leave",
    ),
]


def accepted(case: str, path: str) -> Accepted | None:
    for entry in ACCEPTED:
        if entry.covers(case, path):
            return entry
    return None


# A notebook cell's error is its record's, not stderr (docs/contexts-and-cells.md says each).
ACCEPTED += [
    Accepted(
        ("finalisation/*-raises",),
        "cell",
        "a cell's error is its record's, apart from the cell's stderr: what the notebook's "
        "end printed after it cannot be told to come after it",
    ),
    Accepted(
        ("interpreter/modules",),
        "cell",  # a notebook is served by a zygote set up in Python, as with inputs
        "a child set up in Python is cloned from an image that imported them",
    ),
]
