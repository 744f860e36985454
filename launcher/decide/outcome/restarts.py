"""Pure: after an attempt failed, whether to run again, on which nodes, and after how long.

``--restarts N`` relaunches the whole gang up to N times (docs/restarts.md). Each attempt's
end is summed up as an ``AttemptEnd`` (facts the launcher already has: the verdict's root
cause, hangs' ``FailureReason``, whether any rank made progress, which nodes were lost);
``classify`` names the fault:

* ``user``: deterministic, a restart fails the same way: a SyntaxError / ImportError /
  argparse error (``failures.DETERMINISTIC``), a rank failure before any progress line, the
  same exception (or OOM kill, or hang in the script's own code) at the same place as the
  attempt before. Exactly one attempt more is never spent on it.
* ``node``: evidence of the machine (docs/restarts.md): a lost or unreachable node, a node
  that did not start, a GPU Xid of the hardware catalogue, the hang culprit named again
  after a restart while its stack stands outside the script's code (in a collective, in
  native code, no Python stack at all). The node is fenced (never used again by this run,
  and remembered, tier ``isolate``: ``decide.outcome.lemons``), unless it is the run's last usable
  node.
* ``process``: anything else (a signal from outside, a native crash, a peer's connection
  closed, an exit code without a story, an OOM kill of the training process, a hang in
  the script's own code, a hang culprit outside it named once): the same nodes again. A
  hang culprit outside the script's code is remembered as a ``suspect`` (a one-off,
  forgiven after a cooldown), and fenced if it is named again.
* ``final``: success, Ctrl-C / `dtrain stop`, --timeout: no restart.

``choose_gang`` picks every run's first gang (the lemon list's hosts left out while enough
remain, ``--nnodes MAX`` hosts, the rest spares). ``next_gang`` replaces fenced nodes by
spares (in the fenced node's place, so node ranks stay), or shrinks within ``--nnodes
MIN:MAX``, or says the run cannot go on. ``backoff`` is the bounded exponential wait
before a relaunch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.decide.outcome import lemons as lm
from launcher.decide.outcome.failures import DETERMINISTIC, NODE_XIDS, FailureReason
from launcher.decide.outcome.incidents import Recall
from launcher.decide.outcome.lemons import Lemon
from launcher.decide.runplan.placement import Place, spare_for
from launcher.errors import UsageError
from launcher.hosts.hostfile import fold

USER, NODE, PROCESS, FINAL = "user", "node", "process", "final"
RESTART_ENV = "DTRAIN_ATTEMPT"  # 1 for the first attempt; the shim adds attempt-1 to
#                                 TORCHELASTIC_RESTART_COUNT (torchrun resets it to its own)
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
_ARGPARSE = re.compile(r"^(?:usage: .*|\S+: error: .*)$")


@dataclass(frozen=True)
class NodeCount:
    """``--nnodes K`` (min = max = K) or ``--nnodes MIN:MAX``."""

    min: int
    max: int

    def __str__(self) -> str:
        return str(self.max) if self.min == self.max else f"{self.min}:{self.max}"


def parse_nnodes(text: str | None, option: str = "--nnodes") -> NodeCount | None:
    """``K`` or ``MIN:MAX`` (torchrun's spelling); None when not given."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) in (1, 2) and all(p.isdigit() and int(p) > 0 for p in parts):
        low, high = int(parts[0]), int(parts[-1])
        if low <= high:
            return NodeCount(low, high)
    raise UsageError(f"{option} {text!r}: give a number of nodes (3) or MIN:MAX (2:4)",
                     hint="the hosts beyond MAX are spares: they replace a fenced node")


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended, as the launcher saw it (facts, no judgement)."""

    code: int
    root_kind: str | None  # the verdict's: rank, node, lost, start, hang, interrupted, timeout
    host: str | None = None
    rank: int | None = None
    reason: FailureReason | None = None  # why the root-cause rank died (decide.outcome.failures)
    progressed: bool = False  # a progress line was seen during the attempt
    lost: tuple[str, ...] = ()  # every node lost (heartbeat, connection) in the attempt
    error: str | None = None  # the root cause's own words (a lost node's, a hang's)
    stderr: tuple[str, ...] = ()  # the root-cause rank's last stderr lines
    # a hang's culprit (decide.outcome.stacks.Culprit): where it stands (script, collective,
    # native; None: not known) and its place
    where: str | None = None
    place: str | None = None


@dataclass(frozen=True)
class Fault:
    """What kind of failure it was, and which nodes to fence (with why)."""

    kind: str  # user, node, process, final
    why: str  # one line: "node2 lost (no heartbeat for 10 s)"
    fence: tuple[tuple[str, str], ...] = ()  # (host, why)
    signature: str | None = None  # "the same exception at the same place" key
    suspect: tuple[tuple[str, str], ...] = ()  # (host, why): named once, not fenced
    tier: str = lm.ISOLATE  # the lemon list's tier of the fenced nodes


def signature(reason: FailureReason | None) -> str | None:
    """The place of a Python exception or native crash, without the rank and host: two
    attempts with the same signature failed the same way."""
    if reason is None:
        return None
    if reason.kind == "exception":
        _, _, rest = reason.summary.partition(" raised ")
        return f"exception: {rest}" if rest else None
    if reason.kind == "oom":
        return "oom: killed by the kernel's OOM killer"
    if reason.kind in ("segfault", "abort"):
        frames = reason.details.get("frames") if reason.details else None
        if frames:
            return f"{reason.kind}: " + " <- ".join(str(f) for f in list(frames)[:4])
    return None


def _exception_type(reason: FailureReason) -> str:
    first = reason.evidence[0] if reason.evidence else ""
    return first.split(":", 1)[0].rsplit(".", 1)[-1]


def _argparse_error(end: AttemptEnd) -> str | None:
    """argparse's exit 2 after ``usage:`` and ``prog: error: ...`` on stderr."""
    if end.code != 2:
        return None
    lines = [t.strip() for t in end.stderr if t.strip()]
    if any(t.startswith("usage: ") for t in lines) and lines and \
            _ARGPARSE.match(lines[-1]) and ": error: " in lines[-1]:
        return lines[-1]
    return None


def classify(end: AttemptEnd, before: Sequence[Fault] = ()) -> Fault:
    """The fault of one attempt (``before``: the faults of the earlier attempts, oldest
    first). Node faults first: a node that went away is never the script's fault."""
    if end.code == 0:
        return Fault(FINAL, "succeeded")
    if end.root_kind == "interrupted":
        return Fault(FINAL, "interrupted")
    if end.root_kind == "timeout":
        return Fault(FINAL, "--timeout reached")
    if end.lost or end.root_kind == "lost":
        lost = list(end.lost) or ([end.host] if end.host else [])
        why = re.sub(r" \((.*)\)$", r", \1", end.error or "connection lost")
        # a lost attempt whose node was not named (no host, no lost list): say so
        return Fault(NODE, f"{', '.join(lost) or 'a node (not named)'} lost ({why})",
                     tuple((h, f"lost ({why})") for h in lost))
    if end.root_kind == "start" and end.host:
        why = end.error or "did not start"
        return Fault(NODE, f"{end.host} {why}", ((end.host, why),))
    if end.root_kind == "hang":
        return _hang(end, before)
    reason = end.reason
    if reason is not None and reason.host and reason.kind == "xid":
        n = reason.details.get("xid") if reason.details else None
        if n is None or n in NODE_XIDS or reason.scope == NODE:
            return Fault(NODE, reason.summary, ((reason.host, reason.summary),))
    # an OOM kill of the training process is not the machine's: the same script needs the
    # same memory on any node (the same place twice below: a user fault)
    sig = signature(reason)
    if reason is not None and reason.kind == "exception":
        kind = _exception_type(reason)
        if kind in DETERMINISTIC:
            return Fault(USER, f"{reason.summary} (a {kind} fails the same way on every "
                         "attempt)", signature=sig)
    parse_error = _argparse_error(end)
    if parse_error:
        return Fault(USER, f"the script refused its arguments: {parse_error}")
    if sig is not None and before and before[-1].signature == sig:
        return Fault(USER, f"{reason.summary if reason else sig} (the same failure at the "
                     "same place as the attempt before)", signature=sig)
    if end.root_kind == "rank" and not end.progressed:
        what = reason.summary if reason is not None else f"exit {end.code}"
        return Fault(USER, f"{what} before any progress line (a restart would fail the same "
                     "way; --progress REGEX names the script's progress lines)",
                     signature=sig)
    why = reason.summary if reason is not None else end.error or f"exit {end.code}"
    return Fault(PROCESS, why, signature=sig)


OUTSIDE = ("collective", "native")  # decide.outcome.stacks: a culprit not in the script's code


def _hang(end: AttemptEnd, before: Sequence[Fault]) -> Fault:
    """A hang: fenced only on evidence of the machine (module doc, docs/restarts.md)."""
    what = end.error or "no progress"
    host = end.host
    if not host:
        return Fault(PROCESS, end.error or "hang")
    sig = f"hang: {end.place}" if end.place else None
    if end.where is None:  # no stacks read: no evidence of the machine either way
        return Fault(PROCESS, f"{host}: hang culprit ({what}); where its stack stood is not "
                     "known: no evidence of the machine", signature=sig)
    if end.where not in OUTSIDE:
        if sig is not None and before and before[-1].signature == sig:
            return Fault(USER, f"{host}: hang culprit blocked in the script's own code at the "
                         "same place as the attempt before, not a node fault (it hangs the "
                         f"same way on any node) ({what})", signature=sig)
        return Fault(PROCESS, f"{host}: hang culprit blocked in the script's own code, not a "
                     f"node fault ({what})", signature=sig)
    stands = "in a collective" if end.where == "collective" else "outside Python"
    if any(host in (h for h, _ in f.suspect) for f in before):
        why = f"hang culprit again after a restart, {stands} ({what})"
        return Fault(NODE, f"{host}: {why}", ((host, why),), signature=sig)
    why = f"hang culprit {stands}, once ({what})"
    return Fault(PROCESS, f"{host}: {why}: a suspect, fenced if named again", signature=sig,
                 suspect=((host, why),))


def remembered(fault: Fault, history: Recall) -> Fault:
    """A process fault seen again by the incidents of earlier runs (docs/incidents.md): its
    print already failed on other nodes with this commit (the code's: a user fault, no
    restart), or its node failed in other ways too (the machine's: fenced, tier suspect,
    isolate from three prints). The line says the evidence."""
    if history.code is not None:
        return Fault(USER, history.code, signature=fault.signature)
    if history.fence is not None:
        host, tier, line = history.fence
        return Fault(NODE, f"{fault.why}; {line}", ((host, line),), fault.signature,
                     tier=tier)
    return fault


@dataclass(frozen=True)
class Gang:
    """The nodes of the next attempt, and what changed (for the console line)."""

    active: tuple[str, ...]
    spares: tuple[str, ...]
    replaced: tuple[tuple[str, str], ...] = ()  # (fenced, spare in its place)
    dropped: tuple[str, ...] = ()  # fenced with no spare: the run shrank
    stop: str | None = None  # why the run cannot go on (then active is what is left)


def next_gang(active: Sequence[str], spares: Sequence[str], fenced: Sequence[str],
              count: NodeCount, places: Mapping[str, Place] | None = None) -> Gang:
    """Fenced nodes out; each replaced, in its place, by a spare (``places``: one from its
    NVLink domain, switch or segment first, decide/runplan/placement.py; else the first); without
    a spare the run shrinks down to ``count.min``, below it the run stops."""
    out = set(fenced)
    pool = [s for s in spares if s not in out]
    slots: list[str] = []
    replaced: list[tuple[str, str]] = []
    dropped: list[str] = []
    for host in active:
        if host not in out:
            slots.append(host)
        elif pool:
            spare = spare_for(host, pool, places)[0] if places else pool[0]
            assert spare is not None
            pool.remove(spare)
            slots.append(spare)
            replaced.append((host, spare))
        else:
            dropped.append(host)
    stop = None
    if len(slots) < count.min:
        stop = (f"{len(slots)} usable node(s) left, the run needs at least {count.min} "
                f"(--nnodes {count}); no spare left")
    return Gang(tuple(slots), tuple(pool), tuple(replaced), tuple(dropped), stop)


def fenced_line(why: str, gang: Gang) -> str:
    """``<why>: fenced``, then what the fencing changed: each spare brought in, and the
    smaller run when a node had no spare (unless the run stops)."""
    change = [f"spare {new} in" for _, new in gang.replaced]
    if gang.dropped and not gang.stop:
        n = len(gang.active)
        change.append(f"shrinking to {n} node{'' if n == 1 else 's'}")
    return f"{why}: fenced" + (f", {', '.join(change)}" if change else "")


def backoff(attempt: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """Seconds to wait before ``attempt`` (2 = the first relaunch): base, 2 base, 4 base...
    up to ``cap`` (or the base itself, when that is larger)."""
    if attempt <= 1 or base <= 0:
        return 0.0
    return float(min(max(cap, base), base * 2 ** (attempt - 2)))


@dataclass(frozen=True)
class RestartPolicy:
    """``--restarts N`` and its bounds."""

    restarts: int = 0
    count: NodeCount | None = None  # --nnodes
    backoff: float = BACKOFF_BASE_S
    remember: bool = True  # fenced nodes go on the lemon list
    fence_ttl: float = 24 * 3600.0

    def split(self, hosts: Sequence[str]) -> tuple[NodeCount, list[str], list[str]]:
        """(the node count, the first attempt's nodes, the spares) of a host list."""
        count = self.count or NodeCount(len(hosts), len(hosts))
        return count, list(hosts[:count.max]), list(hosts[count.max:])


@dataclass(frozen=True)
class FirstGang:
    """Every run's first gang (``choose_gang``): its nodes, the node count, the spares, and
    the lines that say so (the lemon list's skips and warnings, then the spares' line)."""

    active: tuple[str, ...]
    count: NodeCount
    spares: tuple[str, ...]
    lemon_lines: tuple[str, ...] = ()
    spares_line: str | None = None  # None: no spare (said only for a run, not a dry run)


def choose_gang(labels: Sequence[str], policy: RestartPolicy, lemons: Mapping[str, Lemon],
                now: float) -> FirstGang:
    """(the first attempt's hosts, the node count, the spares) of every run: the hosts on
    the lemon list (``lemons``: those in force, ``decide.outcome.lemons.current``) left out while
    enough remain, else used with a warning; ``--nnodes MAX`` hosts; the rest spares."""
    if policy.count is not None and policy.count.min > len(labels):
        raise UsageError(f"--nnodes {policy.count}: only {len(labels)} host(s) given "
                         f"({fold(labels)})")
    need = policy.count.min if policy.count else len(labels)
    lines: list[str] = []
    usable = list(labels)
    if lemons:
        chosen = lm.skip(labels, lemons, need)
        lines = [lm.skip_line(lemon, now) for lemon in chosen.skipped]
        lines += [lm.kept_line(lemon, now) for lemon in chosen.kept]
        usable = list(chosen.hosts)
    count, active, spares = policy.split(usable)
    if policy.count is None:
        count = NodeCount(len(active), len(active))
    said = None
    if spares:
        names = fold(spares)
        said = (f"{names}: spare{'s' if len(spares) > 1 else ''} for a fenced node "
                f"(--nnodes {count})" if policy.restarts else
                f"{names} not used (--nnodes {count})")
    return FirstGang(tuple(active), count, tuple(spares), tuple(lines), said)


@dataclass
class Decision:
    """What the loop does after an attempt: ``relaunch`` on ``gang`` after ``wait`` s, or
    stop; ``line`` is the one console line that says so."""

    relaunch: bool
    line: str
    fault: Fault
    gang: Gang | None = None
    wait: float = 0.0
    fenced: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    suspect: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # lemon list only


def decide(end: AttemptEnd, before: Sequence[Fault], attempt: int, policy: RestartPolicy,
           active: Sequence[str], spares: Sequence[str], count: NodeCount,
           places: Mapping[str, Place] | None = None, history: Recall | None = None
           ) -> Decision:
    """The whole decision after attempt ``attempt`` ended; ``history``: what the incidents
    of earlier runs say of this failure (decide/outcome/incidents.py ``recall``)."""
    fault = classify(end, before)
    if fault.kind == FINAL:
        return Decision(False, "", fault)
    if history is not None and fault.kind == PROCESS:
        fault = remembered(fault, history)
        if fault.kind == USER:
            return Decision(False, fault.why, fault)
    if fault.kind == USER:
        return Decision(False, f"{fault.why}: not restarted", fault)
    left = policy.restarts - (attempt - 1)
    gang = next_gang(active, spares, [h for h, _ in fault.fence], count, places)
    parts = [fenced_line(fault.why, gang) if fault.fence else fault.why]
    if fault.fence and not gang.active:  # a run never fences its last usable node
        last = [h for h, _ in fault.fence]
        fault = Fault(fault.kind, fault.why, (), fault.signature, fault.suspect, fault.tier)
        gang = next_gang(active, spares, [], count, places)
        parts = [f"{fault.why}: not fenced ({', '.join(last)}: the run's last usable "
                 f"node{'s' if len(last) > 1 else ''})"]
    if gang.stop:
        return Decision(False, "; ".join([*parts, gang.stop]), fault, gang,
                        fenced=fault.fence, suspect=fault.suspect)
    if left <= 0:
        return Decision(False, "; ".join([*parts, f"no restart left (--restarts "
                                          f"{policy.restarts})"]), fault, gang,
                        fenced=fault.fence, suspect=fault.suspect)
    wait = backoff(attempt + 1, policy.backoff)
    same = "" if fault.fence else " on the same nodes"
    parts.append(f"attempt {attempt + 1}{same} from the last checkpoint" +
                 (f" in {wait:g} s" if wait else ""))
    return Decision(True, "; ".join(parts), fault, gang, wait, fault.fence, fault.suspect)
