"""Without namespaces (namespaces=False, as on a host that refuses them) the executor
still runs snippets, still cleans up after them as root, and says what is missing."""

from __future__ import annotations

import os
import time

from codepool.worker import LocalExecutor
from tests.conftest import processes_of


def test_fallback_runs_and_cleans_up() -> None:
    # subprocess is preloaded: without a mount namespace the snippet uid cannot read the
    # interpreter's files under /root on this host, and the report says so.
    with LocalExecutor(concurrency=2, mode="fork", preload=("subprocess",), namespaces=False) as ex:
        report = {line["name"]: line for line in ex.report}
        assert not report["namespaces"]["active"]
        assert "namespaces=False" in report["namespaces"]["detail"]
        assert not report["processes"]["active"]
        assert report["uid"]["active"]
        if any(os.stat(p).st_mode & 0o001 == 0 for p in ("/root",) if os.path.exists(p)):
            assert not report["interpreter paths"]["active"]

        r = ex.run("print(2 + 3)")
        assert (r.ok, r.stdout) == (True, "5\n")
        assert ex.run("while True: pass", timeout_s=1.0).timed_out

        marker = f"/tmp/codepool-fallback-{os.getpid()}"
        daemon = (
            "import os, subprocess, time\n"
            f"open({marker!r}, 'w').write('x')\n"
            "subprocess.Popen(['sleep', '1000'])\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    time.sleep(1000)\n"
            "print(os.getcwd())"
        )
        r = ex.run(daemon)
        assert r.ok, r.stderr
        workdir = r.stdout.strip()
        deadline = time.monotonic() + 5
        while processes_of(ex.snippet_uids, except_children_of=ex.supervisor_pid):
            assert time.monotonic() < deadline, "snippet processes outlived it"
            time.sleep(0.05)
        assert not os.path.exists(marker)
        assert not os.path.exists(workdir)
