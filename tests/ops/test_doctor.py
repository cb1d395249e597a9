"""`codepool doctor` reports each protection and what a snippet really meets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from codepool.ops import doctor


def test_doctor_cli_reports_every_protection() -> None:
    """As root, every protection; as non-root, all but a uid per snippet, which is a
    warning (`[--]`), not a failure: doctor still exits 0."""
    root = os.geteuid() == 0
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
        *(["uid"] if root else []),
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
    if root:
        assert "all protections active" in proc.stdout
    else:
        assert any(line.startswith("[--] uid") for line in proc.stdout.splitlines())
        assert "all protections this environment can give are active" in proc.stdout
    assert "[!!]" not in proc.stdout
    assert "embedded Redis: " in proc.stdout  # which server binary replay would run


def test_the_probes_fail_where_the_layers_are_off_and_doctor_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without namespaces and without the second layer, a snippet reaches doctor's own
    listeners: the probes must say so, and doctor must fail."""
    real = doctor.diagnose

    def weak(mode: str, preload: tuple[str, ...], **_: object) -> list[dict[str, object]]:
        return real(mode, preload, allow_weak_isolation=True, namespaces=False, landlock=False)

    lines = weak("fork", ())
    active = {str(line["name"]): line["active"] for line in lines}
    for probe in ("probe: network", "probe: udp", "probe: abstract socket"):
        assert active[probe] is False, (probe, lines)
    monkeypatch.setattr(doctor, "diagnose", weak)
    assert doctor.main("fork", ()) == 1
    assert "[!!] probe: network" in capsys.readouterr().out
