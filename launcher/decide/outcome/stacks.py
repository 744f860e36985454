"""Pure: faulthandler dumps of every rank -> one folded verdict and the likely culprit.

A rank's dump is faulthandler's text (docs/hangs.md): one block per thread, innermost frame
first, ``  File "path", line N in func``. The rank's *main* thread is the one that runs the
user's script: it holds the rank wrapper's frames (``_run_user`` in dtrain_shim.py) at its
bottom, which are cut off; the wrapper's idle helper thread is left out. Ranks whose main
threads stand at the same place (same frames) fold into one group, as ``--gather`` folds
output::

    ranks 0-3,5 (5 ranks on 3 nodes): all_reduce <- step_once() train.py:88
    rank 4 (node3): time.sleep <- load_batch() data.py:41

The culprit comes from the wavefront, never from a vote (docs/hangs.md): a rank that waits
inside a collective is a victim; the culprits are the ranks that have not reached the
collective the others wait in, however many or few they are. Each rank's dump is its own
node's claim, and a rank is named only on its own word: its own stack stands outside every
collective and its own flight recorder (``decide.outcome.flight``) shows no collective entered and
not completed. Another rank's report (a higher sequence number, another op, another place)
is never evidence against a rank; it may only clear it: a rank whose own record shows the
collective the waiting ranks wait in completed is not behind it. A rank that waits by its
own report is never named, whatever the others say; when every rank does, no culprit. Where
sequence numbers are known for every culprit, the rule is ``flight``; else ``wavefront``.
Only when no rank waits by its own report is the group that differs from the largest one
named (``differs``). A rank that did not answer the dump at all (stopped, or stuck in the
kernel) is a group of its own, and not inside a collective.

``Culprit.where`` says where the culprits stand, for the restart policy (docs/restarts.md):
``script`` (blocked in the script's own Python code: the script's), ``native`` (no Python
stack: native code, a driver, the kernel, a stopped process). ``collective`` (inside a
collective) is kept for the records of earlier versions: a rank inside a collective by its
own stack waits, and is never named now.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from launcher.decide.outcome.flight import RankFlight
from launcher.text.words import rank_ranges

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^  File "(.*)", line (\d{1,12}) in (.*)$')  # a longer number: no frame
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
SHIM_NAME = "dtrain_shim.py"
_WRAPPER = frozenset({"_run_user", "_guarded", "rank_main", "<lambda>", "main", "<module>",
                      "_run_module_as_main", "_run_code", "run_path", "_run_module_code"})
_HELPER = "_arm_helper"
COLLECTIVES = frozenset({
    "all_reduce", "allreduce", "barrier", "monitored_barrier", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_object", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "send", "recv", "isend",
    "irecv", "wait", "broadcast_object_list", "_allgather_base", "_reduce_scatter_base"})


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    @property
    def library(self) -> bool:
        """Not the user's code: site-packages, the standard library, frozen modules."""
        path = self.path
        return "-packages/" in path or path.startswith("<") or "/lib/python3" in path

    @property
    def basename(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def where(self) -> str:
        return f"{self.func}() {self.basename}:{self.line}"


@dataclass(frozen=True)
class Thread:
    ident: str
    current: bool
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class RankStack:
    """One rank's dump, parsed (``error`` when there was none)."""

    rank: int
    host: str
    threads: tuple[Thread, ...] = ()
    main: tuple[Frame, ...] = ()  # the main thread, the wrapper's frames cut off
    sources: Mapping[str, str] = field(default_factory=dict)  # "path:line" -> source
    error: str | None = None

    def place(self) -> str:
        """Where the main thread stands: ``all_reduce <- step() train.py:88``."""
        if self.error is not None:
            return f"no stack ({self.error})"
        if not self.main:
            return "no Python frame"
        inner = self.main[0]
        user = next((f for f in self.main if not f.library), None)
        if not inner.library:
            call = _called(self.sources.get(f"{inner.path}:{inner.line}", ""))
            return f"{call} <- {inner.where()}" if call else inner.where()
        if user is None:
            return inner.where()
        return f"{inner.func} <- {user.where()}"

    def key(self) -> tuple[object, ...]:
        if self.error is not None:
            return ("error", self.error)
        return tuple((f.path, f.line, f.func) for f in self.main)


def _called(source: str) -> str | None:
    """``time.sleep`` from ``time.sleep(3600)``: the first call on a source line."""
    m = _CALL.search(source)
    return m.group(1) if m else None


def parse_faulthandler(text: str) -> tuple[Thread, ...]:
    """faulthandler's all-threads dump -> threads (the last dump when several follow)."""
    blocks: list[list[Thread]] = [[]]
    ident, current, frames = None, False, []  # type: ignore[var-annotated]

    def close() -> None:
        if ident is not None:
            blocks[-1].append(Thread(ident, current, tuple(frames)))

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        m = _THREAD.match(line)
        if m:
            close()
            seen = {t.ident for t in blocks[-1]}
            again = m.group(1) == "Current thread" and any(t.current for t in blocks[-1])
            if m.group(2) in seen or again:  # a thread seen again: a new dump begins
                blocks.append([])
            ident, current, frames = m.group(2), m.group(1) == "Current thread", []
            continue
        f = _FRAME.match(line)
        if f and ident is not None:
            frames.append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    close()
    return tuple(blocks[-1])


def _is_wrapper(frame: Frame) -> bool:
    return frame.basename == SHIM_NAME or frame.path.endswith("runpy.py") \
        or frame.path == "<frozen runpy>"


def main_frames(threads: Sequence[Thread]) -> tuple[Frame, ...]:
    """The user's main thread, innermost first, without the wrapper's outer frames."""
    chosen = None
    for t in threads:
        if any(f.basename == SHIM_NAME and f.func in _WRAPPER for f in t.frames):
            chosen = t
            break
    if chosen is None:  # no wrapper (another launcher's dump): the thread at <module>
        for t in threads:
            if t.frames and t.frames[-1].func == "<module>":
                chosen = t
                break
    if chosen is None:
        chosen = next((t for t in threads if t.current), threads[0] if threads else None)
    if chosen is None:
        return ()
    frames = list(chosen.frames)
    while frames and _is_wrapper(frames[-1]):
        frames.pop()
    return tuple(frames)


def user_threads(threads: Sequence[Thread]) -> tuple[Thread, ...]:
    """Every thread but the wrapper's helper."""
    return tuple(t for t in threads if not any(f.func == _HELPER and f.basename == SHIM_NAME
                                                for f in t.frames))


@dataclass(frozen=True)
class StackAnswer:
    """One rank's part of a node's ``stacks`` answer, typed (job/events.py ``Stacks.ranks``
    decodes it, the one place that reads the node's dict)."""

    text: str | None = None  # faulthandler's dump of every thread
    sources: Mapping[str, str] = field(default_factory=dict)  # "path:line" -> its source line
    error: str | None = None  # why there is no dump ("exited": the rank had ended)
    pid: int | None = None
    pyspy: str | None = None  # py-spy's native dump (or why there is none), to archive
    fr_data: str | None = None  # the flight recorder's dump, base64
    fr_error: str | None = None  # why there is no flight recorder dump

    @property
    def exited(self) -> bool:
        """The rank had ended before the request: its exit report tells the rest."""
        return self.error == "exited"


def rank_stack(rank: int, host: str, answer: StackAnswer) -> RankStack:
    """One rank of a supervisor's ``stacks`` message."""
    text = answer.text
    if text is None or not text.strip():
        return RankStack(rank, host, error=answer.error or "no dump")
    threads = user_threads(parse_faulthandler(text))
    return RankStack(rank, host, threads, main_frames(threads), dict(answer.sources))


@dataclass(frozen=True)
class Group:
    """Ranks whose main threads stand at the same place."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    place: str
    stack: RankStack  # the first rank's, for the frames

    def label(self) -> str:
        """``ranks 0-3,5 (5 ranks on 3 nodes)``, ``rank 4 (node3)``, ``ranks 4-5 (node3)``
        (a bare count, ``(5)``, read as a rank or a host)."""
        n = len(self.ranks)
        who = f"rank {self.ranks[0]}" if n == 1 else f"ranks {rank_ranges(self.ranks)}"
        hosts = list(dict.fromkeys(self.hosts))
        if len(hosts) == 1:
            return f"{who} ({hosts[0]})"
        return f"{who} ({n} ranks on {len(hosts)} nodes)"

    @property
    def in_collective(self) -> bool:
        return _in_collective(self.stack.main)


SCRIPT, COLLECTIVE, NATIVE = "script", "collective", "native"


def _where(stack: RankStack) -> str:
    """Where one rank stands: in the script's code, inside a collective, or no Python."""
    frames = stack.main
    if stack.error is not None or not frames:
        return NATIVE
    if _in_collective(frames):
        return COLLECTIVE
    return SCRIPT if any(not f.library for f in frames) else NATIVE


@dataclass(frozen=True)
class Culprit:
    """The likely culprit: one rank, or the ranks of one node, or several."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    place: str
    why: str
    # script: every culprit blocked in the script's own code; collective / native: not
    where: str = SCRIPT
    rule: str = "differs"  # flight, wavefront, or differs (the fallback)

    @property
    def rank(self) -> int | None:
        return self.ranks[0] if len(self.ranks) == 1 else None

    @property
    def host(self) -> str | None:
        hosts = set(self.hosts)
        return self.hosts[0] if len(hosts) == 1 else None

    def describe(self) -> str:
        if self.rank is not None:
            who = f"rank {self.rank} on {self.hosts[0]}"
        elif self.host is not None:
            who = f"ranks {rank_ranges(self.ranks)} on {self.host}"
        else:
            who = f"ranks {rank_ranges(self.ranks)}"
        return f"{who}: {self.place}"

    def json(self) -> dict[str, object]:
        return {"rank": self.rank, "host": self.host, "ranks": list(self.ranks),
                "hosts": sorted(set(self.hosts)), "place": self.place, "why": self.why,
                "where": self.where, "rule": self.rule}


@dataclass(frozen=True)
class Folded:
    """Every rank's stack folded into groups (largest first) and the likely culprit."""

    groups: tuple[Group, ...]
    culprit: Culprit | None
    missing: tuple[int, ...] = ()  # ranks of the plan with no answer at all

    def lines(self) -> list[str]:
        out = []
        for g in self.groups:
            mark = "   <- likely culprit" if self.culprit is not None and set(
                g.ranks) <= set(self.culprit.ranks) else ""
            out.append(f"{g.label()}: {g.place}{mark}")
        if self.missing:
            out.append(f"ranks {rank_ranges(self.missing)}: no answer from their node")
        return out

    def json(self) -> list[dict[str, object]]:
        return [{"ranks": list(g.ranks), "hosts": sorted(set(g.hosts)), "place": g.place,
                 "frames": [{"path": f.path, "line": f.line, "func": f.func}
                            for f in g.stack.main]} for g in self.groups]


def fold(stacks: Iterable[RankStack], expected: Iterable[int] = (),
         positions: Mapping[int, RankFlight] | None = None) -> Folded:
    """Group ranks by their main thread's frames and name the culprits (module doc);
    ``positions``: the flight recorder's per-rank sequence numbers, where known."""
    by_key: dict[tuple[object, ...], list[RankStack]] = {}
    own: dict[int, RankStack] = {}
    for s in sorted(stacks, key=lambda s: s.rank):
        if s.rank in own:  # one answer per rank (job/nodemsg.py keeps one): the first
            continue
        own[s.rank] = s
        by_key.setdefault(s.key(), []).append(s)
    groups = [Group(tuple(s.rank for s in members), tuple(s.host for s in members),
                    members[0].place(), members[0]) for members in by_key.values()]
    # largest first; among equals, ranks waiting in a collective first (they are the
    # ones waiting for someone), then by first rank
    groups.sort(key=lambda g: (-len(g.ranks), not g.in_collective, g.ranks[0]))
    missing = tuple(sorted(set(expected) - set(own)))
    return Folded(tuple(groups), _culprit(groups, own, positions or {}), missing)


def _in_collective(frames: Sequence[Frame]) -> bool:
    return bool(frames) and any(f.func in COLLECTIVES for f in frames[:6])


def waits(stack: RankStack, position: RankFlight | None) -> bool:
    """By this rank's own report alone, it waits for someone: its own stack is inside a
    collective, or its own flight recorder shows a collective entered and not completed
    (an NCCL rank returns from the call at once and blocks later, in the script's code)."""
    if stack.error is None and _in_collective(stack.main):
        return True
    return position is not None and position.completed < position.enqueued


def _culprit(groups: Sequence[Group], own: Mapping[int, RankStack],
             positions: Mapping[int, RankFlight]) -> Culprit | None:
    """The culprits, each named by its own report only (docs/hangs.md, "whose word").

    A rank is named only when its own stack stands outside every collective and its own
    flight recorder does not show it inside one: what another node's ranks report (a
    higher sequence number, another op, another place) is never evidence against it; it
    may only clear it (a rank that by its own record has completed the collective every
    waiting rank waits in is not behind it). A rank that waits by its own report is never
    named, whatever the others say: every rank waiting by its own word, no culprit."""
    known = {r: p for r, p in positions.items() if r in own}
    waiting = [r for r in sorted(own) if waits(own[r], known.get(r))]
    outside = [r for r in sorted(own) if r not in set(waiting)]
    if not waiting:
        return _differs(groups, own)  # nobody waits for anyone: the fallback
    # the collective the waiting ranks are in, by their own flight recorders
    pending = {r: known[r] for r in waiting
               if r in known and known[r].completed < known[r].enqueued}
    front = max((p.enqueued for p in pending.values()), default=None)
    if front is not None:  # their word may clear: it never accuses
        outside = [r for r in outside if r not in known or known[r].enqueued < front]
    if not outside:
        return None
    they = "it has" if len(outside) == 1 else "they have"
    if front is not None and all(r in known for r in outside):
        op = next((p.last_op for p in pending.values() if p.enqueued == front and p.last_op),
                  None)
        what = f"collective #{front}" + (f" ({op})" if op else "")
        low = min(known[r].enqueued for r in outside)
        why = (f"{they} not entered {what}, which {_who(len(waiting))} in (flight recorder: "
               f"at #{low})")
        return _make(groups, own, outside, why, "flight")
    inside = next((g for g in groups if g.in_collective), None)
    at = f", at {inside.place}" if inside is not None else ""
    why = f"{they} not reached the collective {_who(len(waiting))} in{at}"
    return _make(groups, own, outside, why, "wavefront")


def _make(groups: Sequence[Group], own: Mapping[int, RankStack], ranks: Iterable[int],
          why: str, rule: str) -> Culprit:
    """The culprit of these ranks (their groups' places, their hosts, where each one's own
    stack stands)."""
    chosen = sorted(set(ranks))
    group = {r: g for g in groups for r in g.ranks}
    hosts = tuple(own[r].host if r in own else "?" for r in chosen)
    places = list(dict.fromkeys(group[r].place for r in chosen if r in group))
    wheres = {_where(own[r]) for r in chosen if r in own}
    where = SCRIPT if wheres == {SCRIPT} else (NATIVE if NATIVE in wheres else COLLECTIVE)
    return Culprit(tuple(chosen), hosts, "; ".join(places) or "no stack", why, where, rule)


def _who(n: int) -> str:
    return f"the other {n} ranks wait" if n > 1 else "the other rank waits"


def _differs(groups: Sequence[Group], own: Mapping[int, RankStack]) -> Culprit | None:
    """The fallback, when no rank waits in a collective by its own report (each rank's own
    stack and flight recorder put it outside every collective): the group that differs
    from the largest."""
    if not groups:
        return None
    majority, others = groups[0], list(groups[1:])
    if not others:
        return None  # every rank stands at the same place: nobody differs
    if len(majority.ranks) == len(others[0].ranks):
        return None  # no majority to differ from
    ranks = tuple(r for g in others for r in g.ranks)
    n = len(majority.ranks)
    others_ = f"the other {n} ranks', which wait" if n > 1 else "the other rank's, which waits"
    why = f"{'its stack differs' if len(ranks) == 1 else 'their stacks differ'} from " \
          f"{others_} at {majority.place}"
    return _make(groups, own, ranks, why, "differs")
