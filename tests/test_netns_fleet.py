"""codepool.ops.bench.netns: a hub namespace running redis-server and host namespaces on veths,
reachable, cuttable, signalable, and gone without a trace afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from codepool.ops.bench.netns import Fleet, NetnsError, netns_available
from codepool.ops.bench.process_tree import process_state
from tests.conftest import wait_until

# Dials Redis from inside a host namespace and SETs a key: exit 0 only if that worked.
SET_KEY = """
import sys, redis
client = redis.Redis.from_url(sys.argv[1], socket_connect_timeout=1.0, socket_timeout=1.0)
client.set(sys.argv[2], sys.argv[3])
"""

# A parent and a child sleeping in a host namespace; the parent prints the child's pid.
TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def require_netns() -> None:
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    require_netns()
    with Fleet(hosts=2) as built:
        yield built


def set_from_host(fleet: Fleet, host: int, url: str, key: str, value: str) -> str:
    """Run SET_KEY in host ``host``'s namespace against ``url``; its stderr if it failed."""
    argv = fleet.exec_argv(host, [sys.executable, "-c", SET_KEY, url, key, value])
    done = subprocess.run(argv, capture_output=True, text=True)
    return "" if done.returncode == 0 else done.stderr or f"exit {done.returncode}"


def root_link_names() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], check=True, capture_output=True, text=True)
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()}


def test_redis_in_the_hub_answers_over_the_unix_socket(fleet: Fleet) -> None:
    client = redis.Redis.from_url(fleet.redis_unix_url)
    assert client.ping()
    assert client.config_get("port")["port"] == "6379"
    for ns in fleet.namespaces:  # loopback up everywhere: local services must work
        lo = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "lo"], capture_output=True)
        assert b"LOWER_UP" in lo.stdout, (ns, lo.stdout, lo.stderr)


def test_a_host_reaches_redis_over_its_veth(fleet: Fleet) -> None:
    assert set_from_host(fleet, 1, fleet.redis_url_for(1), "from-host-1", "hello") == ""
    assert redis.Redis.from_url(fleet.redis_unix_url).get("from-host-1") == b"hello"


def test_hosts_are_isolated_and_the_root_namespace_has_no_fleet_address(fleet: Fleet) -> None:
    # Host 0 has no route to host 1's subnet. From the root namespace the address leads
    # wherever its default route goes (on some CI machines a proxy answers any TCP
    # connection), but never to the fleet's Redis.
    assert set_from_host(fleet, 0, fleet.redis_url_for(1), "crossed", "x") != ""
    outside = redis.Redis.from_url(
        fleet.redis_url_for(0), socket_connect_timeout=1.0, socket_timeout=1.0
    )
    with pytest.raises(redis.RedisError):
        outside.ping()
    out = subprocess.run(["ip", "-o", "addr"], check=True, capture_output=True, text=True)
    assert "10.250." not in out.stdout


def test_cut_link_partitions_one_host_and_restore_link_heals_it(fleet: Fleet) -> None:
    fleet.cut_link(1)
    try:
        error = set_from_host(fleet, 1, fleet.redis_url_for(1), "during-cut", "lost")
        assert error != ""
        assert "Timeout" in error or "connect" in error.lower()
        assert set_from_host(fleet, 0, fleet.redis_url_for(0), "host-0-unaffected", "yes") == ""
    finally:
        fleet.restore_link(1)
    assert set_from_host(fleet, 1, fleet.redis_url_for(1), "after-restore", "back") == ""
    client = redis.Redis.from_url(fleet.redis_unix_url)
    assert client.get("during-cut") is None
    assert client.get("after-restore") == b"back"
    assert client.get("host-0-unaffected") == b"yes"


def test_freeze_thaw_and_kill_a_host_reach_every_process_in_it(fleet: Fleet) -> None:
    parent = subprocess.Popen(
        fleet.exec_argv(0, [sys.executable, "-c", TREE]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert {parent.pid, child} <= set(fleet.host_pids(0))
        assert fleet.host_pids(1) == []

        assert {parent.pid, child} <= set(fleet.freeze_host(0))
        assert process_state(parent.pid) == "T"
        assert process_state(child) == "T"
        fleet.thaw_host(0)
        wait_until(lambda: process_state(parent.pid) != "T" and process_state(child) != "T")

        assert {parent.pid, child} <= set(fleet.kill_host(0))
        assert parent.wait() == -signal.SIGKILL
        # The child was re-parented; whoever reaps orphans may leave it a zombie a while.
        wait_until(lambda: process_state(child) in (None, "Z"))
        assert fleet.host_pids(0) == []
    finally:
        parent.kill()
        parent.wait()


def test_leaving_the_fleet_removes_everything_it_created() -> None:
    require_netns()
    links_before = root_link_names()
    with Fleet(hosts=3) as fleet:
        namespaces = fleet.namespaces
        redis_pid = fleet.redis_pid
        socket_path = fleet.redis_unix_url.removeprefix("unix://")
        # Started behind the fleet's back: teardown still kills what runs in its namespaces.
        stray = subprocess.Popen(
            fleet.exec_argv(2, [sys.executable, "-c", "input()"]), stdin=subprocess.PIPE
        )
        wait_until(lambda: stray.pid in fleet.host_pids(2))
        assert len(namespaces) == 4
        assert redis_pid is not None and process_state(redis_pid) not in (None, "Z")
    assert stray.poll() == -signal.SIGKILL  # killed, and dead by the time teardown returned
    listed = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
    for ns in namespaces:
        assert ns not in listed.stdout
        assert not os.path.exists(f"/run/netns/{ns}")
    assert process_state(redis_pid) is None
    assert not os.path.exists(os.path.dirname(socket_path))
    assert root_link_names() <= links_before
    assert fleet.namespaces == []


def test_a_failure_half_way_in_undoes_the_half_and_spares_what_was_not_its_own() -> None:
    require_netns()
    fleet = Fleet(hosts=3)
    squatter = f"{fleet.prefix}-h1"  # someone else's namespace, under the name host 1 needs
    subprocess.run(["ip", "netns", "add", squatter], check=True)
    try:
        with pytest.raises(NetnsError, match="File exists"), fleet:
            pass
        listed = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
        assert squatter in listed.stdout
        assert f"{fleet.prefix}-hub" not in listed.stdout
        assert f"{fleet.prefix}-h0" not in listed.stdout
        assert fleet.namespaces == []
        assert fleet.redis_pid is None
        assert not os.path.exists(os.path.dirname(fleet.redis_unix_url.removeprefix("unix://")))
    finally:
        subprocess.run(["ip", "netns", "delete", squatter], check=True)
