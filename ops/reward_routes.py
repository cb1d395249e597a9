"""Rewards by fork over HTTP: ``POST /run_tests`` on ``codepool serve`` runs a
candidate against test cases (``RemoteSandbox.arun_tests``: loaded once, each case in
a fork of it), with the token and 4xx rules of serve's other routes.

The body: ``candidate`` (the program), and either ``cases`` (a list of ``{"code",
"stdin", "expected_stdout"}``, each optional) with an optional ``prefix``, or
``ground_truth`` in verl's ``sandbox_fusion`` format (``inputs``/``outputs``, optional
``fn_name``, ``assert_case``); ``timeout_s`` per case (default 10), ``memory_mb``.
The answer: ``{"passed": k, "total": n, "results": [{"verdict", "forked", "status",
"returncode", "stdout", "stderr", "exec_s"}, ...]}``.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from codepool.common.case_formats import sandbox_fusion_cases
from codepool.common.errors import CodepoolError, ConfigError
from codepool.common.reward_tests import DEFAULT_TIMEOUT_S, Case, CaseResult
from codepool.ops.context_routes import Service  # what routes need of the server

FIELDS = ("candidate", "cases", "prefix", "ground_truth", "timeout_s", "memory_mb")
CASE_FIELDS = ("code", "stdin", "expected_stdout")


def tests_request(body: Any) -> tuple[str, str, list[Case], dict[str, Any]]:
    """The candidate, prefix, cases and limits of a ``/run_tests`` body; ConfigError
    (a 400) when it is malformed."""
    if not isinstance(body, dict):
        raise ConfigError("the body must be a JSON object")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown fields: {unknown}; known: {list(FIELDS)}")
    candidate = body.get("candidate")
    if not isinstance(candidate, str):
        raise ConfigError("candidate must be a string (the program)")
    if ("cases" in body) == ("ground_truth" in body):
        raise ConfigError("give either cases or ground_truth")
    if "ground_truth" in body:
        prefix, cases = sandbox_fusion_cases(body["ground_truth"])
    else:
        prefix = body.get("prefix", "")
        if not isinstance(prefix, str):
            raise ConfigError("prefix must be a string")
        cases = _cases(body["cases"])
    limits: dict[str, Any] = {}
    timeout_s = body.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise ConfigError("timeout_s must be a number")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ConfigError("timeout_s must be positive")
    limits["timeout_s"] = float(timeout_s)
    if "memory_mb" in body:
        memory_mb = body["memory_mb"]
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
            raise ConfigError("memory_mb must be a positive integer")
        limits["memory_mb"] = memory_mb
    return candidate, prefix, cases, limits


def _cases(raw: Any) -> list[Case]:
    if not isinstance(raw, list):
        raise ConfigError("cases must be a list")
    cases = []
    for item in raw:
        if not isinstance(item, dict) or set(item) - set(CASE_FIELDS):
            raise ConfigError(f"each case is an object with some of {list(CASE_FIELDS)}")
        code, stdin, expected = item.get("code", ""), item.get("stdin"), item.get("expected_stdout")
        if not isinstance(code, str):
            raise ConfigError("a case's code must be a string")
        for name, value in (("stdin", stdin), ("expected_stdout", expected)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"a case's {name} must be a string or null")
        cases.append(Case(code, stdin, expected))
    return cases


def tests_response(results: list[CaseResult]) -> dict[str, Any]:
    return {
        "passed": sum(result.passed for result in results),
        "total": len(results),
        "results": [
            {
                "verdict": case.verdict,
                "forked": case.forked,
                "status": case.result.status,
                "returncode": case.result.returncode,
                "stdout": case.result.stdout,
                "stderr": case.result.stderr,
                "exec_s": case.result.exec_s,
            }
            for case in results
        ],
    }


def reward_routes(service: Service) -> list[Route]:
    """``/run_tests`` over ``service``'s sandbox."""

    async def run_tests(request: Request) -> Response:
        service.authorize(request)
        try:
            candidate, prefix, cases, limits = tests_request(await service.body(request))
        except ConfigError as exc:
            raise HTTPException(400, str(exc)) from None

        async def work() -> list[CaseResult] | None:
            running = asyncio.ensure_future(
                service.sandbox.arun_tests(candidate, cases, prefix=prefix, **limits)
            )
            gone = asyncio.ensure_future(_disconnected(request))
            try:
                await asyncio.wait({running, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not running.done():  # the client left: its runs are cancelled
                    running.cancel()
            return None if running.cancelled() else running.result()

        try:
            results = await service.hold(work)
        except CodepoolError as exc:  # limits the sandbox refuses, say
            raise HTTPException(422, str(exc)) from None
        if results is None:
            return Response(status_code=499)
        return JSONResponse(tests_response(results))

    return [Route("/run_tests", run_tests, methods=["POST"])]


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
