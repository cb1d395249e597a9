"""The notebook inside an E2B code context: runs in the sandbox, in the context's own
interpreter, never in serve.

Serve sends this module's source to each new context once (``install_code``), which
makes it the module ``_codepool_e2b`` of that interpreter (forks inherit it); each
execution is then one context call, ``run(code, env_vars, nonce, piece_chars)``.

Notebook rules come from IPython's shell where IPython is installed (the optional extra
``codepool[notebook]``): the last expression's value is the main result, ``display()``
and matplotlib's figures (the inline backend) are display data, a DataFrame's columns
are ``e2b/data``, and the execution count is the shell's. Without IPython a small
fallback keeps the first two rules for plain values (its ``repr``).

What the execution printed through ``sys.stdout``/``sys.stderr`` is caught in order;
what it wrote to fds 1 and 2 directly (a subprocess) is the call's raw output, which
serve puts first. The events go back as JSON on the real stdout after a line holding
the call's nonce, at most ``piece_chars`` at a time: a context call's output is cut to
its ``max_output_chars``, so serve fetches the rest with ``more(nonce, offset, n)``.

Stdlib only (and IPython when present): the sandbox imports nothing of codepool's.
"""

from __future__ import annotations

import ast
import datetime
import importlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import textwrap
import traceback
from typing import Any

NAME = "_codepool_e2b"
FILENAME = "<codepool-e2b>"  # this module's frames, left out of a traceback
# The inline backend: figures become PNG display data (matplotlib_inline ships with IPython).
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
MAX_TRACEBACK_LINES = 200

_state: dict[str, Any] = {"count": 0, "base_env": {}, "pending": {}, "shell": None}


def setup(env_vars: dict[str, str], cwd: str | None) -> None:
    """Once per context: the sandbox's environment, the working dir, the shell."""
    for key, value in env_vars.items():
        os.environ[key] = value
    _state["base_env"] = dict(env_vars)
    if cwd:
        try:
            os.chdir(cwd)
        except OSError:
            pass  # serve reports the dir the interpreter really has
    _state["shell"] = _make_shell()
    print(json.dumps({"cwd": os.getcwd(), "ipython": _state["shell"] is not None}))


def run(code: str, env_vars: dict[str, str] | None, nonce: str, piece_chars: int) -> None:
    """Run one execution and print the first piece of its events (see the module doc)."""
    events: list[dict[str, Any]] = []
    saved = _set_env(env_vars or {})
    out, err = sys.stdout, sys.stderr
    sys.stdout = _Stream("stdout", events, out)
    sys.stderr = _Stream("stderr", events, err)
    try:
        shell = _state["shell"]
        if shell is not None:
            count = _run_in_shell(shell, code, events)
        else:
            count = _run_plain(code, events)
    finally:
        sys.stdout, sys.stderr = out, err
        _restore_env(saved)
    events.append({"type": "number_of_executions", "execution_count": count})
    payload = json.dumps(events, default=repr)
    _state["pending"] = {nonce: payload}
    _say(nonce, payload, 0, piece_chars)


def more(nonce: str, offset: int, piece_chars: int) -> None:
    """Print the next piece of an execution's events."""
    payload = _state["pending"].get(nonce, "")
    _say(nonce, payload, offset, piece_chars)
    if offset + piece_chars >= len(payload):
        _state["pending"] = {}


def _say(nonce: str, payload: str, offset: int, piece_chars: int) -> None:
    out = sys.stdout
    out.write(f"\n{nonce}{len(payload)}:{payload[offset : offset + piece_chars]}")
    out.flush()


class _Stream(io.TextIOBase):
    """A stdout or stderr that keeps what is written as events, in order; writes in a
    row to one stream are one event (print's text and its newline are one chunk)."""

    def __init__(self, name: str, events: list[dict[str, Any]], real: Any) -> None:
        self.name = name
        self.events = events
        self.real = real

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:
            return 0
        last = self.events[-1] if self.events else None
        if last is not None and last["type"] == self.name:
            last["text"] += text
        else:
            self.events.append({"type": self.name, "text": text, "timestamp": _now()})
        return len(text)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return int(self.real.fileno())

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _set_env(env_vars: dict[str, str]) -> dict[str, str | None]:
    saved = {key: os.environ.get(key) for key in env_vars}
    for key, value in env_vars.items():
        os.environ[str(key)] = str(value)
    return saved


def _restore_env(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# -- with IPython ---------------------------------------------------------------------


def _make_shell() -> Any:
    try:
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher
        from IPython.core.formatters import BaseFormatter
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets import ObjectName, Unicode
        from traitlets.config import Config
    except ImportError:
        return None
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="ipython-"))

    class Hook(DisplayHook):
        """The main result: kept as an event instead of an ``Out[n]:`` line."""

        events: list[dict[str, Any]] = []

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: Any, md_dict: Any = None) -> None:
            Hook.events.append({"type": "display", "main": True, "data": dict(format_dict)})

        def finish_displayhook(self) -> None:
            pass

    class Publisher(DisplayPublisher):
        """Display data (``display()``, figures): kept as events, in order."""

        def publish(self, data: Any, metadata: Any = None, *args: Any, **kwargs: Any) -> None:
            Hook.events.append({"type": "display", "main": False, "data": dict(data)})

        def clear_output(self, wait: bool = False) -> None:
            pass

    class Shell(InteractiveShell):
        def _showtraceback(self, etype: Any, evalue: Any, stb: list[str]) -> None:
            Hook.events.append(
                {
                    "type": "error",
                    "name": getattr(etype, "__name__", str(etype)),
                    "value": str(evalue),
                    "traceback": "\n".join(stb[-MAX_TRACEBACK_LINES:]),
                }
            )

    class DataFormatter(BaseFormatter):
        """A DataFrame's columns, as ``e2b/data`` (E2B's name for them)."""

        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj: Any) -> Any:
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return super().__call__(obj)
            columns = obj.to_dict(orient="list")
            return {
                str(name): [v.isoformat() if isinstance(v, pandas.Timestamp) else v for v in vs]
                for name, vs in columns.items()
            }

    class ChartFormatter(BaseFormatter):
        """A matplotlib figure's chart, as ``e2b/chart``, where E2B's own ``e2b_charts``
        (which reads the chart out of the figure) is installed."""

        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        def __call__(self, obj: Any) -> Any:
            figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
            if figure is None or not isinstance(obj, figure):
                return super().__call__(obj)
            try:
                charts = importlib.import_module("e2b_charts")
            except ImportError:
                return None
            try:
                return charts.chart_figure_to_dict(obj)
            except Exception:  # a figure it cannot read is still a PNG
                return {}

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Plain"
    main = sys.modules["__main__"]
    shell: Any = Shell.instance(
        config=config,
        user_module=main,
        user_ns=main.__dict__,
        displayhook_class=Hook,
        display_pub_class=Publisher,
    )
    formatters = shell.display_formatter.formatters
    formatters["e2b/data"] = DataFormatter(parent=shell.display_formatter)
    formatters["e2b/chart"] = ChartFormatter(parent=shell.display_formatter)
    shell._codepool_hook = Hook
    shell.system = shell.system_raw  # IPython's own wants a pty; a sandbox has none
    _inline_figures(shell)
    return shell


def _inline_figures(shell: Any) -> None:
    """Figures as PNG display data (matplotlib's inline backend, as in Jupyter), taken
    up when the user imports pyplot (importing matplotlib here would cost every context
    a second)."""
    if importlib.util.find_spec("matplotlib_inline") is None:  # found, not imported:
        return  # importing it imports matplotlib
    os.environ["MPLBACKEND"] = INLINE_BACKEND  # the worker's environment says Agg
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None:  # a worker that preloads it
        try:
            matplotlib.use(INLINE_BACKEND)
        except Exception:  # a broken matplotlib: the user sees it when they use it
            pass


def _run_in_shell(shell: Any, code: str, events: list[dict[str, Any]]) -> int:
    shell._codepool_hook.events = events
    try:
        result = shell.run_cell(code, store_history=True)
    finally:
        shell._codepool_hook.events = []
    count = result.execution_count
    return int(count) if count is not None else int(shell.execution_count) - 1


# -- without IPython -------------------------------------------------------------------


def _run_plain(code: str, events: list[dict[str, Any]]) -> int:
    _state["count"] += 1
    namespace = sys.modules["__main__"].__dict__
    filename = f"<cell {_state['count']}>"
    try:
        tree = ast.parse(textwrap.dedent(code), filename, "exec")
        tail = None
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
            tail = ast.Expression(body=last.value)
        exec(compile(tree, filename, "exec"), namespace)
        if tail is not None:
            value = eval(compile(tail, filename, "eval"), namespace)
            if value is not None and not code.rstrip().endswith(";"):
                namespace["_"] = value
                data = {"text/plain": repr(value)}
                events.append({"type": "display", "main": True, "data": data})
    except BaseException as exc:  # SystemExit too: a notebook reports it and goes on
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        kept = [line for line in lines if FILENAME not in line]
        events.append(
            {
                "type": "error",
                "name": type(exc).__name__,
                "value": str(exc),
                "traceback": "".join(kept[-MAX_TRACEBACK_LINES:]),
            }
        )
    return int(_state["count"])
