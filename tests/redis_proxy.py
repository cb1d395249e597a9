"""Fault injection below the fleet: a TCP proxy in front of a real redis-server that
can lose the reply to a chosen command, cut a connection at a chosen command, or stall
every connection, for paths a whole fleet reaches too rarely to test (a BLMPOP whose
reply a dropped connection lost, a Redis that stops answering mid-call).

Clients connect to ``proxy.url``; each connection gets its own upstream connection and
two forwarding threads. The proxy reads RESP both ways (RESP2 and RESP3 frames), so it
knows which reply answers which command, pipelined or not; replies that answer no
command (pub/sub messages, RESP3 pushes) pass through as they come.
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# RESP frames whose length follows the type byte: bulk strings, verbatim, bulk errors.
_BULK = b"$=!"
# Aggregates: their count of elements (maps and attributes count pairs).
_AGGREGATE = b"*~>"
_PAIRS = b"%|"


def frame_end(buf: bytes | bytearray, pos: int = 0) -> int | None:
    """The offset just past the RESP frame starting at ``pos``; None if ``buf`` does not
    hold all of it yet."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind = buf[pos : pos + 1]
    after = line_end + 2
    if kind and kind in _BULK:
        length = int(buf[pos + 1 : line_end])
        if length < 0:
            return after
        end = after + length + 2
        return end if len(buf) >= end else None
    if kind and kind in _AGGREGATE + _PAIRS:
        count = int(buf[pos + 1 : line_end])
        count *= 2 if kind in _PAIRS else 1
        for _ in range(max(0, count)):
            nxt = frame_end(buf, after)
            if nxt is None:
                return None
            after = nxt
        return after
    return after  # a one-line frame: + - : _ , # ( and inline commands


def command_name(frame: bytes) -> str:
    """The (upper-cased) name of the command a client frame carries."""
    if frame[:1] == b"*":
        head = frame.index(b"\r\n") + 2  # past the array's count
        start = frame.index(b"\r\n", head) + 2  # past the first bulk's length
        return frame[start : frame.index(b"\r\n", start)].decode(errors="replace").upper()
    return frame.split(None, 1)[0].decode(errors="replace").upper() if frame.strip() else ""


def is_empty_reply(frame: bytes) -> bool:
    """A null reply (a blocking pop that timed out, say)."""
    return frame.startswith((b"*-1\r\n", b"$-1\r\n", b"_\r\n"))


@dataclass
class _Rule:
    """Act on the ``nth`` matching command seen from now on, then on no other."""

    command: str
    nth: int
    nonempty: bool  # count only commands whose reply is not null (reply rules only)
    seen: int = 0
    fired: threading.Event = field(default_factory=threading.Event)

    def matches(self, name: str) -> bool:
        if self.fired.is_set() or name != self.command:
            return False
        self.seen += 1
        if self.seen < self.nth:
            return False
        self.fired.set()
        return True


class RedisProxy:
    """A proxy on a free local port in front of ``upstream`` (host, port). Use as a
    context manager, or ``close()`` it."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._running = threading.Event()  # cleared while stalled
        self._running.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._reply_rules: list[_Rule] = []
        self._command_rules: list[_Rule] = []
        self.commands: collections.Counter[str] = collections.Counter()
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="proxy-accept")
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drop_reply(self, command: str, *, nth: int = 1, nonempty: bool = True) -> threading.Event:
        """Lose the reply to the ``nth`` ``command`` from now on (by default counting only
        those whose reply is not null): Redis ran it, the client never hears, and its
        connection is cut. The event is set once it happened."""
        rule = _Rule(command.upper(), nth, nonempty)
        with self._lock:
            self._reply_rules.append(rule)
        return rule.fired

    def cut_at(self, command: str, *, nth: int = 1) -> threading.Event:
        """Cut the connection that sends the ``nth`` ``command`` from now on, before
        Redis sees it (the command fails with a connection error)."""
        rule = _Rule(command.upper(), nth, False)
        with self._lock:
            self._command_rules.append(rule)
        return rule.fired

    def stall(self) -> None:
        """Forward nothing either way until ``resume`` (a frozen Redis, to its clients)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._running.set()
        self._listener.close()
        for sock in sockets:
            _shut(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    _shut(client)
                    _shut(server)
                    return
                self._sockets += [client, server]
            pending: collections.deque[str] = collections.deque()

            def cut(a: socket.socket = client, b: socket.socket = server) -> None:
                _shut(a)
                _shut(b)

            for target, args in (
                (self._commands, (client, server, pending, cut)),
                (self._replies, (server, client, pending, cut)),
            ):
                threading.Thread(target=target, args=args, daemon=True).start()

    def _frames(self, source: socket.socket) -> collections.abc.Iterator[bytes]:
        buf = bytearray()
        while True:
            try:
                chunk = source.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while buf:
                end = frame_end(buf)
                if end is None:
                    break
                frame = bytes(buf[:end])
                del buf[:end]
                self._running.wait()
                yield frame

    def _commands(
        self,
        client: socket.socket,
        server: socket.socket,
        pending: collections.deque[str],
        cut: Callable[[], None],
    ) -> None:
        for frame in self._frames(client):
            name = command_name(frame)
            with self._lock:
                self.commands[name] += 1
                fire = any(rule.matches(name) for rule in self._command_rules)
            if fire:
                break
            pending.append(name)
            try:
                server.sendall(frame)
            except OSError:
                break
        cut()

    def _replies(
        self,
        server: socket.socket,
        client: socket.socket,
        pending: collections.deque[str],
        cut: Callable[[], None],
    ) -> None:
        for frame in self._frames(server):
            if frame[:1] == b">" or not pending:
                name = ""  # a push: it answers no command
            else:
                name = pending.popleft()
            if name and not (is_empty_reply(frame) and self._counts_only_nonempty(name)):
                with self._lock:
                    drop = any(rule.matches(name) for rule in self._reply_rules)
                if drop:
                    break
            try:
                client.sendall(frame)
            except OSError:
                break
        cut()

    def _counts_only_nonempty(self, name: str) -> bool:
        with self._lock:
            return any(r.command == name and r.nonempty for r in self._reply_rules)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
