"""The msgpack codec: round trips, version checks, clear errors, no pickle."""

from __future__ import annotations

import pickle

import pytest

from codepool.common import ConfigError, ExecResult, Limits, WireError, codec


def test_result_round_trip() -> None:
    result = ExecResult(
        ok=False,
        stdout="é\n",
        stderr="x",
        returncode=None,
        timed_out=True,
        latency=1.5,
        status="timeout",
        truncated=True,
        worker="h:1",
        limit="wall_time",
    )
    data = codec.encode_result(result)
    assert codec.decode_result(data) == result
    with pytest.raises(pickle.UnpicklingError):  # msgpack, not a pickle stream
        pickle.loads(data)


def test_results_of_older_and_newer_workers_decode() -> None:
    # A worker from before ExecResult.limit writes no such field: no limit named.
    record = ExecResult(False, "", "e", 1, False, 0.1, status="error").to_dict()
    del record["limit"]
    older = codec.decode_result(codec.dumps({**record, "v": codec.RESULT_SCHEMA_VERSION}))
    assert older.status == "error" and older.limit is None
    # A field this version does not know is left out, as an older producer leaves limit.
    newer = codec.decode_result(codec.dumps({**record, "v": 1, "later_field": 1}))
    assert newer == older


def test_bad_payloads_raise_wire_error() -> None:
    with pytest.raises(WireError):
        codec.loads(b"\xc1")
    with pytest.raises(WireError):
        codec.decode_result(codec.dumps({"v": 999}))
    with pytest.raises(WireError):
        codec.decode_result(codec.dumps([1, 2]))
    with pytest.raises(WireError):
        codec.decode_limits({"timeout_s": "soon"})
    with pytest.raises(WireError):
        codec.decode_limits({"bogus": 1})
    with pytest.raises(WireError):
        codec.dumps(object())


def test_serializer_protocol() -> None:
    payload = ["codepool.worker.job.run_batch", None, [b"x"], {"k": 1}]
    assert codec.MsgpackSerializer.loads(codec.MsgpackSerializer.dumps(payload)) == payload


def test_limits_validation_and_clamp() -> None:
    assert Limits().effective_cpu_s == 35.0
    with pytest.raises(ConfigError):
        Limits(timeout_s=0)
    with pytest.raises(ConfigError):
        Limits(memory_mb=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Limits(auto_print=1)  # type: ignore[arg-type]
    asked = Limits(timeout_s=100, memory_mb=64, max_output_chars=10_000)
    clamped = asked.clamp(Limits(timeout_s=10))
    assert (clamped.timeout_s, clamped.memory_mb, clamped.max_output_chars) == (10, 64, 4096)
    assert clamped.effective_cpu_s == 15.0
    assert Limits.from_dict(asked.to_dict()) == asked
