"""The chaos run's faults (ops/bench/chaos.py): a schedule drawn from the seed alone, so a
failing seed replays the same faults at the same offsets, and the injector that applies
each to the fleet (ops/bench/chaos_fleet.py) and logs it.

Kinds (each at least ``--minutes`` / 3 times, so every kind at least 10 times in 30 min):

- ``host_kill``: kill -9 of a host's whole tree; it is started again 1-3 s later under a
  new name (a new machine taking its place).
- ``host_same_name``: kill -9 of a host's tree and a start under the same name at once
  (a container or systemd restart).
- ``host_stop``: SIGSTOP of a host's tree for 2-12 s, then SIGCONT.
- ``dispatcher_kill`` / ``supervisor_kill`` / ``zygote_kill``: kill -9 of one such
  process of a host.
- ``redis_restart``: Redis stopped (SIGTERM; AOF ``everysec``) and started again on its
  port and data.
- ``redis_freeze``: SIGSTOP of Redis for 10 s, then SIGCONT.
- ``redis_failover`` (``--sentinel``): ``SENTINEL FAILOVER``, and the wait for the new
  primary. Under Sentinel the restart and the freeze act on the primary of the moment
  (a freeze outlasts the sentinels' 3-s failure detection: a failover of its own).
- ``link_cut`` (``--netns``): the host's veth link taken down for 2-12 s, then restored
  (ops/bench/netns.py; root only). There Redis lives in the hub namespace without AOF
  and ``redis_restart`` does nothing.
- ``producer_kill``: kill -9 of a producer process; another of its role takes its place.
- ``client_disconnect``: an HTTP client of ``codepool serve`` sends a call that sleeps 3 s
  and closes its connection 0.5 s later (the load's HTTP clients also give up).
"""

from __future__ import annotations

import json
import random
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from codepool.ops.bench.chaos_fleet import ChaosFleet, Host, signal_all
from codepool.ops.bench.chaos_redis import NetnsRedis, SentinelRedis
from codepool.ops.bench.process_tree import worker_role

KINDS = (
    "host_kill",
    "host_same_name",
    "host_stop",
    "dispatcher_kill",
    "supervisor_kill",
    "zygote_kill",
    "redis_restart",
    "redis_freeze",
    "producer_kill",
    "client_disconnect",
)
# Under --sentinel only.
SENTINEL_KINDS = ("redis_failover",)
# Under --netns only; there Redis has no AOF and is not restarted.
NETNS_KINDS = ("link_cut",)
REDIS_FREEZE_S = 10.0


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``at_s`` after the load started, of ``kind``, on host or
    producer number ``target``, held ``hold_s`` where it lasts, ``pick`` choosing among
    several processes of a kind."""

    at_s: float
    kind: str
    target: int
    hold_s: float
    pick: int


def plan(
    seed: int, minutes: float, interval_s: float, hosts: int, kinds: tuple[str, ...]
) -> list[Fault]:
    """The schedule: a fault every ``interval_s`` on average (jittered), kinds dealt from
    shuffled rounds of every kind so each comes equally often; from ``seed`` alone."""
    rng = random.Random(seed)
    count = max(len(kinds), int(minutes * 60 / interval_s))
    dealt: list[str] = []
    while len(dealt) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        dealt += round_
    faults = []
    for number, kind in enumerate(dealt):
        at_s = (number + 0.5 + rng.uniform(-0.4, 0.4)) * minutes * 60 / len(dealt)
        hold_s = REDIS_FREEZE_S if kind == "redis_freeze" else rng.uniform(2.0, 12.0)
        faults.append(
            Fault(
                round(at_s, 2), kind, rng.randrange(hosts), round(hold_s, 2), rng.randrange(1 << 16)
            )
        )
    return faults


class Injector:
    """Applies faults to ``fleet`` and appends each to ``log_path`` (and ``log``)."""

    def __init__(self, fleet: ChaosFleet, log_path: Path) -> None:
        self.fleet = fleet
        self.log_path = log_path
        self.log: list[dict[str, Any]] = []
        self._timers: list[threading.Timer] = []
        self._lock = threading.Lock()
        self._redis_thaws_at = 0.0  # a restart waits for a freeze to end

    def apply(self, fault: Fault) -> None:
        t = time.time()
        detail = getattr(self, f"_{fault.kind}")(fault)
        record = {"t": t, "kind": fault.kind, "at_s": fault.at_s, "target": fault.target}
        record["detail"] = detail
        if fault.kind in ("host_stop", "redis_freeze", "link_cut"):
            record["hold_s"] = fault.hold_s
        record["took_s"] = round(time.time() - t, 2)
        with self._lock:
            self.log.append(record)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def settle(self) -> None:
        """Every held fault released (SIGCONT of what is frozen) now."""
        for timer in self._timers:
            timer.cancel()
            timer.function(*timer.args)

    def _later(self, hold_s: float, release: Any, *args: Any) -> None:
        timer = threading.Timer(hold_s, release, args)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    # -- hosts ---------------------------------------------------------------------

    def _host(self, fault: Fault) -> Host:
        return self.fleet.hosts[fault.target % len(self.fleet.hosts)]

    def _kill_tree(self, host: Host) -> int:
        tree = host.tree()
        signal_all(tree, signal.SIGKILL)
        if host.process is not None:
            host.process.wait()
        return len(tree)

    def _host_kill(self, fault: Fault) -> str:
        with self.fleet.hosts_lock:
            return self._replace_host(fault)

    def _replace_host(self, fault: Fault) -> str:
        host = self._host(fault)
        old = host.name
        killed = self._kill_tree(host)
        time.sleep(1.0 + fault.hold_s % 2.0)
        host.name = f"h{host.index}r{host.starts}"
        self.fleet.start_host(host)
        return f"{old}: {killed} processes killed; started as {host.name}"

    def _host_same_name(self, fault: Fault) -> str:
        host = self._host(fault)
        with self.fleet.hosts_lock:
            killed = self._kill_tree(host)
            self.fleet.start_host(host)
        return f"{host.name}: {killed} processes killed; started again as {host.name}"

    def _host_stop(self, fault: Fault) -> str:
        host = self._host(fault)
        tree = host.tree()
        signal_all(tree, signal.SIGSTOP)
        self._later(fault.hold_s, signal_all, tree, signal.SIGCONT)
        return f"{host.name}: {len(tree)} processes stopped for {fault.hold_s} s"

    def _kill_role(self, fault: Fault, role: str) -> str:
        # A host still starting is left to start: a process of it killed then makes the
        # host exit (a finding of its own, docs/chaos.md), not the fault this one is.
        host = self._host(fault)
        waited_s = self.fleet.ready(host)
        pids = sorted(pid for pid in host.tree() if worker_role(pid) == role)
        if not pids:
            return f"{host.name}: no {role} to kill"
        pid = pids[fault.pick % len(pids)]
        signal_all([pid], signal.SIGKILL)
        return f"{host.name}: {role} {pid} killed (of {len(pids)}; waited {waited_s:.1f} s)"

    def _dispatcher_kill(self, fault: Fault) -> str:
        return self._kill_role(fault, "dispatcher")

    def _supervisor_kill(self, fault: Fault) -> str:
        return self._kill_role(fault, "supervisor")

    def _zygote_kill(self, fault: Fault) -> str:
        return self._kill_role(fault, "zygote")

    # -- Redis ---------------------------------------------------------------------

    def _redis_restart(self, fault: Fault) -> str:
        if isinstance(self.fleet.store, NetnsRedis):
            return "not under --netns (its Redis has no AOF): nothing done"
        time.sleep(max(0.0, self._redis_thaws_at - time.monotonic()))
        started = time.monotonic()
        server = self.fleet.store.primary()
        server.stop()
        server.start()
        return f"down {time.monotonic() - started:.2f} s"

    def _redis_freeze(self, fault: Fault) -> str:
        pid = self.fleet.redis_pid
        signal_all([pid], signal.SIGSTOP)
        self._redis_thaws_at = time.monotonic() + fault.hold_s + 0.1
        self._later(fault.hold_s, signal_all, [pid], signal.SIGCONT)
        return f"frozen for {fault.hold_s} s"

    def _redis_failover(self, fault: Fault) -> str:
        if not isinstance(self.fleet.store, SentinelRedis):
            return "no Sentinel (--sentinel): nothing done"
        time.sleep(max(0.0, self._redis_thaws_at - time.monotonic()))
        return self.fleet.store.failover()

    def _link_cut(self, fault: Fault) -> str:
        if not isinstance(self.fleet.store, NetnsRedis):
            return "no netns fleet (--netns): nothing done"
        host = self._host(fault)
        netns = self.fleet.store.fleet
        netns.cut_link(host.index)
        self._later(fault.hold_s, netns.restore_link, host.index)
        return f"{host.name}: link cut for {fault.hold_s} s"

    # -- producers and clients -----------------------------------------------------

    def _producer_kill(self, fault: Fault) -> str:
        return self.fleet.kill_producer(fault.pick)

    def _client_disconnect(self, fault: Fault) -> str:
        where = urlsplit(self.fleet.serve_url)
        body = json.dumps(
            {"code": "import time\ntime.sleep(3)\nprint(1)", "language": "python"}
        ).encode()
        head = (
            f"POST /run_code HTTP/1.1\r\nHost: {where.hostname}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            with socket.create_connection((where.hostname, where.port), timeout=5) as client:
                client.sendall(head + body)
                time.sleep(0.5)
        except OSError as exc:
            return f"could not reach serve: {exc}"
        return "sent a 3-s call, left after 0.5 s"
