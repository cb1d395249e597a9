"""Every command that takes --url takes a Sentinel URL; a bad one is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from codepool.ops.cli import build_parser

URL = "redis+sentinel://codepool:secret@10.0.0.1:26379,10.0.0.2:26379/mymaster/0"


@pytest.mark.parametrize(
    "command",
    [
        ["worker"],
        ["serve"],
        ["replay", "rollouts.jsonl", "-o", "out.jsonl"],
        ["stats"],
        ["doctor"],
        ["exporter", "--port", "9000"],
    ],
)
def test_each_command_takes_a_sentinel_url(command: list[str]) -> None:
    args = build_parser().parse_args([*command, "--url", URL])
    assert args.url == URL


def test_a_bad_sentinel_url_is_one_line_not_a_traceback() -> None:
    bad = "redis+sentinel://codepool:secret@10.0.0.1:26379"  # no service
    done = subprocess.run(
        [sys.executable, "-m", "codepool.ops.cli", "stats", "--url", bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "name the service" in done.stderr and "Traceback" not in done.stderr
    assert "secret" not in done.stderr + done.stdout
