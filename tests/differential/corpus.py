"""The differential's snippets: hand-written cases and generated variants, by family.

Each case prints only what ``python -B -c`` would print alike on any run (no pid, uid,
cwd, environment, timing or address: addresses are masked anyway). Families: output
plumbing, finalisation, exit statuses, exceptions and hooks, signals, forks and
processes, threads, encodings, files in and out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    """One snippet; ``files`` are written into its work dir first, ``fetch`` read back
    after it ends."""

    name: str
    family: str
    code: str
    files: dict[str, bytes] = field(default_factory=dict)
    fetch: tuple[str, ...] = ()


CASES: list[Case] = []


def case(
    family: str,
    name: str,
    *lines: str,
    files: dict[str, bytes] | None = None,
    fetch: tuple[str, ...] = (),
) -> None:
    full = f"{family}/{name}"
    assert all(c.name != full for c in CASES), full
    CASES.append(Case(full, family, "\n".join(lines), files or {}, fetch))


# How a snippet may end, after what it did: each family crosses its plumbing with them.
ENDINGS = {
    "falls-off": "",
    "exit-0": "import sys; sys.exit(0)",
    "exit-3": "import sys; sys.exit(3)",
    "exit-msg": "import sys; sys.exit('bye')",
    "raises": "raise ValueError('boom')",
    "os-exit": "import os; os._exit(4)",
    "kbd": "raise KeyboardInterrupt",
}

# -- output plumbing ---------------------------------------------------------------------

WRITES = {
    "print": "print('{t}')",
    "print-noeol": "print('{t}', end='')",
    "write": "import sys; sys.{s}.write('{t}\\n')",
    "buffer": "import sys; sys.{s}.buffer.write(b'{t}\\n')",
    "oswrite": "import os; os.write({fd}, b'{t}\\n')",
    "print-flush": "print('{t}', flush=True)",
}
for (wname, write), stream, (ename, ending) in itertools.product(
    WRITES.items(), ("stdout", "stderr"), ENDINGS.items()
):
    if wname.startswith("print") and stream == "stderr":
        write = write.replace(")", ", file=__import__('sys').stderr)", 1)
    fd = 1 if stream == "stdout" else 2
    first = write.format(t="first", s=stream, fd=fd)
    second = "print('second')"
    case("output", f"{wname}-{stream}-{ename}", first, second, ending)

REBINDS = {
    "to-stderr": "sys.stdout = sys.stderr",
    "stringio": "import io; sys.stdout = io.StringIO()",
    "devnull": "sys.stdout = open(os.devnull, 'w')",
    "file": "sys.stdout = open('out.txt', 'w')",
    "none": "sys.stdout = None",
    "del": "del sys.stdout",
    "restore": "s = sys.stdout; sys.stdout = io.StringIO(); print('hidden'); sys.stdout = s",
    "redirect": "import contextlib\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n    print('in')",
    "redirect-stderr": "import contextlib\nwith contextlib.redirect_stderr(sys.stdout):\n"
    "    print('e', file=sys.stderr)",
    "tee": "class Tee:\n    def __init__(s, *f): s.f = f\n"
    "    def write(s, x):\n        for f in s.f: f.write(x)\n"
    "    def flush(s):\n        for f in s.f: f.flush()\n"
    "sys.stdout = Tee(sys.stdout, sys.stderr)",
    "closed": "sys.stdout.close()",
    "dunder": "sys.stdout = sys.__stderr__",
}
for (rname, rebind), (ename, ending) in itertools.product(
    REBINDS.items(), [e for e in ENDINGS.items() if e[0] in ("falls-off", "exit-0", "raises")]
):
    case(
        "output",
        f"rebind-{rname}-{ename}",
        "import io, os, sys",
        "print('before')",
        rebind,
        "try:\n    print('after')\n"
        "except Exception as e:\n    os.write(2, repr(e).encode() + b'\\n')",
        ending,
        fetch=("out.txt",) if rname == "file" else (),
    )

case("output", "interleave-oswrite", "import os", "print('a')", "os.write(1, b'b\\n')")
case("output", "big", "print('x' * 3000)", "print('y' * 500)")
case("output", "many-lines", "for i in range(300):\n    print(i)")
case(
    "output",
    "stderr-line-buffered",
    "import os, sys",
    "sys.stderr.write('e1\\n'); os.write(2, b'raw\\n')",
)
case("output", "stderr-partial", "import os, sys", "sys.stderr.write('e1'); os.write(2, b'raw\\n')")
case("output", "print-sep-end", "print(1, 2, 3, sep='-', end='!\\n')")
case(
    "output",
    "stdout-line-buffering",
    "import sys",
    "print(sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stdout.write_through)",
)
case(
    "output",
    "reconfigure",
    "import sys",
    "sys.stdout.reconfigure(line_buffering=True)",
    "print('a')",
    "import os; os.write(1, b'b\\n')",
)
case("output", "flush-then-exit", "import sys, os", "print('a'); sys.stdout.flush(); os._exit(0)")
case("output", "unflushed-os-exit", "import os", "print('lost'); os._exit(0)")

# -- finalisation ------------------------------------------------------------------------

FINALISERS = {
    "del": "class A:\n    def __del__(self): print('del ran')\na = A()",
    "del-raises": "class A:\n    def __del__(self): raise ValueError('in del')\na = A()",
    "del-stderr": "import sys\nclass A:\n"
    "    def __del__(self): print('del', file=sys.stderr)\na = A()",
    "generator": "def g():\n    try:\n        yield 1\n    finally:\n        print('gen finally')\n"
    "it = g(); next(it)",
    "generator-raises": "def g():\n    try:\n        yield 1\n"
    "    finally:\n        raise KeyError('k')\n"
    "it = g(); next(it)",
    "cycle-del": "class A:\n    def __del__(self): print('cycle del')\na = A(); a.me = a; del a",
    "weakref-finalize": "import weakref\nclass A: pass\na = A()\n"
    "weakref.finalize(a, print, 'finalized')",
    "atexit": "import atexit\natexit.register(print, 'at exit')",
    "atexit-order": "import atexit\nfor i in range(3):\n    atexit.register(print, i)",
    "atexit-raises": "import atexit\n"
    "def f():\n    raise RuntimeError('in atexit')\natexit.register(f)",
    "atexit-builtin-raises": "import atexit\natexit.register(int, 'x')",
    "atexit-exit": "import atexit, sys\ndef f():\n    sys.exit(5)\natexit.register(f)",
    "atexit-prints-after-rebind": "import atexit, sys, io\natexit.register(print, 'ae')\n"
    "sys.stdout = io.StringIO()",
    "asyncio-pending": "import asyncio\nasync def f():\n    try:\n        await asyncio.sleep(10)\n"
    "    finally:\n        print('task cleanup')\nasync def main():\n"
    "    asyncio.get_running_loop().create_task(f())\n    await asyncio.sleep(0)\n"
    "asyncio.run(main())",
    "asyncio-loop-left": "import asyncio\nasync def f():\n"
    "    try:\n        await asyncio.sleep(10)\n"
    "    finally:\n        print('cleanup')\nloop = asyncio.new_event_loop()\n"
    "t = loop.create_task(f())\nloop.run_until_complete(asyncio.sleep(0))",
    "file-open": "f = open('left.txt', 'w'); f.write('data')",
    "unraisable-hook": "import sys\n"
    "sys.unraisablehook = lambda u: print('hooked', u.exc_type.__name__)\n"
    "class A:\n    def __del__(self): 1/0\na = A()",
    "del-uses-global": "import sys\nclass A:\n"
    "    def __del__(self): sys.stdout.write('global ok\\n')\n"
    "a = A()",
    "flush-fails": "import sys\nclass W:\n    def write(s, x): return len(x)\n"
    "    def flush(s): raise OSError(5, 'flush failed')\nsys.stdout = W()",
    "stderr-flush-fails": "import sys\nclass W:\n    def write(s, x): return len(x)\n"
    "    def flush(s): raise OSError(5, 'flush failed')\nsys.stderr = W()",
    "close-fd1": "import os\nprint('x')\nos.close(1)",
}
for (fname, body), (ename, ending) in itertools.product(
    FINALISERS.items(),
    [e for e in ENDINGS.items() if e[0] in ("falls-off", "exit-0", "exit-3", "raises")],
):
    case(
        "finalisation",
        f"{fname}-{ename}",
        body,
        ending,
        fetch=("left.txt",) if fname == "file-open" else (),
    )

# -- exit statuses -----------------------------------------------------------------------

EXIT_VALUES = [
    "0",
    "1",
    "2",
    "127",
    "128",
    "255",
    "256",
    "257",
    "-1",
    "-255",
    "10**30",
    "-10**30",
    "2**31",
    "2**31 + 7",
    "2**63",
    "2**63 - 1",
    "True",
    "False",
    "None",
    "'msg'",
    "''",
    "[1, 2]",
    "3.5",
    "b'x'",
    "ValueError('v')",
]
for i, value in enumerate(EXIT_VALUES):
    case("exit", f"sys-exit-{i}", "import sys", f"sys.exit({value})")
    case("exit", f"raise-systemexit-{i}", f"raise SystemExit({value})")
for value in ("0", "1", "7", "255"):
    case("exit", f"os-exit-{value}", "import os", f"print('p')\nos._exit({value})")
case("exit", "exit-two-args", "raise SystemExit(1, 2)")
case("exit", "kbd", "raise KeyboardInterrupt")
case("exit", "kbd-subclass", "class K(KeyboardInterrupt):\n    pass\nraise K")
case("exit", "kbd-msg", "raise KeyboardInterrupt('why')")
case("exit", "stderr-none-exit-msg", "import sys", "sys.stderr = None", "sys.exit('msg')")
case("exit", "stderr-del-exit-msg", "import sys", "del sys.stderr", "sys.exit('msg')")
case("exit", "exit-in-finally", "try:\n    1/0\nfinally:\n    raise SystemExit(9)")
case("exit", "exit-builtin", "exit(6)")
case("exit", "quit-builtin", "quit(7)")
case(
    "exit",
    "exit-from-thread",
    "import threading, sys",
    "t = threading.Thread(target=sys.exit, args=(3,)); t.start(); t.join(); print('main')",
)
case("exit", "generator-exit", "raise GeneratorExit")
case("exit", "base-exception", "raise BaseException('base')")

# -- exceptions and hooks ----------------------------------------------------------------

ERRORS = {
    "zero": "1/0",
    "name": "undefined_name",
    "attr": "import math; math.sqr",
    "key": "{}['k']",
    "index": "[][1]",
    "type": "len(1)",
    "value": "int('x')",
    "custom": "class MyError(Exception):\n    pass\nraise MyError('mine')",
    "custom-module": "class E(Exception):\n    __module__ = 'pkg.mod'\nraise E('e')",
    "notes": "e = ValueError('n')\ne.add_note('a note')\nraise e",
    "group": "raise ExceptionGroup('g', [ValueError(1), TypeError(2)])",
    "chained-from": "try:\n    1/0\nexcept Exception as e:\n    raise KeyError('k') from e",
    "chained-context": "try:\n    1/0\nexcept Exception:\n    raise KeyError('k')",
    "suppressed": "try:\n    1/0\nexcept Exception:\n    raise KeyError('k') from None",
    "bad-str": "class E(Exception):\n"
    "    def __str__(self): raise RuntimeError('no str')\nraise E()",
    "recursion": "def f(): f()\nf()",
    "assert": "assert 1 == 2, 'not equal'",
    "unicode-msg": "raise ValueError('ünïcödé ✓')",
    "multiline-msg": "raise ValueError('a\\nb')",
    "empty-msg": "raise ValueError()",
    "syntax": "x = (",
    "syntax-2": "def f(:\n    pass",
    "indent": "if True:\nprint(1)",
    "tab": "if True:\n\tx = 1\n        y = 2",
    "surrogate-literal": "x = '\\ud800'",
    "surrogate-source": "x = '\ud800'",
    "import-error": "import no_such_module_here",
    "from-import": "from math import nope",
}
WHERE = {
    "top": "{e}",
    "func": "def f():\n{ei}\nf()",
    "nested": "def f():\n    def g():\n{eii}\n    g()\nf()",
}


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


for (ename, error), (wname, where) in itertools.product(ERRORS.items(), WHERE.items()):
    if wname != "top" and ename in (
        "syntax",
        "syntax-2",
        "indent",
        "tab",
        "custom",
        "custom-module",
        "bad-str",
        "surrogate-source",
    ):
        continue
    case(
        "exceptions",
        f"{ename}-{wname}",
        where.format(e=error, ei=_indent(error, 4), eii=_indent(error, 8)),
    )

HOOKS = {
    "custom-hook": "def h(t, v, tb):\n    print('hook', t.__name__, v)\nsys.excepthook = h",
    "broken-hook": "def h(t, v, tb):\n    raise RuntimeError('hook broke')\nsys.excepthook = h",
    "deleted-hook": "del sys.excepthook",
    "none-hook": "sys.excepthook = None",
    "hook-exits": "def h(t, v, tb):\n    sys.exit(4)\nsys.excepthook = h",
    "stderr-none": "sys.stderr = None",
    "stderr-del": "del sys.stderr",
    "stdout-del": "del sys.stdout",
    "stderr-stringio": "import io\nsys.stderr = io.StringIO()",
    "stderr-closed": "sys.stderr.close()",
    "hook-prints-stdout": "import traceback\ndef h(t, v, tb):\n"
    "    traceback.print_exception(t, v, tb, file=sys.stdout)\nsys.excepthook = h",
}
for hname, hook in HOOKS.items():
    for tail in ("1/0", "print('fine')", "raise SystemExit('m')"):
        case("hooks", f"{hname}-{tail.split('(')[0].replace('/', 'div')}", "import sys", hook, tail)

# -- signals -----------------------------------------------------------------------------

SIGNALS = [
    "SIGTERM",
    "SIGUSR1",
    "SIGHUP",
    "SIGQUIT",
    "SIGALRM",
    "SIGINT",
    "SIGSEGV",
    "SIGABRT",
    "SIGPIPE",
    "SIGCHLD",
    "SIGUSR2",
    "SIGXFSZ",
]
for sig in SIGNALS:
    case(
        "signals",
        f"self-{sig}",
        "import os, signal",
        "print('before', flush=True)",
        f"os.kill(os.getpid(), signal.{sig})",
        "import time; time.sleep(0.2)",
        "print('after')",
    )
    case(
        "signals",
        f"handled-{sig}",
        "import os, signal",
        f"signal.signal(signal.{sig}, lambda s, f: print('got', s))",
        f"os.kill(os.getpid(), signal.{sig})",
        "print('after')",
    )
    case(
        "signals",
        f"ignored-{sig}",
        "import os, signal",
        f"signal.signal(signal.{sig}, signal.SIG_IGN)",
        f"os.kill(os.getpid(), signal.{sig})",
        "print('after')",
    )
    case("signals", f"disposition-{sig}", "import signal", f"print(signal.getsignal(signal.{sig}))")
case(
    "signals",
    "alarm",
    "import signal, time",
    "print('a', flush=True)",
    "signal.alarm(1)",
    "time.sleep(3)",
    "print('not reached')",
)
case(
    "signals",
    "alarm-handled",
    "import signal, time",
    "signal.signal(signal.SIGALRM, lambda s, f: print('alarm'))",
    "signal.alarm(1)",
    "time.sleep(3)",
    "print('after')",
)
case(
    "signals",
    "setitimer",
    "import signal, time",
    "signal.setitimer(signal.ITIMER_REAL, 0.2)",
    "time.sleep(2)",
)
case("signals", "abort", "import os", "print('x', flush=True)", "os.abort()")
case("signals", "raise-signal", "import signal", "signal.raise_signal(signal.SIGTERM)")
case(
    "signals",
    "pthread-kill",
    "import signal, threading",
    "signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)",
)
case(
    "signals",
    "sigint-handler-default",
    "import os, signal",
    "os.kill(os.getpid(), signal.SIGINT)",
    "import time; time.sleep(1)",
)
case(
    "signals",
    "blocked-then-unblocked",
    "import os, signal",
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})",
    "os.kill(os.getpid(), signal.SIGTERM)",
    "print('pending', signal.SIGTERM in signal.sigpending())",
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})",
    "print('not reached')",
)
case(
    "signals",
    "all-dispositions",
    "import signal",
    "print([(s, str(signal.getsignal(s))) for s in range(1, 32) if s not in (9, 19)])",
)
case("signals", "sigmask", "import signal", "print(signal.pthread_sigmask(signal.SIG_BLOCK, []))")

# -- forks and processes -----------------------------------------------------------------

CHILD_ENDS = {
    "return": "pass",
    "exit-0": "sys.exit(0)",
    "exit-5": "sys.exit(5)",
    "raises": "raise ValueError('child')",
    "os-exit": "os._exit(6)",
    "kbd": "raise KeyboardInterrupt",
    "self-term": "os.kill(os.getpid(), signal.SIGTERM)",
}
for (cname, cend), waited in itertools.product(CHILD_ENDS.items(), (True, False)):
    lines = [
        "import os, signal, sys",
        "pid = os.fork()",
        f"if pid == 0:\n    print('child', flush=True)\n    {cend}",
    ]
    if waited:
        lines.append(
            "else:\n    _, status = os.waitpid(pid, 0)\n"
            "    print('status', os.waitstatus_to_exitcode(status))"
        )
    else:
        lines.append("else:\n    import time; time.sleep(0.3)")
    lines.append("print('parent end')")
    case("forks", f"fork-{cname}-{'waited' if waited else 'unwaited'}", *lines)
case(
    "forks",
    "subprocess-python",
    "import subprocess, sys",
    "r = subprocess.run([sys.executable, '-c', 'print(42)'], capture_output=True, text=True)",
    "print(r.returncode, r.stdout)",
)
case(
    "forks",
    "subprocess-inherit",
    "import subprocess, sys",
    "print('first', flush=True)",
    "subprocess.run([sys.executable, '-c', 'print(\"sub\")'])",
    "print('last')",
)
case(
    "forks",
    "subprocess-exit-code",
    "import subprocess, sys",
    "print(subprocess.run([sys.executable, '-c', 'raise SystemExit(3)']).returncode)",
)
case(
    "forks",
    "subprocess-signal",
    "import subprocess, sys",
    "print(subprocess.run([sys.executable, '-c', "
    "'import os, signal; os.kill(os.getpid(), signal.SIGTERM)']).returncode)",
)
case(
    "forks",
    "unflushed-before-fork",
    "import os",
    "print('once')",
    "pid = os.fork()",
    "if pid:\n    os.waitpid(pid, 0)",
)
case(
    "forks",
    "fork-atexit",
    "import atexit, os",
    "atexit.register(print, 'atexit', flush=True)",
    "pid = os.fork()",
    "if pid:\n    os.waitpid(pid, 0)",
)
case(
    "forks",
    "mp-pool",
    "import multiprocessing as mp",
    "if __name__ == '__main__':\n    with mp.get_context('fork').Pool(2) as p:\n"
    "        print(p.map(abs, [-1, -2, 3]))",
)
case(
    "forks",
    "mp-process-exitcode",
    "import multiprocessing as mp, sys",
    "p = mp.get_context('fork').Process(target=sys.exit, args=(7,))",
    "p.start(); p.join()",
    "print(p.exitcode)",
)

# -- threads -----------------------------------------------------------------------------

case(
    "threads",
    "print",
    "import threading",
    "t = threading.Thread(target=print, args=('from thread',)); t.start(); t.join()",
)
case(
    "threads",
    "non-daemon-after-main",
    "import threading, time",
    "def w():\n    time.sleep(0.3)\n    print('late')",
    "threading.Thread(target=w).start()",
    "print('main done')",
)
case(
    "threads",
    "non-daemon-after-exit",
    "import threading, time, sys",
    "def w():\n    time.sleep(0.3)\n    print('late')",
    "threading.Thread(target=w).start()",
    "sys.exit(2)",
)
case(
    "threads",
    "non-daemon-after-error",
    "import threading, time",
    "def w():\n    time.sleep(0.3)\n    print('late')",
    "threading.Thread(target=w).start()",
    "1/0",
)
case(
    "threads",
    "daemon",
    "import threading, time",
    "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()",
    "print('main')",
)
case(
    "threads",
    "hook",
    "import threading",
    "threading.excepthook = lambda a: print('hooked', a.exc_type.__name__)",
    "t = threading.Thread(target=lambda: 1/0); t.start(); t.join()",
)
case(
    "threads",
    "executor",
    "from concurrent.futures import ThreadPoolExecutor",
    "with ThreadPoolExecutor(2) as ex:\n    print(list(ex.map(abs, [-1, -2])))",
)
case(
    "threads",
    "executor-unjoined",
    "from concurrent.futures import ThreadPoolExecutor",
    "import time",
    "ex = ThreadPoolExecutor(1)",
    "ex.submit(lambda: (time.sleep(0.2), print('job')))",
    "print('main')",
)
case(
    "threads", "interrupt-main", "import _thread, time", "_thread.interrupt_main()", "time.sleep(1)"
)
case(
    "threads",
    "atexit-in-thread-order",
    "import atexit, threading, time",
    "atexit.register(print, 'atexit')",
    "def w():\n    time.sleep(0.2)\n    print('thread')",
    "threading.Thread(target=w).start()",
)
case("threads", "active-count", "import threading", "print(threading.active_count())")
for n in (1, 2, 4, 8):
    case(
        "threads",
        f"many-{n}",
        "import threading",
        "out = []",
        f"ts = [threading.Thread(target=out.append, args=(i,)) for i in range({n})]",
        "[t.start() for t in ts]; [t.join() for t in ts]",
        "print(sorted(out))",
    )

# -- encodings ---------------------------------------------------------------------------

TEXTS = {
    "ascii": "plain",
    "latin": "café",
    "cjk": "漢字",
    "emoji": "😀",
    "surrogate": "\\ud800",
    "escape": "\\x00\\x1b[0m",
    "rtl": "שלום",
    "combining": "e\\u0301",
}
for (tname, text), stream in itertools.product(TEXTS.items(), ("stdout", "stderr")):
    case("encodings", f"{tname}-{stream}", "import sys", f"print('{text}', file=sys.{stream})")
    case(
        "encodings",
        f"{tname}-{stream}-repr",
        "import sys",
        f"print(ascii('{text}'), len('{text}'), file=sys.{stream})",
    )
case(
    "encodings",
    "stream-encodings",
    "import sys",
    "print(sys.stdout.encoding, sys.stdout.errors, sys.stderr.encoding, sys.stderr.errors,"
    " sys.stdin.encoding)",
)
case(
    "encodings",
    "filesystem",
    "import sys",
    "print(sys.getfilesystemencoding(), sys.getdefaultencoding(), sys.flags.utf8_mode)",
)
case("encodings", "locale", "import locale", "print(locale.getpreferredencoding(False))")
case("encodings", "invalid-utf8-bytes", "import sys", "sys.stdout.buffer.write(b'a\\xff\\xfeb\\n')")
case("encodings", "invalid-utf8-stderr", "import os", "os.write(2, b'\\xc3\\x28\\n')")
case(
    "encodings",
    "open-default",
    "with open('t.txt', 'w') as f:\n    f.write('é')",
    "print(open('t.txt', 'rb').read())",
    fetch=("t.txt",),
)
case("encodings", "source-coding", "# -*- coding: latin-1 -*-", "print('ok')")
case("encodings", "bom", "\ufeffprint('bom')")
case("encodings", "cookie-ignored", "# -*- coding: latin-1 -*-", "print(ascii('é'))")
case("encodings", "cookie-cp1252", "# coding: cp1252", "s = '€'", "print(len(s), ascii(s))")
case("encodings", "surrogate-error-message", "raise ValueError('\\udc80')")
case("encodings", "surrogate-name", "print('\\udcff'.encode('utf-8', 'surrogateescape'))")

# -- files in and out --------------------------------------------------------------------

DATA = {"in.txt": b"line one\nline two\n", "sub/d.bin": bytes(range(256))}
case("files", "read-text", "print(open('in.txt').read(), end='')", files=DATA)
case("files", "read-binary", "print(len(open('sub/d.bin', 'rb').read()))", files=DATA)
case(
    "files",
    "listdir",
    "import os",
    "print(sorted(os.listdir('.')), sorted(os.listdir('sub')))",
    files=DATA,
)
case(
    "files",
    "modify-fetch",
    "with open('in.txt', 'a') as f:\n    f.write('three\\n')",
    files=DATA,
    fetch=("in.txt",),
)
case("files", "missing-fetch", "print('nothing written')", fetch=("nope.txt",))
WRITES_OUT = {
    "with": "with open('o.txt', '{m}') as f:\n    f.write({d})",
    "left-open": "f = open('o.txt', '{m}'); f.write({d})",
    "in-func": "def w():\n    global g\n    g = open('o.txt', '{m}'); g.write({d})\nw()",
    "in-cycle": "class H: pass\n"
    "h = H(); h.h = h; h.f = open('o.txt', '{m}'); h.f.write({d})\ndel h",
    "flushed": "f = open('o.txt', '{m}'); f.write({d}); f.flush()",
    "buffered-big": "f = open('o.txt', '{m}'); f.write({d} * 5000)",
}
for (wname, body), mode, (ename, ending) in itertools.product(
    WRITES_OUT.items(),
    ("w", "wb", "a"),
    [e for e in ENDINGS.items() if e[0] in ("falls-off", "exit-0", "raises", "os-exit")],
):
    data = "b'data'" if mode == "wb" else "'data'"
    case("files", f"{wname}-{mode}-{ename}", body.format(m=mode, d=data), ending, fetch=("o.txt",))
case("files", "stdin-empty", "import sys", "print(repr(sys.stdin.read()))")
case("files", "input-eof", "input()")
case(
    "files",
    "tempfile",
    "import tempfile",
    "with tempfile.TemporaryFile() as f:\n    f.write(b'x'); f.seek(0); print(f.read())",
)
case(
    "files",
    "os-open-write",
    "import os",
    "fd = os.open('r.txt', os.O_WRONLY | os.O_CREAT)",
    "os.write(fd, b'raw')",
    fetch=("r.txt",),
)

# -- what the interpreter holds ------------------------------------------------------------

MODULE_PROBE = (
    "import sys\n"
    "names = ('ctypes', '_ctypes', 'msgpack', 'asyncio', 'json')\n"
    "print([m for m in names if m in sys.modules])"
)
FATAL = {
    "segv": "import faulthandler, os, signal\nfaulthandler.enable()\n"
    "os.kill(os.getpid(), signal.SIGSEGV)",
    "abort": "import faulthandler, os\nfaulthandler.enable()\nos.abort()",
    "dump": "import faulthandler\nfaulthandler.dump_traceback()",
}
for inputs in (False, True):  # with inputs, a snippet is cloned by another zygote
    files = {"in.txt": b"x"} if inputs else None
    suffix = "-with-inputs" if inputs else ""
    case("interpreter", f"modules{suffix}", MODULE_PROBE, files=files)
    for fname, body in FATAL.items():
        case("interpreter", f"fatal-{fname}{suffix}", body, files=files)
