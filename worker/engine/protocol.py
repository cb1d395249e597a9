"""Framing between the supervisor and its clients: a 4-byte length, then msgpack.

Messages (maps, key ``t`` is the type):
  supervisor -> client  ``hello``  {pid, zygote_pids, report, mode,
                                    concurrency, uids}
  client -> supervisor  ``run``    {id, code: bytes, limits: map, inputs?: map}
                                   (inputs: Snippet.inputs_record())
  client -> supervisor  ``cancel`` {ids: [id]}  (given up: dropped if queued, killed if
                                   running, all at once; each result is then one of status
                                   ``cancelled``)
  supervisor -> client  ``result`` {id, r: ExecResult fields}
  client -> supervisor  ``withdraw`` {ids: [id], running: bool}: drop those of the
                        client's requests that have not started (with ``running``, kill
                        those that have too, and send no result for them)
  supervisor -> client  ``withdrawn`` {ids: [id]}: the requests dropped or killed, of
                        which no result will come
  supervisor -> child   a struct header, the code, and its inputs as msgpack when it has
                        any (see child.ChildRequest: no msgpack for a plain snippet's child)
  child -> supervisor   "R" (ready), with the work dir's fd when files are fetched and
                        the notebook record fd for cells (SCM_RIGHTS)
  supervisor -> zygote  CLONE_REQUEST: the child's uid (-1: none), then the work dir the
                        supervisor made when there is no PID namespace; with the child's
                        request socket, stdout and stderr (SCM_RIGHTS)
  zygote -> supervisor  CLONE_REPLY: the child's pid
Plain structs between supervisor and zygote: _nativechild.c reads and writes them too.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from codepool.common import codec

_HEADER = struct.Struct("!I")
CLONE_REQUEST = struct.Struct("!i")
CLONE_REPLY = struct.Struct("!i")
MAX_FRAME_BYTES = 64 << 20


def encode_frame(message: dict[str, Any]) -> bytes:
    body = codec.dumps(message)
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Accumulates bytes from a stream and yields whole decoded messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {length} bytes exceeds the limit")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            messages.append(codec.loads(bytes(self._buffer[_HEADER.size : end])))
            del self._buffer[:end]
        return messages


def recv_one(sock: socket.socket, reader: FrameReader) -> dict[str, Any] | None:
    """Block until one message arrives; None on EOF."""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return None
        messages = reader.feed(data)
        if messages:
            if len(messages) > 1:
                raise ValueError("recv_one got more than one message")
            return messages[0]
