"""Redis URLs: the plain forms redis-py takes (``redis://``, ``rediss://``, ``unix://``)
and a Sentinel-managed primary:

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]

``host:port`` pairs are the sentinels (port 26379 when left out); ``service_name`` is the
name the sentinels monitor the primary under (``sentinel monitor <name> ...``); user and
password are the primary's (and its replicas'), not the sentinels'. ``sentinel://`` is
taken as the same. Query options: ``sentinel_password=`` for sentinels that require
one (``requirepass`` in sentinel.conf), ``sentinel_username=`` with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from codepool.common.errors import ConfigError

SENTINEL_SCHEMES = ("redis+sentinel", "sentinel")
DEFAULT_SENTINEL_PORT = 26379
SENTINEL_FORM = "redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]"


@dataclass(frozen=True)
class SentinelAddress:
    """Where the sentinels are and which primary of theirs to use."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The parts of a ``redis+sentinel://`` URL; ConfigError saying what is wrong (the
    password never in the message)."""
    shown = redact(url)
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in SENTINEL_SCHEMES or not rest:
        raise ConfigError(f"{shown} is not a Sentinel URL; expected {SENTINEL_FORM}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    credentials, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_host_port(part, shown) for part in hosts.split(","))
    segments = [unquote(s) for s in path.split("/") if s]
    if not segments or len(segments) > 2:
        raise ConfigError(f"{shown}: name the service, {SENTINEL_FORM}")
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ConfigError(f"{shown}: the db must be a number, {SENTINEL_FORM}")
        db = int(segments[1])
    options = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    if "db" in options:
        if not options["db"].isdigit():
            raise ConfigError(f"{shown}: the db must be a number, {SENTINEL_FORM}")
        db = int(options["db"])
    unknown = set(options) - {"db", "sentinel_password", "sentinel_username"}
    if unknown:
        raise ConfigError(f"{shown}: unknown option {sorted(unknown)[0]!r}, {SENTINEL_FORM}")
    return SentinelAddress(
        sentinels=sentinels,
        service=segments[0],
        db=db,
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
    )


def _host_port(part: str, shown: str) -> tuple[str, int]:
    if part.startswith("["):  # [ipv6]:port
        host, _, port = part[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
    if not host:
        raise ConfigError(f"{shown}: a sentinel without a host, {SENTINEL_FORM}")
    if not port:
        return host, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{shown}: sentinel port {port!r} is not a port, {SENTINEL_FORM}")
    return host, int(port)


def redact(url: str) -> str:
    """``url`` with its passwords replaced by ``***`` (for output and logs)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url if "@" not in url else "<unparsable URL>"
    rest, qmark, query = rest.partition("?")
    if "sentinel_password=" in query:
        query = "&".join(
            "sentinel_password=***" if item.startswith("sentinel_password=") else item
            for item in query.split("&")
        )
    netloc, slash, path = rest.partition("/")
    credentials, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _ = credentials.partition(":")
        netloc = f"{user}:***@{hosts}" if colon else f"{user}@{hosts}"
    if scheme.lower() in SENTINEL_SCHEMES or scheme.lower() == "unix":
        return f"{scheme}://{netloc}{slash}{path}{qmark}{query}"
    try:
        parts = urlsplit(url)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparsable URL>"
