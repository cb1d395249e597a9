"""The runtime a snippet sees is the reference's: each probe of tests/worker/runtime_probes.py
runs through every child path (the C set-up with the bare and the full image, the Python
set-up, spawn, no namespaces) and through ``python -B -c`` with the snippet's own
environment (once per probe: the reference does not depend on the path), and stdout,
stderr and the return code must be equal. Two things are made alike first, both
documented in the README: the snippet's file ``<string>`` is named ``<sandbox>``, and
object addresses (which differ between any two runs) are masked."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import pytest

from codepool.worker import LocalExecutor
from codepool.worker.engine import native
from tests.conftest import CHILD_PATHS, NO_NAMESPACES, executor_on, skip_unreadable
from tests.reference import run_reference
from tests.worker.runtime_probes import PROBES

# A snippet that imports numpy is cloned by the preloading zygote (the full image).
IMAGES = {"plain": "", "preloaded": "import numpy\n"}
# Where the C module cannot hide the harness's frames (another CPython than it knows),
# these show them; the README says so.
FRAME_PROBES = {
    "print-stack",
    "format-stack",
    "inspect-stack",
    "frame-back",
    "frame-depth",
    "extract-stack",
    "recursion-depth",
    "recursion-traceback",
}
# Their output reads the interpreter's own files (threading.py's source lines).
READS_THE_INTERPRETER = {"thread-exception"}
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _alike(text: str) -> str:
    return _ADDRESS.sub(" at 0x", text)


@pytest.fixture(scope="module", params=[*CHILD_PATHS, NO_NAMESPACES])
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    """Every child path, and the one without namespaces."""
    with executor_on(request.param) as ex:
        yield ex


@pytest.fixture(scope="module")
def snippet_env(executor: LocalExecutor) -> dict[str, str]:
    """The environment the executor gives snippets (HOME and TMPDIR set per run)."""
    r = executor.run("import os, json\nprint(json.dumps(dict(os.environ)))")
    env: dict[str, str] = json.loads(r.stdout)
    return env


Reference = Callable[[str, dict[str, str]], tuple[str, str, int]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """What ``python -B -c code`` gives with ``env`` (HOME and TMPDIR its own cwd), each
    run once (no probe prints its work dir: the executor's is another anyway)."""
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, str, int]] = {}

    def run(code: str, env: dict[str, str]) -> tuple[str, str, int]:
        key = code, tuple(sorted((k, v) for k, v in env.items() if k not in ("HOME", "TMPDIR")))
        if key not in seen:
            cwd = tmp_path_factory.mktemp("reference")
            own = {**env, "HOME": str(cwd), "TMPDIR": str(cwd)}
            stdout, stderr, returncode = run_reference(code, env=own, cwd=cwd)
            same = "<string>", "<sandbox>"
            seen[key] = _alike(stdout.replace(*same)), _alike(stderr.replace(*same)), returncode
        return seen[key]

    return run


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("probe", PROBES)
def test_a_snippet_sees_what_python_c_shows(
    executor: LocalExecutor,
    snippet_env: dict[str, str],
    reference: Reference,
    probe: str,
    image: str,
) -> None:
    hidden = native._module is not None and getattr(native._module, "HIDES_FRAMES", 0)
    if probe in FRAME_PROBES and not hidden:
        pytest.skip("this CPython's frame layout is not known to _nativechild.run_main")
    if probe in READS_THE_INTERPRETER:
        skip_unreadable(executor, "this probe reads the interpreter's files")
    code = IMAGES[image] + PROBES[probe]
    r = executor.run(code, timeout_s=30.0)
    got = (_alike(r.stdout), _alike(r.stderr), r.returncode)
    assert got == reference(code, snippet_env)


def test_an_unhandled_keyboard_interrupt_ends_the_snippet_by_sigint(
    executor: LocalExecutor,
) -> None:
    r = executor.run("print('x', flush=True)\nraise KeyboardInterrupt")
    assert (r.returncode, r.signal, r.status, r.stdout) == (-2, 2, "signal", "x\n")
    assert r.stderr.endswith("KeyboardInterrupt\n")


def test_rich_tracebacks_keep_the_interpreters_suggestion(executor: LocalExecutor) -> None:
    r = executor.run("lenght = 3\nprint(lengt)", rich_tracebacks=True)
    assert r.stderr.splitlines()[-4:] == [
        '  File "<sandbox>", line 2, in <module>',
        "    print(lengt)",
        "           ^^^^^",
        "NameError: name 'lengt' is not defined. Did you mean: 'lenght'?",
    ]
