"""A venv whose ``python3`` links through a directory under /tmp (as ``python3 -m venv``
makes when the python3 found on PATH is such a link) still runs spawn-mode snippets:
every hop of the link is in the snippet's mounts, although its /tmp is a fresh tmpfs."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile

DRIVER = """
from codepool.worker import LocalExecutor
with LocalExecutor(concurrency=1, mode="spawn", preload=()) as ex:
    r = ex.run("import sys; print(sys.executable)")
    print(r.status, r.stdout.strip(), r.stderr.strip()[-300:])
"""


def test_spawn_mode_in_a_venv_linked_through_tmp() -> None:
    base = tempfile.mkdtemp(prefix="codepool-link-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        link = os.path.join(base, "python3")
        os.symlink(os.path.realpath(sys.executable), link)
        venv = os.path.join(base, "venv")
        subprocess.run([link, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
        python = os.path.join(venv, "bin", "python")
        assert os.readlink(os.path.join(venv, "bin", "python3")) == link
        # The new venv sees the suite's packages (and the editable codepool's .pth).
        purelib = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        with open(os.path.join(purelib, "codepool-suite.pth"), "w") as f:
            f.write(
                "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
            )
        proc = subprocess.run(
            [python, "-c", DRIVER],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split("\n")[0] == f"ok {python} ", proc.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)
