"""The verl tool (producer/verl_tool.py) through Redis and a real worker, driven as
verl drives tools: ToolAgentLoop's create / execute(agent_data=...) / release per tool
call, and a per-trajectory instance (create once, release at the end); 10-turn
trajectories side by side, each keeping its own state. Where verl's source is at hand
(tests/verl_source.py), the same on verl's own BaseTool and tool-schema classes."""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
from typing import Any

import pytest

import codepool.producer.verl_tool as verl_tool
from tests.conftest import StartWorker, wait_until
from tests.verl_source import verl_module

TURNS = 10


class AgentData:
    """What verl's ToolAgentLoop hands a tool: its trajectory's state, with
    ``extra_fields`` for tool session data (verl/experimental/agent_loop)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.extra_fields: dict[str, Any] = {}


async def call_tool(tool: Any, arguments: dict[str, Any], agent_data: AgentData) -> str:
    """One tool call as ToolAgentLoop._call_tool makes it."""
    instance_id = None
    try:
        instance_id, _ = await tool.create(create_kwargs={})
        response, _, _ = await tool.execute(instance_id, arguments, agent_data=agent_data)
        return str(response.text)
    finally:
        if instance_id:
            await tool.release(instance_id)


def turn_code(turn: int, seed: int) -> str:
    if turn == 0:
        return f"total = {seed}\nhistory = []\nprint(total)"
    if turn == 5:
        return "undefined_name"  # an error keeps the state
    return f"total += {turn}\nhistory.append({turn})\nprint(total, len(history))"


def expected(turn: int, seed: int) -> str:
    if turn == 0:
        return f"{seed}\n"
    if turn == 5:
        return "NameError"
    done = [t for t in range(1, turn + 1) if t != 5]
    return f"{seed + sum(done)} {len(done)}\n"


async def trajectory(tool: Any, seed: int) -> list[str]:
    data = AgentData(f"request-{seed}")
    return [await call_tool(tool, {"code": turn_code(t, seed)}, data) for t in range(TURNS)]


def check(messages: list[str], seed: int) -> None:
    for turn, message in enumerate(messages):
        want = expected(turn, seed)
        assert (want in message) if turn == 5 else (message == want), (turn, message)


def make_tool(redis_url: str, **config: Any) -> Any:
    """The tool as verl's registry makes it from the YAML: the class by its name."""
    module_name, class_name = verl_tool.CLASS_NAME.rsplit(".", 1)
    tool_class = getattr(importlib.import_module(module_name), class_name)
    return tool_class({"redis_url": redis_url, "default_timeout": 10, **config}, None)


def test_ten_turns_keep_their_state_as_the_agent_loop_drives_it(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    tool = make_tool(redis_url)
    try:

        async def three() -> list[list[str]]:
            return await asyncio.gather(*(trajectory(tool, seed) for seed in (100, 200, 300)))

        for seed, messages in zip((100, 200, 300), asyncio.run(three()), strict=True):
            check(messages, seed)
        assert tool.name == "code_interpreter" and tool._instances == {}
    finally:
        tool.close()


def test_a_trajectory_that_ends_closes_its_context(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    tool = make_tool(redis_url)
    try:
        data = AgentData("r")
        asyncio.run(call_tool(tool, {"code": "x = 1"}, data))
        context = data.extra_fields[verl_tool.CONTEXT_FIELD]
        assert context.ended is None
        del data
        gc.collect()
        wait_until(lambda: context.ended is not None, 10, what="the context closed")
    finally:
        tool.close()


def test_an_instance_per_trajectory_and_its_reward(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    tool = make_tool(redis_url)
    truth = {
        "assert_case": ["assert square(3) == 9", "assert square(-2) == 4", "assert square(0) == 1"]
    }

    async def run() -> tuple[list[str], float, list[str]]:
        instance_id, _ = await tool.create(ground_truth=truth)
        messages = []
        for turn in range(TURNS):
            code = "n = 0" if turn == 0 else "n += 1\nprint(n)"
            response, reward, metrics = await tool.execute(instance_id, {"code": code})
            assert reward == 0.0 and metrics["status"] == "ok"
            messages.append(response.text)
        await tool.execute(instance_id, {"code": "def square(x):\n    return x * x"})
        score = await tool.calc_reward(instance_id)
        timed = [
            (await tool.execute(instance_id, {"code": code, "timeout": 1}))[0].text
            for code in ("while True: pass", "print(n)")
        ]
        context = tool._instances[instance_id].context
        await tool.release(instance_id)
        assert context.ended == "closed by its caller"
        return messages, score, timed

    try:
        messages, score, timed = asyncio.run(run())
        assert messages == [""] + [f"{n}\n" for n in range(1, TURNS)]
        assert score == pytest.approx(2 / 3)
        assert timed[0] == "Error: execution timed out after 1 seconds."
        assert "NameError" in timed[1]  # the timeout ended the context: a new one, no n
    finally:
        tool.close()


def test_on_verls_own_base_tool(redis_url: str, start_worker: StartWorker) -> None:
    base_tool = verl_module("verl.tools.base_tool")
    schemas = verl_module("verl.tools.schemas")
    if base_tool is None or schemas is None:
        pytest.skip("verl is not installed (pip install codepool[verl], or CODEPOOL_VERL_SRC)")
    start_worker()
    module = importlib.reload(verl_tool)  # its classes now come from verl
    try:
        assert issubclass(module.CodepoolTool, base_tool.BaseTool)
        schema = schemas.OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "python",
                    "description": "Run Python.",
                    "parameters": {
                        "type": "object",
                        "properties": {"code": {"type": "string", "description": "code"}},
                        "required": ["code"],
                    },
                },
            }
        )
        tool = module.CodepoolTool({"redis_url": redis_url, "type": "native"}, schema)
        try:
            assert tool.name == "python" and tool.get_openai_tool_schema() is schema
            messages = asyncio.run(trajectory(tool, 7))
            check(messages, 7)
            _, response = asyncio.run(tool.create())
            assert isinstance(response, schemas.ToolResponse)
        finally:
            tool.close()
    finally:
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            del sys.modules[name]
        importlib.reload(verl_tool)
