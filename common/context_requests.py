"""Requests for the interpreter contexts of the fleet, and their replies, as they travel
through Redis (producer/context.py sends them, worker/context_server.py answers).

A context lives on one worker host; a request goes on that host's list
(``Keys.host_requests``) and names the list its one reply goes to
(``Keys.context_reply``). msgpack maps with short keys:

- request: ``op`` (``open``, ``run``, ``fork``, ``close``), ``id`` (the request's, and its
  reply's), ``ctx`` (the context's id; for ``open`` the id to give it), ``code`` and
  ``limits`` (a Limits dict: the context's defaults for ``open``, the call's overrides
  for ``run``), ``new`` (for ``fork``: the ids of the forks to make).
- reply: ``ok`` (bool), ``result`` (an encoded ExecResult, for ``run``), ``error`` (why
  not, for the others), ``ttl`` (for ``open``: the host's idle TTL, seconds).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from codepool.common.codec import dumps, loads
from codepool.common.errors import WireError

OPS = ("open", "run", "fork", "close")


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class ContextRequest:
    op: str
    ctx: str
    id: str = field(default_factory=new_id)
    code: str = ""
    limits: dict[str, Any] = field(default_factory=dict)
    new: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        return dumps(
            {
                "op": self.op,
                "id": self.id,
                "ctx": self.ctx,
                "code": self.code,
                "limits": self.limits,
                "new": self.new,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> ContextRequest:
        try:
            record = loads(data)
            request = cls(
                op=str(record["op"]),
                ctx=str(record["ctx"]),
                id=str(record["id"]),
                code=str(record.get("code", "")),
                limits=dict(record.get("limits") or {}),
                new=[str(i) for i in record.get("new") or []],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WireError(f"malformed context request: {exc}") from exc
        if request.op not in OPS:
            raise WireError(f"unknown context request {request.op!r}")
        return request


@dataclass
class ContextReply:
    ok: bool
    result: bytes = b""
    error: str = ""
    ttl_s: float = 0.0
    # The host does not hold the context's state any more though nothing ended it (the
    # host restarted, its supervisor died): the caller rebuilds it from its record.
    lost: bool = False

    def encode(self) -> bytes:
        record = {"ok": self.ok, "result": self.result, "error": self.error, "ttl": self.ttl_s}
        if self.lost:
            record["lost"] = True
        return dumps(record)

    @classmethod
    def decode(cls, data: bytes) -> ContextReply:
        try:
            record = loads(data)
            return cls(
                ok=bool(record["ok"]),
                result=bytes(record.get("result") or b""),
                error=str(record.get("error", "")),
                ttl_s=float(record.get("ttl") or 0.0),
                lost=bool(record.get("lost", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WireError(f"malformed context reply: {exc}") from exc
