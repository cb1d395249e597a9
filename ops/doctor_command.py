"""``codepool doctor``: which protections this host gives (see ops/doctor.py)."""

from __future__ import annotations

import argparse
import os

from codepool.ops.arguments import Commands, add_executor_arguments


def register(commands: Commands[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("doctor", help="report which protections are active")
    add_executor_arguments(parser)
    parser.add_argument(
        "--url",
        default=None,
        help="also check this Redis (default $REDIS_URL when set): version, persistence, "
        "maxmemory-policy, ACL rights",
    )
    parser.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="run the probes even where neither a PID namespace nor Landlock is available",
    )
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    from codepool.ops import doctor  # starts an executor: imported only when asked

    return doctor.main(
        args.mode,
        args.preload,
        args.url or os.environ.get("REDIS_URL"),
        allow_weak_isolation=args.allow_weak_isolation,
    )
