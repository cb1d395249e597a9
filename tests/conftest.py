"""Shared fixtures: real executors (real zygotes, real namespaces), torn down after use."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

import codepool.common
import codepool.ops
import codepool.worker
from codepool.common.errors import ConfigError
from codepool.common.process_start import start_ticks
from codepool.common.reaping import wait_or_kill
from codepool.ops.bench.process_tree import children, descendants
from codepool.ops.redis_server import RedisServer
from codepool.ops.server_binary import find_server_binary
from codepool.producer import CodePool
from codepool.worker import LocalExecutor
from codepool.worker.engine.config import FALLBACK_PREFIX
from tests.processes import exiting, processes

VOLATILE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


# The paths a child can take. "fork": the C set-up; "fork-python": the Python set-up
# (where no compiler was at install time); "spawn": a fresh interpreter per snippet;
# "no-namespaces": what containers without user namespaces get, the Python set-up with
# no PID namespace (the snippet's first process is not pid 1, so it says no done notice
# and its end is its exit), a uid per snippet as root.
CHILD_PATHS = ("fork", "spawn", "fork-python")
NO_NAMESPACES = "no-namespaces"
# Without a mount namespace a snippet uid reads the interpreter only where every parent
# directory is world-searchable (not the suite's under /root): there only preloaded
# modules import, so multiprocessing's fork start method is preloaded (the spawn and
# forkserver methods, fresh interpreters, cannot run at all; see skip_unreadable).
MULTIPROCESSING = (
    "multiprocessing.pool",
    "multiprocessing.popen_fork",
    "multiprocessing.queues",
    "multiprocessing.synchronize",
)


@contextmanager
def executor_on(path: str) -> Iterator[LocalExecutor]:
    """An executor whose children take ``path`` (CHILD_PATHS or NO_NAMESPACES)."""
    if path == NO_NAMESPACES:
        with LocalExecutor(
            concurrency=2, preload=("numpy", *MULTIPROCESSING), namespaces=False
        ) as ex:
            yield ex
        return
    mode, _, steps = path.partition("-")
    with LocalExecutor(
        concurrency=2, mode=mode, preload=("numpy",), native_child=steps != "python"
    ) as ex:
        yield ex


@pytest.fixture(scope="module", params=CHILD_PATHS)
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    """Both modes, and fork mode with each child set up by the Python steps instead of
    the C extension (where no compiler was at install time): every contract holds on
    each. A module whose contract holds without namespaces too overrides this with
    ``params=[*CHILD_PATHS, NO_NAMESPACES]``."""
    with executor_on(request.param) as ex:
        yield ex


def skip_unreadable(executor: LocalExecutor, why: str) -> None:
    """Skip, saying ``why`` needs them, where this executor's snippet uids cannot read
    the interpreter's files (its report's "interpreter paths" line: root without a mount
    namespace, an interpreter under a directory only root may search)."""
    for line in executor.report:
        if line["name"] == "interpreter paths" and not line["active"]:
            pytest.skip(f"{why}, and here {line['detail']}")


def poll_until(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout_s`` has passed (False): the one
    polling loop of the suite, for waits whose running out is an answer, not a failure."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def wait_until(
    check: Callable[[], bool], timeout_s: float = 10.0, what: str | Callable[[], str] = ""
) -> None:
    """Poll ``check`` until it holds; fail after ``timeout_s``, naming ``what`` (or what
    it returns then: logs, say)."""
    if not poll_until(check, timeout_s):
        said = what() if callable(what) else what
        raise AssertionError(f"not met within {timeout_s} s: {said or check}")


def processes_of(uids: range, *, except_children_of: int = 0, running: bool = False) -> list[str]:
    """Command lines of live processes running as any of ``uids``.

    ``except_children_of``: leave out direct children of this pid (the zygote's one
    waiting child already runs as its snippet uid). ``running``: leave out those in
    their exit (zombies included): they run nothing more.
    """
    return [
        p.cmdline
        for p in processes()
        if p.uid in uids
        and not (except_children_of and p.ppid == except_children_of)
        and not (running and exiting(p.pid))
    ]


def command_lines(containing: str) -> list[str]:
    """Command lines of live processes that contain ``containing``."""
    return [p.cmdline for p in processes() if containing in p.cmdline]


def sleeping_pids(pid: int) -> dict[int, int]:
    """Processes below ``pid`` in a timed sleep (a snippet's ``time.sleep``: what tells
    a snippet that runs from one only claimed), each with its start ticks, so that
    ``tests.processes.still_running`` can tell when they are gone."""
    found = {}
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/wchan") as f:
                asleep = "nanosleep" in f.read()
        except OSError:
            continue
        ticks = start_ticks(child)
        if asleep and ticks is not None:
            found[child] = ticks
    return found


def sleeping_below(pid: int) -> int:
    """How many processes below ``pid`` sit in a timed sleep."""
    return len(sleeping_pids(pid))


# "What runs is killed and its slot freed within about a second" (README, Giving up):
# the bound the tests hold a cancellation to, from the give-up to the snippet's process
# gone and its slot serving another snippet. Far below what else would end a sleeper
# (it asks for 300 s, the worker's ceiling makes it 30 s), and generous against a
# loaded two-core machine.
KILLED_WITHIN_S = 5.0


def waiting_children(executor: LocalExecutor) -> list[int]:
    """The supervisor's children other than the zygote: the snippets' processes."""
    return [pid for pid in children(executor.supervisor_pid) if pid not in executor.zygote_pids]


def files_of(
    uids: range, supervisor_pid: int, *, shm_before: Collection[str] | None = None
) -> list[str]:
    """Entries in the host's temp dirs owned by ``uids`` or left by that supervisor (not
    by other executors, whatever they left); with ``shm_before`` (the names in /dev/shm
    as the executor started; snippets without namespaces or uids of their own use the
    host's /dev/shm as the worker's uid) also what is new there and of this uid."""
    found = []
    for root in VOLATILE_DIRS:
        for name in os.listdir(root):
            path = os.path.join(root, name)
            try:
                owner = os.lstat(path).st_uid
            except FileNotFoundError:
                continue
            ours = owner in uids or name.startswith(f"{FALLBACK_PREFIX}{supervisor_pid}-")
            if shm_before is not None and root == "/dev/shm":
                ours = ours or (owner == os.geteuid() and name not in shm_before)
            if ours:
                found.append(path)
    return found


def shm_names() -> set[str]:
    """What the host's /dev/shm holds now (for ``shm_before``)."""
    return set(os.listdir("/dev/shm"))


ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not ROOT, reason="needs root: only a root worker gives each snippet a uid of its own"
)


def assert_nothing_left(
    executor: LocalExecutor, *, shm_before: Collection[str] | None = None
) -> None:
    """No process and no file of any snippet outlives it (checked on the host).

    As root each snippet has a uid of its own, so anything of those uids is a leftover
    (in /dev/shm too); as non-root snippets keep the worker's uid, so what is looked for
    is anything below the supervisor other than its zygotes and the children they cloned
    ahead, and (given ``shm_before``, see files_of; ignored as root) new files of that
    uid in /dev/shm.

    A snippet's result goes out before its process's exit has torn its image down
    (worker/engine/done.py): what is still in its exit is waited for first (it runs
    nothing more), and only for so long."""
    give_up = time.monotonic() + 5.0
    while True:
        while any(map(exiting, descendants(executor.supervisor_pid))):
            assert time.monotonic() < give_up, "a snippet's process took 5 s to exit"
            time.sleep(0.005)
        below = descendants(executor.supervisor_pid)  # before: a clone ahead may come
        waiting = waiting_children(executor)
        # A child killed at its notice may not have begun its exit yet on a busy host.
        if len(waiting) <= 2 * len(executor.zygote_pids) or time.monotonic() > give_up:
            break
        time.sleep(0.005)
    # Between snippets the only children left are the (at most two per zygote) waiting.
    assert len(waiting) <= 2 * len(executor.zygote_pids)
    if ROOT:
        assert executor.snippet_uids, "a root executor must give snippets their own uids"
        uids, shm_before = executor.snippet_uids, None  # their files are those uids'
        # Without a PID namespace a killed process whose parent went first is the host's
        # init's to reap, whenever it gets round to it (some reap one per SIGCHLD): it is
        # judged once in its exit, where the kill lands in its own time.
        give_up = time.monotonic() + 5.0
        while (
            running := processes_of(uids, except_children_of=executor.supervisor_pid, running=True)
        ) and time.monotonic() < give_up:
            time.sleep(0.02)
        assert running == []
    else:
        uids = range(0)
        expected = {*executor.zygote_pids, *waiting}
        assert [p for p in below if p not in expected] == []

    def left() -> list[str]:
        # Without namespaces each waiting child has a work dir on the host: it sits in it
        # once set up; one cloned a moment ago (still the zygote's uid and cwd) has an
        # empty one it has not entered yet. Neither is a leftover.
        waiting = waiting_children(executor)
        waiting_in = {_cwd(pid) for pid in waiting}
        found = files_of(uids, executor.supervisor_pid, shm_before=shm_before)
        found = [path for path in found if path not in waiting_in]
        unplaced = sum(not _cwd(pid).startswith(tuple(VOLATILE_DIRS)) for pid in waiting)
        empty = [path for path in found if _empty_work_dir(path)]
        if 0 < len(empty) <= unplaced:
            found = [path for path in found if path not in empty]
        return found

    # The supervisor sweeps once it has sent the result: wait for it, only so long.
    # Judged on the look that ended the wait: the supervisor keeps cloning waiting
    # children meanwhile, and a look a moment later may catch a new one's dir before
    # the child itself exists.
    give_up = time.monotonic() + 10.0
    while (remaining := left()) and time.monotonic() < give_up:
        time.sleep(0.02)
    assert remaining == [], [_describe(path, executor) for path in remaining]


def _describe(path: str, executor: LocalExecutor) -> str:
    """What a leftover is: its owner, some entries, the processes inside it."""
    try:
        st = os.lstat(path)
        entries = sorted(os.listdir(path))[:8] if os.path.isdir(path) else []
    except OSError as exc:
        return f"{path}: {exc}"
    inside = [pid for pid in (_pids()) if _cwd(pid).startswith(path)]
    waiting = {pid: (_cwd(pid), _uid(pid)) for pid in waiting_children(executor)}
    return (
        f"{path}: uid {st.st_uid}, entries {entries}, processes inside {inside}, "
        f"waiting children (cwd, uid) {waiting}"
    )


def _uid(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _empty_work_dir(path: str) -> bool:
    try:
        return os.path.basename(path).startswith(FALLBACK_PREFIX) and not os.listdir(path)
    except OSError:
        return False


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


# -- Other users and other interpreters --------------------------------------------------

SYSTEM_PYTHON = "/usr/bin/python3"
needs_a_system_python = pytest.mark.skipif(
    not ROOT or shutil.which("useradd") is None or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root (to create a user), useradd and a system python3",
)


@dataclass(frozen=True)
class ReadableCopy:
    """A world-readable copy of codepool (and msgpack) in ``base``/lib for Debian's own
    python3: the suite's interpreter lives under /root (mode 700), which neither another
    user nor, without a mount namespace, a snippet uid can read."""

    base: Path

    def run(
        self, *argv: str, user: pwd.struct_passwd | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``SYSTEM_PYTHON *argv`` in ``base``, as ``user`` (default: this process's)."""
        home = os.environ.get("HOME", "/") if user is None else user.pw_dir
        return subprocess.run(
            [SYSTEM_PYTHON, *argv],
            user=None if user is None else user.pw_uid,
            group=None if user is None else user.pw_gid,
            extra_groups=None if user is None else [],
            cwd=str(self.base),
            env={"PYTHONPATH": str(self.base / "lib"), "PATH": "/usr/bin:/bin", "HOME": home},
            capture_output=True,
            text=True,
            timeout=300,
        )

    def script(self, name: str, text: str) -> str:
        """Write a world-readable script into ``base``; returns its path."""
        path = self.base / name
        path.write_text(text)
        path.chmod(0o644)
        return str(path)


@pytest.fixture(scope="module")
def readable_codepool() -> Iterator[ReadableCopy]:
    """A world-readable copy of codepool for SYSTEM_PYTHON, removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="codepool-readable-"))
    try:
        tree = base / "lib"
        packages = (("common", codepool.common), ("worker", codepool.worker), ("ops", codepool.ops))
        for package, source in packages:
            shutil.copytree(source.__path__[0], tree / "codepool" / package)
        import msgpack

        shutil.copytree(Path(msgpack.__file__).parent, tree / "msgpack")
        base.chmod(0o755)
        subprocess.run(["chmod", "-R", "a+rX", str(tree)], check=True)
        yield ReadableCopy(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def throwaway_user() -> Iterator[pwd.struct_passwd]:
    """A non-root user with a home holding a 0600 secret (``~/secret``); the user, its
    home and every process it still runs are removed afterwards."""
    name = f"cptest{os.getpid() % 100000}"
    # Not under /tmp: there a snippet's own tmpfs would hide it whatever the executor did.
    home = Path("/home") / name
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/false", name],
        check=True,
        capture_output=True,
    )
    try:
        entry = pwd.getpwnam(name)
        home.mkdir(mode=0o700)
        (home / "secret").write_text("the worker user's secret")
        (home / "secret").chmod(0o600)
        for path in (home, home / "secret"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        yield entry
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


# -- Redis and worker processes (integration tests) ------------------------------------


@pytest.fixture(autouse=True)
def close_leftover_pools(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every CodePool a test opens (itself or through a RemoteSandbox) is closed when the
    test ends, so no pool's lease thread lives on in the test process; closing twice is
    fine. Pools of module fixtures are made before this runs and are theirs to close."""
    made: list[CodePool] = []
    original = CodePool.__init__

    def recording(pool: CodePool, *args: object, **kwargs: object) -> None:
        made.append(pool)
        original(pool, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CodePool, "__init__", recording)
    yield
    for pool in made:
        try:
            pool.close()
        except AttributeError:  # its __init__ failed part-way: nothing was started
            pass


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server on a free port for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server, emptied for this test."""
    if redis_server.process is None:  # a fault test stopped it
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@dataclass
class WorkerProcess:
    """A real ``codepool worker`` process started by a test."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return wait_or_kill(self.process, timeout_s)


StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def start_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Factory: start ``codepool worker`` processes; all are stopped at teardown."""
    started: list[WorkerProcess] = []

    def start(
        *args: str,
        concurrency: int | None = 2,
        name: str | None = None,
        env: dict[str, str] | None = None,
        url: str | None = redis_url,
        wait: bool = True,
        wrap: Sequence[str] = (),
    ) -> WorkerProcess:
        """``concurrency`` None: the worker's default; ``wrap``: a command that runs
        the worker's (``taskset -c 0``, say)."""
        name = name or f"w{len(started)}-{os.getpid()}"
        log_path = str(tmp_path / f"{name}-{len(started)}.log")
        command = [
            *wrap,
            sys.executable,
            "-m",
            "codepool.ops.cli",
            "worker",
            *(["-c", str(concurrency)] if concurrency is not None else []),
            "--preload",
            "",
            "--name",
            name,
            *args,
        ]
        if url is not None:
            command += ["--url", url]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
        worker = WorkerProcess(name, process, log_path)
        started.append(worker)
        if wait:
            wait_for_dispatchers(redis_url, name, worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def wait_for_dispatchers(
    url: str, name: str, worker: WorkerProcess, timeout_s: float = 30.0
) -> None:
    """Until every dispatcher of worker ``name`` is registered with RQ."""
    from rq import Worker

    client = redis.Redis.from_url(url)

    def registered() -> bool:
        names = [w.name for w in Worker.all(connection=client)]
        if sum(n.startswith(name + ".") for n in names) >= 2:
            return True
        if worker.process.poll() is not None:
            raise AssertionError(f"worker {name} exited")
        return False

    try:
        wait_until(registered, timeout_s, what=f"worker {name} ready")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{worker.log()}") from None
    finally:
        client.close()


def pytest_report_header() -> str:
    """Which server binary the suite's own Redis servers run (see ops/server_binary.py)."""
    try:
        return f"redis server: {find_server_binary().describe()}"
    except ConfigError as exc:
        return f"redis server: none ({exc})"
