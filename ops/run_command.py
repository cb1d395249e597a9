"""``codepool run FILE|-c CODE``: run snippets on this host and print the tool text
(see ops/run.py)."""

from __future__ import annotations

import argparse

from codepool.ops.arguments import (
    Commands,
    add_executor_arguments,
    add_rich_tracebacks,
    add_slots_argument,
)


def register(commands: Commands[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("run", help="run snippets on this host and print the tool text")
    parser.add_argument(
        "source", help="a .py file (cells split on '# %%%%' lines), '-' for stdin, or code with -c"
    )
    parser.add_argument("-c", dest="is_code", action="store_true", help="SOURCE is code")
    add_executor_arguments(parser)
    add_slots_argument(parser, "--concurrency", "-j", what="snippets at once")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per snippet")
    parser.add_argument(
        "--auto-print",
        action="store_true",
        help="print a trailing expression's value, like a notebook",
    )
    add_rich_tracebacks(parser)
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    from codepool.common import Limits
    from codepool.ops import run

    limits = Limits(
        timeout_s=args.timeout, auto_print=args.auto_print, rich_tracebacks=args.rich_tracebacks
    )
    return run.main(
        args.source,
        is_code=args.is_code,
        mode=args.mode,
        preload=args.preload,
        concurrency=args.concurrency,
        limits=limits,
    )
