"""The run's output pipeline and its folds: stderr tails kept on the way, lines a command
takes (smoke's reports), torchrun's shutdown chatter and exit-barrier trace kept off the
console (output/fold.py), every line handed to the job's observers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from launcher.decide.outcome.verdict import TailKeeper
from launcher.job.events import Observer, Observers, RankExit
from launcher.models import Host, OutputLine
from launcher.output.fold import ExitBarrierNoise, ShutdownChatter
from launcher.output.pipeline import OutputPipeline


class RunPipeline(OutputPipeline, Observer):
    """The output pipeline, keeping stderr tails on the way; ``take`` may claim lines
    (dtrain smoke's reports), which then go neither to the console nor to the archive. It
    hands every line to the job's observers (``observers``), and observes the job itself:
    a node's ranks' exits fold torchrun's exit-barrier trace (output/fold.py)."""

    def __init__(self, *args: Any, tails: TailKeeper,
                 take: Callable[[OutputLine], bool] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tails = tails
        self.take = take
        self.chatter = ShutdownChatter()
        # torchrun's exit-barrier trace on a node whose ranks all finished (fold.py): the
        # launch sets its ranks per host and feeds it the rank_exit messages
        self.barrier = ExitBarrierNoise({})
        self._held_at_stop: dict[int, OutputLine] = {}  # stopping(): the agent lines held
        self.observers: Observers | None = None  # the job's (the hang watch, the errors)

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        self.barrier.rank_exit(host.label, ev.end.code)

    def stopping(self) -> None:
        """dtrain began stopping the job: torchrun's shutdown chatter leaves the console,
        the lines the folder holds now included (``leaving_fold``)."""
        if not self.chatter.stopping and self.folder is not None:
            # by identity: the objects stay referenced here until they leave
            self._held_at_stop = {id(line): line for line in self.folder.held_lines()
                                  if line.rank is None and line.stream == "err"}
        self.chatter.stopping = True

    def leaving_fold(self, lines: Sequence[OutputLine]) -> Sequence[OutputLine]:
        """The lines the folder still held when the stop began are judged as they leave
        it: an agent's stderr is held a moment, so its block printed just before dtrain
        knew of the failure it reports (the shim SIGKILLed: torchrun and the supervisor
        race to say so) is folded too. Lines that came after were judged on arrival (and
        so never fold across nodes); a line folded across nodes is not chatter's."""
        held = self._held_at_stop
        if not held or not lines:
            return lines
        keep = self.chatter.keep
        kept = [line for line in lines
                if held.pop(id(line), None) is not line or keep(line)]
        return kept if len(kept) != len(lines) else lines

    def job_over(self, order: Sequence[str]) -> None:
        """The job ended: show the lines held for folding, then one line per node whose
        torchrun shutdown chatter was kept off the console."""
        self.flush_console()
        self._held_at_stop = {}
        for host, text in self.chatter.summary(order):
            self.message(text, host=host)
        for host, text in self.barrier.summary(order):
            self.message(text, host=host)

    def for_console(self, lines: Sequence[OutputLine]) -> Sequence[OutputLine]:
        if self.barrier.ok:  # some node's ranks exited 0: its agent's trace may follow
            keep = self.barrier.keep
            kept = [line for line in lines if keep(line)]
            if len(kept) != len(lines):
                lines = kept
        if self.chatter.stopping:
            keep = self.chatter.keep
            kept = [line for line in lines if keep(line)]
            if len(kept) != len(lines):
                lines = kept
        return super().for_console(lines) if lines else lines

    def emit(self, lines: Sequence[OutputLine], **kwargs: Any) -> None:
        if self.take is not None:
            take = self.take
            kept = [line for line in lines if line.stream == "dtrain" or not take(line)]
            if len(kept) != len(lines):
                lines, kwargs["size"] = kept, None
        self.tails.add(lines)
        if self.observers is not None:
            self.observers.lines(lines)
        super().emit(lines, **kwargs)

