"""``codepool serve``: SandboxFusion's HTTP API in front of the pool (see ops/serve.py).

Without ``--url`` and ``REDIS_URL`` it serves the embedded default (a private Redis and
a local worker), all stopped when serve stops, and killed with it if it is killed. Never
an open door: listening on anything but loopback needs ``--token`` (or
``CODEPOOL_SERVE_TOKEN``) unless the operator passes ``--insecure-no-token`` for a
trusted network.

Stopping: the first SIGTERM or SIGINT closes the listener; calls waiting on the pool may
finish until the drain deadline (less the time the embedded pool takes to stop), then
get a 503; the interpreter contexts still open are closed; the pool stops and serve
exits 0 within ``--drain-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import signal
import socket
import sys
from contextlib import ExitStack
from types import FrameType

from codepool.ops.arguments import (
    Commands,
    add_drain_argument,
    add_rich_tracebacks,
    add_slots_argument,
)

TOKEN_ENV = "CODEPOOL_SERVE_TOKEN"
# The line serve prints once it listens (and the pool is ready), and how to read it back.
LISTENING_LINE = (
    "codepool serve: SandboxFusion API on http://{host}:{port} "
    "(POST /run_code, POST /run_jupyter, GET /health, /contexts)"
)
LISTENING = re.compile(r"SandboxFusion API on (http://[\d.]+:\d+)")


def register(commands: Commands[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "serve", help="answer SandboxFusion's HTTP API (/run_code, /run_jupyter) from the pool"
    )
    parser.add_argument(
        "--url",
        default=None,
        help="Redis URL of a running pool (default $REDIS_URL; without either, "
        "a private Redis and a local worker are started and stopped with serve)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port (0: any free one)")
    parser.add_argument(
        "--token", default=None, help=f"require 'Authorization: Bearer TOKEN' (or ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="listen beyond loopback without a token (a trusted network only)",
    )
    add_slots_argument(parser, "-c", "--concurrency", what="slots of the embedded worker")
    parser.add_argument("--run", default="serve", help="run tag for the stats")
    add_rich_tracebacks(parser)
    parser.add_argument("--max-in-flight", type=int, default=4096, help="more get 503")
    parser.add_argument(
        "--max-body-mb", type=float, default=64.0, help="larger request bodies get 413"
    )
    parser.add_argument(
        "--max-contexts",
        type=int,
        default=4096,
        help="interpreter contexts open through this server at once; more get 503",
    )
    parser.add_argument(
        "--context-idle",
        dest="context_idle_s",
        type=float,
        default=300.0,
        metavar="S",
        help="forget a context nobody used for S seconds (default 300: the workers' "
        "default --context-ttl, after which its host has ended it)",
    )
    add_drain_argument(
        parser,
        "takes no new request; requests waiting on the pool may finish until the deadline "
        "(less 2 s to stop the embedded pool, if any), then get a 503 to retry",
    )
    parser.set_defaults(handler=serve_command)


def refusal(host: str, token: str | None, insecure: bool) -> str:
    """Why serve must not start as asked ('' when it may)."""
    if token is not None and not token.strip():
        return "--token must not be empty"
    if token is not None or insecure or _loopback(host):
        return ""
    return (
        f"refusing to listen on {host} without a token: anyone who reaches it could run "
        f"code on this pool. Pass --token TOKEN (or set {TOKEN_ENV}; clients then send "
        "'Authorization: Bearer TOKEN'), or --insecure-no-token on a trusted network"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_command(args: argparse.Namespace) -> int:
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    why = refusal(args.host, token, args.insecure_no_token)
    if why:
        print(f"codepool serve: {why}", file=sys.stderr)
        return 2
    try:
        import uvicorn

        from codepool.ops.serve import DrainingServer, Service, build_app
    except ImportError as exc:
        print(
            f"codepool serve needs the 'serve' extra ({exc}): pip install 'codepool[serve]'",
            file=sys.stderr,
        )
        return 2
    from codepool.common.errors import CodepoolError
    from codepool.common.settings import Settings
    from codepool.ops.embedded import STOP_S, url_or_embedded
    from codepool.producer.sandbox import RemoteSandbox

    # Until uvicorn takes the signals over: a stop while the pool starts unwinds it.
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _stop)
    embedded = (args.url or os.environ.get("REDIS_URL")) is None
    try:
        listener = _listen(args.host, args.port)
        with listener, ExitStack() as stack:  # closed also when the pool cannot start
            try:
                url = url_or_embedded(stack, args.url, args.concurrency)
                sandbox = RemoteSandbox(
                    url,
                    run=args.run,
                    rich_tracebacks=args.rich_tracebacks,
                    settings=Settings.from_env(redis_url=url),
                )
            except CodepoolError as exc:
                print(f"codepool serve: {exc}", file=sys.stderr)
                return 2
            # What still waits once the HTTP side has answered is nobody's any more.
            stack.callback(sandbox.close, wait=False)
            service = Service(
                sandbox,
                token=token,
                max_body_bytes=int(args.max_body_mb * (1 << 20)),
                max_in_flight=args.max_in_flight,
                max_contexts=args.max_contexts,
                context_idle_s=args.context_idle_s,
            )
            # Before the sandbox closes (the stack unwinds in reverse): the contexts
            # still open are closed on their hosts, not left to their TTL.
            stack.callback(service.contexts.close_all)
            stack.callback(service.e2b.kill_all)
            service.refresh_slots()
            host, port = listener.getsockname()[:2]
            print(LISTENING_LINE.format(host=host, port=port), flush=True)
            drain_s = max(0.0, args.drain_s - (STOP_S if embedded else 0.0))
            config = uvicorn.Config(
                build_app(service),
                log_level="warning",
                timeout_graceful_shutdown=drain_s + 1.0,  # a backstop: give_up answers all
            )
            DrainingServer(config, service, drain_s=drain_s).run(sockets=[listener])
            # Stopping the pool takes STOP_S at most: further signals change nothing.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (KeyboardInterrupt, Stopped):  # while the pool started
        pass
    finally:
        for signum, handler in saved.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(signum, handler)
    return 0


class Stopped(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named, so asyncio sets TCP_NODELAY on every accepted connection (it does for
    # IPPROTO_TCP sockets only): a response's headers and body then never wait ~40 ms
    # for a delayed ACK.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(2048)  # now, so a client that read our line is never refused

    return listener
