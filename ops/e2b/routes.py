"""E2B's HTTP protocol on ``codepool serve``, mounted under ``/e2b``: the control plane
the ``e2b`` SDK calls at ``E2B_API_URL`` and the code interpreter it calls at
``E2B_SANDBOX_URL``, one base URL for both (docs/e2b.md).

Control plane (``X-API-Key``, or ``Authorization: Bearer``, must be serve's token when
it has one): ``POST /sandboxes`` and ``/v2/sandboxes`` (201), ``GET`` and ``DELETE
/sandboxes/{id}``, ``POST /sandboxes/{id}/timeout``, ``POST /sandboxes/{id}/connect``
and ``/v2/sandboxes/{id}/connect``, ``POST /sandboxes/{id}/fork`` (copy-on-write forks
of every code context). Errors are E2B's ``{"code", "message"}``.

Sandbox side, routed by the ``E2b-Sandbox-Id`` header (a sandbox id is a random
secret, like a context id of ``/contexts``; the SDK sends no API key there): ``GET
/health`` (204; 502 once the sandbox is gone), ``POST /execute`` (newline-delimited
JSON events), ``POST``/``GET /contexts``, ``DELETE /contexts/{id}``, ``POST
/contexts/{id}/restart``.

An execution's events are sent when it ends (the context call returns them at once).
A client that disconnects first ends the execution: its code context is restarted
(there is no interrupt that keeps the state). A sandbox killed during an execution
ends that response without its last event, as E2B's proxy does, so the SDK asks
``/health``, gets 502 and says the sandbox was killed.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from codepool.common.errors import CodepoolError, ConfigError
from codepool.ops.context_routes import Service as ContextService
from codepool.ops.context_routes import in_thread
from codepool.ops.e2b.sandboxes import (
    LANGUAGE,
    MAX_FORKS,
    Sandbox,
    SandboxError,
    Sandboxes,
    Watch,
    timeout_of,
)


class Service(ContextService, Protocol):
    """What these routes need of the server (ops/serve.py's ``Service``): the contexts'
    routes' needs and its token."""

    token: str | None


log = logging.getLogger(__name__)

T = TypeVar("T")
SANDBOX_HEADER = "e2b-sandbox-id"
SWEEP_EVERY_S = 1.0
END = b'{"type": "end_of_execution"}\n'
LANGUAGES = (None, "", LANGUAGE, "python3")


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """E2B's error body."""
    return JSONResponse({"code": status, "message": message}, status, headers=headers)


def e2b_routes(service: Service, sandboxes: Sandboxes) -> list[BaseRoute]:
    """The routes, to mount under ``/e2b``."""
    sweeper: list[asyncio.Task[None]] = []

    def handler(
        work: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            if not sweeper or sweeper[0].done():
                sweeper[:] = [asyncio.ensure_future(_sweep(sandboxes))]
            try:
                return await work(request)
            except SandboxError as exc:
                headers = {"Should-Retry": "false"} if exc.status == 502 else None
                return error(exc.status, str(exc), headers)
            except HTTPException as exc:  # the body's size, the server's bounds
                return error(exc.status_code, str(exc.detail), dict(exc.headers or {}))
            except ConfigError as exc:
                return error(400, str(exc))
            except CodepoolError as exc:  # no live host, or none with room
                return error(503, str(exc), {"Retry-After": "1"})

        return handle

    def authorize(request: Request) -> None:
        token = service.token
        if token is None:
            return
        given = request.headers.get("x-api-key", "")
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given = given or bearer.strip()
        if not hmac.compare_digest(given, token):
            raise SandboxError(401, "missing or wrong API key: set E2B_API_KEY to serve's token")

    async def blocking(work: Callable[[], T]) -> T:
        return await service.hold(lambda: in_thread(work))

    async def body(request: Request) -> dict[str, Any]:
        got = await service.body(request, optional=True)
        if not isinstance(got, dict):
            raise SandboxError(400, "the body must be a JSON object")
        return got

    def in_sandbox(request: Request) -> Sandbox:
        return sandboxes.get(request.headers.get(SANDBOX_HEADER))

    # -- control plane ---------------------------------------------------------------

    async def create(request: Request) -> Response:
        authorize(request)
        fields = await body(request)
        env_vars = _strings(fields.get("envVars"), "envVars")
        metadata = _strings(fields.get("metadata"), "metadata")
        template = str(fields.get("templateID") or "code-interpreter-v1")
        timeout_s = timeout_of(fields.get("timeout"))
        sandbox = await blocking(
            lambda: sandboxes.create(
                template=template, timeout_s=timeout_s, env_vars=env_vars, metadata=metadata
            )
        )
        return JSONResponse(sandbox.describe(), 201)

    async def info(request: Request) -> Response:
        authorize(request)
        sandbox = sandboxes.find(request.path_params["sandbox_id"])
        return JSONResponse(sandbox.describe(detail=True))

    async def kill(request: Request) -> Response:
        authorize(request)
        sandbox_id = request.path_params["sandbox_id"]
        if not await in_thread(lambda: sandboxes.kill(sandbox_id)):
            raise SandboxError(404, f"Sandbox {sandbox_id[:64]} not found")
        return Response(status_code=204)

    async def set_timeout(request: Request) -> Response:
        authorize(request)
        sandbox = sandboxes.find(request.path_params["sandbox_id"])
        fields = await body(request)
        sandbox.end_at = time.time() + timeout_of(fields.get("timeout"))
        return Response(status_code=204)

    async def connect(request: Request) -> Response:
        authorize(request)
        sandbox = sandboxes.find(request.path_params["sandbox_id"])
        fields = await body(request)
        if fields.get("timeout") is not None:
            sandbox.end_at = max(sandbox.end_at, time.time() + timeout_of(fields.get("timeout")))
        return JSONResponse(sandbox.describe(), 200)

    async def fork(request: Request) -> Response:
        authorize(request)
        parent = sandboxes.find(request.path_params["sandbox_id"])
        fields = await body(request)
        count = fields.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            raise SandboxError(400, f"count: from 1 to {MAX_FORKS}, got {count!r}")
        timeout_s = timeout_of(fields.get("timeout"))
        forks = await blocking(lambda: sandboxes.fork(parent, count, timeout_s))
        return JSONResponse([{"sandbox": sandbox.describe()} for sandbox in forks], 201)

    # -- sandbox side ------------------------------------------------------------------

    async def health(request: Request) -> Response:
        in_sandbox(request)
        return Response(status_code=204)

    async def execute(request: Request) -> Response:
        sandbox = in_sandbox(request)
        fields = await body(request)
        code = fields.get("code")
        if not isinstance(code, str):
            raise SandboxError(400, "code: a string is required")
        language, context_id = fields.get("language"), fields.get("context_id")
        if language and context_id:
            raise SandboxError(400, "Only one of context_id or language can be provided")
        if language not in LANGUAGES:
            raise SandboxError(400, f"language {str(language)[:40]!r}: codepool runs Python only")
        env_vars = _strings(fields.get("env_vars"), "env_vars") or None
        context = sandbox.context(context_id if isinstance(context_id, str) else None)
        await service.hold(_nothing)  # refused now (503) rather than after the 200

        watch = Watch()

        async def run() -> list[dict[str, Any]]:
            sandbox.running += 1
            try:
                return await blocking(
                    lambda: sandboxes.execute(sandbox, context, code, env_vars, watch)
                )
            finally:
                sandbox.running -= 1

        def left() -> None:
            _in_background(lambda: sandboxes.leave(sandbox, watch))

        return _Execution(run, left)

    async def list_contexts(request: Request) -> Response:
        sandbox = in_sandbox(request)
        return JSONResponse([context.describe() for context in sandbox.contexts.values()])

    async def create_context(request: Request) -> Response:
        sandbox = in_sandbox(request)
        fields = await body(request)
        if fields.get("language") not in LANGUAGES:
            language = str(fields.get("language"))[:40]
            raise SandboxError(400, f"language {language!r}: codepool runs Python only")
        cwd = fields.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise SandboxError(400, "cwd: must be a string")
        context = await blocking(lambda: sandboxes.open_context(sandbox, cwd))
        return JSONResponse(context.describe())

    async def remove_context(request: Request) -> Response:
        sandbox = in_sandbox(request)
        context_id = request.path_params["context_id"]
        await in_thread(lambda: sandboxes.remove_context(sandbox, context_id))
        return Response(status_code=204)

    async def restart_context(request: Request) -> Response:
        sandbox = in_sandbox(request)
        context_id = request.path_params["context_id"]
        await blocking(lambda: sandboxes.restart_context(sandbox, context_id))
        return Response(status_code=204)

    routes = [
        ("/sandboxes", create, "POST"),
        ("/v2/sandboxes", create, "POST"),
        ("/sandboxes/{sandbox_id}", info, "GET"),
        ("/sandboxes/{sandbox_id}", kill, "DELETE"),
        ("/sandboxes/{sandbox_id}/timeout", set_timeout, "POST"),
        ("/sandboxes/{sandbox_id}/connect", connect, "POST"),
        ("/v2/sandboxes/{sandbox_id}/connect", connect, "POST"),
        ("/sandboxes/{sandbox_id}/fork", fork, "POST"),
        ("/health", health, "GET"),
        ("/execute", execute, "POST"),
        ("/contexts", list_contexts, "GET"),
        ("/contexts", create_context, "POST"),
        ("/contexts/{context_id}", remove_context, "DELETE"),
        ("/contexts/{context_id}/restart", restart_context, "POST"),
    ]
    return [Route(path, handler(work), methods=[method]) for path, work, method in routes]


class _Execution(Response):
    """The NDJSON answer of one execution: headers at once, the events when it ends. A
    client that leaves first has ``on_left`` called; a sandbox killed meanwhile gets its
    connection cut before the last event."""

    media_type = "application/x-ndjson"

    def __init__(
        self, run: Callable[[], Awaitable[list[dict[str, Any]]]], on_left: Callable[[], None]
    ) -> None:
        super().__init__(status_code=200)
        self.run = run
        self.on_left = on_left

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", self.media_type.encode())]  # chunked: no length yet
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        work = asyncio.ensure_future(self.run())
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not work.done():  # the client left: nobody waits for the events
            work.add_done_callback(_quietly)
            self.on_left()
            return
        try:
            events = work.result()
        except SandboxError as exc:
            if exc.status == 502:  # killed: cut the stream as E2B's proxy does
                log.debug("an execution's sandbox was killed: %s", exc)
                return
            events = [_error_event(exc)]
        except (HTTPException, CodepoolError) as exc:
            events = [_error_event(exc)]
        lines = b"".join(json.dumps(event).encode() + b"\n" for event in events)
        await send({"type": "http.response.body", "body": lines + END, "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _quietly(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # seen, so asyncio does not log it


def _error_event(exc: Exception) -> dict[str, Any]:
    detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
    return {"type": "error", "name": "SandboxError", "value": str(detail), "traceback": ""}


def _in_background(work: Callable[[], None]) -> None:
    """``work()`` on a daemon thread, off the loop; what it raises is logged."""

    def target() -> None:
        try:
            work()
        except Exception as exc:  # the sandbox was killed meanwhile, or no room
            log.info("e2b: an execution's context was not restarted: %s", exc)

    threading.Thread(target=target, name="codepool-e2b-restart", daemon=True).start()


async def _sweep(sandboxes: Sandboxes) -> None:
    """End the sandboxes past their end time and keep the others' contexts alive, while
    any are held."""
    keeping: asyncio.Future[None] | None = None
    while len(sandboxes):
        for sandbox_id in sandboxes.expired():
            await in_thread(functools.partial(sandboxes.kill, sandbox_id, "its timeout passed"))
        if keeping is None or keeping.done():
            keeping = asyncio.ensure_future(in_thread(sandboxes.keep_alive))
        await asyncio.sleep(SWEEP_EVERY_S)


async def _nothing() -> None:
    return None


def _strings(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SandboxError(400, f"{name}: an object of strings")
    return dict(value)
