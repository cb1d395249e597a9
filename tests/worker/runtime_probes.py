"""Probes of the interpreter"s state as a snippet sees it, each run through every child
path and through ``python -B -c`` (tests/worker/test_runtime_differential.py).

Each prints what it finds; stdout, stderr and the return code must equal the
reference"s. None of them prints what README lists as an accepted difference (the uid,
pid 1 in the namespace, the environment allow-list, modules already imported, the
string hash seed of a zygote, the frozen objects of the zygote"s heap)."""

from __future__ import annotations


def _code(*lines: str) -> str:
    return "\n".join(lines)


PROBES: dict[str, str] = {
    "attribute-suggestion": _code(
        "import math",
        "math.sqr(2)",
    ),
    "method-suggestion": _code(
        "x = [1]",
        "x.apend(2)",
    ),
    "name-suggestion": _code(
        "lenght = 3",
        "print(lengt)",
    ),
    "builtin-suggestion": _code(
        "prnt('x')",
    ),
    "nested-name-suggestion": _code(
        "def f():",
        "    total = 1",
        "    return totl",
        "f()",
    ),
    "import-from": _code(
        "from math import sqr",
    ),
    "print-stack": _code(
        "import traceback",
        "traceback.print_stack()",
    ),
    "format-stack": _code(
        "import traceback",
        "print(traceback.format_stack())",
    ),
    "inspect-stack": _code(
        "import inspect",
        "print([f.function for f in inspect.stack()])",
    ),
    "frame-back": _code(
        "import sys",
        "print(sys._getframe().f_back)",
    ),
    "frame-depth": _code(
        "import sys",
        "f = sys._getframe()",
        "n = 0",
        "while f:",
        "    n += 1",
        "    f = f.f_back",
        "print(n)",
    ),
    "extract-stack": _code(
        "import traceback",
        "def g():",
        "    return len(traceback.extract_stack())",
        "print(g())",
    ),
    "recursion-depth": _code(
        "def f(n):",
        "    try:",
        "        return f(n + 1)",
        "    except RecursionError:",
        "        return n",
        "print(f(0))",
    ),
    "recursion-traceback": _code(
        "def f():",
        "    f()",
        "f()",
    ),
    "warning": _code(
        "import warnings",
        "warnings.warn('careful')",
    ),
    "main-globals": _code(
        "print(sorted(globals()))",
    ),
    "main-module": _code(
        "import sys",
        "m = sys.modules['__main__']",
        "print(m.__name__, m.__spec__, m.__loader__, m.__package__, m.__doc__, __annotations__)",
    ),
    "logging": _code(
        "import logging",
        "logging.warning('w')",
        "logging.getLogger(__name__).error('e')",
    ),
    "sigint-self": _code(
        "import os, signal",
        "try:",
        "    os.kill(os.getpid(), signal.SIGINT)",
        "    import time",
        "    time.sleep(1)",
        "except KeyboardInterrupt:",
        "    print('interrupted')",
    ),
    "keyboard-interrupt": _code(
        "print('x', flush=True)",
        "raise KeyboardInterrupt",
    ),
    "sigint-handler": _code(
        "import signal",
        "print(signal.getsignal(signal.SIGINT))",
    ),
    "dispositions": _code(
        "import signal",
        "unset = (signal.SIGKILL, signal.SIGSTOP, signal.SIGINT)",
        "print({s.name: signal.getsignal(s) for s in signal.Signals if s not in unset})",
    ),
    "sigterm-handler": _code(
        "import os, signal",
        "signal.signal(signal.SIGTERM, lambda *a: print('term'))",
        "os.kill(os.getpid(), signal.SIGTERM)",
        "print('after')",
    ),
    "blocked": _code(
        "import signal",
        "print(signal.pthread_sigmask(signal.SIG_BLOCK, []))",
    ),
    "exit-codes": _code(
        "import sys",
        "sys.exit(3)",
    ),
    "exit-string": _code(
        "import sys",
        "sys.exit('bye')",
    ),
    "exit-none": _code(
        "raise SystemExit",
    ),
    "exit-large": _code(
        "import sys",
        "sys.exit(300)",
    ),
    "exit-negative": _code(
        "import sys",
        "sys.exit(-1)",
    ),
    "os-exit": _code(
        "import os",
        "print('unflushed')",
        "os._exit(4)",
    ),
    "excepthook": _code(
        "import sys",
        "sys.excepthook = lambda t, v, tb: print('hook', t.__name__)",
        "1 / 0",
    ),
    "atexit": _code(
        "import atexit",
        "atexit.register(print, 'at exit')",
        "print('main')",
    ),
    "atexit-raises": _code(
        "import atexit",
        "def bad():",
        "    raise ValueError('late')",
        "atexit.register(bad)",
        "print('main')",
    ),
    "exception-group": _code(
        "raise ExceptionGroup('g', [ValueError(1), TypeError(2)])",
    ),
    "chained": _code(
        "try:",
        "    {}['k']",
        "except KeyError:",
        "    raise ValueError('v')",
    ),
    "syntax-error": _code(
        "def f(:",
        "    pass",
    ),
    "indentation": _code(
        "if True:",
        "print(1)",
    ),
    "flags": _code(
        "import sys",
        "print(sys.flags)",
    ),
    "gc": _code(
        "import gc",
        "print(gc.isenabled(), gc.get_threshold(), gc.get_debug())",
    ),
    "argv": _code(
        "import sys",
        "print(sys.argv)",
    ),
    "orig-argv": _code(
        "import sys",
        "print(sys.orig_argv[1:-1])",
    ),
    "path-head": _code(
        "import sys",
        "print(sys.path[0])",
    ),
    "recursion-limit": _code(
        "import sys",
        "print(sys.getrecursionlimit())",
    ),
    "int-digits": _code(
        "import sys",
        "print(sys.get_int_max_str_digits())",
    ),
    "stdio": _code(
        "import sys",
        "print([(s.encoding, s.errors, s.line_buffering) for s in (sys.stdout, sys.stderr)])",
    ),
    "stdin": _code(
        "import sys",
        "print(repr(sys.stdin.read()), sys.stdin.encoding)",
    ),
    "dont-write-bytecode": _code(
        "import sys",
        "print(sys.dont_write_bytecode)",
    ),
    "name": _code(
        "print(__name__, __builtins__)",
    ),
    "interrupt-in-thread": _code(
        "import _thread, time",
        "_thread.interrupt_main()",
        "try:",
        "    time.sleep(1)",
        "except KeyboardInterrupt:",
        "    print('interrupted')",
    ),
    "unraisable": _code(
        "class A:",
        "    def __del__(self):",
        "        raise ValueError('in del')",
        "a = A()",
        "del a",
        "print('after')",
    ),
    "thread-exception": _code(
        "import threading",
        "t = threading.Thread(target=lambda: 1 / 0)",
        "t.start()",
        "t.join()",
        "print('joined')",
    ),
    "main-dict": _code(
        "print(globals())",
    ),
    "stream-names": _code(
        "import sys",
        "print([(s.name, s.mode, s.buffer.raw.name) for s in (sys.stdin, sys.stdout, sys.stderr)])",
    ),
    "surrogate-out": _code(
        "print('\\udcff')",
    ),
}
