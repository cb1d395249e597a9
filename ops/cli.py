"""The ``codepool`` command line (each subcommand's module registers it and names its
handler)."""

from __future__ import annotations

import argparse
import logging
import sys

from codepool.common.errors import ConfigError
from codepool.ops import (
    doctor_command,
    exporter,
    pid1,
    replay_command,
    run_command,
    serve_command,
    stats_view,
    worker_command,
)

SUBCOMMANDS = (
    doctor_command,
    worker_command,
    replay_command,
    serve_command,
    stats_view,
    exporter,
    run_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codepool",
        description="codepool: runs model-written Python for RL rollouts in isolated, "
        "resource-limited sandboxes, on one host or a fleet fed through Redis.",
        epilog="`codepool COMMAND --help` for each command; the README has the details.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.register(commands)  # each sets its own ``handler``
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pid1.init_if_pid1()  # a container's first process: reap its orphans (ops/pid1.py)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args))
    except ConfigError as exc:  # a bad URL or setting: say what, not where
        print(f"codepool {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
