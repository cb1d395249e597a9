"""A real E2B client against serve's ``/e2b``: smolagents' ``CodeAgent`` with its
``E2BExecutor`` runs a multi-step agent (state kept from step to step, an error the
agent sees and recovers from, the final answer) on a real serve and worker. The model
is scripted, so the test needs no LLM; everything after it is smolagents' own code."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from codepool.common.reaping import wait_or_kill
from tests.ops.test_serve import Serve, start_serve

pytest.importorskip("e2b_code_interpreter")
smolagents = pytest.importorskip("smolagents")

TOKEN = "agent-s3cret"
STEPS = [
    "Thought: define the numbers first.\n<code>\n"
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
    "values = [fib(i) for i in range(10)]\nprint(values)\n</code>",
    "Thought: a slip.\n<code>\nprint(totl)\n</code>",
    "Thought: sum what the first step kept.\n<code>\ntotal = sum(values)\nprint(total)\n</code>",
    "Thought: done.\n<code>\nfinal_answer(total * 2)\n</code>",
]


class ScriptedModel(smolagents.Model):  # type: ignore[misc]
    """Answers each step with the next of STEPS, as an LLM would with code."""

    def __init__(self, steps: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.steps = iter(steps)

    def generate(self, messages: Any, stop_sequences: Any = None, **kwargs: Any) -> Any:
        return smolagents.ChatMessage(role="assistant", content=next(self.steps))


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    server = start_serve(tmp_path_factory.mktemp("serve") / "serve.log", "--token", TOKEN)
    yield server
    server.process.send_signal(signal.SIGTERM)
    wait_or_kill(server.process, 30)


def test_smolagents_e2b_executor_runs_a_multi_step_agent(serve: Serve) -> None:
    url = f"{serve.url}/e2b"
    agent = smolagents.CodeAgent(
        tools=[],
        model=ScriptedModel(STEPS),
        executor_type="e2b",
        executor_kwargs={"api_key": TOKEN, "api_url": url, "sandbox_url": url},
        max_steps=6,
        verbosity_level=0,
    )
    try:
        answer = agent.run("Twice the sum of the first ten Fibonacci numbers?")
        steps = [step for step in agent.memory.steps if hasattr(step, "observations")]
        assert answer == 176
        assert "[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]" in steps[0].observations
        assert steps[1].error is not None and "totl" in str(steps[1].error)
        assert "88" in steps[2].observations
    finally:
        agent.cleanup()
