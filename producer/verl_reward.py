"""verl's custom reward function for code, on codepool: ``compute_score(data_source,
solution_str, ground_truth, extra_info)``, the signature verl's
``custom_reward_function`` names, with the scores of verl's own ``sandbox_fusion``
reward for the same ground truth (``inputs``/``outputs``, optional ``fn_name`` and
``assert_case``), but each candidate loaded once and forked per test case
(``RemoteSandbox.run_tests``).

In verl's config::

    custom_reward_function:
      path: /path/to/site-packages/codepool/producer/verl_reward.py   # or a file importing it
      name: compute_score
      reward_kwargs:
        redis_url: redis://pool-host:6379/0    # default: $REDIS_URL
        timeout: 10                             # seconds per test case
        continuous: true                        # score over the first 10 cases, as verl's

What the score is, as there: the code is the last ```python block of the solution (or
the first plain ``` block); no block scores 0.0; else the share of cases that pass
(with ``continuous``, among the first 10). The sandboxes are made once per process
and URL and reused.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from codepool.common.case_formats import sandbox_fusion_cases
from codepool.common.errors import ConfigError
from codepool.common.reward_tests import CaseResult
from codepool.producer.sandbox import RemoteSandbox

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10
CONTINUOUS_CASES = 10  # verl's continuous score looks at this many cases


def extract_code(solution_str: str) -> str | None:
    """The code in a model's answer as verl's ``sandbox_fusion`` reward finds it: the
    text after the last ```python fence up to the next fence; else the first ``` block
    (a one-word language line dropped); None when there is no fence."""
    if "```python" in solution_str:
        return solution_str.split("```python")[-1].split("```")[0]
    if "```" not in solution_str:
        return None
    parts = solution_str.split("```")
    code = parts[1]
    if "\n" in code:
        first, rest = code.split("\n", 1)
        if first.strip().isalpha():
            code = rest
    return code


@functools.lru_cache(maxsize=8)
def sandbox_for(url: str | None) -> RemoteSandbox:
    """The process's sandbox for ``url`` (None: ``$REDIS_URL``), made once."""
    return RemoteSandbox(url, timeout=DEFAULT_TIMEOUT_S)


def score_results(results: list[CaseResult], *, continuous: bool) -> float:
    """The share of passing cases (with ``continuous``: among the first 10)."""
    counted = results[:CONTINUOUS_CASES] if continuous else results
    if not counted:
        return 0.0
    return sum(result.passed for result in counted) / len(counted)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    redis_url: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    memory_limit_mb: int = 1024,
    continuous: bool = True,
    sandbox: RemoteSandbox | None = None,
    **_: Any,
) -> float:
    """The score of ``solution_str`` against ``ground_truth`` (see the module docstring).

    redis_url: the pool's Redis (default ``$REDIS_URL``); sandbox: use this one instead.
    timeout: seconds per test case. memory_limit_mb: per case. continuous: score over
    the first 10 cases only (verl's default for code data sources). A malformed ground
    truth scores 0.0 (and is logged), as there.
    """
    code = extract_code(solution_str) if isinstance(solution_str, str) else None
    if code is None:
        return 0.0
    try:
        prefix, cases = sandbox_fusion_cases(ground_truth)
    except ConfigError as exc:
        log.error("%s: cannot score: %s", data_source, exc)
        return 0.0
    if continuous:
        cases = cases[:CONTINUOUS_CASES]  # the rest would not count
    if not cases:
        return 0.0
    runner = sandbox or sandbox_for(redis_url)
    results = runner.run_tests(
        code, cases, prefix=prefix, timeout_s=timeout, memory_mb=memory_limit_mb
    )
    return score_results(results, continuous=continuous)
