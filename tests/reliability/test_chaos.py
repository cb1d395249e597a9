"""The chaos run's short form (ops/bench/chaos.py, docs/chaos.md): a minute of mixed load
on two hosts under a fixed seed's faults, then its checker over the history, Redis and
/proc. Every violation it prints is a finding; the full run is 30 minutes, every kind."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from codepool.ops.bench import chaos

SEED = 30
# The fault kinds the short form draws from. Each of the others has a finding open on
# today's code (docs/chaos.md, "Findings"); its owner adds it here with the fix.
KINDS = ("host_kill", "dispatcher_kill", "zygote_kill", "producer_kill", "client_disconnect")
# Violations of findings open on today's code (docs/chaos.md, "Findings"), let through
# here until their fixes land (none now: finding 5's lone counters ride with the replies).
OPEN_FINDINGS: tuple[str, ...] = ()


@pytest.mark.timeout(360)
def test_a_short_chaos_run_keeps_every_call_exactly_once(tmp_path: Path) -> None:
    args = chaos.parse(
        [
            "--minutes",
            "1",
            "--seed",
            str(SEED),
            "--hosts",
            "2",
            "--rate",
            "0.25",
            "--sleepy",
            "0.5",
            "--interval",
            "5",
            "--kinds",
            ",".join(KINDS),
            "--dir",
            str(tmp_path),
        ]
    )
    report = chaos.run(args)
    violations = [v for v in report.violations if not any(f in v for f in OPEN_FINDINGS)]
    assert violations == [], f"see {tmp_path}"
    faults = Counter(report.figures["faults"])
    assert set(faults) == set(KINDS) and min(faults.values()) >= 2, faults
    assert report.figures["snippets"] >= 300, report.figures
