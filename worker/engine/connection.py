"""One client connection of the supervisor (the owning executor, or an attached
dispatcher): a non-blocking socket, the frames read from it, and an outbox of what
it has not read yet. A client that stalls (a dispatcher stopped with SIGSTOP, or its
reader thread blocked on a Redis write) fills its own outbox, never the supervisor's
loop: deadlines, kills and reaping go on."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field

from codepool.worker.engine.protocol import FrameReader

log = logging.getLogger("codepool.worker.engine.supervisor")

# What may wait in one client's outbox before the client is dropped as stuck. Its
# results are bounded by its requests; this bounds a bug.
MAX_OUTBOX_BYTES = 256 << 20


@dataclass
class Client:
    sock: socket.socket
    owner: bool
    reader: FrameReader = field(default_factory=FrameReader)
    outbox: bytearray = field(default_factory=bytearray)
    broken: bool = False  # a write failed or its outbox overflowed: to be dropped

    def push(self, frame: bytes) -> bool:
        """Queue ``frame`` and send what the socket takes now; False once the client
        is broken (gone, or its outbox overflowed). Never waits."""
        if self.broken:
            return False
        self.outbox += frame
        if len(self.outbox) > MAX_OUTBOX_BYTES:
            log.error("a client read nothing of %d bytes sent to it; dropping it", MAX_OUTBOX_BYTES)
            return self._break()
        return self.flush()

    def flush(self) -> bool:
        """Send what the socket takes of the outbox; False once the client is broken."""
        try:
            while self.outbox:
                sent = self.sock.send(self.outbox)
                del self.outbox[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            log.warning("client went away before its result could be sent")
            return self._break()
        return True

    def flush_before_exit(self, timeout_s: float) -> None:
        """One bounded, blocking try to send what is left (the supervisor stops)."""
        if self.broken or not self.outbox:
            return
        try:
            self.sock.settimeout(max(0.01, timeout_s))
            self.sock.sendall(self.outbox)
        except OSError:
            pass

    def _break(self) -> bool:
        self.broken = True
        self.outbox.clear()
        return False
