"""Plain snippets fork from the light zygote, numpy-only ones from the mid one, the rest
from the heavy one."""

from __future__ import annotations

import pytest

from codepool.common import counters
from codepool.worker import LocalExecutor
from codepool.worker.engine.routing import HEAVY, LIGHT, MID, Router, imported_modules


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
        (b"import numpy as np", MID),  # the first preloaded module alone
        (b"import math\nfrom numpy.linalg import norm", MID),
        (b"import numpy\nimport sympy", HEAVY),
        (b"from sympy import symbols", HEAVY),  # preloaded
        (b"import scipy.linalg", HEAVY),  # not stdlib: third-party code pulls in numpy
        (b"import numpy, scipy", HEAVY),
        (b"import x = (", LIGHT),  # fails either way, sooner in the light one
        (b"m = __import__('numpy')", LIGHT),  # run-time imports still work there
    ],
)
def test_routing(source: bytes, kind: str) -> None:
    router = Router(["numpy", "sympy"], mid=True)
    assert router.kind(source) == kind
    assert router.kind(source) == kind  # and from the cache


def test_without_a_mid_zygote_numpy_goes_to_the_heavy_one() -> None:
    assert Router(["numpy", "sympy"]).kind(b"import numpy") == HEAVY
    assert Router(["numpy"], mid=True).kind(b"import numpy") == HEAVY  # nothing to split


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


def test_numpy_snippets_fork_from_an_image_without_sympy() -> None:
    with LocalExecutor(concurrency=2, preload=("numpy", "sympy")) as ex:
        assert len(ex.zygote_pids) == 3
        probe = "import sys\nprint('numpy' in sys.modules, 'sympy' in sys.modules)"
        kinds = {
            probe: ("light", "False False\n"),
            "import numpy\n" + probe: ("mid", "True False\n"),
            "import numpy, sympy\n" + probe: ("heavy", "True True\n"),
            "import sympy\n" + probe: ("heavy", "True True\n"),
        }
        results = ex.run_many(list(kinds) * 3)
        assert [(r.zygote, r.stdout) for r in results] == list(kinds.values()) * 3
        late = ex.run("import numpy\nm = __import__('sympy')\nprint(m.Integer(6) / 4)")
        assert (late.zygote, late.status, late.stdout) == ("mid", "ok", "3/2\n")
        totals = [counters.count(r) for r in results]
        assert [
            sum(t.get(f"zygote_{k}", 0) for t in totals) for k in ("light", "mid", "heavy")
        ] == [
            3,
            3,
            6,
        ]
        merged = {field: sum(t.get(field, 0) for t in totals) for field in counters.FIELDS}
        assert counters.metrics(merged)["sandbox/mid_zygote_share"] == 0.25


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
