"""Notebook cells are a child path like any other (worker/engine/cells.py): what a cell
forks ends as under ``python -B -c`` and never runs the next cells or writes records;
a cell runs as a snippet does (no harness frame, its own ``sys.orig_argv``); a lone
surrogate anywhere in a cell comes back as a result, locally and through Redis."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from codepool.common.result import ExecResult
from codepool.common.snippet import Snippet
from codepool.producer import CodePool
from codepool.worker import LocalExecutor
from tests.conftest import (
    NO_NAMESPACES,
    StartWorker,
    assert_nothing_left,
    executor_on,
    skip_unreadable,
)
from tests.hostile import HOSTILE
from tests.worker.test_forking_snippets import CASES, FRESH_INTERPRETER, Reference
from tests.worker.test_forking_snippets import reference as reference  # the fixture

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=["fork", "spawn", NO_NAMESPACES])
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    with executor_on(request.param) as ex:
        yield ex


def _as_snippet(text: str) -> str:
    return text.replace('File "<cell 1>"', 'File "<sandbox>"')


@pytest.mark.parametrize("case", CASES)
def test_what_a_cell_forks_never_runs_the_next_cells(
    executor: LocalExecutor, reference: Reference, case: str
) -> None:
    if case in FRESH_INTERPRETER:
        skip_unreadable(executor, "this start method starts the interpreter afresh")
    code = CASES[case]
    r = executor.run("", cells=[code, "print('mine')", "print('last')"], timeout_s=30.0)
    assert r.ok and len(r.cells) == 3, r  # six records before, for the first case
    first, mine, last = r.cells
    stdout, stderr, _ = reference(code)
    assert (first["stdout"], _as_snippet(first["stderr"]), first["error"]) == (stdout, stderr, [])
    assert (mine["stdout"], last["stdout"]) == ("mine\n", "last\n")


def test_a_cell_sees_no_harness(executor: LocalExecutor) -> None:
    probe = (
        "import sys, traceback\n"
        "print(len(traceback.format_stack()), sys._getframe().f_back is None)\n"
        "print(sys.orig_argv[1:])"
    )
    snippet = executor.run(probe)
    r = executor.run("", cells=["x = 1", probe])
    lines = r.cells[1]["stdout"].splitlines()
    assert lines[1] == str(["-B", "-c", probe])  # the zygote's argv before
    assert lines[0] == snippet.stdout.splitlines()[0]  # cells.py and zygote.py frames before


SURROGATES = [
    "x = '\ud800'",  # the source itself: compiled as the reference compiles it
    "raise ValueError('\\ud800')",  # the error message
    "class A:\n    def __repr__(self):\n        return '\\ud800'\nA()",  # the display
]


def test_a_lone_surrogate_in_a_cell_is_a_result(executor: LocalExecutor) -> None:
    # Each raised WireError out of run (the first two), or killed the zygote (infra),
    # and the first left the executor's reader thread dead: every later call hung.
    r = executor.run("", cells=[*SURROGATES, "print('after')"], timeout_s=10.0)
    assert r.ok, r
    source, message, display = r.cells[:3]
    assert source["error"][0]["ename"] == "UnicodeEncodeError"
    assert "surrogates not allowed" in source["error"][0]["evalue"]
    assert message["error"][0]["evalue"] == "\\ud800"
    assert display["display"] == [{"text/plain": "\\ud800"}]
    assert r.cells[3]["stdout"] == "after\n"
    assert executor.run("print(1)", timeout_s=10.0).stdout == "1\n"


def test_cells_through_redis(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    try:
        snippets = [Snippet.make(cells=[*SURROGATES, "print('after')"]), "print('plain')"]
        notebook, plain = pool.submit(snippets, timeout_s=10.0).results(timeout_s=60)
        assert notebook.ok and notebook.cells[3]["stdout"] == "after\n", notebook
        assert notebook.cells[1]["error"][0]["evalue"] == "\\ud800"
        assert plain.stdout == "plain\n"
        forked = pool.submit([Snippet.make(cells=[CASES["fork-in-a-loop"], "print('mine')"])])
        (r,) = forked.results(timeout_s=60)
        assert [c["stdout"] for c in r.cells][1:] == ["mine\n"], r
        check_notebooks(
            _notebooks(
                lambda notebooks, t: pool.submit(notebooks, timeout_s=t).results(timeout_s=120)
            )
        )
    finally:
        pool.close()


def _notebooks(run_many: Callable[[list[Any], float], list[ExecResult]]) -> dict[str, ExecResult]:
    """Each hostile snippet as the middle cell of a notebook of its own."""
    corpus = dict(HOSTILE)
    alone = {"fork-bomb": corpus.pop("fork-bomb")}  # as test_hostile_paths runs it
    disk = {"fill-disk": corpus.pop("fill-disk")}  # bounded by the disk: see its 20 s
    results: dict[str, ExecResult] = {}
    for batch in (corpus, alone, disk):
        notebooks = [
            Snippet.make(cells=["x = 1", code, "print('mine')"]) for code in batch.values()
        ]
        timeout_s = 20.0 if batch is disk else 3.0
        results.update(zip(batch, run_many(notebooks, timeout_s), strict=True))
    return results


def check_notebooks(results: dict[str, ExecResult]) -> None:
    """tests/hostile.check for notebooks: a cell's error is its record's, the notebook
    goes on; the cells' record fd is one more fd a cell can write to (fd 5)."""
    ended = {"fork-bomb": ("timeout", "error"), "closed-stdout": ("timeout",)}
    for name, statuses in ended.items():
        assert results[name].status in statuses, results[name]
    shown = {
        "kill-all": "alive\n",
        "fds": "[4, 5]\n",
        "daemon": "parent done\n",
        "sigstop": "continued\n",
    }
    errors = {"memory-bomb": "MemoryError", "fill-disk": "OSError"}
    for name, result in results.items():
        if name in ended:
            continue
        assert result.ok and len(result.cells) == 3, (name, result)
        first, cell, last = result.cells
        assert (first["stdout"], last["stdout"]) == ("", "mine\n"), (name, result)
        if name in errors:
            assert cell["error"][0]["ename"] == errors[name], (name, cell)
        elif name == "secrets":
            assert cell["stdout"].startswith("False False ["), cell
            assert "codepool-worker-" not in cell["stdout"]
        else:
            assert (cell["stdout"], cell["error"]) == (shown[name], []), (name, cell)
    assert "No space left" in results["fill-disk"].cells[1]["error"][0]["evalue"]


def test_hostile_snippets_are_contained_in_cells(executor: LocalExecutor) -> None:
    if not any(line["name"] == "processes" and line["active"] for line in executor.report):
        pytest.skip("the corpus expects a PID namespace, as on test_hostile_paths' paths")
    check_notebooks(_notebooks(lambda notebooks, t: executor.run_many(notebooks, timeout_s=t)))
    assert_nothing_left(executor)


def test_a_signal_a_cell_sends_itself_acts_as_on_any_process(executor: LocalExecutor) -> None:
    # The cell runner is its namespace's init, as a snippet is: without the snippet's
    # stand-in handlers the kernel dropped the signal and the notebook went on.
    code = "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nprint('not reached')"
    r = executor.run("", cells=["print('first')", code, "print('next')"], timeout_s=10.0)
    assert (r.status, r.returncode) == ("signal", -15), r
    assert [c["stdout"] for c in r.cells] == ["first\n"]


def test_what_a_cell_printed_before_rebinding_stdout_is_its_own(executor: LocalExecutor) -> None:
    # It turned up in no record (Python's stdout was never flushed after the rebind), and
    # a cell that deleted sys.stdout made the runner fail with its own frames, rc 1.
    rebind = "import sys\nprint('before')\nsys.stdout = sys.stderr\nprint('after')"
    r = executor.run("", cells=[rebind, "print('next')"], timeout_s=10.0)
    assert [(c["stdout"], c["stderr"]) for c in r.cells] == [
        ("before\n", "after\n"),
        ("", "next\n"),
    ]
    r = executor.run("", cells=["import sys\nprint('kept')\ndel sys.stdout"], timeout_s=10.0)
    assert (r.status, r.returncode, r.cells[0]["stdout"]) == ("ok", 0, "kept\n"), r
    assert "zygote.py" not in r.stderr


def test_a_cells_error_is_printed_as_python_prints_a_snippets(executor: LocalExecutor) -> None:
    # It was formatted by the traceback module: the cell's own sys.excepthook was never
    # called, and on Python 3.11 "Did you mean" was missing.
    hook = "import sys\nsys.excepthook = lambda t, v, tb: print('hook:', v, file=sys.stderr)\n"
    cells = [hook + "1/0", "prnt(1)", "import sys\nsys.excepthook = sys.__excepthook__", "prnt(1)"]
    r = executor.run("", cells=cells, timeout_s=10.0)
    assert r.ok and len(r.cells) == 4, r
    assert [c["error"][0]["traceback"] for c in r.cells[:2]] == [
        ["hook: division by zero"],
        ["hook: name 'prnt' is not defined"],
    ]
    snippet = executor.run("prnt(1)", timeout_s=10.0)
    want = snippet.stderr.replace('"<sandbox>"', '"<cell 4>"').splitlines()
    assert r.cells[3]["error"][0]["traceback"] == want
    assert r.cells[3]["error"][0]["traceback"][-1].endswith("Did you mean: 'print'?")


def test_the_notebooks_end_is_a_snippets_and_the_last_cells(executor: LocalExecutor) -> None:
    # __main__'s finalisers, atexit and late threads ran after the last record: what they
    # printed was in no cell's output.
    cells = [
        "class A:\n    def __del__(self):\n        print('del ran')\na = A()",
        "import atexit, threading, time\natexit.register(print, 'bye')\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('late'))).start()\nprint('x')",
    ]
    r = executor.run("", cells=cells, timeout_s=10.0)
    assert (r.status, r.returncode) == ("ok", 0), r
    assert [c["stdout"] for c in r.cells] == ["", "x\nlate\nbye\ndel ran\n"]
    flush_fails = "import os, sys\nsys.stdout.write('x')\nos.close(1)"
    snippet = executor.run(flush_fails, timeout_s=10.0)
    r = executor.run("", cells=["pass", flush_fails], timeout_s=10.0)
    assert r.returncode == snippet.returncode == 120, (r, snippet)


def test_sys_exit_in_a_cell_ends_the_notebook_as_it_ends_python_c(
    executor: LocalExecutor,
) -> None:
    # It was the cell's error and the next cells ran; the notebook ended 0.
    for code in ("import sys\nsys.exit(3)", "import sys\nsys.exit('bye')", "raise SystemExit"):
        snippet = executor.run(code, timeout_s=10.0)
        r = executor.run("", cells=["print('first')", code, "print('not run')"], timeout_s=10.0)
        assert r.returncode == snippet.returncode, (r, snippet)
        assert [(c["stdout"], c["stderr"], c["error"]) for c in r.cells] == [
            ("first\n", "", []),
            ("", snippet.stderr, []),
        ]
    hook = "import sys\nsys.excepthook = lambda *a: sys.exit(4)\n1/0"
    r = executor.run("", cells=[hook, "print('not run')"], timeout_s=10.0)
    assert r.returncode == 4 and len(r.cells) == 1, r
    assert r.cells[0]["error"][0]["ename"] == "ZeroDivisionError"


NOTEBOOK_ENDS = {
    # __main__ was held by the runner: cleared as a survivor, a __del__ saw its globals None
    "del-uses-global": "import sys\nclass A:\n    def __del__(self):\n"
    "        print('global ok', sys.version_info > (3,))\na = A()",
    # the error went to the record though the cell had let go of stderr
    "stderr-none": "import sys\nsys.stderr = None\n1/0",
    "stderr-closed": "import sys\nsys.stderr.close()\n1/0",
    "stderr-rebound": "import sys\nsys.stderr = sys.stdout\n1/0",
    # worded as a plain UnicodeEncodeError, not as python -c refuses the command
    "surrogate-source": "print('ran')\nx = '\ud800'",
}


@pytest.mark.parametrize("case", NOTEBOOK_ENDS)
def test_a_one_cell_notebook_ends_as_the_snippet(executor: LocalExecutor, case: str) -> None:
    code = NOTEBOOK_ENDS[case]
    snippet = executor.run(code, timeout_s=10.0)
    r = executor.run("", cells=[code], timeout_s=10.0)
    (cell,) = r.cells
    lines = [line for error in cell["error"] for line in error["traceback"]]
    stderr = _as_snippet(cell["stderr"] + "".join(line + "\n" for line in lines))
    masked = re.compile(r"0x[0-9a-f]+|refcount : \d+")
    got = (_as_snippet(cell["stdout"]), masked.sub("", stderr))
    assert got == (snippet.stdout, masked.sub("", snippet.stderr)), (r, snippet)
