"""The supervisor never waits on a client: a client that stops reading (a dispatcher
stopped with SIGSTOP, or its reader thread blocked on a Redis write) holds no deadline,
no kill and no reaping of anyone else's snippets. Real supervisor, real children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from codepool.common import codec
from codepool.common.limits import Limits
from codepool.worker.engine.executor import LocalExecutor
from codepool.worker.engine.protocol import encode_frame

# Enough output to fill any socket buffer many times over: 200 results of 4 KiB.
FLOOD = 200
NOISY = "print('x' * 4000)"
SPINNER = "while True:\n    pass"


def _flood(path: str) -> bytes:
    limits = codec.encode_limits(Limits(timeout_s=10.0))
    return b"".join(
        encode_frame({"t": "run", "id": i, "code": NOISY.encode(), "limits": limits})
        for i in range(FLOOD)
    )


def _spinner_killed_on_time(executor: LocalExecutor) -> None:
    started = time.monotonic()
    result = executor.submit(SPINNER, timeout_s=1.0).result(timeout=120)
    waited = time.monotonic() - started
    assert result.timed_out and result.status == "timeout", result
    # Its kill came at its deadline, not when the stalled client let go (never, here).
    assert result.exec_s < 3.0, (result.exec_s, waited)


def test_a_client_that_reads_nothing_holds_no_deadline(tmp_path: Path) -> None:
    # Failed before the fix: the supervisor sat in a blocking sendall to the client
    # that read nothing, and the spinner behind its requests was never killed.
    path = str(tmp_path / "supervisor.sock")
    with LocalExecutor(concurrency=2, preload=(), listen_path=path) as executor:
        stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stalled.connect(path)
        try:
            stalled.sendall(_flood(path))
            _spinner_killed_on_time(executor)
            # What it did not read waits for it, whole and in order.
            stalled.settimeout(30)
            reader = _Frames(stalled)
            assert reader.next()["t"] == "hello"
            ids = [reader.next()["id"] for _ in range(FLOOD)]
            assert sorted(ids) == list(range(FLOOD))
        finally:
            stalled.close()


def test_a_dispatcher_stopped_with_sigstop_holds_no_deadline(tmp_path: Path) -> None:
    # A real client process, attached as a dispatcher is, stopped mid-flood.
    path = str(tmp_path / "supervisor.sock")
    with LocalExecutor(concurrency=2, preload=(), listen_path=path) as executor:
        program = (
            "import socket, sys, time\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "s.connect(sys.argv[1])\n"
            "s.sendall(sys.stdin.buffer.read())\n"
            "print('sent', flush=True)\n"
            "time.sleep(600)\n"
        )
        client = subprocess.Popen(
            [sys.executable, "-c", program, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert client.stdin is not None and client.stdout is not None
            client.stdin.write(_flood(path))
            client.stdin.close()
            assert client.stdout.readline() == b"sent\n"
            os.kill(client.pid, signal.SIGSTOP)
            _spinner_killed_on_time(executor)
        finally:
            client.kill()
            client.wait()


class _Frames:
    """Whole frames off a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        from codepool.worker.engine.protocol import FrameReader

        self.sock = sock
        self.reader = FrameReader()
        self.ready: list[dict[str, object]] = []

    def next(self) -> dict[str, object]:
        while not self.ready:
            data = self.sock.recv(1 << 16)
            assert data, "the supervisor closed the connection"
            self.ready += self.reader.feed(data)
        return self.ready.pop(0)
