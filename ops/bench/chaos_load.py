"""One producer process of the chaos run (ops/bench/chaos.py): it makes load of one kind
until ``--until`` (unix time) and records every call in its history file
(ops/bench/chaos_history.py). Started, killed -9 and replaced by the chaos run:

    python -m codepool.ops.bench.chaos_load ROLE --url URL --history FILE --name NAME
        --seed S --until T [--rate R] [--threads N] [--serve URL]

Roles: ``batch`` (CodePool.submit of 10-60 snippets, some batches cancel their slow
snippets part way), ``lone`` (RemoteSandbox.run_code from several threads, coalesced; some
calls are given up on), ``ctx`` (interpreter contexts with state and forks), ``http``
(SandboxFusion clients of ``codepool serve``, some of which disconnect mid-call).
"""

from __future__ import annotations

import argparse
import faulthandler
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import requests

from codepool.common.errors import CodepoolError
from codepool.common.result import ExecResult
from codepool.ops.bench.chaos_history import Recorder, cheap_snippet, slow_snippet
from codepool.producer import CodePool, RemoteSandbox
from codepool.producer.context import RemoteContext

RUN_TAG = "chaos"
TIMEOUT_S = 10.0  # every snippet's wall-clock limit: far above what it needs
CANCEL_SHARE = 0.15  # batches (and lone calls) that give something up
HTTP_GIVE_UP_S = 0.5


class Load:
    """What every role shares: the history, the clock it stops at, its random stream."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(f"{args.seed}:{args.name}")
        self.history = Recorder(Path(args.history), args.name)
        self.stopping = threading.Event()
        self._count = 0
        self._lock = threading.Lock()

    def more(self) -> bool:
        return not self.stopping.is_set() and time.time() < self.args.until

    def op_id(self, what: str) -> str:
        with self._lock:
            self._count += 1
            return f"{self.args.name}-{what}{self._count}"

    def snippet(self, rng: random.Random) -> tuple[str, str]:
        """A cheap snippet, or (a ``--sleepy`` share) one that sleeps 0.1-0.5 s first:
        work still claimed when a fault hits, for no CPU."""
        if rng.random() < self.args.sleepy:
            return slow_snippet(rng, rng.uniform(0.1, 0.5))
        return cheap_snippet(rng)

    def fork_rng(self) -> random.Random:
        with self._lock:
            return random.Random(self.rng.random())

    def raised(self, op_id: str, exc: BaseException) -> None:
        """A call that raised instead of returning a result: recorded as status
        ``raised`` (the checker reports it unless its caller gave up)."""
        self.history.outcome(op_id, "raised", "", f"{type(exc).__name__}: {exc}"[:300])

    def pace(self, started: float, snippets: int, rate: float) -> None:
        left = started + snippets / rate - time.monotonic()
        if left > 0:
            self.stopping.wait(left)

    def threads(self, body: Callable[[], None]) -> None:
        workers = [threading.Thread(target=body, daemon=True) for _ in range(self.args.threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()


def run_batches(load: Load) -> None:
    pool = CodePool(load.args.url)
    rng = load.rng
    try:
        while load.more():
            started = time.monotonic()
            n = rng.randint(10, 60)
            gives_up = rng.random() < CANCEL_SHARE
            slow = set(rng.sample(range(n), n // 4)) if gives_up else set()
            pairs = [
                slow_snippet(rng, rng.uniform(0.5, 1.5)) if i in slow else load.snippet(rng)
                for i in range(n)
            ]
            tag = load.op_id("b")
            try:
                batch = pool.submit([code for code, _ in pairs], run=RUN_TAG, timeout_s=TIMEOUT_S)
            except Exception as exc:  # any raise is a finding: recorded as one
                load.history.invoke(f"{tag}-submit", "batch", "")
                load.raised(f"{tag}-submit", exc)
                load.stopping.wait(1.0)
                continue
            for i, (_, expect) in enumerate(pairs):
                load.history.invoke(
                    f"{tag}-{i}", "batch", expect, may_cancel=i in slow, batch=batch.id, index=i
                )
            try:
                for number, (index, result) in enumerate(batch.as_completed()):
                    load.history.complete(f"{tag}-{index}", result, batch=batch.id, index=index)
                    if slow and number == 0:
                        batch.cancel(sorted(slow))
            except Exception as exc:  # any raise is a finding: recorded as one
                load.raised(f"{tag}-collect", exc)
            load.pace(started, n, load.args.rate)
    finally:
        pool.close()


def run_lone(load: Load) -> None:
    sandbox = RemoteSandbox(load.args.url, timeout=TIMEOUT_S, run=RUN_TAG)

    def caller() -> None:
        rng = load.fork_rng()
        while load.more():
            started = time.monotonic()
            op_id = load.op_id("l")
            if rng.random() < CANCEL_SHARE:
                code, expect = slow_snippet(rng, rng.uniform(0.5, 1.5))
                load.history.invoke(op_id, "lone", expect, may_cancel=True)
                future = sandbox.submit(code)
                load.stopping.wait(rng.uniform(0.1, 0.6))
                if future.cancel():
                    load.history.abandon(op_id)
                    continue
                try:
                    load.history.complete(op_id, future.result())
                except Exception as exc:  # any raise is a finding: recorded as one
                    load.raised(op_id, exc)
                continue
            code, expect = load.snippet(rng)
            load.history.invoke(op_id, "lone", expect)
            try:
                load.history.complete(op_id, sandbox.run_code(code))
            except Exception as exc:  # any raise is a finding: recorded as one
                load.raised(op_id, exc)
            load.pace(started, 1, load.args.rate / load.args.threads)

    try:
        load.threads(caller)
    finally:
        sandbox.close()


def _context_call(load: Load, context: RemoteContext, code: str, expect: str) -> ExecResult | None:
    op_id = load.op_id("c")
    load.history.invoke(op_id, "ctx", expect)
    try:
        result = context.run_code(code)
    except Exception as exc:  # any raise is a finding: recorded as one
        load.raised(op_id, exc)
        return None
    load.history.complete(op_id, result, context=context.id)
    return result


def run_contexts(load: Load) -> None:
    """Each thread: a context that adds to ``x`` and prints it, forked part way; a call
    that is not ok ends that context (the state the next one expects is unknown)."""
    pool = CodePool(load.args.url)

    def trajectory() -> None:
        rng = load.fork_rng()
        while load.more():
            started = time.monotonic()
            try:
                context = pool.context(timeout_s=TIMEOUT_S)
            except CodepoolError as exc:
                op_id = load.op_id("o")
                load.history.invoke(op_id, "ctx_open", "")
                load.raised(op_id, exc)
                load.stopping.wait(1.0)
                continue
            calls = _trajectory(load, rng, context)
            context.close()
            load.pace(started, calls, load.args.rate / load.args.threads)

    try:
        load.threads(trajectory)
    finally:
        pool.close()


def _trajectory(load: Load, rng: random.Random, context: RemoteContext) -> int:
    value = rng.randrange(1000)
    calls = 1
    first = _context_call(load, context, f"x = {value}\nprint(x)", f"{value}\n")
    if first is None or first.status != "ok":
        return calls
    for step in range(rng.randint(3, 6)):
        add = rng.randrange(1, 100)
        value += add
        calls += 1
        result = _context_call(load, context, f"x += {add}\nprint(x)", f"{value}\n")
        if result is None or result.status != "ok":
            return calls
        if step == 1:
            try:
                forks = context.fork(2)
            except CodepoolError as exc:
                op_id = load.op_id("f")
                load.history.invoke(op_id, "ctx_fork", "")
                load.raised(op_id, exc)
                continue
            for fork in forks:
                extra = rng.randrange(1, 100)
                calls += 1
                _context_call(load, fork, f"x += {extra}\nprint(x)", f"{value + extra}\n")
                fork.close()
    return calls


def run_http(load: Load) -> None:
    def client() -> None:
        rng = load.fork_rng()
        session = requests.Session()
        while load.more():
            started = time.monotonic()
            op_id = load.op_id("h")
            gives_up = rng.random() < CANCEL_SHARE * 2
            if gives_up:
                code, expect = slow_snippet(rng, rng.uniform(1.0, 2.0))
            else:
                code, expect = cheap_snippet(rng)
            load.history.invoke(op_id, "http", expect, may_cancel=gives_up)
            body: dict[str, Any] = {"code": code, "language": "python", "run_timeout": TIMEOUT_S}
            try:
                response = session.post(
                    f"{load.args.serve}/run_code",
                    json=body,
                    timeout=HTTP_GIVE_UP_S if gives_up else 300,
                )
            except requests.Timeout:
                load.history.abandon(op_id)
                session.close()  # the connection goes: serve sees the client leave
                session = requests.Session()
                continue
            except requests.RequestException as exc:
                load.raised(op_id, exc)
                continue
            _record_http(load, op_id, response)
            load.pace(started, 1, load.args.rate / load.args.threads)
        session.close()

    load.threads(client)


def _record_http(load: Load, op_id: str, response: requests.Response) -> None:
    if response.status_code != 200:
        load.history.outcome(op_id, f"http{response.status_code}", "", response.text[:300])
        return
    reply = response.json()
    run = reply.get("run_result") or {}
    if reply.get("status") == "Success":
        load.history.outcome(op_id, "ok", run.get("stdout") or "")
    elif reply.get("status") == "Failed":
        load.history.outcome(op_id, "error", run.get("stdout") or "", run.get("stderr") or "")
    else:  # SandboxError: codepool could not produce a result (infra)
        load.history.outcome(op_id, "infra", "", str(reply.get("message", ""))[:300])


ROLES: dict[str, Callable[[Load], None]] = {
    "batch": run_batches,
    "lone": run_lone,
    "ctx": run_contexts,
    "http": run_http,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--url", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--until", type=float, required=True, help="unix time to stop at")
    parser.add_argument("--rate", type=float, default=5.0, help="snippets a second")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--sleepy", type=float, default=0.1, help="share of sleeping snippets")
    parser.add_argument("--serve", default="", help="codepool serve's URL (http role)")
    args = parser.parse_args(argv)
    load = Load(args)

    def stop(signum: int, frame: FrameType | None) -> None:
        load.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    # The chaos run asks a producer that does not finish where it waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        ROLES[args.role](load)
    finally:
        load.history.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
