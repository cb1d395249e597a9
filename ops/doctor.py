"""``codepool doctor``: one line per protection, active or why not."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from codepool.common.errors import ConfigError, ExecutorError
from codepool.common.host_cpus import host_cpus
from codepool.ops.check_lines import format_lines
from codepool.ops.server_binary import find_server_binary
from codepool.worker import LocalExecutor

# Probes run inside a real snippet, so the report is what a snippet actually meets.
# Network probes dial listeners doctor itself opens on the host ({port}, {udp_port},
# {abstract}), so an offline host cannot pass them by accident.
PROBES: list[tuple[str, str, str]] = [
    (
        "probe: network",
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 1)"
        "\n    print('reachable')\nexcept OSError:\n    print('unreachable')",
        "unreachable",
    ),
    (
        "probe: udp",
        "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto("
        "b'x', ('127.0.0.1', {udp_port}))\n    print('sent')\nexcept OSError:\n"
        "    print('unreachable')",
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


@dataclass(frozen=True)
class HostListeners:
    """Sockets on the host that no snippet may reach: where they listen, and the UDP
    socket itself (a datagram leaves no connection to refuse; look for it instead)."""

    tcp_port: int
    udp_port: int
    abstract: str
    udp: socket.socket

    def datagram_arrived(self) -> bool:
        self.udp.setblocking(False)
        try:
            self.udp.recv(64)
            return True
        except BlockingIOError:
            return False


@contextlib.contextmanager
def host_listeners() -> Iterator[HostListeners]:
    """A TCP listener, a UDP socket and an abstract unix listener on this host."""
    with contextlib.ExitStack() as stack:
        tcp = stack.enter_context(socket.socket())
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        udp.bind(("127.0.0.1", 0))
        unix = stack.enter_context(socket.socket(socket.AF_UNIX))
        abstract = f"\0codepool-listener-{os.getpid()}-{id(unix)}"
        unix.bind(abstract)
        unix.listen()
        yield HostListeners(tcp.getsockname()[1], udp.getsockname()[1], abstract, udp)


def diagnose(
    mode: str = "fork",
    preload: tuple[str, ...] = (),
    *,
    allow_weak_isolation: bool = False,
    namespaces: bool = True,
    landlock: bool = True,
) -> list[dict[str, Any]]:
    """Start an executor, collect the zygote's report and run the probes. Raises
    ExecutorError where isolation is too weak to run snippets (unless allowed).
    ``namespaces``/``landlock`` off: what the probes see without those layers."""
    lines: list[dict[str, Any]] = []
    with host_listeners() as host:
        values = {"port": host.tcp_port, "udp_port": host.udp_port, "abstract": host.abstract}
        with LocalExecutor(
            concurrency=1,
            mode=mode,
            preload=preload,
            allow_weak_isolation=allow_weak_isolation,
            namespaces=namespaces,
            landlock=landlock,
        ) as executor:
            lines.extend(executor.report)
            for name, code, expected in PROBES:
                result = executor.run(code.format(**values), timeout_s=10.0)
                seen = result.stdout.strip() or f"{result.status}: {result.stderr.strip()[-200:]}"
                if name == "probe: udp" and host.datagram_arrived():
                    seen = "a datagram reached the host"
                lines.append({"name": name, "active": seen == expected, "detail": seen})
    return lines


def environment(lines: list[dict[str, Any]], *, root: bool) -> tuple[str, set[str]]:
    """The environment the report shows, and the protections it cannot give at all."""
    active = {str(line["name"]): bool(line["active"]) for line in lines}
    if active.get("processes"):
        if root:
            return "root host with namespaces", set()
        return "rootless host with user namespaces", {"uid"}
    cannot = {"namespaces", "user namespace", "network", "filesystem", "processes", "ipc"}
    cannot.add("interpreter paths")  # only preloaded modules import where a parent is 0700
    if root:
        return "root without namespaces (e.g. a container without CAP_SYS_ADMIN)", cannot
    return (
        "non-root without namespaces (e.g. a rootless container)",
        cannot | {"uid", "shared memory"},  # one uid for all: only names keep them apart
    )


def embedded_server() -> str:
    """Which server binary the embedded default would run, or why there is none (a
    note: worker hosts need none, they point --url at a real Redis)."""
    try:
        return f"embedded Redis: {find_server_binary().describe()}"
    except ConfigError as exc:
        return f"embedded Redis: none; {exc}"


def main(
    mode: str,
    preload: tuple[str, ...],
    url: str | None = None,
    *,
    allow_weak_isolation: bool = False,
) -> int:
    """Print the environment, the executor's protections and, with ``url``, the Redis
    checks. Exits 0 when everything this environment can give is active; what it cannot
    give is shown as ``[--]``, a warning."""
    try:
        lines = diagnose(mode, preload, allow_weak_isolation=allow_weak_isolation)
    except ExecutorError as exc:
        print(f"[!!] isolation  {exc}")
        return 1
    name, cannot = environment(lines, root=os.geteuid() == 0)
    if url:
        from codepool.ops.redis_checks import check_redis

        lines += check_redis(url)
    print(f"environment: {name}")
    print(embedded_server())
    print(f"slots: {host_cpus().describe()}")
    print(format_lines(lines, cannot))
    missing = [line["name"] for line in lines if not line["active"] and line["name"] not in cannot]
    if missing:
        print(f"\n{len(missing)} check(s) not passed: {', '.join(map(str, missing))}")
        return 1
    unavailable = [line["name"] for line in lines if not line["active"]]
    if unavailable:
        print(
            f"\nall protections this environment can give are active; not available here: "
            f"{', '.join(map(str, unavailable))}"
        )
    else:
        print("\nall protections active" + (" and Redis set up as codepool needs" if url else ""))
    return 0
