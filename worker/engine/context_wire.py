"""The records between the supervisor and an interpreter context's processes.

A context (worker/engine/context_child.py) talks to the supervisor on its control
socket, the request socket of the child it began as (or, for a fork, a socketpair the
supervisor made and handed over with the fork order). Both ways it is one kind byte and
a fixed struct, so neither side needs a decoder for anything the other could garble:

  supervisor -> context  ``C`` call: CPU seconds, flags (contract.FLAG_*), code length,
                         the call's token (random), then the code
                         ``F`` fork: how many; with 3 fds per fork (SCM_RIGHTS): its
                         control socket, stdout and stderr files
                         (end of file: close; the process exits)
  context -> supervisor  ``R`` ready (the child set-up's, before the context starts)
                         ``H`` hello: its pid in its PID namespace (the kernel adds its
                         pid in the supervisor's, SCM_CREDENTIALS)
                         ``E`` a call ended: the call's token, exit code, CPU
                         microseconds and peak RSS (KiB) of the call
                         ``K`` a fork order was carried out: how many forks were made

The call's code can reach the control socket too (fd 3; nothing hides an fd from a
process that writes to every fd it has): what arrives while a call runs, before that
call's ``E`` and token, is the call's own writing and is dropped (``resync``), so a
call that writes to every fd goes on as a snippet that does.

The family's reaper (the first process, which never runs user code) reports each
process it reaps on the done pipe: its namespace pid, wait status, CPU microseconds and
peak RSS, so the supervisor learns how a context died (a signal, the CPU limit) though
the context is not its own child.
"""

from __future__ import annotations

import struct
from typing import Any

CALL = b"C"
FORK = b"F"
READY = b"R"
HELLO = b"H"
ENDED = b"E"
FORKED = b"K"

CALL_HEAD = struct.Struct("!IBI8s")  # cpu_s, flags, code length, token
FORK_HEAD = struct.Struct("!I")  # forks wanted
BODIES = {
    READY: struct.Struct("!"),
    HELLO: struct.Struct("!i"),  # namespace pid
    ENDED: struct.Struct("!8siqq"),  # token, exit code, cpu_us, max_rss_kb
    FORKED: struct.Struct("!i"),  # forks made
}
REAPED = struct.Struct("=iiqq")  # namespace pid, wait status, cpu_us, max_rss_kb
MAX_FORKS_PER_ORDER = 64  # 3 fds each must fit the child's RLIMIT_NOFILE


def parse(buffer: bytearray) -> list[tuple[bytes, tuple[Any, ...]]]:
    """Take the whole records off the front of ``buffer``; raises ValueError on a kind
    byte that is none of the context's."""
    records = []
    while buffer:
        kind = bytes(buffer[:1])
        body = BODIES.get(kind)
        if body is None:
            raise ValueError(f"unknown context record {kind!r}")
        if len(buffer) < 1 + body.size:
            break
        records.append((kind, body.unpack_from(buffer, 1)))
        del buffer[: 1 + body.size]
    return records


def resync(buffer: bytearray, token: bytes) -> bool:
    """While a call runs: drop what precedes its ``E`` record (``token``'s) from the
    front of ``buffer``; True once the record's start is at the front."""
    marker = ENDED + token
    at = buffer.find(marker)
    if at >= 0:
        del buffer[:at]
        return True
    del buffer[: max(0, len(buffer) - len(marker) + 1)]  # keep what may begin it
    return False
