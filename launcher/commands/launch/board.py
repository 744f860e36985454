"""The job's observers made here: the live status line on a terminal (``NodeBoard``), the
failure evidence (``Evidence``, around decide/outcome/failures.ErrorKeeper) and the run's hang
watch (``hang_watch``: job/hangwatch.py's, recorded through the run's recorder)."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from launcher.commands.launch.pipeline import RunPipeline
from launcher.commands.launch.recorder import RunRecorder
from launcher.decide.outcome.failures import ErrorKeeper
from launcher.decide.outcome.hang import ProgressWatch, compile_progress
from launcher.decide.runplan.plan import LaunchPlan
from launcher.decide.runplan.runoptions import RunOptions
from launcher.job.events import Exit, Hello, Observer, RankExit, Stopping
from launcher.job.hangwatch import HangWatch
from launcher.job.orchestrate import Job, JobState
from launcher.models import Host, OutputLine
from launcher.text.words import count


class NodeBoard(Observer):
    """The live status line on a terminal: per-node state from the supervisors' messages
    (an observer of the job, job/events.py)."""

    def __init__(self, labels: Sequence[str], world_size: int) -> None:
        self.state = dict.fromkeys(labels, "starting")
        self.world_size = world_size
        self.ranks_done = 0
        self.ranks_failed = 0
        self.start = time.monotonic()

    def on_hello(self, host: Host, ev: Hello) -> None:
        self.state[host.label] = "running"

    def on_stopping(self, host: Host, ev: Stopping) -> None:
        self.state[host.label] = "stopping"

    def on_exit(self, host: Host, ev: Exit) -> None:
        self.state[host.label] = f"exit {ev.code}"

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        self.ranks_done += 1
        self.ranks_failed += ev.end.failed

    def render(self) -> str:
        counts: dict[str, int] = {}
        for state in self.state.values():
            counts[state] = counts.get(state, 0) + 1
        elapsed = int(time.monotonic() - self.start)
        nodes = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        failed = f" ({self.ranks_failed} failed)" if self.ranks_failed else ""
        return (f"dtrain {elapsed // 60:02d}:{elapsed % 60:02d} | "
                f"{count(len(self.state), 'node')}: "
                f"{nodes} | ranks finished {self.ranks_done}/{self.world_size}{failed}")


class Evidence(Observer):
    """decide/outcome/failures.py's ErrorKeeper (below job/), fed as an observer: each rank's stderr
    lines and the node's evidence of its death."""

    def __init__(self, keeper: ErrorKeeper) -> None:
        self.keeper = keeper

    def on_lines(self, lines: Sequence[OutputLine]) -> None:
        self.keeper.observe(lines)

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        self.keeper.rank_exit(host.label, ev.end.rank, ev.end.evidence)


def hang_watch(job: Job, plan: LaunchPlan, opts: RunOptions, recorder: RunRecorder,
               out: RunPipeline, board: NodeBoard) -> HangWatch:
    """The run's hang watch (docs/hangs.md), an observer of the job: every output line,
    the ranks' starts, the nodes' stacks and flight recorder dumps; what it declares goes
    to meta.json and --notify through the recorder."""
    policy = opts.watch.hang
    progress = ProgressWatch(compile_progress(policy.progress), range(plan.world_size),
                             time.time())

    def alive() -> bool:
        return job.state is JobState.RUNNING and board.ranks_done == 0

    watch = HangWatch(job, policy, progress, {n.host.label: list(n.ranks) for n in plan.nodes},
                      recorder.archive.dir, out.message, alive=alive)
    watch.on_record = functools.partial(recorder.hang, watch)
    job.observe(watch)  # the output lines (progress), rank_start, stacks, flight
    return watch
