"""multiprocessing in every environment of the isolation matrix: a Pool, a named
semaphore and shared memory work as under ``python -B -c``; what they leave in /dev/shm
goes with the snippet; and a concurrent snippet cannot open them by name, except where
snippets share the worker's uid with nothing else between them (non-root without
namespaces), where only the promised part is checked (see the README and shm.py).

Every environment but root with namespaces runs a driver under Debian's python3 with a
world-readable copy of codepool: without a mount namespace a snippet uid cannot read the
suite's interpreter (under /root, mode 700), so nothing outside the preload would import
and neither the spawn nor the forkserver start method (both exec the interpreter) nor
shared memory (its resource tracker is a fresh interpreter too) could run there."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from typing import Any

import pytest

from codepool.ops import doctor
from codepool.worker import LocalExecutor
from tests.conftest import (
    ROOT,
    ReadableCopy,
    assert_nothing_left,
    files_of,
    needs_a_system_python,
    processes_of,
    shm_names,
    wait_until,
)

# The snippets, formatted by the driver ({method}, {shm}: a name, {sem}: bytes).
POOL = """
import ctypes, multiprocessing, os
from multiprocessing import shared_memory

if __name__ == "__main__":
    context = multiprocessing.get_context({method!r})
    with context.Pool(2) as pool:
        print(pool.map(abs, [-1, -2, -3]))
    lock = context.Lock()
    with lock:
        print("locked")
    shm = shared_memory.SharedMemory(create=True, size=16)
    shm.buf[:5] = b"hello"
    again = shared_memory.SharedMemory(shm.name)
    print(bytes(again.buf[:5]).decode())
    again.close()
    shm.close()
    shm.unlink()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sem_open.restype = ctypes.c_void_p
    name = ("/codepool-sem-" + os.urandom(6).hex()).encode()
    sem = libc.sem_open(name, os.O_CREAT | os.O_EXCL, 0o600, 0)
    libc.sem_post(ctypes.c_void_p(sem))
    other = libc.sem_open(name, 0)
    print("semaphore posted", libc.sem_trywait(ctypes.c_void_p(other)) == 0)
    libc.sem_unlink(name)
"""
# Ends with its pool up, tidying nothing (under spawn and forkserver the pool's locks
# are named semaphores, which the resource tracker would remove).
ABANDONED = """
import multiprocessing, os
if __name__ == "__main__":
    pool = multiprocessing.get_context({method!r}).Pool(2)
    print(pool.map(abs, [-1]), flush=True)
    os._exit(3)
"""
OPEN = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.sem_open.restype = ctypes.c_void_p
"""
# A: makes both, closes them (only their names hold them), waits for SIGUSR1, reopens.
A = (
    OPEN
    + """
import signal
from multiprocessing import shared_memory
shm = shared_memory.SharedMemory(name={shm!r}, create=True, size=16)
shm.buf[:6] = b"secret"
shm.close()
libc.sem_close(ctypes.c_void_p(libc.sem_open({sem!r}, os.O_CREAT | os.O_EXCL, 0o600, 1)))
print(shm.name, {sem!r}.decode())
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
# A handler for SIGWINCH, which nothing else here catches: the mark that A is ready
# (SigCgt in /proc/PID/status; blocked shows nothing meanwhile, a wait unblocks what it
# waits for; SIGUSR1 shows as caught in every child, its default action's stand-in).
signal.signal(signal.SIGUSR1, lambda *_: None)
signal.signal(signal.SIGWINCH, lambda *_: None)
signal.sigwait({{signal.SIGUSR1}})
again = shared_memory.SharedMemory(name={shm!r})
print(bytes(again.buf[:6]).decode())
sem = libc.sem_open({sem!r}, 0)
print("semaphore", "reopened" if sem else os.strerror(ctypes.get_errno()))
again.close()
again.unlink()
libc.sem_unlink({sem!r})
"""
)
# B: lists /dev/shm, opens A's two by name (plain calls: no resource tracker of its own).
B = (
    OPEN
    + """
import _posixshmem, errno
try:
    print("listed", any({shm!r} in name for name in os.listdir("/dev/shm")))
except PermissionError:
    print("not listable")
try:
    os.close(_posixshmem.shm_open("/" + {shm!r}, os.O_RDONLY, 0))
    print("shared memory opened")
except OSError as exc:
    print("shared memory", type(exc).__name__)
sem = libc.sem_open({sem!r}, 0)
print("semaphore", "opened" if sem else errno.errorcode[ctypes.get_errno()])
"""
)
# Leaves both behind as it exits: only the executor's sweep removes them.
LEAVE = (
    OPEN
    + """
import _posixshmem
os.ftruncate(_posixshmem.shm_open("/" + {shm!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600), 4096)
libc.sem_open({sem!r}, os.O_CREAT | os.O_EXCL, 0o600, 1)
print(os.path.exists("/dev/shm/" + {shm!r}), os.path.exists("/dev/shm/sem." + {sem!r}.decode()[1:]))
"""
)


# Runs in the environment under test (argv[1]: JSON options, the snippets included);
# prints one JSON line.
DRIVER = r'''
import json, os, signal, subprocess, sys, tempfile, time
from codepool.worker import LocalExecutor

options = json.loads(sys.argv[1])
globals().update(options["snippets"])
tag = f"codepool-mp-{os.getpid()}-{os.urandom(3).hex()}"


def reference(code):
    with tempfile.TemporaryDirectory() as cwd:
        argv = [sys.executable, "-B", "-c", code]
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    return done.stdout


def wait_until(check, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def ready_for_usr1(supervisor):
    """The snippet process below the supervisor that handles SIGWINCH: A, about to wait
    for SIGUSR1."""
    with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
        children = f.read().split()
    for pid in children:
        try:
            with open(f"/proc/{pid}/status") as f:
                caught = [l for l in f if l.startswith("SigCgt:")][0].split()[1]
        except (OSError, IndexError):
            continue
        if int(caught, 16) & 1 << (signal.SIGWINCH - 1):
            return int(pid)
    return None


if options["container"]:  # started as a container runtime starts it
    from codepool.worker.engine import linux, seccomp

    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    seccomp.build(group_calls=False, sockets=False).install()

before_path = f"/dev/shm/{tag}-before"  # the worker user's own, older than the executor
os.close(os.open(before_path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
before = set(os.listdir("/dev/shm"))
out = {"runs": {}}
kwargs = {} if options["namespaces"] is None else {"namespaces": options["namespaces"]}
for mode in options["modes"]:
    with LocalExecutor(concurrency=2, mode=mode, preload=(), **kwargs) as ex:
        from multiprocessing import shared_memory

        held = shared_memory.SharedMemory(create=True, size=16)  # ours, newer, held open
        uids = set(ex.snippet_uids) or {os.geteuid()}
        out["report"] = {l["name"]: [l["active"], l["detail"]] for l in ex.report}
        out["supervisor"], out["uids"] = ex.supervisor_pid, [min(uids), max(uids) + 1]

        def left():
            found = []
            for name in set(os.listdir("/dev/shm")) - before - {held.name}:
                try:
                    if os.lstat("/dev/shm/" + name).st_uid in uids:
                        found.append(name)
                except FileNotFoundError:
                    pass
            return found

        def run(name, code, alone=True):
            r = ex.run(code, timeout_s=60.0)
            if alone:  # else what the snippet running beside it made is still there
                wait_until(lambda: not left())
            out["runs"][f"{mode}/{name}"] = [r.status, r.stdout, r.stderr[-2000:], left()]

        for method in options["methods"]:
            code = POOL.format(method=method)
            run(f"pool/{method}", code)
            out["runs"][f"{mode}/pool/{method}"].append(reference(code))
            if method != "fork":
                run(f"abandoned/{method}", ABANDONED.format(method=method))
        names = {"shm": f"{tag}-{mode}-shm", "sem": f"/{tag}-{mode}-sem".encode()}
        run("leave", LEAVE.format(**names))
        run("after-leave", B.format(**names))
        a = ex.submit(A.format(**names), timeout_s=60.0)
        found = wait_until(lambda: ready_for_usr1(ex.supervisor_pid) is not None)
        run("b", B.format(**names), alone=False)
        if found:
            os.kill(ready_for_usr1(ex.supervisor_pid), signal.SIGUSR1)
        r = a.result()
        wait_until(lambda: not left())
        out["runs"][f"{mode}/a"] = [r.status, r.stdout, r.stderr[-2000:], left()]
        out["held"] = os.path.exists(f"/dev/shm/{held.name}")
        held.close()
        if out["held"]:
            held.unlink()
out["before"] = os.path.exists(before_path)
if out["before"]:
    os.unlink(before_path)
print(json.dumps(out))
'''

OPTIONS = {
    "namespaces": None,  # the executor's default
    "container": False,
    "modes": ["fork"],  # spawn mode: its interpreter gets no PYTHONPATH (allow-listed env)
    "methods": ["fork", "forkserver", "spawn"],
    "snippets": {"POOL": POOL, "ABANDONED": ABANDONED, "A": A, "B": B, "LEAVE": LEAVE},
}


def _drive(copy: ReadableCopy | None, user: pwd.struct_passwd | None = None, **options: Any) -> Any:
    """Run the driver on Debian's python3 with ``copy``, as root or as ``user``; without
    a copy, on the suite's own interpreter as root."""
    argument = json.dumps({**OPTIONS, **options})
    if copy is None:
        argv = [sys.executable, "-c", DRIVER, argument]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    else:
        done = copy.run(copy.script("mp_driver.py", DRIVER), argument, user=user)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


POOL_OUTPUT = "[1, 2, 3]\nlocked\nhello\nsemaphore posted True\n"
# What B sees of A's two: each snippet's own tmpfs; a uid of its own (files 0600).
NAMESPACED = ["listed False", "shared memory FileNotFoundError", "semaphore ENOENT"]
OWN_UID = ["not listable", "shared memory PermissionError", "semaphore EACCES"]


def _check_runs(out: Any, *, b_sees: list[str]) -> None:
    """Every run as the reference ran, nothing left in /dev/shm after any of them, and
    B saw A's semaphore and shared memory as ``b_sees`` says (its three lines)."""
    assert out["before"] and out["held"], "a file the snippets did not make was removed"
    runs = out["runs"]
    for name, (status, stdout, stderr, left, *reference) in runs.items():
        assert left == [] or name.endswith("/b"), f"{name} left {left} in /dev/shm"
        if "/pool/" in name:
            assert (status, stdout) == ("ok", reference[0]) and stdout == POOL_OUTPUT, stderr
        elif "/abandoned/" in name:
            assert (status, stdout) == ("error", "[1]\n"), (name, stderr)
    for mode in {name.split("/")[0] for name in runs}:
        assert runs[f"{mode}/leave"][:2] == ["ok", "True True\n"], runs[f"{mode}/leave"]
        gone = runs[f"{mode}/after-leave"][1].splitlines()[1:]
        assert gone == ["shared memory FileNotFoundError", "semaphore ENOENT"], gone
        assert runs[f"{mode}/b"][:2] == ["ok", "\n".join(b_sees) + "\n"], runs[f"{mode}/b"]
        # A had closed both before B ended: they were still there for A to open again.
        status, stdout, stderr = runs[f"{mode}/a"][:3]
        assert (status, stdout.splitlines()[1:]) == ("ok", ["secret", "semaphore reopened"]), (
            stdout + stderr
        )


def _assert_nothing_left_by(out: Any) -> None:
    """Once the driver's executor has stopped, as root: no process and no temp file of
    its snippet uids (killed processes whose parent went first are init's to reap)."""
    uids = range(*out["uids"])
    wait_until(lambda: not processes_of(uids), what="the snippets' processes reaped")
    assert files_of(uids, out["supervisor"]) == []


@pytest.mark.skipif(not ROOT, reason="root with namespaces: the rootless case is below")
def test_multiprocessing_as_root_with_namespaces() -> None:
    """Each child's /dev/shm is a tmpfs of its own. The suite's interpreter (bound back
    into the mount namespace) runs the driver, so spawn mode is run too."""
    out = _drive(None, modes=["fork", "spawn"])
    assert out["report"]["processes"][0] and out["report"]["ipc"][0]
    assert "shared memory" not in out["report"]
    _check_runs(out, b_sees=NAMESPACED)
    _assert_nothing_left_by(out)


@needs_a_system_python
def test_multiprocessing_rootless_with_user_namespaces(
    readable_codepool: ReadableCopy, throwaway_user: pwd.struct_passwd
) -> None:
    out = _drive(readable_codepool, throwaway_user)
    assert out["report"]["processes"][0] and not out["report"]["uid"][0]
    _check_runs(out, b_sees=NAMESPACED)


@needs_a_system_python
def test_multiprocessing_as_root_without_namespaces(readable_codepool: ReadableCopy) -> None:
    """A uid per snippet: its files are 0600 and its own, and swept with it."""
    out = _drive(readable_codepool, namespaces=False)
    assert not out["report"]["processes"][0] and out["report"]["uid"][0]
    assert out["report"]["shared memory"][0]
    _check_runs(out, b_sees=OWN_UID)
    _assert_nothing_left_by(out)


@needs_a_system_python
def test_multiprocessing_under_a_container_profile(readable_codepool: ReadableCopy) -> None:
    """The executor's defaults under a seccomp profile that refuses namespaces (see
    test_container_profile): as root without namespaces."""
    out = _drive(readable_codepool, container=True)
    assert not out["report"]["processes"][0] and "cannot unshare" in out["report"]["network"][1]
    assert out["report"]["shared memory"][0]
    _check_runs(out, b_sees=OWN_UID)
    _assert_nothing_left_by(out)


@needs_a_system_python
def test_multiprocessing_as_non_root_without_namespaces(
    readable_codepool: ReadableCopy, throwaway_user: pwd.struct_passwd
) -> None:
    """Every snippet is the worker's uid: /dev/shm is not listable, what a snippet leaves
    goes after it, a file a running snippet closed stays until that snippet ends, and
    what the snippets did not make stays (the driver's own files, older and newer than
    the executor, and another user's). A concurrent snippet that knows a name opens it:
    the gap the README states, and doctor counts among what this environment cannot give."""
    other = f"/dev/shm/codepool-mp-other-{os.getpid()}"  # root's
    with open(other, "w") as f:
        f.write("root's")
    try:
        out = _drive(readable_codepool, throwaway_user, namespaces=False)
        assert os.path.exists(other)
    finally:
        os.unlink(other)
    report = out["report"]
    assert not report["processes"][0] and not report["uid"][0]
    assert not report["shared memory"][0]
    lines = [{"name": name, "active": line[0]} for name, line in report.items()]
    assert "shared memory" in doctor.environment(lines, root=False)[1]
    _check_runs(out, b_sees=["not listable", "shared memory opened", "semaphore opened"])


# Without a mount namespace a snippet uid cannot read the suite's interpreter (under
# /root): only what is preloaded imports, and neither the resource tracker nor the spawn
# and forkserver start methods (each a fresh interpreter) can run.
PRELOAD = (
    "ctypes",
    "mmap",
    "_posixshmem",
    "multiprocessing.pool",
    "multiprocessing.popen_fork",
    "multiprocessing.queues",
    "multiprocessing.synchronize",
)
IN_PROCESS = """
import ctypes, mmap, multiprocessing, os, _posixshmem
with multiprocessing.Pool(2) as pool:
    print(pool.map(abs, [-1, -2, -3]))
name = "/codepool-mp-" + os.urandom(6).hex()
fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, 16)
with mmap.mmap(fd, 16) as shared:
    shared[:5] = b"hello"
with mmap.mmap(_posixshmem.shm_open(name, os.O_RDONLY, 0), 16, prot=mmap.PROT_READ) as seen:
    print(seen[:5].decode())
_posixshmem.shm_unlink(name)
libc = ctypes.CDLL(None, use_errno=True)
libc.sem_open.restype = ctypes.c_void_p
print("semaphore", bool(libc.sem_open(name.encode(), os.O_CREAT | os.O_EXCL, 0o600, 1)))
libc.sem_unlink(name.encode())
"""


def test_multiprocessing_without_namespaces_in_process() -> None:
    """As whoever runs the suite (root: a uid per snippet; not root: the worker's), with
    the suite's own checks: conftest's covers /dev/shm here too."""
    before = shm_names()
    with LocalExecutor(concurrency=2, preload=PRELOAD, namespaces=False) as ex:
        r = ex.run(IN_PROCESS)
        assert (r.status, r.stdout) == ("ok", "[1, 2, 3]\nhello\nsemaphore True\n"), r.stderr
        assert_nothing_left(ex, shm_before=before)
        names = {"shm": f"codepool-mp-{os.getpid()}-left", "sem": f"/codepool-mp-{os.getpid()}"}
        r = ex.run(LEAVE.format(shm=names["shm"], sem=names["sem"].encode()))
        assert (r.status, r.stdout) == ("ok", "True True\n"), r.stderr
        assert_nothing_left(ex, shm_before=before)
