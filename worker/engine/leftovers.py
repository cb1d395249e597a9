"""Temp dirs named after the process that made them, so a successor can remove those
whose maker is gone (killed -9, a lost host) without touching anyone else's."""

from __future__ import annotations

import os
import shutil
import tempfile


def make_dir(prefix: str) -> str:
    """A fresh 0700 temp dir ``{prefix}{pid}-XXXX`` owned by this process."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def sweep(prefix: str, marker: bytes) -> int:
    """Remove ``{prefix}{pid}-*`` dirs whose pid is no longer a live process whose
    command line holds ``marker``; returns how many were removed."""
    removed = 0
    for entry in os.scandir(tempfile.gettempdir()):
        if not entry.name.startswith(prefix):
            continue
        owner = entry.name[len(prefix) :].split("-", 1)[0]
        if owner.isdigit() and not _runs(int(owner), marker):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def _runs(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker in f.read()
    except OSError:
        return False
