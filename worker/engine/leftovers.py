"""What snippets leave behind, and removing it: temp dirs named after the process that
made them, so a successor can remove those whose maker is gone (killed -9, a lost host)
without touching anyone else's; and, without PID namespaces, every process and temp
file of a snippet's uid."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

from codepool.common.socket_dirs import owner_of, pid_namespace_tag, socket_bases
from codepool.worker.engine.isolation import VOLATILE_ROOTS


def make_dir(prefix: str) -> str:
    """A fresh 0700 temp dir ``{prefix}{pid}-{pid namespace}-XXXX`` owned by this process (under
    TMPDIR, or /tmp where TMPDIR is too long to hold a Unix socket's path)."""
    tag = pid_namespace_tag()
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{tag}", dir=socket_bases()[0])


def sweep(prefix: str, marker: bytes) -> int:
    """Remove ``{prefix}{pid}-*`` dirs of this PID namespace whose pid is no longer a
    live process whose command line holds ``marker``; returns how many were removed."""
    removed = 0
    for base in socket_bases():
        for entry in os.scandir(base):
            if not entry.name.startswith(prefix):
                continue
            owner = owner_of(entry.name, prefix)
            if owner is not None and owner.isdigit() and not _runs(int(owner), marker):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


def _runs(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker in f.read()
    except OSError:
        return False


def sweep_uid(uid: int) -> None:
    """Without PID namespaces: kill every process of ``uid`` and remove its temp files."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)  # as that uid, -1 reaches only that uid's processes
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    for root in VOLATILE_ROOTS:
        for entry in os.scandir(root):
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
