"""Start and stop a private Redis server (whichever binary ``server_binary`` finds): for
tests, benchmarks and the embedded default of ``codepool replay``. Never touches a Redis
someone else runs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

from codepool.common.errors import ConfigError
from codepool.common.reaping import wait_or_kill
from codepool.common.socket_dirs import socket_bases
from codepool.ops.parent_death import die_with_parent
from codepool.ops.server_binary import ServerBinary, find_server_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A Redis server child process on a free port (or a unix socket) in a temp dir.

    appendonly: AOF with ``appendfsync everysec`` (for restart tests); else no persistence.
    unix_socket: listen on a socket file in the temp dir instead of TCP.
    binary: the server binary; default the first ``find_server_binary`` finds (raises
        ConfigError, saying what to install, when there is none).
    die_with_parent: the server is SIGKILLed when this process dies, however it dies
        (ops/parent_death.py): the embedded default's, never left behind.
    """

    appendonly: bool = False
    unix_socket: bool = False
    port: int = 0
    extra_args: list[str] = field(default_factory=list)
    binary: ServerBinary | None = None
    die_with_parent: bool = False
    process: subprocess.Popen[bytes] | None = None
    dir: str = ""

    @property
    def url(self) -> str:
        if self.unix_socket:
            return f"unix://{os.path.join(self.dir, 'redis.sock')}"
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def name(self) -> str:
        return os.path.basename(self.binary.path) if self.binary else "the Redis server"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        if self.binary is None:
            self.binary = find_server_binary()
        if not self.dir:
            # Short enough for the path of its Unix socket, whatever TMPDIR is.
            self.dir = tempfile.mkdtemp(prefix="codepool-redis-", dir=socket_bases()[0])
        if not self.port and not self.unix_socket:
            self.port = free_port()
        args = [
            self.binary.path,
            "--dir",
            self.dir,
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            os.path.join(self.dir, "redis.log"),
        ]
        if self.unix_socket:
            args += [
                "--port",
                "0",
                "--unixsocket",
                os.path.join(self.dir, "redis.sock"),
                "--unixsocketperm",
                "700",
            ]
        else:
            args += ["--port", str(self.port), "--bind", "127.0.0.1"]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        args += self.extra_args
        if self.die_with_parent:
            args = die_with_parent(args)
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    pass
                if self.process is not None and self.process.poll() is not None:
                    raise ConfigError(f"{self.name} exited: see {self.dir}/redis.log")
                if time.monotonic() > deadline:
                    raise ConfigError(f"{self.name} did not answer within {timeout_s} s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL with ``kill``); the data dir is kept for a restart."""
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        wait_or_kill(self.process)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()
