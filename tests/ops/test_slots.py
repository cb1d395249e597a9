"""Slots default to the CPUs the process may use: a real ``codepool worker`` started
without ``-c`` under a narrowed CPU affinity (taskset) and inside a cgroup with a CPU
quota of its own (v2 where the machine offers the cpu controller there, v1 where it is
bound to a v1 hierarchy), ``codepool doctor``'s line saying so, and serve, replay and
run taking the same default. Each cgroup the test makes is removed afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from codepool.common.errors import ConfigError
from codepool.common.keys import Keys
from codepool.ops import embedded, run
from codepool.ops.cli import main
from tests.conftest import StartWorker, wait_until

QUOTA_US, PERIOD_US = 150_000, 100_000  # 1.5 CPUs: one slot


def affinity() -> int:
    return len(os.sched_getaffinity(0))


needs_two_cpus = pytest.mark.skipif(
    affinity() < 2, reason="one CPU: a default of one slot would prove nothing"
)


@dataclass
class CpuCgroup:
    """A cgroup of the test's own with a CPU quota of 1.5 CPUs."""

    version: int
    path: str

    def wrap(self) -> list[str]:
        """A prefix that runs a command inside this cgroup from its first instruction."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]

    def members(self) -> list[str]:
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            return f.read().split()


def cgroup_mount(version: int) -> str | None:
    """Where this machine mounts the cgroup v2 hierarchy, or v1's cpu controller."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3].split(",")
            if version == 2 and fstype == "cgroup2":
                return fields[4]
            if version == 1 and fstype == "cgroup" and "cpu" in options:
                return fields[4]
    return None


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@pytest.fixture(params=[2, 1], ids=["cgroup-v2", "cgroup-v1"])
def cpu_cgroup(request: pytest.FixtureRequest) -> Iterator[CpuCgroup]:
    version: int = request.param
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    mount = cgroup_mount(version)
    if mount is None:
        pytest.skip(f"no cgroup v{version} hierarchy with a cpu controller is mounted here")
    enabled_here = False
    if version == 2:
        with open(os.path.join(mount, "cgroup.controllers")) as f:
            controllers = f.read().split()
        if "cpu" not in controllers:
            pytest.skip(
                f"cgroup v2 at {mount} offers no cpu controller (it has: "
                f"{' '.join(controllers) or 'none'}); the cpu controller is bound to v1 here"
            )
        with open(os.path.join(mount, "cgroup.subtree_control")) as f:
            if "cpu" not in f.read().split():
                try:
                    write(os.path.join(mount, "cgroup.subtree_control"), "+cpu")
                except OSError as exc:
                    pytest.skip(f"cannot enable the cpu controller below {mount}: {exc}")
                enabled_here = True
    path = os.path.join(mount, f"codepool-test-{os.getpid()}")
    os.mkdir(path)
    try:
        if version == 2:
            write(os.path.join(path, "cpu.max"), f"{QUOTA_US} {PERIOD_US}")
        else:
            write(os.path.join(path, "cpu.cfs_period_us"), str(PERIOD_US))
            write(os.path.join(path, "cpu.cfs_quota_us"), str(QUOTA_US))
        yield CpuCgroup(version, path)
    finally:
        cgroup = CpuCgroup(version, path)
        wait_until(lambda: not cgroup.members(), timeout_s=60, what="the cgroup emptied")
        os.rmdir(path)
        if enabled_here:
            try:
                write(os.path.join(mount, "cgroup.subtree_control"), "-cpu")
            except OSError:
                pass  # another cgroup has taken the controller up meanwhile


def worker_slots(redis_url: str, name: str) -> tuple[int, int]:
    """The slots and dispatchers worker ``name`` reports in its heartbeat."""
    client = redis.Redis.from_url(redis_url)
    key = Keys().worker_stats(name)
    try:
        wait_until(lambda: client.hget(key, "slots") is not None, what="the worker's heartbeat")
        return int(client.hget(key, "slots") or 0), int(client.hget(key, "dispatchers") or 0)
    finally:
        client.close()


def doctor_slots_line(wrap: list[str]) -> str:
    proc = subprocess.run(
        [*wrap, sys.executable, "-m", "codepool.ops.cli", "doctor", "--preload", ""],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("slots: ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


@needs_two_cpus
def test_the_default_follows_the_cpu_affinity(redis_url: str, start_worker: StartWorker) -> None:
    wrap = ["taskset", "-c", "0"]
    worker = start_worker(concurrency=None, name="pinned", wrap=wrap)
    assert worker_slots(redis_url, "pinned") == (1, 2)  # dispatchers: still at least 2
    assert "pinned: 1 slots" in worker.log()
    assert doctor_slots_line(wrap) == "slots: 1 (CPU affinity 1, no cgroup quota)"
    # An explicit -c still wins.
    start_worker(concurrency=3, name="asked", wrap=wrap)
    assert worker_slots(redis_url, "asked") == (3, 3)


@contextmanager
def one_cpu() -> Iterator[None]:
    """This thread (and what it starts) on one CPU, as under ``taskset -c``: Linux keeps
    an affinity per thread, and ``default_slots`` reads the calling thread's."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


@needs_two_cpus
def test_serve_replay_and_run_take_the_same_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """serve's and replay's slots are their embedded worker's, run's its executor's.
    Their real handlers run here, under one CPU: the embedded pool they ask for notes
    what they ask (and refuses, so that they stop there: a real one costs seconds), and
    run's executor notes the slots its supervisor took."""
    asked: list[int | None] = []
    slots: list[int] = []

    def noting_pool(concurrency: int | None, preload: tuple[str, ...] = ()) -> Iterator[str]:
        asked.append(concurrency)
        raise ConfigError("no pool in this test")

    class NotingExecutor(run.LocalExecutor):
        def __init__(self, **keywords: Any) -> None:
            super().__init__(**keywords)
            slots.append(self.concurrency)

    monkeypatch.setattr(embedded, "embedded_pool", noting_pool)
    monkeypatch.setattr(run, "LocalExecutor", NotingExecutor)
    monkeypatch.delenv("REDIS_URL", raising=False)
    source = tmp_path / "in.jsonl"
    source.write_text('{"code": "print(1)"}\n')
    with one_cpu():
        serve_code = main(["serve", "--port", "0"])
        replay_code = main(["replay", str(source), "-o", str(tmp_path / "out.jsonl")])
        run_code = main(["run", "-c", "print(1)"])
    assert (serve_code, replay_code, run_code) == (2, 2, 0)  # serve and replay: no pool
    assert slots == [1]
    # serve and replay ask for no number, and the embedded worker is then started
    # without -c: it takes the default itself, as the first test sees under one CPU.
    assert asked == [None, None]
    argv = embedded.worker_argv("redis://unused", "embedded", None, ())
    assert not {"-c", "--concurrency"} & set(argv)
    asked_for = embedded.worker_argv("redis://unused", "embedded", 3, ())
    assert asked_for[asked_for.index("-c") :][:2] == ["-c", "3"]


@needs_two_cpus
def test_the_default_follows_the_cgroup_quota(
    cpu_cgroup: CpuCgroup, redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(concurrency=None, name="quota", wrap=cpu_cgroup.wrap())
    try:
        assert worker_slots(redis_url, "quota") == (1, 2)
        assert str(worker.process.pid) in cpu_cgroup.members()
    finally:
        worker.stop()
    line = doctor_slots_line(cpu_cgroup.wrap())
    assert line == f"slots: 1 (CPU affinity {affinity()}, cgroup quota 1.5)"


def test_the_help_shows_the_default() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "codepool.ops.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "the CPUs this process may use" in " ".join(out.split())
