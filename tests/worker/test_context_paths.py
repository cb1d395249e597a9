"""A context call is a child path like any other: what the call forks ends as it
would under ``python -B -c`` and never ends the call or answers it; only the process
that runs the call does (worker/engine/context_child.py). The fork corpus
(test_forking_snippets.py) runs as a context's first call and as a later one, compared
with the reference, and the call after it gets its own output."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from codepool.worker import LocalExecutor
from tests.conftest import NO_NAMESPACES, executor_on, skip_unreadable
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
