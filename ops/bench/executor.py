"""Side-by-side benchmark: the reference subprocess sandbox vs codepool's LocalExecutor.

Every workload goes through every executor in one run, so the ratios in the table come from
the same machine in the same minute. This is a report, not a test: it exits 0 whatever the
numbers say, and non-zero only when an executor raised.

    python ops/bench/executor.py [--concurrency 2] [--scale 1.0] [--rounds 3]
                                 [--modes reference,spawn,fork,fork-1z,fork-py]
    python -m codepool.ops.bench.executor

Each workload runs ``--rounds`` times on every executor, alternating; the table shows the
median of the rounds, and each ratio is the median of the per-round ratios. ``cpu ms`` is
CPU per snippet of the whole executor tree (supervisor, zygotes and every child; for the
reference, its child interpreters), ``caller ms`` that of the calling process (the
client, or the reference's threads). ``fork-1z`` is fork mode with the light zygote off,
so the table shows what routing plain snippets to it saves; ``fork-py`` fork mode with
children set up by the Python steps instead of the C extension (what a host without a
compiler at install time gets).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import IO, Any, Protocol, Self

from codepool.common import ExecResult
from codepool.common.quantile import nearest_rank
from codepool.ops.bench.side_by_side import alternate, print_interpreter_startup

PRINT_CODE = "print(2 + 3)"
NUMPY_CODE = (
    "import numpy as np\n"
    "a = np.arange(1000).reshape(10, 100)\n"
    "print(int(a.sum()), float(np.linalg.norm(a[:3, :3])))"
)
SYMPY_CODE = "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 5*x + 6, x))"
SPIN_CODE = "while True: pass"

MODES = ("reference", "spawn", "fork", "fork-1z", "fork-py")
# (workload, minimum fork-vs-reference throughput ratio) checked in the targets section.
THROUGHPUT_TARGETS = (("print", 8.0), ("numpy", 20.0), ("sympy", 30.0))
LONE_FORK_P50_TARGET_MS = 2.5
PRINT_CPU_TARGET_MS = 2.5


class Runner(Protocol):
    """What the bench needs from an executor; codepool's LocalExecutor satisfies it as is."""

    def run(self, code: str, *, timeout_s: float) -> ExecResult: ...

    def run_many(self, codes: Sequence[str], *, timeout_s: float) -> list[ExecResult]: ...


class ReferenceExecutor:
    """The pre-codepool LocalPythonSandbox approach, kept here as the yardstick.

    One fresh ``python -B -c`` per snippet, outputs through temp files, a semaphore of 8
    in front and a 64-thread pool behind it, so the semaphore is the only limit.
    """

    def __init__(
        self, *, max_parallel: int = 8, pool_threads: int = 64, max_output_chars: int = 4096
    ) -> None:
        self._slots = threading.Semaphore(max_parallel)
        self._pool = ThreadPoolExecutor(max_workers=pool_threads, thread_name_prefix="ref")
        self._max_output_chars = max_output_chars
        # Same single-threaded BLAS as codepool's children, so numpy timings compare fairly.
        self._env = {
            **os.environ,
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        # A private cwd keeps the snippet's `import x` from picking up whatever sits in ours.
        self._workdir = tempfile.TemporaryDirectory(prefix="codepool-bench-ref-")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True)
        self._workdir.cleanup()

    def run(self, code: str, *, timeout_s: float) -> ExecResult:
        """Run one snippet; ``latency`` includes the wait for a semaphore slot, as seen."""
        started = time.perf_counter()
        with self._slots:
            result = self._execute(code, timeout_s)
        return result.replace(latency=time.perf_counter() - started)

    def run_many(self, codes: Sequence[str], *, timeout_s: float) -> list[ExecResult]:
        futures = [self._pool.submit(self.run, code, timeout_s=timeout_s) for code in codes]
        return [future.result() for future in futures]

    def _execute(self, code: str, timeout_s: float) -> ExecResult:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            # No preexec_fn: this runs on pool threads, and Python code between fork and exec
            # in a threaded process can deadlock. So the CPU limit is set from outside with
            # prlimit right after the spawn (a fast snippet may finish first; that is fine).
            proc = subprocess.Popen(
                [sys.executable, "-B", "-c", code],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=self._workdir.name,
                env=self._env,
                start_new_session=True,
            )
            _limit_cpu(proc.pid, math.ceil(timeout_s) + 5)
            try:
                # Faithful to subprocess.run(timeout=): on 3.11 this polls with doubling
                # sleeps, so a ~35 ms child is noticed at ~64 ms. Part of what was replaced.
                returncode: int | None = proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                # start_new_session made the child a group leader: kill what it started too.
                _kill_group(proc.pid)
                proc.wait()
                returncode, timed_out = None, True
            stdout = _read_tail(out, self._max_output_chars)
            stderr = _read_tail(err, self._max_output_chars)
        return ExecResult(
            ok=returncode == 0 and not timed_out,
            stdout=stdout,
            stderr=stderr,
            returncode=returncode,
            timed_out=timed_out,
            latency=0.0,  # set by run(), which also sees the semaphore wait
            status=_status(returncode, timed_out),
        )


def _limit_cpu(pid: int, cpu_s: int) -> None:
    try:
        resource.prlimit(pid, resource.RLIMIT_CPU, (cpu_s, cpu_s))
    except (ProcessLookupError, PermissionError):
        pass  # already exited; the wall timer covers the rest


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_tail(file: IO[bytes], max_chars: int) -> str:
    file.seek(0)
    text = file.read().decode("utf-8", errors="replace")
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    return f"[... truncated {cut} chars ...]\n" + text[cut:]


def _status(returncode: int | None, timed_out: bool) -> str:
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    return "signal" if returncode is not None and returncode < 0 else "error"


@dataclass(frozen=True)
class Workload:
    name: str
    codes: tuple[str, ...]
    expected: tuple[str, ...]  # the status each snippet must come back with
    timeout_s: float
    sequential: bool = False  # one `run` at a time instead of one `run_many`


@dataclass(frozen=True)
class Measurement:
    n: int
    wall_s: float
    p50_ms: float
    p95_ms: float
    bad: int
    sequential: bool
    cpu_ms: float = math.nan  # per snippet, the executor's whole process tree
    caller_ms: float = math.nan  # per snippet, the calling process

    @property
    def throughput(self) -> float:
        return self.n / self.wall_s if self.wall_s > 0 else math.inf


def build_workloads(scale: float) -> list[Workload]:
    def count(base: int) -> int:
        return max(1, round(base * scale))

    def same(name: str, code: str, n: int, *, sequential: bool = False) -> Workload:
        return Workload(name, (code,) * n, ("ok",) * n, 5.0, sequential)

    n_mix = count(100)
    n_spin = max(1, round(n_mix * 0.05))
    # Spread the spinners out so they overlap fast snippets rather than each other.
    spin_at = {int((k + 0.5) * n_mix / n_spin) for k in range(n_spin)}
    mix = tuple(SPIN_CODE if i in spin_at else PRINT_CODE for i in range(n_mix))
    return [
        same("print", PRINT_CODE, count(200)),
        same("numpy", NUMPY_CODE, count(60)),
        same("sympy", SYMPY_CODE, count(30)),
        Workload(
            "mix-5%-timeout",
            mix,
            tuple("timeout" if code == SPIN_CODE else "ok" for code in mix),
            1.0,
        ),
        same("lone", PRINT_CODE, count(50), sequential=True),
    ]


def measure(runner: Runner, workload: Workload, label: str) -> Measurement:
    tree_before, caller_before = _tree_cpu(runner), _own_cpu()
    started = time.perf_counter()
    if workload.sequential:
        results = [runner.run(code, timeout_s=workload.timeout_s) for code in workload.codes]
    else:
        results = runner.run_many(list(workload.codes), timeout_s=workload.timeout_s)
    wall_s = time.perf_counter() - started
    n = len(workload.codes)
    cpu_ms = (_tree_cpu(runner) - tree_before) / n * 1000
    caller_ms = (_own_cpu() - caller_before) / n * 1000
    if len(results) != len(workload.codes):
        raise RuntimeError(f"{label}: {len(results)} results for {len(workload.codes)} snippets")
    pairs = enumerate(zip(results, workload.expected, strict=True))
    mismatched = [(i, r) for i, (r, want) in pairs if r.status != want]
    if mismatched:
        # One sample is enough to tell a broken executor from a slow one.
        i, r = mismatched[0]
        print(
            f"  {label} {workload.name}: {len(mismatched)} unexpected, e.g. #{i} "
            f"status={r.status} rc={r.returncode} stderr={r.stderr[-200:]!r}",
            file=sys.stderr,
        )
    latencies = sorted(r.latency for r in results)
    return Measurement(
        n=len(results),
        wall_s=wall_s,
        p50_ms=nearest_rank(latencies, 0.50) * 1000,
        p95_ms=nearest_rank(latencies, 0.95) * 1000,
        bad=len(mismatched),
        sequential=workload.sequential,
        cpu_ms=cpu_ms,
        caller_ms=caller_ms,
    )


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tree_cpu(runner: Runner) -> float:
    if isinstance(runner, ReferenceExecutor):
        # Its interpreters are this process's children, reaped by the time run returns;
        # codepool's supervisor, also a child, is reaped only when the bench ends.
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime
    if hasattr(runner, "supervisor_pid"):
        return tree_cpu_s(runner)
    return math.nan  # a remote executor: its tree is another host's


def open_executor(mode: str, concurrency: int) -> AbstractContextManager[Runner]:
    if mode == "reference":
        return ReferenceExecutor()
    # Imported late so `--modes reference` runs before (or without) a working worker package.
    from codepool.worker import LocalExecutor

    if mode == "spawn":
        return LocalExecutor(concurrency=concurrency, mode="spawn")
    return LocalExecutor(
        concurrency=concurrency,
        mode="fork",
        preload=("numpy", "sympy"),
        light_zygote=mode != "fork-1z",
        native_child=mode != "fork-py",
    )


def warm_up(runner: Runner) -> None:
    # First calls pay for page cache, zygote preloads and lazy imports; none of that is
    # what the table is about.
    runner.run_many([PRINT_CODE, NUMPY_CODE, SYMPY_CODE] * 5, timeout_s=5.0)
    runner.run(PRINT_CODE, timeout_s=5.0)


def ratio_vs_reference(m: Measurement, ref: Measurement | None) -> float | None:
    if ref is None:
        return None
    if m.sequential:
        # A lone call is about latency, so "faster" means a smaller p50.
        return ref.p50_ms / m.p50_ms if m.p50_ms > 0 else math.inf
    return m.throughput / ref.throughput


# Every round's measurement of (workload, executor).
Results = dict[tuple[str, str], list[Measurement]]


def _median(rounds: Sequence[Measurement], value: Callable[[Measurement], float]) -> float:
    return statistics.median(value(m) for m in rounds)


def median_of_ratios(
    rounds: Sequence[Measurement] | None, refs: Sequence[Measurement] | None
) -> float | None:
    """The median over rounds of each round's ratio against that round's reference."""
    if not rounds or not refs:
        return None
    ratios = [ratio_vs_reference(m, ref) for m, ref in zip(rounds, refs, strict=False)]
    return statistics.median(r for r in ratios if r is not None)


def median_ratio(results: Results, workload: str, mode: str) -> float | None:
    return median_of_ratios(results.get((workload, mode)), results.get((workload, "reference")))


def print_table(workloads: Sequence[Workload], modes: Sequence[str], results: Results) -> None:
    header = (
        f"{'workload':<16}{'executor':<11}{'n':>5}{'wall s':>9}{'snip/s':>9}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'bad':>5}{'cpu ms':>8}{'caller ms':>11}{'x ref':>8}"
    )
    print(header)
    print("-" * len(header))
    for workload in workloads:
        for mode in modes:
            rounds = results.get((workload.name, mode))
            if not rounds:
                print(f"{workload.name:<16}{mode:<11}{'(no result: executor failed)':>54}")
                continue
            ratio = None if mode == "reference" else median_ratio(results, workload.name, mode)
            ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
            print(
                f"{workload.name:<16}{mode:<11}{rounds[0].n:>5}"
                f"{_median(rounds, lambda m: m.wall_s):>9.2f}"
                f"{_median(rounds, lambda m: m.throughput):>9.1f}"
                f"{_median(rounds, lambda m: m.p50_ms):>9.1f}"
                f"{_median(rounds, lambda m: m.p95_ms):>9.1f}"
                f"{sum(m.bad for m in rounds):>5}"
                f"{_median(rounds, lambda m: m.cpu_ms):>8.2f}"
                f"{_median(rounds, lambda m: m.caller_ms):>11.2f}{ratio_text:>8}"
            )
    print(
        "medians of the rounds; x ref: median of the per-round throughput ratios (for "
        "'lone', reference p50 / executor p50). p50/p95 from ExecResult.latency (reference: "
        "per-call wall time incl. semaphore wait); bad sums the rounds."
    )


def print_targets(results: Results) -> None:
    print("\ntargets")
    for name, need in THROUGHPUT_TARGETS:
        ratio = median_ratio(results, name, "fork")
        label = f"fork >= {need:g}x ref on {name}"
        if ratio is None:
            print(f"  SKIP  {label} (needs fork and reference)")
            continue
        print(f"  {'PASS' if ratio >= need else 'FAIL'}  {label}: {ratio:.2f}x")
    _median_target(
        results.get(("print", "fork")),
        lambda m: m.cpu_ms,
        PRINT_CPU_TARGET_MS,
        f"fork print <= {PRINT_CPU_TARGET_MS:g} ms CPU per snippet (whole tree)",
    )
    _median_target(
        results.get(("lone", "fork")),
        lambda m: m.p50_ms,
        LONE_FORK_P50_TARGET_MS,
        f"lone fork p50 <= {LONE_FORK_P50_TARGET_MS:g} ms",
    )


def _median_target(
    rounds: list[Measurement] | None,
    value: Callable[[Measurement], float],
    most: float,
    label: str,
) -> None:
    """PASS/FAIL for a median over rounds that must stay at or under ``most`` ms."""
    if not rounds:
        print(f"  SKIP  {label} (needs fork)")
        return
    median = _median(rounds, value)
    print(f"  {'PASS' if median <= most else 'FAIL'}  {label}: {median:.2f} ms")


LAYER_TARGET_MS = 0.3
LAYER_SNIPPETS = 300


def tree_cpu_s(executor: Any) -> float:
    """CPU seconds of an executor's supervisor and zygote, and of every child the
    supervisor reaped (children are the supervisor's: the zygote clones with
    CLONE_PARENT)."""
    total = 0.0
    pids = [(executor.supervisor_pid, 4)] + [(pid, 2) for pid in executor.zygote_pids]
    for pid, fields in pids:
        with open(f"/proc/{pid}/stat") as f:
            values = f.read().rsplit(")", 1)[1].split()
        # utime stime cutime cstime are fields 14-17: 11-14 after the command.
        total += sum(int(v) for v in values[11 : 11 + fields])
    return total / os.sysconf("SC_CLK_TCK")


def print_layer_cost(concurrency: int) -> None:
    """CPU per print snippet of the whole executor tree, with and without the second
    layer (Landlock and seccomp), alternating three pairs; the median difference is its cost."""
    from codepool.worker import LocalExecutor

    codes = [PRINT_CODE] * LAYER_SNIPPETS
    per_snippet: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(3):
        for layer in (True, False):
            with LocalExecutor(concurrency=concurrency, preload=(), landlock=layer) as ex:
                ex.run_many(codes[:20], timeout_s=5.0)
                before = tree_cpu_s(ex)
                ex.run_many(codes, timeout_s=5.0)
                per_snippet[layer].append((tree_cpu_s(ex) - before) / len(codes) * 1000)
    on, off = statistics.median(per_snippet[True]), statistics.median(per_snippet[False])
    pairs = [a - b for a, b in zip(per_snippet[True], per_snippet[False], strict=True)]
    cost = statistics.median(pairs)
    verdict = "PASS" if cost < LAYER_TARGET_MS else "FAIL"
    print(
        f"\nsecond layer (Landlock + seccomp) on print(2 + 3) x{LAYER_SNIPPETS}, no preload, "
        f"CPU of the whole executor tree per snippet: {on:.2f} ms with, {off:.2f} ms without"
    )
    print(f"  {verdict}  second layer costs < {LAYER_TARGET_MS} ms CPU per snippet: {cost:.3f} ms")


def _measure_as(runner: Runner, mode: str, workload: Workload) -> Measurement:
    return measure(runner, workload, mode)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, default=2, help="codepool slots (default 2)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiplier on snippet counts (default 1.0)"
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated subset of %(default)s"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per workload (default 3)")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown or not args.modes:
        parser.error(f"--modes must be a non-empty subset of {','.join(MODES)}; got {unknown}")
    if args.concurrency < 1 or args.scale <= 0 or args.rounds < 1:
        parser.error("--concurrency and --rounds must be >= 1 and --scale > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = build_workloads(args.scale)
    print(
        f"codepool executor bench: python {platform.python_version()}, {os.cpu_count()} cpus, "
        f"codepool concurrency={args.concurrency}, reference=Semaphore(8)+64 threads, "
        f"scale={args.scale:g}, rounds={args.rounds}"
    )
    print_interpreter_startup()
    results: Results = {}
    crashed: list[str] = []
    with ExitStack() as stack:
        # All executors stay open: see side_by_side.py.
        sides: dict[str, Callable[[Workload], Measurement]] = {}
        for mode in args.modes:
            try:
                runner = stack.enter_context(open_executor(mode, args.concurrency))
                warm_up(runner)
            except Exception:
                traceback.print_exc()
                crashed.append(mode)
                continue
            sides[mode] = functools.partial(_measure_as, runner, mode)
        for mode, workload, measured in alternate(sides, workloads, args.rounds, crashed):
            results.setdefault((workload.name, mode), []).append(measured)
        # Printed before the executors close, so a failure on close cannot hide the table.
        print()
        print_table(workloads, args.modes, results)
        print_targets(results)
    if "fork" in args.modes and not crashed:
        print_layer_cost(args.concurrency)
    if crashed:
        print(f"\nexecutor(s) crashed: {', '.join(crashed)}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
