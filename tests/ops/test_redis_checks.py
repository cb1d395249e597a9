"""`check_redis` reports each Redis setting codepool depends on, with the fix; and the
ACL user in ops/deploy/redis.conf is enough for a real worker and producer."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from codepool.common.errors import ConfigError
from codepool.common.keys import Keys
from codepool.ops.redis_checks import check_redis, main, redact
from codepool.ops.redis_server import free_port
from codepool.ops.server_binary import find_server_binary
from codepool.producer import CodePool
from tests.conftest import WorkerProcess, wait_for_dispatchers, wait_until

FRAGMENT = Path(__file__).resolve().parents[2] / "ops" / "deploy" / "redis.conf"


def by_name(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(line["name"]): line for line in lines}


def test_suite_redis_lines(redis_url: str) -> None:
    lines = by_name(check_redis(redis_url))
    assert list(lines) == [
        "redis reachable",
        "redis version",
        "redis persistence",
        "redis maxmemory-policy",
        "redis acl",
    ]
    assert lines["redis reachable"]["active"], lines
    assert "PONG" in lines["redis reachable"]["detail"]
    assert lines["redis version"]["active"], lines
    # The suite's server runs with --appendonly no: not OK, and the line says what to do.
    persistence = lines["redis persistence"]
    assert not persistence["active"]
    assert "CONFIG SET appendonly yes" in persistence["detail"]
    assert "appendfsync everysec" in persistence["detail"]
    # The default user may do everything, and may run ACL DRYRUN itself.
    assert lines["redis acl"]["active"], lines
    assert "ACL DRYRUN" in lines["redis acl"]["detail"]
    assert "user default" in lines["redis acl"]["detail"]


def test_maxmemory_policy_follows_the_server(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        line = by_name(check_redis(redis_url))["redis maxmemory-policy"]
        assert not line["active"]
        assert "allkeys-lru" in line["detail"]
        assert "CONFIG SET maxmemory-policy noeviction" in line["detail"]

        client.config_set("maxmemory-policy", "noeviction")
        line = by_name(check_redis(redis_url))["redis maxmemory-policy"]
        assert line["active"], line
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()


def test_aof_everysec_is_ok(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.config_set("appendonly", "yes")
        line = by_name(check_redis(redis_url))["redis persistence"]
        assert line["active"], line
        assert "everysec" in line["detail"]
    finally:
        client.config_set("appendonly", "no")
        client.close()


def test_unreachable_is_one_line_not_an_exception() -> None:
    url = f"redis://codepool:s3cret@127.0.0.1:{free_port()}/0"
    lines = check_redis(url)
    assert len(lines) == 1
    assert not lines[0]["active"]
    assert "cannot reach" in lines[0]["detail"]
    assert "s3cret" not in lines[0]["detail"]
    assert main(url) == 1


def test_bad_url_is_one_line() -> None:
    lines = check_redis("http://example.invalid")
    assert len(lines) == 1
    assert not lines[0]["active"]


def test_redact_hides_the_password() -> None:
    assert redact("redis://codepool:pw@h:6379/0") == "redis://codepool:***@h:6379/0"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


# -- the ACL fragment, proved with a real worker and producer ---------------------------


@dataclass
class AclRedis:
    port: int
    admin_password: str
    codepool_password: str

    def url(self, user: str, password: str) -> str:
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    @property
    def admin_url(self) -> str:
        return self.url("admin", self.admin_password)

    @property
    def codepool_url(self) -> str:
        return self.url("codepool", self.codepool_password)


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    """A private Redis server that includes ops/deploy/redis.conf (passwords filled in)."""
    try:
        binary = find_server_binary().path
    except ConfigError as exc:
        pytest.skip(str(exc))
    server = AclRedis(free_port(), secrets.token_hex(16), secrets.token_hex(16))
    fragment = FRAGMENT.read_text()
    assert fragment.count("CHANGE_ME_admin_password") == 1
    assert fragment.count("CHANGE_ME_codepool_password") == 1
    fragment = fragment.replace("CHANGE_ME_admin_password", server.admin_password)
    fragment = fragment.replace("CHANGE_ME_codepool_password", server.codepool_password)
    (tmp_path / "codepool.conf").write_text(fragment)
    # As in production: the host's own settings, then the fragment included last.
    (tmp_path / "redis.conf").write_text(
        f"port {server.port}\nbind 127.0.0.1\ndir {tmp_path}\ndaemonize no\nsave ''\n"
        f"logfile {tmp_path / 'redis.log'}\ninclude {tmp_path / 'codepool.conf'}\n"
    )
    process = subprocess.Popen(
        [binary, str(tmp_path / "redis.conf")], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        admin = redis.Redis.from_url(server.admin_url, socket_timeout=1)
        for _ in range(200):
            try:
                admin.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None:
                    pytest.fail((tmp_path / "redis.log").read_text())
                time.sleep(0.05)
        admin.close()
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_fragment_settings_pass_every_check(acl_redis: AclRedis) -> None:
    for url in (acl_redis.admin_url, acl_redis.codepool_url):
        lines = check_redis(url)
        assert all(line["active"] for line in lines), lines
    acl = by_name(check_redis(acl_redis.codepool_url))["redis acl"]
    # The worker user may not run ACL DRYRUN: its rights are probed in a discarded MULTI.
    assert "user codepool" in acl["detail"] and "MULTI" in acl["detail"], acl
    assert "DRYRUN" in by_name(check_redis(acl_redis.admin_url))["redis acl"]["detail"]


def test_fragment_default_user_is_off(acl_redis: AclRedis) -> None:
    client = redis.Redis(port=acl_redis.port, socket_timeout=1)
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    client.close()


def test_fragment_codepool_user_is_confined(acl_redis: AclRedis) -> None:
    client = redis.Redis.from_url(acl_redis.codepool_url, socket_timeout=1)
    try:
        for command in (
            ("SET", "elsewhere", "1"),
            ("FLUSHALL",),
            ("KEYS", "*"),
            ("CONFIG", "GET", "*"),
            ("EVAL", "return 1", "0"),
            ("PUBLISH", "elsewhere", "x"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    finally:
        client.close()


def test_missing_rights_are_named_with_the_fix(acl_redis: AclRedis) -> None:
    admin = redis.Redis.from_url(acl_redis.admin_url)
    admin.execute_command("ACL", "SETUSER", "codepool", "-blmove", "-evalsha")
    admin.close()
    acl = by_name(check_redis(acl_redis.codepool_url))["redis acl"]
    assert not acl["active"]
    assert "+blmove" in acl["detail"] and "+evalsha" in acl["detail"], acl


def test_real_worker_and_producer_with_the_codepool_user(
    acl_redis: AclRedis, start_worker: Callable[..., WorkerProcess]
) -> None:
    worker = start_worker(url=acl_redis.codepool_url, name="acl", wait=False)
    # Registration is checked as admin: the fixture's own wait watches the suite's Redis.
    wait_for_dispatchers(acl_redis.admin_url, "acl", worker)
    pool = CodePool(acl_redis.codepool_url)
    results = pool.submit(["print(1)", "1/0"]).results(timeout_s=30)
    assert [r.status for r in results] == ["ok", "error"], results
    assert results[0].stdout == "1\n"
    admin = redis.Redis.from_url(acl_redis.admin_url, decode_responses=True)
    try:
        # A cancellation publishes to the dispatcher holding the claim, on its channel.
        given_up = pool.submit(["import time\ntime.sleep(60)"])
        state = Keys().batch_state(given_up.id)
        wait_until(lambda: admin.hget(state, "next") == "1", what="the claim")
        assert given_up.cancel() == 1
        assert given_up.results(timeout_s=30)[0].status == "cancelled"
        # Counters are flushed with HINCRBY within about a second.
        deadline = time.monotonic() + 10
        while int(admin.hget(Keys().stats(), "calls") or 0) < 2:
            assert time.monotonic() < deadline, "stats were never flushed"
            time.sleep(0.1)
        assert admin.acl_log() == [], "the codepool user was refused something"
    finally:
        admin.close()
    assert worker.process.poll() is None, worker.log()
    assert "NOPERM" not in worker.log()
