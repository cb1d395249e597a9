"""A child's inputs, set up between its request and the user's first line: the files
written into its work dir, its stdin, and what it hands the supervisor with "ready"
(the work dir, when files are to be read back; the record fd of notebook cells)."""

from __future__ import annotations

import os
import socket
from typing import Any

FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_files(files: list[list[Any]]) -> None:
    """Write ``[path, content]`` pairs under the cwd (paths were checked: relative, no
    ``..``); a path that exists already is an error, never followed."""
    for path, data in files:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, FILE_FLAGS, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def give_stdin(data: bytes) -> None:
    """Make fd 0 read ``data`` then EOF (a memfd: no pipe to fill, no writer to wait on)."""
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)


def say_ready(request_fd: int, ready: bytes, *, fetch: bool, cells: Any) -> int | None:
    """Send ``ready`` on the request socket, with the fds the supervisor reads back from:
    the work dir (``fetch``), then a fresh record memfd (``cells``), which is returned."""
    if not fetch and cells is None:
        os.write(request_fd, ready)
        return None
    fds = []
    if fetch:
        fds.append(os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    record_fd = None
    if cells is not None:
        record_fd = os.memfd_create("cells", os.MFD_CLOEXEC)
        fds.append(record_fd)
    sock = socket.socket(fileno=request_fd)
    try:
        socket.send_fds(sock, [ready], fds)
    finally:
        sock.detach()
    if fetch:
        os.close(fds[0])
    return record_fd
