"""Numbers in words: a count with its noun, ranks folded into ranges; from how many nodes
on identical rows fold."""

from __future__ import annotations

from collections.abc import Iterable

FOLD_AT = 16  # from this many nodes on, identical per-node rows are folded (output/hostgroups,
#               the verdict's summary)


def count(n: int, noun: str) -> str:
    """``1 node``, ``3 nodes``: a number with its noun (regular plurals only)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-3,6,8-9``: sorted ranks with runs folded."""
    out: list[str] = []
    nums = sorted(set(ranks))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)
