"""One child contract: every constant the C set-up and the Python set-up share is
defined once (worker/engine/contract.py), and the built C module agrees with it."""

from __future__ import annotations

import struct

import pytest

from codepool.common.limits import Limits
from codepool.worker.engine import child, contract, done, native


def test_the_c_module_defines_every_shared_constant_as_contract_py_does() -> None:
    if native._module is None:
        pytest.skip("the C extension was not built here (no compiler at install time)")
    # Exact equality: a constant changed by hand on either side fails here.
    assert native._module.CONTRACT == contract.SHARED
    assert native.contract_differences() == []
    assert native.unavailable_here() is None


def test_a_build_that_disagrees_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    if native._module is None:
        pytest.skip("the C extension was not built here (no compiler at install time)")
    changed = {**native._module.CONTRACT, "DONE_FD": contract.DONE_FD + 1}
    monkeypatch.setattr(native._module, "CONTRACT", changed, raising=False)
    why = native.unavailable_here()
    assert why is not None and "DONE_FD" in why and "stale build" in why


@pytest.mark.parametrize("side", ["C", "Python"])
def test_a_header_offset_changed_on_either_side_is_refused_by_name(
    side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if native._module is None:
        pytest.skip("the C extension was not built here (no compiler at install time)")
    moved = contract.HEAD_OFFSETS["HEAD_MAX_PROCS"] + 1
    if side == "C":
        changed = {**native._module.CONTRACT, "HEAD_MAX_PROCS": moved}
        monkeypatch.setattr(native._module, "CONTRACT", changed, raising=False)
    else:
        monkeypatch.setitem(contract.SHARED, "HEAD_MAX_PROCS", moved)
    why = native.unavailable_here()
    assert why is not None and "HEAD_MAX_PROCS" in why and "stale build" in why


def test_each_header_offset_names_the_field_the_python_side_packs_there() -> None:
    """Read back as the C set-up reads them (an "I" as four bytes at its offset, a "B"
    as one), the fields of a request child.py packed hold what they are named after."""
    limits = Limits(cpu_s=9, memory_mb=300, max_procs=11, max_file_mb=5, auto_print=True)
    code = b"print(1)"
    data = child.ChildRequest.encode(code, limits, context=True)  # inputs: extra_len > 0
    expected = {
        "HEAD_CODE_LEN": len(code),
        "HEAD_EXTRA_LEN": len(data) - contract.HEAD_SIZE - len(code),
        "HEAD_CPU_S": limits.cpu_rlimit_s,
        "HEAD_MEMORY_MB": 300,
        "HEAD_MAX_FILE_MB": 5,
        "HEAD_MAX_PROCS": 11,
        "HEAD_AUTO_PRINT": 1,
        "HEAD_RICH_TRACEBACKS": 0,
    }
    assert len(set(expected.values())) == len(expected)  # a field read at another's fails
    codes = contract.HEAD_FORMAT[1:]
    assert contract.HEAD_FORMAT[0] == "!"
    got = {
        name: struct.unpack_from("!" + code, data, offset)[0]
        for code, (name, offset) in zip(codes, contract.HEAD_OFFSETS.items(), strict=True)
    }
    assert got == expected


def test_the_python_side_packs_what_the_contract_says() -> None:
    assert struct.calcsize(contract.HEAD_FORMAT) == contract.HEAD_SIZE == child._HEAD.size
    assert struct.calcsize(contract.DONE_FORMAT) == contract.DONE_SIZE == done._NOTICE.size
    assert len(contract.READY) == 1
    assert contract.SHARED["READY"] == contract.READY[0]
    assert len({contract.REQUEST_FD, contract.DONE_FD, contract.RECORD_FD}) == 3
