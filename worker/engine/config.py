"""How the executor configures its supervisor and zygote: JSON on their stdin (a pipe),
never on a command line, which every local user can read."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field

# Work dirs the supervisor makes itself when the host allows no mount namespace.
FALLBACK_PREFIX = "codepool-snippet-"


@dataclass
class ZygoteConfig:
    """Executor settings for its supervisor and zygote."""

    mode: str = "fork"
    concurrency: int = 2
    preload: list[str] = field(default_factory=list)
    uid_base: int | None = None
    disk_mb: int = 64
    env: dict[str, str] = field(default_factory=dict)
    namespaces: bool = True
    landlock: bool = True  # the second layer; off only to measure what it costs
    light_zygote: bool = True  # fork mode: plain snippets fork from a zygote without preload
    native_child: bool = True  # the clone loop and child set-up in C, where it was built
    bare: bool = False  # this zygote execs the bare image once prepared (see bare.py)
    max_contexts: int = 64  # interpreter contexts alive at once (context_host.py)
    context_ttl_s: float = 300.0  # an idle context is ended after this many seconds
    owner_fd: int = -1
    listen_fd: int = -1  # optional: more clients (the worker's dispatchers) connect here

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ZygoteConfig:
        return cls(**json.loads(text))


def send_config(process: subprocess.Popen[bytes], config: ZygoteConfig) -> None:
    """Hand ``config`` to a just-started supervisor or zygote on its stdin pipe."""
    assert process.stdin is not None
    try:
        process.stdin.write(config.to_json().encode())
        process.stdin.close()
    except BrokenPipeError:
        pass  # it died at once; whoever waits for its hello will say so


def enter(role: str) -> tuple[ZygoteConfig, socket.socket]:
    """Start of a supervisor's or zygote's main: quiet logging, Ctrl-C left to the
    owner, SIGTERM a clean exit, the config from stdin (stdin is then /dev/null, so
    nothing started later inherits the pipe) and the socket to its owner."""
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {role} %(message)s")
    config = ZygoteConfig.from_json(sys.stdin.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return config, socket.socket(fileno=config.owner_fd)
