"""Nothing sensitive on a command line: every local user can read /proc/*/cmdline."""

from __future__ import annotations

import uuid

import pytest

from codepool.worker import LocalExecutor
from tests.conftest import command_lines


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_the_snippet_environment_is_on_no_command_line(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    given, passed = f"given-{uuid.uuid4().hex}", f"passed-{uuid.uuid4().hex}"
    monkeypatch.setenv("CODEPOOL_TEST_PASSED", passed)
    with LocalExecutor(
        concurrency=1,
        mode=mode,
        preload=(),
        env={"CODEPOOL_TEST_GIVEN": given},
        pass_env=("CODEPOOL_TEST_PASSED",),
    ) as ex:
        code = (
            "import os\ne = os.environ\nprint(e['CODEPOOL_TEST_GIVEN'], e['CODEPOOL_TEST_PASSED'])"
        )
        result = ex.run(code)
        assert result.stdout == f"{given} {passed}\n"  # both reached the snippet
        assert ex.supervisor_pid and ex.zygote_pid  # scanned while all of them live
        assert command_lines(given) == []
        assert command_lines(passed) == []
