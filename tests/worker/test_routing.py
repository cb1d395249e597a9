"""Plain snippets fork from the light zygote, the rest from the heavy one."""

from __future__ import annotations

import pytest

from codepool.common import counters
from codepool.worker import LocalExecutor
from codepool.worker.engine.routing import HEAVY, LIGHT, Router, imported_modules


def test_the_scan_finds_statement_imports_and_their_top_level_names() -> None:
    source = b"import os.path, numpy.linalg as la\nfrom sympy.abc import x\nfrom . import y\n"
    assert imported_modules(source) == {"os", "numpy", "sympy"}
    assert imported_modules(b"def f():\n    import json\n") == {"json"}
    assert imported_modules(b"x = (") is None


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        (b"print(2 + 3)", LIGHT),
        (b"import math, json\nprint(math.pi)", LIGHT),
        (b"from collections import Counter", LIGHT),
        (b"import numpy as np", HEAVY),
        (b"from sympy import symbols", HEAVY),  # preloaded
        (b"import scipy.linalg", HEAVY),  # not stdlib: third-party code pulls in numpy
        (b"import x = (", LIGHT),  # fails either way, sooner in the light one
        (b"m = __import__('numpy')", LIGHT),  # run-time imports still work there
    ],
)
def test_routing(source: bytes, kind: str) -> None:
    router = Router(["numpy", "sympy"])
    assert router.kind(source) == kind
    assert router.kind(source) == kind  # and from the cache


def test_each_snippet_runs_in_the_zygote_its_imports_need() -> None:
    with LocalExecutor(concurrency=2, preload=("numpy",)) as ex:
        assert len(ex.zygote_pids) == 2
        probe = "import sys\nprint('numpy' in sys.modules)"
        light = ex.run(probe)
        assert (light.zygote, light.stdout) == ("light", "False\n"), "the light image preloads"
        heavy = ex.run("import numpy, sys\nprint(numpy.arange(3).sum())")
        assert (heavy.zygote, heavy.stdout) == ("heavy", "3\n")
        late = ex.run("m = __import__('numpy')\nprint(m.arange(4).sum())")
        assert (late.zygote, late.status, late.stdout) == ("light", "ok", "6\n")
        results = ex.run_many([probe, "import numpy\nprint(1)"] * 10)
        assert [r.zygote for r in results] == ["light", "heavy"] * 10
        assert all(r.ok for r in results)
        totals = [counters.count(r) for r in results]
        assert sum(t.get("zygote_light", 0) for t in totals) == 10
        assert sum(t.get("zygote_heavy", 0) for t in totals) == 10


def test_one_zygote_when_asked_or_when_nothing_is_preloaded() -> None:
    with LocalExecutor(concurrency=1, preload=("numpy",), light_zygote=False) as ex:
        assert len(ex.zygote_pids) == 1
        assert ex.run("print(1)").zygote == "heavy"
    with LocalExecutor(concurrency=1, preload=()) as ex:
        assert len(ex.zygote_pids) == 1
        assert ex.run("print(1)").zygote == "heavy"
    with LocalExecutor(concurrency=1, mode="spawn") as ex:
        r = ex.run("print(1)")
        assert (r.ok, r.zygote) == (True, "")
