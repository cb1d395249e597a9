"""Every Redis key codepool uses, built in one place (DESIGN §5)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "codepool:"
DEFAULT_QUEUE = "codepool"


@dataclass(frozen=True)
class Keys:
    """Key names under ``prefix`` (default ``codepool:``)."""

    prefix: str = DEFAULT_PREFIX

    def batch_results(self, batch_id: str) -> str:
        """Hash: snippet index -> msgpack ExecResult, first write wins."""
        return f"{self.prefix}batch:{batch_id}:results"

    def batch_done(self, batch_id: str) -> str:
        """List: snippet indices in completion order."""
        return f"{self.prefix}batch:{batch_id}:done"

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
