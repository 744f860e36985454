"""`dtrain smoke`: can every node of this set train together, at the fabric's speed?

`dtrain run`'s machinery (connect, probe, master check, per-node env, supervisor, archive,
exit codes) with a built-in job: nodeside/smoke_job.py, shipped in the supervisor's spec and
written to its private directory on each node (nothing installed, no shared filesystem
needed). The job's ``DTRAIN-SMOKE`` lines are taken out of the console and judged by
decide/fabric/smoke.py; this module renders the table and the verdict (docs/smoke.md).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

from launcher.commands.entry import Ended, finish, in_github_actions, run_command
from launcher.commands.launch import Payload, RunResult, launch_held
from launcher.commands.run import report_nodes
from launcher.decide.fabric.checks import failures as check_failures
from launcher.decide.fabric.checks import fast_checks
from launcher.decide.fabric.linerate import DEFAULT_LINE_FRACTION, LineRate, fabric_rate, node_rate
from launcher.decide.fabric.smoke import (
    DEFAULT_PAIR_FRACTION,
    DEFAULT_PAIR_TIMEOUT,
    SmokeFailure,
    SmokeResults,
    SmokeVerdict,
    choose_backend,
    evaluate,
    fmt_size,
    make_config,
    pair_schedule,
)
from launcher.decide.runplan.container import ContainerRequest
from launcher.decide.runplan.plan import RunRequest
from launcher.decide.runplan.runoptions import RunOptions
from launcher.errors import DtrainError
from launcher.exitcodes import EXIT_INTERRUPTED
from launcher.job.prepare import prepare
from launcher.models import Host, OutputLine
from launcher.nodeside.wire import program_source
from launcher.output import render
from launcher.output.junit import ExtraCase
from launcher.output.report import ERROR, FAILED, PASSED, CommandReport, NodeResult
from launcher.text.termsafe import inert
from launcher.text.words import count
from launcher.transports.ssh import SSHSettings

if TYPE_CHECKING:
    from launcher.output.archive import RunArchive

JOB_FILE = "dtrain_smoke.py"


class Interrupted(DtrainError):
    """Ctrl-C before the job had a verdict."""

    exit_code = EXIT_INTERRUPTED


@dataclass(frozen=True)
class SmokeRequest:
    """What the user asked `dtrain smoke` for (validated by the CLI)."""

    python: str = "python3"
    setup: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    backend: str | None = None  # None: nccl where every node has a GPU, else gloo
    max_size: int | None = None
    min_busbw: float | None = None
    pair_fraction: float = DEFAULT_PAIR_FRACTION
    # None: the hostfile's slots= as run takes them (decide/runplan/plan.nproc_for), else one per
    # GPU on NCCL, one per node on gloo
    nproc_per_node: str | None = None
    run_id: str = ""
    as_json: bool = False
    junit: str | None = None
    container: ContainerRequest | None = None  # --image (docs/containers.md)
    pairs: bool = False  # --pairs: the O(log n) pair rounds (decide/fabric/smoke.py log_rounds)
    pair_timeout: float = DEFAULT_PAIR_TIMEOUT  # --pair-timeout: a failed link after it
    line_fraction: float | None = None  # --line-fraction (None: 0.8 on NCCL, off on gloo)


@dataclass
class SmokeRun:
    """Everything one smoke run produced, for the human, JSON and JUnit outputs (what
    ``smoke_async`` returns; ``error`` is set by the conclusion when the body failed)."""

    started: float
    hosts: list[str]
    backend: str | None = None
    backend_reason: str = ""
    world_size: int = 0
    results: SmokeResults | None = None
    verdict: SmokeVerdict | None = None
    launch: RunResult | None = None
    archive: RunArchive | None = None  # the launch's, still holding the run directory
    error: DtrainError | None = None
    preflight_failures: tuple[SmokeFailure, ...] = ()
    line_rate: LineRate | None = None  # the slowest node's rate between nodes (docs/fabric.md)
    line_fraction: float = 0.0
    pair_rounds: int = 0


# -- rendering -------------------------------------------------------------------------------

def render_table(res: SmokeResults, v: SmokeVerdict, out: TextIO) -> None:
    """nccl-tests' all_reduce_perf table, then the node pairs."""
    w = out.write
    if res.sweep:
        w(f"# all_reduce sum float32, {inert(res.backend or '?')}, "
          f"{count(len(res.ranks), 'rank')}\n")
        w(f"#{'size':>11} {'count':>11} {'type':>6} {'redop':>6} {'time(us)':>10} "
          f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}\n")
        wrong = _wrong_by_size(res)
        for row in res.sweep:
            size = int(row["size"])
            bad = wrong.get(size)
            w(f"{size:>12} {int(row['count']):>11} {'float':>6} {'sum':>6} "
              f"{float(row['time_us']):>10.1f} {float(row['algbw']):>12.3f} "
              f"{float(row['busbw']):>12.3f} {'' if bad is None else bad:>7}\n")
    if v.pairs:
        w(f"# node pairs: send/recv both ways, {fmt_size(v.pairs[0].size)}, best of "
          f"several (GB/s per direction)\n")
        width = max(len(f"{p.a} <-> {p.b}") for p in v.pairs)
        for p in sorted(v.pairs, key=lambda p: p.gbps):
            mark = "  SLOW" if p.slow else ""
            w(f"  {f'{p.a} <-> {p.b}':<{width}} {p.time_us:>10.1f} us {p.gbps:>10.3f}"
              f"{mark}\n")
    out.flush()


def _wrong_by_size(res: SmokeResults) -> dict[int, int]:
    wrong: dict[int, int] = {}
    for checks in res.checks.values():
        for size, n in checks.items():
            wrong[int(size)] = wrong.get(int(size), 0) + n
    return wrong


def show(run: SmokeRun, human: TextIO) -> None:
    """The table and the verdict line, every control character a node sent inert."""
    if run.results is not None and run.verdict is not None:
        render_table(run.results, run.verdict, human)
        if run.pair_rounds and run.verdict.pairs:
            human.write(f"# node pairs measured in {run.pair_rounds} rounds\n")
        if run.line_rate is not None and run.verdict.busbw is not None \
                and len(run.hosts) > 1:
            rate = run.line_rate
            share = f"{run.verdict.busbw / rate.gbytes:.0%}" if rate.gbytes else "?"
            human.write(f"# line rate {rate.gbytes or 0:.3g} GB/s ({rate.host}: {rate.how}): "
                        f"busbw is {share} of it"
                        + (f", judged at --line-fraction {run.line_fraction:g}\n"
                           if run.line_fraction else " (not judged on gloo)\n"))
    human.write(inert(verdict_line(run)) + "\n")  # versions, names: what nodes reported
    human.flush()


def verdict_line(run: SmokeRun) -> str:
    v = run.verdict
    if run.error is not None:
        return f"smoke: ERROR: {run.error.message}"
    if v is None:
        return "smoke: ERROR: no verdict"
    return f"smoke: {'PASS' if v.ok else 'FAIL'}: {v.summary}"


# -- reports ---------------------------------------------------------------------------------

def _failures(run: SmokeRun) -> tuple[SmokeFailure, ...]:
    return run.preflight_failures + (run.verdict.failures if run.verdict else ())


def _node_results(run: SmokeRun) -> tuple[NodeResult, ...]:
    """The run's per-node/rank results, with smoke's named failures on their nodes."""
    base = {n.host: n for n in report_nodes(run.launch)} if run.launch else {}
    named: dict[str, list[str]] = {}
    for f in _failures(run):
        for host in f.hosts:
            named.setdefault(host, []).append(f.message)
    out = []
    for host in run.hosts:
        node = base.get(host) or NodeResult(host, ERROR if run.error else PASSED,
                                            message=run.error.message if run.error else None)
        if named.get(host) and node.status == PASSED:
            node = replace(node, status=FAILED, exit_code=node.exit_code,
                           message="; ".join(named[host]))
        facts = [r for r in (run.results.ranks.values() if run.results else ())
                 if r.host == host]
        details = {"ranks": {str(r.rank): {"hostname": r.hostname, "torch": r.torch,
                                           "nccl": r.nccl, "device": r.device,
                                           "device_count": r.device_count,
                                           "python": r.python} for r in facts}}
        out.append(replace(node, details=details))
    return tuple(out)


def command_report(run: SmokeRun, ended: float) -> CommandReport:
    v = run.verdict
    code = run.error.exit_code if run.error else v.code if v else 1
    summary = verdict_line(run)
    res = run.results or SmokeResults()
    extra: dict[str, Any] = {
        "backend": run.backend, "backend_reason": run.backend_reason,
        "world_size": run.world_size, "sweep": res.sweep,
        "pairs": [{"a": p.a, "b": p.b, "size": p.size, "time_us": p.time_us,
                   "gbps": p.gbps, "slow": p.slow} for p in (v.pairs if v else ())],
        "best_pair_gbps": v.best_pair if v else None,
        "busbw": v.busbw if v else None,
        "line_rate": {"gbytes": run.line_rate.gbytes, "host": run.line_rate.host,
                      "how": run.line_rate.how, "fraction": run.line_fraction}
        if run.line_rate is not None else None,
        "pair_rounds": run.pair_rounds,
        "failures": [{"check": f.check, "hosts": list(f.hosts), "ranks": list(f.ranks),
                      "message": f.message} for f in _failures(run)],
    }
    fails = _failures(run)
    root: dict[str, Any] | None = None
    if code:
        first = fails[0] if fails else None
        root = {"kind": first.check if first else "job",
                "host": first.hosts[0] if first and first.hosts else None,
                "exit_code": code, "summary": summary}
        if run.launch is not None and run.launch.root_cause.get("kind"):
            root = {**run.launch.root_cause, "summary": summary}
    archive = str(run.launch.archive_path) if run.launch and run.launch.archive_path else None
    return CommandReport("smoke", code, summary, run.started, ended, _node_results(run),
                         root, archive, extra)


def extra_cases(run: SmokeRun) -> list[ExtraCase]:
    """One testcase per cluster-wide check, so a CI report shows which check failed."""
    fails = _failures(run)
    cases = []
    for check in ("preflight", "versions", "correctness", "ranks", "pairs", "busbw"):
        mine = [f for f in fails if f.check == check]
        msg = "; ".join(f.message for f in mine) or None
        cases.append(ExtraCase(f"check {check}", FAILED if mine else PASSED, msg, msg or ""))
    return cases


def annotate(run: SmokeRun, stream: TextIO) -> None:
    """GitHub Actions: each failure as an ::error annotation naming host and rank."""
    from launcher.output.render import github_error

    for f in _failures(run):
        github_error(f"smoke {f.check}: {f.message}", hosts=f.hosts, ranks=f.ranks,
                     stream=stream)
    if run.error is not None:
        github_error(f"smoke: {run.error.message}", hosts=(run.error.host,)
                     if run.error.host else (), stream=stream)


# -- the command -----------------------------------------------------------------------------

async def smoke_async(hosts: Sequence[Host], req: SmokeRequest, opts: RunOptions,
                      settings: SSHSettings) -> SmokeRun:
    """Connect, probe, decide, launch the job, judge it."""
    from launcher.output.archive import check_run_id, new_run_id
    from launcher.output.rundir import check_archive_dir

    run = SmokeRun(time.time(), [h.label for h in hosts])
    run_id = check_run_id(req.run_id) if req.run_id else new_run_id()
    check_archive_dir(opts.reports.archive_dir)  # exit 2 before anything connects
    rreq = RunRequest(script=f"{{DTRAIN_DIR}}/{JOB_FILE}", python=req.python,
                      setup=req.setup, workdir=None, env=req.env, run_id=run_id,
                      container=req.container)
    unchecked = replace(opts, checks=replace(opts.checks, preflight=False))
    async with prepare(hosts, rreq, unchecked, settings,
                       transport=opts.connection.transport) as prep:
        pre = prep.pre
        bad = check_failures(fast_checks(pre.facts, hosts))
        if bad:
            run.preflight_failures = tuple(
                SmokeFailure("preflight", (r.host,), f"{r.host}: {r.check}: {r.detail}")
                for r in bad)
            return run
        run.backend, run.backend_reason = choose_backend(pre.facts, req.backend)
        cfg = replace(make_config(run.backend, req.max_size), pairs=req.pairs,
                      pair_timeout=req.pair_timeout)
        rreq = replace(rreq, nproc_per_node=req.nproc_per_node,
                       nproc_default="gpu" if run.backend == "nccl" else "1",
                       args=(json.dumps(cfg.to_json(), separators=(",", ":")),))
        plan = prep.plan(rreq, opts)
        run.world_size = plan.world_size
        ranks_of = {r: n.host.label for n in plan.nodes for r in n.ranks}
        # the line rate: each node's HCAs (or socket NIC) as the plan has NCCL use them
        rates = {n.host.label: node_rate(n.host.label, pre.facts[n.host.label],
                                         {v.name: v.value for v in n.env})
                 for n in plan.nodes if n.host.label in pre.facts}
        run.line_rate = fabric_rate(rates) if len(rates) == len(plan.nodes) else None
        run.line_fraction = req.line_fraction if req.line_fraction is not None else \
            DEFAULT_LINE_FRACTION if run.backend == "nccl" else 0.0
        run.pair_rounds = len(pair_schedule(len(plan.nodes), req.pairs))
        results = run.results = SmokeResults(layout=ranks_of,
                                             nodes=[n.host.label for n in plan.nodes])

        def take(line: OutputLine) -> bool:
            return line.stream == "out" and results.add_line(line.host, line.rank, line.text)

        render.note(f"smoke: {count(len(hosts), 'node')}, "
                    f"world size {plan.world_size}, {run.backend} ({run.backend_reason}), "
                    f"sizes {fmt_size(cfg.min_size)}..{fmt_size(cfg.max_size)}")
        payload = Payload({JOB_FILE: program_source("smoke_job").decode()}, take, judged=True,
                          kind="smoke")
        launched, run.archive = await launch_held(prep, plan, rreq, opts, payload=payload)
        run.launch = launched
        run.verdict = evaluate(results, node_labels=[h.label for h in hosts],
                               world_size=plan.world_size, job_code=launched.code,
                               job_summary=launched.verdict.outcome,
                               min_busbw=req.min_busbw, pair_fraction=req.pair_fraction,
                               ranks_of=ranks_of, line_rate=run.line_rate,
                               line_fraction=run.line_fraction)
    return run


def smoke_sync(hosts: Sequence[Host], req: SmokeRequest, opts: RunOptions,
               settings: SSHSettings) -> int:
    """`dtrain smoke`: run, then the table, the verdict and the reports."""
    return run_command("smoke", hosts, lambda: smoke_async(hosts, req, opts, settings),
                       lambda ended: conclude(ended, hosts, req), concludes_errors=True)


def conclude(ended: Ended[SmokeRun], hosts: Sequence[Host], req: SmokeRequest) -> int:
    """The table, the verdict line, the annotations, the reports (also after an error or
    Ctrl-C, when --json or --junit asked for them)."""
    human = sys.stderr if req.as_json else sys.stdout
    run = ended.result or SmokeRun(ended.started, [h.label for h in hosts])
    if ended.interrupted:
        run.error = Interrupted("interrupted by Ctrl-C")
    elif ended.error is not None:
        render.error(ended.error)
        if not (req.as_json or req.junit):
            return ended.error.exit_code
        run.error = ended.error
    if run.preflight_failures:
        run.verdict = SmokeVerdict(1, (), (), None, None, "; ".join(
            f.message for f in run.preflight_failures))
    show(run, human)
    if in_github_actions():
        annotate(run, human)
    report = command_report(run, time.time())
    if run.archive is not None:
        _archive_smoke(run.archive, report)
    return finish(report, as_json=req.as_json, junit=req.junit,
                  extra_cases=extra_cases(run), annotations=False)


def _archive_smoke(archive: RunArchive, report: CommandReport) -> None:
    """The smoke results beside the run's own in meta.json (the run directory the launch
    still holds)."""
    from launcher.output.report import to_json

    with contextlib.suppress(OSError):
        archive.update_meta(smoke=to_json(report)["smoke"])
