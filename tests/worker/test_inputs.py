"""A snippet's inputs and read-backs in both modes: stdin, files in, fetched files out,
notebook cells; and the malformed ones refused."""

from __future__ import annotations

import pytest

from codepool.common import ConfigError
from codepool.common.snippet import Snippet
from codepool.worker import LocalExecutor
from tests.conftest import assert_nothing_left


def test_stdin_str_and_bytes(executor: LocalExecutor) -> None:
    code = "import sys\nprint(input() * 2)\nprint(repr(sys.stdin.read()))"
    r = executor.run(code, stdin="ab\nrest\n")
    assert r.stdout == "abab\n'rest\\n'\n", r.stderr
    r = executor.run("import sys; print(sys.stdin.buffer.read())", stdin=b"\x00\xff")
    assert r.stdout == "b'\\x00\\xff'\n", r.stderr
    # Without stdin the snippet reads EOF at once, as before.
    r = executor.run("input()")
    assert r.status == "error" and r.stderr.endswith("EOFError: EOF when reading a line\n")


def test_files_are_written_and_fetched(executor: LocalExecutor) -> None:
    code = (
        "data = open('in/deep/x.txt').read()\n"
        "open('out.txt', 'w').write(data.upper())\n"
        "open('in/bin', 'rb').read() == b'\\x00\\x01' or exit(5)"
    )
    r = executor.run(
        code,
        files={"in/deep/x.txt": "hello", "in/bin": b"\x00\x01"},
        fetch_files=["out.txt", "missing.txt", "in/deep/x.txt"],
    )
    assert r.ok, r.stderr
    assert r.files == {"out.txt": b"HELLO", "in/deep/x.txt": b"hello"}
    # Nothing of one snippet's files is visible to the next.
    r = executor.run("import os; print(sorted(os.listdir('.')))")
    assert r.stdout == "[]\n", r.stdout
    assert_nothing_left(executor)


def test_files_are_fetched_after_a_timeout_and_a_crash(executor: LocalExecutor) -> None:
    code = "open('partial', 'w').write('so far')\nimport time\ntime.sleep(30)"
    r = executor.run(code, fetch_files=["partial"], timeout_s=0.5)
    assert r.status == "timeout" and r.files == {"partial": b"so far"}
    r = executor.run("open('a', 'w').write('x'); import os; os._exit(9)", fetch_files=["a"])
    assert r.returncode == 9 and r.files == {"a": b"x"}


def test_fetch_reads_only_plain_files_beneath_the_work_dir(executor: LocalExecutor) -> None:
    code = (
        "import os\n"
        "os.symlink('/etc/passwd', 'link')\n"
        "os.symlink('/etc', 'dir')\n"
        "os.mkfifo('fifo')\n"
        "os.mkdir('sub')\n"
        "open('big', 'wb').write(b'x' * 5000)\n"
        "open('small', 'wb').write(b'y' * 10)\n"
        "open('once', 'w').write('1'); os.link('once', 'twice')"
    )
    fetch = ["link", "dir/passwd", "fifo", "sub", "big", "small", "once", "twice"]
    r = executor.run(code, fetch_files=fetch, max_fetch_bytes=1000)
    assert r.ok, r.stderr
    # A symlink is never followed, a FIFO never opened (it would block), a hard-linked
    # file is left out (it could name a file outside), and what is over the cap too.
    assert r.files == {"small": b"y" * 10}


def test_input_sizes_over_the_limits_are_rejected(executor: LocalExecutor) -> None:
    r = executor.run("print(1)", stdin="x" * 100, max_stdin_bytes=10)
    assert r.status == "rejected" and "stdin is 100 bytes, over the 10 limit" in r.stderr
    r = executor.run("print(1)", files={"a": "x" * 50, "b": "y" * 51}, max_files_bytes=100)
    assert r.status == "rejected" and "files hold 101 bytes" in r.stderr


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"files": {"/etc/cron.d/x": "a"}}, "must be relative"),
        ({"files": {"../up": "a"}}, "no '..'"),
        ({"files": {"a/./b": "a"}}, "no '..'"),
        ({"files": {"a": "1", "a/b": "2"}}, "both a file and a directory"),
        ({"files": {"a": 5}}, "content must be str or bytes"),
        ({"files": ["a"]}, "files must map paths"),
        ({"stdin": 5}, "stdin must be str or bytes"),
        ({"fetch_files": "out.txt"}, "not one string"),
        ({"fetch_files": [""]}, "non-empty"),
        ({"cells": "print(1)"}, "not one string"),
        ({"cells": ["x = 1"], "cell_timeout_s": -1}, "positive number"),
    ],
)
def test_malformed_inputs_raise(
    executor: LocalExecutor, keywords: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        executor.run("print(1)", **keywords)  # type: ignore[arg-type]


def test_inputs_given_twice_raise(executor: LocalExecutor) -> None:
    with pytest.raises(ConfigError, match="not both"):
        executor.run(Snippet.make("print(1)", stdin="a"), stdin="b")


def test_malformed_inputs_on_the_wire_are_rejected(executor: LocalExecutor) -> None:
    # What a client that skipped the checks would send: the supervisor checks again.
    bad = Snippet("print(1)", fetch_files=("../../etc/shadow",))
    r = executor.run(bad)
    assert r.status == "rejected" and "no '..'" in r.stderr, r


def test_notebook_cells_carry_state_and_keep_outputs_apart(executor: LocalExecutor) -> None:
    cells = [
        "a = 123",
        "a",
        "print(a); a + 1;",
        "import sys, os; sys.stderr.write('err'); os.system('echo from a subprocess')",
        "raise RuntimeError('boom')",
        "def f():\n    return 1 / 0\nf()",
        "print(a * 2)",
    ]
    r = executor.run("", cells=cells)
    assert r.ok and len(r.cells) == len(cells), r
    outs = [(c["stdout"], c["stderr"], c["display"]) for c in r.cells]
    assert outs[:4] == [
        ("", "", []),
        ("", "", [{"text/plain": "123"}]),
        ("123\n", "", []),  # a trailing ';' hides the value, as in a notebook
        ("from a subprocess\n", "err", [{"text/plain": "0"}]),
    ]
    assert [c["error"] for c in r.cells[:4]] == [[], [], [], []]
    assert r.cells[4]["error"] == [
        {
            "ename": "RuntimeError",
            "evalue": "boom",
            "traceback": [
                "Traceback (most recent call last):",
                '  File "<cell 5>", line 1, in <module>',
                "RuntimeError: boom",
            ],
        }
    ]
    assert r.cells[5]["error"][0]["traceback"][1:] == [
        '  File "<cell 6>", line 3, in <module>',
        '  File "<cell 6>", line 2, in f',
        "ZeroDivisionError: division by zero",
    ]
    assert r.cells[6]["stdout"] == "246\n"  # state survived the errors
    assert_nothing_left(executor)


def test_cell_timeout_and_total_timeout(executor: LocalExecutor) -> None:
    cells = ["import time", "time.sleep(10)", "print('next')"]
    r = executor.run("", cells=cells, cell_timeout_s=0.3, timeout_s=5)
    assert r.ok and [c["stdout"] for c in r.cells] == ["", "", "next\n"]
    assert r.cells[1]["error"][0]["ename"] == "TimeoutError"
    assert "cell_timeout of 0.3 s" in r.cells[1]["error"][0]["evalue"]
    # The snippet's own timeout ends the notebook; the cells that finished are kept.
    r = executor.run("", cells=["print(1)", "import time; time.sleep(30)", "print(2)"], timeout_s=1)
    assert r.status == "timeout" and [c["stdout"] for c in r.cells] == ["1\n"]
    assert_nothing_left(executor)


def test_cell_output_is_cut_to_the_limit(executor: LocalExecutor) -> None:
    r = executor.run("", cells=["print('x' * 5000)", "'y' * 5000"], max_output_chars=100)
    first, second = r.cells
    assert first["stdout"].startswith("[... truncated 4901 chars ...]\n")
    assert first["stdout"].endswith("x" * 99 + "\n")
    shown = second["display"][0]["text/plain"]
    assert shown == "[... truncated 4902 chars ...]\n" + "y" * 99 + "'"
