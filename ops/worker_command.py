"""``codepool worker``: a worker host (executor + RQ dispatchers), see worker/host.py."""

from __future__ import annotations

import argparse

from codepool.ops.arguments import (
    Commands,
    add_drain_argument,
    add_executor_arguments,
    add_slots_argument,
)


def register(commands: Commands[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("worker", help="run a worker host: executor + RQ dispatchers")
    parser.add_argument("--url", default=None, help="Redis URL (default: $REDIS_URL)")
    add_slots_argument(parser, "-c", "--concurrency", what="snippet slots")
    parser.add_argument(
        "-k",
        "--dispatchers",
        type=int,
        default=0,
        help="RQ dispatcher processes (default: one per slot, at least 2)",
    )
    add_executor_arguments(parser, ("numpy", "sympy"))
    parser.add_argument("--queue", default=None, help="RQ queue name (default codepool)")
    parser.add_argument("--name", default="", help="worker name (default HOST.PID)")
    parser.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    add_drain_argument(
        parser,
        "takes no more work and lets running snippets finish; what still runs 2 s before "
        "the deadline (half of it, if shorter) is stopped; what it claimed and did not "
        "run is given back, to run elsewhere",
    )
    parser.add_argument(
        "--max-timeout",
        type=float,
        default=None,
        help="ceiling on any snippet's timeout_s (default 30)",
    )
    parser.add_argument(
        "--max-cpu-s",
        type=float,
        default=None,
        help="ceiling on any snippet's cpu_s (default: its timeout_s + 5)",
    )
    parser.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="run snippets even where neither a PID namespace nor Landlock is available "
        "(they could then signal the worker's processes): an explicit opt-in",
    )
    parser.add_argument(
        "--max-memory-mb",
        type=int,
        default=None,
        help="ceiling on any snippet's memory_mb (default 1024)",
    )
    parser.add_argument(
        "--max-contexts",
        type=int,
        default=None,
        help="interpreter contexts live at once on this host (default: one per 256 MiB "
        "of its memory, 4 to 1024)",
    )
    parser.add_argument(
        "--context-ttl",
        type=float,
        default=300.0,
        help="seconds an idle interpreter context lives (default 300)",
    )
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    from codepool.common import Limits
    from codepool.common.host_cpus import default_slots
    from codepool.common.settings import Settings
    from codepool.worker.host import WorkerHost, WorkerOptions

    settings = Settings.from_env(redis_url=args.url, queue=args.queue)
    ceiling = {
        "timeout_s": args.max_timeout,
        "cpu_s": args.max_cpu_s,
        "memory_mb": args.max_memory_mb,
    }
    options = WorkerOptions(
        concurrency=args.concurrency or default_slots(),
        dispatchers=args.dispatchers,
        mode=args.mode,
        preload=args.preload,
        burst=args.burst,
        name=args.name,
        max_limits=Limits().with_overrides(**{k: v for k, v in ceiling.items() if v}),
        log_level="DEBUG" if args.verbose else "INFO",
        allow_weak_isolation=args.allow_weak_isolation,
        drain_s=max(0.0, args.drain_s),
        max_contexts=args.max_contexts,
        context_ttl_s=args.context_ttl,
    )
    return WorkerHost(settings, options).serve()
