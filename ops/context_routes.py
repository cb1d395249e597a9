"""Interpreter contexts over HTTP: the routes ``codepool serve`` adds for the fleet's
contexts (producer/context.py), with the token and 4xx rules of its other routes.

- ``POST /contexts`` ``{"run_timeout"?, "memory_limit_MB"?, "rebuild"?}`` -> 201
  ``{"context_id"}``: open one on a live worker host with room.
- ``POST /contexts/{id}/run`` ``{"code", "run_timeout"?}`` -> 200, ``/run_code``'s
  response (SandboxFusion's RunCodeResponse) plus ``context_id``, ``rebuilt`` (the call
  ran on a context rebuilt after its host was lost) and ``ended`` (why the context is
  over, null while it lives). 409 on a context that had ended before the call.
- ``POST /contexts/{id}/fork`` ``{"n"?}`` -> 201 ``{"context_ids": [...]}``: n contexts,
  each from a copy of this one's state now.
- ``GET /contexts/{id}`` -> its host, recorded calls, rebuilds, ``ended``.
- ``DELETE /contexts/{id}`` -> 204; then the id is unknown (404), like any id this
  server never opened.

The server keeps the contexts it opened in memory, id -> RemoteContext, at most
``max_open``. One nobody uses for ``idle_s`` is forgotten (and closed) when a context is
next opened: its host has ended it by then (the host's ``--context-ttl``, same default).
A server that stops closes the rest; one killed leaves them to their hosts' TTL.

A context's calls block on Redis for as long as the call runs, so each waits on a daemon
thread of its own: never on the event loop, never on the loop's few default threads, and
never holding up the server's exit. A client that leaves during a call does not cancel
it, unlike ``/run_code``: the call is part of the context's state either way, and the
context's next call runs after it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import redis
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from codepool.common.errors import CodepoolError, ConfigError
from codepool.ops import sandbox_fusion
from codepool.ops.sandbox_fusion import (
    DEFAULT_RUN_TIMEOUT_S,
    BadRequest,
    field_of,
    json_object,
    memory_limits,
    seconds_of,
)
from codepool.producer.context import DEFAULT_TTL_S, RemoteContext
from codepool.producer.sandbox import RemoteSandbox

log = logging.getLogger(__name__)

T = TypeVar("T")


class Service(Protocol):
    """What these routes need of the server (ops/serve.py's ``Service``): its sandbox,
    its token check, its body reader and its admission."""

    sandbox: RemoteSandbox

    def authorize(self, request: Request) -> None: ...

    async def body(self, request: Request, *, optional: bool = False) -> Any: ...

    async def hold(self, work: Callable[[], Awaitable[T]]) -> T: ...


DEFAULT_MAX_OPEN = 4096  # contexts one server holds at once; more get 503
DEFAULT_IDLE_S = DEFAULT_TTL_S  # the hosts' default --context-ttl
MAX_FORKS = 64  # forks one request may ask for
CLOSE_ALL_S = 2.0  # a stopping server waits this long for its contexts to close
OPEN_FIELDS = ("run_timeout", "memory_limit_MB", "rebuild")
RUN_FIELDS = ("code", "run_timeout")
FORK_FIELDS = ("n",)


# -- request bodies --------------------------------------------------------------------


def open_request(body: Any) -> tuple[dict[str, Any], bool]:
    """The Limits overrides and ``rebuild`` a ``POST /contexts`` body asks for."""
    fields = _known(body, OPEN_FIELDS)
    limits = {"timeout_s": seconds_of(fields, "run_timeout", DEFAULT_RUN_TIMEOUT_S)}
    limits.update(memory_limits(fields))
    rebuild = fields.get("rebuild", True)
    if not isinstance(rebuild, bool):
        raise BadRequest(f"rebuild: must be true or false, got {type(rebuild).__name__}")
    return limits, rebuild


def run_request(body: Any) -> tuple[str, dict[str, Any]]:
    """The code and per-call Limits overrides a ``POST /contexts/{id}/run`` body asks for."""
    fields = _known(body, RUN_FIELDS)
    code = field_of(fields, "code", str, required=True)
    limits = {}
    if fields.get("run_timeout") is not None:
        limits["timeout_s"] = seconds_of(fields, "run_timeout", DEFAULT_RUN_TIMEOUT_S)
    return code, limits


def fork_request(body: Any) -> int:
    """How many forks a ``POST /contexts/{id}/fork`` body asks for (default 1)."""
    fields = _known(body, FORK_FIELDS)
    n = field_of(fields, "n", int)
    n = 1 if n is None else n
    if not 1 <= n <= MAX_FORKS:
        raise BadRequest(f"n: must be from 1 to {MAX_FORKS}, got {n}")
    return int(n)


def _known(body: Any, names: tuple[str, ...]) -> dict[str, Any]:
    # A misspelt limit silently ignored would run with the default: say so instead.
    fields = json_object(body)
    unknown = sorted(set(fields) - set(names))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0][:40]!r}; known: {', '.join(names)}")
    return fields


# -- the contexts a server holds ---------------------------------------------------------


@dataclass
class Held:
    context: RemoteContext
    used_at: float  # time.monotonic() of its last call's start or end
    busy: int = 0  # its calls and forks going on


class OpenContexts:
    """The contexts one server opened and has not closed, by id."""

    def __init__(self, *, max_open: int = DEFAULT_MAX_OPEN, idle_s: float = DEFAULT_IDLE_S):
        self.max_open = max_open
        self.idle_s = idle_s
        self._held: dict[str, Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def check_room(self, n: int) -> None:
        """Forget the idle ones, then 503 unless ``n`` more fit."""
        for context in self.forget_idle():
            _close_later(context)
        if len(self._held) + n > self.max_open:
            raise HTTPException(
                503,
                f"busy: this server holds {len(self._held)} open contexts, at most "
                f"{self.max_open}; close some, or retry later",
                headers={"Retry-After": "1"},
            )

    def add(self, context: RemoteContext) -> None:
        self._held[context.id] = Held(context, time.monotonic())

    def get(self, context_id: str) -> Held:
        held = self._held.get(context_id)
        if held is None:
            raise HTTPException(
                404,
                f"no open context {context_id[:64]!r} here: closed, never opened on this "
                f"server, or idle for over {self.idle_s:g} s",
            )
        return held

    def pop(self, context_id: str) -> RemoteContext:
        context = self.get(context_id).context
        del self._held[context_id]
        return context

    def forget_idle(self) -> list[RemoteContext]:
        """Drop the contexts unused for ``idle_s`` (their hosts have ended them); returns them."""
        since = time.monotonic() - self.idle_s
        idle = [key for key, held in self._held.items() if not held.busy and held.used_at < since]
        return [self._held.pop(key).context for key in idle]

    def close_all(self, wait_s: float = CLOSE_ALL_S) -> None:
        """Close every context held, waiting ``wait_s`` at most (a call still running
        holds its context's close up; its host's TTL ends that one)."""
        contexts = [held.context for held in self._held.values()]
        self._held.clear()
        threads = [_close_later(context) for context in contexts]
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if contexts:
            log.info("closed %d open contexts on stopping", len(contexts))


def _close_later(context: RemoteContext) -> threading.Thread:
    thread = threading.Thread(target=context.close, name="codepool-context-close", daemon=True)
    thread.start()
    return thread


async def in_thread(blocking: Callable[[], T]) -> T:
    """``blocking()`` on a daemon thread of its own, awaited."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = blocking()
        except BaseException as exc:
            error = exc
        try:
            loop.call_soon_threadsafe(_settle, future, value, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=target, name="codepool-context-call", daemon=True).start()
    return await future


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # given up on (serve stops)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


# -- the routes -----------------------------------------------------------------------


def context_routes(service: Service, contexts: OpenContexts) -> list[Route]:
    """The routes of the contexts ``service`` holds in ``contexts``."""

    async def parsed(request: Request, parse: Callable[[Any], T], *, optional: bool) -> T:
        try:
            return parse(await service.body(request, optional=optional))
        except BadRequest as exc:
            raise HTTPException(exc.status, str(exc)) from None

    async def on_pool(work: Callable[[], T]) -> T:
        try:
            return await service.hold(lambda: in_thread(work))
        except redis.RedisError as exc:  # the pool's Redis is away: retry later
            log.warning("a context request failed on Redis: %s", exc)
            raise HTTPException(
                503, f"codepool: the pool's Redis failed: {exc}", headers={"Retry-After": "1"}
            ) from None

    async def busy_with(held: Held, work: Callable[[], T]) -> T:
        held.busy += 1
        held.used_at = time.monotonic()
        try:
            return await on_pool(work)
        finally:
            held.busy -= 1
            held.used_at = time.monotonic()

    async def open_one(request: Request) -> Response:
        service.authorize(request)
        limits, rebuild = await parsed(request, open_request, optional=True)
        contexts.check_room(1)
        sandbox = service.sandbox
        try:
            context = await on_pool(lambda: sandbox.context(rebuild=rebuild, **limits))
        except ConfigError as exc:  # limits the pool refuses
            raise HTTPException(422, str(exc)) from None
        except CodepoolError as exc:  # no live host, or none with room
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
        contexts.add(context)
        log.debug("context %s opened on host %s", context.id, context.host)
        return JSONResponse({"context_id": context.id}, status_code=201)

    async def run(request: Request) -> Response:
        service.authorize(request)
        held = contexts.get(request.path_params["context_id"])
        code, limits = await parsed(request, run_request, optional=False)
        context = held.context
        if context.ended is not None:
            raise HTTPException(409, f"the context ended: {context.ended}; open another")
        result = await busy_with(held, lambda: context.run_code(code, **limits))
        body = sandbox_fusion.run_code_response(result)
        body.update(context_id=context.id, rebuilt=result.rebuilt, ended=context.ended)
        return JSONResponse(body)

    async def fork(request: Request) -> Response:
        service.authorize(request)
        held = contexts.get(request.path_params["context_id"])
        n = await parsed(request, fork_request, optional=True)
        contexts.check_room(n)
        try:
            forks = await busy_with(held, lambda: held.context.fork(n))
        except CodepoolError as exc:
            ended = held.context.ended is not None
            raise HTTPException(409 if ended else 503, f"{exc}") from None
        for context in forks:
            contexts.add(context)
        return JSONResponse({"context_ids": [context.id for context in forks]}, status_code=201)

    async def describe(request: Request) -> Response:
        service.authorize(request)
        context = contexts.get(request.path_params["context_id"]).context
        body = {
            "context_id": context.id,
            "host": context.host,
            "recorded_calls": len(context.history),
            "rebuild": context.rebuild,
            "rebuilds": context.rebuilds,
            "ended": context.ended,
        }
        return JSONResponse(body)

    async def close(request: Request) -> Response:
        service.authorize(request)
        context = contexts.pop(request.path_params["context_id"])
        # After a call running in it, if any (calls and the close run in order).
        await in_thread(context.close)
        log.debug("context %s closed", context.id)
        return Response(status_code=204)

    return [
        Route("/contexts", open_one, methods=["POST"]),
        Route("/contexts/{context_id}/run", run, methods=["POST"]),
        Route("/contexts/{context_id}/fork", fork, methods=["POST"]),
        Route("/contexts/{context_id}", describe, methods=["GET"]),
        Route("/contexts/{context_id}", close, methods=["DELETE"]),
    ]
