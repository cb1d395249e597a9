"""Which zygote runs a snippet: the bare one (the interpreter and the C set-up alone,
see bare.py), the light one (no preload), the mid one (the first preloaded module
alone) or the heavy one (all of them).

A fork of the heavy image (numpy, sympy and whatever ``preload`` names) costs several
times a fork of a bare interpreter, in page tables, copied pages and exit teardown, and
most snippets never touch what it preloaded; a numpy snippet forked from a numpy-only
image costs a fifth less CPU than from numpy and sympy. So a snippet goes to the light
zygote unless a static scan of its imports finds a preloaded module or one outside the
standard library (third-party packages tend to pull in numpy); to the mid one when the
first preloaded module is the only one it imports beyond the standard library; else
to the heavy one. The scan only routes: a snippet that imports a module at run time
(``__import__``, ``importlib``) that its zygote did not preload still works, just slower.
Of the snippets the light zygote would run, the plain ones (no stdin, files, fetched
files or cells) go to the bare one where it runs.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import sys
import warnings

BARE = "bare"
LIGHT = "light"
MID = "mid"
HEAVY = "heavy"
KINDS = (BARE, LIGHT, MID, HEAVY)
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


def mid_preload(preload: list[str]) -> list[str] | None:
    """What the mid zygote preloads: the first module, when there is more than one."""
    return preload[:1] if len({name.split(".")[0] for name in preload}) > 1 else None


class Router:
    """Routes snippets by their imports, cached by code hash, among the zygotes that
    run: ``light``, ``mid`` (see mid_preload) and ``bare`` say which do besides the
    heavy one (without a light one, the heavy one preloads nothing and stands in)."""

    def __init__(
        self, preload: list[str], *, mid: bool = False, light: bool = True, bare: bool = False
    ) -> None:
        self.heavy = {name.split(".")[0] for name in preload}
        first = mid_preload(preload) if mid else None
        self.mid = first[0].split(".")[0] if first else None
        self.light = light
        self.bare = bare
        self.cache: collections.OrderedDict[bytes, str] = collections.OrderedDict()

    def kind(self, source: bytes, *, plain: bool = True) -> str:
        """``plain``: the request has no inputs (only those may go to the bare one)."""
        kind = self._by_imports(source)
        if kind == LIGHT:
            if plain and self.bare:
                return BARE
            if not self.light:
                return HEAVY
        return kind

    def _by_imports(self, source: bytes) -> str:
        if b"import" not in source:  # most snippets: no parse at all
            return LIGHT
        key = hashlib.blake2b(source, digest_size=16).digest()
        kind = self.cache.get(key)
        if kind is not None:
            self.cache.move_to_end(key)
            return kind
        names = imported_modules(source)
        # A syntax error fails the same in either; the light one fails it sooner.
        beyond = set() if names is None else {n for n in names if not self._stdlib(n)}
        if not beyond:
            kind = LIGHT
        elif self.mid is not None and beyond == {self.mid}:
            kind = MID
        else:
            kind = HEAVY
        self.cache[key] = kind
        if len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return kind

    def _stdlib(self, name: str) -> bool:
        return name in sys.stdlib_module_names and name not in self.heavy
