"""One supervised job over the plan's nodes, followed to its verdict (``supervise``): the
console, each node's launch, the stop policy, the job's observers, the control socket, the
verdict and meta.json's end."""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.aio import cancel_and_wait
from launcher.commands.launch.board import Evidence, NodeBoard
from launcher.commands.launch.pipeline import RunPipeline
from launcher.commands.launch.recorder import hang_recorded
from launcher.commands.launch.result import NO_PAYLOAD, Payload, RunResult
from launcher.commands.run_sampling import RunSampling, alongside
from launcher.commands.startup import StartupClock
from launcher.decide.failures import ErrorKeeper
from launcher.decide.flight import flight_names
from launcher.decide.hang import ProgressWatch, compile_progress
from launcher.decide.nccl_account import wants_account
from launcher.decide.outcomes import Failure
from launcher.decide.plan import LaunchPlan, RunRequest
from launcher.decide.runoptions import RunOptions
from launcher.decide.verdict import (
    TailKeeper,
    failure_lines,
    failure_reason,
    node_results,
    root_cause_json,
    summary_lines,
    verdict,
)
from launcher.exitcodes import EXIT_FABRIC
from launcher.hosts.hostfile import fold
from launcher.job.fabric import FabricWatch
from launcher.job.hangwatch import HangWatch
from launcher.job.node import JobSpec
from launcher.job.nodemsg import rank_owners
from launcher.job.orchestrate import Job, JobState, LineRouter, NodeLaunch, Policy
from launcher.job.prepare import Prepared
from launcher.job.probes import HOST_PYTHON
from launcher.output import render
from launcher.output.fold import StderrFolder
from launcher.runrecord import RunMeta
from launcher.text.words import count

if TYPE_CHECKING:
    from launcher.commands.detach import Detacher
    from launcher.output.archive import RunArchive


async def supervise(plan: LaunchPlan, req: RunRequest, opts: RunOptions, prep: Prepared,
                    archive: RunArchive, detacher: Detacher | None, payload: Payload = NO_PAYLOAD,
                    *, earlier: HangWatch | None = None,
                    retried: Callable[[RunResult], bool] | None = None) -> RunResult:
    """One job over the plan's nodes, followed to its verdict (with --restarts: one attempt,
    ``req.attempt``; ``earlier``: the attempt before's hang watch, whose records go on;
    ``retried``: whether the restart loop relaunches after this result, asked before the
    summary is said, so that an attempt retried says ``attempt N failed``, never FAILED)."""
    from launcher.job.control import StopRequest
    from launcher.job.stoppable import ControlSocket
    from launcher.output.console import Console

    # with --json, stdout holds the one JSON document: the human output goes to stderr
    console = Console(sys.stderr if opts.reports.as_json else sys.stdout, color=opts.display.color,
                      ranks=opts.display.ranks, hosts=opts.display.hosts_filter,
                      sanitize=False if opts.display.raw else None,
                      labels=[n.host.label for n in plan.nodes], world_size=plan.world_size,
                      timestamps=opts.display.timestamps)
    launches = {}
    owners = rank_owners({n.host.label: n.ranks for n in plan.nodes},
                         planned=plan.rdzv == "static")
    torch_versions = archive.meta.get("torch_versions") or {}
    for node in plan.nodes:
        spec = JobSpec(argv=node.argv, env=node.exported_env(),
                       rank_shim=True, grace=opts.limits.grace,
                       heartbeat_timeout=opts.limits.heartbeat_timeout,
                       heartbeat_interval=min(2.0, opts.limits.heartbeat_timeout / 4),
                       files=payload.files,
                       flight_recorder=flight_names(torch_versions.get(node.host.label)),
                       container=node.container.wire() if node.container else None,
                       nccl_account=wants_account(v.name for v in node.env),
                       warm=opts.preload)
        probes = prep.pre.probes  # the probe there becomes the supervisor: same python
        #                           (the plan's is host.python or req.python, as the probe's),
        #                           workdir and setup
        adopt = functools.partial(probes.become, node.host.label, req.workdir) \
            if probes is not None else None
        host_python = HOST_PYTHON if node.container else node.python  # --image: the host's
        launches[node.host.label] = NodeLaunch(spec, python=host_python, workdir=req.workdir,
                                               setup=req.setup, node_rank=node.node_rank,
                                               adopt=adopt, ranks=owners[node.host.label])
    limits = opts.limits
    policy = Policy(grace=limits.grace, timeout=limits.timeout, start_timeout=limits.start_timeout,
                    fail_fast=True, fanout=opts.connection.fanout,
                    rank_fail_fast=req.max_restarts == 0, hangup_stops=detacher is None)
    tails = TailKeeper()
    node_ranks = {n.host.label: n.node_rank for n in plan.nodes}
    hosts = [n.host for n in plan.nodes]
    board = NodeBoard([n.host.label for n in plan.nodes], plan.world_size)
    console.status = board.render
    folder = StderrFolder(plan.world_size, len(plan.nodes), fold_hosts=fold)
    async with RunPipeline(console, archive, tails=tails, take=payload.take,
                           folder=folder) as out:
        nodes = count(len(hosts), "node")
        attempt = f" attempt {req.attempt}" if req.restarts or req.attempt > 1 else ""
        if attempt:
            archive.begin_attempt(req.attempt)
        out.message(f"run {archive.run_id}{attempt}: {nodes}, world size {plan.world_size}, "
                    f"master {plan.master_addr}:{plan.master_port}; archive {archive.path}")
        if detacher is None and req.attempt == 1 and _on_a_terminal():
            # one short line, and only where a terminal can close under the run (not in CI
            # logs or pipes): docs/runs.md
            render.note(STOP_NOTE)

        def on_state(state: JobState) -> None:
            if state is JobState.RUNNING:
                archive.update_meta(state="running")
                if detacher is not None:
                    console.broken = True  # the terminal is gone: the archive has every line
                    detacher.detach(archive.run_id, archive.dir)
            elif state is JobState.TEARING_DOWN:
                archive.update_meta(state="stopping")
                out.stopping()

        sampling = RunSampling(archive, plan, opts.watch.sample_interval, opts.watch.stragglers,
                               out.message, heartbeat_timeout=opts.limits.heartbeat_timeout,
                               attempt=req.attempt if req.restarts or req.attempt > 1
                               else None) \
            if opts.watch.sample_interval > 0 else None

        out.barrier.ranks = {n.host.label: len(n.ranks) for n in plan.nodes}
        errors = ErrorKeeper()  # why a rank died: its stderr, its node's evidence
        job = Job(hosts, launches, policy, LineRouter(out, node_ranks), on_state=on_state,
                  victim=lambda f: errors.victim(f.host, f.rank, f.signal))
        out.observers = job.observers
        # the job's observers (job/events.py), called in this order: the exit-barrier fold,
        # the status line, the hang watch, NCCL's account, the failure evidence, the samplers
        job.observe(out)
        job.observe(board)
        watch = hang_watch(job, plan, opts, archive, out, board)
        watch.attempt = req.attempt
        if earlier is not None:
            watch.continue_from(earlier)

        def fabric_failed(host: str, why: str) -> None:
            now = time.time()
            out.message(f"{why}: stopping every node")
            job.declare_failure(Failure("fabric", host, code=EXIT_FABRIC, t=now, seen=now,
                                        error=why))

        fabric = FabricWatch(plan, opts.watch.require_fabric, out.message, fabric_failed,
                             on_record=lambda: archive.update_meta(**fabric.meta()))
        job.observe(fabric)
        job.observe(Evidence(errors))
        clock = StartupClock([n.host.label for n in plan.nodes], prep.pre.clock)
        job.observe(clock)  # where start-up went, per node (docs/goodput.md)
        if sampling is not None:
            job.observe(sampling)

        def on_stop(stop: StopRequest) -> str:
            who = f"`dtrain stop` (pid {stop.pid})"
            job.request_stop(who, grace=stop.grace, kill=stop.kill)
            return "stopping"

        async def on_stacks(pid: int) -> dict[str, Any]:
            dump = await watch.dump("stacks", f"`dtrain stacks` (pid {pid})")
            archive.update_meta(**watch.meta())
            return {**dump.json(), "lines": dump.folded.lines() if dump.folded else [],
                    "ranks": len(dump.stacks)}

        control = ControlSocket(archive.dir, on_stop, on_stacks=on_stacks)
        refused = await control.open()
        if refused is not None:  # e.g. a filesystem without unix sockets
            render.note(f"warning: no control socket in {archive.path} ({refused}): `dtrain "
                        "stop` cannot reach this run; stop it with Ctrl-C or SIGTERM")
        watching: asyncio.Task[None] | None = None
        try:
            if sampling is not None:
                archive.update_meta(**sampling.meta())
            watching = asyncio.get_running_loop().create_task(watch.run(), name="hang-watch")
            outcome = await alongside(job.run(prep.transport, prep.conns), sampling,
                                      prep.conns)
        finally:
            try:
                if watching is not None:  # cancelled and awaited on every way out
                    await cancel_and_wait(watching)
                    if not watching.cancelled() and watching.exception() is not None:
                        watch.trouble("its end", watching.exception())  # type: ignore[arg-type]
            finally:
                await control.aclose()
        fabric.finish()
        out.job_over([h.label for h in hosts])
        for line in sampling.problems() if sampling is not None else ():
            out.message(line)
        v = verdict(outcome, plan, tails)
        failure = failure_reason(outcome, v, errors)
        if failure is not None:
            v.why = failure_lines(failure)
        results = node_results(outcome, plan, v)
        root_cause = root_cause_json(outcome, v, tails)
        if failure is not None:
            root_cause["failure"] = failure.json()
        result = RunResult(v.code, outcome, v, tails, archive.path, archive, results,
                           root_cause, req.run_id, plan.world_size,
                           f"{plan.master_addr}:{plan.master_port}", watch.hangs, failure,
                           watch.watch.any_progress, watch, fabric=fabric.meta()["fabric"])
        again = bool(v.code) and retried is not None and retried(result)
        for line in summary_lines(outcome, plan, v, judged=payload.judged,
                                  attempt=req.attempt, retried=again):
            out.summary(line)
    end: RunMeta = {"end": time.time(), "exit_code": v.code, "outcome": v.outcome,
                    "state": "finished", "root_cause": root_cause, "nodes": results,
                    "console_skipped": out.skipped, **watch.meta(),
                    **(sampling.meta() if sampling is not None else {}), **fabric.meta(),
                    "startup": clock.meta(archive.meta.get("startup"), req.attempt)}
    archive.update_meta(**end)
    return result


STOP_NOTE = "Ctrl-C or closing this terminal stops the run; --detach keeps it going"


def _on_a_terminal() -> bool:
    """stdin or stderr is a terminal: one that closes sends SIGHUP to the run."""
    return any(getattr(s, "isatty", lambda: False)() for s in (sys.stdin, sys.stderr))


def hang_watch(job: Job, plan: LaunchPlan, opts: RunOptions, archive: RunArchive,
               out: RunPipeline, board: NodeBoard) -> HangWatch:
    """The run's hang watch (docs/hangs.md), an observer of the job: every output line,
    the ranks' starts, the nodes' stacks and flight recorder dumps."""
    policy = opts.watch.hang
    progress = ProgressWatch(compile_progress(policy.progress), range(plan.world_size),
                             time.time())
    watch = HangWatch(job, policy, progress, {n.host.label: list(n.ranks) for n in plan.nodes},
                      archive.dir, lambda text: out.message(text),
                      alive=lambda: job.state is JobState.RUNNING and board.ranks_done == 0,
                      on_record=lambda: hang_recorded(archive, watch))
    job.observe(watch)  # the output lines (progress), rank_start, stacks, flight
    return watch
