"""Snippet: code with what it reads (stdin, files) and what is read back after it ends
(fetched files), or notebook cells that run in order in one child.

A plain ``str`` is a snippet with no inputs; everywhere a str is accepted, a Snippet is
too (``LocalExecutor.submit``, ``CodePool.submit``, ``RemoteSandbox.run_code``). The
shape is checked when a Snippet is made (ConfigError) and again when one is decoded off
the wire (WireError: the snippet comes back ``rejected``); sizes are checked against the
Limits it runs under (``max_stdin_bytes``, ``max_files_bytes``, ``max_fetch_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from codepool.common.errors import ConfigError, WireError
from codepool.common.limits import Limits

MAX_FILES = 1000  # files written in, and files fetched, per snippet
MAX_PATH_CHARS = 1024
MAX_CELLS = 1000


@dataclass(frozen=True, slots=True)
class Snippet:
    """code: the source. stdin: what the snippet reads on stdin (str is UTF-8 encoded;
    None: at EOF at once). files: relative path -> content, written into the snippet's
    private work dir before it starts. fetch_files: relative paths read back after it
    ends (``ExecResult.files``; a path that is missing or not a regular file is left
    out). cells: notebook cells (then ``code`` is ignored): run in order in one child,
    state carried from cell to cell; ``ExecResult.cells`` holds each one's output.
    cell_timeout_s: wall clock per cell (None: only the snippet's ``timeout_s``)."""

    code: str = ""
    stdin: bytes | None = None
    files: tuple[tuple[str, bytes], ...] = ()
    fetch_files: tuple[str, ...] = ()
    cells: tuple[str, ...] | None = None
    cell_timeout_s: float | None = None

    @classmethod
    def make(
        cls,
        code: str = "",
        *,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
        fetch_files: Iterable[str] = (),
        cells: Iterable[str] | None = None,
        cell_timeout_s: float | None = None,
    ) -> Snippet:
        """A checked Snippet from friendly types (str stdin and file contents are UTF-8)."""
        if not isinstance(code, str):
            raise ConfigError(f"code must be str, got {type(code).__name__}")
        if isinstance(stdin, str):
            stdin = stdin.encode("utf-8", "surrogatepass")
        if files is not None and not isinstance(files, Mapping):
            raise ConfigError(f"files must map paths to contents, got {type(files).__name__}")
        pairs = tuple(
            (path, data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
            for path, data in (files or {}).items()
        )
        if isinstance(fetch_files, (str, bytes)):
            raise ConfigError("fetch_files must be a list of paths, not one string")
        if isinstance(cells, (str, bytes)):
            raise ConfigError("cells must be a list of strings, not one string")
        snippet = cls(
            code,
            stdin,
            pairs,
            tuple(fetch_files),
            None if cells is None else tuple(cells),
            cell_timeout_s,
        )
        try:
            snippet.check_shape()
        except WireError as exc:
            raise ConfigError(str(exc)) from None
        return snippet

    @property
    def has_inputs(self) -> bool:
        """Anything beyond the code (a plain snippet travels as bare code)."""
        return bool(
            self.stdin is not None or self.files or self.fetch_files or self.cells is not None
        )

    @property
    def source(self) -> str:
        """What the snippet runs, as one text (cells joined): for size checks and routing."""
        return "\n".join(self.cells) if self.cells is not None else self.code

    def check_shape(self) -> None:
        """Raise WireError saying what is malformed (types, paths, counts)."""
        if not isinstance(self.code, str):
            raise WireError("code must be a string")
        if self.stdin is not None and not isinstance(self.stdin, bytes):
            raise WireError("stdin must be str or bytes")
        if len(self.files) > MAX_FILES or len(self.fetch_files) > MAX_FILES:
            raise WireError(f"at most {MAX_FILES} files in and {MAX_FILES} fetched")
        for path, data in self.files:
            check_path(path, "files")
            if not isinstance(data, bytes):
                raise WireError(f"file {path!r}: content must be str or bytes")
        written = [path for path, _ in self.files]
        if len(set(written)) != len(written):
            raise WireError("files names one path twice")
        prefixes = {"/".join(p.split("/")[:i]) for p in written for i in range(1, p.count("/") + 1)}
        clash = sorted(prefixes.intersection(written))
        if clash:
            raise WireError(f"files: {clash[0]!r} is both a file and a directory")
        for path in self.fetch_files:
            check_path(path, "fetch_files")
        if self.cells is not None:
            if len(self.cells) > MAX_CELLS:
                raise WireError(f"at most {MAX_CELLS} cells")
            if not all(isinstance(cell, str) for cell in self.cells):
                raise WireError("cells must be strings")
        timeout = self.cell_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise WireError(f"cell_timeout_s must be a positive number, got {timeout!r}")

    def check_sizes(self, limits: Limits) -> str:
        """What is over ``limits`` ('' when nothing): the caller rejects the snippet."""
        if self.stdin is not None and len(self.stdin) > limits.max_stdin_bytes:
            return f"stdin is {len(self.stdin)} bytes, over the {limits.max_stdin_bytes} limit"
        total = sum(len(data) for _, data in self.files)
        if total > limits.max_files_bytes:
            return f"files hold {total} bytes, over the {limits.max_files_bytes} limit"
        return ""

    def inputs_record(self) -> dict[str, Any] | None:
        """The inputs as plain data for msgpack (None for a plain snippet)."""
        if not self.has_inputs:
            return None
        record: dict[str, Any] = {}
        if self.stdin is not None:
            record["stdin"] = self.stdin
        if self.files:
            record["files"] = [[path, data] for path, data in self.files]
        if self.fetch_files:
            record["fetch"] = list(self.fetch_files)
        if self.cells is not None:
            record["cells"] = [cell_to_wire(cell) for cell in self.cells]
            if self.cell_timeout_s is not None:
                record["cell_timeout_s"] = self.cell_timeout_s
        return record

    @classmethod
    def from_record(cls, code: str, record: Any) -> Snippet:
        """The Snippet an inputs record (see ``inputs_record``) describes; WireError if
        it is malformed."""
        if record is None:
            return cls(code)
        if not isinstance(record, dict):
            raise WireError("snippet inputs must be a map")
        unknown = sorted(set(record) - {"stdin", "files", "fetch", "cells", "cell_timeout_s"})
        if unknown:
            raise WireError(f"unknown snippet input(s): {', '.join(map(str, unknown))}")
        files = record.get("files", [])
        if not isinstance(files, list) or not all(
            isinstance(pair, list) and len(pair) == 2 for pair in files
        ):
            raise WireError("files must be a list of [path, content] pairs")
        fetch, cells = record.get("fetch", []), record.get("cells")
        if not isinstance(fetch, list) or (cells is not None and not isinstance(cells, list)):
            raise WireError("fetch and cells must be lists")
        snippet = cls(
            code,
            record.get("stdin"),
            tuple((path, data) for path, data in files),
            tuple(fetch),
            None if cells is None else tuple(cell_from_wire(cell) for cell in cells),
            record.get("cell_timeout_s"),
        )
        snippet.check_shape()
        return snippet


def cell_to_wire(cell: str) -> str | bytes:
    """A cell as msgpack can carry it: as it is, or, holding a lone surrogate (which
    UTF-8 cannot encode), its bytes with the surrogates passed through, as a snippet's
    code goes; the child compiles it and reports it as Python would."""
    try:
        cell.encode("utf-8")
    except UnicodeEncodeError:
        return cell.encode("utf-8", "surrogatepass")
    return cell


def cell_from_wire(cell: Any) -> Any:
    """``cell_to_wire`` undone (anything but bytes as it came, for check_shape)."""
    if not isinstance(cell, bytes):
        return cell
    try:
        return cell.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise WireError(f"a cell is not UTF-8: {exc}") from None


def check_path(path: Any, what: str) -> None:
    """A path inside the work dir: relative, no ``..``, no empty or ``.`` parts, no NUL."""
    if not isinstance(path, str) or not path:
        raise WireError(f"{what}: paths must be non-empty strings")
    if len(path) > MAX_PATH_CHARS or "\0" in path:
        raise WireError(f"{what}: bad path {path[:80]!r}")
    if path.startswith("/"):
        raise WireError(f"{what}: {path!r} must be relative to the snippet's work dir")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise WireError(f"{what}: {path!r} must name a file inside the work dir (no '..')")


INPUT_KEYWORDS = ("stdin", "files", "fetch_files", "cells", "cell_timeout_s")


def split_inputs(code: Any, keywords: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``code`` with the input keywords among ``keywords`` (stdin=, files=, ...) folded
    into a Snippet, and the keywords left (the Limits fields). ConfigError when they are
    malformed or given twice (in a Snippet and as keywords)."""
    given = {name: keywords[name] for name in INPUT_KEYWORDS if name in keywords}
    if not given:
        return code, keywords
    rest = {name: value for name, value in keywords.items() if name not in given}
    if isinstance(code, Snippet):
        raise ConfigError("give a snippet's inputs in the Snippet or as keywords, not both")
    if given.get("cells") is not None and code in (None, ""):
        code = ""
    return Snippet.make(code, **given), rest
