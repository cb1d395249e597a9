"""LocalSandbox keeps the reference sandbox's API, across event loops and threads."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from codepool.worker import LocalSandbox


def test_reference_api_across_event_loops() -> None:
    with LocalSandbox(timeout=2.0, max_concurrency=2, preload=()) as sandbox:
        r = sandbox.run_code("print(2 + 3)")
        assert r.ok and sandbox.format_tool_content(r) == "5\n"

        async def step(i: int) -> list[str]:
            results = await asyncio.gather(
                *(sandbox.arun_code(f"print({i} + {j})") for j in range(5))
            )
            return [sandbox.format_tool_content(r) for r in results]

        for i in range(3):  # a new event loop per training step
            assert asyncio.run(step(i)) == [f"{i + j}\n" for j in range(5)]

        timeout = sandbox.run_code("while True: pass")
        assert sandbox.format_tool_content(timeout) == "Error: execution timed out after 2 seconds."
        with ThreadPoolExecutor(4) as pool:
            assert all(r.ok for r in pool.map(sandbox.run_code, ["print(1)"] * 8))
        m = sandbox.stats.metrics()
        assert m["sandbox/calls"] == 1 + 15 + 1 + 8
        assert m["sandbox/timeout_rate"] == 1 / 25
        assert m["sandbox/success_rate"] == 24 / 25
        assert m["sandbox/latency"] > 0
