"""Snippet inputs end to end: a producer's Snippets through Redis and a real worker."""

from __future__ import annotations

import asyncio

import pytest

from codepool.common import ConfigError, Limits
from codepool.common.settings import Settings
from codepool.common.snippet import Snippet
from codepool.common.wire import BatchJob, new_batch_id
from codepool.producer import Batch, CodePool, RemoteSandbox
from tests.conftest import StartWorker


def test_a_batch_of_snippets_with_inputs(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    program = "n = int(input())\nprint(sum(range(n)))"
    snippets: list[object] = [Snippet.make(program, stdin=f"{n}\n") for n in (3, 10)]
    snippets.append(
        Snippet.make(
            "open('out', 'w').write(open('in').read()[::-1])",
            files={"in": "abc"},
            fetch_files=["out"],
        )
    )
    snippets.append(Snippet.make(cells=["x = 2", "x ** 10"]))
    snippets.append("print('plain')")
    results = pool.submit(snippets, timeout_s=5.0).results(timeout_s=60)
    assert [r.stdout for r in results[:2]] == ["3\n", "45\n"]
    assert results[2].ok and results[2].files == {"out": b"cba"}
    assert results[3].cells[1]["display"] == [{"text/plain": "1024"}]
    assert results[4].stdout == "plain\n"


def test_per_snippet_keywords_on_a_batch_raise(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="belongs to one snippet"):
        CodePool(redis_url).submit(["print(1)"], stdin="x")


def test_a_batch_over_the_byte_limit_raises(redis_url: str) -> None:
    pool = CodePool(redis_url, settings=Settings(redis_url=redis_url, max_batch_bytes=1000))
    with pytest.raises(ConfigError, match="over the limit of 1000"):
        pool.submit([Snippet.make("print(1)", stdin="x" * 2000)])


def test_malformed_inputs_reject_their_snippet_only(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    pool = CodePool(redis_url)
    # What a broken (or hostile) producer could store: the worker checks each snippet.
    codes = (b"print(input())", b"print(2)", b"print(3)")
    inputs = ({"stdin": 5}, None, {"files": [["../escape", b"x"]]})
    job = BatchJob(new_batch_id(), codes, Limits(timeout_s=5.0), inputs=inputs)
    pool._store_and_announce(job.batch_id, job.encode(), len(codes), "", 2)
    results = Batch(pool, job.batch_id, len(codes), job.limits).results(timeout_s=60)
    assert [r.status for r in results] == ["rejected", "ok", "rejected"]
    assert "stdin must be str or bytes" in results[0].stderr
    assert "no '..'" in results[2].stderr
    assert results[1].stdout == "2\n"


def test_remote_sandbox_inputs_and_per_call_limits(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    with RemoteSandbox(redis_url, timeout=5.0) as sandbox:
        r = sandbox.run_code("print(input()[::-1])", stdin="abc")
        assert r.stdout == "cba\n"

        async def burst() -> list[object]:
            calls = [
                sandbox.arun_code("import time; time.sleep(3)", timeout_s=0.5),
                sandbox.arun_code("print(open('f').read())", files={"f": "in a file"}),
                sandbox.arun_code("", cells=["y = 7", "y * 6"]),
                sandbox.arun_code("print(1)"),
            ]
            return list(await asyncio.gather(*calls))

        slow, with_file, notebook, plain = asyncio.run(burst())
        # Calls with their own limits go in batches of their own.
        assert slow.status == "timeout"  # type: ignore[attr-defined]
        assert with_file.stdout == "in a file\n"  # type: ignore[attr-defined]
        assert notebook.cells[1]["display"] == [{"text/plain": "42"}]  # type: ignore[attr-defined]
        assert plain.stdout == "1\n"  # type: ignore[attr-defined]
        with pytest.raises(ConfigError, match="unknown limit"):
            sandbox.submit("print(1)", timeout_seconds=3)
