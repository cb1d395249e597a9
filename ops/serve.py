"""The HTTP front of the pool: SandboxFusion's ``/run_code`` and ``/run_jupyter`` over a
RemoteSandbox, so concurrent requests are coalesced into batches that every live
worker host shares.

Starlette (an ASGI toolkit without a validation framework of its own: the request
models are SandboxFusion's and live in ops/sandbox_fusion.py) on uvicorn. Bounded by
design: a request body over ``max_body_bytes`` is refused while it is read, and at most
``max_in_flight`` requests wait on the pool at once (more get 503 and a reason), so
thousands of clients cost bounded memory. Every refusal is a 4xx/503 with a JSON
``{"detail": reason}``; nothing a client sends makes a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from codepool.common.errors import CodepoolError
from codepool.common.result import ExecResult
from codepool.ops import sandbox_fusion
from codepool.ops.sandbox_fusion import BadRequest, Call
from codepool.producer.sandbox import RemoteSandbox

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 << 20
DEFAULT_MAX_IN_FLIGHT = 4096


class Service:
    """The state behind the routes: the sandbox, the token, the bounds."""

    def __init__(
        self,
        sandbox: RemoteSandbox,
        *,
        token: str | None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.sandbox = sandbox
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    def authorize(self, request: Request) -> None:
        if self.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), self.token):
            raise HTTPException(401, "missing or wrong token: send 'Authorization: Bearer <token>'")

    async def body(self, request: Request) -> Any:
        size = int(request.headers.get("content-length") or 0)
        if size > self.max_body_bytes:
            raise HTTPException(413, f"body of {size} bytes is over {self.max_body_bytes}")
        chunks, received = [], 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > self.max_body_bytes:
                raise HTTPException(413, f"body is over {self.max_body_bytes} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as exc:
            raise HTTPException(400, f"the body is not JSON: {exc}") from None

    async def run(self, call: Call) -> ExecResult:
        if self.in_flight >= self.max_in_flight:
            raise HTTPException(503, f"busy: {self.in_flight} requests in flight; retry later")
        self.in_flight += 1
        try:
            return await self.sandbox.arun_code(call.snippet, **call.limits)
        except CodepoolError as exc:  # the sandbox refused the call's limits, say
            raise HTTPException(422, str(exc)) from None
        finally:
            self.in_flight -= 1


def build_app(service: Service) -> Starlette:
    """The ASGI app: the two SandboxFusion endpoints, ``/v1/ping`` as SandboxFusion has
    it, and ``/health``."""

    def endpoint(
        parse: Callable[[Any], Call],
        respond: Callable[[ExecResult], dict[str, Any]],
        *,
        jupyter: bool,
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            service.authorize(request)
            try:
                call = parse(await service.body(request))
            except BadRequest as exc:
                raise HTTPException(exc.status, str(exc)) from None
            if call.snippet is None:
                return JSONResponse(sandbox_fusion.refusal_response(call.refusal, jupyter=jupyter))
            try:
                result = await service.run(call)
            except HTTPException:
                raise
            except Exception as exc:  # the pool's own fault: the client sees SandboxError
                log.exception("request failed inside codepool")
                message = f"codepool: internal error: {type(exc).__name__}: {exc}"
                return JSONResponse(sandbox_fusion.refusal_response(message, jupyter=jupyter))
            return JSONResponse(respond(result))

        return handle

    async def ping(request: Request) -> Response:
        return PlainTextResponse("pong")

    async def health(request: Request) -> Response:
        service.authorize(request)
        live = await asyncio.to_thread(service.sandbox.pool.watch)
        body = {"ok": bool(live), "live_dispatchers": live, "in_flight": service.in_flight}
        return JSONResponse(body, status_code=200 if live else 503)

    async def refuse(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    routes = [
        Route(
            "/run_code",
            endpoint(sandbox_fusion.run_code_call, sandbox_fusion.run_code_response, jupyter=False),
            methods=["POST"],
        ),
        Route(
            "/run_jupyter",
            endpoint(
                sandbox_fusion.run_jupyter_call, sandbox_fusion.run_jupyter_response, jupyter=True
            ),
            methods=["POST"],
        ),
        Route("/v1/ping", ping, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: refuse})
