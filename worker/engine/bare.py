"""The bare zygote: plain snippets fork from an image of the interpreter, the C set-up
and the snippet runner, and nothing else.

A fork copies one page-table entry per resident page and one mapping per mapped
region, and the child's exit frees them all again. The light zygote's image holds the
whole set-up machinery (isolation, Landlock and seccomp in Python, the wire codec,
ctypes, msgpack): 10 MiB of heap and 127 mappings, where a bare interpreter has 5 MiB
and 44, so its fork and exit cost a plain snippet about twice the CPU. So the bare
zygote prepares as any zygote does (namespaces, both layers planned, hello sent), then
execs a fresh interpreter in the same process, which keeps the namespaces and the fds
the C set-up needs (the supervisor's socket, Landlock's path fds) and receives the rest
of _nativechild.serve's arguments through a memfd, marshalled. Only plain requests come
here (no stdin, files, fetched files or cells: their Python steps would be imported in
each child); the supervisor's router sees to that. Where the C set-up is not
available the zygote stays as it is and serves like a light one.
"""

from __future__ import annotations

import gc
import marshal
import os
import sys
from typing import Any, NoReturn

from codepool.worker.engine import contract, runtime

# ``python -B -c``, as the reference's snippets see it; the cwd is not searched.
BOOT = "import sys; del sys.path[0]; from codepool.worker.engine import bare; bare.main()"


def become(arguments: dict[str, Any], keep_fds: list[int]) -> NoReturn:
    """In a prepared zygote: exec the bare image, which serves with ``arguments``
    (native.serve_arguments) and inherits ``keep_fds``."""
    if os.geteuid() != 0:
        # Here, not at the top: the bare image imports this module, and must not ctypes.
        from codepool.worker.engine import linux

        # A user namespace's owner keeps its uid, so execve would drop its capabilities.
        linux.keep_capabilities_across_exec()
    carrier = os.memfd_create("codepool-bare")
    try:
        os.write(carrier, marshal.dumps(arguments))
        for fd in [carrier, *keep_fds]:
            os.set_inheritable(fd, True)
        os.execv(sys.executable, [sys.executable, "-B", "-c", BOOT, str(carrier)])
    except OSError:
        os.close(carrier)  # the caller serves from this image
        raise


def main() -> NoReturn:
    """The bare image's loop: in the zygote until the supervisor goes, in each child
    the snippet."""
    # Here, not at the top: every zygote imports this module, built extension or not.
    from codepool.worker.engine import _nativechild

    carrier = int(sys.argv[1])
    arguments = marshal.loads(os.pread(carrier, 1 << 24, 0))
    os.close(carrier)
    fresh = runtime.Fresh.create()
    gc.collect()
    gc.freeze()  # as in any zygote: the collector leaves the shared pages alone
    # __main__ after the freeze: the collector must see its namespace, or the cycles
    # through it (a function, a class) never die and their finalizers never run.
    fresh.main = runtime.fresh_main()
    runtime.prepare(fresh)
    arguments["vm_baseline"] = vm_size_bytes()  # this image's, not the one before exec
    runtime.done_notice = _nativechild.say_done
    runtime.reference_signals()  # the children's; serve() ignores SIGINT here
    got = _nativechild.serve(**arguments, warm=runtime.warm_up)
    if got is None:
        os._exit(0)  # the supervisor is gone
    payload, flags = got
    if flags < 0:  # a request with inputs: never routed here
        os.write(2, b"codepool: a request with inputs reached the bare zygote\n")
        os._exit(contract.SETUP_FAILED_EXIT)
    runtime.run_snippet(
        payload,
        auto_print=bool(flags & contract.FLAG_AUTO_PRINT),
        rich=bool(flags & contract.FLAG_RICH_TRACEBACKS),
    )


def vm_size_bytes() -> int:
    """This process's address space (RLIMIT_AS counts a child's from it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
