"""Observations equal the reference sandbox's: what a fresh ``python -B -c`` prints, its
``<string>`` frames named ``<sandbox>``; source lines and markers only when asked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from codepool.common import format_tool_content
from codepool.worker import LocalExecutor

BENIGN = [
    "print(2 + 3)",
    "1 / 0",
    "def f():\n    return 1 / 0\nf()",
    "x = (",
    "  x = 1",
    "undefined_name",
    "{}['key']",
    "import no_such_module",
    "[1 / 0 for _ in range(1)]",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise ValueError('v') from e",
    "try:\n    1 / 0\nexcept Exception:\n    raise KeyError(1)",
    "assert 1 == 2, 'message'",
    "import sys\nsys.exit('bye')",
    "import math\nprint(math.sqrt(-1))",
    "class A:\n    def m(self):\n        raise TypeError('t')\nA().m()",
    "print('before')\nraise SystemExit(2)",
    "int('x')",
    "import json\njson.loads('{')",
    "(lambda: 1 / 0)()",
]


def reference(code: str, cwd: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-B", "-c", code], capture_output=True, text=True, cwd=cwd, timeout=30
    )
    return done.stdout, done.stderr.replace('File "<string>"', 'File "<sandbox>"')


@pytest.mark.parametrize("code", BENIGN)
def test_tool_text_equals_the_reference(
    executor: LocalExecutor, code: str, tmp_path: object
) -> None:
    r = executor.run(code)
    stdout, stderr = reference(code, str(tmp_path))
    assert (r.stdout, r.stderr) == (stdout, stderr)
    expected = stdout if r.ok else stderr or f"Error: process exited with code {r.returncode}."
    assert format_tool_content(r) == expected


def test_rich_tracebacks_show_source_lines_and_markers(executor: LocalExecutor) -> None:
    r = executor.run("def f():\n    return 1 / 0\nf()", rich_tracebacks=True)
    assert r.stderr.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<sandbox>", line 3, in <module>',
        "    f()",
        '  File "<sandbox>", line 2, in f',
        "    return 1 / 0",
        "           ~~^~~",
        "ZeroDivisionError: division by zero",
    ]
    # The default is the reference's form.
    assert "return 1 / 0" not in executor.run("def f():\n    return 1 / 0\nf()").stderr
