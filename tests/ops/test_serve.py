"""``codepool serve`` as SandboxFusion's clients see it: its published client, raw JSON
as verl posts it, a burst of concurrent requests, the 4xx rules, the token rule and the
embedded default's teardown. Real processes throughout: serve, its private Redis, its
worker."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from sandbox_fusion import RunCodeRequest, RunJupyterRequest, run_code, run_jupyter

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.reaping import wait_or_kill
from codepool.common.result import infra, rejected
from codepool.ops import sandbox_fusion as protocol
from codepool.ops.bench.process_tree import descendants
from codepool.ops.serve_command import LISTENING
from codepool.ops.server_binary import find_server_binary
from tests.conftest import KILLED_WITHIN_S, StartWorker, sleeping_below, sleeping_pids, wait_until
from tests.processes import processes, still_running


@dataclass
class Serve:
    process: subprocess.Popen[str]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_serve(log_path: Path, *args: str, env: dict[str, str] | None = None) -> Serve:
    """``codepool serve --port 0 ARGS``, once it says where it listens."""
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "codepool.ops.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**environ, **(env or {})},
        )
    assert process.stdout is not None
    for line in process.stdout:  # the line comes once the pool is ready
        match = LISTENING.search(line)
        if match:
            return Serve(process, match.group(1), log_path)
    process.wait(timeout=30)
    raise AssertionError(f"serve exited ({process.returncode}):\n{log_path.read_text()}")


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """One serve on the embedded default (no --url, no REDIS_URL) for the module."""
    server = start_serve(tmp_path_factory.mktemp("serve") / "serve.log")
    yield server
    server.process.send_signal(signal.SIGTERM)
    wait_or_kill(server.process, 30)


def post(serve: Serve, path: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(f"{serve.url}{path}", json=body, **{"timeout": 60, **kwargs})


def test_the_published_client_runs_code(serve: Serve) -> None:
    ok = run_code(RunCodeRequest(code="print(2 + 3)", language="python"), endpoint=serve.url)
    assert ok.status == "Success" and ok.run_result is not None
    assert (ok.run_result.status, ok.run_result.return_code, ok.run_result.stdout) == (
        "Finished",
        0,
        "5\n",
    )
    error = run_code(RunCodeRequest(code="1 / 0", language="python"), endpoint=serve.url)
    assert error.status == "Failed" and error.run_result is not None
    assert error.run_result.return_code == 1
    assert error.run_result.stderr == (
        'Traceback (most recent call last):\n  File "<sandbox>", line 1, in <module>\n'
        "ZeroDivisionError: division by zero\n"
    )
    slow = RunCodeRequest(code="import time; time.sleep(30)", language="python", run_timeout=1)
    timeout = run_code(slow, endpoint=serve.url)
    assert timeout.status == "Failed" and timeout.run_result is not None
    assert timeout.run_result.status == "TimeLimitExceeded"
    assert timeout.run_result.return_code is None
    # The published client's models ignore the one field codepool adds.
    assert not hasattr(timeout, "limit")


def test_the_published_client_with_stdin_and_files(serve: Serve) -> None:
    request = RunCodeRequest(
        code=(
            "n = int(input())\n"
            "text = open('data/in.txt').read()\n"
            "open('out.txt', 'w').write(text * n)"
        ),
        language="python",
        stdin="3\n",
        files={"data/in.txt": base64.b64encode(b"ab").decode()},
        fetch_files=["out.txt", "not-there.txt"],
    )
    response = run_code(request, endpoint=serve.url)
    assert response.status == "Success", response
    assert response.files == {"out.txt": base64.b64encode(b"ababab").decode()}


def test_the_published_client_runs_notebook_cells(serve: Serve) -> None:
    cells = [
        "a = 123",
        "a",
        "print(a)",
        'import sys; sys.stderr.write("stderr message")',
        'raise RuntimeError("error message")',
    ]
    response = run_jupyter(RunJupyterRequest(cells=cells), endpoint=serve.url)
    assert response.status == "Success"
    outputs = [(c.stdout, c.stderr, c.display) for c in response.cells]
    assert outputs == [
        ("", "", []),
        ("", "", [{"text/plain": "123"}]),
        ("123\n", "", []),
        ("", "stderr message", [{"text/plain": "14"}]),
        ("", "", []),
    ]
    error = response.cells[4].error
    assert [(e["ename"], e["evalue"]) for e in error] == [("RuntimeError", "error message")]
    assert error[0]["traceback"][-1] == "RuntimeError: error message"


def test_another_language_is_a_sandbox_error(serve: Serve) -> None:
    with pytest.raises(Exception, match="not supported by codepool; supported: python"):
        run_code(
            RunCodeRequest(code="int main(){}", language="cpp"), endpoint=serve.url, max_attempts=1
        )


def test_raw_json_as_verl_posts_it(serve: Serve) -> None:
    payload = {
        "compile_timeout": 10,
        "run_timeout": 10,
        "code": "a, b = map(int, input().split())\nprint(a + b)",
        "stdin": "2 40",
        "memory_limit_MB": 1024,
        "language": "python",
        "files": {},
        "fetch_files": [],
    }
    response = requests.post(
        f"{serve.url}/run_code",
        data=json.dumps(payload),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        timeout=60,
    )
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "Success" and body["run_result"]["stdout"] == "42\n"
    assert set(body) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
        "limit",
    }
    assert body["limit"] is None
    assert set(body["run_result"]) == {
        "status",
        "execution_time",
        "return_code",
        "stdout",
        "stderr",
    }


def test_a_burst_of_concurrent_requests(serve: Serve) -> None:
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=64, pool_maxsize=64)
    session.mount("http://", adapter)

    def one(i: int) -> str:
        body = {"code": f"print({i} * 3)", "language": "python", "run_timeout": 10}
        response = session.post(f"{serve.url}/run_code", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return str(response.json()["run_result"]["stdout"])

    with ThreadPoolExecutor(64) as threads:
        outputs = list(threads.map(one, range(300)))
    assert outputs == [f"{i * 3}\n" for i in range(300)]


@pytest.mark.parametrize(
    ("path", "body", "status", "reason"),
    [
        ("/run_code", b"{not json", 400, "not JSON"),
        ("/run_code", [1, 2], 422, "must be a JSON object"),
        ("/run_code", {"language": "python"}, 422, "code: field required"),
        ("/run_code", {"code": 5, "language": "python"}, 422, "code: must be str"),
        ("/run_code", {"code": "1", "language": "python", "run_timeout": -1}, 422, "positive"),
        ("/run_code", {"code": "1", "language": "python", "stdin": 7}, 422, "stdin"),
        (
            "/run_code",
            {"code": "1", "language": "python", "files": {"a": "!!!"}},
            422,
            "not base64",
        ),
        (
            "/run_code",
            {"code": "1", "language": "python", "files": {"../a": "YQ=="}},
            422,
            "no '..'",
        ),
        ("/run_code", {"code": "1", "language": "python", "fetch_files": "x"}, 422, "must be list"),
        ("/run_jupyter", {"cells": "print(1)"}, 422, "cells: must be list"),
        ("/run_jupyter", {"cells": [1]}, 422, "every cell must be a string"),
        ("/run_jupyter", {"cells": ["1"], "kernel": "julia"}, 422, "not supported"),
    ],
)
def test_malformed_requests_get_a_4xx_with_a_reason(
    serve: Serve, path: str, body: Any, status: int, reason: str
) -> None:
    if isinstance(body, bytes):
        response = requests.post(f"{serve.url}{path}", data=body, timeout=30)
    else:
        response = post(serve, path, body)
    assert response.status_code == status, response.text
    assert reason in response.json()["detail"]


def test_wrong_methods_and_paths(serve: Serve) -> None:
    assert requests.get(f"{serve.url}/run_code", timeout=30).status_code == 405
    assert requests.post(f"{serve.url}/nowhere", json={}, timeout=30).status_code == 404
    assert requests.get(f"{serve.url}/v1/ping", timeout=30).text == "pong"
    health = requests.get(f"{serve.url}/health", timeout=30).json()
    assert health["ok"] is True and health["live_hosts"] >= 1


# Snippets that reach each limit under the pool's default limits (max_file_mb 16,
# max_procs 32, max_output_chars 4096) or the request's (run_timeout, memory_limit_MB).
FORK_64 = (
    "import os\nr, w = os.pipe()\nfor _ in range(64):\n"
    "    if os.fork() == 0:\n        os.close(w)\n        os.read(r, 1)\n        os._exit(0)"
)
LIMIT_REQUESTS = {
    "wall_time": {"code": "import time\ntime.sleep(60)", "run_timeout": 0.5},
    "memory": {"code": "x = bytearray(512 << 20)", "memory_limit_MB": 128},
    "file_size": {"code": "open('big', 'wb').write(b'x' * (17 << 20))"},
    "processes": {"code": FORK_64},
    "output": {"code": "print('x' * 5000)"},
}
# As SandboxFusion's server answers the same run: (status, run_result status, return code).
LIMIT_STATUSES = {
    "wall_time": ("Failed", "TimeLimitExceeded", None),
    "memory": ("Failed", "Finished", 1),
    "file_size": ("Failed", "Finished", 1),
    "processes": ("Failed", "Finished", 1),
    "output": ("Success", "Finished", 0),
}


@pytest.mark.parametrize("limit", list(LIMIT_REQUESTS))
def test_each_limit_is_named_beside_sandbox_fusions_own_statuses(serve: Serve, limit: str) -> None:
    response = post(serve, "/run_code", {"language": "python", **LIMIT_REQUESTS[limit]})
    assert response.status_code == 200, response.text
    body = response.json()
    run = body["run_result"]
    assert (body["status"], run["status"], run["return_code"]) == LIMIT_STATUSES[limit], body
    assert body["limit"] == limit, body


def test_a_notebook_stopped_by_its_total_timeout_names_the_wall_clock(serve: Serve) -> None:
    cells = ["a = 1", "import time\ntime.sleep(60)"]
    body = post(serve, "/run_jupyter", {"cells": cells, "total_timeout": 1}).json()
    assert (body["status"], body["driver"]["status"], body["limit"]) == (
        "Failed",
        "TimeLimitExceeded",
        "wall_time",
    )
    assert len(body["cells"]) == 1  # the cell that finished


def test_the_cpu_limit_is_named_and_finished_as_sandbox_fusion_has_it(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    # SandboxFusion's requests carry no CPU limit: a worker's ceiling sets one.
    start_worker("--max-cpu-s", "1")
    server = start_serve(tmp_path / "serve.log", "--url", redis_url)
    try:
        # A wall-clock limit far above it, so that it is the CPU limit that ends the
        # loop even on a machine so busy that 1 s of CPU takes many seconds.
        request = {"code": "while True: pass", "language": "python", "run_timeout": 100}
        body = post(server, "/run_code", request).json()
    finally:
        server.process.send_signal(signal.SIGTERM)
        wait_or_kill(server.process, 30)
    run = body["run_result"]
    # Killed by a signal: Finished with -N, as SandboxFusion reports any killed process.
    assert (body["status"], run["status"], body["limit"]) == ("Failed", "Finished", "cpu_time")
    assert run["return_code"] in (-24, -9), body


def test_results_codepool_could_not_produce_are_sandbox_errors() -> None:
    body = protocol.run_code_response(infra("codepool: no live worker"))
    assert (body["status"], body["message"], body["run_result"]) == (
        "SandboxError",
        "codepool: no live worker",
        None,
    )
    notebook = protocol.run_jupyter_response(rejected("rejected: too big"))
    assert notebook["status"] == "SandboxError" and notebook["cells"] == []
    assert body["limit"] is None and notebook["limit"] is None


def test_beyond_loopback_a_token_is_required(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "codepool.ops.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "CODEPOOL_SERVE_TOKEN"},
    )
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in refused.stderr
    assert "--insecure-no-token" in refused.stderr


def test_a_token_is_checked(redis_url: str, start_worker: StartWorker, tmp_path: Path) -> None:
    start_worker()
    args = ("--url", redis_url, "--token", "s3cret", "--max-in-flight", "1")
    server = start_serve(tmp_path / "serve.log", *args)
    try:
        body = {"code": "print('in')", "language": "python"}
        missing = post(server, "/run_code", body)
        wrong = post(server, "/run_code", body, headers={"Authorization": "Bearer nope"})
        right = post(server, "/run_code", body, headers={"Authorization": "Bearer s3cret"})
        assert (missing.status_code, wrong.status_code) == (401, 401)
        assert "Authorization: Bearer" in missing.json()["detail"]
        assert right.status_code == 200 and right.json()["run_result"]["stdout"] == "in\n"
        # Beyond --max-in-flight a request is turned away at once, not queued.
        slow = {"code": "import time; time.sleep(2)", "language": "python"}
        auth = {"Authorization": "Bearer s3cret"}
        with ThreadPoolExecutor(2) as threads:
            first = threads.submit(post, server, "/run_code", slow, headers=auth)
            wait_until(lambda: health(server, auth)["in_flight"] == 1, what="one in flight")
            second = post(server, "/run_code", body, headers=auth)
            assert second.status_code == 503 and "busy" in second.json()["detail"]
            assert first.result().status_code == 200
    finally:
        server.process.send_signal(signal.SIGTERM)
        wait_or_kill(server.process, 30)


def health(server: Serve, headers: dict[str, str]) -> dict[str, Any]:
    response = requests.get(f"{server.url}/health", headers=headers, timeout=30)
    return dict(response.json())


def test_stopping_serve_stops_its_redis_and_worker(tmp_path: Path) -> None:
    server = start_serve(tmp_path / "serve.log", "--max-body-mb", "0.01")
    try:
        too_big = post(server, "/run_code", {"code": "x" * 20_000, "language": "python"})
        assert too_big.status_code == 413, too_big.text
        started = descendants(server.process.pid)
        names = " ".join(info.cmdline for info in processes() if info.pid in started)
        server_name = os.path.basename(find_server_binary().path)  # redis- or valkey-server
        assert server_name in names and "codepool.ops.cli worker" in names, names
    finally:
        server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0, server.log()

    def left() -> set[int]:
        return {info.pid for info in processes()}.intersection(started)

    wait_until(lambda: not left(), timeout_s=30, what="serve's Redis and worker gone")
    assert left() == set()


SLEEPER = "import time\ntime.sleep(120)"


def sleeper_request(**extra: Any) -> dict[str, Any]:
    return {"code": SLEEPER, "language": "python", "run_timeout": 300, **extra}


def raw_post(
    server: Serve, body: dict[str, Any], headers: dict[str, str] | None = None
) -> socket.socket:
    """POST ``body`` to /run_code on a socket of its own, and leave the answer unread:
    closing the socket is a client that drops its connection."""
    host, port = server.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    lines = [
        "POST /run_code HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    conn = socket.create_connection((host, int(port)))
    conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
    return conn


def counters_of(redis_url: str, run: str) -> dict[str, int]:
    client = redis.Redis.from_url(redis_url)
    try:
        return counters.parse(client.hgetall(Keys().run_stats(run)))
    finally:
        client.close()


def test_clients_that_give_up_take_their_work_with_them(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    # One slot: a request after a give-up can only run in the slot the kill frees.
    worker = start_worker(concurrency=1)
    server = start_serve(tmp_path / "serve.log", "--url", redis_url, "--run", "left")
    pid = worker.process.pid

    def running() -> dict[int, int]:
        wait_until(lambda: sleeping_below(pid) == 1, timeout_s=30, what="the snippet running")
        return sleeping_pids(pid)

    def freed(snippet: dict[int, int]) -> None:
        """The snippet's process is gone and its slot serves the next request, each
        within KILLED_WITHIN_S of the give-up."""
        wait_until(lambda: not still_running(snippet), KILLED_WITHIN_S, what="the snippet killed")
        body = {"code": "print(1)", "language": "python"}
        lone = post(server, "/run_code", body, timeout=KILLED_WITHIN_S)
        assert lone.status_code == 200 and lone.json()["run_result"]["stdout"] == "1\n"

    try:
        # SandboxFusion's own client, and requests as verl uses it, with read timeouts
        # shorter than the work: each gives up, and its snippet is killed.
        slow = RunCodeRequest(code=SLEEPER, language="python", run_timeout=300)
        clients = [
            lambda: run_code(slow, endpoint=server.url, max_attempts=1, client_timeout=3),
            lambda: requests.post(
                f"{server.url}/run_code", json=sleeper_request(), timeout=(10, 3)
            ),
        ]
        with ThreadPoolExecutor(1) as thread:
            for client in clients:
                gave_up = thread.submit(client)
                snippet = running()
                with pytest.raises(Exception, match="timed out"):
                    gave_up.result()
                freed(snippet)
        # A client that drops its connection: its snippet runs, and is killed.
        dropped = raw_post(server, sleeper_request())
        snippet = running()
        dropped.close()
        freed(snippet)
        # Lone calls are counted by their host within a second (the cancellations at once).
        wait_until(
            lambda: counters_of(redis_url, "left").get("calls", 0) >= 3, what="3 calls counted"
        )
        got = counters_of(redis_url, "left")
        assert (got["calls"], got["cancelled"]) == (3, 3), got
        assert "collecting results failed" not in server.log()
    finally:
        server.process.send_signal(signal.SIGTERM)
        wait_or_kill(server.process, 30)


def test_a_request_that_cannot_start_within_its_budget_is_answered_at_once(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    worker = start_worker(concurrency=1)
    server = start_serve(tmp_path / "serve.log", "--url", redis_url)
    pid = worker.process.pid
    held: list[socket.socket] = []
    try:
        # One snippet runs on the only slot and one waits behind it: serve sees no answer
        # come back, so its estimate of a new request's wait grows.
        held = [raw_post(server, sleeper_request()) for _ in range(2)]
        wait_until(lambda: sleeping_below(pid) == 1, timeout_s=30, what="a snippet running")
        wait_until(lambda: health(server, {})["start_wait_s"] > 3, what="a wait of seconds")
        quick = {"code": "print(1)", "language": "python", "compile_timeout": 3}
        refused = post(server, "/run_code", quick, timeout=30)
        assert refused.status_code == 504, refused.text
        assert int(refused.headers["Retry-After"]) >= 3
        assert "budget of 3.0 s" in refused.json()["detail"]
        # The client's own timeout, when it says it: 10 s in all for a 9 s run.
        told = post(
            server,
            "/run_code",
            {"code": "print(1)", "language": "python", "run_timeout": 9},
            headers={"X-Request-Timeout": "10"},
            timeout=30,
        )
        assert told.status_code == 504 and "budget of 1.0 s" in told.json()["detail"], told.text
        # SandboxFusion's client sees a status it retries (here: gives up after one try).
        with pytest.raises(Exception, match="responded with code 504"):
            run_code(
                RunCodeRequest(code="print(1)", language="python", compile_timeout=3),
                endpoint=server.url,
                max_attempts=1,
            )
        for conn in held:
            conn.close()
        wait_until(lambda: sleeping_below(pid) == 0, what="the held snippets killed")
        wait_until(lambda: health(server, {})["in_flight"] == 0, what="nothing in flight")
        again = post(server, "/run_code", quick, timeout=30)
        assert again.status_code == 200 and again.json()["run_result"]["stdout"] == "1\n"
    finally:
        for conn in held:
            conn.close()
        server.process.send_signal(signal.SIGTERM)
        wait_or_kill(server.process, 30)
