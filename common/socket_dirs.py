"""Where temp dirs that hold Unix sockets go: the executor's, a private Redis's, the
embedded default's home. Shared by worker and ops, so it lives here."""

from __future__ import annotations

import tempfile

# A Unix socket's path must fit in 108 bytes; a dir under a TMPDIR longer than this
# leaves too little room for a socket inside it, so such dirs go to /tmp instead.
MAX_BASE_CHARS = 60


def socket_bases() -> list[str]:
    """Where temp dirs that hold Unix sockets go: TMPDIR when short enough, else /tmp
    (then TMPDIR too, for sweeping)."""
    base = tempfile.gettempdir()
    return [base] if len(base) <= MAX_BASE_CHARS else ["/tmp", base]
