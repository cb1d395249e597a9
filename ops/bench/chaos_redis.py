"""The Redis of a chaos run (ops/bench/chaos.py): one server with AOF, or (``--sentinel``) a
primary, a replica and three sentinels, so the run can restart, freeze and fail over
whichever server is the primary now."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from codepool.common.errors import ConfigError
from codepool.common.reaping import wait_or_kill
from codepool.ops.bench.netns import Fleet
from codepool.ops.redis_server import RedisServer, free_port
from codepool.ops.server_binary import find_server_binary

SERVICE = "chaos"
# Sentinel's failure detection: a primary silent this long is failed over (a freeze of
# 10 s is one).
DOWN_AFTER_MS = 3000
SETTLE_TIMEOUT_S = 60.0


@dataclass
class PlainRedis:
    """One redis-server with AOF ``everysec``."""

    server: RedisServer = field(default_factory=lambda: RedisServer(appendonly=True))

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> None:
        self.server.start()

    def primary(self) -> RedisServer:
        return self.server

    def direct_url(self) -> str:
        return self.server.url

    def close(self) -> None:
        self.server.close()


@dataclass
class SentinelRedis:
    """A primary and a replica (AOF each) and three sentinels that monitor them as
    ``SERVICE``; ``url`` is the ``redis+sentinel://`` URL codepool takes."""

    servers: list[RedisServer] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    dir: str = ""

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        binary = find_server_binary().path
        self.dir = tempfile.mkdtemp(prefix="codepool-chaos-sentinel-")
        primary = RedisServer(appendonly=True).start()
        replica = RedisServer(
            appendonly=True, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
        ).start()
        self.servers = [primary, replica]
        for number in range(3):
            port = free_port()
            config = os.path.join(self.dir, f"sentinel-{number}.conf")
            with open(config, "w") as f:
                f.write(
                    f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                    f"logfile {self.dir}/sentinel-{number}.log\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {SERVICE} 10000\n"
                )
            self.ports.append(port)
            self.processes.append(
                subprocess.Popen(
                    [binary, config, "--sentinel"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self.wait_settled()

    def _sentinel(self, number: int = 0) -> redis.Redis:
        return redis.Redis(port=self.ports[number], socket_timeout=2, socket_connect_timeout=2)

    def primary_port(self) -> int:
        for number in range(len(self.ports)):
            client = self._sentinel(number)
            try:
                address: tuple[str, int] = client.sentinel_get_master_addr_by_name(SERVICE)  # type: ignore[assignment]
                return int(address[1])
            except (redis.RedisError, TypeError):
                continue
            finally:
                client.close()
        raise ConfigError("no sentinel names a primary")

    def primary(self) -> RedisServer:
        port = self.primary_port()
        return next(server for server in self.servers if server.port == port)

    def direct_url(self) -> str:
        return self.primary().url

    def wait_settled(self, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Until every sentinel sees the others and a replica in sync with the primary:
        a failover can then be agreed."""
        deadline = time.monotonic() + timeout_s
        while not all(self._settled(number) for number in range(3)):
            if time.monotonic() > deadline:
                raise ConfigError(f"sentinels did not settle; logs in {self.dir}")
            time.sleep(0.2)

    def _settled(self, number: int) -> bool:
        client = self._sentinel(number)
        try:
            master: dict[str, Any] = client.sentinel_master(SERVICE)  # type: ignore[assignment]
            replicas: list[dict[str, Any]] = client.sentinel_slaves(SERVICE)
        except redis.RedisError:
            return False
        finally:
            client.close()
        return (
            not master["is_sdown"]
            and int(master["num-other-sentinels"]) == 2
            and any(not r["is_sdown"] and r.get("master-link-status") == "ok" for r in replicas)
        )

    def failover(self) -> str:
        """``SENTINEL FAILOVER`` and the wait for the new primary; what happened."""
        started = time.monotonic()
        try:
            self.wait_settled()
        except ConfigError as exc:
            return f"not settled, no failover: {exc}"
        old = self.primary_port()
        client = self._sentinel()
        try:
            client.sentinel_failover(SERVICE)
        except redis.RedisError as exc:
            return f"refused: {exc}"
        finally:
            client.close()
        while time.monotonic() - started < SETTLE_TIMEOUT_S:
            try:
                if self.primary_port() != old:
                    return f"{old} -> {self.primary_port()} in {time.monotonic() - started:.1f} s"
            except ConfigError:
                pass
            time.sleep(0.1)
        return f"no new primary after {SETTLE_TIMEOUT_S:.0f} s"

    def close(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            wait_or_kill(process)
        for server in self.servers:
            server.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class NetnsRedis:
    """The netns fleet's Redis (ops/bench/netns.py): in its hub namespace, without AOF, so
    it is frozen but never restarted; the hosts dial it over their veth links, the rest
    over its unix socket."""

    fleet: Fleet = field(default_factory=lambda: Fleet(hosts=1))

    @property
    def url(self) -> str:
        return self.fleet.redis_unix_url

    def start(self) -> None:
        self.fleet.__enter__()

    def pid(self) -> int:
        pid = self.fleet.redis_pid
        if pid is None:
            raise ConfigError("the netns fleet's Redis is not running")
        return pid

    def direct_url(self) -> str:
        return self.url

    def close(self) -> None:
        self.fleet.__exit__(None, None, None)
