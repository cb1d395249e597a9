"""Interpreter contexts over HTTP (ops/context_routes.py): open, run with state kept, fork
and the forks' isolation, close, the token rule, the 4xx rules, and a stopping serve
closing what is open. Real processes throughout: serve, its private Redis (or the
test's), its worker."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from sandbox_fusion import RunCodeResponse

from codepool.common.keys import Keys
from codepool.common.reaping import wait_or_kill
from tests.conftest import StartWorker, wait_until
from tests.ops.test_serve import Serve, start_serve

TOKEN = "ctx-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """One serve on the embedded default (its worker in fork mode), with a token."""
    server = start_serve(tmp_path_factory.mktemp("serve") / "serve.log", "--token", TOKEN)
    yield server
    server.process.send_signal(signal.SIGTERM)
    wait_or_kill(server.process, 30)


def call(
    serve: Serve, method: str, path: str, body: Any = None, **kwargs: Any
) -> requests.Response:
    kwargs = {"headers": AUTH, "timeout": 60, **kwargs}
    if isinstance(body, bytes):
        return requests.request(method, f"{serve.url}{path}", data=body, **kwargs)
    return requests.request(method, f"{serve.url}{path}", json=body, **kwargs)


def open_context(serve: Serve, body: Any = None) -> str:
    response = call(serve, "POST", "/contexts", body)
    assert response.status_code == 201, response.text
    return str(response.json()["context_id"])


def run(serve: Serve, context_id: str, code: str, **extra: Any) -> dict[str, Any]:
    response = call(serve, "POST", f"/contexts/{context_id}/run", {"code": code, **extra})
    assert response.status_code == 200, response.text
    return dict(response.json())


def stdout(body: dict[str, Any]) -> str:
    assert body["status"] == "Success", body
    return str(body["run_result"]["stdout"])


def test_a_context_keeps_its_state_between_calls(serve: Serve) -> None:
    context_id = open_context(serve)
    first = run(serve, context_id, "def f(x):\n    return x + 1\ndata = [1]")
    second = run(serve, context_id, "data.append(f(1))\nprint(data)")
    assert stdout(first) == "" and stdout(second) == "[1, 2]\n"
    assert (second["context_id"], second["rebuilt"], second["ended"]) == (context_id, False, None)
    # /run_code's shape: SandboxFusion's own client model reads it.
    parsed = RunCodeResponse(**second)
    assert parsed.run_result is not None and parsed.run_result.stdout == "[1, 2]\n"
    error = run(serve, context_id, "f(undefined_name)")
    assert error["status"] == "Failed" and "NameError" in error["run_result"]["stderr"]
    assert error["ended"] is None  # an error is a result, the context lives on
    assert stdout(run(serve, context_id, "print(data)")) == "[1, 2]\n"
    info = call(serve, "GET", f"/contexts/{context_id}").json()
    assert (info["recorded_calls"], info["rebuild"], info["ended"]) == (3, True, None)
    assert call(serve, "DELETE", f"/contexts/{context_id}").status_code == 204


def test_forks_start_from_their_parent_and_are_their_own(serve: Serve) -> None:
    parent = open_context(serve)
    assert stdout(run(serve, parent, "data = [1]\nopen('f.txt', 'w').write('p')")) == ""
    forked = call(serve, "POST", f"/contexts/{parent}/fork", {"n": 2})
    assert forked.status_code == 201, forked.text
    left, right = forked.json()["context_ids"]
    assert len({parent, left, right}) == 3
    changed = "data.append(2)\nopen('f.txt', 'w').write('l')\nprint(data, open('f.txt').read())"
    assert stdout(run(serve, left, changed)) == "[1, 2] l\n"
    shown = "print(data, open('f.txt').read())"
    assert stdout(run(serve, right, shown)) == "[1] p\n"
    assert stdout(run(serve, parent, shown)) == "[1] p\n"
    # No body: one fork.
    (one,) = call(serve, "POST", f"/contexts/{left}/fork").json()["context_ids"]
    assert stdout(run(serve, one, "print(data)")) == "[1, 2]\n"
    for context_id in (parent, left, right, one):
        assert call(serve, "DELETE", f"/contexts/{context_id}").status_code == 204


def test_a_closed_context_is_unknown(serve: Serve) -> None:
    context_id = open_context(serve)
    assert stdout(run(serve, context_id, "x = 1")) == ""
    assert call(serve, "DELETE", f"/contexts/{context_id}").status_code == 204
    for method, path, body in (
        ("POST", f"/contexts/{context_id}/run", {"code": "print(x)"}),
        ("POST", f"/contexts/{context_id}/fork", {}),
        ("GET", f"/contexts/{context_id}", None),
        ("DELETE", f"/contexts/{context_id}", None),
    ):
        response = call(serve, method, path, body)
        assert response.status_code == 404, (method, path, response.text)
        assert "no open context" in response.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/contexts/0123abcd/run"),
        ("POST", "/contexts/0123abcd/fork"),
        ("GET", "/contexts/0123abcd"),
        ("DELETE", "/contexts/0123abcd"),
    ],
)
def test_an_unknown_id_is_404(serve: Serve, method: str, path: str) -> None:
    response = call(serve, method, path, {"code": "1"} if path.endswith("run") else None)
    assert response.status_code == 404, response.text
    assert "'0123abcd'" in response.json()["detail"]


def test_the_token_is_required_on_every_context_route(serve: Serve) -> None:
    context_id = open_context(serve)
    assert stdout(run(serve, context_id, "n = 0")) == ""
    routes = [
        ("POST", "/contexts", {}),
        ("POST", f"/contexts/{context_id}/run", {"code": "n += 1"}),
        ("POST", f"/contexts/{context_id}/fork", {}),
        ("GET", f"/contexts/{context_id}", None),
        ("DELETE", f"/contexts/{context_id}", None),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        for method, path, body in routes:
            response = call(serve, method, path, body, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert "Authorization: Bearer" in response.json()["detail"]
    # Nothing refused ran, forked or closed.
    assert stdout(run(serve, context_id, "print(n)")) == "0\n"
    assert call(serve, "GET", f"/contexts/{context_id}").json()["recorded_calls"] == 2
    assert call(serve, "DELETE", f"/contexts/{context_id}").status_code == 204


@pytest.mark.parametrize(
    ("where", "body", "status", "reason"),
    [
        ("open", b"{not json", 400, "not JSON"),
        ("open", [1], 422, "must be a JSON object"),
        ("open", {"run_timeout": -1}, 422, "run_timeout: must be a positive number"),
        ("open", {"run_timeout": "5"}, 422, "run_timeout: must be int or float"),
        ("open", {"rebuild": "yes"}, 422, "rebuild: must be true or false"),
        ("open", {"memory_limt_MB": 64}, 422, "unknown field 'memory_limt_MB'"),
        ("run", b"", 400, "not JSON"),
        ("run", {}, 422, "code: field required"),
        ("run", {"code": 5}, 422, "code: must be str"),
        ("run", {"code": "1", "run_timeout": 0}, 422, "run_timeout: must be a positive"),
        ("run", {"code": "1", "language": "python"}, 422, "unknown field 'language'"),
        ("fork", {"n": 0}, 422, "n: must be from 1 to 64"),
        ("fork", {"n": 65}, 422, "n: must be from 1 to 64"),
        ("fork", {"n": 2.0}, 422, "n: must be int"),
        ("fork", {"n": True}, 422, "n: must be int"),
    ],
)
def test_a_bad_body_gets_a_4xx_with_a_reason(
    serve: Serve, where: str, body: Any, status: int, reason: str
) -> None:
    context_id = open_context(serve)
    try:
        path = "/contexts" if where == "open" else f"/contexts/{context_id}/{where}"
        response = call(serve, "POST", path, body)
        assert response.status_code == status, response.text
        assert reason in response.json()["detail"]
        # The context is untouched by a refused request.
        assert stdout(run(serve, context_id, "print('alive')")) == "alive\n"
    finally:
        call(serve, "DELETE", f"/contexts/{context_id}")


def test_a_timeout_ends_the_context_and_then_it_is_409(serve: Serve) -> None:
    context_id = open_context(serve, {"run_timeout": 300})
    assert stdout(run(serve, context_id, "x = 5")) == ""
    (kept,) = call(serve, "POST", f"/contexts/{context_id}/fork").json()["context_ids"]
    # The call's own run_timeout, over the context's 300 s (which would outlast the
    # request's own 60 s).
    timed_out = run(serve, context_id, "while True: pass", run_timeout=1)
    assert (timed_out["status"], timed_out["run_result"]["status"]) == (
        "Failed",
        "TimeLimitExceeded",
    )
    assert timed_out["run_result"]["execution_time"] < 60, timed_out
    assert timed_out["limit"] == "wall_time" and timed_out["ended"], timed_out
    after = call(serve, "POST", f"/contexts/{context_id}/run", {"code": "print(x)"})
    assert after.status_code == 409 and "the context ended" in after.json()["detail"]
    refork = call(serve, "POST", f"/contexts/{context_id}/fork")
    assert refork.status_code == 409, refork.text
    # Its fork lives on.
    assert stdout(run(serve, kept, "print(x)")) == "5\n"
    for each in (context_id, kept):
        assert call(serve, "DELETE", f"/contexts/{each}").status_code == 204


def test_stopping_serve_closes_its_open_contexts(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker()
    server = start_serve(tmp_path / "serve.log", "--url", redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        opened = [open_context(server) for _ in range(2)]
        assert stdout(run(server, opened[0], "x = 1")) == ""
        assert all(client.exists(Keys().context(each)) for each in opened)
        health = requests.get(f"{server.url}/health", timeout=30).json()
        assert health["open_contexts"] == 2
    finally:
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0, server.log()
    assert not any(client.exists(Keys().context(each)) for each in opened)
    client.close()


def test_an_idle_context_is_forgotten_when_the_next_opens(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    start_worker()
    server = start_serve(tmp_path / "serve.log", "--url", redis_url, "--context-idle", "1")
    opened: list[str] = []

    def forgotten() -> bool:
        opened.append(open_context(server))
        return call(server, "GET", f"/contexts/{opened[0]}").status_code == 404

    try:
        wait_until(forgotten, timeout_s=30, what="the first context forgotten")
        client = redis.Redis.from_url(redis_url)
        # Forgotten is closed on its host too, not left to its TTL.
        wait_until(lambda: not client.exists(Keys().context(opened[0])), what="closed")
        client.close()
        # The last one opened is not idle yet.
        assert call(server, "GET", f"/contexts/{opened[-1]}").status_code == 200
    finally:
        server.process.send_signal(signal.SIGTERM)
        wait_or_kill(server.process, 30)
