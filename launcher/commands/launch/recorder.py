"""A run's record: its archive directory held and locked for the launcher's life,
meta.json as the job starts and ends, --notify's events, and the launcher's title in ps.

``RunRecorder`` is a job's one writer of meta.json and --notify while it runs (the job's
state, the hang watch's and NCCL's records, the samplers', the end); the observers it
records for call it through their ``on_record`` hook, bound here to the recorder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from launcher import __version__
from launcher.commands.launch.result import RunResult, Word
from launcher.decide.outcome.liveness import launcher_timeout
from launcher.decide.runplan.plan import LaunchPlan, RunRequest, plan_json
from launcher.decide.runplan.runoptions import RunOptions
from launcher.exitcodes import EXIT_INTERRUPTED
from launcher.job.hangwatch import HangWatch
from launcher.job.orchestrate import JobState
from launcher.job.preflight import Preflight
from launcher.job.prepare import Prepared
from launcher.output import render
from launcher.runrecord import RunMeta, Startup
from launcher.text.redact import redact_command

if TYPE_CHECKING:
    from launcher.commands.detach import Detacher
    from launcher.output.archive import RunArchive


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
                                     # how long its nodes wait for it (decide/outcome/liveness.py)
                                     "launcher_timeout":
                                         launcher_timeout(opts.limits.heartbeat_timeout),
                                     "grace": opts.limits.grace}})


def title_launcher(kind: str, run_id: str, nodes: int) -> None:
    """What every user of the login node sees of this launcher in ps: ``dtrain run RUN 4
    nodes`` (comm ``dtrain-run``), the title `dtrain ps --everyone` reads (docs/runs.md); the
    command line it replaces (the script's arguments) is no one else's business."""
    from launcher.nodeside.nodetitle import set_title
    from launcher.text.words import count

    set_title(f"dtrain {kind} {run_id} {count(nodes, 'node')}",  # type: ignore[no-untyped-call]
              f"dtrain-{kind}")


class Recorded(Protocol):
    """What keeps a part of meta.json (the hang watch, NCCL's account, the samplers)."""

    def meta(self) -> RunMeta: ...


class RunRecorder:
    """One job's writes to meta.json and its --notify events, in one place (its archive
    and what each record holds stay where they are: the archive, the observers)."""

    def __init__(self, archive: RunArchive) -> None:
        self.archive = archive

    def state(self, state: JobState) -> None:
        """The job running, or being torn down: meta.json's ``state``."""
        if state is JobState.RUNNING:
            self.archive.update_meta(state="running")
        elif state is JobState.TEARING_DOWN:
            self.archive.update_meta(state="stopping")

    def part(self, source: Recorded) -> None:
        """``source``'s part of meta.json, rewritten (NCCL's account; the hang watch's
        records after `dtrain stacks`; the samplers' at the start)."""
        self.archive.update_meta(**source.meta())

    def hang(self, watch: HangWatch) -> None:
        """A hang declared: into meta.json, and to --notify (with the culprit)."""
        from launcher.job import notify

        self.archive.update_meta(**watch.meta())
        if not watch.hangs:
            return
        h = watch.hangs[-1].json()
        c = h["culprit"]
        who = f"rank {c['rank']} on {c['host']}" if c else "no culprit named"
        notify.event("hang", f"hang declared after {h['stalled_s']} s without progress: "
                     f"{who}", culprit=c, attempt=h["attempt"])

    def end(self, result: RunResult, skipped: int, parts: Sequence[Recorded | None],
            startup: list[Startup]) -> None:
        """The job's end: its verdict, per-node results, what the console skipped, each
        part's records (the hang watch, the samplers, NCCL's account), its start-up."""
        end: RunMeta = {"end": time.time(), "exit_code": result.code,
                        "outcome": result.verdict.outcome, "state": "finished",
                        "root_cause": result.root_cause, "nodes": result.nodes,
                        "console_skipped": skipped}
        for part in parts:
            if part is not None:
                end.update(part.meta())
        end["startup"] = startup
        self.archive.update_meta(**end)


def with_ledger(result: RunResult, archive: RunArchive) -> RunResult:
    """The result with the run's goodput ledger, once held_run's end has made it."""
    return replace(result, goodput=archive.meta.get("goodput"))
