"""Pure: a run's step rate from its progress lines.

A progress line is one the progress pattern matches (``--progress``; the default is the
one hang detection uses). Its step number is the first ``step``/``iter``/``iteration``/
``global_step``/``batch`` number on the line (``step 120 loss 0.3``, ``iter: 55``, a tqdm
``45/100 [``); a progress line without one counts as one step. The rate is measured on one
rank (the lowest that prints progress: in data-parallel training rank 0 logs, and every
rank steps at the same pace anyway) over the last ``window`` seconds.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from launcher.decide.outcome.hang import DEFAULT_PROGRESS

STEP_NUMBER = re.compile(r"(?i)(?:(?<![a-z])(?:global_step|step|iteration|iter|batch)['\"]?"
                         r"\s*[:=#]?\s*(\d{1,15})(?!\d))|(?:(\d{1,15})/\d+\s*\[)")
WINDOW_S = 30.0
PROGRESS = DEFAULT_PROGRESS  # the pattern hang detection uses (decide/outcome/hang.py)


@dataclass
class _RankSteps:
    points: deque[tuple[float, int]] = field(default_factory=deque)  # (t, step)
    counted: int = 0  # progress lines without a number


class StepRate:
    """Feed progress lines (``feed``), read the rate (``rate``) and the last step."""

    def __init__(self, pattern: re.Pattern[str], window: float = WINDOW_S) -> None:
        self.pattern = pattern
        self.window = window
        self.ranks: dict[int, _RankSteps] = {}

    def feed(self, rank: int, t: float, text: str) -> bool:
        """One output line of ``rank``; True when it is a progress line."""
        if not self.pattern.search(text):
            return False
        r = self.ranks.setdefault(rank, _RankSteps())
        m = STEP_NUMBER.search(text)
        if m:
            step = int(m.group(1) or m.group(2))
        else:
            r.counted += 1
            step = r.counted
        if r.points and step < r.points[-1][1]:
            r.points.clear()  # a restart (or a new epoch's counter): start over
        r.points.append((t, step))
        while len(r.points) > 2 and t - r.points[1][0] >= self.window:
            r.points.popleft()
        return True

    def _rank(self) -> _RankSteps | None:
        return self.ranks[min(self.ranks)] if self.ranks else None

    def step(self) -> int | None:
        r = self._rank()
        return r.points[-1][1] if r and r.points else None

    def rate(self, now: float) -> float | None:
        """Steps per second over the window (None: fewer than two progress lines); a rank
        silent for a whole window steps at 0."""
        r = self._rank()
        if r is None or len(r.points) < 2:
            return None
        (t0, s0), (t1, s1) = r.points[0], r.points[-1]
        if now - t1 > self.window:
            return 0.0
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None
