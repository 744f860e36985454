"""NCCL's account of the fabric during a run: collected from the nodes, said once, enforced.

Each node's supervisor ships the NCCL lines of its ranks (``nccl`` messages, checked by
job/nodemsg.py: a host speaks only for its own ranks); this watch feeds them to
decide/fabric/nccl_account.py's parser, prints the one line once every rank's account is settled
(plus a WARNING per node on NET/Socket and each difference from the plan), and under
``--require-fabric`` declares the run's failure at once (exit 123, docs/exit-codes.md).
What it found goes into meta.json (``fabric``) and the run's JSON report.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from launcher.decide.fabric import nccl_account as na
from launcher.decide.runplan.plan import LaunchPlan
from launcher.job.events import Nccl, Observer
from launcher.models import Host
from launcher.runrecord import RunMeta


class FabricWatch(Observer):
    """The run's NCCL accounts (one per rank), from the nodes' ``nccl`` messages (an
    observer of the job, job/events.py)."""

    def __init__(self, plan: LaunchPlan, require: str | None, say: Callable[[str], None],
                 fail: Callable[[str, str], None],
                 on_record: Callable[[], None] | None = None) -> None:
        self.require = require
        self.say = say
        self.fail = fail  # (host, why): the run's failure (--require-fabric)
        self.on_record = on_record
        self.hosts = {r: n.host.label for n in plan.nodes for r in n.ranks}
        self.multi_node = len(plan.nodes) > 1
        self.plan_env: dict[str, dict[str, str]] = {
            n.host.label: {v.name: v.value for v in n.env if v.name.startswith("NCCL_")}
            for n in plan.nodes}
        self.accounts: dict[int, na.RankAccount] = {}
        self.said = False
        self.refused = False
        self.first_line_t: float | None = None

    def on_nccl(self, host: Host, ev: Nccl) -> None:
        if ev.rank not in self.hosts:
            return
        # job/events.py let this host speak for the rank (the plan's, or with --rdzv c10d
        # one it claimed): the account is that host's
        self.hosts[ev.rank] = host.label
        na.feed(self.accounts.setdefault(ev.rank, na.RankAccount()), ev.lines)
        self._judge()

    def _judge(self) -> None:
        acc = self.accounts
        if self.require and not self.refused:
            # a rank whose account is settled and falls short: refused at once
            bad = {r: a for r, a in acc.items()
                   if na.settled(a, self.require)
                   and not na.meets(na.transport(a), self.require)}
            if bad:
                s = self.summary(partial=True)
                self.refused = True
                if not self.said:
                    self._say(s)
                why = s.refusal or f"--require-fabric {self.require}"
                first = min(bad)
                self.fail(self.hosts[first], why)
                return
        if not self.said and len(acc) == len(self.hosts) and all(
                na.settled(a, self.require) for a in acc.values()):
            self._say(self.summary())

    def _say(self, s: na.FabricSummary) -> None:
        self.said = True
        self.first_line_t = time.time()
        self.say(s.line)
        for line in (*s.warnings, *(f"note: NCCL differs from the plan: {d}"
                                    for d in s.differences)):
            self.say(line)
        if self.on_record is not None:
            self.on_record()

    def summary(self, partial: bool = False) -> na.FabricSummary:
        return na.summarize(self.accounts, self.hosts, self.plan_env,
                            require=self.require, multi_node=self.multi_node, partial=partial)

    def finish(self) -> None:
        """At the run's end: say what is known, if the line was never said."""
        if not self.said and self.accounts:
            self._say(self.summary())

    def meta(self) -> RunMeta:
        """meta.json's ``fabric`` (None when NCCL said nothing)."""
        if not self.accounts:
            return {"fabric": None}
        s = self.summary()
        return {"fabric": {**s.json(), "require": self.require,
                           "transports": {r: d["transport"] for r, d in s.per_rank.items()}}}
