"""``codepool run``: execute snippets on this host and print what the policy would see."""

from __future__ import annotations

from codepool.common import Limits, format_tool_content
from codepool.worker import LocalExecutor

CELL_MARKER = "# %%"


def split_cells(text: str) -> list[str]:
    """Split on ``# %%`` lines; a file without markers is one snippet."""
    cells: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if line.strip() == CELL_MARKER:
            cells.append([])
        else:
            cells[-1].append(line)
    snippets = ["".join(cell) for cell in cells]
    if CELL_MARKER in text:
        snippets = snippets[1:]  # what precedes the first marker is a preamble
    return [s for s in snippets if s.strip()]


def main(
    source: str,
    *,
    is_code: bool,
    mode: str,
    preload: tuple[str, ...],
    concurrency: int | None,
    limits: Limits,
) -> int:
    if is_code:
        snippets = [source]
    else:
        with open(source if source != "-" else "/dev/stdin", encoding="utf-8") as f:
            snippets = split_cells(f.read())
    with LocalExecutor(
        concurrency=concurrency, mode=mode, preload=preload, limits=limits
    ) as executor:
        results = executor.run_many(snippets)
    for index, (snippet, result) in enumerate(zip(snippets, results, strict=True)):
        first = snippet.strip().splitlines()[0][:60]
        print(f"--- [{index}] {first}  ({result.status}, {result.latency * 1e3:.1f} ms)")
        text = format_tool_content(result, timeout_s=limits.timeout_s)
        print(text, end="" if text.endswith("\n") else "\n")
    # A snippet that fails is a result; only snippets codepool could not run fail the run.
    return 1 if any(r.status in ("infra", "rejected") for r in results) else 0
