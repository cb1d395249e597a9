"""One child contract: every constant the C set-up and the Python set-up share is
defined once (worker/engine/contract.py), and the built C module agrees with it."""

from __future__ import annotations

import struct

import pytest

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


def test_the_python_side_packs_what_the_contract_says() -> None:
    assert struct.calcsize(contract.HEAD_FORMAT) == contract.HEAD_SIZE == child._HEAD.size
    assert struct.calcsize(contract.DONE_FORMAT) == contract.DONE_SIZE == done._NOTICE.size
    assert len(contract.READY) == 1
    assert contract.SHARED["READY"] == contract.READY[0]
    assert len({contract.REQUEST_FD, contract.DONE_FD, contract.RECORD_FD}) == 3
