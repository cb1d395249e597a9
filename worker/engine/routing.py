"""Which zygote runs a snippet: the light one (no preload) or the heavy one.

A fork of the heavy image (numpy, sympy and whatever ``preload`` names) costs several
times a fork of a bare interpreter, in page tables, copied pages and exit teardown, and
most snippets never touch what it preloaded. So a snippet goes to the light zygote
unless a static scan of its imports finds a preloaded module or one outside the
standard library (third-party packages tend to pull in numpy). The scan only routes:
a light snippet that imports a heavy module at run time (``__import__``, ``importlib``)
still works, just slower.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import sys
import warnings

LIGHT = "light"
HEAVY = "heavy"
CACHE_SIZE = 4096


def imported_modules(source: bytes) -> set[str] | None:
    """Top-level names of the modules ``source`` imports by statement (``import a.b``
    gives ``a``; relative imports give nothing), or None if it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


class Router:
    """Routes snippets by their imports, cached by code hash."""

    def __init__(self, preload: list[str]) -> None:
        self.heavy = {name.split(".")[0] for name in preload}
        self.cache: collections.OrderedDict[bytes, str] = collections.OrderedDict()

    def kind(self, source: bytes) -> str:
        if b"import" not in source:  # most snippets: no parse at all
            return LIGHT
        key = hashlib.blake2b(source, digest_size=16).digest()
        kind = self.cache.get(key)
        if kind is not None:
            self.cache.move_to_end(key)
            return kind
        names = imported_modules(source)
        # A syntax error fails the same in either; the light one fails it sooner.
        light = names is None or all(
            name in sys.stdlib_module_names and name not in self.heavy for name in names
        )
        kind = LIGHT if light else HEAVY
        self.cache[key] = kind
        if len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return kind
