"""First calls the zygote makes after preloading, so children do not pay for them.

Many libraries import submodules and fill caches on first use: sympy's first ``solve``
costs ~40 ms and the next ~2 ms; numpy's first ``default_rng`` ~15 ms. Making those
calls once in the zygote means every forked child starts with them done. This is
codepool's own code with fixed inputs, never user code; what it leaves behind (imported
modules, cache entries) is identical in every child.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def _numpy() -> None:
    np = importlib.import_module("numpy")
    np.linalg.inv(np.eye(3) + 1)
    np.linalg.norm(np.arange(9.0).reshape(3, 3))
    np.random.default_rng(0).random(3)
    np.fft.fft(np.ones(8))
    np.roots([1, -3, 2])
    np.array2string(np.arange(3.0))


def _sympy() -> None:
    sp = importlib.import_module("sympy")
    x = sp.Symbol("x")
    sp.solve(x**2 - 5 * x + 6, x)
    sp.solveset(x**2 - 4, x)
    sp.sympify("x**2 + 3*x")
    sp.simplify(sp.sin(x) ** 2 + sp.cos(x) ** 2)
    sp.factor(x**3 - 1)
    sp.integrate(x**2 * sp.exp(x), x)
    sp.diff(sp.sin(x) * x, x)
    sp.limit(sp.sin(x) / x, x, 0)
    sp.series(sp.exp(x), x, 0, 4)
    sp.nsolve(x**2 - 2, x, 1)
    sp.Matrix([[1, 2], [3, 4]]).det()


WARMUPS: dict[str, Callable[[], None]] = {"numpy": _numpy, "sympy": _sympy}


def warm_up(modules: list[str]) -> list[str]:
    """Run the warm-ups of the modules that have one; returns the ones that ran."""
    done = []
    for name in modules:
        warm = WARMUPS.get(name)
        if warm is None:
            continue
        try:
            warm()
        except Exception:  # an odd library version must not stop the pool
            continue
        done.append(name)
    return done
