"""The processes of the fork harness (common/fork_harness.py): how a case's process is
wired, watched, ended and reported. Its source goes into the harness snippet ahead of
fork_harness.py's (common/reward_tests.py), so it too uses the standard library alone,
and only modules a worker's zygote has loaded (where the snippet's uid cannot read the
interpreter's own files, nothing else imports: hashlib has a fallback).
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import socket
import sys
import time
import types
from typing import Any

try:
    import hashlib
except ImportError:  # pragma: no cover - only where the sandbox cannot read it
    hashlib = None  # type: ignore[assignment]

CHUNK = 1 << 16

DIGEST_TAG = b"codepool-case"


def digest(line: bytes) -> str:
    """What the harness prints for a result line (``line`` with its newline)."""
    if hashlib is None:  # pragma: no cover
        return _sha256(line)[:32]
    return hashlib.sha256(line).hexdigest()[:32]


class _NeedsStdin(BaseException):
    """Raised in the template when the program touches stdin while it loads."""


class _StdinGuard:
    touched = False

    def __getattr__(self, name: str) -> Any:
        _StdinGuard.touched = True
        raise _NeedsStdin("stdin is read while the program loads")


def _fresh_main() -> dict[str, Any]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    return main.__dict__


def _finish(code_obj: Any, namespace: dict[str, Any]) -> None:
    """Run ``code_obj`` in ``namespace`` and end the process as ``python -c`` would."""
    status = 0
    try:
        exec(code_obj, namespace)
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:  # the program's: printed as Python prints it
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        status = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 120
    os._exit(status)


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


class _Children:
    """The harness's children, reaped with whatever became its child meanwhile (the
    harness is the snippet's first process: orphans come to it)."""

    def __init__(self) -> None:
        self.ended: dict[int, int] = {}

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.ended[pid] = status

    def wait(self, pid: int, timeout_s: float) -> int | None:
        """The wait status of child ``pid``, or None if it runs past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = -1
        try:
            while True:
                self.reap()
                if pid in self.ended:
                    return self.ended.pop(pid)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if pidfd >= 0:
                    select.select([pidfd], [], [], left)
                else:
                    time.sleep(min(left, 0.002))
        finally:
            if pidfd >= 0:
                os.close(pidfd)


def _own_group() -> None:
    """A process group of its own, where the sandbox allows it (its kill takes what the
    test started; else the snippet's end does)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _status_fields(status: int | None) -> dict[str, Any]:
    if status is None:
        return {"rc": None, "sig": None, "timed_out": True}
    if os.WIFSIGNALED(status):
        return {"rc": -os.WTERMSIG(status), "sig": os.WTERMSIG(status), "timed_out": False}
    return {"rc": os.waitstatus_to_exitcode(status), "sig": None, "timed_out": False}


class _Tail:
    """The last ``keep`` bytes of a stream (after ``start``'s), and its whole size."""

    def __init__(self, keep: int, start: _Tail | None = None) -> None:
        self.keep = keep
        self.data: bytearray = bytearray(start.data if start else b"")
        self.total: int = start.total if start else 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data += chunk
        if len(self.data) > 2 * self.keep:
            del self.data[: len(self.data) - self.keep]

    def text(self) -> str:
        """As latin-1 text for JSON; the client decodes it."""
        return bytes(self.data[-self.keep :]).decode("latin-1")


class _Control:
    """The harness's end of its socket to a template: what the template said so far
    ("R" loaded; "P i pid" forked case i; "E i status" case i ended)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.ready = False
        self.gone = False
        self.said: dict[tuple[bytes, int], int] = {}

    def poll(self) -> None:
        while not self.gone:
            try:
                data = self.sock.recv(64)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.gone = True
                return
            words = data.split()
            if words == [b"R"]:
                self.ready = True
            elif len(words) == 3 and words[0] in (b"P", b"E"):
                try:
                    self.said[(words[0], int(words[1]))] = int(words[2])
                except ValueError:
                    pass


def _wire(stdin_fd: int, out_fd: int, err_fd: int, keep: int = -1) -> None:
    """In a fresh child, before any user code: fds 0-2 the case's, every other fd (the
    harness's stdout, its pipes and sockets) closed but ``keep``."""
    for target, fd in ((0, stdin_fd), (1, out_fd), (2, err_fd)):
        os.dup2(fd, target)
    if keep >= 3:
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 20)
    else:
        os.closerange(3, 1 << 20)


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _is_case(pid: Any, parents: tuple[int, ...]) -> bool:
    """Whether ``pid`` (as a template reported it) is a child of ``parents``: never the
    harness, its group or anything above it."""
    if not isinstance(pid, int) or pid <= 1 or pid in (os.getpid(), os.getpgrp()):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1]) in parents
    except (OSError, ValueError, IndexError):
        return False


def _still_running() -> bool:
    """Whether a load left code of its own running in the template: a thread, or an
    interval timer (its handler would run between cases). Such a program makes no
    template (its cases run plain) rather than spend several cases' time on one."""
    timers = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
    if any(signal.getitimer(timer) != (0.0, 0.0) for timer in timers):
        return True
    try:
        return len(os.listdir("/proc/self/task")) > 1
    except OSError:
        return False


def _end_descendants() -> None:
    """Kill and reap every process below the harness (orphans come to it: it is their
    subreaper), until it has no child left."""
    me = os.getpid()
    give_up = time.monotonic() + 5.0
    while time.monotonic() < give_up:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        try:
            with open(f"/proc/{me}/task/{me}/children", "rb") as f:
                pids = [int(word) for word in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)


def _publish(path: str, data: bytes) -> None:
    """The results file, made anew (whatever a test left at its path is removed)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


_K = [
    int(x, 16)
    for x in (
        "428a2f98 71374491 b5c0fbcf e9b5dba5 3956c25b 59f111f1 923f82a4 ab1c5ed5 d807aa98 12835b01 "
        "243185be 550c7dc3 72be5d74 80deb1fe 9bdc06a7 c19bf174 e49b69c1 efbe4786 0fc19dc6 240ca1cc "
        "2de92c6f 4a7484aa 5cb0a9dc 76f988da 983e5152 a831c66d b00327c8 bf597fc7 c6e00bf3 d5a79147 "
        "06ca6351 14292967 27b70a85 2e1b2138 4d2c6dfc 53380d13 650a7354 766a0abb 81c2c92e 92722c85 "
        "a2bfe8a1 a81a664b c24b8b70 c76c51a3 d192e819 d6990624 f40e3585 106aa070 19a4c116 1e376c08 "
        "2748774c 34b0bcb5 391c0cb3 4ed8aa4a 5b9cca4f 682e6ff3 748f82ee 78a5636f 84c87814 8cc70208 "
        "90befffa a4506ceb bef9a3f7 c67178f2"
    ).split()
]


def _sha256(data: bytes) -> str:
    """SHA-256 (FIPS 180-4) where hashlib does not import."""
    h = [
        0x6A09E667,
        0xBB67AE85,
        0x3C6EF372,
        0xA54FF53A,
        0x510E527F,
        0x9B05688C,
        0x1F83D9AB,
        0x5BE0CD19,
    ]
    data = data + b"\x80" + b"\0" * ((55 - len(data)) % 64) + (len(data) * 8).to_bytes(8, "big")
    mask = 0xFFFFFFFF

    def ror(x: int, n: int) -> int:
        return (x >> n | x << (32 - n)) & mask

    for start in range(0, len(data), 64):
        w = [int.from_bytes(data[start + 4 * j : start + 4 * j + 4], "big") for j in range(16)]
        for j in range(16, 64):
            s0 = ror(w[j - 15], 7) ^ ror(w[j - 15], 18) ^ w[j - 15] >> 3
            s1 = ror(w[j - 2], 17) ^ ror(w[j - 2], 19) ^ w[j - 2] >> 10
            w.append((w[j - 16] + s0 + w[j - 7] + s1) & mask)
        a, b, c, d, e, f, g, k = h
        for j in range(64):
            t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + (e & f ^ ~e & g) + _K[j] + w[j]
            t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + (a & b ^ a & c ^ b & c)
            a, b, c, d, e, f, g, k = (t1 + t2) & mask, a, b, c, (d + t1) & mask, e, f, g
        h = [(x + y) & mask for x, y in zip(h, (a, b, c, d, e, f, g, k), strict=True)]
    return b"".join(x.to_bytes(4, "big") for x in h).hex()
