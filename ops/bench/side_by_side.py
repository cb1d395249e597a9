"""How the side-by-side benches (executor.py, e2e.py) run their sides: every side open at
once, and each workload run on all of them back to back, round after round, so a burst of
load from elsewhere on the host skews a ratio's two sides alike, not just one.
"""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


W = TypeVar("W", bound=Named)
R = TypeVar("R")


def alternate(
    sides: dict[str, Callable[[W], R]], workloads: Sequence[W], rounds: int, crashed: list[str]
) -> Iterator[tuple[str, W, R]]:
    """``(side, workload, what it returned)`` for each workload, ``rounds`` times on every
    side in turn. A side that raises is dropped from ``sides`` and named in ``crashed``
    (its traceback printed); the others go on, so one broken side still leaves a table."""
    for workload in workloads:
        for _ in range(rounds):
            for label, run in list(sides.items()):
                try:
                    measured = run(workload)
                except Exception:
                    traceback.print_exc()
                    del sides[label]
                    crashed.append(label)
                    continue
                yield label, workload, measured
        print(f"{workload.name} done", file=sys.stderr, flush=True)


def print_interpreter_startup() -> None:
    """Printed with every table: a bare interpreter's start is the floor under every
    reference call, and it moves between installs (an editable install's import hook runs
    at every interpreter start), so a reader comparing runs should see it."""
    print(f"interpreter startup ({sys.executable}): {interpreter_startup_ms():.1f} ms")


def interpreter_startup_ms(samples: int = 5) -> float:
    """Median wall time of a bare ``python -B -c pass``: the floor under every reference call."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-B", "-c", "pass"], check=True)
        times.append(time.perf_counter() - started)
    return sorted(times)[samples // 2] * 1000
