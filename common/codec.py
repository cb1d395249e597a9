"""The one msgpack codec: wire records, and RQ's ``Serializer`` protocol (dumps/loads).

No pickle anywhere: everything codepool puts in Redis or on a socket is msgpack.
"""

from __future__ import annotations

from typing import Any

import msgpack

from codepool.common.errors import ConfigError, WireError
from codepool.common.limits import Limits
from codepool.common.result import ExecResult

# Version of the ExecResult record (the batch record has its own, in wire.py).
RESULT_SCHEMA_VERSION = 1


def dumps(obj: Any) -> bytes:
    """Encode plain data (dicts, lists, str, bytes, numbers, None) as msgpack."""
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def loads(data: bytes) -> Any:
    """Decode msgpack bytes; raise WireError on anything malformed."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"undecodable msgpack payload: {exc}") from exc


class MsgpackSerializer:
    """RQ ``Serializer`` protocol over this codec (``rq.Queue(serializer=...)``)."""

    dumps = staticmethod(dumps)
    loads = staticmethod(loads)


def encode_result(result: ExecResult) -> bytes:
    record = result.to_dict()
    record["v"] = RESULT_SCHEMA_VERSION
    return dumps(record)


def decode_result(data: bytes) -> ExecResult:
    record = loads(data)
    if not isinstance(record, dict) or record.get("v") != RESULT_SCHEMA_VERSION:
        raise WireError(f"not an ExecResult record of schema version {RESULT_SCHEMA_VERSION}")
    try:
        return ExecResult.from_dict(record)
    except TypeError as exc:
        raise WireError(f"malformed ExecResult record: {exc}") from exc


def encode_done_entry(index: int, result_blob: bytes) -> bytes:
    """A done-list entry: the snippet index and its encoded ExecResult."""
    return dumps([index, result_blob])


def decode_done_entry(data: bytes) -> tuple[int, ExecResult]:
    entry = loads(data)
    if (
        not isinstance(entry, list)
        or len(entry) != 2
        or not isinstance(entry[0], int)
        or not isinstance(entry[1], bytes)
    ):
        raise WireError("malformed done-list entry")
    return entry[0], decode_result(entry[1])


def encode_limits(limits: Limits) -> dict[str, Any]:
    return limits.to_dict()


def decode_limits(record: Any) -> Limits:
    if not isinstance(record, dict):
        raise WireError("limits must be a map")
    try:
        return Limits.from_dict(record)
    except (ConfigError, TypeError) as exc:
        raise WireError(f"bad limits: {exc}") from exc
