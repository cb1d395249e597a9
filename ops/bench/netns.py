"""Several worker hosts on one machine, each in a network namespace of its own, wired to one
private redis-server over veth pairs: so a test or a benchmark can kill, freeze or cut the
link of one host while the others go on, as on a real cluster.
It ships with the benches for ops/bench/fleet.py (root only); the tests borrow it.

A hub namespace runs redis-server; host i is joined to it by a veth pair on 10.250.i.0/30
(hub end .1, host end .2). The addresses exist only inside namespaces a `Fleet` created and
nothing routes out of them, so nothing else on the machine sees them.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType

import redis

from codepool.common.errors import CodepoolError, ConfigError
from codepool.common.reaping import wait_or_kill
from codepool.ops.bench.process_tree import descendants, process_state
from codepool.ops.server_binary import find_server_binary

log = logging.getLogger(__name__)

REDIS_PORT = 6379  # the hub namespace is private: the usual port cannot clash
# Links are created directly inside our own namespaces, so their names cannot collide with
# anyone's: hub end ``veth{i}``, host end HOST_SIDE (both far below the 15-character limit).
HOST_SIDE = "uplink"


class NetnsError(CodepoolError):
    """Raised when an ``ip`` command that builds, changes or removes a fleet fails."""


def _ip(*args: str) -> str:
    """Run ``ip ARGS`` and return its stdout; NetnsError with its stderr if it fails."""
    argv = ["ip", *args]
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        raise NetnsError(f"`{' '.join(argv)}` failed ({e.returncode}): {e.stderr.strip()}") from e
    except OSError as e:
        raise NetnsError(f"`{' '.join(argv)}` could not run: {e}") from e


def _unique_prefix() -> str:
    # The random part keeps apart two fleets of one process and a crashed run's leftovers.
    return f"cp{os.getpid() % 100000}-{secrets.token_hex(2)}"


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _poll(check: Callable[[], str | None], timeout_s: float, what: str) -> None:
    """Call ``check`` until it returns None (done); NetnsError with its last complaint
    after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while (problem := check()) is not None:
        if time.monotonic() > deadline:
            raise NetnsError(f"{what} not within {timeout_s} s: {problem}")
        time.sleep(0.01)


def netns_available() -> str | None:
    """None if this process can create network namespaces and veth pairs, else a one-line
    reason (for ``pytest.skip``). It tries for real: root is not enough in a container
    without CAP_SYS_ADMIN, without veth support, or with a read-only /run."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` binary (iproute2)"
    probe = f"{_unique_prefix()}-probe"
    try:
        _ip("netns", "add", probe)
    except NetnsError as e:
        return str(e)
    try:
        _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
        return None
    except NetnsError as e:
        return str(e)
    finally:
        subprocess.run(["ip", "netns", "delete", probe], capture_output=True)


@dataclass(kw_only=True)
class Fleet:
    """A hub namespace running a private redis-server plus ``hosts`` host namespaces
    (indices 0 .. hosts-1), each linked to the hub by a veth pair of its own.

    A context manager: leaving it, or a failure half way into it, stops the workers and the
    redis-server it started and deletes the namespaces it created, and nothing else.

    hosts: number of host namespaces, 1..256.
    start_timeout_s: seconds redis-server may take to answer PING.
    stop_timeout_s: seconds a worker (after SIGTERM) or redis-server may take to exit
        before its whole process tree is SIGKILLed.
    """

    hosts: int = 2
    start_timeout_s: float = 10.0
    stop_timeout_s: float = 10.0
    prefix: str = field(init=False, default_factory=_unique_prefix)
    _dir: str = field(init=False, default="")
    _namespaces: list[str] = field(init=False, default_factory=list)
    _links: list[int] = field(init=False, default_factory=list)
    _redis: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _workers: dict[int, subprocess.Popen[bytes]] = field(init=False, default_factory=dict)
    _started: list[tuple[int, subprocess.Popen[bytes]]] = field(init=False, default_factory=list)

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def namespace(self, host_index: int) -> str:
        """Name of host ``host_index``'s network namespace."""
        if not 0 <= host_index < self.hosts:
            raise IndexError(f"host {host_index} not in 0..{self.hosts - 1}")
        return f"{self.prefix}-h{host_index}"

    @property
    def namespaces(self) -> list[str]:
        """The namespaces this fleet created and has not deleted (yet)."""
        return list(self._namespaces)

    @property
    def redis_unix_url(self) -> str:
        """Redis for processes outside the fleet: a unix socket is found by its path, and
        paths do not depend on the network namespace."""
        return f"unix://{os.path.join(self._dir, 'redis.sock')}"

    @property
    def redis_pid(self) -> int | None:
        return None if self._redis is None else self._redis.pid

    def redis_url_for(self, host_index: int) -> str:
        """The Redis URL a process inside host ``host_index``'s namespace dials."""
        self.namespace(host_index)
        return f"redis://10.250.{host_index}.1:{REDIS_PORT}/0"

    def exec_argv(self, host_index: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``host_index``'s namespace. ``ip netns exec`` execs it,
        so a Popen of the result has the pid of ``argv[0]`` itself."""
        return ["ip", "netns", "exec", self.namespace(host_index), *argv]

    def __enter__(self) -> Fleet:
        if self._dir:
            raise ConfigError("a Fleet can be entered only once")
        if not 1 <= self.hosts <= 256:
            raise ConfigError(f"hosts must be in 1..256, got {self.hosts}")
        try:
            self._build()
        except BaseException:
            self._teardown(raise_errors=False)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # With an exception in flight a teardown problem is only logged: it must not hide it.
        self._teardown(raise_errors=exc_type is None)

    def start_worker(
        self,
        host_index: int,
        *args: str,
        name: str,
        log_path: str | os.PathLike[str],
        concurrency: int = 2,
    ) -> subprocess.Popen[bytes]:
        """Start ``codepool worker`` in host ``host_index``'s namespace, dialing Redis over
        its veth, stdout and stderr appended to ``log_path``. ``args`` come last, so they
        can override the defaults (``"--preload", "numpy"``). The Popen's pid is the worker
        host process itself; it runs in a session of its own so a Ctrl-C meant for the
        caller does not reach it."""
        previous = self._workers.get(host_index)
        if previous is not None and previous.poll() is None:
            raise ConfigError(f"host {host_index} already runs worker pid {previous.pid}")
        argv = [sys.executable, "-m", "codepool.ops.cli", "worker"]
        argv += ["--url", self.redis_url_for(host_index), "-c", str(concurrency)]
        argv += ["--preload", "", "--name", name, *args]
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                self.exec_argv(host_index, argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._workers[host_index] = process
        self._started.append((host_index, process))
        return process

    def stop_worker(self, host_index: int) -> None:
        """Stop the host's worker as its service manager would (SIGTERM: it finishes what
        it runs and leaves the fleet), killing what is left after ``stop_timeout_s``."""
        worker = self._workers.get(host_index)
        if worker is not None:
            self._stop_worker(worker, self.namespace(host_index))

    def host_pids(self, host_index: int) -> list[int]:
        """The worker's pid and every process below it, plus whatever else runs in the
        host's namespace (an orphan whose parent died is no longer below the worker)."""
        worker = self._workers.get(host_index)
        roots = [] if worker is None or worker.poll() is not None else [worker.pid]
        return self._tree(self.namespace(host_index), roots)

    def freeze_host(self, host_index: int) -> list[int]:
        """SIGSTOP every process of the host (a hung machine) and wait until all of them
        are stopped (a signal takes effect only when its target is next scheduled); the
        pids stopped."""
        pids = self._stop_tree(partial(self.host_pids, host_index))
        self._await_states(pids, ("T", "t", "Z", "X", None), f"host {host_index} stopped")
        return pids

    def thaw_host(self, host_index: int) -> None:
        """SIGCONT every process of the host."""
        _signal_all(self.host_pids(host_index), signal.SIGCONT)

    def kill_host(self, host_index: int) -> list[int]:
        """SIGKILL every process of the host at once (a power cut) and reap the worker; the
        pids killed. All are stopped first, so none can fork or clean up in between."""
        pids = self.freeze_host(host_index)
        _signal_all(pids, signal.SIGKILL)
        worker = self._workers.get(host_index)
        if worker is not None:
            worker.wait()
        self._await_states(pids, ("Z", "X", None), f"host {host_index} dead")
        return pids

    def cut_link(self, host_index: int) -> None:
        """Take the hub end of the host's veth down: packets vanish, no RST, no FIN."""
        _ip("-n", self.hub, "link", "set", f"veth{host_index}", "down")

    def restore_link(self, host_index: int, timeout_s: float = 5.0) -> None:
        """Bring the link up again and wait until both ends have carrier and the hub routes
        the host's address over it again (the kernel drops that route while it is down).
        Both ends forget the neighbours they failed to reach meanwhile: an address
        resolution still pending from the cut would fail the next connection with "No
        route to host" after the link is back."""
        hub_side, ns = f"veth{host_index}", self.namespace(host_index)
        _ip("-n", self.hub, "link", "set", hub_side, "up")
        _ip("-n", self.hub, "neigh", "flush", "dev", hub_side)
        _ip("-n", ns, "neigh", "flush", "dev", HOST_SIDE)

        def healed() -> str | None:
            try:
                if "LOWER_UP" not in _ip("-n", self.hub, "-o", "link", "show", hub_side):
                    return f"no carrier on {hub_side}"
                if "LOWER_UP" not in _ip("-n", ns, "-o", "link", "show", HOST_SIDE):
                    return f"no carrier on {HOST_SIDE}"
                route = _ip("-n", self.hub, "route", "get", f"10.250.{host_index}.2")
                return None if f"dev {hub_side} " in route else f"route is {route.strip()}"
            except NetnsError as e:
                return str(e)

        _poll(healed, timeout_s, f"link to host {host_index} back up")

    def _build(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="codepool-fleet-")
        self._add_namespace(self.hub)
        for i in range(self.hosts):
            ns, hub_side = self.namespace(i), f"veth{i}"
            self._add_namespace(ns)
            # Born inside the hub with its peer inside the host: never in the root namespace.
            peer = ["peer", "name", HOST_SIDE, "netns", ns]
            _ip("-n", self.hub, "link", "add", hub_side, "type", "veth", *peer)
            self._links.append(i)
            _ip("-n", self.hub, "addr", "add", f"10.250.{i}.1/30", "dev", hub_side)
            _ip("-n", ns, "addr", "add", f"10.250.{i}.2/30", "dev", HOST_SIDE)
            _ip("-n", self.hub, "link", "set", hub_side, "up")
            _ip("-n", ns, "link", "set", HOST_SIDE, "up")
        self._start_redis()

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._namespaces.append(ns)  # only now is it ours to delete
        _ip("-n", ns, "link", "set", "lo", "up")

    def _start_redis(self) -> None:
        binary = find_server_binary().path
        argv = ["ip", "netns", "exec", self.hub, binary, "--port", str(REDIS_PORT)]
        argv += ["--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]
        argv += ["--dir", self._dir, "--unixsocket", os.path.join(self._dir, "redis.sock")]
        argv += ["--unixsocketperm", "700", "--daemonize", "no"]
        log_path = os.path.join(self._dir, "redis.log")
        with open(log_path, "ab") as out:
            server = self._redis = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def answers() -> str | None:
            if server.poll() is not None:
                with open(log_path, errors="replace") as f:
                    raise NetnsError(
                        f"redis-server exited ({server.returncode}): {f.read()[-2000:]}"
                    )
            try:
                return None if client.ping() else "no PONG"
            except redis.RedisError as e:  # the socket file may not exist yet
                return str(e)

        with redis.Redis.from_url(self.redis_unix_url, socket_connect_timeout=1.0) as client:
            _poll(answers, self.start_timeout_s, "redis-server answering PING")

    def _tree(self, ns: str, roots: list[int]) -> list[int]:
        members = dict.fromkeys(roots)
        if ns in self._namespaces:
            members.update(dict.fromkeys(int(p) for p in _ip("netns", "pids", ns).split()))
        for pid in list(members):
            members.update(dict.fromkeys(descendants(pid)))
        return list(members)

    def _stop_tree(self, pids_now: Callable[[], list[int]]) -> list[int]:
        """SIGSTOP until no new pid shows up: a stopped process cannot fork, so the list
        is then complete (the kernel restarts a fork that a signal interrupts)."""
        stopped: dict[int, None] = {}
        while new := [pid for pid in pids_now() if pid not in stopped]:
            _signal_all(new, signal.SIGSTOP)
            stopped.update(dict.fromkeys(new))
        return list(stopped)

    def _await_states(self, pids: list[int], states: tuple[str | None, ...], what: str) -> None:
        def reached() -> str | None:
            behind = [pid for pid in pids if process_state(pid) not in states]
            return f"pids {behind} not yet" if behind else None

        _poll(reached, self.stop_timeout_s, what)

    def _kill_tree(self, ns: str, roots: list[int]) -> None:
        pids = self._stop_tree(partial(self._tree, ns, roots))
        _signal_all(pids, signal.SIGKILL)
        self._await_states(pids, ("Z", "X", None), f"processes in {ns} dead")

    def _stop_worker(self, process: subprocess.Popen[bytes], ns: str) -> None:
        if process.poll() is not None:
            return
        # Thaw a frozen host first: SIGTERM is to reach a running host, as in production.
        _signal_all(self._tree(ns, [process.pid]), signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("worker pid %s ignored SIGTERM for %s s", process.pid, self.stop_timeout_s)
            self._kill_tree(ns, [process.pid])
            process.wait()

    def _stop_redis(self, process: subprocess.Popen[bytes]) -> None:
        process.terminate()
        wait_or_kill(process, timeout_s=self.stop_timeout_s)

    def _delete_link(self, host_index: int) -> None:
        # Deleting one end deletes both, at once; deleting just the namespaces would leave
        # the pair to the kernel's asynchronous namespace cleanup.
        _ip("-n", self.hub, "link", "del", f"veth{host_index}")
        self._links.remove(host_index)

    def _delete_namespace(self, ns: str) -> None:
        _ip("netns", "delete", ns)
        self._namespaces.remove(ns)

    def _teardown(self, *, raise_errors: bool) -> None:
        """Undo whatever part of ``_build`` and ``start_worker`` happened, trying every step
        even if an earlier one failed. Whatever still runs in our namespaces is ours (nobody
        else knows their names), so it is killed before they are deleted."""
        steps: list[tuple[str, Callable[[], object]]] = [
            (f"stop worker {p.pid}", partial(self._stop_worker, p, self.namespace(i)))
            for i, p in self._started
        ]
        if self._redis is not None:
            steps.append(("stop redis-server", partial(self._stop_redis, self._redis)))
        steps += [(f"kill in {ns}", partial(self._kill_tree, ns, [])) for ns in self._namespaces]
        steps += [(f"delete veth{i}", partial(self._delete_link, i)) for i in self._links]
        steps += [
            (f"delete {ns}", partial(self._delete_namespace, ns)) for ns in self._namespaces[::-1]
        ]
        if os.path.isdir(self._dir):
            steps.append((f"remove {self._dir}", partial(shutil.rmtree, self._dir)))
        errors = []
        for what, step in steps:
            try:
                step()
            except Exception as e:
                errors.append(f"{what}: {e}")
        if errors:
            message = "fleet teardown incomplete: " + "; ".join(errors)
            if raise_errors:
                raise NetnsError(message)
            log.error("%s", message)
