"""`dtrain exec`: one command on every node, output tagged by host (the pdsh replacement)."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher import defaults
from launcher.decide.outcome.outcomes import JobOutcome
from launcher.exitcodes import EXIT_TIMEOUT, EXIT_UNREACHABLE, exit_for_signal
from launcher.hosts.where import failed_hosts_lines, leave_out_hint
from launcher.job.node import JobSpec
from launcher.job.orchestrate import Job, LineRouter, NodeLaunch, Policy
from launcher.models import Host
from launcher.output import render
from launcher.output.console import Console, Gatherer, fold_hosts
from launcher.output.fastout import ExecOutput
from launcher.output.pipeline import OutputPipeline
from launcher.text.termsafe import clean_text
from launcher.transports import AutoTransport
from launcher.transports.ssh import SSHSettings

if TYPE_CHECKING:  # --image only: exec without it does not import the container decisions
    from launcher.decide.runplan.container import ContainerRequest
    from launcher.output.report import CommandReport

EXEC_GRACE = 2.0


@dataclass(frozen=True)
class ExecRequest:
    """What the user asked `dtrain exec` for."""

    command: tuple[str, ...]
    gather: bool = False
    timeout: float | None = None
    fanout: int = defaults.FANOUT
    python: str = "python3"
    color: bool | None = None
    raw: bool = False  # --raw: the nodes' control sequences reach the terminal
    grace: float = EXEC_GRACE
    heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT_S
    transport: str = "auto"
    prefix: bool = True  # False: -N, the nodes' lines without their host tag
    as_json: bool = False  # one dtrain.exec/1 document on stdout; the output goes to stderr
    junit: str | None = None
    timestamps: bool = False  # --timestamps: each console line starts with its arrival time
    container: ContainerRequest | None = None  # --image: the command runs inside it


def exec_spec(command: Sequence[str], *, grace: float = EXEC_GRACE,
              heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT_S) -> JobSpec:
    """One argument is a shell command line (as ssh/pdsh take it); several are an exact argv."""
    interval = min(2.0, heartbeat_timeout / 4)
    if len(command) == 1:
        return JobSpec(shell=command[0], grace=grace, heartbeat_timeout=heartbeat_timeout,
                       heartbeat_interval=interval)
    return JobSpec(argv=tuple(command), grace=grace, heartbeat_timeout=heartbeat_timeout,
                   heartbeat_interval=interval)


def exit_code(outcome: JobOutcome) -> int:
    """124 timeout, 128+N interrupted, 255 unreachable, else the largest remote code."""
    if outcome.timed_out:
        return EXIT_TIMEOUT
    if outcome.interrupted:
        return exit_for_signal(outcome.interrupted)
    codes = [n.exit_code for n in outcome.nodes.values() if n.exit_code is not None]
    worst = max(codes, default=0)
    if any(n.exit_code is None for n in outcome.nodes.values()):
        return EXIT_UNREACHABLE
    return worst


def summary(outcome: JobOutcome, hosts: Sequence[Host] = ()) -> list[str]:
    """Failed hosts, folded, grouped by what went wrong, in hostfile order. Unreachable
    hosts come with their hostfile lines and the exact --exclude that skips them."""
    order = [h.label for h in hosts] or list(outcome.nodes)
    nodes = {label: outcome.nodes[label] for label in order if label in outcome.nodes}
    nodes.update(outcome.nodes)
    unreachable = {label: why for label, why in outcome.connect_errors.items()
                   if label in nodes}
    known = [h for h in hosts if h.label in unreachable]
    lines = failed_hosts_lines(known, {k: f"not reached: {v}" for k, v in unreachable.items()})
    lines += [f"{label}: not reached: {unreachable[label]}" for label in unreachable
              if label not in {h.label for h in known}]
    groups: dict[str, list[str]] = {}
    for label, node in nodes.items():
        if label in unreachable:
            continue
        if node.exit_code is None:
            groups.setdefault(f"not run: {node.error}", []).append(label)
        elif node.exit_code != 0:
            what = f"killed by signal {node.signal}" if node.signal else f"exit {node.exit_code}"
            if node.error:  # it never started: the supervisor says why, as a shell would
                what = f"{node.error} ({what})"
            groups.setdefault(what, []).append(label)
    lines += [f"{fold_hosts(labels)}: {what}" for what, labels in groups.items()]
    if known:
        lines.append(leave_out_hint(known).replace("fix ", "unreachable: fix ", 1))
    return lines


async def exec_async(hosts: Sequence[Host], req: ExecRequest,
                     settings: SSHSettings) -> JobOutcome:
    """Run the command on every host; the job's outcome (``exit_code`` gives the code)."""
    stdout = sys.stderr if req.as_json else sys.stdout
    spec = exec_spec(req.command, grace=req.grace, heartbeat_timeout=req.heartbeat_timeout)
    specs = {h.label: spec for h in hosts}
    if req.container is not None or any(h.image for h in hosts):
        specs = await container_specs(hosts, req, spec, settings)
    launches = {h.label: NodeLaunch(specs[h.label], python=h.python or req.python)
                for h in hosts}
    policy = Policy(grace=req.grace, timeout=req.timeout, fail_fast=False, fanout=req.fanout,
                    fanout_whole_job=True)
    probe = AutoTransport(settings, req.transport, say=render.note)
    probe.choose(hosts)  # a forced srun that cannot work: exit 2 before anything starts
    if req.gather:
        gatherer = Gatherer(h.label for h in hosts)
        console = Console(stdout, err_stream=sys.stderr, color=req.color,
                          labels=[h.label for h in hosts], sanitize=False if req.raw else None,
                          timestamps=req.timestamps)
        async with OutputPipeline(console, gatherer=gatherer) as out:
            async with probe as transport:
                outcome = await Job(hosts, launches, policy, LineRouter(out)).run(transport)
        report = gatherer.render()
        stdout.write(clean_text(report) if console.sanitize else report)
        stdout.flush()
    else:
        fast = ExecOutput([h.label for h in hosts], color=req.color, out=stdout.buffer,
                          sanitize=False if req.raw else None, timestamps=req.timestamps,
                          prefix=req.prefix)
        try:
            async with probe as transport:
                outcome = await Job(hosts, launches, policy, fast).run(transport)
        finally:
            fast.close()
    for line in summary(outcome, hosts):
        render.note(line)
    return outcome


async def container_specs(hosts: Sequence[Host], req: ExecRequest, spec: JobSpec,
                          settings: SSHSettings) -> dict[str, JobSpec]:
    """--image (or a hostfile's image:): each node's runtime and image first (a node without
    them is named before anything starts), then the command inside, in the node's home
    (exec's directory)."""
    import dataclasses

    from launcher.decide.runplan.container import (
        NodeContainerFacts,
        command_for,
        for_host,
        image_problems,
    )
    from launcher.errors import PreflightFailed
    from launcher.job.containers import probe_containers
    from launcher.output.archive import new_run_id

    reqs = {h.label: c for h in hosts if (c := for_host(req.container, h.image))}
    async with AutoTransport(settings, req.transport, say=render.note) as transport:
        facts, homes, errors = await probe_containers(
            transport, hosts, reqs, fanout=req.fanout,
            connect_timeout=settings.connect_timeout, python=req.python)
    problems = [f"{label}: not reached: {why}" for label, why in errors.items()]
    problems += image_problems({k: v for k, v in reqs.items() if k not in errors}, facts)
    if problems:
        raise PreflightFailed("; ".join(problems), hint="nothing was started")
    run_id = "exec-" + new_run_id()
    out = {h.label: spec for h in hosts}
    for h in hosts:
        if h.label not in reqs:
            continue
        f, bits = facts[h.label], homes[h.label]
        assert f.runtime is not None  # image_problems names a node without one
        cmd = command_for(reqs[h.label], f.runtime,
                          NodeContainerFacts(bits.gpus, bits.rdma, bits.shm_bytes),
                          run_id=run_id, host=h.name, attempt=1, workdir=bits.home,
                          grace=req.grace)
        out[h.label] = dataclasses.replace(spec, container=cmd.wire())
    return out


def exec_report(outcome: JobOutcome | None, code: int, req: ExecRequest, started: float,
                hosts: Sequence[Host]) -> CommandReport:
    """dtrain.exec/1: per node, its exit code (no ranks: exec runs one command per node)."""
    from launcher.output.report import ERROR, FAILED, PASSED, CommandReport, NodeResult

    nodes = []
    for h in hosts:
        node = outcome.nodes.get(h.label) if outcome else None
        if node is None:
            nodes.append(NodeResult(h.label, ERROR, None, "not started"))
            continue
        status = PASSED if node.exit_code == 0 else ERROR if node.exit_code is None else FAILED
        msg = node.error or (f"killed by signal {node.signal}" if node.signal else
                             None if node.exit_code == 0 else f"exit {node.exit_code}")
        dur = node.duration if isinstance(node.duration, (int, float)) else None
        nodes.append(NodeResult(h.label, status, node.exit_code, msg, dur,
                                stderr_tail=tuple(node.stderr_tail)))
    lines = summary(outcome) if outcome else []
    text = "; ".join(lines) if lines else ("ok" if code == 0 else f"exit {code}")
    root = None
    if code:
        first = next((n for n in nodes if n.status != PASSED), None)
        root = {"kind": "node" if first else "job", "host": first.host if first else None,
                "rank": None, "exit_code": code, "summary": text}
    return CommandReport("exec", code, text, started, time.time(), tuple(nodes), root, None,
                         {"command_line": shlex.join(req.command) if len(req.command) > 1
                          else req.command[0]})


def run_exec(hosts: Sequence[Host], req: ExecRequest, settings: SSHSettings) -> int:
    """`dtrain exec`; --json/--junit report every node's exit code (dtrain.exec/1)."""
    from launcher.commands.entry import INTERRUPTED, Ended, Reports, run_command

    reports = Reports(req.as_json, req.junit)

    def conclude(ended: Ended[JobOutcome]) -> int | CommandReport:
        code = INTERRUPTED if ended.result is None else exit_code(ended.result)
        if not reports.made:
            return code
        return exec_report(ended.result, code, req, ended.started, hosts)

    return run_command("exec", hosts, lambda: exec_async(hosts, req, settings), conclude,
                       reports=reports)
