"""Plain snippets fork from the bare zygote (where the C set-up runs), others whose
imports are all stdlib from the light one, numpy-only ones from the mid one, the rest
from the heavy one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from codepool.common import counters
from codepool.common.snippet import Snippet
from codepool.worker import LocalExecutor
from codepool.worker.engine import native
from codepool.worker.engine.routing import BARE, HEAVY, LIGHT, MID, Router, imported_modules

# Where the C set-up was built, plain snippets go to the bare zygote, else the light one.
BARE_HERE = native.unavailable_here() is None
PLAIN = "bare" if BARE_HERE else "light"


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


def test_only_plain_requests_go_to_the_bare_zygote() -> None:
    router = Router(["numpy", "sympy"], mid=True, bare=True)
    assert router.kind(b"print(2 + 3)") == BARE
    assert router.kind(b"import math\nprint(math.pi)") == BARE
    assert router.kind(b"print(input())", plain=False) == LIGHT  # stdin, files, cells
    assert router.kind(b"import numpy", plain=False) == MID
    # Nothing preloaded: the heavy zygote is the light one.
    alone = Router([], light=False, bare=True)
    assert alone.kind(b"print(1)") == BARE
    assert alone.kind(b"print(1)", plain=False) == HEAVY
    assert alone.kind(b"import scipy") == HEAVY


def test_without_a_mid_zygote_numpy_goes_to_the_heavy_one() -> None:
    assert Router(["numpy", "sympy"]).kind(b"import numpy") == HEAVY
    assert Router(["numpy"], mid=True).kind(b"import numpy") == HEAVY  # nothing to split


def test_each_snippet_runs_in_the_zygote_its_imports_need() -> None:
    with LocalExecutor(concurrency=2, preload=("numpy",)) as ex:
        assert len(ex.zygote_pids) == 2 + BARE_HERE
        probe = "import sys\nprint('numpy' in sys.modules)"
        plain = ex.run(probe)
        assert (plain.zygote, plain.stdout) == (PLAIN, "False\n"), "that image preloads"
        light = ex.run(Snippet.make(probe, stdin=""))
        assert (light.zygote, light.stdout) == ("light", "False\n")
        heavy = ex.run("import numpy, sys\nprint(numpy.arange(3).sum())")
        assert (heavy.zygote, heavy.stdout) == ("heavy", "3\n")
        late = ex.run("m = __import__('numpy')\nprint(m.arange(4).sum())")
        assert (late.zygote, late.status, late.stdout) == (PLAIN, "ok", "6\n")
        results = ex.run_many([probe, "import numpy\nprint(1)"] * 10)
        assert [r.zygote for r in results] == [PLAIN, "heavy"] * 10
        assert all(r.ok for r in results)
        totals = [counters.count(r) for r in results]
        assert sum(t.get(f"zygote_{PLAIN}", 0) for t in totals) == 10
        assert sum(t.get("zygote_heavy", 0) for t in totals) == 10


@pytest.mark.skipif(not BARE_HERE, reason="the C set-up was not built here")
def test_the_bare_image_holds_no_set_up_machinery_and_keeps_the_limits() -> None:
    with LocalExecutor(concurrency=1, preload=()) as ex:
        probe = "import sys\nprint(sorted({'ctypes', 'msgpack', 'dataclasses'} & set(sys.modules)))"
        bare = ex.run(probe)
        assert (bare.zygote, bare.stdout) == ("bare", "[]\n"), bare
        light = ex.run(Snippet.make(probe, stdin=""))  # the heavy one stands in for light
        assert light.zygote == "heavy" and light.stdout != "[]\n"
        # The memory limit counts from the bare image's own address space.
        hog = ex.run("x = bytearray(300 << 20)\nprint(len(x))", memory_mb=256)
        assert (hog.zygote, hog.status) == ("bare", "memory"), hog
        fits = ex.run("x = bytearray(200 << 20)\nprint(len(x))", memory_mb=256)
        assert (fits.zygote, fits.stdout) == ("bare", f"{200 << 20}\n"), fits
        # Each child reseeds nothing and still draws its own numbers.
        draws = {ex.run("import random\nprint(random.random())").stdout for _ in range(5)}
        assert len(draws) == 5


def test_numpy_snippets_fork_from_an_image_without_sympy() -> None:
    with LocalExecutor(concurrency=2, preload=("numpy", "sympy")) as ex:
        assert len(ex.zygote_pids) == 3 + BARE_HERE
        probe = "import sys\nprint('numpy' in sys.modules, 'sympy' in sys.modules)"
        kinds = {
            probe: (PLAIN, "False False\n"),
            "import numpy\n" + probe: ("mid", "True False\n"),
            "import numpy, sympy\n" + probe: ("heavy", "True True\n"),
            "import sympy\n" + probe: ("heavy", "True True\n"),
        }
        results = ex.run_many(list(kinds) * 3)
        assert [(r.zygote, r.stdout) for r in results] == list(kinds.values()) * 3
        late = ex.run("import numpy\nm = __import__('sympy')\nprint(m.Integer(6) / 4)")
        assert (late.zygote, late.status, late.stdout) == ("mid", "ok", "3/2\n")
        totals = [counters.count(r) for r in results]
        assert [sum(t.get(f"zygote_{k}", 0) for t in totals) for k in (PLAIN, "mid", "heavy")] == [
            3,
            3,
            6,
        ]
        merged = {field: sum(t.get(field, 0) for t in totals) for field in counters.FIELDS}
        assert counters.metrics(merged)["sandbox/mid_zygote_share"] == 0.25


def test_one_zygote_when_asked_and_the_bare_one_beside_an_image_without_preload() -> None:
    with LocalExecutor(concurrency=1, preload=("numpy",), light_zygote=False) as ex:
        assert len(ex.zygote_pids) == 1
        assert ex.run("print(1)").zygote == "heavy"
    with LocalExecutor(concurrency=1, preload=(), native_child=False) as ex:
        assert len(ex.zygote_pids) == 1
        assert ex.run("print(1)").zygote == "heavy"
    with LocalExecutor(concurrency=1, preload=()) as ex:
        assert len(ex.zygote_pids) == 1 + BARE_HERE
        assert ex.run("print(1)").zygote == PLAIN.replace("light", "heavy")
        assert ex.run(Snippet.make("print(1)", stdin="")).zygote == "heavy"
    with LocalExecutor(concurrency=1, mode="spawn") as ex:
        r = ex.run("print(1)")
        assert (r.ok, r.zygote) == (True, "")


def test_every_zygote_starts_where_the_c_extension_was_not_built() -> None:
    """Without a compiler at install time there is no _nativechild: the zygote and the
    supervisor still import (and say why there is no C set-up)."""
    blocked = (
        "import sys\n"
        "sys.modules['codepool.worker.engine._nativechild'] = None\n"
        "from codepool.worker.engine import bare, native, supervisor, zygote\n"
        "print(native.unavailable_here())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "not built" in out.stdout
