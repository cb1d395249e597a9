"""``POST /run_tests`` on a real ``codepool serve``: cases or verl's ground truth in,
verdicts out, 4xx for malformed bodies; and, where verl's source is at hand
(tests/verl_source.py), verl's own ``sandbox_fusion`` reward, pointed at serve's
``/run_code``, gives the scores codepool's ``compute_score`` gives."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from codepool.common.reaping import wait_or_kill
from tests.ops.test_serve import Serve, post, start_serve
from tests.producer.test_verl_reward import SCORED
from tests.verl_source import verl_module


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    server = start_serve(tmp_path_factory.mktemp("serve") / "serve.log")
    yield server
    server.process.send_signal(signal.SIGTERM)
    wait_or_kill(server.process, 30)


def test_cases_in_verdicts_out(serve: Serve) -> None:
    body = {
        "candidate": "def add(a, b):\n    return a + b\n",
        "cases": [
            {"code": "assert add(1, 2) == 3"},
            {"code": "assert add(1, 2) == 4"},
            {"code": "print(add(1, 1))", "expected_stdout": "2"},
            {"code": "while True: pass"},
        ],
        "timeout_s": 1,
    }
    answer = post(serve, "/run_tests", body)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert [r["verdict"] for r in got["results"]] == ["passed", "error", "passed", "timeout"]
    assert got["passed"] == 2 and got["total"] == 4
    assert all(r["forked"] for r in got["results"])
    assert "AssertionError" in got["results"][1]["stderr"]


def test_ground_truth_in_verdicts_out(serve: Serve) -> None:
    body = {
        "candidate": "a, b = map(int, input().split())\nprint(a + b)\n",
        "ground_truth": {"inputs": ["1 2\n", "2 2\n"], "outputs": ["3", "5"]},
    }
    got = post(serve, "/run_tests", body).json()
    assert [r["verdict"] for r in got["results"]] == ["passed", "wrong_answer"]


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"candidate": 1, "cases": []},
        {"candidate": "", "cases": [], "ground_truth": {}},
        {"candidate": ""},
        {"candidate": "", "cases": [{"code": 1}]},
        {"candidate": "", "cases": [{"stdin": 1}]},
        {"candidate": "", "cases": [{"what": ""}]},
        {"candidate": "", "cases": [], "timeout_s": -1},
        {"candidate": "", "cases": [], "memory_mb": "a lot"},
        {"candidate": "", "ground_truth": {"inputs": [1]}},
        {"candidate": "", "cases": [], "extra": 1},
    ],
)
def test_malformed_bodies_get_a_400_with_a_reason(serve: Serve, body: Any) -> None:
    answer = post(serve, "/run_tests", body)
    assert answer.status_code == 400
    assert answer.json()["detail"]


def test_verl_scores_match_through_serve(serve: Serve) -> None:
    verl_reward = verl_module("verl.utils.reward_score.sandbox_fusion")
    if verl_reward is None:
        pytest.skip("verl is not installed (pip install codepool[verl], or CODEPOOL_VERL_SRC)")
    for solution, truth, score in SCORED:
        theirs, _ = verl_reward.compute_score(
            f"{serve.url}/run_code", None, 1024, solution, truth, continuous=True, timeout=5
        )
        code = solution.split("```python")[-1].split("```")[0] if "```" in solution else None
        ours = 0.0
        if code is not None and isinstance(truth, (dict, str)):
            answer = post(
                serve, "/run_tests", {"candidate": code, "ground_truth": truth, "timeout_s": 5}
            )
            if answer.status_code == 200:
                ours = answer.json()["passed"] / max(1, min(10, answer.json()["total"]))
        assert theirs == pytest.approx(score) == pytest.approx(ours), solution
