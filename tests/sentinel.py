"""Test scaffolding: a primary, a replica and three sentinels on free ports, each a
private redis-server in a temp dir (sentinel mode needs a config file it can rewrite).
Fast failure detection (``down_after_ms``), so a failover takes a second or two."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

import redis

from codepool.common.reaping import wait_or_kill
from codepool.ops.redis_server import RedisServer, free_port
from codepool.ops.server_binary import find_server_binary
from tests.conftest import poll_until, wait_until

SERVICE = "mymaster"


def sentinel_mode_error() -> str | None:
    """Why the server binary cannot run as a sentinel here; None when it can (it starts
    one on a free port and waits for its PING)."""
    try:
        binary = find_server_binary().path
    except Exception as exc:
        return str(exc)
    workdir = tempfile.mkdtemp(prefix="codepool-sentinel-probe-")
    port = free_port()
    config = os.path.join(workdir, "sentinel.conf")
    with open(config, "w") as f:
        f.write(f"port {port}\nbind 127.0.0.1\ndir {workdir}\n")
    process = subprocess.Popen(
        [binary, config, "--sentinel"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
    try:

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return process.poll() is not None  # exited: no sense waiting on

        if poll_until(answers, 10) and process.poll() is None:
            return None
        return f"{binary} does not run in sentinel mode (--sentinel)"
    finally:
        client.close()
        process.terminate()
        wait_or_kill(process)
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Sentinels:
    """Primary + replica + three sentinels monitoring them as ``SERVICE``."""

    down_after_ms: int = 1000
    failover_timeout_ms: int = 3000
    servers: list[RedisServer] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    dir: str = ""

    @property
    def url(self) -> str:
        """The Sentinel URL codepool takes (``redis+sentinel://h:p,h:p,h:p/service/db``)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> Sentinels:
        binary = find_server_binary().path
        self.dir = tempfile.mkdtemp(prefix="codepool-sentinel-")
        primary = RedisServer().start()
        self.servers.append(primary)
        replica = RedisServer(
            extra_args=[
                "--replicaof",
                "127.0.0.1",
                str(primary.port),
                # DEBUG SLEEP holds the replica back, so a test can make writes it lacks.
                "--enable-debug-command",
                "yes",
            ]
        )
        self.servers.append(replica.start())
        for number in range(3):
            port = free_port()
            config = os.path.join(self.dir, f"sentinel-{number}.conf")
            with open(config, "w") as f:
                f.write(
                    f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                    f"logfile {self.dir}/sentinel-{number}.log\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
                    f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n"
                )
            self.sentinel_ports.append(port)
            self.processes.append(
                subprocess.Popen(
                    [binary, config, "--sentinel"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self.wait_settled(primary.port)
        return self

    def sentinel(self, number: int = 0) -> redis.Redis:
        return redis.Redis(port=self.sentinel_ports[number], socket_timeout=2)

    def primary_port(self) -> int:
        client = self.sentinel()
        try:
            return int(client.sentinel_get_master_addr_by_name(SERVICE)[1])
        finally:
            client.close()

    def server_on(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    def wait_settled(self, primary_port: int, timeout_s: float = 30.0) -> None:
        """Until every sentinel names ``primary_port`` the primary, sees the other two
        sentinels and a replica in sync: a failover can then be agreed and done."""
        wait_until(
            lambda: all(self._settled(number, primary_port) for number in range(3)),
            timeout_s,
            f"sentinels settled; logs in {self.dir}",
        )

    def _settled(self, number: int, primary_port: int) -> bool:
        client = self.sentinel(number)
        try:
            master = client.sentinel_master(SERVICE)
            replicas = client.sentinel_slaves(SERVICE)
        except redis.RedisError:
            return False
        finally:
            client.close()
        return (
            int(master["port"]) == primary_port
            and not master["is_sdown"]
            and int(master["num-other-sentinels"]) == 2
            and any(not r["is_sdown"] and r.get("master-link-status") == "ok" for r in replicas)
        )

    def wait_new_primary(self, old_port: int, timeout_s: float = 60.0) -> int:
        """Until a sentinel names another primary than ``old_port`` and it answers as
        one; its port."""
        found: list[int] = []

        def elected() -> bool:
            try:
                port = self.primary_port()
            except redis.RedisError:
                return False
            if port == old_port:
                return False
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                if client.info("replication")["role"] == "master":
                    found.append(port)
                    return True
            except redis.RedisError:
                pass
            finally:
                client.close()
            return False

        wait_until(elected, timeout_s, f"a new primary; logs in {self.dir}")
        return found[-1]

    def close(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            wait_or_kill(process)
        for server in self.servers:
            server.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Sentinels:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
