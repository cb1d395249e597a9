"""Sentinel URLs: the parts, the errors (never with the password), the redaction."""

from __future__ import annotations

import pytest

from codepool.common.errors import ConfigError
from codepool.common.redis_url import is_sentinel_url, parse_sentinel_url, redact
from codepool.common.settings import Settings


def test_a_sentinel_url_names_sentinels_service_db_and_credentials() -> None:
    address = parse_sentinel_url(
        "redis+sentinel://codepool:p%40ss@s1:26380,s2,[::1]:26381/mymaster/2?sentinel_password=sp"
    )
    assert address.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (address.service, address.db) == ("mymaster", 2)
    assert (address.username, address.password) == ("codepool", "p@ss")
    assert address.sentinel_password == "sp"
    assert parse_sentinel_url("sentinel://h:1/svc").db == 0
    assert is_sentinel_url("redis+sentinel://h/s") and not is_sentinel_url("redis://h:6379/0")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://:secret@h:26379", "name the service"),
        ("redis+sentinel://:secret@h:99999/s", "is not a port"),
        ("redis+sentinel://:secret@/s", "without a host"),
        ("redis+sentinel://:secret@h/s/db1", "db must be a number"),
        ("redis+sentinel://:secret@h/s?ssl=1", "unknown option"),
    ],
)
def test_a_bad_sentinel_url_is_a_config_error_without_the_password(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        Settings(redis_url=url)
    assert "secret" not in str(caught.value)


def test_redact_hides_every_password() -> None:
    assert (
        redact("redis+sentinel://u:pw@h1:1,h2/s/0?sentinel_password=spw")
        == "redis+sentinel://u:***@h1:1,h2/s/0?sentinel_password=***"
    )
    assert redact("redis://u:pw@h:6379/0") == "redis://u:***@h:6379/0"
    assert redact("unix://:pw@/tmp/r.sock?db=1") == "unix://:***@/tmp/r.sock?db=1"
