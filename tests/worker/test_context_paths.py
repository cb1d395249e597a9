"""A context call is a child path like any other: what the call forks ends as it
would under ``python -B -c`` and never ends the call or answers it; only the process
that runs the call does (worker/engine/context_child.py). The fork corpus
(test_forking_snippets.py) runs as a context's first call and as a later one, compared
with the reference, and the call after it gets its own output."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from codepool.common.result import ExecResult
from codepool.ops.bench.process_tree import descendants
from codepool.producer import CodePool
from codepool.worker import LocalExecutor
from tests.conftest import (
    NO_NAMESPACES,
    StartWorker,
    assert_nothing_left,
    executor_on,
    poll_until,
    skip_unreadable,
    wait_until,
)
from tests.hostile import HOSTILE, check
from tests.processes import exiting
from tests.worker.test_forking_snippets import CASES, FRESH_INTERPRETER, Reference
from tests.worker.test_forking_snippets import reference as reference  # the fixture

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=["fork", NO_NAMESPACES])
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    with executor_on(request.param) as ex:
        yield ex


@pytest.mark.parametrize("later", [False, True], ids=["first-call", "later-call"])
@pytest.mark.parametrize("case", CASES)
def test_what_a_call_forks_never_ends_it(
    executor: LocalExecutor, reference: Reference, case: str, later: bool
) -> None:
    if case in FRESH_INTERPRETER:
        skip_unreadable(executor, "this start method starts the interpreter afresh")
    code = CASES[case]
    with executor.context(timeout_s=30.0) as ctx:
        if later:
            assert ctx.run_code("import os\nx = 1").ok
        r = ctx.run_code(code)
        assert (r.stdout, r.stderr, r.returncode) == reference(code)
        assert r.status == "ok" and ctx.ended is None
        mine = ctx.run_code("print('mine')")
        assert (mine.status, mine.stdout, mine.stderr) == ("ok", "mine\n", "")


@pytest.mark.parametrize("lose", ["del sys.stderr", "sys.stderr.close()", "sys.stderr = None"])
def test_an_error_that_cannot_be_printed_is_rc_1_and_the_context_lives(
    executor: LocalExecutor, reference: Reference, lose: str
) -> None:
    code = f"import os, sys\n{lose}\n1/0"
    with executor.context() as ctx:
        r = ctx.run_code(code)
        assert (r.status, r.returncode) == ("error", reference(code)[2]) == ("error", 1)
        assert ctx.ended is None
        assert ctx.run_code("print('mine')").stdout == "mine\n"


def test_a_call_that_breaks_the_control_socket_fails_and_ends_the_context(
    executor: LocalExecutor,
) -> None:
    # fd 3 is how the interpreter answers: a call that closes it cannot be answered,
    # and must not come back "ok" with no output (it did: taken for the end of orders).
    with executor.context() as ctx:
        r = ctx.run_code("import os\nos.close(3)\nprint('hi')")
        assert (r.status, r.returncode, r.stdout) == ("error", 1, "hi\n"), r
        assert "could not answer its call" in r.stderr
        assert ctx.ended is not None
        assert ctx.run_code("print(1)").status == "rejected"


def test_a_call_may_lower_its_own_cpu_limit(executor: LocalExecutor) -> None:
    with executor.context() as ctx:
        lower = "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))"
        assert ctx.run_code(lower).ok
        assert ctx.run_code("print('mine')").stdout == "mine\n"


def _timeout(name: str) -> float:
    """3 s, as tests/reliability/test_hostile.py gives the corpus; filling the disk is
    bounded by the disk, and on a loaded machine its writes can outlast 3 s."""
    return 20.0 if name == "fill-disk" else 3.0


def _in_contexts(
    executor: LocalExecutor, corpus: dict[str, str], *, later: bool
) -> dict[str, ExecResult]:
    """Each snippet of ``corpus`` as a call of a context of its own (a first call, or
    one after a call that set some state), all at once; then a call after it."""
    contexts = {name: executor.context(timeout_s=_timeout(name)) for name in corpus}
    try:
        if later:
            for ctx in contexts.values():
                assert ctx.run_code("import os\nx = 1").ok
        futures = {name: contexts[name].submit(code) for name, code in corpus.items()}
        results = {name: future.result() for name, future in futures.items()}
        for name, ctx in contexts.items():
            after = ctx.run_code("print('mine')")
            if ctx.ended is None:  # a call that ends its context: later calls say so
                assert after.stdout == "mine\n", (name, after)
            else:
                assert after.status == "rejected", (name, after)
        return results
    finally:
        for ctx in contexts.values():
            ctx.close()


@pytest.mark.parametrize("later", [False, True], ids=["first-call", "later-call"])
def test_hostile_snippets_are_contained_in_contexts(executor: LocalExecutor, later: bool) -> None:
    if not any(line["name"] == "processes" and line["active"] for line in executor.report):
        pytest.skip("the corpus expects a PID namespace, as on test_hostile_paths' paths")
    corpus = dict(HOSTILE)
    alone = {"fork-bomb": corpus.pop("fork-bomb")}  # as test_hostile_paths runs it
    results = _in_contexts(executor, corpus, later=later)
    results.update(_in_contexts(executor, alone, later=later))
    # A call is not its namespace's init; the call may write to its control socket
    # (fd 3): what it writes there is dropped (context_wire.resync), it ended the context.
    check(results, pidns=False, fds="[3]\n")
    # The fork bomb's family was killed at its deadline and answered then; the kernel's
    # teardown of a namespace full of forks took 10-70 s at load 80 (context_host.expire).
    wait_until(lambda: _settled(executor), 120, "the killed families' processes gone")
    assert_nothing_left(executor)


def _settled(executor: LocalExecutor) -> bool:
    """No process below the supervisor in its exit, for a second on end (killed ones
    start their exit as they get the CPU)."""
    return not poll_until(lambda: any(map(exiting, descendants(executor.supervisor_pid))), 1.0)


def test_the_end_of_a_call_is_an_interactive_statement_s_end(
    executor: LocalExecutor, reference: Reference
) -> None:
    # As an interactive interpreter: an unhandled error is kept for pdb.pm() (sys.last_*,
    # as PyErr_Print sets them), the streams are flushed, and the session goes on.
    with executor.context() as ctx:
        assert ctx.run_code("print('half', end='')\n1/0").stdout == "half"
        last = "sys.last_type.__name__, sys.last_traceback.tb_frame.f_code.co_filename"
        seen = ctx.run_code(f"import sys\nprint({last})")
        assert seen.stdout == "ZeroDivisionError <sandbox>\n", seen
    # python -c sets them too: an atexit hook sees them.
    code = "import atexit, sys\natexit.register(lambda: print(sys.last_type.__name__))\n1/0"
    assert executor.run(code).stdout == reference(code)[0] == "ZeroDivisionError\n"


def test_the_corpora_in_contexts_through_redis(
    redis_url: str, start_worker: StartWorker, reference: Reference
) -> None:
    start_worker()
    pool = CodePool(redis_url)

    async def run(corpus: dict[str, str]) -> dict[str, ExecResult]:
        contexts = [await pool.acontext(timeout_s=_timeout(name)) for name in corpus]
        try:
            calls = (
                ctx.arun_code(code) for ctx, code in zip(contexts, corpus.values(), strict=True)
            )
            results = dict(zip(corpus, await asyncio.gather(*calls), strict=True))
            after = await asyncio.gather(*(ctx.arun_code("print('mine')") for ctx in contexts))
            for name, ctx, mine in zip(corpus, contexts, after, strict=True):
                wanted = ("rejected", "") if ctx.ended else ("ok", "mine\n")
                assert (mine.status, mine.stdout) == wanted, (name, mine)
            return results
        finally:
            for ctx in contexts:
                await ctx.aclose()

    try:
        corpus = dict(HOSTILE)
        alone = {"fork-bomb": corpus.pop("fork-bomb")}
        results = asyncio.run(run(corpus))
        results.update(asyncio.run(run(alone)))
        check(results, pidns=False, fds="[3]\n")
        forks = {name: code for name, code in CASES.items() if name not in FRESH_INTERPRETER}
        for name, r in asyncio.run(run(forks)).items():
            assert (r.stdout, r.stderr, r.returncode) == reference(forks[name]), name
    finally:
        pool.close()
