"""How the executor configures its supervisor and zygote (JSON on their command line)."""

from __future__ import annotations

import json
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
    owner_fd: int = -1
    listen_fd: int = -1  # optional: more clients (the worker's dispatchers) connect here

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ZygoteConfig:
        return cls(**json.loads(text))
