"""The listen turn: one holder at a time, handed on when given back or when its holder
dies, the waiter's keepalive running meanwhile, and a wait interrupted by a signal
handler's exception never leaves the turn held."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from codepool.worker.listen_turn import ListenTurn
from tests.conftest import wait_until


class Stop(Exception):
    """Stands in for RQ's StopRequested, raised in the waiting thread."""


def _take_in_thread(turn: ListenTurn) -> tuple[threading.Thread, threading.Event]:
    got = threading.Event()

    def take() -> None:
        turn.take(keepalive=lambda: None, every_s=0.05)
        got.set()

    thread = threading.Thread(target=take)
    thread.start()
    return thread, got


def test_one_holder_at_a_time_and_the_waiter_keeps_alive(tmp_path: Path) -> None:
    path = str(tmp_path / "turn")
    first, second = ListenTurn(path), ListenTurn(path)
    first.take(keepalive=lambda: None, every_s=1.0)
    beats: list[int] = []
    got = threading.Event()

    def wait() -> None:
        second.take(keepalive=lambda: beats.append(1), every_s=0.02)
        got.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: len(beats) >= 3, what="the waiter's keepalive")
    assert not got.is_set()
    first.give_back()
    waiter.join(timeout=10)
    assert got.is_set()
    second.give_back()
    first.close()
    second.close()


def test_the_turn_is_handed_on_when_its_holder_dies(tmp_path: Path) -> None:
    path = str(tmp_path / "turn")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom codepool.worker.listen_turn import ListenTurn\n"
            f"ListenTurn({path!r}).take(keepalive=lambda: None, every_s=1.0)\n"
            "print('held', flush=True)\ntime.sleep(600)",
        ],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    turn = ListenTurn(path)
    got = threading.Event()
    waiter = threading.Thread(
        target=lambda: (turn.take(keepalive=lambda: None, every_s=0.05), got.set())
    )
    waiter.start()
    assert not got.wait(0.3)
    holder.kill()
    holder.wait()
    waiter.join(timeout=10)
    assert got.is_set()
    turn.close()


def test_an_interrupted_wait_never_keeps_the_turn(tmp_path: Path) -> None:
    path = str(tmp_path / "turn")
    first, second = ListenTurn(path), ListenTurn(path)
    first.take(keepalive=lambda: None, every_s=1.0)

    def stop() -> None:
        raise Stop

    with pytest.raises(Stop):
        second.take(keepalive=stop, every_s=0.02)
    first.give_back()
    # The interrupted waiter's thread gets the turn and hands it straight back.
    third = ListenTurn(path)
    got = threading.Event()
    waiter = threading.Thread(
        target=lambda: (third.take(keepalive=lambda: None, every_s=0.05), got.set())
    )
    waiter.start()
    waiter.join(timeout=10)
    assert got.is_set()
    for turn in (first, second, third):
        turn.close()
