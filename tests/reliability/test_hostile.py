"""Hostile snippets through the queue, against a real worker: nothing leaks, nothing is
left running, and the worker's snippets run as fast afterwards as before."""

from __future__ import annotations

import statistics
import time
from urllib.parse import urlparse

from codepool.common.result import ExecResult
from codepool.ops.processes import descendants
from codepool.producer import CodePool
from tests.conftest import ROOT, StartWorker


def _exec_ms(pool: CodePool, n: int = 40) -> float:
    """Median time a plain snippet spends in its child: what a leftover process, a full
    /tmp or a damaged zygote would slow down, and far steadier on a shared machine than
    a batch's wall time."""
    results = pool.submit(["print(2 + 3)"] * n).results(timeout_s=60)
    assert all(r.stdout == "5\n" for r in results)
    return statistics.median(r.exec_s for r in results) * 1000


def test_hostile_snippets_change_nothing(redis_url: str, start_worker: StartWorker) -> None:
    worker = start_worker(concurrency=2, env={"CODEPOOL_TEST_SECRET": "hunter2"})
    pool = CodePool(redis_url)
    port = urlparse(redis_url).port
    baseline_processes = len(descendants(worker.process.pid))
    before = _exec_ms(pool)
    hostile = {
        "redis": f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
        "    print('REACHED')\nexcept OSError:\n    print('blocked')",
        "secrets": "import os\nseen = [open(f'/proc/{p}/environ', 'rb').read() for p in "
        "os.listdir('/proc') if p.isdigit()]\nprint(any(b'hunter2' in s or "
        "b'REDIS' in s for s in seen), 'REDIS_URL' in os.environ, "
        "sorted(os.listdir('/tmp')))",
        "kill-all": "import os, signal\nfor pid in [-1, 0, *range(1, 4000)]:\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "print('alive')",
        "fds": "import os\nhit = []\nfor fd in range(3, 1024):\n    try:\n"
        "        os.write(fd, b'x' * 64)\n        hit.append(fd)\n    except OSError:\n"
        "        pass\nprint(hit)",
        "fork-bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        pass",
        "memory-bomb": "x = []\nwhile True:\n    x.append(b'x' * (2 << 30))",
        "fill-disk": "import os\ni = 0\nwhile True:\n    with open(f'/tmp/f{i}', 'wb') as f:\n"
        "        f.write(b'x' * (8 << 20))\n    i += 1",
        "daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(1000)\n    os._exit(0)\nprint('parent done')",
        "closed-stdout": "import os\nos.close(1)\nwhile True:\n    pass",
        "sigstop": "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\nprint('continued')",
    }
    # Without root every snippet keeps the worker's uid, so a fork bomb starves the
    # snippets running beside it of processes (README, the rootless column): there it
    # runs alone, after the others; as root each snippet's uid has its own count.
    alone = {} if ROOT else {"fork-bomb": hostile.pop("fork-bomb")}
    results: dict[str, ExecResult] = {}
    for batch in filter(None, (hostile, alone)):
        outcomes = pool.submit(list(batch.values()), timeout_s=3.0).results(timeout_s=120)
        results.update(zip(batch, outcomes, strict=True))
    assert results["redis"].stdout == "blocked\n"
    # No secret anywhere; /tmp holds the snippet's own work dir (and, when the venv lives
    # under /tmp, its read-only bind), never the worker's socket dir.
    assert results["secrets"].stdout.startswith("False False [")
    assert "'work'" in results["secrets"].stdout
    assert "codepool-worker-" not in results["secrets"].stdout
    assert results["kill-all"].stdout == "alive\n"
    # Beyond stdio a snippet can write only to its own done pipe (worker/engine/done.py),
    # where what it writes could only end it early: these 64 bytes are no notice.
    assert (results["fds"].status, results["fds"].stdout) == ("ok", "[4]\n")
    assert results["fork-bomb"].status in ("timeout", "error")
    assert results["memory-bomb"].status == "memory"
    assert results["fill-disk"].status == "error" and "No space left" in results["fill-disk"].stderr
    assert results["daemon"].stdout == "parent done\n"
    assert results["closed-stdout"].status == "timeout"
    assert results["sigstop"].stdout == "continued\n"
    assert worker.process.poll() is None
    # Nothing the snippets started is left: the host is back to its own processes.
    deadline = time.monotonic() + 10
    while len(descendants(worker.process.pid)) > baseline_processes:
        assert time.monotonic() < deadline, descendants(worker.process.pid)
        time.sleep(0.1)
    after = _exec_ms(pool)
    assert after <= 3 * before + 5, f"a plain snippet took {after:.1f} ms, {before:.1f} before"
