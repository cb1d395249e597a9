"""``codepool replay IN -o OUT.jsonl``: replay a rollout batch, embedded by default.

Stopping: the first SIGTERM or SIGINT submits no further batch; results of the one
running are still written until the drain deadline (less the time the embedded pool
takes to stop), then the replay stops, says how far it got and exits 128 + the signal's
number (143, 130); a second signal stops it at once. Every line written is whole (or
cut on the next run), so running it again resumes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from contextlib import ExitStack
from types import FrameType
from typing import TextIO

from codepool.common.error_types import ranked
from codepool.common.errors import CodepoolError
from codepool.common.settings import Settings
from codepool.ops.arguments import add_drain_argument, add_rich_tracebacks, add_slots_argument
from codepool.ops.embedded import STOP_S, url_or_embedded
from codepool.ops.report import write_report
from codepool.producer.pool import CodePool
from codepool.producer.replay import ReplaySummary, replay
from codepool.producer.rollout_files import check_readable

SHOWN_PROBLEMS = 20  # skipped lines and unreadable answers printed one by one
SHOWN_ERROR_TYPES = 10  # rows of the error-type table; the rest are summed as "other"
NAME_CHARS = 48  # longer error-type names are shortened in the table


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "replay",
        help="replay a saved rollout batch (JSONL or Parquet) and write one line per code call",
    )
    parser.add_argument(
        "input",
        help="JSONL (or .parquet rows of the same shape): records with 'code', or chat 'messages'",
    )
    parser.add_argument("-o", "--output", required=True, help="JSONL results (appended, resumed)")
    parser.add_argument(
        "--url",
        default=None,
        help="Redis URL of a running pool (default $REDIS_URL; without either, "
        "a private Redis and a local worker are started and stopped)",
    )
    add_slots_argument(parser, "-c", "--concurrency", what="slots of the embedded worker")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    parser.add_argument("--run", default="replay", help="run tag for the stats")
    parser.add_argument("--report", default=None, help="write an HTML report here")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="compare each observation with the one recorded in the input "
        "(adds 'recorded' and 'match' to each line)",
    )
    add_rich_tracebacks(parser)
    add_drain_argument(
        parser,
        "submits no further batch and writes the results of the one running until the "
        "deadline (less 2 s to stop the embedded pool, if any), then exits 128 + the "
        "signal's number; run it again to resume",
    )
    parser.set_defaults(handler=run_command)


class Stopped(Exception):
    """Raised in the main thread when a stopping replay's drain deadline passes."""


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """SIGTERM and SIGINT while a replay runs: the first starts the drain, a second (or
    the drain's deadline, which a timer thread signals to the main thread as another
    SIGTERM) raises Stopped there. ``restore`` puts the caller's handlers back."""

    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.received: list[int] = []
        self._deadline: threading.Timer | None = None
        self._saved = {signum: signal.signal(signum, self._on_signal) for signum in STOP_SIGNALS}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) > 1 or self.drain_s <= 0:
            raise Stopped
        main = threading.main_thread().ident
        assert main is not None
        self._deadline = threading.Timer(self.drain_s, signal.pthread_kill, (main, signal.SIGTERM))
        self._deadline.daemon = True
        self._deadline.start()

    def stopping(self) -> bool:
        return bool(self.received)

    def settle(self) -> None:
        """From here on (stopping the pool, bounded) signals change nothing."""
        if self._deadline is not None:
            self._deadline.cancel()
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def restore(self) -> None:
        self.settle()
        for signum, handler in self._saved.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(signum, handler)


def run_command(args: argparse.Namespace) -> int:
    embedded = (args.url or os.environ.get("REDIS_URL")) is None
    stop = StopSignals(max(0.0, args.drain_s - (STOP_S if embedded else 0.0)))
    try:
        return _replay(args, stop)
    finally:
        stop.restore()


def _replay(args: argparse.Namespace, stop: StopSignals) -> int:
    """The replay, its summary and report; the exit code."""
    progress = Progress()
    summary: ReplaySummary | None = None
    with ExitStack() as stack:
        try:
            check_readable(args.input)
            url = url_or_embedded(stack, args.url, args.concurrency)
            pool = CodePool(url, settings=Settings.from_env(redis_url=url))
            stack.callback(pool.close)
            summary = replay(
                pool,
                args.input,
                args.output,
                timeout_s=args.timeout,
                run=args.run,
                compare=args.compare,
                on_progress=progress.show,
                stopping=stop.stopping,
                rich_tracebacks=args.rich_tracebacks,
            )
        except CodepoolError as exc:
            print(f"codepool replay: {exc}", file=sys.stderr)
            return 2
        except Stopped:
            pass
        finally:
            stop.settle()  # before the pool stops, so that nothing interrupts it
            progress.close()
    if stop.received:
        name = signal.Signals(stop.received[0]).name
        print(
            f"codepool replay: stopped by {name}: {progress.done} results written to "
            f"{args.output}; run it again to resume",
            file=sys.stderr,
        )
    if summary is None:
        return 128 + stop.received[0] if stop.received else 2
    print_problems("skipped", summary.bad_lines)
    if summary.comparison is not None:
        print_problems("not compared", summary.comparison.unreadable)
    print(summary_table(summary))
    if args.report:
        write_report(args.output, args.report)
        print(f"report: {args.report}")
    return 128 + stop.received[0] if stop.received and summary.left else 0


class Progress:
    """A one-line progress bar on a terminal (stderr); silent elsewhere."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.started = time.monotonic()
        self.done = 0  # results written so far

    def show(self, done: int, total: int) -> None:
        self.done = done
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / max(1, total))
        rate = done / max(1e-9, time.monotonic() - self.started)
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {rate:.0f}/s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")


def print_problems(what: str, problems: list[str]) -> None:
    for problem in problems[:SHOWN_PROBLEMS]:
        print(f"{what}: {problem}", file=sys.stderr)
    if len(problems) > SHOWN_PROBLEMS:
        print(f"{what}: ... and {len(problems) - SHOWN_PROBLEMS} more", file=sys.stderr)


def summary_table(summary: ReplaySummary) -> str:
    """The status and error-type breakdowns, the comparison and the run-time line printed
    after a replay."""
    lines = [f"{'status':<10} {'count':>7} {'share':>7}"]
    for status, count in summary.statuses.most_common():
        lines.append(f"{status:<10} {count:>7} {count / max(1, summary.ran):>7.1%}")
    rate = summary.ran / summary.wall_s if summary.wall_s else 0.0
    lines.append(
        f"{'total':<10} {summary.ran:>7}   (skipped {summary.skipped} already done, "
        f"{len(summary.bad_lines)} bad lines)"
    )
    lines += limit_table(summary)
    lines += error_type_table(summary)
    if summary.comparison is not None:
        lines.append(f"compared   {summary.comparison.describe()}")
    lines.append(
        f"run time p50 {summary.percentile_ms(0.5):.1f} ms, "
        f"p95 {summary.percentile_ms(0.95):.1f} ms; {rate:.1f} calls/s over {summary.wall_s:.1f} s"
    )
    return "\n".join(lines)


def limit_table(summary: ReplaySummary) -> list[str]:
    """Rows of calls by the limit that stopped them (none when no limit was reached)."""
    if not summary.limits:
        return []
    lines = [f"{'limit':<10} {'count':>7} {'share':>7}"]
    for limit, count in ranked(summary.limits):
        lines.append(f"{limit:<10} {count:>7} {count / max(1, summary.ran):>7.1%}")
    return lines


def error_type_table(summary: ReplaySummary) -> list[str]:
    """Rows of failures by error type, the most common first (none when all succeeded)."""
    if not summary.error_types:
        return []
    kinds = [(_shorten(name), count) for name, count in ranked(summary.error_types)]
    shown = kinds[:SHOWN_ERROR_TYPES]
    if len(kinds) > SHOWN_ERROR_TYPES:
        rest = kinds[SHOWN_ERROR_TYPES:]
        shown.append((f"other ({len(rest)} types)", sum(count for _, count in rest)))
    width = max(len("error type"), *(len(name) for name, _ in shown))
    lines = [f"{'error type':<{width}} {'count':>7}"]
    lines += [f"{name:<{width}} {count:>7}" for name, count in shown]
    return lines


def _shorten(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"
