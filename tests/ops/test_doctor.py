"""`codepool doctor` reports each protection and what a snippet really meets."""

from __future__ import annotations

import subprocess
import sys


def test_doctor_cli_reports_every_protection() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "codepool.ops.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in (
        "network",
        "filesystem",
        "interpreter paths",
        "uid",
        "processes",
        "landlock",
        "probe: network",
        "probe: udp",
        "probe: abstract socket",
        "probe: host files",
        "probe: parent",
        "probe: uid",
        "probe: secrets",
    ):
        assert any(line.startswith("[ok] " + name) for line in proc.stdout.splitlines()), name
    assert "all protections active" in proc.stdout
