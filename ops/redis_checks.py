"""``codepool doctor --url``: is this Redis fit for codepool? One line per check, each
saying what to change when it is not OK. Never raises: a Redis that cannot be reached
is one not-OK line."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.exceptions import NoPermissionError

from codepool.common import rq_records
from codepool.common.connection import redis_client
from codepool.common.errors import ConfigError
from codepool.common.failover import sentinel_of
from codepool.common.redis_url import is_sentinel_url, parse_sentinel_url, redact
from codepool.common.settings import Settings
from codepool.ops.check_lines import format_lines

Line = dict[str, Any]

# BLMOVE is RQ's reliable dequeue (Redis 6.2); the producer collects results with BLMPOP (7.0).
MIN_VERSION_BLMOVE = (6, 2, 0)
MIN_VERSION_BLMPOP = (7, 0, 0)
CHECK_TIMEOUT_S = 5.0
URL_FORM = (
    "pass --url redis://USER:PASSWORD@HOST:PORT/DB or "
    "redis+sentinel://USER:PASSWORD@HOST:PORT,HOST:PORT/SERVICE/DB (or set REDIS_URL)"
)
# Placeholder names in the probed commands: DRYRUN and a discarded MULTI never run them.
PROBE_ID = "doctor-probe"
PROBE_SHA = "0" * 40
# Transaction commands cannot be queued inside the MULTI that the fallback probe uses.
TRANSACTION_COMMANDS = frozenset({"MULTI", "EXEC", "WATCH", "UNWATCH", "DISCARD"})
PERSISTENCE_FIX = (
    "CONFIG SET appendonly yes; CONFIG SET appendfsync everysec; CONFIG REWRITE "
    "(redis.conf: `appendonly yes` and `appendfsync everysec`; see ops/deploy/redis.conf)"
)
POLICY_FIX = (
    "CONFIG SET maxmemory-policy noeviction; CONFIG REWRITE "
    "(redis.conf: `maxmemory-policy noeviction`); a full Redis then refuses writes "
    "with an OOM error instead of dropping keys"
)


def required_commands(settings: Settings) -> list[tuple[str, ...]]:
    """A representative command of each kind codepool and RQ send, on their real key
    names (codepool's from ``settings.keys``, RQ's from RQ's own key builders)."""
    keys = settings.keys
    results = keys.batch_results(PROBE_ID)
    done = keys.batch_done(PROBE_ID)
    queue_key = rq_records.queue_key(settings.queue)
    intermediate = rq_records.intermediate_queue_key(settings.queue)
    started = rq_records.started_registry_key(settings.queue)
    channel = rq_records.command_channel(PROBE_ID)
    result_stream = rq_records.result_stream_key(PROBE_ID)
    job_key = rq_records.job_key(PROBE_ID)
    return [
        # codepool: result writer (and its counting), leases and claims, heartbeat, producer,
        # cancellation (its script publishes to the dispatchers' channels).
        ("SCRIPT", "LOAD", "return 1"),
        ("TIME",),
        ("ZRANGEBYSCORE", keys.leases(), "0", "1", "LIMIT", "0", "1"),
        ("ZCOUNT", keys.hosts(), "0", "+inf"),
        ("ZREMRANGEBYSCORE", keys.hosts(), "-inf", "0"),
        ("ZRANGE", keys.open_batches(), "0", "1"),
        ("HMGET", keys.batch_state(PROBE_ID), "n", "next"),
        ("LPOP", keys.batch_retry(PROBE_ID), "1"),
        ("SMEMBERS", keys.owner_batches(PROBE_ID)),
        ("HSCAN", keys.batch_state(PROBE_ID), "0", "MATCH", "c:*"),
        ("ZADD", keys.producers(), "0", PROBE_ID),
        ("PUBLISH", keys.cancel_channel(PROBE_ID), "x|all"),
        ("SUBSCRIBE", keys.cancel_channel(PROBE_ID)),
        ("EVALSHA", PROBE_SHA, "2", results, done, "0", "result", "entry"),
        ("HSETNX", results, "0", "result"),
        ("RPUSH", done, "entry"),
        ("EXPIRE", results, str(settings.batch_ttl_s)),
        ("HINCRBY", keys.stats(), "calls", "1"),
        ("HINCRBY", keys.minute_stats(0), "calls", "1"),
        ("HSET", keys.worker_stats(PROBE_ID), "heartbeat", "0"),
        ("ZADD", keys.workers(), "0", PROBE_ID),
        ("BLMPOP", "1", "1", done, "LEFT", "COUNT", "1"),
        ("HGETALL", keys.stats()),
        ("DEL", done),
        # RQ: enqueue, reliable dequeue, registries, results, worker registration, commands.
        ("HSET", job_key, "status", "queued"),
        ("RPUSH", queue_key, PROBE_ID),
        ("LPUSH", queue_key, PROBE_ID),
        ("BLMOVE", queue_key, intermediate, "LEFT", "RIGHT", "1"),
        ("LREM", intermediate, "1", PROBE_ID),
        ("ZADD", started, "0", PROBE_ID),
        ("SADD", rq_records.queues_key(), queue_key),
        ("SADD", rq_records.workers_key(), rq_records.worker_key(PROBE_ID)),
        ("XADD", result_stream, "*", "type", "1"),
        ("PUBLISH", channel, "{}"),
        ("SUBSCRIBE", channel),
        ("INFO", "server"),
        ("CLIENT", "SETNAME", PROBE_ID),
        ("MULTI",),
        ("EXEC",),
        ("WATCH", job_key),
    ]


def check_redis(url: str) -> list[Line]:
    """Check the Redis at ``url`` (credentials included) the way a worker would use it.

    Returns doctor-style lines ``{"name", "active", "detail"}``; ``active`` means OK.
    """
    shown = redact(url)
    try:
        # One attempt: a dead or firewalled Redis should cost one timeout, not four.
        client = redis_client(
            Settings.from_env(
                redis_url=url,
                socket_timeout_s=CHECK_TIMEOUT_S,
                connect_timeout_s=CHECK_TIMEOUT_S,
            ),
            retries=0,
            decode_responses=True,
        )
    except ConfigError as exc:
        return [_line("redis reachable", False, f"{exc}; fix: {URL_FORM}")]
    try:
        reachable = _check_reachable(client, shown)
        if not reachable["active"]:
            return [reachable]
        primary = primary_line(client)
        if primary is not None:
            reachable = _line(
                "redis reachable", True, f"{reachable['detail']}; {primary['detail']}"
            )
        checks: list[tuple[str, Callable[[], Line]]] = [
            ("redis version", lambda: _check_version(client)),
            ("redis persistence", lambda: _check_persistence(client)),
            ("redis maxmemory-policy", lambda: _check_policy(client)),
            ("redis acl", lambda: _check_acl(client, url)),
        ]
        return [reachable, *(_guarded(name, check) for name, check in checks)]
    finally:
        client.close()


def main(url: str) -> int:
    """Print the checks of the Redis at ``url``; exit status 1 if any is not OK."""
    lines = check_redis(url)
    print(format_lines(lines))
    failing = [str(line["name"]) for line in lines if not line["active"]]
    if failing:
        print(f"\n{len(failing)} Redis check(s) not OK: {', '.join(failing)}")
        return 1
    print("\nRedis is ready for codepool")
    return 0


def _line(name: str, active: bool, detail: str) -> Line:
    return {"name": name, "active": active, "detail": detail}


def _guarded(name: str, check: Callable[[], Line]) -> Line:
    # doctor must report, not crash: whatever a check trips over becomes its line.
    try:
        return check()
    except NoPermissionError as exc:
        return _line(name, False, f"not checked: {exc}; fix: ACL SETUSER <user> +info")
    except Exception as exc:
        return _line(name, False, f"check failed: {type(exc).__name__}: {exc}")


def _check_reachable(client: redis.Redis, shown: str) -> Line:
    name = "redis reachable"
    started = time.perf_counter()
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        return _line(name, False, f"{shown}: {exc}; fix: check user and password, {URL_FORM}")
    except redis.ResponseError as exc:
        # NOAUTH: the server wants credentials the URL does not carry.
        return _line(name, False, f"{shown}: {exc}; fix: {URL_FORM}")
    except (redis.RedisError, OSError) as exc:
        return _line(
            name,
            False,
            f"cannot reach {shown}: {exc}; fix: start redis-server there or check host, "
            f"port and firewall, {URL_FORM}",
        )
    elapsed_ms = (time.perf_counter() - started) * 1000
    return _line(name, True, f"{shown}: PONG in {elapsed_ms:.2f} ms")


def _info(client: redis.Redis, section: str) -> dict[str, Any]:
    return dict(client.info(section))


def _config(client: redis.Redis, *names: str) -> dict[str, str] | None:
    """CONFIG GET, or None when this user may not (CONFIG is admin-only) or the server
    does not offer it (managed Redis)."""
    try:
        values = client.config_get(*names)
    except redis.ResponseError:
        return None
    return {str(k): str(v) for k, v in dict(values).items()}


def _check_version(client: redis.Redis) -> Line:
    name = "redis version"
    try:
        version_text = str(_info(client, "server").get("redis_version", "?"))
    except NoPermissionError:
        return _line(
            name,
            False,
            "this user may not run INFO, which RQ needs to read the server version; "
            "fix: ACL SETUSER <user> +info",
        )
    version = _parse_version(version_text)
    if version is None:
        return _line(name, False, f"unrecognised version {version_text!r}; need Redis >= 7.0")
    if version < MIN_VERSION_BLMOVE:
        return _line(
            name,
            False,
            f"{version_text}: RQ's reliable dequeue needs BLMOVE (>= 6.2) and the producer "
            "BLMPOP (>= 7.0); fix: upgrade to Redis >= 7.0",
        )
    if version < MIN_VERSION_BLMPOP:
        return _line(
            name,
            False,
            f"{version_text}: has BLMOVE, but the producer collects results with BLMPOP "
            "(>= 7.0); fix: upgrade to Redis >= 7.0",
        )
    return _line(name, True, f"{version_text} (BLMOVE needs >= 6.2, BLMPOP >= 7.0)")


def _parse_version(text: str) -> tuple[int, int, int] | None:
    try:
        parts = [int(part) for part in text.split(".")[:3]]
    except ValueError:
        return None
    parts += [0] * (3 - len(parts))
    return (parts[0], parts[1], parts[2])


def _check_persistence(client: redis.Redis) -> Line:
    name = "redis persistence"
    config = _config(client, "appendonly", "appendfsync", "save")
    if config is None:
        # Without CONFIG GET, INFO still says whether AOF is on, not how often it syncs.
        info = _info(client, "persistence")
        if int(info.get("aof_enabled", 0)):
            return _line(
                name,
                True,
                "AOF on (appendfsync not visible without CONFIG GET; everysec recommended)",
            )
        return _line(
            name,
            False,
            "AOF off: a restart loses queued batches and results written since the last "
            f"snapshot, if any; fix: {PERSISTENCE_FIX}",
        )
    appendonly = config.get("appendonly", "no")
    fsync = config.get("appendfsync", "")
    save = config.get("save", "").strip()
    if appendonly == "yes":
        if fsync == "everysec":
            return _line(name, True, "AOF on, appendfsync everysec")
        if fsync == "always":
            return _line(
                name, True, "AOF on, appendfsync always (safest but slower; everysec suffices)"
            )
        return _line(
            name,
            False,
            f"AOF on but appendfsync {fsync}: the OS decides when writes reach disk, so a "
            "host crash can lose ~30 s of batches and results; fix: CONFIG SET appendfsync "
            "everysec; CONFIG REWRITE (redis.conf: `appendfsync everysec`)",
        )
    if save:
        return _line(
            name,
            False,
            f"RDB snapshots only (save {save!r}): a restart loses every batch and result "
            f"since the last snapshot; fix: {PERSISTENCE_FIX}",
        )
    return _line(
        name,
        False,
        f"no persistence (appendonly no, save ''): a restart loses every queued batch and "
        f"result; fix: {PERSISTENCE_FIX}",
    )


def _check_policy(client: redis.Redis) -> Line:
    name = "redis maxmemory-policy"
    config = _config(client, "maxmemory-policy")
    memory = _info(client, "memory")
    policy = config.get("maxmemory-policy") if config else memory.get("maxmemory_policy")
    limit_bytes = int(memory.get("maxmemory", 0) or 0)
    limit = f"maxmemory {limit_bytes / 2**30:.1f} GiB" if limit_bytes else "no maxmemory"
    if policy is None:
        return _line(
            name, False, f"cannot read the policy; make sure it is noeviction: {POLICY_FIX}"
        )
    if policy != "noeviction":
        return _line(
            name,
            False,
            f"{policy} ({limit}): under memory pressure Redis would evict keys, silently "
            f"losing queued batches, results and RQ job records; fix: {POLICY_FIX}",
        )
    return _line(name, True, f"noeviction ({limit})")


def _check_acl(client: redis.Redis, url: str) -> Line:
    name = "redis acl"
    user = _whoami(client, url)
    settings = Settings.from_env(redis_url=url)
    commands = required_commands(settings)
    try:
        denied = _dryrun(client, user, commands)
        how = "ACL DRYRUN"
    except redis.ResponseError as exc:
        # DRYRUN is Redis >= 7 and admin-only; a well-restricted worker user may not run it.
        why = f"ACL DRYRUN unavailable ({exc})"
        try:
            denied = _queue_probe(client, commands)
            how = f"a discarded MULTI, {why}"
        except redis.ResponseError as probe_exc:
            return _line(
                name,
                True,
                f"not checked for user {user}: {why}, and MULTI refused ({probe_exc}); an "
                f"admin can run `ACL DRYRUN {user} BLMOVE ...` (commands as in "
                "ops/deploy/redis.conf)",
            )
    if not denied:
        return _line(
            name,
            True,
            f"user {user} may run the {len(commands)} commands codepool and RQ send on "
            f"{settings.prefix}* and {rq_records.key_pattern()} (checked with {how})",
        )
    fixes = sorted({_acl_fix(command, message, settings) for command, message in denied})
    shown = "; ".join(f"{' '.join(command[:2])}: {message}" for command, message in denied[:3])
    if len(denied) > 3:
        shown += f"; and {len(denied) - 3} more"
    return _line(
        name,
        False,
        f"user {user} may not run {len(denied)} of {len(commands)} commands ({shown}); "
        f"fix: ACL SETUSER {user} {' '.join(fixes)} (see ops/deploy/redis.conf)",
    )


def primary_line(client: redis.Redis) -> Line | None:
    """Where a Sentinel-managed client found its primary (None for a plain client)."""
    manager = sentinel_of(client)
    if manager is None:
        return None
    service = client.connection_pool.service_name  # type: ignore[attr-defined]
    host, port = manager.discover_master(service)
    return _line(
        "redis primary",
        True,
        f"Sentinel-managed primary {service!r} at {host}:{port} "
        f"({len(manager.sentinels)} sentinels in the URL)",
    )


def _whoami(client: redis.Redis, url: str) -> str:
    # The URL's user is who AUTH logged in as; asking would put a refused ACL WHOAMI in
    # the ACL LOG of a well-restricted worker user.
    named = parse_sentinel_url(url).username if is_sentinel_url(url) else urlsplit(url).username
    if named:
        return named
    try:
        return str(client.acl_whoami())
    except redis.ResponseError:
        return "default"


def _dryrun(
    client: redis.Redis, user: str, commands: list[tuple[str, ...]]
) -> list[tuple[tuple[str, ...], str]]:
    denied = []
    for command in commands:
        reply = client.execute_command("ACL", "DRYRUN", user, *command)  # type: ignore[no-untyped-call]
        if str(reply) != "OK":
            denied.append((command, str(reply)))
    return denied


def _queue_probe(
    client: redis.Redis, commands: list[tuple[str, ...]]
) -> list[tuple[tuple[str, ...], str]]:
    """Queue each command inside MULTI and DISCARD: Redis checks ACL rights when it
    queues, so a denied command answers NOPERM while nothing ever runs."""
    denied = []
    # Any: redis-py leaves Connection's raw send/read methods unannotated.
    connection: Any = client.connection_pool.get_connection()
    try:
        connection.send_command("MULTI")
        connection.read_response()
        for command in commands:
            if command[0] in TRANSACTION_COMMANDS:
                continue
            connection.send_command(*command)
            try:
                connection.read_response()
            except NoPermissionError as exc:
                denied.append((command, str(exc)))
            except redis.ResponseError:
                pass  # refused for another reason (e.g. not allowed in MULTI): not an ACL gap
        connection.send_command("DISCARD")
        try:
            connection.read_response()
        except redis.ResponseError:
            pass  # the connection is dropped below, which discards the transaction anyway
    finally:
        # Never hand back a connection that may still be inside MULTI.
        connection.disconnect()
        client.connection_pool.release(connection)
    return denied


def _acl_fix(command: tuple[str, ...], message: str, settings: Settings) -> str:
    """The ACL rule that grants what ``message`` (NOPERM or DRYRUN text) says is missing."""
    lowered = message.lower()
    if "to run" in lowered:
        if command[0] in ("SCRIPT", "CLIENT"):
            return f"+{command[0].lower()}|{command[1].lower()}"
        return f"+{command[0].lower()}"
    if "channel" in lowered:
        return "&" + rq_records.command_channel("*")
    prefix = settings.prefix
    return (
        f"~{prefix}*"
        if any(arg.startswith(prefix) for arg in command[1:])
        else "~" + rq_records.key_pattern()
    )
