"""The ``codepool`` command."""

from __future__ import annotations

import argparse
import logging
import sys

from codepool.ops import exporter, replay_command, stats_view


def _split(value: str) -> tuple[str, ...]:
    return tuple(name for name in value.split(",") if name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codepool", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser("doctor", help="report which protections are active")
    doctor.add_argument("--mode", choices=("fork", "spawn"), default="fork")
    doctor.add_argument(
        "--preload",
        type=_split,
        default=(),
        help="comma-separated modules to preload, e.g. numpy,sympy",
    )
    doctor.add_argument(
        "--url",
        default=None,
        help="also check this Redis (default $REDIS_URL when set): version, persistence, "
        "maxmemory-policy, ACL rights",
    )
    doctor.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="run the probes even where neither a PID namespace nor Landlock is available",
    )
    worker = commands.add_parser("worker", help="run a worker host: executor + RQ dispatchers")
    worker.add_argument("--url", default=None, help="Redis URL (default: $REDIS_URL)")
    worker.add_argument("-c", "--concurrency", type=int, default=2, help="snippet slots")
    worker.add_argument(
        "-k",
        "--dispatchers",
        type=int,
        default=0,
        help="RQ dispatcher processes (default: one per slot, at least 2)",
    )
    worker.add_argument("--mode", choices=("fork", "spawn"), default="fork")
    worker.add_argument(
        "--preload",
        type=_split,
        default=("numpy", "sympy"),
        help="comma-separated modules the zygote imports (default numpy,sympy)",
    )
    worker.add_argument("--queue", default=None, help="RQ queue name (default codepool)")
    worker.add_argument("--name", default="", help="worker name (default HOST.PID)")
    worker.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    worker.add_argument(
        "--max-timeout",
        type=float,
        default=None,
        help="ceiling on any snippet's timeout_s (default 30)",
    )
    worker.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="run snippets even where neither a PID namespace nor Landlock is available "
        "(they could then signal the worker's processes): an explicit opt-in",
    )
    worker.add_argument(
        "--max-memory-mb",
        type=int,
        default=None,
        help="ceiling on any snippet's memory_mb (default 1024)",
    )
    replay_command.register(commands)
    stats_view.register(commands)
    exporter.register(commands)
    run = commands.add_parser("run", help="run snippets on this host and print the tool text")
    run.add_argument(
        "source", help="a .py file (cells split on '# %%%%' lines), '-' for stdin, or code with -c"
    )
    run.add_argument("-c", dest="is_code", action="store_true", help="SOURCE is code")
    run.add_argument("--mode", choices=("fork", "spawn"), default="fork")
    run.add_argument(
        "--preload",
        type=_split,
        default=(),
        help="comma-separated modules to preload, e.g. numpy,sympy",
    )
    run.add_argument("--concurrency", "-j", type=int, default=2)
    run.add_argument("--timeout", type=float, default=5.0, help="seconds per snippet")
    run.add_argument(
        "--auto-print",
        action="store_true",
        help="print a trailing expression's value, like a notebook",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "doctor":
        import os

        from codepool.ops import doctor

        return doctor.main(
            args.mode,
            args.preload,
            args.url or os.environ.get("REDIS_URL"),
            allow_weak_isolation=args.allow_weak_isolation,
        )
    if args.command == "worker":
        from codepool.common import Limits
        from codepool.common.settings import Settings
        from codepool.worker.host import WorkerHost, WorkerOptions

        settings = Settings.from_env(redis_url=args.url, queue=args.queue)
        ceiling = {"timeout_s": args.max_timeout, "memory_mb": args.max_memory_mb}
        options = WorkerOptions(
            concurrency=args.concurrency,
            dispatchers=args.dispatchers,
            mode=args.mode,
            preload=args.preload,
            burst=args.burst,
            name=args.name,
            max_limits=Limits().with_overrides(**{k: v for k, v in ceiling.items() if v}),
            log_level="DEBUG" if args.verbose else "INFO",
            allow_weak_isolation=args.allow_weak_isolation,
        )
        return WorkerHost(settings, options).serve()
    if args.command == "stats":
        return stats_view.run_command(args)
    if args.command == "exporter":
        return exporter.run_command(args)
    if args.command == "replay":
        return replay_command.run_command(args)
    if args.command == "run":
        from codepool.common import Limits
        from codepool.ops import run

        limits = Limits(timeout_s=args.timeout, auto_print=args.auto_print)
        return run.main(
            args.source,
            is_code=args.is_code,
            mode=args.mode,
            preload=args.preload,
            concurrency=args.concurrency,
            limits=limits,
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())
