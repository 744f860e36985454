"""`dtrain top`: the cluster (and a run) at a glance, live, with the slow node named.

One connection per node, one small sampler on each (nodeside/sampler.py, no daemon),
samples every ``--interval`` s. The views (screen.py live, view.py plain and rows) all draw
the same dtrain.top/1 document (model.py); runwatch.py adds what a run's archive says.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from launcher import defaults
from launcher.commands.entry import INTERRUPTED, Ended, run_command
from launcher.commands.top.model import TopState
from launcher.commands.top.runwatch import RunWatch
from launcher.commands.top.view import ViewOptions, plain
from launcher.decide.outcome.hang import compile_progress
from launcher.decide.outcome.stragglers import StragglerSettings
from launcher.exitcodes import EXIT_UNREACHABLE
from launcher.hosts.hostfile import filter_hosts, with_user
from launcher.job.sampling import OK, FollowPolicy, SamplerParams, follow
from launcher.models import Host
from launcher.output import render
from launcher.output.archive import list_runs, read_meta, resolve_run
from launcher.output.runstate import run_status
from launcher.transports import AutoTransport
from launcher.transports.ssh import SSHSettings


@dataclass(frozen=True)
class TopRequest:
    """What the user asked `dtrain top` for."""

    interval: float = 1.0
    once: bool = False
    as_json: bool = False
    count: int | None = None  # stop after this many snapshots (None: until q / Ctrl-C)
    view: ViewOptions = ViewOptions()
    color: bool | None = None
    python: str = "python3"
    transport: str = "auto"
    fanout: int = defaults.FANOUT
    connect_timeout: float = defaults.CONNECT_TIMEOUT_S
    ifaces: tuple[str, ...] = ()
    gpu: bool = True
    stragglers: StragglerSettings = StragglerSettings()
    live: bool | None = None  # None: the full screen exactly when stdout and stdin are a tty
    progress: str | None = None  # --progress REGEX (None: the default pattern)


def _tty() -> bool:
    return sys.stdout.isatty() and sys.stdin.isatty()


def sampler_params(req: TopRequest) -> SamplerParams:
    return SamplerParams(interval=req.interval, first=min(req.interval, 0.3),
                         ifaces=req.ifaces, gpu=req.gpu,
                         hb_timeout=max(30.0, req.interval * 10))


def policy(req: TopRequest) -> FollowPolicy:
    lost = max(5.0, req.interval * 3)
    return FollowPolicy(connect_timeout=req.connect_timeout, lost_after=lost,
                        reconnect_after=max(15.0, lost * 3), retry=5.0, fanout=req.fanout)


async def _first_round(state: TopState, req: TopRequest) -> None:
    """Wait (bounded) until every node sampled once or is known down."""
    deadline = time.monotonic() + req.connect_timeout * 2 + req.interval * 2 + 5
    while not state.all_reported() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def _stream(state: TopState, req: TopRequest) -> int:
    """--once, --json, or a pipe: snapshots on stdout every interval."""
    await _first_round(state, req)
    count = 1 if req.once else req.count
    n = 0
    next_at = time.monotonic()
    while True:
        doc = state.document()
        if req.as_json:
            sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        else:
            sys.stdout.write(("\n" if n else "") + plain(doc, req.view))
        sys.stdout.flush()
        n += 1
        if count is not None and n >= count:
            break
        next_at += req.interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    if req.once:
        return 0 if all(nd.state == OK for nd in state.nodes.values()) else EXIT_UNREACHABLE
    return 0


async def _poll_run(state: TopState, every: float) -> None:
    """A followed run's archive, re-read every interval (meta.json, new output lines)."""
    while state.run is not None:
        state.poll_run()
        await asyncio.sleep(every)


async def top_async(hosts: Sequence[Host], req: TopRequest, settings: SSHSettings,
                    state: TopState | None = None,
                    per_host: Mapping[str, SamplerParams] | None = None) -> int:
    """Sample every host until the view is done; returns the exit code."""
    transport = AutoTransport(settings, req.transport, say=render.note)
    transport.choose(hosts)  # a forced srun that cannot work: exit 2 before anything starts
    state = state or TopState([h.label for h in hosts], req.interval,
                              settings=req.stragglers)
    pythons = {h.label: h.python or req.python for h in hosts}
    live = _tty() and not (req.once or req.as_json) if req.live is None else req.live
    async with transport, asyncio.TaskGroup() as tg:
        sampling = tg.create_task(follow(transport, hosts, sampler_params(req), state.on_sample,
                                         state.on_state, policy(req), pythons, per_host),
                                  name="top:follow")
        polling = tg.create_task(_poll_run(state, req.interval), name="top:run")
        try:
            if live:
                from launcher.commands.top.screen import live as live_view

                code = await live_view(state, req.view, color=req.color,
                                       refresh=req.interval)
            else:
                code = await _stream(state, req)
        finally:
            sampling.cancel()
            polling.cancel()
    return code


def conclude(ended: Ended[int]) -> int:
    """The view's own code, or 130 for a Ctrl-C."""
    return INTERRUPTED if ended.result is None else ended.result


def run_top(hosts: Sequence[Host], req: TopRequest, settings: SSHSettings,
            state: TopState | None = None,
            per_host: Mapping[str, SamplerParams] | None = None) -> int:
    """`dtrain top`, through the one entry of every command body (commands/entry.py)."""
    try:
        return run_command("top", hosts, lambda: top_async(hosts, req, settings, state,
                                                           per_host), conclude)
    except BrokenPipeError:
        return 0  # `dtrain top | head`: the reader has what it wanted


# -- a run ---------------------------------------------------------------------------------

def latest_live_run(archive_dir: Path) -> str | None:
    """The most recently started run whose launcher is alive (a path), or None."""
    for run_dir in reversed(list_runs(archive_dir) if archive_dir.is_dir() else []):
        if run_status(run_dir).alive:
            return str(run_dir)
    return None


def run_top_for_run(archive_dir: Path, run: str, req: TopRequest, settings: SSHSettings, *,
                    hosts: list[Host] | None = None, include: str | None = None,
                    exclude: str | None = None, user: str | None = None) -> int:
    """`dtrain top RUN`: the run's hosts (--include/--exclude and -l applied; or ``hosts``,
    the ones -f/-H name), samplers told the run's ranks."""
    run_dir = resolve_run(archive_dir, run)
    # the run's own --progress (meta.json hang_policy, docs/hangs.md) unless top names one
    recorded = (read_meta(run_dir).get("hang_policy") or {}).get("progress")
    pattern = req.progress or (recorded if isinstance(recorded, str) else None)
    watch = RunWatch(run_dir, compile_progress(pattern))
    host_list = hosts if hosts is not None else with_user(
        filter_hosts(watch.hosts(), include, exclude), user)
    layout, ifaces = watch.layout, watch.ifaces()
    base = sampler_params(req)
    per_host = {h.label: replace(base, run_id=watch.run_id,
                                 ranks=tuple(layout.get(h.label, ())) or None,
                                 ifaces=req.ifaces or ((ifaces[h.label],)
                                                       if h.label in ifaces else ()))
                for h in host_list}
    state = TopState([h.label for h in host_list], req.interval, run=watch,
                     settings=req.stragglers)
    return run_top(host_list, req, settings, state, per_host)
