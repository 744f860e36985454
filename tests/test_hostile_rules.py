"""Every rule that fences, blames or refuses a node, attacked by ANOTHER node that lies
(issue 50; docs/threat-model.md section 2): the honest node is neither blamed nor fenced nor
refused. The liar is tests/hostile.py's: its messages go through the real decode
(job/events.py against the plan) into the real decision, without I/O, or through the fake
transport (the health gate). The hang culprit's rule: tests/test_no_cross_blame.py.

Found and fixed here: `dtrain smoke`'s version check gave a tie to node 0's value, so in a
2-node smoke a lying node 0 got the honest node named as the odd one (decide/fabric/smoke.py
``_odd_ones``: a tie now names no node); a master (node 0) that says it listens and does
not got every honest worker fenced by a restarting run (job/preflight.py, now
decide/fabric/checks.py ``unreachable_fence``: nobody, when no worker reached it)."""

from __future__ import annotations

import ast
import asyncio
import base64
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.decide.outcome import failures
from launcher.decide.outcome.outcomes import Failure, JobOutcome
from launcher.decide.outcome.restarts import (
    NODE,
    PROCESS,
    AttemptEnd,
    Fault,
    NodeCount,
    RestartPolicy,
    classify,
    decide,
)
from launcher.decide.outcome.verdict import TailKeeper, failure_reason, verdict
from launcher.job import events
from launcher.models import Host, OutputLine
from tests.hostile import (
    CLEAN_GPU,
    ROW_REMAP_FAILED,
    Cluster,
    nccl_gdr,
    nccl_socket,
    transport,
    xid_line,
)
from tests.hostile import hostile as hostile  # noqa: F401 (the fixture)
from tests.util import REPO

A, B = "nodeA", "nodeB"  # nodeA (ranks 0-1) is honest, nodeB (ranks 2-3) lies


# -- --require-fabric: a node's NCCL account refuses only that node ----------------------------

def _fabric(cluster: Cluster, require: str) -> tuple[Any, list[tuple[str, str]], list[str]]:
    from launcher.job.fabric import FabricWatch

    plan = SimpleNamespace(nodes=[SimpleNamespace(host=Host(h), ranks=rs, env=())
                                  for h, rs in cluster.plan.items()])
    failed: list[tuple[str, str]] = []
    said: list[str] = []
    watch = FabricWatch(plan, require, said.append,  # type: ignore[arg-type]
                        lambda host, why: failed.append((host, why)))
    return watch, failed, said


def _send(watch: events.Observer, cluster: Cluster, host: str, data: bytes,
          owners: Any = None) -> None:
    ev = cluster.decode(host, data, owners)
    if ev is not None:
        ev.send(watch, Host(host))


def test_a_node_s_nccl_account_cannot_refuse_another_node(hostile: Cluster) -> None:
    """nodeB's ranks say they use NET/Socket, in lines that carry nodeA's name and channels
    to nodeA's ranks, and it sends a Socket account for nodeA's rank 0: nodeB is refused
    (its own ranks' word about themselves), nodeA is named nowhere in the refusal."""
    liar, honest = hostile.liar, hostile.honest
    watch, failed, said = _fabric(hostile, "rdma")
    _send(watch, hostile, B, liar.nccl(0, nccl_socket(A, 0, 2)))  # not its rank: dropped
    assert watch.accounts == {} and failed == []
    _send(watch, hostile, A, honest.nccl(0, nccl_gdr(A, 0, 2)))
    assert failed == []
    _send(watch, hostile, B, liar.nccl(2, nccl_socket(A, 2, 0)))
    (host, why), = failed
    assert host == B and A not in why, why
    assert why.startswith("--require-fabric rdma: rank 2 (nodeB) uses socket"), why
    _send(watch, hostile, A, honest.nccl(1, nccl_gdr(A, 1, 3)))
    _send(watch, hostile, B, liar.nccl(3, nccl_socket(A, 3, 1)))
    assert len(failed) == 1  # refused once
    transports = watch.meta()["fabric"]["transports"]
    assert transports == {"0": "gdr", "1": "gdr", "2": "socket", "3": "socket"}, transports
    assert not any(A in line for line in said if line.startswith("WARNING")), said


def test_with_a_dynamic_rendezvous_a_node_that_claims_ranks_first_is_refused_itself(
        hostile: Cluster) -> None:
    """--rdzv c10d: torchrun numbers the ranks, a host may claim as many as it runs. nodeB
    claims ranks 0 and 1 first with Socket accounts: the refusal is nodeB's, and nodeA's
    later accounts for those numbers are not taken as its own."""
    owners = hostile.owners(planned=False)
    liar, honest = hostile.liar, hostile.honest
    watch, failed, _ = _fabric(hostile, "rdma")
    _send(watch, hostile, B, liar.nccl(0, nccl_socket(A, 0, 2)), owners)
    _send(watch, hostile, B, liar.nccl(1, nccl_socket(A, 1, 3)), owners)
    _send(watch, hostile, A, honest.nccl(0, nccl_gdr(A, 0, 2)), owners)  # taken: dropped
    _send(watch, hostile, A, honest.nccl(2, nccl_gdr(A, 2, 0)), owners)
    (host, why), = failed
    assert host == B and "(nodeB)" in why and A not in why, why


# -- the health gate: a node's answer is about that node only ----------------------------------

def _health(tmp_path: Path, answers: dict[str, bytes]) -> tuple[list[dict[str, object]],
                                                                 dict[str, list[Any]]]:
    """gather_with through the fake transport, each node answering ``answers[label]``
    (what its collector printed)."""
    from launcher.commands.health import HealthOptions, gather_with

    hosts = [Host(label) for label in answers]
    fake = transport(answers)
    return asyncio.run(gather_with(fake, hosts, HealthOptions(timeout=20.0), 5.0))


def test_a_health_answer_naming_another_node_isolates_only_the_one_that_sent_it(
        hostile: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nodeB's collector answer names nodeA everywhere it can (its host and hostname
    fields, an Xid line about nodeA's GPU, a port called nodeA's and down, a failed row
    remap): the findings are nodeB's, nodeB goes on the lemon list, nodeA stays ok and
    keeps no Xid lines of nodeB's."""
    from launcher.commands.health import load_xids, remember
    from launcher.decide.fabric import health as hd
    from launcher.job.lemons import LemonStore

    monkeypatch.setenv("DTRAIN_STATE_DIR", str(tmp_path / "state"))
    lie = hostile.liar.health(
        gpu_csv=ROW_REMAP_FAILED, host=A, hostname=A,
        xid_lines=[xid_line("0000:18:00", 79, " (on nodeA)")],
        ports={f"{A}:mlx5_0:1": {"state": "1: DOWN", "before": {}, "after": {}}})
    nodes, found = _health(tmp_path, {A: hostile.honest.health(gpu_csv=CLEAN_GPU), B: lie})
    verdicts = {str(n["host"]): n["verdict"] for n in nodes}
    assert verdicts == {A: "ok", B: "isolate"}, nodes
    assert found[A] == [] and hd.verdict(found[B]) == "isolate"
    store = LemonStore(tmp_path / "state")
    assert remember(found, "r1", store) == [B]
    assert [lemon.host for lemon in store.load()] == [B]
    xids = load_xids(tmp_path / "state")
    assert xids[A] == [] and len(xids[B]) == 1, xids


# -- stragglers: a comparison, so a liar can get an honest node named; nothing acts on it ------

def test_a_node_reporting_a_fast_rate_gets_an_honest_node_a_straggler_line_only(
        hostile: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """nodeB says its ranks barely use the CPU (they wait: fast, by their word); honest
    nodeA, as busy as ever, is flagged against them: one console line and meta.json's
    ``stragglers``. That is all a flag is (the next test: nothing reads it to act)."""
    from launcher.commands import run_sampling
    from launcher.commands.run_sampling import RunSampling
    from launcher.decide.outcome.stragglers import StragglerDetector, StragglerSettings
    from launcher.job.sampling import NodeSampler, SamplerParams

    said: list[str] = []
    rs = RunSampling.__new__(RunSampling)
    rs.node_ranks, rs.log, rs.say = {A: 0, B: 1}, None, said.append
    rs.earlier = []
    rs.detector = StragglerDetector(StragglerSettings(window=4.0, hold=2.0))
    recorded: list[list[Any]] = []
    rs._record = lambda: recorded.append(rs.stragglers())  # type: ignore[method-assign]
    samplers = {h: NodeSampler(SimpleNamespace(host=SimpleNamespace(label=h)),  # type: ignore[arg-type]
                               SamplerParams(ranks=tuple(hostile.plan[h])), rs.on_sample)
                for h in hostile.plan}
    clock = [0.0]
    monkeypatch.setattr(run_sampling, "time", SimpleNamespace(time=lambda: clock[0]))
    for i in range(30):
        t = clock[0] = 1_800_000_000.0 + i
        samplers[A]._line(hostile.honest.sample(t, {0: 0.9 * i, 1: 0.9 * i}))
        samplers[B]._line(hostile.liar.sample(t, {2: 0.01 * i, 3: 0.01 * i}))
    assert [line.split(" (")[0] for line in said] == ["straggler: nodeA"], said
    assert recorded and recorded[-1][0]["host"] == A


# the modules that may read a straggler flag: they report it (the console line, meta.json,
# top's column, the report page); none of them fences, refuses, restarts or records a node
STRAGGLER_READERS = {
    "launcher/decide/outcome/stragglers.py", "launcher/decide/runplan/runoptions.py",
    "launcher/commands/run_sampling.py", "launcher/commands/launch/attempt.py",
    "launcher/commands/top/__init__.py", "launcher/commands/top/model.py",
    "launcher/commands/top/view.py", "launcher/commands/top/runwatch.py",
    "launcher/output/runreport/page.py", "launcher/output/runreport/document.py",
    "launcher/output/runreport/summary.py", "launcher/output/runreport/timeline.py",
    "launcher/output/runreport/usage.py",
    "launcher/cli/top.py", "launcher/cli/configs.py", "launcher/cli/watching.py",
    "launcher/cli/run.py", "launcher/cli/runconfig.py", "launcher/runrecord.py",
    "launcher/nodeside/sampler.py",
}


def _names(path: Path) -> set[str]:
    """Every identifier, attribute and string constant of a module (not its comments)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and not node.value.count("\n"):
            out.add(node.value)
    return out


def test_nothing_acts_on_a_straggler_flag() -> None:
    """A straggler flag changes no exit code, fences no node, puts none on the lemon list,
    records no incident and restarts nothing: the restart decision's input has no field for
    it, and no module outside the reporting ones names the detector, its flags or
    meta.json's ``stragglers`` (a new reader must be added here, on purpose)."""
    assert not any("straggl" in f for f in AttemptEnd.__dataclass_fields__)
    readers = set()
    for path in sorted((REPO / "launcher").rglob("*.py")):
        names = _names(path)
        if any("straggl" in n.lower() or n in ("StragglerDetector", "flagged_hosts")
               for n in names):
            readers.add(str(path.relative_to(REPO)))
    assert readers <= STRAGGLER_READERS, sorted(readers - STRAGGLER_READERS)
    deciders = ("decide/outcome/restarts.py", "decide/outcome/lemons.py",
    "decide/outcome/incidents.py",
                "decide/outcome/verdict.py", "decide/fabric/health.py", "decide/outcome/stacks.py",
                "job/orchestrate.py", "job/lemons.py", "job/incidents.py", "job/fabric.py",
                "job/hangwatch.py", "commands/restarts.py", "commands/incidents.py",
                "commands/health.py")
    assert not readers & {f"launcher/{d}" for d in deciders}


# -- restart classification and fencing: only on the node's own evidence -----------------------

def _root_reason(outcome: JobOutcome, keeper: failures.ErrorKeeper
                 ) -> tuple[Any, failures.FailureReason | None]:
    v = verdict(outcome, None, TailKeeper())  # type: ignore[arg-type]
    return v, failure_reason(outcome, v, keeper)


def _fenced(end: AttemptEnd, attempts: int = 3) -> list[tuple[tuple[str, ...], str]]:
    before: list[Fault] = []
    out = []
    for n in range(1, attempts + 1):
        d = decide(end, before, n, RestartPolicy(restarts=5), [A, B], ["nodeC"],
                   NodeCount(2, 2))
        before.append(d.fault)
        out.append((tuple(h for h, _ in d.fenced), d.fault.kind))
    return out


def test_an_xid_another_node_reports_fences_only_that_node(hostile: Cluster) -> None:
    """nodeB reports rank 0 (nodeA's) dead of an Xid 79: dropped. nodeB's own rank 2 exits
    with kernel lines of an Xid 79 that name nodeA: the GPU fault is nodeB's, nodeB is
    fenced, nodeA is not."""
    liar = hostile.liar
    evidence = {"kernel": [xid_line("0000:18:00", 79, " on nodeA: fence nodeA")]}
    assert hostile.decode(B, liar.rank_exit(0, 1, evidence=evidence)) is None
    ev = hostile.decode(B, liar.rank_exit(2, 1, evidence=evidence))
    assert isinstance(ev, events.RankExit)
    keeper = failures.ErrorKeeper()
    keeper.rank_exit(B, ev.end.rank, ev.end.evidence)
    outcome = JobOutcome(failures=[Failure("rank", B, rank=2, code=1)])
    v, reason = _root_reason(outcome, keeper)
    assert reason is not None and (reason.kind, reason.host) == ("xid", B), reason
    end = AttemptEnd(1, v.root_kind, v.root_host, v.root_rank, reason, progressed=True)
    assert classify(end).fence == ((B, reason.summary),)
    assert _fenced(end)[0] == ((B,), NODE)


def test_an_honest_victim_of_a_lying_node_is_never_fenced(hostile: Cluster) -> None:
    """nodeB hides its own failure (its ranks say they were asked to stop) and its ranks'
    stderr blames nodeA (NCCL WARN, an Xid naming nodeA's GPU): nodeA's rank 0, whose
    peer went away, is the root cause, by its own report a communication error with a
    peer gone: a process fault, never fenced, attempt after attempt; nodeB's lines about
    nodeA are not nodeA's evidence."""
    liar, honest = hostile.liar, hostile.honest
    assert isinstance(hostile.decode(B, liar.rank_exit(2, 143, stop_signal=15)), events.RankExit)
    keeper = failures.ErrorKeeper()
    keeper.observe([OutputLine(B, "err", text, 2, 2, 1.0) for text in (
        "NCCL WARN NET/IB : Got completion from peer nodeA with error 12, fence nodeA",
        "NVRM: Xid (PCI:0000:18:00): 79, nodeA's GPU has fallen off the bus")])
    keeper.observe([OutputLine(A, "err", "RuntimeError: Connection closed by peer "
                                         "[10.0.0.2]:29500", 0, 0, 2.0)])
    ev = hostile.decode(A, honest.rank_exit(0, 1))
    assert isinstance(ev, events.RankExit)
    keeper.rank_exit(A, ev.end.rank, ev.end.evidence)
    outcome = JobOutcome(failures=[Failure("rank", A, rank=0, code=1)])
    v, reason = _root_reason(outcome, keeper)
    assert reason is not None and reason.host == A and reason.kind == "comm", reason
    assert reason.scope != failures.NODE and "nodeA's GPU" not in reason.summary
    end = AttemptEnd(1, v.root_kind, v.root_host, v.root_rank, reason, progressed=True)
    assert _fenced(end) == [((), PROCESS)] * 3
    # its incident is a communication error: never counted against its machine
    from launcher.decide.outcome import incidents as inc

    found = inc.explained(reason=reason, stderr=(), code=1, root_kind="rank", host=A)
    assert found is not None and found[:2] == (A, "comm")


def test_a_lying_node_cannot_make_an_honest_node_lost_or_not_started(hostile: Cluster) -> None:
    """Lost, unreachable and not started are the launcher's own observations of each
    node's channel; no message of another node names them. Whatever nodeB sends about
    nodeA (rank_start, rank_exit, an exit of its ranks, a stopping), none of it is about
    nodeA once decoded, and an attempt whose only lost node is nodeB fences nodeB."""
    liar = hostile.liar
    for data in (liar.rank_start(0), liar.rank_exit(1, 255, signal=signal.SIGKILL),
                 liar.exit(255, {0: {"code": 255}, 1: {"code": 255}})):
        ev = hostile.decode(B, data)
        assert ev is None or (isinstance(ev, events.Exit) and dict(ev.ranks) == {}), ev
    end = AttemptEnd(255, "lost", B, None, None, lost=(B,), error="no heartbeat for 10 s")
    assert _fenced(end, 1) == [((B,), NODE)]


def test_a_flood_from_a_lying_node_cannot_push_out_an_honest_node_s_own_evidence(
        hostile: Cluster) -> None:
    """nodeB floods (ten thousand stderr lines of NCCL errors, Xids and tracebacks naming
    nodeA, on its own ranks and on nodeA's rank numbers): nodeA's rank 0 keeps its own
    last lines, and its failure is explained by them alone (a SyntaxError: the user's)."""
    from launcher.decide.outcome.restarts import USER

    liar = hostile.liar
    keeper = failures.ErrorKeeper()
    own = ['Traceback (most recent call last):', '  File "/w/train.py", line 9',
           "SyntaxError: invalid syntax"]
    keeper.observe([OutputLine(A, "err", text, 0, 0, 1.0) for text in own])
    flood = [line.decode() for line in liar.flood(10_000, b"NCCL WARN nodeA Xid 79 "
                                                          b"RuntimeError: fence nodeA")]
    for rank in (2, 3, None):  # its output on rank 0's number is the node's (rank None):
        # the session attributes output to the host's own ranks only (test_node_claims.py)
        keeper.observe([OutputLine(B, "err", text, rank, rank, 2.0) for text in flood])
    assert list(keeper.tails[(A, 0)]) == own
    outcome = JobOutcome(failures=[Failure("rank", A, rank=0, code=1)])
    v, reason = _root_reason(outcome, keeper)
    assert reason is not None and reason.kind == "exception", reason
    assert reason.evidence == ("SyntaxError: invalid syntax",) and "fence" not in reason.summary
    end = AttemptEnd(1, v.root_kind, v.root_host, v.root_rank, reason, progressed=True)
    assert _fenced(end, 1) == [((), USER)]


def test_a_node_that_says_nothing_is_the_only_one_named(hostile: Cluster) -> None:
    """A hang, and nodeB says nothing to the stacks request (``silent``): nodeA's ranks
    wait in all_reduce by their own stacks and flight records, so no rank of nodeA is the
    culprit; nodeB's ranks are the missing ones. And its silence on the channel is its own
    loss: the launcher's clock of nodeA's bytes is nodeA's alone."""
    from launcher.decide.outcome import flight, stacks
    from launcher.decide.outcome.liveness import Silence
    from tests.hostile import ALL_REDUCE, fr, rank_entry

    honest = hostile.honest
    assert hostile.liar.silent() == []
    ev = hostile.decode(A, honest.stacks({0: rank_entry(ALL_REDUCE, fr(7, 6)),
                                          1: rank_entry(ALL_REDUCE, fr(7, 6))}))
    assert isinstance(ev, events.Stacks)
    ranks, positions = [], {}
    for rank, entry in ev.ranks.items():
        ranks.append(stacks.rank_stack(rank, A, entry))
        assert entry.fr_data is not None
        loaded = flight.load_dump(base64.b64decode(entry.fr_data))
        assert loaded is not None
        position = flight.rank_flight(rank, loaded)
        assert position is not None
        positions[rank] = position
    folded = stacks.fold(ranks, [0, 1, 2, 3], positions)
    assert folded.missing == (2, 3)
    assert folded.culprit is None or folded.culprit.host != A, folded.culprit
    silences = {h: Silence(timeout=10.0, heard_at=0.0) for h in hostile.plan}
    for now in range(1, 30):
        silences[A].heard(float(now))  # nodeA's bytes keep coming; nodeB says nothing
        lost = {h for h, s in silences.items() if s.look(float(now), float(now), 1.0)}
        assert A not in lost
    assert lost == {B}


def _master_port(answers: dict[str, dict[str, Any]], labels: list[str]) -> Any:
    """job/preflight.check_master_port with each node's probe answering ``answers``."""
    from launcher.errors import PreflightFailed
    from launcher.job.preflight import check_master_port

    async def ask(label: str, request: dict[str, Any]) -> dict[str, Any]:
        return answers[label]

    probes = SimpleNamespace(ask=ask)
    try:
        return asyncio.run(check_master_port(probes, labels, "10.0.0.1",  # type: ignore[arg-type]
                                             29500, 5.0))
    except PreflightFailed as exc:
        return exc


def test_a_master_that_says_it_listens_and_does_not_fences_no_worker() -> None:
    """nodeB is node 0: its probe says the master port is bound, and nothing answers there.
    Every honest worker's own connect fails: the run is refused, and no worker is fenced by
    a restarting run (before: every one of them, and remembered on the lemon list), nor
    node 0 on their word. A worker that fails while another reached the master is fenced:
    its own link."""
    refused = {"ok": False, "error": "[Errno 111] Connection refused"}
    listen = {"ok": True, "port": 29500}
    labels = [B, A, "nodeC"]
    exc = _master_port({B: listen, A: refused, "nodeC": refused}, labels)
    assert "unreachable from nodeA" in exc.message and exc.hosts == (), exc
    exc = _master_port({B: listen, A: refused}, [B, A])
    assert exc.hosts == ()
    exc = _master_port({B: listen, A: refused, "nodeC": {"ok": True}}, labels)
    assert exc.hosts == (A,)
    assert _master_port({B: listen, A: {"ok": True}}, [B, A]) == 29500


def test_preflight_version_checks_refuse_the_run_and_fence_nobody(hostile: Cluster) -> None:
    """doctor's and the run's torch check take the majority's version, a tie going to node
    0's (the master's; test_doctor.py): a lying node 0 in a 2-node run gets the honest
    node's row marked FAIL. The run is refused either way, and the refusal fences nobody."""
    from launcher.decide.fabric.checks import FAIL, failure_message, fast_checks
    from launcher.errors import PreflightFailed
    from tests.test_doctor import node

    facts = {B: node(B, "10.0.0.1", torch="9.9.9"), A: node(A, "10.0.0.2", torch="2.13.0")}
    rows = [r for r in fast_checks(facts, [B, A]) if r.check == "torch"]
    assert [(r.host, r.status) for r in rows if r.status == FAIL] == [(A, FAIL)]
    problem = failure_message(fast_checks(facts, [B, A]))
    assert problem and PreflightFailed(problem).hosts == ()


# -- the incident store: against the node whose own rank failed --------------------------------

def test_an_incident_is_recorded_against_the_node_whose_own_rank_failed(
        hostile: Cluster, tmp_path: Path) -> None:
    """nodeB's rank 2 fails with a traceback and evidence that name nodeA: the incident is
    nodeB's (tests/test_incidents.py: a neighbour's output that names a node)."""
    from launcher.commands.incidents import remember
    from launcher.job.incidents import IncidentStore

    liar = hostile.liar
    ev = hostile.decode(B, liar.rank_exit(2, 1, evidence={"kernel": ["nodeA: oom-kill"]}))
    assert isinstance(ev, events.RankExit)
    keeper = failures.ErrorKeeper()
    keeper.rank_exit(B, ev.end.rank, ev.end.evidence)
    keeper.observe([OutputLine(B, "err", text, 2, 2, 1.0) for text in (
        "Traceback (most recent call last):", '  File "/w/train.py", line 3, in step',
        "RuntimeError: nodeA is broken, fence nodeA")])
    outcome = JobOutcome(failures=[Failure("rank", B, rank=2, code=1)])
    v, reason = _root_reason(outcome, keeper)
    assert reason is not None and reason.host == B
    store = IncidentStore(tmp_path / "state")
    for run in ("r1", "r2", "r3"):
        end = AttemptEnd(1, v.root_kind, v.root_host, v.root_rank, reason, progressed=True)
        remember(end, run_id=run, attempt=1, script="train.py", workdir=None,
                 hosts=[A, B], store=store, commit="a" * 40)
    assert {r.host for r in store.load()} == {B}


# -- dtrain smoke: versions and pair speeds ----------------------------------------------------

def _smoke(cluster: Cluster, lines: list[tuple[str, int, str]]) -> Any:
    from launcher.decide.fabric.smoke import SmokeResults, evaluate

    layout = {r: h for h, rs in cluster.plan.items() for r in rs}
    res = SmokeResults(layout=layout, nodes=cluster.hosts)
    for host, rank, text in lines:
        res.add_line(host, rank, text)
    return evaluate(res, node_labels=cluster.hosts, world_size=len(layout), job_code=0,
                    job_summary="")


def _facts(node: Any, rank: int, torch: str = "2.13.0") -> str:
    return node.smoke("rank", rank=rank, node_rank=rank, hostname=node.label, torch=torch,
                      nccl=None, device="cpu", device_count=0, python="3.11.7")


def _full(cluster: Cluster) -> list[tuple[str, int, str]]:
    """Every rank's facts and sum check, and rank 0's sweep: a whole, healthy report."""
    out = []
    for host, ranks in cluster.plan.items():
        for r in ranks:
            node = cluster.node(host)
            out += [(host, r, _facts(node, r)),
                    (host, r, node.smoke("check", rank=r, mismatches={"1024": 0}))]
            if r == 0:
                out.append((host, r, node.smoke("sweep", backend="gloo", rows=[
                    {"size": 1024, "count": 256, "iters": 5, "time_us": 10.0, "algbw": 1.0,
                     "busbw": 1.0}])))
    return out


def test_a_lying_node_0_cannot_make_the_other_node_the_odd_version() -> None:
    """Two nodes, one rank each; node 0 lies about its torch: the versions check fails the
    smoke and names no node (no majority), where a tie used to go to node 0's value and
    name the honest node 1 as the odd one."""
    cluster = Cluster(plan={"nodeB": [0], "nodeA": [1]}, liar_label="nodeB")
    liar = cluster.liar
    report = [(h, r, _facts(liar, 0, torch="9.9.9") if h == B else text)
              for h, r, text in _full(cluster)]
    v = _smoke(cluster, report)
    (f,) = [f for f in v.failures if f.check == "versions"]
    assert f.hosts == () and not v.ok, f
    assert f.message.startswith("torch differs: nodeB has 9.9.9, nodeA has 2.13.0"), f.message
    # three nodes: the majority's word stands, the liar is the odd one
    three = Cluster(plan={"nodeB": [0], "nodeA": [1], "nodeC": [2]}, liar_label="nodeB")
    v = _smoke(three, [(h, r, _facts(three.liar, 0, torch="9.9.9") if text == _facts(
        three.liar, 0) else text) for h, r, text in _full(three)])
    (f,) = [f for f in v.failures if f.check == "versions"]
    assert f.hosts == (B,), f


def test_a_lying_node_names_only_links_it_is_an_end_of() -> None:
    """Three nodes; nodeB reports every pair with it slow and a pair of two honest nodes
    slow and failed: what it says of the others' pair is refused (naming nodeB), its own
    pairs make it the slow node; nodeA is never named alone, and never at all once nodeB
    is the node every slow pair has in common."""
    three = Cluster(plan={"nodeA": [0], "nodeB": [1], "nodeC": [2]}, liar_label="nodeB")
    a, b, c = three.node(A), three.liar, three.node("nodeC")
    row = {"size": 1 << 20, "time_us": 100.0}
    honest = [(A, 0, a.smoke("pairs", rows=[dict(row, a=0, b=1, gbps=10.0),
                                             dict(row, a=0, b=2, gbps=10.0)])),
              ("nodeC", 2, c.smoke("pairs", rows=[dict(row, a=0, b=2, gbps=10.0),
                                                  dict(row, a=1, b=2, gbps=10.0)]))]
    lies = [(B, 1, b.smoke("pairs", rows=[dict(row, a=0, b=1, gbps=0.01),
                                           dict(row, a=1, b=2, gbps=0.01)])),
            (B, 1, b.smoke("pair_failed", a=0, b=2, size=1 << 20, timeout=30.0))]
    v = _smoke(three, _full(three) + honest + lies)
    assert [(f.check, f.hosts) for f in v.failures] == [("ranks", (B,)), ("pairs", (B,))], \
        v.failures
    assert "a report on the pair nodeA <-> nodeC, which it is no end of" in v.failures[0].message
    # one slow pair of its own: that link is named, the liar as one of its two ends
    one = [(B, 1, b.smoke("pairs", rows=[dict(row, a=0, b=1, gbps=0.01),
                                          dict(row, a=1, b=2, gbps=10.0)]))]
    v = _smoke(three, _full(three) + honest + one)
    assert [(f.check, f.hosts) for f in v.failures] == [("pairs", (A, B))], v.failures


# -- a whole job through the fake transport: a flooding node ------------------------------------

def test_a_flooding_node_neither_stalls_nor_blames_the_honest_one() -> None:
    """`exec` on two fake nodes (transports/fake.py): nodeB floods its output (20 MB of
    lines, the ``flood`` of the menu) and exits 0; honest nodeA prints one line and exits
    3. nodeA's line and exit come through, the exit code is nodeA's own, and nodeB is named
    nowhere in dtrain's words. (A node that says nothing: tests/test_fake_transport.py
    ``test_a_frozen_node_is_declared_lost_by_its_missing_heartbeat``, the honest node not
    named.)"""
    from typer.testing import CliRunner

    from launcher.cli import app

    line = Cluster().liar.flood(1)[0].decode()
    script = (f'if [ "$DTRAIN_FAKE_NODE" = {B} ]; then yes {line} | '
              f"head -n 200000; exit 0; else echo honest; exit 3; fi")
    with transport({}).installed():
        res = CliRunner().invoke(app, ["exec", "-H", f"{A},{B}", "--", script])
    assert res.exit_code == 3, res.stderr[-2000:]
    out = res.stdout.splitlines()
    assert f"{A}: honest" in out and out.count(f"{B}: {line}") == 200_000
    assert f"{A}: exit 3" in res.stderr and B not in res.stderr, res.stderr[-2000:]
