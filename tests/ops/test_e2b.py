"""E2B's protocol on serve (ops/e2b/), driven by E2B's own SDK (``e2b_code_interpreter``)
set up as a user would: ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` at serve's ``/e2b``,
``E2B_API_KEY`` serve's token. Real serve, its real worker, the real SDK over HTTP.
E2B's own test suite runs apart (``make e2b-test``, docs/e2b.md)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from codepool.common.keys import Keys
from codepool.common.reaping import wait_or_kill
from tests.conftest import StartWorker, wait_until
from tests.ops.test_serve import Serve, start_serve

e2b = pytest.importorskip("e2b")
e2b_code_interpreter = pytest.importorskip("e2b_code_interpreter")
Sandbox = e2b_code_interpreter.Sandbox

TOKEN = "e2b-s3cret"


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """One serve with a token, and the SDK's environment pointing at it."""
    server = start_serve(tmp_path_factory.mktemp("serve") / "serve.log", "--token", TOKEN)
    saved = {key: os.environ.get(key) for key in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ.update(
        E2B_API_URL=f"{server.url}/e2b", E2B_SANDBOX_URL=f"{server.url}/e2b", E2B_API_KEY=TOKEN
    )
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.process.send_signal(signal.SIGTERM)
    wait_or_kill(server.process, 30)


@pytest.fixture
def sandbox(serve: Serve) -> Iterator[object]:
    made = Sandbox.create(envs={"SANDBOX_VAR": "from-create"}, timeout=120)
    yield made
    made.kill()


def test_notebook_rules(sandbox: object) -> None:
    run = sandbox.run_code  # type: ignore[attr-defined]
    first = run("x = 41\nx + 1")
    assert first.text == "42" and first.results[0].is_main_result
    assert first.execution_count == 1
    said = run("print('out'); import sys; print('err', file=sys.stderr); x")
    assert said.logs.stdout == ["out\n"] and said.logs.stderr == ["err\n"]
    assert said.text == "41" and said.execution_count == 2
    quiet = run("x;")
    assert quiet.results == [] and quiet.error is None
    failed = run("def f():\n    return undefined_name\nf()")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == (
        "NameError",
        "name 'undefined_name' is not defined",
    )
    assert "undefined_name" in failed.error.traceback
    assert run("'a string'").text == "a string"  # its quotes dropped, as E2B's server does


def test_environment_of_the_sandbox_and_of_one_call(sandbox: object) -> None:
    run = sandbox.run_code  # type: ignore[attr-defined]
    code = "import os\n(os.getenv('SANDBOX_VAR'), os.getenv('CALL_VAR', 'unset'))"
    assert run(code).text == "('from-create', 'unset')"
    envs = {"SANDBOX_VAR": "overwritten", "CALL_VAR": "given"}
    assert run(code, envs=envs).text == "('overwritten', 'given')"
    assert run(code).text == "('from-create', 'unset')"


def test_output_longer_than_a_calls_cap_comes_whole(sandbox: object) -> None:
    # A context call keeps 4096 characters of output: the rest comes in more calls.
    execution = sandbox.run_code("print('y' * 30000)\n'z' * 20000")  # type: ignore[attr-defined]
    assert "".join(execution.logs.stdout) == "y" * 30000 + "\n"
    assert execution.text == "z" * 20000


def test_code_contexts_are_separate_interpreters(sandbox: object) -> None:
    sandbox.run_code("shared = 1")  # type: ignore[attr-defined]
    context = sandbox.create_code_context()  # type: ignore[attr-defined]
    listed = sandbox.list_code_contexts()  # type: ignore[attr-defined]
    assert [c.id for c in listed][-1] == context.id and context.language == "python"
    missing = sandbox.run_code("shared", context=context)  # type: ignore[attr-defined]
    assert missing.error is not None and missing.error.name == "NameError"
    sandbox.run_code("mine = 2", context=context)  # type: ignore[attr-defined]
    assert sandbox.run_code("mine", context=context).text == "2"  # type: ignore[attr-defined]
    sandbox.restart_code_context(context)  # type: ignore[attr-defined]
    after = sandbox.run_code("mine", context=context)  # type: ignore[attr-defined]
    assert after.error is not None and after.error.name == "NameError"
    assert after.execution_count == 1
    sandbox.remove_code_context(context)  # type: ignore[attr-defined]
    assert context.id not in [c.id for c in sandbox.list_code_contexts()]  # type: ignore[attr-defined]
    with pytest.raises(e2b.NotFoundException):
        sandbox.run_code("1", context=context)  # type: ignore[attr-defined]


def test_other_languages_get_a_clear_refusal(sandbox: object) -> None:
    with pytest.raises(e2b.SandboxException, match="Python only"):
        sandbox.run_code("console.log(1)", language="js")  # type: ignore[attr-defined]


def test_connect_reaches_the_same_state(sandbox: object) -> None:
    sandbox.run_code("kept = 'yes'")  # type: ignore[attr-defined]
    again = Sandbox.connect(sandbox.sandbox_id)  # type: ignore[attr-defined]
    assert again.run_code("kept").text == "yes"


def test_kill_ends_the_sandbox_and_its_execution_in_flight(serve: Serve) -> None:
    sandbox = Sandbox.create()
    assert sandbox.is_running()
    timer = threading.Timer(2.0, sandbox.kill)
    timer.start()
    try:
        with pytest.raises(e2b.TimeoutException, match="sandbox was killed"):
            sandbox.run_code("import time; time.sleep(25)", timeout=60)
    finally:
        timer.cancel()
    assert not sandbox.is_running()
    with pytest.raises(e2b.TimeoutException):
        sandbox.run_code("1")


def test_a_client_that_leaves_ends_its_execution(sandbox: object) -> None:
    run = sandbox.run_code  # type: ignore[attr-defined]
    with pytest.raises(e2b.TimeoutException):
        run("import time; time.sleep(25)", timeout=2)
    # The sleep was ended with its interpreter (it is not left to run out its 25 s).
    assert run("1 + 1", timeout=20).text == "2"


def test_fork_copies_every_code_context(sandbox: object) -> None:
    sandbox.run_code("n = 10")  # type: ignore[attr-defined]
    other = sandbox.create_code_context()  # type: ignore[attr-defined]
    sandbox.run_code("m = 'other'", context=other)  # type: ignore[attr-defined]
    forks = sandbox.fork(count=2)  # type: ignore[attr-defined]
    try:
        assert all(not isinstance(fork, Exception) for fork in forks), forks
        for number, fork in enumerate(forks):
            fork.run_code(f"n += {number + 1}")
            assert fork.run_code("m", context=other).text == "other"
        assert [fork.run_code("n").text for fork in forks] == ["11", "12"]
        assert sandbox.run_code("n").text == "10"  # type: ignore[attr-defined]
    finally:
        for fork in forks:
            if not isinstance(fork, Exception):
                fork.kill()


def test_the_sandbox_timeout_ends_it(serve: Serve) -> None:
    sandbox = Sandbox.create(timeout=1)
    wait_until(lambda: not sandbox.is_running(), 30, "the sandbox ended at its timeout")
    with pytest.raises(e2b.NotFoundException):
        Sandbox.connect(sandbox.sandbox_id)


def test_the_api_key_is_required(serve: Serve) -> None:
    with pytest.raises(e2b.AuthenticationException):
        Sandbox.create(api_key="wrong")
    gone = requests.get(f"{serve.url}/e2b/health", headers={"E2b-Sandbox-Id": "nope"}, timeout=10)
    assert gone.status_code == 502
    refused = requests.post(f"{serve.url}/e2b/v2/sandboxes", json={"timeout": "x"}, timeout=10)
    assert refused.status_code == 401 and set(refused.json()) == {"code", "message"}


def test_display_data_beside_the_main_result(sandbox: object) -> None:
    code = (
        "from IPython.display import HTML, display\n"
        "class Picture:\n"
        "    def _repr_png_(self):\n"
        "        return b'\\x89PNG fake'\n"
        "display(HTML('<b>bold</b>'))\n"
        "display({'text/latex': r'\\text{raw}'}, raw=True)\n"
        "Picture()"
    )
    execution = sandbox.run_code(code)  # type: ignore[attr-defined]
    html, latex, main = execution.results
    assert (html.html, html.is_main_result) == ("<b>bold</b>", False)
    assert latex.formats() == ["latex"]
    assert main.is_main_result and main.png  # base64, as IPython formats PNG bytes


def test_overload_is_a_503_with_retry_after_that_the_sdk_rides_out(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    server = start_serve(tmp_path_factory.mktemp("busy") / "serve.log", "--max-in-flight", "1")
    url = f"{server.url}/e2b"
    # More retries than the SDK's default 3, so the test does not race the sleep's end.
    params = {"api_key": "any", "api_url": url, "sandbox_url": url, "retries": 30}
    try:
        busy = Sandbox.create(**params)
        sleeper = threading.Thread(target=busy.run_code, args=("import time; time.sleep(4)",))
        sleeper.start()
        wait_until(
            lambda: requests.get(f"{server.url}/health", timeout=10).json()["in_flight"] == 1,
            30,
            "the sleeping execution in flight",
        )
        refused = requests.post(f"{url}/v2/sandboxes", json={}, timeout=10)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert set(refused.json()) == {"code", "message"}
        # The SDK retries after Retry-After until the execution is done and there is room.
        later = Sandbox.create(**params)
        assert later.run_code("6 * 7").text == "42"
        sleeper.join(30)
        later.kill()
        busy.kill()
    finally:
        server.process.send_signal(signal.SIGTERM)
        wait_or_kill(server.process, 30)


def test_a_sandbox_outlives_its_hosts_idle_ttl(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    # Its end time ends a sandbox, not the hosts' context TTL: serve keeps it alive.
    start_worker("--context-ttl", "3")
    server = start_serve(tmp_path / "serve.log", "--url", redis_url)
    url = f"{server.url}/e2b"
    client = redis.Redis.from_url(redis_url)
    calls = lambda: int(client.hget(Keys().stats(), "context_calls") or 0)  # noqa: E731
    try:
        sandbox = Sandbox.create(api_key="any", api_url=url, sandbox_url=url)
        sandbox.run_code("kept = 'still here'")
        since = calls()
        # Touches come a third of the TTL apart once idle: six span twice the TTL.
        wait_until(lambda: calls() >= since + 6, 60, "six touches of the idle context")
        assert sandbox.run_code("kept").text == "still here"
        sandbox.kill()
    finally:
        client.close()
        server.process.send_signal(signal.SIGTERM)
        wait_or_kill(server.process, 30)
