"""A context reply whose write meets a Redis that is gone is written again once Redis is
back (within the reply's TTL), not dropped: a dropped reply left its caller waiting out
the call's timeout and a margin, judging the host lost, and running the call twice."""

from __future__ import annotations

from typing import cast

import pytest
import redis

from codepool.common.context_requests import ContextReply, ContextRequest
from codepool.common.settings import Settings
from codepool.ops.redis_server import RedisServer
from codepool.worker.context_server import ContextServer
from codepool.worker.engine.executor import LocalExecutor
from tests.conftest import wait_until


def test_a_reply_written_while_redis_is_down_arrives_when_it_is_back(
    redis_url: str, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(redis_url=redis_url, socket_timeout_s=1.0, connect_timeout_s=1.0)
    # Only the reply writer runs: no executor is needed for it.
    server = ContextServer(settings, cast(LocalExecutor, None), host="h", ttl_s=60.0)
    server._writer.start()
    request = ContextRequest("run", "ctx", code="pass")
    redis_server.stop()
    try:
        server._reply(request, ContextReply(ok=True))
        # The writer met the gone Redis (before: the reply was dropped then).
        wait_until(lambda: "context reply" in caplog.text, timeout_s=30, what="a failed write")
    finally:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    key = settings.keys.context_reply(request.id)
    wait_until(lambda: client.llen(key) >= 1, timeout_s=30, what="the reply written")
    assert ContextReply.decode(client.lpop(key)).ok
    server.stop()
    client.close()
