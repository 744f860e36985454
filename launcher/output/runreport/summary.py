"""A run's story from its archive: header, lanes, attempts, hangs, stragglers (pure).

Input: meta.json as a dict, the ``Digest`` of output.jsonl, the ``UsageBuilder`` of
samples.jsonl and the stack dump texts. Every field of meta.json is optional here: old
archives (before per-rank start/end times, attempts, hangs, stragglers) and live runs give
what they have, and where a time had to be inferred from the output lines the lane says so
(``approx``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.output.console import fold_hosts
from launcher.output.runreport.curves import Curve, curves
from launcher.output.runreport.digest import Digest, Line
from launcher.output.runreport.usage import UsageBuilder, UsageChart, charts, why_none
from launcher.text.words import rank_ranges

RANK_LANES_MAX = 64  # above this many ranks, one lane per node (``--lanes rank`` overrides)


@dataclass(frozen=True)
class RankLane:
    rank: int
    host: str
    start: float | None  # seconds since the run's start
    end: float | None
    approx: bool  # times inferred from the output lines
    exit_code: int | None
    signal: int | None
    role: str  # root cause, failed, stopped, ok, unknown, running
    lines: int


@dataclass(frozen=True)
class NodeLane:
    host: str
    node_rank: int | None
    ranks: tuple[RankLane, ...]
    exit_code: int | None
    signal: int | None
    error: str | None
    lost: bool
    fenced: tuple[tuple[int, str], ...]  # (attempt, why)
    straggler: str | None  # why it was flagged, or None
    start: float | None = None  # the node program (torchrun) ran from, seconds since start
    end: float | None = None


@dataclass(frozen=True)
class Attempt:
    n: int
    start: float | None
    end: float | None
    exit_code: int | None
    cause: str | None
    hosts: tuple[str, ...]
    fenced: tuple[str, ...]
    outcome: str | None = None  # how it ended: which rank died and how (the verdict's line)


@dataclass(frozen=True)
class StackFile:
    rank: int | None
    name: str  # file name in the dump directory
    anchor: str
    text: str


@dataclass(frozen=True)
class Hang:
    t: float | None
    attempt: int
    culprit_rank: int | None
    culprit_host: str | None
    folded: tuple[str, ...]
    dump: str | None
    anchor: str | None  # the dump's section in the page, when its files are there
    place: str | None = None  # where the culprit is (its innermost frames)
    why: str | None = None  # why it is the likely culprit


@dataclass(frozen=True)
class Event:
    """A marker on the timeline."""

    t: float
    kind: str  # root cause, hang, straggler, fenced
    label: str
    host: str | None = None
    rank: int | None = None
    href: str | None = None


@dataclass(frozen=True)
class Header:
    run_id: str
    command: str
    hosts: str  # folded
    nodes: int
    world_size: int | None
    started: float | None  # Unix time
    duration: float | None
    attempts: int
    exit_code: int | None
    outcome: str
    root_cause: str
    state: str
    advice: str | None
    dtrain_version: str | None


@dataclass(frozen=True)
class RunSummary:
    header: Header
    nodes: tuple[NodeLane, ...]
    per_node_lanes: bool
    attempts: tuple[Attempt, ...]
    hangs: tuple[Hang, ...]
    events: tuple[Event, ...]
    curves: tuple[Curve, ...]
    curves_left_out: tuple[str, ...]
    usage: tuple[UsageChart, ...]
    stragglers: tuple[str, ...]  # hosts
    failing: tuple[int | None, str | None]  # (rank, host) of the root cause
    failing_tail: tuple[Line, ...]
    node_tails: dict[str, tuple[Line, ...]]
    notes: tuple[Line, ...]
    stacks: dict[str, tuple[StackFile, ...]]  # dump id -> files
    lines: int
    bad_records: int
    samples: int
    span: float  # seconds from the start to the last thing seen
    warnings: tuple[str, ...] = field(default=())
    usage_note: str = ""  # why there is no utilisation chart (when there is none)
    chatter: dict[str, int] = field(default_factory=dict)  # host -> shutdown lines folded
    goodput: dict[str, Any] | None = None  # meta.json's goodput ledger (docs/goodput.md)
    # NCCL's account (meta.json's fabric, docs/fabric.md): its one line, then its warnings
    # and the differences from the plan; empty when NCCL said nothing (gloo, no NCCL_DEBUG)
    fabric: tuple[str, ...] = field(default=())


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _dicts(v: object) -> list[Mapping[str, Any]]:
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []


def _rel(v: object, t0: float) -> float | None:
    n = _num(v)
    return round(n - t0, 3) if n is not None else None


def _layout(meta: Mapping[str, Any], digest: Digest) -> list[tuple[str, int | None, list[int]]]:
    """(host, node_rank, ranks) per node: meta's layout, else the plan, else the lines."""
    for rows in (_dicts(meta.get("layout")),
                 _dicts(meta.get("plan", {}).get("nodes")
                        if isinstance(meta.get("plan"), Mapping) else None)):
        out = [(str(r.get("host")), _int(r.get("node_rank")),
                [x for x in r.get("ranks", []) if _int(x) is not None])
               for r in rows if isinstance(r.get("host"), str)]
        if out:
            return out
    by_host: dict[str, list[int]] = {}
    node_rank: dict[str, int | None] = {}
    for rank, seen in sorted(digest.ranks.items()):
        by_host.setdefault(seen.host, []).append(rank)
        node_rank.setdefault(seen.host, seen.node_rank)
    hosts = [h for h in meta.get("hosts", []) if isinstance(h, str)] \
        if isinstance(meta.get("hosts"), list) else []
    for h in hosts:
        by_host.setdefault(h, [])
    return [(h, node_rank.get(h), rs) for h, rs in by_host.items()]


def _attempts(meta: Mapping[str, Any], t0: float) -> list[Attempt]:
    out = []
    for i, a in enumerate(_dicts(meta.get("attempts")), start=1):
        start, end = _num(a.get("start")), _num(a.get("end"))
        fenced = [f if isinstance(f, str) else _str(f.get("host")) if isinstance(f, Mapping)
                  else None for f in a.get("fenced") or []] if isinstance(
                      a.get("fenced"), list) else []
        hosts = a.get("hosts")
        out.append(Attempt(
            n=_int(a.get("n")) or i,
            start=start - t0 if start is not None else None,
            end=end - t0 if end is not None else None,
            exit_code=_int(a.get("exit_code")), cause=_cause_text(a.get("cause")),
            hosts=tuple(h for h in hosts if isinstance(h, str)) if isinstance(hosts, list)
            else (),
            fenced=tuple(f for f in fenced if f),
            outcome=_str(a.get("outcome")) or _cause_text(a.get("cause"))))
    return out


def _cause_text(cause: object) -> str | None:
    if isinstance(cause, str):
        return cause
    if isinstance(cause, Mapping):
        return _str(cause.get("summary")) or _str(cause.get("kind"))
    return None


def _fence_reasons(meta: Mapping[str, Any]) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for i, a in enumerate(_dicts(meta.get("attempts")), start=1):
        n = _int(a.get("n")) or i
        for f in a.get("fenced") or [] if isinstance(a.get("fenced"), list) else []:
            host = f if isinstance(f, str) else _str(f.get("host")) \
                if isinstance(f, Mapping) else None
            why = (_str(f.get("reason")) or _str(f.get("why"))) if isinstance(f, Mapping) \
                else None
            if host:
                out.setdefault(host, []).append((n, why or _cause_text(a.get("cause")) or ""))
    return out


def _stragglers(meta: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in meta.get("stragglers") or [] if isinstance(meta.get("stragglers"), list) else []:
        if isinstance(s, str):
            out[s] = "flagged as a straggler"
        elif isinstance(s, Mapping) and isinstance(s.get("host"), str):
            why = _str(s.get("reason")) or _str(s.get("why")) or _str(s.get("evidence")) \
                or _str(s.get("summary")) or "flagged as a straggler"
            out[s["host"]] = why
    return out


def _rank_lane(rank: int, host: str, info: Mapping[str, Any], digest: Digest, t0: float,
               end_default: float | None) -> RankLane:
    seen = digest.ranks.get(rank)
    dur = _num(info.get("duration"))
    start, end = _num(info.get("start")), _num(info.get("end"))
    approx = False
    if start is None and end is not None and dur is not None:
        start = end - dur
    if start is None and seen is not None:
        start, approx = seen.first_t, True
    if end is None and start is not None and dur is not None:
        end = start + dur
    if end is None and (info.get("exit_code") is not None or end_default is not None):
        end, approx = (seen.last_t if seen else end_default), True
    code, sig = _int(info.get("exit_code")), _int(info.get("signal"))
    role = _str(info.get("role"))
    if role is None:
        role = "running" if not info and end_default is None else \
            "ok" if code == 0 else "unknown" if code is None else "failed"
    return RankLane(rank=rank, host=host,
                    start=round(start - t0, 3) if start is not None else None,
                    end=round(end - t0, 3) if end is not None else None, approx=approx,
                    exit_code=code, signal=sig, role=role,
                    lines=seen.lines if seen else 0)


def _earlier_hosts(meta: Mapping[str, Any], digest: Digest,
                   known: set[str]) -> list[tuple[str, list[int]]]:
    """Hosts of earlier attempts that the last one no longer has (fenced, replaced), with
    the ranks their lines came from."""
    out = []
    for a in _dicts(meta.get("attempts")):
        hosts = a.get("hosts") if isinstance(a.get("hosts"), list) else []
        for host in hosts or []:
            if isinstance(host, str) and host not in known:
                known.add(host)
                out.append((host, sorted(r for h, r in digest.host_ranks if h == host)))
    return out


def _seen_lane(rank: int, host: str, digest: Digest, t0: float, role: str) -> RankLane:
    first, last, lines = digest.host_ranks[(host, rank)]
    return RankLane(rank=rank, host=host, start=round(first - t0, 3),
                    end=round(last - t0, 3), approx=True, exit_code=None, signal=None,
                    role=role, lines=int(lines))


def _stack_anchor(dump: str, name: str) -> str:
    return f"stack-{_id(dump)}-{_id(name)}"


def _id(text: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in text)


def summarize(meta: Mapping[str, Any], digest: Digest, usage: UsageBuilder,
              stacks: Mapping[str, Sequence[tuple[str, str]]] | None = None, *,
              run_id: str = "", lanes: str = "auto") -> RunSummary:
    """Everything the page and ``--json`` show. ``stacks``: dump id -> (file name, text)."""
    t0 = _num(meta.get("start")) or _num(meta.get("created_ts")) or digest.first_t or 0.0
    end_abs = _num(meta.get("end"))
    root = meta.get("root_cause") if isinstance(meta.get("root_cause"), Mapping) else {}
    assert isinstance(root, Mapping)
    root_rank, root_host = _int(root.get("rank")), _str(root.get("host"))
    fences, strag = _fence_reasons(meta), _stragglers(meta)
    meta_nodes = {str(n.get("host")): n for n in _dicts(meta.get("nodes"))}
    nodes = []
    for host, node_rank, ranks in _layout(meta, digest):
        mn = meta_nodes.get(host, {})
        rank_info = mn.get("ranks") if isinstance(mn.get("ranks"), Mapping) else {}
        assert isinstance(rank_info, Mapping)
        node_end = end_abs
        if node_end is None and _num(mn.get("duration")) is not None:
            node_end = t0 + (_num(mn.get("duration")) or 0.0)
        lanes_ = tuple(_rank_lane(r, host, rank_info.get(str(r)) or {}, digest, t0, node_end)
                       for r in ranks)
        nodes.append(NodeLane(
            host=host, node_rank=node_rank, ranks=lanes_, exit_code=_int(mn.get("exit_code")),
            signal=_int(mn.get("signal")), error=_str(mn.get("error")),
            lost=bool(mn.get("lost")), fenced=tuple(fences.get(host, ())),
            straggler=strag.get(host),
            start=_rel(mn.get("start"), t0), end=_rel(mn.get("end"), t0)))
    for host, ranks in _earlier_hosts(meta, digest, {n.host for n in nodes}):
        lanes_ = tuple(_seen_lane(r, host, digest, t0, "fenced" if host in fences else
                                  "unknown") for r in ranks)
        nodes.append(NodeLane(host=host, node_rank=None, ranks=lanes_, exit_code=None,
                              signal=None, error=None, lost=False,
                              fenced=tuple(fences.get(host, ())), straggler=strag.get(host)))
    world = _int(meta.get("world_size")) or sum(len(n.ranks) for n in nodes) or None
    per_node = lanes == "node" or (lanes == "auto" and (world or 0) > RANK_LANES_MAX)
    attempts = _attempts(meta, t0)

    stack_files: dict[str, tuple[StackFile, ...]] = {}
    for dump, files in (stacks or {}).items():
        stack_files[dump] = tuple(
            StackFile(rank=_rank_of(name), name=name, anchor=_stack_anchor(dump, name),
                      text=text) for name, text in sorted(files, key=lambda f: _sort_key(f[0])))
    hangs = []
    for i, h in enumerate(_dicts(meta.get("hangs"))):
        culprit = h.get("culprit") if isinstance(h.get("culprit"), Mapping) else {}
        assert isinstance(culprit, Mapping)
        dump_id = _str(h.get("dump")) or _str(h.get("dump_id"))
        if dump_id and "/" in dump_id:
            dump_id = dump_id.rstrip("/").rsplit("/", 1)[-1]
        t = _num(h.get("t"))
        folded = h.get("folded") if isinstance(h.get("folded"), list) else []
        assert isinstance(folded, list)
        hangs.append(Hang(
            t=t - t0 if t is not None else None, attempt=_int(h.get("attempt")) or 1,
            culprit_rank=_int(culprit.get("rank")), culprit_host=_str(culprit.get("host")),
            folded=tuple(_folded_text(f) for f in folded),
            dump=dump_id, anchor=f"dump-{_id(dump_id)}" if dump_id in stack_files
            else f"hang-{i}", place=_str(culprit.get("place")), why=_str(culprit.get("why"))))

    events = _events(root, t0, hangs, attempts, fences, strag, meta)
    curve_list, left_out = curves(digest.curves, t0)
    usage_charts = charts(usage, t0)
    last = max([x for x in (end_abs, digest.last_t) if x is not None] or [t0])
    span = max(0.0, last - t0)
    failing_tail: tuple[Line, ...] = tuple(digest.err_tails.get(root_rank, ())) \
        if root_rank is not None else ()
    if failing_tail:  # the attempt that failed (a restarted run's rank failed in its last)
        last_attempt = max(x.attempt for x in failing_tail)
        failing_tail = tuple(x for x in failing_tail if x.attempt == last_attempt)
    if not failing_tail and isinstance(root.get("stderr_tail"), list):
        failing_tail = tuple(Line(t=end_abs or t0, host=root_host or "", rank=root_rank,
                                  stream="err", text=str(x), attempt=1)
                             for x in root["stderr_tail"])
    header = _header(meta, run_id, nodes, world, t0, end_abs, attempts, root, hangs,
                     digest)
    return RunSummary(
        header=header, nodes=tuple(nodes), per_node_lanes=per_node,
        attempts=tuple(attempts), hangs=tuple(hangs), events=tuple(events),
        curves=tuple(curve_list), curves_left_out=tuple(left_out), usage=tuple(usage_charts),
        stragglers=tuple(strag), failing=(root_rank, root_host), failing_tail=failing_tail,
        node_tails={h: tuple(t) for h, t in digest.node_tails.items()},
        notes=tuple(digest.notes), stacks=stack_files, lines=digest.lines,
        bad_records=digest.bad, samples=usage.records, span=span,
        usage_note="" if usage_charts else why_none(meta, usage.records, span),
        goodput=dict(meta["goodput"]) if isinstance(meta.get("goodput"), Mapping) else None,
        fabric=_fabric(meta.get("fabric")),
        chatter=dict(digest.chatter))


def _rank_of(name: str) -> int | None:
    """``r12.txt`` -> 12."""
    stem = name.split(".", 1)[0]
    return int(stem[1:]) if stem[:1] == "r" and stem[1:].isdigit() else None


def _sort_key(name: str) -> tuple[int, str]:
    r = _rank_of(name)
    return (r if r is not None else 1 << 30, name)


def _folded_text(f: object) -> str:
    """One folded stack group as a line: ``ranks 0-3,5 (5) on node[1-3]: all_reduce <- ...``."""
    if isinstance(f, str):
        return f
    if not isinstance(f, Mapping):
        return str(f)
    ranks = f.get("ranks")
    nums = [r for r in ranks if _int(r) is not None] if isinstance(ranks, list) else []
    where = (f"rank {nums[0]}" if len(nums) == 1 else
             f"ranks {rank_ranges(nums)} ({len(nums)})" if nums else _str(ranks) or "")
    hosts = [h for h in f.get("hosts") or [] if isinstance(h, str)] \
        if isinstance(f.get("hosts"), list) else []
    if hosts:
        where += f" on {fold_hosts(hosts)}"
    text = _str(f.get("place")) or _str(f.get("stack")) or _str(f.get("summary")) or ""
    if not text and isinstance(f.get("frames"), list):
        text = " <- ".join(f"{fr.get('func')}() {fr.get('path')}:{fr.get('line')}"
                           for fr in f["frames"] if isinstance(fr, Mapping))
    return f"{where}: {text}" if where else text


def _events(root: Mapping[str, Any], t0: float, hangs: list[Hang], attempts: list[Attempt],
            fences: Mapping[str, list[tuple[int, str]]], strag: Mapping[str, str],
            meta: Mapping[str, Any]) -> list[Event]:
    out = []
    rt = _num(root.get("t"))
    if rt is not None and root.get("kind") in ("rank", "node", "lost", "start", "hang"):
        out.append(Event(rt - t0, "root cause", _str(root.get("summary")) or "root cause",
                         _str(root.get("host")), _int(root.get("rank")), "#failing"))
    for h in hangs:
        if h.t is not None:
            who = (f"rank {h.culprit_rank}" if h.culprit_rank is not None else "?") + \
                (f" on {h.culprit_host}" if h.culprit_host else "")
            if h.place:
                who += f": {h.place}"
            out.append(Event(h.t, "hang", f"hang: likely culprit {who}", h.culprit_host,
                             h.culprit_rank, f"#{h.anchor}" if h.anchor else None))
    ends = {a.n: a.end for a in attempts}
    for host, items in fences.items():
        for n, why in items:
            t = ends.get(n)
            if t is not None:
                out.append(Event(t, "fenced", f"{host} fenced after attempt {n}: {why}",
                                 host))
    for s in _dicts(meta.get("stragglers")):
        slow, t = _str(s.get("host")), _num(s.get("t")) or _num(s.get("since"))
        if slow and t is not None:
            # each flag its own line (a node flagged in two attempts has two), its first rank
            ranks = s.get("ranks") if isinstance(s.get("ranks"), list) else []
            assert isinstance(ranks, list)
            rank = _int(s.get("rank"))
            if rank is None:
                rank = next((r for r in map(_int, ranks) if r is not None), None)
            why = _str(s.get("summary")) or strag.get(slow, "straggler")
            out.append(Event(t - t0, "straggler", f"{slow}: {why}", slow, rank, "#usage-sec"))
    return sorted(out, key=lambda e: e.t)


def _fabric(fabric: object) -> tuple[str, ...]:
    """meta.json's ``fabric``: NCCL's line, its warnings, the differences from the plan."""
    if not isinstance(fabric, Mapping) or not _str(fabric.get("line")):
        return ()
    more = [*(fabric.get("warnings") or ()), *(
        f"NCCL differs from the plan: {d}" for d in fabric.get("differences") or ())]
    return (str(fabric["line"]), *(str(x) for x in more if isinstance(x, str)))


def _header(meta: Mapping[str, Any], run_id: str, nodes: list[NodeLane], world: int | None,
            t0: float, end_abs: float | None, attempts: list[Attempt],
            root: Mapping[str, Any], hangs: list[Hang], digest: Digest) -> Header:
    cmd = meta.get("command")
    command = shlex.join(str(c) for c in cmd) if isinstance(cmd, list) else _str(cmd) or ""
    hosts = [n.host for n in nodes]
    code = _int(meta.get("exit_code"))
    outcome = _str(meta.get("outcome")) or ("running" if end_abs is None else "")
    why = _str(root.get("summary")) or outcome
    failure = root.get("failure") if isinstance(root.get("failure"), Mapping) else {}
    assert isinstance(failure, Mapping)
    explain = _str(failure.get("summary")) or _str(root.get("explanation")) or \
        _str(root.get("why")) or _str(root.get("reason"))
    if explain and explain.startswith(why):  # the explanation repeats the summary first
        why = explain
    elif explain and explain not in why:
        why = f"{why}: {explain}" if why else explain
    if hangs and not any(w in why for w in ("hang", "hung")):
        h = hangs[-1]
        who = f"rank {h.culprit_rank}" if h.culprit_rank is not None else "a rank"
        why += ("; " if why else "") + f"hang detected, likely culprit {who}" + \
            (f" on {h.culprit_host}" if h.culprit_host else "")
    if end_abs is None:
        state = _str(meta.get("state")) or "running"
    else:
        state = "finished"
    last = end_abs if end_abs is not None else digest.last_t
    return Header(
        run_id=_str(meta.get("run_id")) or run_id, command=command,
        hosts=fold_hosts(hosts) if hosts else "", nodes=len(hosts), world_size=world,
        started=t0 or None, duration=(last - t0) if last is not None and t0 else None,
        attempts=max(1, len(attempts)), exit_code=code, outcome=outcome,
        root_cause=why or ("ok" if code == 0 else ""), state=state,
        advice=_str(failure.get("advice")),
        dtrain_version=_str(meta.get("dtrain_version")))
