"""Argument helpers the ``codepool`` subcommands share."""

from __future__ import annotations

import argparse

Commands = argparse._SubParsersAction  # what ``add_subparsers`` returns


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


def add_rich_tracebacks(parser: argparse.ArgumentParser) -> None:
    """``--rich-tracebacks``: the Limits field of the same name."""
    parser.add_argument(
        "--rich-tracebacks",
        action="store_true",
        help="tracebacks with source lines and markers (default: as the reference's)",
    )
