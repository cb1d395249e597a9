"""``codepool doctor``: one line per protection, active or why not."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from codepool.worker import LocalExecutor

# Probes run inside a real snippet, so the report is what a snippet actually meets.
# Network probes dial listeners doctor itself opens on the host ({port}, {abstract}), so
# an offline host cannot pass them by accident.
PROBES: list[tuple[str, str, str]] = [
    (
        "probe: network",
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 1)"
        "\n    print('reachable')\nexcept OSError:\n    print('unreachable')",
        "unreachable",
    ),
    (
        "probe: abstract socket",
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({abstract!r})"
        "\n    print('reachable')\nexcept OSError:\n    print('unreachable')",
        "unreachable",
    ),
    (
        "probe: host files",
        "try:\n    open('/etc/hostname').read()\n    print('readable')\n"
        "except OSError:\n    print('hidden')",
        "hidden",
    ),
    ("probe: parent", "import os\nprint('hidden' if os.getppid() == 0 else 'visible')", "hidden"),
    (
        "probe: uid",
        "import os\nprint('unprivileged' if os.getuid() != 0 else 'root')",
        "unprivileged",
    ),
    (
        "probe: secrets",
        "import os\nprint('clean' if not any(k.startswith(('REDIS', 'AWS', "
        "'CODEPOOL')) for k in os.environ) else 'leaked')",
        "clean",
    ),
]


def diagnose(mode: str = "fork", preload: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Start an executor, collect the zygote's report and run the probes."""
    lines: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        tcp = stack.enter_context(socket.socket())
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        unix = stack.enter_context(socket.socket(socket.AF_UNIX))
        abstract = f"\0codepool-doctor-{os.getpid()}"
        unix.bind(abstract)
        unix.listen()
        values = {"port": tcp.getsockname()[1], "abstract": abstract}
        executor = stack.enter_context(LocalExecutor(concurrency=1, mode=mode, preload=preload))
        lines.extend(executor.report)
        for name, code, expected in PROBES:
            result = executor.run(code.format(**values), timeout_s=10.0)
            seen = result.stdout.strip() or f"{result.status}: {result.stderr.strip()[-200:]}"
            lines.append({"name": name, "active": seen == expected, "detail": seen})
    return lines


def format_lines(lines: list[dict[str, Any]]) -> str:
    width = max(len(str(line["name"])) for line in lines)
    return "\n".join(
        f"[{'ok' if line['active'] else '!!'}] {str(line['name']).ljust(width)}  {line['detail']}"
        for line in lines
    )


def main(mode: str, preload: tuple[str, ...], url: str | None = None) -> int:
    """Print the executor's protections and, with ``url``, the Redis checks."""
    lines = diagnose(mode, preload)
    if url:
        from codepool.ops.redis_checks import check_redis

        lines += check_redis(url)
    print(format_lines(lines))
    missing = [line["name"] for line in lines if not line["active"]]
    if missing:
        print(f"\n{len(missing)} check(s) not passed: {', '.join(map(str, missing))}")
        return 1
    print("\nall protections active" + (" and Redis set up as codepool needs" if url else ""))
    return 0
