"""Where temp dirs that hold Unix sockets go: the executor's, a private Redis's, the
embedded default's home. Shared by worker and ops, so it lives here."""

from __future__ import annotations

import os
import tempfile

# A Unix socket's path must fit in 108 bytes; a dir under a TMPDIR longer than this
# leaves too little room for a socket inside it, so such dirs go to /tmp instead.
MAX_BASE_CHARS = 60


def socket_bases() -> list[str]:
    """Where temp dirs that hold Unix sockets go: TMPDIR when short enough, else /tmp
    (then TMPDIR too, for sweeping)."""
    base = tempfile.gettempdir()
    return [base] if len(base) <= MAX_BASE_CHARS else ["/tmp", base]


def pid_namespace_tag() -> str:
    """``n{inode}-`` (hex), this process's PID namespace, for the names of dirs swept by
    their maker's pid: put after the pid, so that a sweep judges only pids of its own
    namespace. A worker in a container that shares /tmp, or a command run as a PID
    namespace's init, would otherwise take the live dirs of another namespace for a
    dead process's. Empty where /proc does not say."""
    try:
        return f"n{os.stat('/proc/self/ns/pid').st_ino:x}-"
    except OSError:
        return ""


def owner_of(name: str, prefix: str) -> str | None:
    """The owner part of a dir named ``{prefix}{owner}-{pid_namespace_tag()}XXXX``; None
    when it was made in another PID namespace, whose pids are not this one's to judge.
    A name without the tag (made before it existed) is judged as before."""
    owner, _, rest = name[len(prefix) :].partition("-")
    tag, tagged, _ = rest.partition("-")  # mkdtemp's own suffix holds no "-"
    if tagged and tag.startswith("n"):
        return owner if f"{tag}-" == pid_namespace_tag() else None
    return owner
