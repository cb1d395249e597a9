"""Only the snippet's first process ends the snippet: whatever it forks may end in any
way (return, sys.exit, an exception, os._exit) and the snippet goes on, as under
``python -B -c``; on every child path (C set-up, bare and full images; Python set-up;
spawn; no namespaces, where the snippet's first process is not pid 1 and says no done
notice). The reference does not depend on the path: it runs once per case."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from codepool.worker import LocalExecutor
from tests.conftest import (
    CHILD_PATHS,
    NO_NAMESPACES,
    assert_nothing_left,
    executor_on,
    skip_unreadable,
)
from tests.reference import run_reference

PARENT_WAITS = (
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    print('child', flush=True)\n"
    "    {ending}\n"
    "else:\n"
    "    os.waitpid(pid, 0)\n"
    "    time.sleep(0.3)\n"
    "    print('parent done')\n"
)
ENDINGS = {
    "returns": "pass",
    "exits-0": "sys.exit(0)",
    "exits-3": "sys.exit(3)",
    "raises": "raise ValueError('in the child')",
    "os-exit": "os._exit(0)",
    "interrupted": "raise KeyboardInterrupt",
}
MULTIPROCESSING = {
    method: (
        "import multiprocessing as mp\n"
        f"ctx = mp.get_context({method!r})\n"
        "with ctx.Pool(2) as pool:\n"
        "    print(pool.map(abs, [-1, -2, -3]))\n"
        "p = ctx.Process(target=print, args=('from a process',))\n"
        "p.start()\n"
        "p.join()\n"
        "print('exit code', p.exitcode)\n"
    )
    for method in ("fork", "forkserver", "spawn")
}
FRESH_INTERPRETER = {"multiprocessing-forkserver", "multiprocessing-spawn"}
LOOP = (
    "import os, sys\n"
    "for i in range(6):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        print('child', i, flush=True)\n"
    "        sys.exit(i)\n"
    "    _, status = os.waitpid(pid, 0)\n"
    "    print('reaped', os.waitstatus_to_exitcode(status), flush=True)\n"
    "print('done')\n"
)
CASES = {
    **{f"fork-child-{name}": PARENT_WAITS.format(ending=end) for name, end in ENDINGS.items()},
    **{f"multiprocessing-{method}": code for method, code in MULTIPROCESSING.items()},
    "fork-in-a-loop": LOOP,
}
# A snippet that imports numpy is cloned by the preloading zygote (the full image, set
# up in C), not the bare one.
IMAGES = {"plain": "", "preloaded": "import numpy\n"}


@pytest.fixture(scope="module", params=[*CHILD_PATHS, NO_NAMESPACES])
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    """Every child path, and the one without namespaces."""
    with executor_on(request.param) as ex:
        yield ex


Reference = Callable[[str], tuple[str, str, int]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """stdout, stderr and return code of ``python -B -c code``, each run once."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    seen: dict[str, tuple[str, str, int]] = {}

    def run(code: str) -> tuple[str, str, int]:
        if code not in seen:
            cwd = tmp_path_factory.mktemp("reference")
            stdout, stderr, returncode = run_reference(code, env=env, cwd=cwd)
            seen[code] = stdout, stderr.replace('File "<string>"', 'File "<sandbox>"'), returncode
        return seen[code]

    return run


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("case", CASES)
def test_what_a_snippet_forks_never_ends_it(
    executor: LocalExecutor, reference: Reference, case: str, image: str
) -> None:
    if case in FRESH_INTERPRETER:
        skip_unreadable(executor, "this start method starts the interpreter afresh")
    code = IMAGES[image] + CASES[case]
    r = executor.run(code, timeout_s=30.0)
    assert (r.stdout, r.stderr, r.returncode) == reference(code)
    assert r.status == "ok" and not r.timed_out


def test_a_child_that_outlives_its_parent_is_reaped_with_the_snippet(
    executor: LocalExecutor,
) -> None:
    code = (
        "import os, sys, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    print('child up', flush=True)\n"
        "    os.write(w, b'x')\n"
        "    time.sleep(60)\n"
        "    print('child late', flush=True)\n"
        "    sys.exit(0)\n"
        "os.read(r, 1)\n"
        "print('parent done')\n"
    )
    r = executor.run(code, timeout_s=30.0)
    assert (r.status, r.returncode, r.stdout) == ("ok", 0, "child up\nparent done\n")
    assert_nothing_left(executor)
