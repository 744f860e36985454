"""Pure: per-rank progress from output lines, and when a job counts as hung.

Every line a rank prints updates its *last line* time; a line matching the progress pattern
(``--progress REGEX``; by default step/iteration/epoch/loss lines and progress bars) updates
its *last progress* time. A job is hung when no rank made progress for ``--hang-timeout``
seconds while every rank is alive (docs/hangs.md). Until the first progress line of the job,
any line counts as progress: a job whose lines the pattern does not know is judged by its
silence, not declared hung for printing the wrong words.

Times are the launcher's arrival times (OutputLine.t); the clock is passed in, so the rules
are unit-tested without waiting. The stall is counted in the launcher's own running time, as
a node's silence is (decide/outcome/liveness.py): the hang watch's tick knows when it was due, and a
late tick means the launcher itself was not running (SIGSTOP, a starved loop), a stretch
that is not the ranks' stall; and what the ranks printed meanwhile may still be unread when
that late tick runs, so a late tick declares a hang only past one more tick. docs/hangs.md.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from launcher.decide.outcome.liveness import Silence
from launcher.decide.outcome.stacks import Culprit, Folded
from launcher.errors import UsageError
from launcher.models import OutputLine
from launcher.runrecord import HangCulprit, HangRecord

# step 12 / iter: 3 / Epoch 2/10 / 'loss': 0.31 / train_loss=0.3 / global_step=100, and
# progress bars (tqdm, Lightning): "45/100 [00:10<00:12" or "4.50it/s" / "1.2s/it"
DEFAULT_PROGRESS = (r"(?i)(?:(?<![a-z])(?:global_step|step|iter|iteration|it|epoch|batch|loss)"
                    r"['\"]?\s*[:=#]?\s*[-+]?\d)|(?:\d+/\d+\s*\[)|(?:\d(?:it/s|s/it)\b)")
# long enough for a slow step, a checkpoint or an evaluation that prints nothing, and shorter
# than NCCL's 10-minute watchdog (PyTorch's default collective timeout), so the stacks are
# taken while the ranks still hang; a false alarm with --on-hang dump costs one dump
DEFAULT_HANG_TIMEOUT = 300.0
ON_HANG = ("dump", "stop")
RESOLUTION_S = 1.0  # a rank's progress time is kept to this (fewer pattern matches)


def compile_progress(pattern: str | None) -> re.Pattern[str]:
    """The --progress pattern (exit 2 on a bad one, before anything connects)."""
    try:
        return re.compile(DEFAULT_PROGRESS if pattern is None else pattern)
    except re.error as exc:
        raise UsageError(f"--progress {pattern!r}: {exc}",
                         hint="a Python regular expression, searched in each output line"
                         ) from None


@dataclass(frozen=True)
class HangPolicy:
    """--hang-timeout (0 = off), --progress, --on-hang."""

    timeout: float = DEFAULT_HANG_TIMEOUT
    progress: str | None = None  # None: DEFAULT_PROGRESS
    on_hang: str = "dump"
    # every rank started, none printed a line yet (importing torch, the rendezvous): the
    # timeout is at least this: a slow start is not a hang, a rendezvous that never ends is
    startup_grace: float = 60.0

    @property
    def enabled(self) -> bool:
        return self.timeout > 0


@dataclass
class RankProgress:
    last_line: float | None = None
    last_progress: float | None = None
    progress_text: str | None = None
    # lines not searched (within RESOLUTION_S of the last match): searched only when the
    # last progress is shown (``latest``), so the HANG line names the newest one
    unsearched: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=32))


class ProgressWatch:
    """Per-rank last line and last progress times, fed with the job's output lines."""

    def __init__(self, pattern: re.Pattern[str], ranks: Iterable[int], start: float) -> None:
        self.pattern = pattern
        self.ranks = {r: RankProgress() for r in ranks}
        self.start = start
        self.any_progress = False  # a progress line was seen: only those count now
        self.any_line = False  # a rank printed anything at all
        self.last_any: float = start  # the job's last line (before any progress line)
        self.last: float = start  # the job's last progress
        self.last_text: str | None = None
        self.last_rank: int | None = None
        # the launcher's own stalls since the baseline (decide/outcome/liveness.py; timeout 0: it
        # only measures), and the margin of the last look (one tick when it came late)
        self._own = Silence(0.0, start)
        self.margin = 0.0

    def observe(self, lines: Sequence[OutputLine]) -> None:
        search = self.pattern.search
        for line in lines:
            rank = line.rank
            if rank is None or line.stream not in ("out", "err"):
                continue
            state = self.ranks.get(rank)
            if state is None:
                state = self.ranks[rank] = RankProgress()
            t = line.t
            state.last_line = t
            self.any_line = True
            if t > self.last_any:
                self.last_any = t
            if state.last_progress is not None and t - state.last_progress < RESOLUTION_S \
                    and self.any_progress:
                state.unsearched.append((t, line.text))
                continue
            state.unsearched.clear()
            if search(line.text):
                state.last_progress = t
                state.progress_text = line.text
                self.any_progress = True
                if t >= self.last:
                    self.last, self.last_text, self.last_rank = t, line.text, rank

    def latest(self) -> tuple[float, int, str] | None:
        """The newest progress line of any rank (time, rank, text), throttled lines too."""
        best = (self.last, self.last_rank, self.last_text) if self.last_text is not None \
            else None
        search = self.pattern.search
        for rank, state in self.ranks.items():
            for t, text in reversed(state.unsearched):
                if best is not None and t < best[0]:
                    break
                if search(text):
                    best = (t, rank, text)
                    break
        return best  # type: ignore[return-value]

    def baseline(self) -> float:
        """Since when the job has made no progress."""
        return self.last if self.any_progress else max(self.last_any, self.start)

    def _since(self) -> Silence:
        base = self.baseline()
        if base != self._own.heard_at:  # new progress: earlier stalls of ours do not count
            self._own.heard(base)
        return self._own

    def look(self, now: float, due: float, interval: float) -> None:
        """The hang watch's tick at ``now``, due at ``due``: one later than the slack was the
        launcher's own stall (not counted), and it may run before the lines the ranks
        printed meanwhile are read: it may declare a hang only past one more ``interval``."""
        own = self._since()
        own.look(now, due, interval)
        self.margin = interval if own.late(now, due) else 0.0

    def stalled_for(self, now: float) -> float:
        """No progress for this long, in the launcher's own running time."""
        return self._since().silent(now)

    def json(self) -> dict[str, dict[str, object]]:
        """meta.json ``progress``: per rank, its last line and last progress times."""
        return {str(r): {"last_line": p.last_line, "last_progress": p.last_progress,
                         "progress_line": p.progress_text}
                for r, p in sorted(self.ranks.items())}


def hang_due(watch: ProgressWatch, now: float, policy: HangPolicy, *, all_alive: bool,
             declared: float | None) -> bool:
    """True when a hang is to be declared now: enabled, every rank alive, no progress for
    the timeout, and not already declared for this stall (a stall is declared once; the
    next one begins with new progress)."""
    if not policy.enabled or not all_alive:
        return False
    if declared is not None and watch.baseline() <= declared:
        return False
    limit = policy.timeout if watch.any_line else max(policy.timeout, policy.startup_grace)
    return watch.stalled_for(now) >= limit + watch.margin


@dataclass(frozen=True)
class Hang:
    """One hang the watch declared (job/hangwatch.py): when, how long the stall, the likely
    culprit from the stacks (decide/outcome/stacks.py), and what was done. meta.json's ``hangs[]``
    is its ``json()``, written only at that edge; the restart policy reads the culprit."""

    t: float
    attempt: int
    stalled_s: float
    culprit: Culprit | None
    folded: Folded | None
    dump: str  # the stack dump's id (stacks/<id>/ in the archive)
    dir: str | None
    action: str  # --on-hang: dump or stop

    def json(self) -> HangRecord:
        c = self.culprit
        culprit: HangCulprit | None = None if c is None else {
            "rank": c.rank, "host": c.host, "ranks": list(c.ranks), "place": c.place,
            "why": c.why, "where": c.where, "rule": c.rule}
        return {"t": self.t, "attempt": self.attempt, "stalled_s": self.stalled_s,
                "culprit": culprit, "folded": self.folded.json() if self.folded else [],
                "dump": self.dump, "dir": self.dir, "action": self.action}
