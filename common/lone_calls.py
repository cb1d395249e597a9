"""Lone calls: one snippet at a time, on the work channel every live worker host keeps
open, without an RQ job (producer/calls.py sends them, worker/call_server.py runs them).

A producer pushes a call on the fleet's call list (``Keys.calls``); a host's call server,
while it has a free slot, moves the oldest onto its own in-flight list
(``Keys.host_calls``, one atomic BLMOVE), runs it, and answers on the producer's inbox
(``Keys.inbox``) as it takes the call off its in-flight list. A host that lapses has
its in-flight calls put back at the head of the call list by a janitor
(``requeue_host_calls``); a call lost ``MAX_RUNS`` times comes back ``infra``. A call
can so run twice (a frozen host that comes back), but its caller takes the first
answer only: exactly one visible result.

msgpack records with short keys:

- call: ``id``, ``inbox`` (the producer's inbox key), ``code``, ``in`` (the snippet's
  inputs record, or None), ``lim`` (a complete Limits dict), ``run`` (run tag),
  ``runs`` (how often a host holding it was lost).
- reply: ``[id, encoded ExecResult]``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import redis

from codepool.common.codec import dumps, encode_result, loads
from codepool.common.errors import WireError
from codepool.common.keys import Keys
from codepool.common.result import ExecResult, infra

log = logging.getLogger(__name__)

MAX_RUNS = 3  # hosts lost while holding one call before it comes back infra
INBOX_TTL_S = 300  # an inbox nobody reads goes away
LOST_MESSAGE = "codepool: the worker running this call was lost {runs} times; not run again"


@dataclass
class LoneCall:
    id: str
    inbox: str
    code: str
    limits: dict[str, Any]
    inputs: dict[str, Any] | None = None
    run: str = ""
    runs: int = 0
    raw: bytes = field(default=b"", compare=False)  # as it was popped (for LREM)

    def encode(self) -> bytes:
        return dumps(
            {
                "id": self.id,
                "inbox": self.inbox,
                "code": self.code,
                "in": self.inputs,
                "lim": self.limits,
                "run": self.run,
                "runs": self.runs,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> LoneCall:
        record = loads(data)
        if not isinstance(record, dict):
            raise WireError("a lone call must be a map")
        try:
            call = cls(
                id=str(record["id"]),
                inbox=str(record["inbox"]),
                code=record["code"],
                limits=record["lim"],
                inputs=record.get("in"),
                run=str(record.get("run", "")),
                runs=int(record.get("runs", 0)),
                raw=data,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"malformed lone call: {exc}") from exc
        if not isinstance(call.limits, dict):
            raise WireError("a lone call's limits must be a map")
        return call


def encode_reply(call_id: str, result: ExecResult) -> bytes:
    return dumps([call_id, encode_result(result)])


def decode_reply(data: bytes) -> tuple[str, bytes]:
    record = loads(data)
    if not isinstance(record, list) or len(record) != 2 or not isinstance(record[1], bytes):
        raise WireError("a lone call's reply must be [id, result]")
    return str(record[0]), record[1]


def requeue_host_calls(conn: redis.Redis, keys: Keys, host: str, *, janitor: str) -> int:
    """Put lapsed ``host``'s unanswered calls back at the head of the call list (a call
    lost too often is answered ``infra`` instead); returns how many went back.

    One LPOP at a time: two janitors never take the same call, and the rare janitor
    that dies between its pop and its push loses a call to its caller's deadline."""
    requeued = 0
    given_up = 0
    while True:
        data = conn.lpop(keys.host_calls(host))
        if data is None:
            break
        try:
            call = LoneCall.decode(data)  # type: ignore[arg-type]
        except WireError:
            continue  # the host could not read it either
        call.runs += 1
        if call.runs >= MAX_RUNS:
            result = infra(LOST_MESSAGE.format(runs=call.runs), worker=janitor)
            with conn.pipeline(transaction=False) as pipe:
                pipe.rpush(call.inbox, encode_reply(call.id, result))
                pipe.expire(call.inbox, INBOX_TTL_S)
                pipe.execute()
            given_up += 1
            continue
        conn.lpush(keys.calls(), call.encode())
        requeued += 1
    if requeued or given_up:
        log.warning(
            "janitor %s: worker host %s lapsed; %d lone calls back on the call list, %d lost "
            "too often",
            janitor,
            host,
            requeued,
            given_up,
        )
    return requeued
