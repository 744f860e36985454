"""`dtrain run --restarts N`: the relaunch loop over the shared prepare and launch phases.

Each attempt is ``job.prepare.prepare`` (connect -> preflight) on the attempt's nodes,
``Prepared.plan`` and a ``commands.launch.Attempt`` into the one run archive (output.jsonl lines
carry ``"attempt": n``; meta.json ``attempts[]``). After an attempt ends,
``decide.outcome.restarts``
(pure) names the fault and the next gang: a node fault fences the node (remembered on the
lemon list) and brings in a spare or shrinks, a process fault reruns on the same nodes, a
deterministic user error stops. Between attempts (the back-off, the next prepare) Ctrl-C,
SIGTERM and `dtrain stop` end the run at once: the loop serves the control socket then
(job/stoppable.Stoppable).
A node that fails to connect or its preflight at a relaunch is fenced like a lost one.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.commands.incidents import Remembered, charge_run, remember
from launcher.commands.launch import Attempt as JobAttempt
from launcher.commands.launch import (
    RunResult,
    Word,
    held_run,
    start_meta,
    title_launcher,
    with_ledger,
)
from launcher.decide.outcome import lemons as lm
from launcher.decide.outcome.restarts import (
    FINAL,
    AttemptEnd,
    Decision,
    Fault,
    NodeCount,
    RestartPolicy,
    classify,
    decide,
    fenced_line,
)
from launcher.decide.outcome.restarts import next_gang as _next_gang
from launcher.decide.outcome.verdict import restarts_text
from launcher.decide.runplan.plan import RunRequest
from launcher.decide.runplan.runoptions import RunOptions
from launcher.errors import ConnectError, PreflightFailed
from launcher.job.prepare import prepare
from launcher.job.stoppable import Stoppable
from launcher.models import Host, OutputLine
from launcher.output import render
from launcher.runrecord import Attempt

if TYPE_CHECKING:
    from launcher.commands.detach import Detacher
    from launcher.job.hangwatch import HangWatch
    from launcher.job.lemons import LemonStore
    from launcher.output.archive import RunArchive
    from launcher.transports.ssh import SSHSettings


def say(archive: RunArchive | None, text: str, opts: RunOptions) -> None:
    """One line of the loop's own: to the console and, as a dtrain line, to the archive."""
    render.note(text, sys.stderr if opts.reports.as_json else sys.stdout)
    if archive is not None and archive.attempt is not None:
        archive.begin_attempt(archive.attempt)  # reopens output.jsonl after a pipeline
        archive.write_lines([OutputLine("", "dtrain", text, t=time.time())])
        archive.flush()


def attempt_end(result: RunResult) -> AttemptEnd:
    """What decide.outcome.restarts needs of an attempt's result."""
    v, outcome = result.verdict, result.outcome
    root = outcome.root
    lost = tuple(label for label, node in outcome.nodes.items() if node.lost)
    host = v.root_host
    where = place = None
    if v.root_kind == "hang":
        # the hang's culprit (decide/outcome/stacks.py): its one node, where its stack stands
        hangs = result.hangs
        culprit = hangs[-1].culprit if hangs else None
        if culprit is not None:
            host, where, place = culprit.host, culprit.where, culprit.place
        elif v.root_rank is None:
            host = None  # no culprit: nobody to fence
    return AttemptEnd(result.code, v.root_kind, host, v.root_rank, result.failure,
                      result.progressed, lost, root.error if root is not None else None,
                      tuple(result.tails.tails.get((v.root_host or "", v.root_rank), ())),
                      where, place)


def versions_of(result: RunResult, host: str) -> dict[str, str]:
    """The failed node's torch and NCCL versions beside its incident: the probe's (meta.json
    ``torch_versions``, ``nccl_versions``), else NCCL's own version line in the run
    (docs/fabric.md's account); NCCL ``unknown`` when neither says."""
    torch = (result.versions.get("torch") or {}).get(host)
    nccl = (result.versions.get("nccl") or {}).get(host) \
        or (result.fabric or {}).get("version") or "unknown"
    return {**({"torch": torch} if torch else {}), "nccl": str(nccl)}


def remember_attempt(end: AttemptEnd, result: RunResult, req: RunRequest, n: int,
                     hosts: Sequence[str], fault: str | None = None,
                     seconds: Mapping[str, float | None] | None = None) -> Remembered:
    """Attempt ``n``'s explained failure into the incident store (commands/incidents.py),
    with the run's script, working directory and the failed node's torch and NCCL versions
    (``seconds``: the time it cost, when the ledger is already made)."""
    host = (end.host if end.reason is None else end.reason.host) or ""
    return remember(end, run_id=req.run_id or result.run_id, attempt=n, script=req.script,
                    workdir=req.workdir, hosts=hosts, fault=fault,
                    versions=versions_of(result, host), seconds=seconds)


def detected(result: RunResult) -> float | None:
    """When the launcher learned of the attempt's root cause (a lost node: when its
    heartbeat timeout ran out or its connection dropped); None when nothing failed."""
    root = result.outcome.root
    if root is not None and root.seen:
        return root.seen
    return result.outcome.interrupted_t


async def run_restarting(hosts: Sequence[Host], spares: Sequence[Host], count: NodeCount,
                         req: RunRequest, opts: RunOptions, settings: SSHSettings,
                         detacher: Detacher | None) -> RunResult:
    """`dtrain run --restarts N` (docs/restarts.md)."""
    from launcher.job.lemons import LemonStore

    loop = Loop([*hosts, *spares], req, opts, settings, opts.watch.restart, LemonStore(), detacher,
                count, [h.label for h in hosts], [h.label for h in spares])
    return await loop.run()


class Loop:
    """One restarting run: its nodes, spares, attempts and fenced nodes."""

    def __init__(self, hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
                 settings: SSHSettings, policy: RestartPolicy, store: LemonStore,
                 detacher: Detacher | None, count: NodeCount, active: Sequence[str],
                 spares: Sequence[str]) -> None:
        self.by_label = {h.label: h for h in hosts}
        from launcher.decide.runplan.placement import host_places

        # the hostfile's switch=/segment=, then --topology's: a spare from the fenced node's
        # switch or segment
        self.places = host_places(hosts, opts.checks.topology, opts.checks.topology_from)
        self.req, self.opts, self.settings = req, opts, settings
        self.policy, self.store, self.detacher = policy, store, detacher
        self.count = count
        self.active, self.spares = list(active), list(spares)
        self.attempts: list[Attempt] = []
        self.faults: list[Fault] = []
        self.fenced: list[dict[str, Any]] = []
        self.watch: HangWatch | None = None
        # the decision over an attempt's result, made once: asked by supervise before its
        # summary (``attempt N failed`` or FAILED), used by judge
        self.decided: tuple[RunResult, Decision] | None = None
        self.notes: list[str] = []  # the incident store's warnings, said by judge
        # the --notify word of each attempt's recorded failure (docs/incidents.md)
        self.words: dict[int, Word] = {}
        self.recorded = False  # an incident of this run is in the store (charged at its end)

    def suspect(self, archive: RunArchive, pairs: Sequence[tuple[str, str]]) -> None:
        """Named once without evidence of the machine: on the lemon list as a suspect (a
        cooldown), used again by this run."""
        now = time.time()
        records = [lm.Lemon(host, why, self.req.run_id, now, now + lm.cooldown(1),
                            lm.SUSPECT) for host, why in pairs]
        if self.policy.remember and records:
            try:
                self.store.remember(records)
            except OSError as exc:
                say(archive, f"warning: cannot remember the suspect node(s) in "
                             f"{self.store.path} ({exc.strerror})", self.opts)

    def fence(self, archive: RunArchive, pairs: Sequence[tuple[str, str]],
              tier: str = lm.ISOLATE) -> None:
        now = time.time()
        until = now + (self.policy.fence_ttl if tier == lm.ISOLATE else lm.cooldown(1))
        records = [lm.Lemon(host, why, self.req.run_id, now, until, tier)
                   for host, why in pairs]
        self.fenced += [{"host": r.host, "why": r.why, "t": r.t, "attempt": len(self.attempts)
                         or 1} for r in records]
        archive.update_meta(fenced=self.fenced)
        from launcher.job import notify

        for r in records:
            notify.event("fenced", f"{r.host} fenced: {r.why}", host=r.host, why=r.why)
        if self.policy.remember and records:
            try:
                self.store.remember(records)
            except OSError as exc:
                say(archive, f"warning: cannot remember the fenced node(s) in "
                             f"{self.store.path} ({exc.strerror})", self.opts)

    async def one(self, archive: RunArchive, n: int, between: Stoppable | None
                  ) -> RunResult | None:
        """Attempt ``n`` on the current nodes (None: stopped before it started); a node that
        cannot be reached or fails its preflight is fenced and replaced first."""
        req = replace(self.req, attempt=n)
        while True:
            hosts = [self.by_label[h] for h in self.active]
            try:
                async with prepare(hosts, req, self.opts, self.settings) as prep:
                    plan = prep.plan(req, self.opts)
                    if between is not None:
                        await between.aclose()
                        if between.who is not None:
                            return None
                    first = archive.meta.get("start")  # the run's start stays
                    start_meta(archive, req, self.opts, plan, prep, self.detacher)
                    if n > 1:
                        archive.update_meta(start=first, next_attempt=None)
                    archive.update_meta(attempt=n)
                    archive.update_meta(attempts=[*self.attempts, self._record(n, hosts)])
                    title_launcher("run", req.run_id, len(plan.nodes))  # ps --everyone
                    attempt = JobAttempt(plan, req, self.opts, prep, archive, self.detacher,
                                         earlier=self.watch,
                                         retried=functools.partial(self.relaunches, n))
                    result = await attempt.run()
                    self.watch = attempt.watch  # the next attempt's hang watch goes on from it
                    return result
            except (ConnectError, PreflightFailed) as exc:
                bad = [h for h in exc.hosts if h in self.active]
                if not bad or self.policy.restarts == 0 or (between and between.who):
                    raise
                what = "unreachable" if isinstance(exc, ConnectError) else "preflight fails"
                pairs = [(h, f"{what}: {exc.message}"[:300]) for h in bad]
                gang = _next_gang(self.active, self.spares, bad, self.count, self.places)
                if gang.stop:
                    raise
                self.fence(archive, pairs)
                say(archive, fenced_line(f"{', '.join(bad)} {what} at attempt {n}", gang),
                    self.opts)
                self.active, self.spares = list(gang.active), list(gang.spares)

    def _record(self, n: int, hosts: Sequence[Host]) -> Attempt:
        return {"n": n, "start": time.time(), "end": None, "exit_code": None, "cause": None,
                "hosts": [h.label for h in hosts], "fenced": [], "detected": None,
                "stopping": None, "relaunched": None}

    def ending(self, archive: RunArchive) -> Word:
        """At the run's end, its ledger made: the incidents of its attempts charged the
        time they cost; the last attempt's word for --notify's ``ended`` (None when it did
        not fail)."""
        if self.recorded and self.req.run_id:
            note = charge_run(self.req.run_id, archive.meta.get("goodput"))
            if note:
                render.note(note, sys.stderr if self.opts.reports.as_json else sys.stdout)
        last = self.attempts[-1] if self.attempts else None
        if last is None or last.get("exit_code") == 0:
            return None
        return self.words.get(last["n"])

    async def run(self) -> RunResult:
        with held_run(self.req, self.opts, self.detacher, self.ending) as archive:
            result = await self._attempts(archive)
        return with_ledger(result, archive)  # its goodput ledger made at the end

    async def _attempts(self, archive: RunArchive) -> RunResult:
        """Attempt after attempt, each judged, until one is the last."""
        archive.attempt = n = 1
        try:
            started = time.time()
            result = await self.one(archive, n, None)
            assert result is not None  # only a relaunch can be stopped before it starts
            while True:
                d = self.judge(archive, n, result, started)
                result = replace(result, attempts=list(self.attempts))
                if not d.relaunch or d.gang is None:
                    if d.line:
                        say(archive, d.line, self.opts)
                    return self.last(archive, n, result)
                # live again: ps, attach and stop see a running run (the last attempt's
                # end is in attempts[])
                meta = archive.meta
                meta.pop("end", None)
                meta.pop("exit_code", None)
                meta.pop("outcome", None)
                archive.write_meta({**meta, "state": "restarting",
                                    "next_attempt": {"n": n + 1,
                                                     "at": time.time() + d.wait}})
                self.active, self.spares = list(d.gang.active), list(d.gang.spares)
                async with Stoppable(archive.dir, hangup=self.detacher is None) as between:
                    say(archive, d.line, self.opts)  # stoppable from here on
                    if await between.wait(d.wait):
                        return self._stopped(archive, between, n + 1, result)
                    n += 1
                    archive.attempt = n
                    started = time.time()
                    self.attempts[-1]["relaunched"] = started
                    from launcher.job import notify

                    word = self.words.get(n - 1)
                    notify.event("relaunched", f"attempt {n} relaunched on "
                                 f"{', '.join(self.active)}"
                                 + (f"; attempt {n - 1} failed: {word[0]}" if word
                                    else ""), attempt=n,
                                 **({"incident": dict(word[1])} if word else {}))
                    archive.update_meta(attempts=self.attempts)
                    relaunched = await self.one(archive, n, between)
                if relaunched is None:
                    return self._stopped(archive, between, n, result)
                result = relaunched
        except BaseException:
            if archive.meta.get("state") in ("restarting", "starting", "running"):
                archive.update_meta(state="finished", end=time.time(),
                                    outcome="launcher ended between attempts")
            raise

    def decision(self, n: int, result: RunResult) -> Decision:
        """decide.outcome.restarts over attempt ``n``'s result (pure), made once per result, with
        what the incidents of earlier runs say of it (the failure recorded first)."""
        if self.decided is None or self.decided[0] is not result:
            end = attempt_end(result)
            history = None
            if result.code != 0:
                got = remember_attempt(end, result, self.req, n, [*self.by_label],
                                       classify(end, self.faults).kind)
                self.notes += got.notes
                history = got.recall
                self.recorded = self.recorded or (got.incident is not None
                                                  and got.recall is not None)
                self.words[n] = (got.seen, got.seen_fields or {}) if got.seen else None
            self.decided = (result, decide(end, self.faults, n, self.policy, self.active,
                                           self.spares, self.count, self.places, history))
        return self.decided[1]

    def relaunches(self, n: int, result: RunResult) -> bool:
        """Whether attempt ``n`` ending so is followed by another (its summary then says
        ``attempt N failed``, not FAILED)."""
        d = self.decision(n, result)
        return d.relaunch and d.gang is not None

    def judge(self, archive: RunArchive, n: int, result: RunResult,
              started: float) -> Decision:
        """Classify attempt ``n``'s end, fence, record it in meta.json, say the decision."""
        d = self.decision(n, result)
        self.decided = None
        self.faults.append(d.fault)
        for note in self.notes:
            say(archive, note, self.opts)
        self.notes = []
        if d.fenced:
            self.fence(archive, d.fenced, d.fault.tier)
        if d.suspect:
            self.suspect(archive, d.suspect)
        self.attempts.append({
            **self._record(n, [self.by_label[h] for h in self.active]),
            "start": started, "end": time.time(), "exit_code": result.code,
            "detected": detected(result), "stopping": result.outcome.stop_t,
            "relaunched": None,
            "cause": self._cause(d.fault, result), "why": d.fault.why,
            "fenced": [{"host": h, "why": why} for h, why in d.fenced],
            "suspect": [{"host": h, "why": why} for h, why in d.suspect],
            "world_size": result.world_size,
            "outcome": result.verdict.outcome, "decision": d.line or None,
            "relaunch": d.relaunch})
        archive.update_meta(attempts=self.attempts)
        return d

    def last(self, archive: RunArchive, n: int, result: RunResult) -> RunResult:
        """The run's result after its last attempt: its verdict counts the restarts
        (``succeeded after 1 restart``), in meta.json's outcome, --json's summary and
        --junit's too, as the summary line said it."""
        if n < 2:
            return result
        outcome = result.verdict.outcome + restarts_text(n - 1)
        archive.update_meta(outcome=outcome)
        return replace(result, verdict=replace(result.verdict, outcome=outcome))

    def _cause(self, fault: Fault, result: RunResult) -> str:
        if fault.kind != FINAL:
            return fault.kind
        return "ok" if result.code == 0 else result.verdict.root_kind or "final"

    def _stopped(self, archive: RunArchive, between: Stoppable, n: int,
                 last: RunResult) -> RunResult:
        text = f"stopped by {between.who} before attempt {n}: nothing more is started"
        say(archive, text, self.opts)
        archive.update_meta(state="finished", end=time.time(), exit_code=between.code,
                            outcome=text, attempts=self.attempts, next_attempt=None)
        base = last
        v = replace(base.verdict, code=between.code, outcome=text, root_kind="interrupted",
                    why=[])
        return replace(base, verdict=v, attempts=list(self.attempts))
