"""Every Redis key codepool uses, built in one place."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "codepool:"
DEFAULT_QUEUE = "codepool"


@dataclass(frozen=True)
class Keys:
    """Key names under ``prefix`` (default ``codepool:``)."""

    prefix: str = DEFAULT_PREFIX

    def batch_results(self, batch_id: str) -> str:
        """Hash: snippet index -> msgpack ExecResult, first write wins (a cancelled
        index holds its cancellation, status ``cancelled``)."""
        return f"{self.prefix}batch:{batch_id}:results"

    def batch_done(self, batch_id: str) -> str:
        """List: msgpack ``[index, ExecResult]`` per first write, in completion order."""
        return f"{self.prefix}batch:{batch_id}:done"

    def batch_state(self, batch_id: str) -> str:
        """Hash: the batch as submitted (``n``, ``run``, ``reruns``; the codes are
        ``batch_spec``), the next
        unclaimed index (``next``), the claims (``c:{id}`` -> ``owner|indices``), how
        many released indices wait (``retry``), per re-run index its lapses
        (``r{i}``), and how many of its indices were cancelled (``cancelled``)."""
        return f"{self.prefix}batch:{batch_id}:state"

    def batch_spec(self, batch_id: str) -> str:
        """String: the batch as submitted (msgpack ``BatchJob``), apart from its state
        hash so that the scripts that walk the state (a release, a cancellation) never
        copy it (a batch stored before it lived here keeps it as the state's ``spec``)."""
        return f"{self.prefix}batch:{batch_id}:spec"

    def batch_retry(self, batch_id: str) -> str:
        """List: indices released from lapsed claims, claimed again before fresh ones."""
        return f"{self.prefix}batch:{batch_id}:retry"

    def leases(self) -> str:
        """Sorted set: registered dispatcher -> when it registered (Redis server time,
        s); its lease is its worker host's (``hosts``). Fenced ones have left it."""
        return f"{self.prefix}leases"

    def host_owners(self, host: str) -> str:
        """Set: the dispatchers registered under a worker host's lease."""
        return f"{self.prefix}host:{host}:owners"

    def host_start(self, host: str) -> str:
        """String: worker host ``host``'s latest lease (``host~{token}``, a token per
        start, ``.N`` after N losses): the next start under the same name fences that
        lease at once (a week's TTL, set by each lease)."""
        return f"{self.prefix}host:{host}:start"

    def host_slots(self) -> str:
        """Hash: worker host (its lease's name) -> the slots it registered."""
        return f"{self.prefix}host_slots"

    def fleet(self) -> str:
        """Hash: ``slots``, the sum of ``host_slots`` (what batches are announced by)."""
        return f"{self.prefix}fleet"

    def context(self, context_id: str) -> str:
        """Hash: an interpreter context of the fleet: ``host`` (the worker host it lives
        on), ``ttl`` (seconds); expires when idle that long (each call renews it)."""
        return f"{self.prefix}ctx:{context_id}"

    def host_requests(self, host: str) -> str:
        """List: msgpack requests for the interpreter contexts a worker host holds
        (open, run, fork, close), oldest first; its context server pops them."""
        return f"{self.prefix}host:{host}:requests"

    def context_reply(self, request_id: str) -> str:
        """List: the one msgpack reply to a context request (expires in a minute)."""
        return f"{self.prefix}reply:{request_id}"

    def calls(self) -> str:
        """List: lone calls waiting for a worker host with a free slot (msgpack
        ``common/lone_calls.py`` records, oldest first); every host's call server pops it."""
        return f"{self.prefix}calls"

    def host_calls(self, start: str) -> str:
        """List: the lone calls a worker host's start (``host~{token}``) took and has
        not answered yet; a janitor puts them back on ``calls`` when it fences any lease
        of that start."""
        return f"{self.prefix}host:{start}:calls"

    def host_call_counts(self, start: str) -> str:
        """List: what a worker host's start's lone-call replies add to the counters,
        pushed with the replies and not yet folded in (common/lone_counts.py)."""
        return f"{self.prefix}host:{start}:call-counts"

    def inbox(self, producer: str) -> str:
        """List: replies to one producer's lone calls (msgpack ``[call id, result]``),
        popped by its one reader thread; expires when nobody reads it."""
        return f"{self.prefix}inbox:{producer}"

    def calls_cancel_channel(self) -> str:
        """Pub/sub channel: the id of a lone call its caller gave up on; the host
        running it kills it."""
        return f"{self.prefix}calls:cancel"

    def fenced(self) -> str:
        """Sorted set: worker host or dispatcher -> when a janitor fenced it (Redis
        server time, s), until its work is released."""
        return f"{self.prefix}fenced"

    def hosts(self) -> str:
        """Sorted set: worker host -> its last beat (Redis server time, s): its lease
        and its dispatchers', and the live hosts a batch is announced to."""
        return f"{self.prefix}hosts"

    def open_batches(self) -> str:
        """Sorted set: batches with work nobody has claimed yet -> when they were stored
        (Redis server time, s): what a dispatcher joins before it first waits on the
        queue (announcements were sized by the hosts live before it)."""
        return f"{self.prefix}open"

    def owner_batches(self, owner: str) -> str:
        """Set: the batches a dispatcher has claimed work in."""
        return f"{self.prefix}owner:{owner}:batches"

    def producers(self) -> str:
        """Sorted set: producer -> last heartbeat (Redis server time, s), while it has
        batches in flight: a producer silent for a lease has its batches cancelled."""
        return f"{self.prefix}producers"

    def producer_batches(self, producer: str) -> str:
        """Set: the batches a producer has in flight (submitted, not all collected)."""
        return f"{self.prefix}producer:{producer}:batches"

    def cancel_channel(self, dispatcher: str) -> str:
        """Pub/sub channel: ``{batch_id}|all`` or ``{batch_id}|i,j,...`` for every
        cancellation in a batch the dispatcher holds claims in (``ledger.CANCEL``
        publishes it; ``dispatcher=""`` gives the prefix the script appends to)."""
        return f"{self.prefix}cancel:{dispatcher}"

    def stats(self) -> str:
        """Hash: cluster-wide counters."""
        return f"{self.prefix}stats"

    def worker_stats(self, worker: str) -> str:
        """Hash: one worker host's counters plus its heartbeat fields."""
        return f"{self.prefix}stats:worker:{worker}"

    def run_stats(self, run: str) -> str:
        """Hash: counters of one run tag (a training run or step)."""
        return f"{self.prefix}stats:run:{run}"

    def minute_stats(self, epoch_minute: int) -> str:
        """Hash: counters of one wall-clock minute (expiring)."""
        return f"{self.prefix}stats:minute:{epoch_minute}"

    def workers(self) -> str:
        """Sorted set: worker host name -> last heartbeat (unix seconds)."""
        return f"{self.prefix}workers"
