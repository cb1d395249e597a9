"""verl's own code for the optional tests, without verl's heavy dependencies.

Where verl is installed with its dependencies (``pip install codepool[verl]``), its
modules import as they are. Where only its source is at hand (a wheel unpacked, named
by ``CODEPOOL_VERL_SRC``, or ``pip install --no-deps verl``), the packages whose
``__init__`` pulls in torch and ray (``verl``, ``verl.utils``,
``verl.utils.reward_score``) are entered without running it, and the one module the
tool base class needs from ray's side, ``verl.utils.rollout_trace`` (a tracing
decorator), is replaced by a pass-through: the reward code, ``BaseTool`` and the tool
schemas that run are verl's own files. None when there is no verl at all."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any


def verl_root() -> Path | None:
    given = os.environ.get("CODEPOOL_VERL_SRC")
    if given:
        return Path(given) / "verl"
    spec = importlib.util.find_spec("verl")  # finds it without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def verl_module(name: str) -> Any:
    """verl's module ``name`` (``verl.tools.base_tool``, say), or None."""
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    root = verl_root()
    if root is None or not root.is_dir():
        return None
    for package in ("verl", "verl.utils", "verl.utils.reward_score"):
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
            sys.modules[package] = stub
    if "verl.utils.rollout_trace" not in sys.modules:
        trace = types.ModuleType("verl.utils.rollout_trace")
        trace.rollout_trace_op = lambda function: function  # type: ignore[attr-defined]
        sys.modules["verl.utils.rollout_trace"] = trace
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
