"""Argument helpers the ``codepool`` subcommands share."""

from __future__ import annotations

import argparse

Commands = argparse._SubParsersAction  # what ``add_subparsers`` returns


def split_names(value: str) -> tuple[str, ...]:
    """``a,b,,c`` -> ("a", "b", "c"); "" -> ()."""
    return tuple(name for name in value.split(",") if name)
