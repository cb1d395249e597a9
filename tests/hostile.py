"""The hostile corpus: snippets that attack the host, the executor and their neighbours.
Run through the queue against a real worker (tests/reliability/test_hostile.py) and
through the executor on every child path (tests/worker/test_hostile_paths.py)."""

from __future__ import annotations

from collections.abc import Mapping

from codepool.common.result import ExecResult

HOSTILE = {
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


def check(results: Mapping[str, ExecResult], *, pidns: bool = True, fds: str = "[4]\n") -> None:
    """What each hostile snippet must come back as. ``pidns``: the snippet is its PID
    namespace's init, whose own SIGSTOP and SIGKILL the kernel drops (README: accepted
    differences); a context's call is not (its family's reaper is). ``fds``: the fds
    beyond stdio it may write to (a context's: its control socket, fd 3)."""
    # No secret anywhere; /tmp holds the snippet's own work dir (and, when the venv lives
    # under /tmp, its read-only bind), never the worker's socket dir.
    assert results["secrets"].stdout.startswith("False False ["), results["secrets"]
    assert "codepool-worker-" not in results["secrets"].stdout
    if pidns:
        assert results["kill-all"].stdout == "alive\n", results["kill-all"]
    else:  # killed by its own kill(0, SIGKILL), as under python -c
        assert results["kill-all"].returncode == -9, results["kill-all"]
    # Beyond stdio a snippet can write only to its own done pipe (worker/engine/done.py),
    # where what it writes could only end it early: these 64 bytes are no notice.
    assert (results["fds"].status, results["fds"].stdout) == ("ok", fds), results["fds"]
    assert results["fork-bomb"].status in ("timeout", "error"), results["fork-bomb"]
    assert results["memory-bomb"].status == "memory", results["memory-bomb"]
    fill = results["fill-disk"]
    assert fill.status == "error", fill
    assert "No space left" in fill.stderr, fill
    assert results["daemon"].stdout == "parent done\n", results["daemon"]
    assert results["closed-stdout"].status == "timeout", results["closed-stdout"]
    if pidns:
        assert results["sigstop"].stdout == "continued\n", results["sigstop"]
    else:  # stopped, as under python -c, until its timeout
        assert results["sigstop"].status == "timeout", results["sigstop"]
