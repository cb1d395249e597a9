"""Compile a snippet, optionally splitting off a trailing expression to print (auto_print).

Stdlib only: the spawn-mode runner imports this in a fresh interpreter.
"""

from __future__ import annotations

import ast
from types import CodeType

FILENAME = "<sandbox>"


def compile_snippet(
    source: str | bytes, *, auto_print: bool = False, filename: str = FILENAME
) -> tuple[CodeType, CodeType | None]:
    """Compile ``source`` into (body, trailing expression or None).

    With ``auto_print``, when the last top-level statement is an expression, it is
    compiled separately so the caller can print its value, like a notebook cell.
    The AST nodes keep their positions, so tracebacks point at the user's lines.
    Raises SyntaxError (or ValueError for NUL bytes) like ``compile`` does.
    """
    if not auto_print:
        return compile(source, filename, "exec", dont_inherit=True), None
    tree = ast.parse(source, filename, "exec")
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return compile(tree, filename, "exec", dont_inherit=True), None
    last = tree.body.pop()
    assert isinstance(last, ast.Expr)
    expression = ast.Expression(body=last.value)
    return (
        compile(tree, filename, "exec", dont_inherit=True),
        compile(expression, filename, "eval", dont_inherit=True),
    )
