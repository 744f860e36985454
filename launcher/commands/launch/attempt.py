"""One supervised job over the plan's nodes, followed to its verdict: an ``Attempt`` built
and run (``supervise`` does both): the console, each node's launch, the stop policy, the
job's observers, the control socket, the verdict, meta.json's end through the recorder."""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.aio import cancel_and_wait
from launcher.commands.launch.board import Evidence, NodeBoard, hang_watch
from launcher.commands.launch.pipeline import RunPipeline
from launcher.commands.launch.recorder import RunRecorder
from launcher.commands.launch.result import NO_PAYLOAD, Payload, RunResult
from launcher.commands.run_sampling import RunSampling, alongside
from launcher.commands.startup import StartupClock
from launcher.decide.fabric.nccl_account import wants_account
from launcher.decide.outcome.failures import ErrorKeeper
from launcher.decide.outcome.flight import flight_names
from launcher.decide.outcome.outcomes import Failure, JobOutcome
from launcher.decide.outcome.verdict import (
    TailKeeper,
    failure_lines,
    failure_reason,
    node_results,
    root_cause_json,
    summary_lines,
    verdict,
)
from launcher.decide.runplan.plan import LaunchPlan, RunRequest
from launcher.decide.runplan.runoptions import RunOptions
from launcher.exitcodes import EXIT_FABRIC
from launcher.hosts.hostfile import fold
from launcher.job.fabric import FabricWatch
from launcher.job.hangwatch import HangWatch
from launcher.job.node import JobSpec, node_session
from launcher.job.nodemsg import rank_owners
from launcher.job.orchestrate import Job, JobState, LineRouter, NodeLaunch, Policy
from launcher.job.prepare import Prepared
from launcher.job.probes import HOST_PYTHON
from launcher.output import render
from launcher.output.fold import StderrFolder
from launcher.text.words import count

if TYPE_CHECKING:
    from launcher.commands.detach import Detacher
    from launcher.job.control import StopRequest
    from launcher.output.archive import RunArchive
    from launcher.output.console import Console


async def supervise(plan: LaunchPlan, req: RunRequest, opts: RunOptions, prep: Prepared,
                    archive: RunArchive, detacher: Detacher | None, payload: Payload = NO_PAYLOAD,
                    *, earlier: HangWatch | None = None,
                    retried: Callable[[RunResult], bool] | None = None) -> RunResult:
    """One job over the plan's nodes, followed to its verdict (``Attempt``'s arguments)."""
    return await Attempt(plan, req, opts, prep, archive, detacher, payload, earlier=earlier,
                         retried=retried).run()


class Attempt:
    """One job over the plan's nodes, followed to its verdict (with --restarts: one attempt,
    ``req.attempt``; ``earlier``: the attempt before's hang watch, whose records go on;
    ``retried``: whether the restart loop relaunches after this result, asked before the
    summary is said, so that an attempt retried says ``attempt N failed``, never FAILED).

    ``run`` makes the live parts below, in this order, and they stay for whoever built the
    attempt to read after it (the restart loop: ``watch``)."""

    console: Console
    board: NodeBoard
    out: RunPipeline
    sampling: RunSampling | None
    errors: ErrorKeeper  # why a rank died: its stderr, its node's evidence
    job: Job
    watch: HangWatch
    fabric: FabricWatch
    clock: StartupClock

    def __init__(self, plan: LaunchPlan, req: RunRequest, opts: RunOptions, prep: Prepared,
                 archive: RunArchive, detacher: Detacher | None,
                 payload: Payload = NO_PAYLOAD, *, earlier: HangWatch | None = None,
                 retried: Callable[[RunResult], bool] | None = None) -> None:
        self.plan, self.req, self.opts, self.prep = plan, req, opts, prep
        self.archive, self.detacher, self.payload = archive, detacher, payload
        self.earlier, self.retried = earlier, retried
        self.recorder = RunRecorder(archive)
        self.labels = [n.host.label for n in plan.nodes]

    async def run(self) -> RunResult:
        """Start the job on every node, follow it to its end, judge it, record it."""
        self.console = console = self._console()
        launches = self._launches()
        tails = TailKeeper()
        self.board = NodeBoard(self.labels, self.plan.world_size)
        console.status = self.board.render
        folder = StderrFolder(self.plan.world_size, len(self.labels), fold_hosts=fold)
        async with RunPipeline(console, self.archive, tails=tails, take=self.payload.take,
                               folder=folder) as out:
            self.out = out
            self._announce()
            self._observe(launches)
            outcome = await self._follow()
            result = self._judge(outcome, tails)
        self.recorder.end(result, out.skipped, (self.watch, self.sampling, self.fabric),
                          self.clock.meta(self.archive.meta.get("startup"), self.req.attempt))
        return result

    def _console(self) -> Console:
        from launcher.output.console import Console

        opts, plan = self.opts, self.plan
        # with --json, stdout holds the one JSON document: the human output goes to stderr
        return Console(sys.stderr if opts.reports.as_json else sys.stdout,
                       color=opts.display.color, ranks=opts.display.ranks,
                       hosts=opts.display.hosts_filter,
                       sanitize=False if opts.display.raw else None, labels=self.labels,
                       world_size=plan.world_size, timestamps=opts.display.timestamps)

    def _launches(self) -> dict[str, NodeLaunch]:
        """What each node runs: the supervisor's spec, its python, where and as which
        node rank, adopting the node's probe process."""
        plan, req, limits = self.plan, self.req, self.opts.limits
        launches = {}
        owners = rank_owners({n.host.label: n.ranks for n in plan.nodes},
                             planned=plan.rdzv == "static")
        torch_versions = self.archive.meta.get("torch_versions") or {}
        for node in plan.nodes:
            spec = JobSpec(argv=node.argv, env=node.exported_env(),
                           rank_shim=True, grace=limits.grace,
                           heartbeat_timeout=limits.heartbeat_timeout,
                           heartbeat_interval=min(2.0, limits.heartbeat_timeout / 4),
                           files=self.payload.files,
                           flight_recorder=flight_names(torch_versions.get(node.host.label)),
                           container=node.container.wire() if node.container else None,
                           nccl_account=wants_account(v.name for v in node.env),
                           warm=self.opts.preload, session=node_session(req, self.opts))
            probes = self.prep.pre.probes  # the probe there becomes the supervisor: same
            #                     python (the plan's is host.python or req.python, as the
            #                     probe's), workdir and setup
            adopt = functools.partial(probes.become, node.host.label, req.workdir) \
                if probes is not None else None
            host_python = HOST_PYTHON if node.container else node.python  # --image: the host's
            launches[node.host.label] = NodeLaunch(spec, python=host_python, workdir=req.workdir,
                                                   setup=req.setup, node_rank=node.node_rank,
                                                   adopt=adopt, ranks=owners[node.host.label])
        return launches

    def _policy(self) -> Policy:
        limits, req = self.opts.limits, self.req
        return Policy(grace=limits.grace, timeout=limits.timeout,
                      start_timeout=limits.start_timeout, fail_fast=True,
                      fanout=self.opts.connection.fanout, rank_fail_fast=req.max_restarts == 0,
                      hangup_stops=self.detacher is None)

    def _announce(self) -> None:
        """The run's first line (and, on a terminal, how to stop it)."""
        req, plan, archive = self.req, self.plan, self.archive
        nodes = count(len(plan.nodes), "node")
        attempt = f" attempt {req.attempt}" if req.restarts or req.attempt > 1 else ""
        if attempt:
            archive.begin_attempt(req.attempt)
        self.out.message(f"run {archive.run_id}{attempt}: {nodes}, world size "
                         f"{plan.world_size}, master {plan.master_addr}:{plan.master_port}; "
                         f"archive {archive.path}")
        if self.detacher is None and req.attempt == 1 and _on_a_terminal():
            # one short line, and only where a terminal can close under the run (not in CI
            # logs or pipes): docs/runs.md
            render.note(STOP_NOTE)

    def _observe(self, launches: dict[str, NodeLaunch]) -> None:
        """The job, and its observers (job/events.py), called in this order: the
        exit-barrier fold, the status line, the hang watch, NCCL's account, the failure
        evidence, the start-up clock, the samplers."""
        plan, opts, out, req = self.plan, self.opts, self.out, self.req
        self.sampling = RunSampling(
            self.archive, plan, opts.watch.sample_interval, opts.watch.stragglers, out.message,
            heartbeat_timeout=opts.limits.heartbeat_timeout,
            attempt=req.attempt if req.restarts or req.attempt > 1 else None) \
            if opts.watch.sample_interval > 0 else None
        out.barrier.ranks = {n.host.label: len(n.ranks) for n in plan.nodes}
        self.errors = ErrorKeeper()
        self.job = job = Job([n.host for n in plan.nodes], launches, self._policy(),
                             LineRouter(out, {n.host.label: n.node_rank for n in plan.nodes}),
                             on_state=self._state, victim=self._victim)
        out.observers = job.observers
        job.observe(out)
        job.observe(self.board)
        self.watch = watch = hang_watch(job, plan, opts, self.recorder, out, self.board)
        watch.attempt = req.attempt
        if self.earlier is not None:
            watch.continue_from(self.earlier)
        self.fabric = fabric = FabricWatch(plan, opts.watch.require_fabric, out.message,
                                           self._fabric_failed)
        fabric.on_record = functools.partial(self.recorder.part, fabric)
        job.observe(fabric)
        job.observe(Evidence(self.errors))
        self.clock = StartupClock(self.labels, self.prep.pre.clock)
        job.observe(self.clock)  # where start-up went, per node (docs/goodput.md)
        if self.sampling is not None:
            job.observe(self.sampling)

    async def _follow(self) -> JobOutcome:
        """The job run to its end, the hang watch beside it, the control socket served."""
        from launcher.job.stoppable import ControlSocket

        control = ControlSocket(self.archive.dir, self._stop, on_stacks=self._stacks)
        refused = await control.open()
        if refused is not None:  # e.g. a filesystem without unix sockets
            render.note(f"warning: no control socket in {self.archive.path} ({refused}): "
                        "`dtrain stop` cannot reach this run; stop it with Ctrl-C or SIGTERM")
        watching: asyncio.Task[None] | None = None
        prep, watch = self.prep, self.watch
        try:
            if self.sampling is not None:
                self.recorder.part(self.sampling)
            watching = asyncio.get_running_loop().create_task(watch.run(), name="hang-watch")
            return await alongside(self.job.run(prep.transport, prep.conns), self.sampling,
                                   prep.conns)
        finally:
            try:
                if watching is not None:  # cancelled and awaited on every way out
                    await cancel_and_wait(watching)
                    if not watching.cancelled() and watching.exception() is not None:
                        watch.trouble("its end", watching.exception())  # type: ignore[arg-type]
            finally:
                await control.aclose()

    def _judge(self, outcome: JobOutcome, tails: TailKeeper) -> RunResult:
        """The verdict over the job's end, its result, its summary on the console."""
        plan, out, watch = self.plan, self.out, self.watch
        self.fabric.finish()
        out.job_over(self.labels)
        for line in self.sampling.problems() if self.sampling is not None else ():
            out.message(line)
        v = verdict(outcome, plan, tails)
        failure = failure_reason(outcome, v, self.errors)
        if failure is not None:
            v.why = failure_lines(failure)
        results = node_results(outcome, plan, v)
        root_cause = root_cause_json(outcome, v, tails)
        if failure is not None:
            root_cause["failure"] = failure.json()
        meta = self.archive.meta
        result = RunResult(
            verdict=v, outcome=outcome, run_id=self.req.run_id, world_size=plan.world_size,
            master=f"{plan.master_addr}:{plan.master_port}", archive_path=self.archive.path,
            nodes=results, root_cause=root_cause, tails=tails, failure=failure,
            hangs=watch.hangs, progressed=watch.watch.any_progress,
            fabric=self.fabric.meta()["fabric"],
            versions={"torch": meta.get("torch_versions") or {},
                      "nccl": meta.get("nccl_versions") or {}})
        again = bool(v.code) and self.retried is not None and self.retried(result)
        for line in summary_lines(outcome, plan, v, judged=self.payload.judged,
                                  attempt=self.req.attempt, retried=again):
            out.summary(line)
        return result

    # -- the job's hooks: its state, a rank's death, NCCL's refusal, stop and stacks --

    def _state(self, state: JobState) -> None:
        self.recorder.state(state)
        if state is JobState.RUNNING:
            if self.detacher is not None:
                self.console.broken = True  # the terminal is gone: the archive has every line
                self.detacher.detach(self.archive.run_id, self.archive.dir)
        elif state is JobState.TEARING_DOWN:
            self.out.stopping()

    def _victim(self, f: Failure) -> bool:
        return self.errors.victim(f.host, f.rank, f.signal)

    def _fabric_failed(self, host: str, why: str) -> None:
        now = time.time()
        self.out.message(f"{why}: stopping every node")
        self.job.declare_failure(Failure("fabric", host, code=EXIT_FABRIC, t=now, seen=now,
                                         error=why))

    def _stop(self, stop: StopRequest) -> str:
        who = f"`dtrain stop` (pid {stop.pid})"
        self.job.request_stop(who, grace=stop.grace, kill=stop.kill)
        return "stopping"

    async def _stacks(self, pid: int) -> dict[str, Any]:
        dump = await self.watch.dump("stacks", f"`dtrain stacks` (pid {pid})")
        self.recorder.part(self.watch)
        return {**dump.json(), "lines": dump.folded.lines() if dump.folded else [],
                "ranks": len(dump.stacks)}


STOP_NOTE = "Ctrl-C or closing this terminal stops the run; --detach keeps it going"


def _on_a_terminal() -> bool:
    """stdin or stderr is a terminal: one that closes sends SIGHUP to the run."""
    return any(getattr(s, "isatty", lambda: False)() for s in (sys.stdin, sys.stderr))
