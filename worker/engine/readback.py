"""What the supervisor reads back from a finished child: the tails of its output, the
files it was asked to fetch, and its notebook cells.

The child is dead (or killed) by then and whatever it wrote is untrusted: only the
tails are read, within the limits; fetched files are opened one path component at a
time beneath the work dir the child handed over, never following a symlink, and only
regular files with one link count (no FIFO to block on, no link to a file elsewhere).
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from codepool.common.observation import decode_tail, truncation_marker

BYTES_PER_CHAR = 4
MAX_RECORDS_BYTES = 8 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_whole(fd: int) -> str:
    """The first 64 KiB of ``fd`` as text (a setup failure's message)."""
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, 1 << 16), 0).decode("utf-8", "replace")


def read_tail(fd: int, max_chars: int, start: int = 0, end: int | None = None) -> tuple[str, bool]:
    """The last ``max_chars`` characters of bytes ``start:end`` of ``fd`` (default: all
    of it), with the truncation marker when cut; True when cut."""
    size = os.fstat(fd).st_size
    end = size if end is None else max(start, min(end, size))
    span = end - start
    length = min(span, max_chars * BYTES_PER_CHAR + BYTES_PER_CHAR)
    data = os.pread(fd, length, end - length) if length > 0 else b""
    return decode_tail(data, span, max_chars)


def fetch(dir_fd: int, paths: tuple[str, ...], max_bytes: int) -> dict[str, bytes]:
    """The regular files at ``paths`` beneath ``dir_fd``, at most ``max_bytes`` in all;
    one that is missing, not a plain file, or does not fit is left out."""
    files: dict[str, bytes] = {}
    left = max_bytes
    for path in paths:
        data = _read_beneath(dir_fd, path, left)
        if data is not None:
            files[path] = data
            left -= len(data)
    return files


def _read_beneath(dir_fd: int, path: str, max_bytes: int) -> bytes | None:
    parts = path.split("/")
    opened: list[int] = []
    try:
        at = dir_fd
        for part in parts[:-1]:
            at = os.open(part, _DIR_FLAGS, dir_fd=at)
            opened.append(at)
        fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=at)
        opened.append(fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > max_bytes:
            return None
        return os.pread(fd, info.st_size, 0)
    except OSError:
        return None
    finally:
        for fd in opened:
            os.close(fd)


def notebook_cells(
    record_fd: int, out_fd: int, err_fd: int, max_chars: int
) -> list[dict[str, Any]]:
    """One map per cell the child recorded (see cells.py): its slice of stdout and
    stderr, its display and its error, each cut to ``max_chars``. A line that is not
    what the harness writes is skipped: a cell that writes to every fd it has writes
    to the records too (cells.py starts each record on a line of its own)."""
    size = os.fstat(record_fd).st_size
    data = os.pread(record_fd, min(size, MAX_RECORDS_BYTES), 0)
    cells: list[dict[str, Any]] = []
    out_at = err_at = 0
    for line in data.split(b"\n"):
        try:
            record = json.loads(line) if line else None
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        out_end, err_end = record.get("out"), record.get("err")
        if not isinstance(out_end, int) or not isinstance(err_end, int):
            continue
        out_end, err_end = max(out_end, out_at), max(err_end, err_at)
        stdout, _ = read_tail(out_fd, max_chars, out_at, out_end)
        stderr, _ = read_tail(err_fd, max_chars, err_at, err_end)
        out_at, err_at = out_end, err_end
        cells.append(
            {
                "stdout": stdout,
                "stderr": stderr,
                "display": _display(record, max_chars),
                "error": _error(record.get("error"), max_chars),
            }
        )
    return cells


def _text(value: Any) -> str:
    """``value`` as text every wire can carry: a lone surrogate (a cell's error message
    or repr may hold one; JSON brings it back) as its escape, as stderr prints it."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _display(record: dict[str, Any], max_chars: int) -> list[dict[str, str]]:
    text, chars = record.get("display"), record.get("display_chars")
    if not isinstance(text, str):
        return []
    text = _text(text)
    total = chars if isinstance(chars, int) and chars >= len(text) else len(text)
    if total > max_chars:
        text = truncation_marker(total - max_chars) + text[-max_chars:]
    return [{"text/plain": text}]


def _error(error: Any, max_chars: int) -> list[dict[str, Any]]:
    if not isinstance(error, dict):
        return []
    lines = error.get("traceback")
    if not isinstance(lines, list):
        lines = []
    return [
        {
            "ename": _text(error.get("ename", ""))[:200],
            "evalue": _text(error.get("evalue", ""))[-max_chars:],
            "traceback": [_text(line)[-max_chars:] for line in lines],
        }
    ]
