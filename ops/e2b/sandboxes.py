"""E2B sandboxes on the fleet's contexts: a sandbox is a family of interpreter contexts
(producer/context.py), one per code context, the default Python one first.

Everything here blocks on Redis (opening a context, a call, a fork): the routes run it
on threads (ops/e2b/routes.py). A sandbox ends when it is killed, or at its end time
(its ``timeout`` from creation, moved by ``set_timeout`` and ``connect``) once no
execution runs in it; ending it kills its contexts, calls in flight included.
"""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from codepool.common.errors import CodepoolError
from codepool.common.result import ExecResult, rejected
from codepool.ops.e2b import execution
from codepool.producer.context import KILLED, RemoteContext

if TYPE_CHECKING:
    from codepool.producer.sandbox import RemoteSandbox

log = logging.getLogger(__name__)

LANGUAGE = "python"
ENVD_VERSION = "0.2.0"  # what the SDK is told: old enough that it asks for no newer routes
DEFAULT_TIMEOUT_S = 300  # E2B's default sandbox timeout
MAX_TIMEOUT_S = 24 * 3600
MAX_FORKS = 20  # E2B's own bound on one fork request


class SandboxError(CodepoolError):
    """Raised when an E2B request cannot be served; ``status`` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class CodeContext:
    """One E2B code context: an interpreter context with the notebook installed."""

    id: str
    cwd: str
    remote: RemoteContext
    language: str = LANGUAGE
    busy: threading.Lock = field(default_factory=threading.Lock)  # its executions, in order
    used_at: float = field(default_factory=time.monotonic)  # its last execution's end

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


@dataclass
class Sandbox:
    id: str
    template: str
    env_vars: dict[str, str]
    metadata: dict[str, str]
    started_at: datetime.datetime
    end_at: float  # time.time() after which an idle sandbox ends
    contexts: dict[str, CodeContext] = field(default_factory=dict)
    default_id: str = ""
    killed: str | None = None  # why it ended
    running: int = 0  # executions in flight
    lock: threading.RLock = field(default_factory=threading.RLock)
    restarting: threading.Lock = field(default_factory=threading.Lock)  # one restart at a time

    def describe(self, *, detail: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            "templateID": self.template,
            "sandboxID": self.id,
            "clientID": "codepool",
            "envdVersion": ENVD_VERSION,
        }
        if detail:
            body.update(
                startedAt=self.started_at.isoformat(),
                endAt=datetime.datetime.fromtimestamp(self.end_at, datetime.UTC).isoformat(),
                cpuCount=1,
                memoryMB=0,
                diskSizeMB=0,
                state="running",
                metadata=self.metadata,
            )
        return body

    def context(self, context_id: str | None) -> CodeContext:
        found = self.contexts.get(context_id or self.default_id)
        if found is None:
            raise SandboxError(404, f"Context {str(context_id)[:64]} not found")
        return found


@dataclass
class Watch:
    """One execution, as its HTTP side sees it: whether its client left, and the code
    context it runs on (once it runs)."""

    left: threading.Event = field(default_factory=threading.Event)
    on: CodeContext | None = None


def timeout_of(value: Any, default: int = DEFAULT_TIMEOUT_S) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SandboxError(400, f"timeout: a whole number of seconds, got {value!r}")
    return min(value, MAX_TIMEOUT_S)


class Sandboxes:
    """The E2B sandboxes one server holds, by id (thread-safe)."""

    def __init__(self, sandbox: RemoteSandbox) -> None:
        self.pool_sandbox = sandbox
        self._held: dict[str, Sandbox] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    # -- the control plane (blocking) ------------------------------------------------

    def create(
        self, *, template: str, timeout_s: int, env_vars: dict[str, str], metadata: dict[str, str]
    ) -> Sandbox:
        sandbox = Sandbox(
            id="i" + secrets.token_hex(10),
            template=template,
            env_vars=env_vars,
            metadata=metadata,
            started_at=datetime.datetime.now(datetime.UTC),
            end_at=time.time() + timeout_s,
        )
        first = self._open(sandbox, None)
        sandbox.contexts[first.id] = first
        sandbox.default_id = first.id
        with self._lock:
            self._held[sandbox.id] = sandbox
        log.debug("e2b sandbox %s created", sandbox.id)
        return sandbox

    def get(self, sandbox_id: str | None) -> Sandbox:
        """A live sandbox; 502 (E2B's answer for a sandbox gone) when none."""
        sandbox = self._held.get(sandbox_id or "")
        if sandbox is None or sandbox.killed is not None:
            raise SandboxError(502, f"The sandbox {str(sandbox_id)[:64]} was not found")
        return sandbox

    def find(self, sandbox_id: str) -> Sandbox:
        """A live sandbox; 404 when none (the control plane's answer)."""
        try:
            return self.get(sandbox_id)
        except SandboxError:
            raise SandboxError(404, f"Sandbox {sandbox_id[:64]} not found") from None

    def kill(self, sandbox_id: str, why: str = "killed") -> bool:
        with self._lock:
            sandbox = self._held.pop(sandbox_id, None)
        if sandbox is None or sandbox.killed is not None:
            return False
        with sandbox.lock:
            sandbox.killed = why
            contexts = list(sandbox.contexts.values())
        for context in contexts:
            context.remote.kill()
        log.debug("e2b sandbox %s ended: %s", sandbox_id, why)
        return True

    def expired(self) -> list[str]:
        """The sandboxes past their end time with no execution running."""
        now = time.time()
        return [
            key for key, held in list(self._held.items()) if held.end_at < now and not held.running
        ]

    def keep_alive(self) -> None:
        """Touch the code contexts idle for a third of their host's idle TTL (blocking):
        a sandbox's end time, not its hosts' TTL, ends it while serve holds it (serve
        gone, the TTL ends its contexts as any)."""
        now = time.monotonic()
        for sandbox in list(self._held.values()):
            for context in list(sandbox.contexts.values()):
                idle_s = now - context.used_at
                if idle_s < context.remote.ttl_s / 3 or not context.busy.acquire(blocking=False):
                    continue
                try:
                    if sandbox.killed is None and context.remote.ended is None:
                        context.remote.run_code("pass")
                        context.used_at = time.monotonic()
                except Exception as exc:  # Redis away: the next round tries again
                    log.warning(
                        "e2b sandbox %s: keeping a context alive failed: %s", sandbox.id, exc
                    )
                finally:
                    context.busy.release()

    def kill_all(self) -> None:
        for sandbox_id in list(self._held):
            self.kill(sandbox_id, "serve stopped")

    def fork(self, parent: Sandbox, count: int, timeout_s: int) -> list[Sandbox]:
        """``count`` sandboxes, each holding a copy-on-write fork of each of ``parent``'s
        code contexts now (same code context ids)."""
        with parent.lock:
            contexts = list(parent.contexts.values())
        copies: dict[str, list[RemoteContext]] = {}
        try:
            for context in contexts:
                copies[context.id] = context.remote.fork(count)
        except CodepoolError as exc:
            for made in copies.values():
                for remote in made:
                    remote.close()
            raise SandboxError(503, f"cannot fork: {exc}") from None
        forks = []
        for number in range(count):
            sandbox = Sandbox(
                id="i" + secrets.token_hex(10),
                template=parent.template,
                env_vars=dict(parent.env_vars),
                metadata=dict(parent.metadata),
                started_at=datetime.datetime.now(datetime.UTC),
                end_at=time.time() + timeout_s,
                default_id=parent.default_id,
            )
            for context in contexts:
                remote = copies[context.id][number]
                sandbox.contexts[context.id] = CodeContext(context.id, context.cwd, remote)
            forks.append(sandbox)
        with self._lock:
            self._held.update((sandbox.id, sandbox) for sandbox in forks)
        return forks

    # -- code contexts (blocking) ------------------------------------------------------

    def execute(
        self,
        sandbox: Sandbox,
        context: CodeContext,
        code: str,
        env_vars: dict[str, str] | None,
        watch: Watch,
    ) -> list[dict[str, Any]]:
        """Run ``code`` in ``context``; its E2B events. A context the execution ended (its
        timeout, memory) is restarted and the events say so; SandboxError(502) when the
        sandbox was killed meanwhile. A call refused because its context had been
        killed (it never ran: a client before it left) is made again on the fresh one,
        unless this execution's own client has left too (``watch``)."""
        events = None
        for _ in range(2):
            with context.busy:  # after the execution before it, which may end it
                if context.remote.ended is not None:
                    self.restart_context(sandbox, context.id, old=context)
                    context = sandbox.context(context.id)
            with context.busy:
                if watch.left.is_set():
                    return []
                watch.on = context
                try:
                    events = self._execute(sandbox, context, code, env_vars)
                finally:
                    context.used_at = time.monotonic()
            if events is not None or watch.left.is_set():
                break
        return events or ended_events(rejected("the context was killed"), 0.0)

    def leave(self, sandbox: Sandbox, watch: Watch) -> None:
        """The execution's client left: end it with its context's interpreter, and put a
        fresh one in its place (blocking)."""
        watch.left.set()
        context = watch.on
        if context is None:
            return  # it has not started, and now it will not
        context.remote.kill()
        self.restart_context(sandbox, context.id, old=context)

    def _execute(
        self, sandbox: Sandbox, context: CodeContext, code: str, env_vars: dict[str, str] | None
    ) -> list[dict[str, Any]] | None:
        """The events; None when the call was refused because the context had ended."""
        remote = context.remote
        piece = execution.piece_chars(remote.limits)
        nonce = execution.new_nonce()
        result = remote.run_code(execution.run_call(code, env_vars, nonce, piece))
        got = execution.read_piece(result, nonce)
        if sandbox.killed is not None:
            raise SandboxError(502, f"The sandbox {sandbox.id} was killed: {sandbox.killed}")
        if got is None:
            if result.status == "rejected" and remote.ended == KILLED:
                return None  # it never ran: the context was killed before it
            timeout_s = float(remote.limits.get("timeout_s", 30.0))
            if remote.ended is not None and sandbox.contexts.get(context.id) is context:
                self.restart_context(sandbox, context.id, old=context)
            return ended_events(result, timeout_s)
        payload = got.text
        while len(payload) < got.total:
            more = remote.run_code(execution.more_call(nonce, len(payload), piece))
            next_piece = execution.read_piece(more, nonce)
            if next_piece is None or not next_piece.text:
                break
            payload += next_piece.text
        return execution.events_of(payload, got.raw, result.stderr)

    def open_context(self, sandbox: Sandbox, cwd: str | None) -> CodeContext:
        context = self._open(sandbox, cwd)
        with sandbox.lock:
            if sandbox.killed is not None:
                context.remote.kill()
                raise SandboxError(502, f"The sandbox {sandbox.id} was killed")
            sandbox.contexts[context.id] = context
        return context

    def remove_context(self, sandbox: Sandbox, context_id: str) -> None:
        with sandbox.lock:
            context = sandbox.contexts.pop(context_id, None)
        if context is None:
            raise SandboxError(404, f"Context {context_id[:64]} not found")
        context.remote.kill()

    def restart_context(
        self, sandbox: Sandbox, context_id: str, *, old: CodeContext | None = None
    ) -> None:
        """The context's interpreter replaced by a fresh one, same id and cwd (with
        ``old``: only if that one is still in place, so a restart is never done twice)."""
        with sandbox.restarting:
            current = sandbox.context(context_id)
            if old is not None and current is not old:
                return  # replaced meanwhile
            fresh = self._open(sandbox, current.cwd, context_id=current.id)
            with sandbox.lock:
                if sandbox.killed is None and sandbox.contexts.get(current.id) is current:
                    sandbox.contexts[current.id] = fresh
                    current.remote.kill()
                    return
            fresh.remote.kill()

    def _open(self, sandbox: Sandbox, cwd: str | None, *, context_id: str = "") -> CodeContext:
        remote = self.pool_sandbox.context()
        try:
            result = remote.run_code(execution.install_code(sandbox.env_vars, cwd))
            told = _told(result)
        except BaseException:
            remote.kill()
            raise
        if told is None:
            remote.kill()
            raise SandboxError(500, f"the notebook did not start: {_why(result)}")
        context_id = context_id or secrets.token_hex(8)
        return CodeContext(context_id, str(told.get("cwd") or ""), remote)


def _told(result: ExecResult) -> dict[str, Any] | None:
    if result.status != "ok":
        return None
    try:
        told = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return told if isinstance(told, dict) else None


def _why(result: ExecResult) -> str:
    return (result.stderr or result.stdout or result.status)[-500:]


def ended_events(result: ExecResult, timeout_s: float) -> list[dict[str, Any]]:
    """The events of an execution whose context ended under it (a limit, its TTL)."""
    if result.status == "timeout":
        name, value = "TimeoutError", f"the execution ran past its timeout of {timeout_s:g} s"
    elif result.status == "memory":
        name, value = "MemoryError", "the execution ran out of memory"
    else:
        name, value = "SandboxError", _why(result).strip() or result.status
    value += "; the context was restarted (its state is lost)"
    return [execution.error_event(name, value)]
