"""The HTTP front of the pool: SandboxFusion's ``/run_code`` and ``/run_jupyter`` over a
RemoteSandbox, so concurrent requests are coalesced into batches that every live
worker host shares.

Starlette (an ASGI toolkit without a validation framework of its own: the request
models are SandboxFusion's and live in ops/sandbox_fusion.py) on uvicorn. Bounded by
design: a request body over ``max_body_bytes`` is refused while it is read, and at most
``max_in_flight`` requests wait on the pool at once (more get 503 and a reason), so
thousands of clients cost bounded memory. A request that cannot start within its own
budget gets 504 and ``Retry-After`` at once (ops/admission.py), and a client that
disconnects takes its work with it: its call is cancelled (common/cancellation.py).
Every refusal is a 4xx/503/504 with a JSON ``{"detail": reason}``; nothing a client
sends makes a 500. A server that stops drains: calls already waiting on the pool may
finish until ``give_up``, then get a 503 (retry elsewhere) rather than a dropped
connection.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

from codepool.common.errors import CodepoolError
from codepool.common.result import ExecResult
from codepool.ops import sandbox_fusion
from codepool.ops.admission import Admission, pool_slots, retry_after_s, start_budget_s
from codepool.ops.context_routes import (
    DEFAULT_IDLE_S,
    DEFAULT_MAX_OPEN,
    OpenContexts,
    context_routes,
)
from codepool.ops.e2b.routes import e2b_routes
from codepool.ops.e2b.sandboxes import Sandboxes
from codepool.ops.reward_routes import reward_routes
from codepool.ops.sandbox_fusion import BadRequest, RequestedRun
from codepool.producer.sandbox import RemoteSandbox

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 << 20
DEFAULT_MAX_IN_FLIGHT = 4096
STOPPING = "codepool serve is stopping; retry on another server or once it is back"
GAVE_UP = "codepool serve stopped before this call finished; retry it"
# The pool's slots are looked up again at most this often (seconds).
SLOTS_EVERY_S = 2.0
# The header a client may state its own timeout in (seconds, the whole request).
TIMEOUT_HEADER = "x-request-timeout"
# Loop turns a request about to be refused waits for disconnects to be taken first.
RECHECK_TURNS = 8

T = TypeVar("T")


class Service:
    """The state behind the routes: the sandbox, the token, the bounds, the open
    interpreter contexts (``max_contexts`` at once; one idle ``context_idle_s`` seconds
    is forgotten, see ops/context_routes.py)."""

    def __init__(
        self,
        sandbox: RemoteSandbox,
        *,
        token: str | None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_contexts: int = DEFAULT_MAX_OPEN,
        context_idle_s: float = DEFAULT_IDLE_S,
    ) -> None:
        self.sandbox = sandbox
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.draining = False  # the server stops: no new call is taken
        self._gave_up = False
        self._waiting: set[asyncio.Task[Any]] = set()  # the calls waiting on the pool
        self.admission = Admission()
        self._slots_at = -1e9
        self._slots_task: asyncio.Task[None] | None = None
        self.contexts = OpenContexts(max_open=max_contexts, idle_s=context_idle_s)
        self.e2b = Sandboxes(sandbox)  # E2B's sandboxes (ops/e2b/, under /e2b)

    def drain(self) -> None:
        """Take no new call (503); those waiting may still finish."""
        self.draining = True

    def give_up(self) -> None:
        """Answer every call still waiting on the pool with a 503, now."""
        self.draining = self._gave_up = True
        for task in list(self._waiting):
            task.cancel()

    def refresh_slots(self) -> None:
        """Look the pool's slots up (blocking; serve calls it once before it listens)."""
        self._slots_at = time.monotonic()
        pool = self.sandbox.pool
        try:
            self.admission.set_slots(pool_slots(pool.conn, pool.settings))
        except Exception as exc:  # a guess that is off only delays an early answer
            log.warning("could not look up the pool's slots: %s", exc)

    def _look_at_slots(self) -> None:
        """Have the pool's slots looked up again, off the request's path."""
        if time.monotonic() - self._slots_at < SLOTS_EVERY_S:
            return
        if self._slots_task is None or self._slots_task.done():
            self._slots_at = time.monotonic()
            self._slots_task = asyncio.ensure_future(self._refresh_slots())

    async def _refresh_slots(self) -> None:
        pool = self.sandbox.pool
        try:
            slots = await asyncio.to_thread(pool_slots, pool.conn, pool.settings)
        except Exception as exc:  # a guess that is off only delays an early answer
            log.warning("could not look up the pool's slots: %s", exc)
            return
        self.admission.set_slots(slots)

    def authorize(self, request: Request) -> None:
        if self.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), self.token):
            raise HTTPException(401, "missing or wrong token: send 'Authorization: Bearer <token>'")

    async def body(self, request: Request, *, optional: bool = False) -> Any:
        """The request's JSON body (``optional``: an empty body is ``{}``)."""
        size = int(request.headers.get("content-length") or 0)
        if size > self.max_body_bytes:
            raise HTTPException(413, f"body of {size} bytes is over {self.max_body_bytes}")
        chunks, received = [], 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > self.max_body_bytes:
                raise HTTPException(413, f"body is over {self.max_body_bytes} bytes")
            chunks.append(chunk)
        if optional and not any(chunks):
            return {}
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as exc:
            raise HTTPException(400, f"the body is not JSON: {exc}") from None

    def _admit(self) -> None:
        """Refuse a new call with a 503 while the server stops or at ``max_in_flight``."""
        if self.draining:
            raise HTTPException(503, STOPPING)
        if self.in_flight >= self.max_in_flight:
            raise HTTPException(
                503,
                f"busy: {self.in_flight} requests in flight; retry later",
                headers={"Retry-After": "1"},
            )

    async def hold(self, work: Callable[[], Awaitable[T]]) -> T:
        """Await ``work()`` as one of the calls this server has in flight (a context's call,
        say): refused with a 503 while the server stops or beyond ``max_in_flight``, and
        answered with a 503 when ``give_up`` comes first."""
        self._admit()
        with self._waiting_on_pool():
            return await work()

    @contextmanager
    def _waiting_on_pool(self) -> Iterator[None]:
        """Count the calling task in flight and let ``give_up`` cancel it. Cancelled by
        give_up alone (not by the server or the client going away), its client gets an
        answer it can act on: a 503."""
        self.in_flight += 1
        task = asyncio.current_task()
        if task is not None:
            self._waiting.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if self._gave_up and task is not None and task.uncancel() == 0:
                raise HTTPException(503, GAVE_UP) from None
            raise
        finally:
            self.in_flight -= 1
            if task is not None:
                self._waiting.discard(task)

    async def run(self, call: RequestedRun, request: Request) -> ExecResult | None:
        """The call's result; None if its client left first (the call is cancelled)."""
        self._admit()
        self._look_at_slots()
        budget_s = start_budget_s(
            header=request.headers.get(TIMEOUT_HEADER),
            timeout_s=float(call.limits["timeout_s"]),
            compile_s=call.compile_s,
        )
        refused = self.admission.admit(budget_s)
        if refused is not None:
            # Clients that left just before this request came may not be seen yet (each
            # disconnect takes the loop a few turns): let it take them, then ask again.
            for _ in range(RECHECK_TURNS):
                await asyncio.sleep(0)
            refused = self.admission.admit(budget_s)
        if refused is not None:
            raise HTTPException(
                504,
                f"busy: this request would wait about {refused:.1f} s for a slot, over its "
                f"budget of {budget_s:.1f} s (its compile_timeout, or {TIMEOUT_HEADER} less "
                "its run_timeout); retry later",
                headers={"Retry-After": str(retry_after_s(refused))},
            )
        ran = False
        with self._waiting_on_pool():
            try:
                work = asyncio.ensure_future(self.sandbox.arun_code(call.snippet, **call.limits))
                gone = asyncio.ensure_future(_disconnected(request))
                try:
                    await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    gone.cancel()
                    left = not work.done()
                    if left:  # the client left (or serve stops): nobody waits for it
                        work.cancel()
                if left:
                    return None
                result = work.result()
                ran = True
                return result
            except CodepoolError as exc:  # the sandbox refused the call's limits, say
                raise HTTPException(422, str(exc)) from None
            finally:
                self.admission.answered(ran=ran)


async def _disconnected(request: Request) -> None:
    """Returns once the client has disconnected (its body is read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(service: Service) -> Starlette:
    """The ASGI app: the two SandboxFusion endpoints, ``/v1/ping`` as SandboxFusion has
    it, ``/health``, the interpreter contexts' ``/contexts`` (ops/context_routes.py),
    ``/run_tests`` (ops/reward_routes.py) and E2B's protocol under ``/e2b``
    (ops/e2b/routes.py)."""

    def endpoint(
        parse: Callable[[Any], RequestedRun],
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
                result = await service.run(call, request)
            except HTTPException:
                raise
            except Exception as exc:  # the pool's own fault: the client sees SandboxError
                log.exception("request failed inside codepool")
                message = f"codepool: internal error: {type(exc).__name__}: {exc}"
                return JSONResponse(sandbox_fusion.refusal_response(message, jupyter=jupyter))
            if result is None:  # nobody to answer: the client left, its call was cancelled
                return Response(status_code=499)
            return JSONResponse(respond(result))

        return handle

    async def ping(request: Request) -> Response:
        return PlainTextResponse("pong")

    async def health(request: Request) -> Response:
        service.authorize(request)
        live = await asyncio.to_thread(service.sandbox.pool.watch)
        body = {
            "ok": bool(live),
            "live_hosts": live,
            "in_flight": service.in_flight,
            "slots": service.admission.slots,
            "start_wait_s": round(service.admission.wait_s(), 3),
            "open_contexts": len(service.contexts),
        }
        return JSONResponse(body, status_code=200 if live else 503)

    async def refuse(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse(
            {"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers
        )

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
        *context_routes(service, service.contexts),
        *reward_routes(service),
        Mount("/e2b", routes=e2b_routes(service, service.e2b)),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: refuse})


class DrainingServer(uvicorn.Server):
    """uvicorn's server, stopping as codepool's commands stop: the first SIGTERM or
    SIGINT closes the listener and lets the calls waiting on the pool finish for
    ``drain_s`` seconds, then answers the rest with a 503 (Service.give_up); a second
    signal answers them now. It returns normally (no signal raised again), so the
    caller stops the pool next."""

    def __init__(self, config: uvicorn.Config, service: Service, *, drain_s: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_s = drain_s
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if loop is None:
            super().handle_exit(sig, frame)
        elif not self.should_exit:
            self.should_exit = True
            loop.call_soon_threadsafe(self._drain, loop)
        else:
            loop.call_soon_threadsafe(self.service.give_up)

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        self.service.drain()
        loop.call_later(self.drain_s, self.service.give_up)
