"""A run's job from its plan to its verdict: the output pipeline, the live status line, the
archive directory held and locked, meta.json, and one supervised job (``supervise``), which
`run` (once, or once per attempt with --restarts: commands/restarts.py) and `smoke` share.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher import __version__
from launcher.aio import cancel_and_wait
from launcher.commands.run_sampling import RunSampling, alongside
from launcher.commands.startup import StartupClock
from launcher.decide.failures import ErrorKeeper, FailureReason
from launcher.decide.flight import flight_names
from launcher.decide.hang import Hang, ProgressWatch, compile_progress
from launcher.decide.liveness import launcher_timeout
from launcher.decide.nccl_account import wants_account
from launcher.decide.outcomes import Failure, JobOutcome
from launcher.decide.plan import LaunchPlan, RunRequest, plan_json
from launcher.decide.runoptions import RunOptions
from launcher.decide.verdict import (
    TailKeeper,
    Verdict,
    failure_lines,
    failure_reason,
    node_results,
    root_cause_json,
    summary_lines,
    verdict,
)
from launcher.exitcodes import EXIT_FABRIC, EXIT_INTERRUPTED
from launcher.hosts.hostfile import fold
from launcher.job.events import Exit, Hello, Observer, Observers, RankExit, Stopping
from launcher.job.fabric import FabricWatch
from launcher.job.hangwatch import HangWatch
from launcher.job.node import JobSpec
from launcher.job.nodemsg import rank_owners
from launcher.job.orchestrate import Job, JobState, LineRouter, NodeLaunch, Policy
from launcher.job.preflight import Preflight
from launcher.job.prepare import Prepared
from launcher.job.probes import HOST_PYTHON
from launcher.models import Host, OutputLine
from launcher.output import render
from launcher.output.fold import ExitBarrierNoise, ShutdownChatter, StderrFolder
from launcher.output.pipeline import OutputPipeline
from launcher.runrecord import Attempt, NodeResult, RootCause, RunMeta
from launcher.text.redact import redact_command
from launcher.text.words import count

if TYPE_CHECKING:
    from launcher.commands.detach import Detacher
    from launcher.output.archive import RunArchive


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


@dataclass(frozen=True)
class Payload:
    """What a command adds to a run's job: files shipped in every supervisor's spec (written
    to its private directory), and the output lines it takes out of the console and the
    archive (dtrain smoke's report lines)."""

    files: Mapping[str, str] = field(default_factory=dict)
    take: Callable[[OutputLine], bool] | None = None
    # the job is part of a command with its own verdict (smoke's PASS/FAIL): its summary
    # says how the job ended, never "ok", which the verdict may contradict
    judged: bool = False
    kind: str = "run"  # the command, as `dtrain ps` lists it (run, smoke)


NO_PAYLOAD = Payload()


@dataclass(frozen=True)
class RunResult:
    """What a launch returned (torch elastic's vocabulary: the plan is the spec, the Job the
    group of workers, this the run's result): the verdict and its evidence."""

    code: int
    outcome: JobOutcome
    verdict: Verdict
    tails: TailKeeper
    archive_path: Path
    archive: RunArchive  # still holding the run directory (smoke adds to it)
    nodes: list[NodeResult]  # meta.json's per-node results
    root_cause: RootCause
    run_id: str
    world_size: int
    master: str
    hangs: list[Hang] = field(default_factory=list)  # dicts only at the output's edge
    failure: FailureReason | None = None  # why the root-cause rank died
    progressed: bool = False  # a progress line was seen (--restarts: decide.restarts)
    watch: HangWatch | None = None  # the attempt's hang watch (its records go on)
    attempts: list[Attempt] = field(default_factory=list)  # meta.json's, --restarts
    fabric: dict[str, Any] | None = None  # NCCL's account (docs/fabric.md), None: none


def run_extra(result: RunResult | None) -> dict[str, Any]:
    """dtrain.run/1's ``run`` section (None: the run never got a result, e.g. Ctrl-C while
    connecting)."""
    if result is None:
        return {"run_id": None, "world_size": 0, "master": None, "stop_reason": None,
                "hangs": [], "attempts": [], "fabric": None, "goodput": None, "restarts": 0}
    return {"run_id": result.run_id, "world_size": result.world_size,
            "master": result.master, "stop_reason": result.outcome.stop_reason,
            "hangs": [h.json() for h in result.hangs], "attempts": result.attempts,
            "fabric": result.fabric,
            "goodput": result.archive.meta.get("goodput"),
            "restarts": sum(1 for a in result.attempts if a.get("relaunched") is not None)}


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
    """decide/failures.py's ErrorKeeper (below job/), fed as an observer: each rank's stderr
    lines and the node's evidence of its death."""

    def __init__(self, keeper: ErrorKeeper) -> None:
        self.keeper = keeper

    def on_lines(self, lines: Sequence[OutputLine]) -> None:
        self.keeper.observe(lines)

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        self.keeper.rank_exit(host.label, ev.end.rank, ev.end.evidence)


def _meta_start(req: RunRequest, opts: RunOptions, plan: LaunchPlan,
                pre: Preflight) -> RunMeta:
    torch_versions = {label: f.torch_version for label, f in pre.facts.items()}
    nccl_versions = {label: f.nccl_version for label, f in pre.facts.items()}
    return {
        "run_id": req.run_id, "dtrain_version": __version__,
        "command": list(opts.command),
        "script": req.script,
        "args": redact_command(req.args, (), (*req.env, *req.shadowed_env), req.hidden_env),
        "module": req.module,
        "workdir": req.workdir, "torch_versions": torch_versions,
        "nccl_versions": nccl_versions,
        "start": time.time(), "plan": plan_json(plan),
        "hosts": [n.host.label for n in plan.nodes], "world_size": plan.world_size,
        "layout": [{"host": n.host.label, "node_rank": n.node_rank, "ranks": list(n.ranks)}
                   for n in plan.nodes],
        # how to reach each host again (`dtrain top RUN`): as the hostfile gave it
        "host_entries": [{"label": n.host.label, "name": n.host.name, "user": n.host.user,
                          "port": n.host.port, "python": n.host.python} for n in plan.nodes],
    }


# what a run's end hands --notify's ``ended`` besides the verdict: a word and its fields
# (the last failed attempt's fingerprint, docs/incidents.md); None: nothing
Word = tuple[str, Mapping[str, Any]] | None


@contextlib.contextmanager
def held_run(req: RunRequest, opts: RunOptions, detacher: Detacher | None,
             ending: Callable[[RunArchive], Word] | None = None) -> Iterator[RunArchive]:
    """The run's archive directory, created and locked for the launcher's life (a crash or
    a Ctrl-C before the job ended is recorded in meta.json). ``ending``: called once the
    finished run's goodput ledger is in meta.json, before --notify's ``ended`` (the
    incidents' time lost); what it returns is said in ``ended``."""
    from launcher.output.archive import RunArchive
    from launcher.output.runlock import LOCK, LauncherLock

    archive = RunArchive.create(opts.reports.archive_dir, req.run_id)
    lock: LauncherLock | None = None
    try:
        lock = LauncherLock.acquire(archive.dir, detached=detacher is not None)
    except OSError as exc:  # a filesystem without locks: the run goes on, ps cannot tell
        render.note(f"warning: cannot lock {archive.path / LOCK} ({exc.strerror}): `dtrain "
                    "ps` will show this run as 'launcher lost' while it runs")
    from launcher.job import notify

    if notify.start(opts.watch.notify, req.run_id, render.note):
        notify.event("started", "started")
    word: Word = None
    try:
        yield archive
        if archive.meta.get("state") == "finished":
            from launcher.commands.goodput import record

            record(archive)  # meta.json's goodput ledger (docs/goodput.md)
            if ending is not None:
                word = ending(archive)
    except BaseException as exc:  # a launcher crash or a Ctrl-C before the job ran: say so
        if "exit_code" not in archive.meta:
            if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
                # Ctrl-C while the job starts (asyncio.run cancels the body): exit 130, as
                # the launcher's own exit says; the verdict names it (docs/reliability.md)
                how = "interrupted by Ctrl-C before the job ran"
                archive.update_meta(end=time.time(), state="finished", exit_code=EXIT_INTERRUPTED,
                                    outcome=how, root_cause={
                                        "kind": "interrupted", "host": None, "rank": None,
                                        "exit_code": EXIT_INTERRUPTED, "summary": how})
            else:
                archive.update_meta(end=time.time(), state="finished", exit_code=None,
                                    outcome=f"launcher ended early: {type(exc).__name__}")
        raise
    finally:
        ended(archive.meta, word)
        if lock is not None:
            lock.release()


def ended(meta: RunMeta, word: Word = None) -> None:
    """--notify: the run's end (its verdict and goodput; ``word``: the last failed attempt's
    fingerprint, seen how often), then the notifier's end (bounded)."""
    from launcher.job import notify

    g = meta.get("goodput") if isinstance(meta.get("goodput"), dict) else {}
    value = g.get("goodput") if isinstance(g, dict) else None
    good = f"{value * 100:.0f}%" if isinstance(value, int | float) else "not measured"
    extra = {"incident": dict(word[1])} if word is not None else {}
    notify.event("ended", f"ended: {meta.get('outcome') or 'no verdict'} (exit "
                 f"{meta.get('exit_code')}); goodput {good}"
                 + (f"; {word[0]}" if word is not None else ""), outcome=meta.get("outcome"),
                 exit_code=meta.get("exit_code"), goodput=value, **extra)
    notify.stop()


def start_meta(archive: RunArchive, req: RunRequest, opts: RunOptions, plan: LaunchPlan,
               prep: Prepared, detacher: Detacher | None) -> None:
    """meta.json as the job starts (each attempt's plan, with --restarts)."""
    archive.write_meta({**archive.meta, **_meta_start(req, opts, plan, prep.pre),
                        "state": "starting", "transport": prep.choice.kind,
                        **({"checkpoint_pattern": opts.watch.checkpoint}
                           if opts.watch.checkpoint else {}),
                        "launcher": {"pid": os.getpid(), "uid": os.getuid(),
                                     "host": socket.gethostname(),
                                     "detached": detacher is not None,
                                     "heartbeat_timeout": opts.limits.heartbeat_timeout,
                                     # how long its nodes wait for it (decide/liveness.py)
                                     "launcher_timeout":
                                         launcher_timeout(opts.limits.heartbeat_timeout),
                                     "grace": opts.limits.grace}})


async def launch(prep: Prepared, plan: LaunchPlan, req: RunRequest, opts: RunOptions, *,
                 detacher: Detacher | None = None, payload: Payload = NO_PAYLOAD,
                 ending: Callable[[RunResult], Word] | None = None) -> RunResult:
    """Start torchrun on every node and follow the job to its verdict (``ending``: called
    with the result once its goodput ledger is made, held_run's)."""
    got: list[RunResult] = []

    def end(archive: RunArchive) -> Word:
        return ending(got[0]) if ending is not None and got else None

    with held_run(req, opts, detacher, end) as archive:
        start_meta(archive, req, opts, plan, prep, detacher)
        archive.update_meta(kind=payload.kind)  # what `dtrain ps` shows in KIND
        title_launcher(payload.kind, req.run_id, len(plan.nodes))
        got.append(await supervise(plan, req, opts, prep, archive, detacher, payload))
        return got[0]


def title_launcher(kind: str, run_id: str, nodes: int) -> None:
    """What every user of the login node sees of this launcher in ps: ``dtrain run RUN 4
    nodes`` (comm ``dtrain-run``), the title `dtrain ps --everyone` reads (docs/runs.md); the
    command line it replaces (the script's arguments) is no one else's business."""
    from launcher.nodeside.nodetitle import set_title
    from launcher.text.words import count

    set_title(f"dtrain {kind} {run_id} {count(nodes, 'node')}",  # type: ignore[no-untyped-call]
              f"dtrain-{kind}")


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


def hang_recorded(archive: RunArchive, watch: HangWatch) -> None:
    """A hang declared: into meta.json, and to --notify (with the culprit)."""
    from launcher.job import notify

    archive.update_meta(**watch.meta())
    if not watch.hangs:
        return
    h = watch.hangs[-1].json()
    c = h["culprit"]
    who = f"rank {c['rank']} on {c['host']}" if c else "no culprit named"
    notify.event("hang", f"hang declared after {h['stalled_s']} s without progress: "
                 f"{who}", culprit=c, attempt=h["attempt"])


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
