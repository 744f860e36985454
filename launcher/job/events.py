"""What a node says, decoded once into typed events, and the one way to listen to a job.

Every control message a node's supervisor sends (``launcher/nodeside/supervisor.py``) is
decoded here, once, where the session reads it (job/node.py): JSON without NaN, Infinity or
endless nesting, checked against the plan (job/nodemsg.py: a host speaks only for its own
ranks, each once; a time is finite or left out), then turned into one frozen dataclass per
message type. No other module reads a node's message as a dict. A sampler's lines (the
``top`` and run samplers, job/sampling.py) are decoded here too (``decode_sample``).

``Observer`` is the protocol of a job's listeners, on the model of ClusterShell's
``Worker.ev_*`` events: one named method per event, each a no-op by default, so an observer
overrides only what it needs. ``Job.observe`` registers one; the job calls them in the order
they registered, each event after the job's own rules (the first failure, the running
state). ``on_lines`` carries the run's output lines (the run pipeline calls it). An
observer's exception is contained (``Observers.call``): told once on stderr, the observer
detached, the others, the run and its teardown untouched (the hang watch also catches its
own, tells it and goes on watching).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.decide.outcome.outcomes import RankEnd
from launcher.decide.outcome.stacks import StackAnswer
from launcher.job import nodemsg
from launcher.models import Host, OutputLine
from launcher.nodeside import nodemessages as names
from launcher.output import render

BadMessage = nodemsg.BadMessage


# -- the readers: a node's value as the launcher may use it ------------------------------------

def integer(value: object) -> int | None:
    """An int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: object) -> float | None:
    """A finite real number (not a bool) as a float, else None."""
    return nodemsg.finite(value)


def instant(value: object) -> float | None:
    """A node's Unix time (finite, in [0, 1e11]), else None."""
    return nodemsg.finite(value, 0.0, 1e11)


def text(value: object) -> str | None:
    """The text of a value that is there (not None, not empty), else None."""
    return str(value) if value else None


def mapping(value: object) -> Mapping[str, Any] | None:
    """A JSON object, else None."""
    return value if isinstance(value, dict) else None


# -- the events: each decodes its own message (``decode``: its checks, then its fields) ------

Ranks = Container[int] | None  # the ranks a host may speak for (None: any)


@dataclass(frozen=True)
class Event:
    """A message of a node's supervisor; ``t``: the node's clock, checked (None: absent)."""

    t: float | None

    def send(self, to: Observer, host: Host) -> None:
        to.on_other(host, self)


@dataclass(frozen=True)
class Hello(Event):
    """The job started (or did not: ``error``, with the exit ``code`` to report)."""

    pid: int | None = None  # the job's pid (= its pgid and session id)
    supervisor_pid: int | None = None
    hostname: str | None = None
    error: str | None = None
    code: int | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_hello(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> Hello:
        return cls(t, pid=integer(msg.get("pid")),
                   supervisor_pid=integer(msg.get("supervisor_pid")),
                   hostname=text(msg.get("hostname")), error=text(msg.get("error")),
                   code=integer(msg.get("code")))


@dataclass(frozen=True)
class RankStart(Event):
    """A rank's shim is up (the hang clock waits for every one); ``agent``: when the node's
    torchrun agent had imported torch (node clock; the start-up split, docs/goodput.md)."""

    rank: int = -1
    agent: float | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_rank_start(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> RankStart | None:
        rank = nodemsg.owned(msg.get("rank"), ranks)
        return None if rank is None else cls(t, rank=rank, agent=instant(msg.get("agent_t")))


@dataclass(frozen=True)
class RankRaised(Event):
    """A rank is failing of its own (an uncaught exception, a non-zero ``sys.exit``; its
    exit report follows): told before its connections close, so a peer's abort on them is
    known for a victim (docs/failure-semantics.md)."""

    rank: int = -1
    exc: str | None = None  # the exception's class name

    def send(self, to: Observer, host: Host) -> None:
        to.on_rank_raised(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> RankRaised | None:
        rank = nodemsg.owned(msg.get("rank"), ranks)
        exc = text(msg.get("exc"))
        return None if rank is None else cls(t, rank=rank, exc=exc[:120] if exc else None)


def rank_end(rank: int, msg: Mapping[str, Any]) -> RankEnd:
    """A rank's exit report (a ``rank_exit`` message, or a rank of the ``exit`` message)."""
    return RankEnd(rank, code=integer(msg.get("code")), signal=integer(msg.get("signal")),
                   stop_signal=integer(msg.get("stop_signal")),
                   duration=number(msg.get("duration")), t=instant(msg.get("t")),
                   pid=integer(msg.get("pid")), script=instant(msg.get("script_t")),
                   evidence=mapping(msg.get("evidence")))


@dataclass(frozen=True)
class RankExit(Event):
    """A rank ended: its exit report (decide/outcome/outcomes.RankEnd, the type the ``exit``
    message's ranks have too)."""

    end: RankEnd

    def send(self, to: Observer, host: Host) -> None:
        to.on_rank_exit(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> RankExit | None:
        rank = nodemsg.owned(msg.get("rank"), ranks)
        return None if rank is None else cls(t, rank_end(rank, dict(msg, t=t)))


def stack_answer(entry: Mapping[str, Any]) -> StackAnswer:
    """One rank's part of a ``stacks`` answer (decide/outcome/stacks.StackAnswer)."""
    sources = mapping(entry.get("sources")) or {}
    spy, fr = mapping(entry.get("pyspy")), mapping(entry.get("fr")) or {}
    got = spy.get("text") if spy is not None else None
    native = got if isinstance(got, str) else None if spy is None else \
        f"py-spy: {spy.get('error')}\n"
    data = fr.get("data")
    return StackAnswer(text=entry["text"] if isinstance(entry.get("text"), str) else None,
                       sources={str(k): str(v) for k, v in sources.items()},
                       error=text(entry.get("error")), pid=integer(entry.get("pid")),
                       pyspy=native, fr_data=data if isinstance(data, str) else None,
                       fr_error=text(fr.get("error")))


@dataclass(frozen=True)
class Stacks(Event):
    """The answer to a ``stacks`` request ``id``: per rank (the host's own) its dump;
    ``native``: py-spy's dumps that follow the first answer (``pyspy``: they will)."""

    id: str = "None"
    ranks: Mapping[int, StackAnswer] = field(default_factory=dict)
    native: bool = False
    pyspy: bool = False
    error: str | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_stacks(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> Stacks:
        answers = nodemsg.rank_map(msg.get("ranks"), ranks)
        return cls(t, id=str(msg.get("id")),
                   ranks={int(r): stack_answer(e) for r, e in answers.items()},
                   native=bool(msg.get("native")), pyspy=bool(msg.get("pyspy")),
                   error=text(msg.get("error")))


@dataclass(frozen=True)
class Flight(Event):
    """The flight recorder's dumps a node had at the end: rank -> base64 text."""

    files: Mapping[int, str] = field(default_factory=dict)

    def send(self, to: Observer, host: Host) -> None:
        to.on_flight(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> Flight:
        files = nodemsg.rank_map(msg.get("files"), ranks, str)
        return cls(t, files={int(r): f for r, f in files.items()})


@dataclass(frozen=True)
class Nccl(Event):
    """NCCL's lines of one of the host's ranks (docs/fabric.md)."""

    rank: int = -1
    lines: tuple[str, ...] = ()

    def send(self, to: Observer, host: Host) -> None:
        to.on_nccl(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> Nccl | None:
        rank = nodemsg.owned(msg.get("rank"), ranks)
        lines = msg.get("lines")
        if rank is None or not isinstance(lines, list):
            return None
        return cls(t, rank=rank, lines=tuple(ln[:600] for ln in lines[:nodemsg.MAX_NCCL_LINES]
                                             if isinstance(ln, str)))


@dataclass(frozen=True)
class Stopping(Event):
    """The supervisor began stopping its job, and why."""

    reason: str | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_stopping(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> Stopping:
        return cls(t, reason=text(msg.get("reason")))


@dataclass(frozen=True)
class Exit(Event):
    """The job ended: its code and signal, the supervisor's stop reason if it stopped it,
    each rank's exit report (the host's own), the container's end (--image)."""

    code: int | None = None
    signal: int | None = None
    stopped: str | None = None
    ranks: Mapping[int, RankEnd] = field(default_factory=dict)
    container: Mapping[str, Any] | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_exit(host, self)

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> Exit:
        ends = nodemsg.rank_map(msg.get("ranks"), ranks)
        return cls(t, code=integer(msg.get("code")), signal=integer(msg.get("signal")),
                   stopped=text(msg.get("stopped")),
                   ranks={int(r): rank_end(int(r), e) for r, e in ends.items()},
                   container=mapping(msg.get("container")))


@dataclass(frozen=True)
class Heartbeat(Event):
    """The supervisor is alive (the session's liveness; never handed to observers)."""

    @classmethod
    def decode(cls, msg: Mapping[str, Any], t: float | None, ranks: Ranks) -> Heartbeat:
        return cls(t)


@dataclass(frozen=True)
class Other(Event):
    """A message of a type the launcher does not know (a newer supervisor's): handed on,
    ignored by every observer of today."""

    kind: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)


# the one dispatch: a message's type (nodeside/nodemessages.py, the names the node programs
# send) -> its event's decoder; tests/test_node_messages.py runs every send through it
DECODERS: Mapping[str, Callable[[Mapping[str, Any], float | None, Ranks], Event | None]] = {
    names.MSG_HELLO: Hello.decode, names.MSG_RANK_START: RankStart.decode,
    names.MSG_RANK_RAISED: RankRaised.decode, names.MSG_RANK_EXIT: RankExit.decode,
    names.MSG_STACKS: Stacks.decode, names.MSG_FLIGHT: Flight.decode,
    names.MSG_NCCL: Nccl.decode, names.MSG_STOPPING: Stopping.decode,
    names.MSG_EXIT: Exit.decode, names.MSG_HB: Heartbeat.decode,
}


def decode(data: bytes | str, ranks: Ranks) -> Event | None:
    """One control message of a supervisor, as the launcher may believe it (``ranks``: the
    ranks that host may speak for, None: any). None: dropped (undecodable JSON, or a claim on
    a rank not the host's). BadMessage: what no supervisor sends (not a JSON object, nested
    too deeply): that node's error."""
    try:
        raw = nodemsg.loads(data)
    except BadMessage:
        raise
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        raise BadMessage("a control message that is not a JSON object")
    return typed(raw, ranks)


def typed(msg: Mapping[str, Any], ranks: Ranks = None) -> Event | None:
    """A message (a JSON object) as its event, checked by its decoder (None: dropped)."""
    kind = msg.get("type")
    t = instant(msg.get("t"))  # a time is finite and plausible, or left out
    decoder = DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        return Other(t, kind=kind if isinstance(kind, str) else None, fields=dict(msg))
    return decoder(msg, t, ranks)


# -- a sampler's lines --------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplerHello:
    """The sampler started."""

    pid: int | None = None


@dataclass(frozen=True)
class Sample:
    """One sample, checked: only the host's ranks, each with a plausible ``cpu``; ``data``
    is the whole sample as samples.jsonl and ``top`` read it."""

    t: float | None
    ranks: Mapping[str, Mapping[str, Any]]
    data: dict[str, Any]

    def cpu(self) -> tuple[float, dict[int, float]] | None:
        """(t, rank -> CPU seconds) for the ranks that say it (``sample_cpu``)."""
        return sample_cpu(self.data)


def sample_cpu(data: Mapping[str, Any]) -> tuple[float, dict[int, float]] | None:
    """A sample's time and its ranks' CPU seconds (rank -> s), or None: no time, or no rank
    with a CPU time (the straggler detector's input, for the run and for ``top``)."""
    ranks, t = data.get("ranks"), number(data.get("t"))
    if not isinstance(ranks, dict) or t is None:
        return None
    cpu = {int(r): float(v["cpu"]) for r, v in ranks.items()
           if str(r).isdigit() and isinstance(v, dict) and number(v.get("cpu")) is not None}
    return (t, cpu) if cpu else None


def decode_sample(line: bytes, ranks: Container[int] | None) -> SamplerHello | Sample | None:
    """One line of a node's sampler; None: not one (a login shell's chatter, undecodable,
    nested too deeply, a type it does not send: the channel goes on)."""
    if not line.lstrip().startswith(b"{"):
        return None  # what a chatty login shell printed before the sampler started
    try:
        msg = nodemsg.loads(line)  # no NaN/Infinity, no RecursionError
    except ValueError:
        return None
    if not isinstance(msg, dict):
        return None
    if msg.get("type") == names.MSG_HELLO:
        return SamplerHello(integer(msg.get("pid")))
    if msg.get("type") == names.MSG_SAMPLE:
        data = nodemsg.checked_sample(msg, ranks)
        found = data.get("ranks")
        return Sample(number(data.get("t")), found if isinstance(found, dict) else {}, data)
    return None


# -- the observer protocol ----------------------------------------------------------------------

class Observer:
    """A listener of one job (see the module doc): override what you need."""

    def on_hello(self, host: Host, ev: Hello) -> None:
        """A node's job started (or failed to: ``ev.error``)."""

    def on_rank_start(self, host: Host, ev: RankStart) -> None:
        """A rank's shim is up."""

    def on_rank_raised(self, host: Host, ev: RankRaised) -> None:
        """A rank is failing of its own; its exit follows."""

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        """A rank ended."""

    def on_stacks(self, host: Host, ev: Stacks) -> None:
        """A node answered a stacks request."""

    def on_flight(self, host: Host, ev: Flight) -> None:
        """A node's flight recorder dumps at its end."""

    def on_nccl(self, host: Host, ev: Nccl) -> None:
        """NCCL's lines of a rank."""

    def on_stopping(self, host: Host, ev: Stopping) -> None:
        """A node's supervisor began stopping its job."""

    def on_exit(self, host: Host, ev: Exit) -> None:
        """A node's job ended."""

    def on_other(self, host: Host, ev: Event) -> None:
        """A message of a type this launcher does not know."""

    def on_lines(self, lines: Sequence[OutputLine]) -> None:
        """Output lines of the run, as the pipeline emits them."""


class Observers:
    """The registered observers of one job, called in registration order.

    An observer is a watcher, never the run: one that raises (a bug in the status line, the
    hang watch, the samplers) is told once on stderr, with its exception's type and message,
    and detached; the others, the run and its teardown go on (``call``, the one guard every
    fan-out goes through). Cancellation (``CancelledError``, ``KeyboardInterrupt``,
    ``SystemExit``: not ``Exception``) passes through untouched."""

    def __init__(self, say: Callable[[str], None] = render.note) -> None:
        self.all: list[Observer] = []
        self.say = say
        self.failed: list[tuple[Observer, str]] = []  # detached: (observer, why)

    def add(self, observer: Observer) -> None:
        self.all.append(observer)

    def event(self, host: Host, ev: Event) -> None:
        for observer in tuple(self.all):
            self.call(observer, ev.send, observer, host)

    def lines(self, lines: Sequence[OutputLine]) -> None:
        for observer in tuple(self.all):
            self.call(observer, observer.on_lines, lines)

    def call(self, observer: Observer, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)`` on behalf of ``observer``; its exception detaches it, told once."""
        if observer not in self.all:  # detached by an earlier call in this fan-out
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - a watcher's bug never ends the run
            self.detach(observer, exc)

    def detach(self, observer: Observer, exc: Exception) -> None:
        try:
            self.all.remove(observer)
        except ValueError:  # already detached (the lines come on the pipeline's thread)
            return
        why = f"{type(exc).__name__}: {exc}"
        why = why if len(why) <= 200 else why[:199] + "…"
        self.failed.append((observer, why))
        with contextlib.suppress(Exception):  # no way left to tell it
            self.say(f"observer {type(observer).__name__} failed ({why}); "
                     "the run goes on without it")

