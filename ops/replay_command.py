"""``codepool replay IN.jsonl -o OUT.jsonl``: replay a rollout batch, embedded by default."""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import ExitStack
from typing import TextIO

from codepool.common.errors import CodepoolError
from codepool.common.settings import Settings
from codepool.ops.embedded import embedded_pool
from codepool.ops.report import write_report
from codepool.producer.pool import CodePool
from codepool.producer.replay import ReplaySummary, replay


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "replay", help="replay a saved rollout batch (JSONL) and write one line per code call"
    )
    parser.add_argument("input", help="JSONL: lines with 'code', or chat 'messages'")
    parser.add_argument("-o", "--output", required=True, help="JSONL results (appended, resumed)")
    parser.add_argument(
        "--url",
        default=None,
        help="Redis URL of a running pool (default $REDIS_URL; without either, "
        "a private Redis and a local worker are started and stopped)",
    )
    parser.add_argument(
        "-c", "--concurrency", type=int, default=2, help="slots of the embedded worker"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    parser.add_argument("--run", default="replay", help="run tag for the stats")
    parser.add_argument("--report", default=None, help="write an HTML report here")
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("REDIS_URL")
    with ExitStack() as stack:
        try:
            if url is None:
                print(
                    "no --url and no REDIS_URL: starting a private Redis and a local worker",
                    file=sys.stderr,
                )
                url = stack.enter_context(embedded_pool(args.concurrency))
            pool = CodePool(url, settings=Settings.from_env(redis_url=url))
            progress = Progress()
            summary = replay(
                pool,
                args.input,
                args.output,
                timeout_s=args.timeout,
                run=args.run,
                on_progress=progress.show,
            )
            progress.close()
            pool.close()
        except CodepoolError as exc:
            print(f"codepool replay: {exc}", file=sys.stderr)
            return 2
    for line in summary.bad_lines:
        print(f"skipped: {line}", file=sys.stderr)
    print(summary_table(summary))
    if args.report:
        write_report(args.output, args.report)
        print(f"report: {args.report}")
    return 0


class Progress:
    """A one-line progress bar on a terminal (stderr); silent elsewhere."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.started = time.monotonic()

    def show(self, done: int, total: int) -> None:
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


def summary_table(summary: ReplaySummary) -> str:
    """The status breakdown and run-time line printed after a replay."""
    lines = [f"{'status':<10} {'count':>7} {'share':>7}"]
    for status, count in summary.statuses.most_common():
        lines.append(f"{status:<10} {count:>7} {count / max(1, summary.ran):>7.1%}")
    rate = summary.ran / summary.wall_s if summary.wall_s else 0.0
    lines += [
        f"{'total':<10} {summary.ran:>7}   (skipped {summary.skipped} already done, "
        f"{len(summary.bad_lines)} bad lines)",
        f"run time p50 {summary.percentile_ms(0.5):.1f} ms, "
        f"p95 {summary.percentile_ms(0.95):.1f} ms; {rate:.1f} calls/s over {summary.wall_s:.1f} s",
    ]
    return "\n".join(lines)
