"""How a run ended: the root cause, the exit code, the summary and meta.json's results.

Pure functions over the JobOutcome (supervisor messages per node and rank) and the plan;
docs/exit-codes.md is the table they implement.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.decide.outcome.failures import (
    ErrorKeeper,
    FailureReason,
    agent_signal,
    agent_stopped,
    explain,
    launcher_silent,
    supervisor_signal,
)
from launcher.decide.outcome.outcomes import JobOutcome, RankEnd
from launcher.decide.runplan.plan import LaunchPlan
from launcher.exitcodes import (
    EXIT_FABRIC,
    EXIT_HANG,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    exit_for_signal,
)
from launcher.hosts.hostfile import fold
from launcher.models import OutputLine
from launcher.runrecord import NodeResult, RankResult, RankRole, RootCause, RootKind
from launcher.text.words import FOLD_AT, count

# how dtrain's stop ends a rank: a rank that ended any other way failed on its own
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP})


class TailKeeper:
    """The last stderr lines of each rank, for the failure summary."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.tails: dict[tuple[str, int | None], deque[str]] = {}

    def add(self, lines: Sequence[OutputLine]) -> None:
        for line in lines:
            if line.stream == "err":
                key = (line.host, line.rank)
                if key not in self.tails:
                    self.tails[key] = deque(maxlen=self.size)
                self.tails[key].append(line.text)


@dataclass
class Verdict:
    """The exit code and the story behind it (see docs/exit-codes.md)."""

    code: int
    outcome: str
    root_host: str | None = None
    root_rank: int | None = None
    lines: list[str] = field(default_factory=list)
    root_kind: RootKind | None = None  # rank, node, lost, start, hang, interrupted, timeout
    why: list[str] = field(default_factory=list)  # the failure's explanation, after the head


def rank_ends(outcome: JobOutcome, host: str) -> list[RankEnd]:
    """A node's ranks' exit reports (its ``exit`` message), in the order they ended (its
    own clock)."""
    node = outcome.nodes.get(host)
    return sorted(node.ranks.values(), key=lambda e: e.t or 0.0) if node is not None else []


def _code(e: RankEnd) -> int:
    """A rank's exit code as the summary and meta.json say it (a report without one: 0)."""
    return e.code if e.code is not None else 0


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _how(code: int | None, sig: int | None) -> str:
    if sig:
        return f"was killed by {_signame(sig)}"
    return f"exited {code}"


def verdict(outcome: JobOutcome, plan: LaunchPlan, tails: TailKeeper) -> Verdict:
    """The exit code: the root cause's (the first failure dtrain saw before it started
    stopping the job): a rank's own code (128+N for signal N), 255 a node lost or unreachable,
    124 --timeout or --start-timeout; 130/143 when interrupted first; 0 when every node ended
    well."""
    root = outcome.root
    lines: list[str] = []
    if outcome.interrupted and (root is None or outcome.interrupted_t is None
                                or root.seen > outcome.interrupted_t):
        how = "interrupted by Ctrl-C" if outcome.interrupted == signal.SIGINT else \
            f"interrupted by {_signame(outcome.interrupted)}"
        if outcome.stopped_by:
            how = f"stopped by {outcome.stopped_by}"
        if outcome.killed:
            how += ", then killed"
        v = Verdict(exit_for_signal(outcome.interrupted), how, root_kind="interrupted")
    elif outcome.timed_out and root is None:
        v = Verdict(EXIT_TIMEOUT, "timed out (--timeout): every node stopped", root_kind="timeout")
    elif root is not None and root.kind == "start":
        late = fold(outcome.start_timed_out) or root.host
        v = Verdict(EXIT_TIMEOUT, f"{late} {root.error}", root.host, root_kind="start")
    elif root is not None and root.kind == "rank" and _stopped_by_its_node(outcome, root) \
            and _self_failed_rank(outcome, root.host) is None:
        # its shim passed on a stop from torchrun (or from the supervisor once torchrun had
        # ended) before dtrain stopped anything, and no rank there failed of its own: that
        # torchrun's end is the root cause
        node = outcome.nodes[root.host]
        v, tail = _torchrun_verdict(root.host, node.exit_code, node.signal,
                                    _node_tail(outcome, tails, root.host))
        if tail:
            lines.append(f"last stderr lines of {root.host}:")
            lines += [f"  {t}" for t in tail]
    elif root is not None and root.kind == "rank":
        v = Verdict(root.code or 1,
                    f"rank {root.rank} on {root.host} {_how(root.code, root.signal)}",
                    root.host, root.rank, root_kind="rank")
        tail = list(tails.tails.get((root.host, root.rank), ()))
        if tail:
            lines.append(f"last stderr lines of rank {root.rank} on {root.host}:")
            lines += [f"  {t}" for t in tail]
    elif root is not None and root.kind == "hang":
        v = Verdict(root.code or EXIT_HANG, root.error or "hang", root.host or None, root.rank,
                    root_kind="hang")
    elif root is not None and root.kind == "fabric":  # --require-fabric (docs/fabric.md)
        v = Verdict(root.code or EXIT_FABRIC, root.error or "fabric refused", root.host or None,
                    root_kind="fabric")
    elif root is not None and root.kind == "lost":
        v = Verdict(EXIT_UNREACHABLE,
                    f"node {root.host} lost: {root.error or 'connection lost'}", root.host,
                    root_kind="lost")
    elif root is not None and (first := _first_failed_rank(outcome, root.host)) is not None:
        # torchrun gave up on this node (say after --max-restarts): its ranks tell why
        v = Verdict(_code(first), f"rank {first.rank} on {root.host} "
                                  f"{_how(first.code, first.signal)}", root.host, first.rank,
                    root_kind="rank")
        tail = list(tails.tails.get((root.host, first.rank), ()))
        if tail:
            lines.append(f"last stderr lines of rank {first.rank} on {root.host}:")
            lines += [f"  {t}" for t in tail]
    elif root is not None:
        tail = _node_tail(outcome, tails, root.host)
        if (sup := supervisor_signal(root.own_stop)) is not None:
            v = Verdict(exit_for_signal(sup),
                        f"dtrain's supervisor on {root.host} got {_signame(sup)} "
                        "(not from dtrain) and stopped its job", root.host,
                        root_kind="node")
        elif (frozen := agent_stopped(root.own_stop)) is not None:
            v = Verdict(EXIT_HANG, f"torchrun on {root.host} was stopped (SIGSTOP or SIGTSTP, "
                                   f"not from dtrain) after every rank there ended, and stayed "
                                   f"so {frozen} s: it could never end, so its supervisor "
                                   "ended the job", root.host, root_kind="hang")
        elif (silent := launcher_silent(root.own_stop)) is not None:
            # the node lost the launcher (a cut or very lossy link, or dtrain stalled): the
            # class of a lost node, 255, never torchrun's exit 1 from being stopped
            v = Verdict(EXIT_UNREACHABLE, f"node {root.host} heard nothing from dtrain for "
                                          f"{silent:g} s and stopped its job (its link to this "
                                          "machine cut or dropping packets, or dtrain stalled)",
                        root.host, root_kind="lost")
        elif root.own_stop:
            v = Verdict(root.code or 1, f"node {root.host} stopped its job by itself: "
                                        f"{root.own_stop}", root.host, root_kind="node")
        elif root.code is None:
            v = Verdict(EXIT_UNREACHABLE, f"node {root.host} failed: {root.error}", root.host,
                        root_kind="node")
        else:
            v, tail = _torchrun_verdict(root.host, root.code, root.signal, tail)
        if tail:
            lines.append(f"last stderr lines of {root.host}:")
            lines += [f"  {t}" for t in tail]
    else:
        missing = [h.label for h in (n.host for n in plan.nodes)
                   if h.label not in outcome.nodes or outcome.nodes[h.label].exit_code is None]
        bad = {label: n.exit_code for label, n in outcome.nodes.items() if n.exit_code}
        if missing:
            v = Verdict(EXIT_UNREACHABLE, f"{fold(missing)} never reported an end", missing[0],
                        root_kind="lost")
        elif bad:
            label = next(iter(bad))
            v = Verdict(bad[label] or 1, f"torchrun on {label} exited {bad[label]}", label,
                        root_kind="node")
        else:
            v = Verdict(0, "succeeded")
    v.lines = lines
    return v


def _first_failed_rank(outcome: JobOutcome, host: str) -> RankEnd | None:
    """The earliest rank of a node that failed as a whole (its own clock) that failed of its
    own: a rank asked to stop (its shim passed on a stop: torchrun's, or the supervisor's
    once torchrun had ended) followed its node's end and does not tell why."""
    if outcome.root is None or outcome.root.kind != "node":
        return None
    return _self_failed_rank(outcome, host)


def _self_failed_rank(outcome: JobOutcome, host: str) -> RankEnd | None:
    failed = [e for e in rank_ends(outcome, host) if e.failed and e.stop_signal is None]
    return failed[0] if failed else None


def _stopped_by_its_node(outcome: JobOutcome, root: Any) -> bool:
    """The first failure is a rank its own node asked to stop before dtrain stopped
    anything, and that node's torchrun then ended badly: a SIGKILLed torchrun (the
    supervisor stops what is left of its tree), a SIGTERMed one (it passes the signal on to
    its workers). Found by the fault campaign (docs/reliability.md)."""
    node = outcome.nodes.get(root.host)
    if node is None or not node.exit_code:
        return False
    end = node.ranks.get(root.rank) if root.rank is not None else None
    return end is not None and end.stop_signal is not None


def _node_tail(outcome: JobOutcome, tails: TailKeeper, host: str) -> list[str]:
    """torchrun's last stderr lines on a node (the supervisor's copy when none came)."""
    node = outcome.nodes.get(host)
    return list(tails.tails.get((host, None), ())) or list(node.stderr_tail if node else ())


def _torchrun_verdict(host: str, code: int | None, sig: int | None,
                      tail: list[str]) -> tuple[Verdict, list[str]]:
    """torchrun's end on ``host`` as the root cause. torchrun's agent that got a signal
    raises SignalException and exits 1: its code is then the signal's (128+N), as for a
    process killed by it, and the signal named."""
    got = agent_signal(tail) if not sig else None
    if got is not None:
        return Verdict(exit_for_signal(got), f"torchrun on {host} got {_signame(got)} and ended (a "
                                  "signal not from dtrain: a scheduler, a user, a watchdog)",
                       host, root_kind="node"), tail
    return Verdict(code or 1, f"torchrun on {host} {_how(code, sig)}", host,
                   root_kind="node"), tail


def _rank_role(outcome: JobOutcome, v: Verdict, host: str, rank: int,
               e: RankEnd | None) -> RankRole:
    """root cause, failed (on its own, before the stop), stopped (by dtrain or as collateral
    of the root cause), ok, or unknown (no exit report: killed along with its node)."""
    if e is None:
        return "unknown"
    if (host, rank) == (v.root_host, v.root_rank) and v.root_kind in ("rank", "hang"):
        return "root cause"
    if not e.failed:
        return "ok"
    if any(f.kind == "rank" and (f.host, f.rank) == (host, rank) for f in outcome.failures):
        return "failed"
    if e.signal in STOP_SIGNALS:
        return "stopped"
    if e.stop_signal is not None and e.signal is None:
        # asked to stop, it exited by itself (a checkpoint, then exit 143, or 1): stopped
        return "stopped"
    return "failed"  # it exited on its own (a crash, a peer's error): not our doing


def _exit_text(code: int | None, sig: int | None) -> str:
    if sig:
        return f"{_signame(sig)} ({code})"
    return f"exit {code}"


def restarts_text(restarts: int) -> str:
    """`` after 2 restarts``: how a run's last attempt's verdict counts the relaunches."""
    return f" after {restarts} restart{'s' if restarts != 1 else ''}" if restarts > 0 else ""


def summary_lines(outcome: JobOutcome, plan: LaunchPlan, v: Verdict, *,
                  judged: bool = False, attempt: int = 1, retried: bool = False) -> list[str]:
    """Per node and rank: how it ended and after how long; the root cause first, followers
    marked as stopped by dtrain; then the last stderr lines of the root cause.

    ``judged``: the job is part of a command with a verdict of its own (smoke), so a job
    that exited 0 is "job: ended (exit 0)", not "ok: succeeded".
    ``attempt``/``retried`` (--restarts): a failed attempt the loop relaunches heads
    ``attempt N failed: ...``, not FAILED; the run's last says its restarts
    (``ok: succeeded after 1 restart (exit 0)``).

    From FOLD_AT nodes on, nodes whose ranks all ended alike (every one exit 0, or every
    one stopped by dtrain) are one line per kind, folded by hostlist, with the range of
    durations (``node[2-64]: 504 ranks exit 0 after 8.1-8.6s; torchrun exit 0 ...``): the
    nodes that differ come first, each on its own line.
    """
    head = "ok" if not v.code else "" if v.root_kind == "interrupted" else "FAILED"
    if judged and not v.code:  # smoke: its own verdict comes next and may be FAIL
        head, v_outcome = "job", "ended"
    elif retried:  # --restarts relaunches: not the run's verdict, which CI greps for
        head, v_outcome = f"attempt {attempt} failed", v.outcome
    else:
        v_outcome = v.outcome + restarts_text(attempt - 1)
    out = [f"{head + ': ' if head else ''}{v_outcome} (exit {v.code})", *v.why]
    order = sorted(plan.nodes, key=lambda n: (n.host.label != v.root_host, n.node_rank))
    rows = [_node_row(outcome, v, node) for node in order]
    if len(rows) < FOLD_AT:
        out += [f"  {label} (node {node_rank}): {text}" for label, node_rank, text, _ in rows]
    else:
        alike: dict[str, list[tuple[str, int, str, tuple[Any, ...]]]] = {}
        for row in rows:
            if row[3]:
                alike.setdefault(row[3][0], []).append(row)
            else:
                out.append(f"  {row[0]} (node {row[1]}): {row[2]}")
        for group in alike.values():
            out.append("  " + _folded_row(group))
    out += v.lines
    return out


def _node_row(outcome: JobOutcome, v: Verdict, node: Any
              ) -> tuple[str, int, str, tuple[Any, ...]]:
    """(label, node rank, its summary text, its fold key and numbers: () when it differs
    from the common kinds and is shown alone)."""
    by_dtrain = outcome.stop_reason is not None
    label = node.host.label
    res = outcome.nodes.get(label)
    if res is None:
        return label, node.node_rank, "not started", ()
    exits = res.ranks
    ranks = sorted(node.ranks, key=lambda r: (r != v.root_rank or label != v.root_host, r))
    parts = []
    kinds: set[str] = set()
    durations: list[float] = []
    for rank in ranks:
        e = exits.get(rank)
        role = _rank_role(outcome, v, label, rank, e)
        if e is None:
            why = " (node lost)" if res.lost else " (killed by dtrain)" if by_dtrain else ""
            parts.append(f"r{rank} no exit report{why}")
            kinds.add("odd")
            continue
        dur = f" after {e.duration:.1f}s" if e.duration is not None else ""
        mark = {"root cause": " (ROOT CAUSE)", "failed": " (failed too)",
                "stopped": " (stopped by dtrain)" if by_dtrain else "",
                "ok": ""}[role]
        exit_text = _exit_text(_code(e), e.signal)
        parts.append(f"r{rank} {exit_text}{dur}{mark}")
        kinds.add(f"{exit_text}{mark}" if role in ("ok", "stopped") else "odd")
        if e.duration is not None:
            durations.append(e.duration)
    if res.lost:
        state = f"LOST: {res.error}"
        kinds.add("odd")
    elif res.exit_code is None:
        state = res.error or "no exit status"
        kinds.add("odd")
    else:
        state = f"torchrun {_exit_text(res.exit_code, res.signal)}"
        if res.duration is not None:
            state += f" after {res.duration:.1f}s"
        if res.stopped:  # every node's torchrun alike, the root cause's node too
            state += " (stopped by dtrain)"
    text = f"{', '.join(parts) or 'no ranks'}; {state}"
    if "odd" in kinds or len(kinds) != 1 or res.exit_code is None:
        return label, node.node_rank, text, ()
    torchrun = f"torchrun {_exit_text(res.exit_code, res.signal)}"
    key = f"{kinds.pop()}|{torchrun}|{bool(res.stopped)}"  # stopped: the stop's reason, or None
    return label, node.node_rank, text, (key, len(parts), durations, res.duration)


def _span(values: Sequence[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    return f" after {lo:.1f}s" if f"{lo:.1f}" == f"{hi:.1f}" else f" after {lo:.1f}-{hi:.1f}s"


def _folded_row(group: Sequence[tuple[str, int, str, tuple[Any, ...]]]) -> str:
    """``node[2-64] (63 nodes): 504 ranks exit 0 after 8.1-8.6s; torchrun exit 0 after
    15.0-15.4s``."""
    kind, torchrun, stopped = group[0][3][0].split("|")
    nranks = sum(row[3][1] for row in group)
    ranks = [d for row in group for d in row[3][2]]
    agents = [row[3][3] for row in group if row[3][3] is not None]
    state = torchrun + _span(agents) + (" (stopped by dtrain)" if stopped == "True" else "")
    exit_text, _, mark = kind.partition(" (")
    mark = f" ({mark}" if mark else ""
    nodes = count(len(group), "node")
    return (f"{fold(row[0] for row in group)} ({nodes}): {count(nranks, 'rank')} "
            f"{exit_text}{_span(ranks)}{mark}; {state}")


def node_results(outcome: JobOutcome, plan: LaunchPlan,
                 v: Verdict | None = None) -> list[NodeResult]:
    """meta.json ``nodes``: per node and rank, how it ended."""
    results: list[NodeResult] = []
    for node in plan.nodes:
        label = node.host.label
        res = outcome.nodes.get(label)
        ranks: dict[str, RankResult] = {}
        for rank in node.ranks:
            e = res.ranks.get(rank) if res is not None else None
            entry: RankResult = {"exit_code": _code(e) if e else None,
                                 "signal": e.signal if e else None,
                                 "duration": e.duration if e else None,
                                 "stop_signal": e.stop_signal if e else None}
            if e is not None and e.t:  # the node's clock when it started and ended
                entry["end"] = round(e.t, 3)
                if e.duration is not None:
                    entry["start"] = round(e.t - e.duration, 3)
            if v is not None:
                entry["role"] = _rank_role(outcome, v, label, rank, e)
            ranks[str(rank)] = entry
        results.append({
            "host": label, "node_rank": node.node_rank,
            "exit_code": res.exit_code if res else None,
            "signal": res.signal if res else None,
            "error": res.error if res else "not started", "lost": bool(res and res.lost),
            "abandoned": bool(res and res.abandoned),
            "stopped": res.stopped if res else None,
            "duration": res.duration if res else None,
            "start": round(res.started, 3) if res and res.started is not None else None,
            "end": round(res.ended, 3) if res and res.ended else None,
            "supervisor_pid": res.supervisor_pid if res else None,
            "pid": res.pid if res else None,
            "ranks": ranks,
        })
    return results


def root_cause_json(outcome: JobOutcome, v: Verdict, tails: TailKeeper) -> RootCause:
    """meta.json ``root_cause``."""
    root = outcome.root
    data: RootCause = {"kind": v.root_kind, "host": v.root_host, "rank": v.root_rank,
                       "exit_code": v.code, "summary": v.outcome}
    if root is not None and v.root_kind in ("rank", "node", "lost", "start", "hang", "fabric"):
        data["signal"], data["error"], data["t"] = root.signal, root.error, root.t
        data["stderr_tail"] = list(tails.tails.get((root.host, root.rank), ()))
        if (first := _first_failed_rank(outcome, root.host)) is not None:
            # the verdict names a failed node's first failed rank: that rank's own end
            data["signal"] = first.signal
            data["t"] = first.t if first.t is not None else root.t
            data["stderr_tail"] = list(tails.tails.get((root.host, first.rank), ()))
    if outcome.stop_reason:
        data["stop_reason"] = outcome.stop_reason
    return data


def failure_reason(outcome: JobOutcome, v: Verdict, keeper: ErrorKeeper) -> FailureReason | None:
    """Why the root-cause rank died (decide.outcome.failures), when the root cause is a rank."""
    if v.root_kind != "rank" or v.root_host is None or v.root_rank is None:
        return None
    node = outcome.nodes.get(v.root_host)
    end = node.ranks.get(v.root_rank) if node is not None else None
    return explain(rank=v.root_rank, host=v.root_host,
                   code=end.code if end is not None and end.code is not None else v.code,
                   sig=end.signal if end is not None else None,
                   pid=end.pid if end is not None else None,
                   evidence=keeper.evidence.get((v.root_host, v.root_rank)),
                   stderr=list(keeper.tails.get((v.root_host, v.root_rank), ())),
                   comm=keeper.comm_lines())


def failure_lines(reason: FailureReason) -> list[str]:
    """The summary's two lines: why, and what to do next (the evidence under why)."""
    return [f"why: {reason.summary}", *(f"  {e}" for e in reason.evidence[:8]),
            f"next: {reason.advice}"]
