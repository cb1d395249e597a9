"""The batch record a producer stores once, and the announcement RQ carries."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from codepool.common import codec
from codepool.common.errors import WireError
from codepool.common.limits import Limits
from codepool.common.snippet import Snippet

SCHEMA_VERSION = 2
# A batch whose snippets carry inputs (stdin, files, fetch_files, cells) is version 3:
# a worker that predates inputs refuses it (rejected) rather than run it without them,
# and plain batches stay readable by such workers.
INPUTS_SCHEMA_VERSION = 3
# A done-list entry with this index rejects the whole batch (its payload was unusable).
WHOLE_BATCH = -1
# The only function a codepool worker will run; RQ jobs naming anything else are refused.
JOB_FUNCTION = "codepool.worker.job.run_batch"
RUN_TAG_MAX_CHARS = 128
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def new_batch_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class BatchJob:
    """One producer's batch. ``codes`` entries are UTF-8 (lone surrogates kept) or None
    for an entry that was neither a str nor a Snippet; the worker answers those with
    ``rejected``. ``inputs``: per snippet, its Snippet.inputs_record() (None for plain
    code), or None for a batch without inputs."""

    batch_id: str
    codes: tuple[bytes | None, ...]
    limits: Limits
    run: str = ""
    submitted_at: float = 0.0
    inputs: tuple[Any, ...] | None = None

    @classmethod
    def from_codes(
        cls, batch_id: str, codes: list[Any], limits: Limits, run: str, submitted_at: float
    ) -> BatchJob:
        encoded: list[bytes | None] = []
        records: list[dict[str, Any] | None] = []
        for code in codes:
            snippet = code if isinstance(code, Snippet) else None
            source = snippet.source if snippet is not None else code
            encoded.append(
                source.encode("utf-8", "surrogatepass") if isinstance(source, str) else None
            )
            records.append(snippet.inputs_record() if snippet is not None else None)
        inputs = tuple(records) if any(r is not None for r in records) else None
        return cls(batch_id, tuple(encoded), limits, run, submitted_at, inputs)

    def encode(self) -> bytes:
        record = {
            "v": SCHEMA_VERSION if self.inputs is None else INPUTS_SCHEMA_VERSION,
            "batch_id": self.batch_id,
            "codes": list(self.codes),
            "limits": codec.encode_limits(self.limits),
            "run": self.run,
            "submitted_at": self.submitted_at,
        }
        if self.inputs is not None:
            record["inputs"] = list(self.inputs)
        return codec.dumps(record)

    def snippet(self, index: int) -> Snippet | str:
        """What snippet ``index`` runs: its code, or a Snippet when it has inputs;
        WireError if they are malformed (that snippet is rejected, not the batch). Its
        code must not be None."""
        code = self.codes[index]
        assert code is not None
        source = code.decode("utf-8", "surrogatepass")
        record = None if self.inputs is None else self.inputs[index]
        return source if record is None else Snippet.from_record(source, record)

    @classmethod
    def decode(cls, data: Any) -> BatchJob:
        """Validate and decode; raise WireError saying what is wrong."""
        record, batch_id = _record(data, "batch payload")
        codes, run = record.get("codes"), record.get("run", "")
        if not isinstance(codes, list):
            raise WireError("codes must be a list")
        if not isinstance(run, str) or len(run) > RUN_TAG_MAX_CHARS:
            raise WireError(f"run must be a string of at most {RUN_TAG_MAX_CHARS} chars")
        submitted_at = record.get("submitted_at", 0.0)
        if not isinstance(submitted_at, (int, float)):
            raise WireError("submitted_at must be a number")
        inputs = record.get("inputs")
        if inputs is not None and (not isinstance(inputs, list) or len(inputs) != len(codes)):
            raise WireError("inputs must be a list as long as codes")
        return cls(
            batch_id=batch_id,
            codes=tuple(_code_bytes(c) for c in codes),
            limits=codec.decode_limits(record.get("limits")),
            run=run,
            submitted_at=float(submitted_at),
            inputs=None if inputs is None else tuple(inputs),
        )


def encode_announcement(batch_id: str) -> bytes:
    """The RQ job payload: which batch to join (the batch itself is in Redis)."""
    return codec.dumps({"v": SCHEMA_VERSION, "batch_id": batch_id})


def decode_announcement(data: Any) -> str:
    """The batch id an announcement names; WireError if it is not one."""
    return _record(data, "announcement")[1]


def _record(data: Any, what: str) -> tuple[dict[str, Any], str]:
    """A versioned msgpack map naming a valid batch id, and that id."""
    if not isinstance(data, bytes):
        raise WireError(f"{what} must be bytes, got {type(data).__name__}")
    record = codec.loads(data)
    if not isinstance(record, dict):
        raise WireError(f"{what} is not a map")
    if record.get("v") not in (SCHEMA_VERSION, INPUTS_SCHEMA_VERSION):
        raise WireError(
            f"{what} schema version {record.get('v')!r}, expected {SCHEMA_VERSION} "
            f"or {INPUTS_SCHEMA_VERSION}"
        )
    batch_id = record.get("batch_id")
    if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id):
        raise WireError("batch_id must be 1-64 characters of [A-Za-z0-9_-]")
    return record, batch_id


def peek_batch_id(data: Any) -> str | None:
    """The batch id of a payload too broken to decode, if it names a valid one."""
    try:
        record = codec.loads(data) if isinstance(data, bytes) else None
    except WireError:
        return None
    batch_id = record.get("batch_id") if isinstance(record, dict) else None
    return batch_id if isinstance(batch_id, str) and _BATCH_ID.fullmatch(batch_id) else None


def _code_bytes(code: Any) -> bytes | None:
    if isinstance(code, bytes):
        return code
    if isinstance(code, str):
        return code.encode("utf-8", "surrogatepass")
    return None
