"""Argument helpers the ``codepool`` subcommands share."""

from __future__ import annotations

import argparse
import sys

from codepool.common.settings import DEFAULT_DRAIN_S

Commands = argparse._SubParsersAction  # what ``add_subparsers`` returns


def cli_command(*args: str) -> list[str]:
    """The argv that runs ``codepool ARGS`` on this interpreter, for a command that starts
    another (the console script need not be on PATH, nor be this install's)."""
    return [sys.executable, "-m", "codepool.ops.cli", *args]


def split_names(value: str) -> tuple[str, ...]:
    """``a,b,,c`` -> ("a", "b", "c"); "" -> ()."""
    return tuple(name for name in value.split(",") if name)


def add_executor_arguments(parser: argparse.ArgumentParser, preload: tuple[str, ...] = ()) -> None:
    """``--mode`` and ``--preload``, as every command that starts an executor takes them."""
    parser.add_argument("--mode", choices=("fork", "spawn"), default="fork")
    default = ",".join(preload) or "none"
    parser.add_argument(
        "--preload",
        type=split_names,
        default=preload,
        help=f"comma-separated modules the zygote imports (default {default})",
    )


def add_slots_argument(parser: argparse.ArgumentParser, *flags: str, what: str) -> None:
    """``-c``/``-j``: snippet slots (``args.concurrency``); None when not given, for the
    CPUs this process may use (common/host_cpus.py), which the help shows."""
    from codepool.common.host_cpus import host_cpus

    parser.add_argument(
        *flags,
        dest="concurrency",
        type=int,
        default=None,
        help=f"{what} (default: the CPUs this process may use, its CPU affinity capped by "
        f"its cgroup's CPU quota; here {host_cpus().describe()})",
    )


def add_drain_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--drain-timeout S`` (``args.drain_s``): ``what`` a first SIGTERM or SIGINT does
    and the bound on it; a second signal cuts the drain short."""
    parser.add_argument(
        "--drain-timeout",
        dest="drain_s",
        type=float,
        default=DEFAULT_DRAIN_S,
        metavar="S",
        help=f"on SIGTERM or SIGINT: {what}; exits within S seconds "
        f"(default {DEFAULT_DRAIN_S:g}); "
        "a second signal cuts the drain short",
    )


def add_rich_tracebacks(parser: argparse.ArgumentParser) -> None:
    """``--rich-tracebacks``: the Limits field of the same name."""
    parser.add_argument(
        "--rich-tracebacks",
        action="store_true",
        help="tracebacks with source lines and markers (default: as the reference's)",
    )
