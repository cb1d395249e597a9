"""auto_print: only a trailing top-level expression is printed; nothing is broken."""

from __future__ import annotations

import contextlib
import io

import pytest

from codepool.common import compile_snippet


def _run(source: str) -> str:
    body, tail = compile_snippet(source, auto_print=True)
    namespace: dict[str, object] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(body, namespace)
        if tail is not None:
            value = eval(tail, namespace)
            if value is not None:
                print(repr(value))
    return out.getvalue()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("2 + 3", "5\n"),
        ("x = 2 + 3", ""),
        ("x = 5\nx  # the answer", "5\n"),
        ("x = 5\n# only a comment", ""),
        ("for i in range(3):\n    i", ""),
        ("if True:\n    7", ""),
        ("(1 +\n 2)", "3\n"),
        ("print(4)", "4\n"),
        ("'text'", "'text'\n"),
        ("None", ""),
        ("a = 1; a + 1", "2\n"),
        ("def f():\n    return 9\nf()", "9\n"),
        ("", ""),
    ],
)
def test_auto_print(source: str, expected: str) -> None:
    assert _run(source) == expected


def test_off_by_default_and_positions_kept() -> None:
    _, tail = compile_snippet("2 + 3")
    assert tail is None
    _, tail = compile_snippet("x = 1\n\n1 / 0", auto_print=True)
    assert tail is not None
    with pytest.raises(ZeroDivisionError) as info:
        eval(tail, {})
    assert info.traceback[-1].lineno + 1 == 3


def test_syntax_errors_propagate() -> None:
    with pytest.raises(SyntaxError):
        compile_snippet("x = (", auto_print=True)
