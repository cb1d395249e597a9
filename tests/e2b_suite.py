"""E2B's own Python SDK tests (e2b-dev/code-interpreter, ``python/tests``, sync and
async) run unchanged against ``codepool serve``: ``make e2b-test`` (docs/e2b.md).

It starts one serve (the embedded default: a private Redis and a local worker), points
the SDK at it the way a user does (``E2B_API_URL``, ``E2B_SANDBOX_URL``,
``E2B_API_KEY``) and runs E2B's pytest suite in its own directory with its own
``pytest.ini``. Left out, each for the reason given in ``LEFT_OUT``: tests of other
languages, of E2B's image layout (cwd ``/home/user``, its systemd services, its
start-up hooks) and of package versions the worker lacks.

    python -m tests.e2b_suite [E2B_REPO_DIR] [pytest args...]

E2B_REPO_DIR is a checkout of e2b-dev/code-interpreter (default
``build/e2b-code-interpreter``, cloned there when missing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from codepool.common.reaping import wait_or_kill
from tests.ops.test_serve import start_serve

REPO = "https://github.com/e2b-dev/code-interpreter"
DEFAULT_DIR = Path("build/e2b-code-interpreter")
OTHER_LANGUAGE = "another language than Python"
LAYOUT = "E2B's image layout"
LEFT_OUT = {
    "tests/sync/env_vars/test_bash.py": OTHER_LANGUAGE,
    "tests/sync/env_vars/test_java.py": OTHER_LANGUAGE,
    "tests/sync/env_vars/test_js.py": OTHER_LANGUAGE,
    "tests/sync/env_vars/test_r.py": OTHER_LANGUAGE,
    "tests/async/env_vars/test_bash.py": OTHER_LANGUAGE,
    "tests/async/env_vars/test_java.py": OTHER_LANGUAGE,
    "tests/async/env_vars/test_js.py": OTHER_LANGUAGE,
    "tests/async/env_vars/test_r.py": OTHER_LANGUAGE,
    "tests/sync/test_default_kernels.py": OTHER_LANGUAGE,
    "tests/async/test_async_default_kernels.py": OTHER_LANGUAGE,
    # A JavaScript context among the defaults.
    "tests/sync/test_contexts.py::test_list_contexts": OTHER_LANGUAGE,
    "tests/sync/test_contexts.py::test_list_contexts_secure_traffic": OTHER_LANGUAGE,
    "tests/async/test_async_contexts.py::test_list_contexts": OTHER_LANGUAGE,
    "tests/async/test_async_contexts.py::test_list_contexts_secure_traffic": OTHER_LANGUAGE,
    # cwd /home/user (and other languages).
    "tests/sync/test_cwd.py": LAYOUT,
    "tests/async/test_async_cwd.py": LAYOUT,
    "tests/sync/test_bash.py": LAYOUT,
    "tests/async/test_async_bash.py": LAYOUT,
    # Its systemd services (kills Jupyter and its server, waits for systemd to restart them).
    "tests/sync/test_systemd.py": LAYOUT,
    "tests/async/test_async_systemd.py": LAYOUT,
    # A start-up hook of E2B's image that makes PIL's Image.save display the image.
    "tests/images/test_images.py::test_get_image_on_save": LAYOUT,
    # boxplot(labels=) is gone from the matplotlib the worker has (tick_labels= now).
    "tests/charts/test_box_and_whiskers.py": "a package version the worker lacks",
}


def main(argv: list[str]) -> int:
    repo = Path(argv[0]) if argv and not argv[0].startswith("-") else DEFAULT_DIR
    extra = argv[1:] if argv and not argv[0].startswith("-") else argv
    if not (repo / "python" / "tests").is_dir():
        subprocess.run(["git", "clone", "--depth", "1", REPO, str(repo)], check=True)
    root = (repo / "python").resolve()
    with tempfile.TemporaryDirectory() as home:
        serve = start_serve(Path(home) / "serve.log")
        try:
            env = {
                **os.environ,
                "E2B_API_URL": f"{serve.url}/e2b",
                "E2B_SANDBOX_URL": f"{serve.url}/e2b",
                "E2B_API_KEY": "any",  # serve has no token here: any key is taken
            }
            left_out = [f"--deselect={test}" for test in LEFT_OUT if "::" in test]
            left_out += [f"--ignore={test}" for test in LEFT_OUT if "::" not in test]
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *left_out]
            command += ["tests", *extra]
            print("left out:", file=sys.stderr)
            for test, why in LEFT_OUT.items():
                print(f"  {test}: {why}", file=sys.stderr)
            return subprocess.run(command, cwd=root, env=env).returncode
        finally:
            serve.process.send_signal(signal.SIGTERM)
            wait_or_kill(serve.process, 30)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
