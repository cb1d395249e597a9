"""verl's custom reward (producer/verl_reward.py) and the ground-truth formats
(common/case_formats.py) through Redis and a real worker: assert, stdin/stdout and
call-based ground truth score as one plain run per case scores them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from codepool.common.case_formats import sandbox_fusion_cases
from codepool.common.errors import ConfigError
from codepool.common.reward_tests import judge, program
from codepool.producer import RemoteSandbox
from codepool.producer.verl_reward import compute_score, extract_code
from tests.conftest import StartWorker

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
SUM = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\ndone"
TWO_SUM = """```python
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, n in enumerate(nums):
            if target - n in seen:
                return [seen[target - n], i]
            seen[n] = i
```"""
# (solution, ground truth, the score verl's sandbox_fusion reward gives it)
SCORED: list[tuple[str, Any, float]] = [
    (ADD, {"assert_case": ["assert add(1, 2) == 3", "assert add(0, 0) == 1"]}, 0.5),
    (SUM, {"inputs": ["1 2\n", "3 4\n", "0 0"], "outputs": ["3\n", "8", "0"]}, 2 / 3),
    (
        TWO_SUM,
        json.dumps(
            {
                "fn_name": "twoSum",
                "inputs": ["[2,7,11,15]\n9", "[3,2,4]\n6", "[1]\n5"],
                "outputs": ["[0, 1]", "[1, 2]", "null"],
            }
        ),
        1.0,
    ),
    (
        "```python\ndef twoSum(a, t):\n    return sqrt(t)\n```",
        {"fn_name": "twoSum", "inputs": ["[1]\n16"], "outputs": ["4.0"]},
        1.0,
    ),  # math, unimported
    (ADD.replace("a + b", "a +"), {"assert_case": ["assert add(1, 2) == 3"]}, 0.0),
    ("no code here", {"assert_case": ["assert True"]}, 0.0),
    (ADD, {"inputs": [1]}, 0.0),  # malformed
    (ADD, {"inputs": [], "outputs": []}, 0.0),
]


def test_extract_code_as_verl_does() -> None:
    assert extract_code("a ```python\nx = 1\n``` b ```python\ny = 2\n```") == "\ny = 2\n"
    assert extract_code("```\nx = 1\n```") == "\nx = 1\n"
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("```py3\nx = 1\n```") == "py3\nx = 1\n"  # not a word: kept
    assert extract_code("x = 1") is None


def test_scores_are_those_of_one_plain_run_per_case(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    with RemoteSandbox(redis_url, timeout=10) as sandbox:
        for solution, truth, score in SCORED:
            assert compute_score(
                "apps", solution, truth, None, sandbox=sandbox, timeout=5
            ) == pytest.approx(score), solution
            code = extract_code(solution)
            if code is None:
                continue
            try:
                prefix, cases = sandbox_fusion_cases(truth)
            except ConfigError:
                continue
            if not cases:
                continue
            plain = [
                judge(c, sandbox.run_code(program(code, c, prefix), stdin=c.stdin, timeout_s=5))
                for c in cases
            ]
            assert sum(v == "passed" for v in plain) / len(cases) == pytest.approx(score)


def test_continuous_scores_the_first_ten_cases(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    truth = {"assert_case": ["assert add(1, 1) == 2"] * 10 + ["assert False"] * 2}
    with RemoteSandbox(redis_url, timeout=10) as sandbox:
        assert compute_score("apps", ADD, truth, sandbox=sandbox) == 1.0
        assert compute_score(
            "apps", ADD, truth, sandbox=sandbox, continuous=False
        ) == pytest.approx(10 / 12)


def test_malformed_ground_truth_is_a_clear_error() -> None:
    for bad in (
        "{",
        [1],
        {"inputs": [1]},
        {"inputs": [1], "outputs": []},
        {"assert_case": [1]},
        {"fn_name": "not a name", "inputs": [], "outputs": []},
    ):
        with pytest.raises(ConfigError):
            sandbox_fusion_cases(bad)
