"""Would this run share nodes with another user's? (docs/runs.md, "Two users on one node")

Pure: the probe's ``others`` (nodeside/runscan.py, decoded as ``NodeFacts.others``) in, one
warning line per shared node out, and with ``run --exclusive`` the refusal. Another user's
run is known only by what every user of the node sees in ``ps``: its user, its run id and
when it started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.decide.runplan.facts import NodeFacts, OtherRun
from launcher.errors import PreflightFailed
from launcher.text.words import count


@dataclass(frozen=True)
class Sharing:
    """What the probes saw of other users' runs on this run's nodes."""

    shared: Mapping[str, tuple[OtherRun, ...]]  # node label -> other users' runs there
    hidden: Mapping[str, str]  # node label -> /proc's hidepid option (nothing visible)

    @property
    def lines(self) -> list[str]:
        """One warning per shared node, then one line for the nodes that hide processes."""
        out = [f"{label} is in use by {_runs(runs)}: two users' jobs would share it "
               "(`dtrain ps --everyone -w " + label + "`)"
               for label, runs in self.shared.items()]
        if self.hidden:
            labels = list(self.hidden)
            out.append(f"other users' processes are hidden on {', '.join(labels)} "
                       f"(/proc {self.hidden[labels[0]]}): whether another run shares "
                       f"{'it' if len(labels) == 1 else 'them'} is not known")
        return out


def _runs(runs: Sequence[OtherRun]) -> str:
    return ", ".join(f"{r.user}'s run {r.run_id}" for r in runs)


def sharing(facts: Mapping[str, NodeFacts], order: Sequence[str]) -> Sharing:
    """The shared and the hidden nodes among ``order`` (the run's node labels, in rank
    order), from each node's facts."""
    shared = {label: facts[label].others for label in order
              if label in facts and facts[label].others}
    hidden = {label: facts[label].others_hidden or "" for label in order
              if label in facts and facts[label].others_hidden}
    return Sharing(shared, hidden)


def refuse(found: Sharing) -> PreflightFailed:
    """``run --exclusive`` on nodes another user's run holds: exit 1, nothing started."""
    labels = list(found.shared)
    what = "; ".join(f"{label}: {_runs(runs)}" for label, runs in found.shared.items())
    return PreflightFailed(
        f"--exclusive: {count(len(labels), 'node')} already run another user's dtrain job "
        f"({what}); nothing was started",
        hint=f"leave {'it' if len(labels) == 1 else 'them'} out (--exclude "
             f"{','.join(labels)}), wait until `dtrain ps --everyone -w {','.join(labels)}` "
             "shows none, or run without --exclusive to share")
