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

from launcher.job import nodemsg
from launcher.models import Host, OutputLine
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
    """A node's Unix time, as ``t`` is checked (nodemsg.checked), else None."""
    return nodemsg.finite(value, 0.0, 1e11)


def text(value: object) -> str | None:
    """The text of a value that is there (not None, not empty), else None."""
    return str(value) if value else None


def mapping(value: object) -> Mapping[str, Any] | None:
    """A JSON object, else None."""
    return value if isinstance(value, dict) else None


# -- the events ---------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class RankStart(Event):
    """A rank's shim is up (the hang clock waits for every one); ``agent``: when the node's
    torchrun agent had imported torch (node clock; the start-up split, docs/goodput.md)."""

    rank: int = -1
    agent: float | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_rank_start(host, self)


@dataclass(frozen=True)
class RankRaised(Event):
    """A rank is failing of its own (an uncaught exception, a non-zero ``sys.exit``; its
    exit report follows): told before its connections close, so a peer's abort on them is
    known for a victim (docs/failure-semantics.md)."""

    rank: int = -1
    exc: str | None = None  # the exception's class name

    def send(self, to: Observer, host: Host) -> None:
        to.on_rank_raised(host, self)


@dataclass(frozen=True)
class RankExit(Event):
    """A rank ended: its exit report (code, 128+N for signal N), the stop its shim passed on
    (``stop_signal``: it was asked to stop), and what the node knows of its death."""

    rank: int = -1
    code: int | None = None
    signal: int | None = None
    stop_signal: int | None = None
    duration: float | None = None
    evidence: Mapping[str, Any] | None = None
    script: float | None = None  # the hand-over to the user's script (node clock)

    @property
    def failed(self) -> bool:
        """Exited non-zero (a code known and not 0)."""
        return self.code not in (0, None)

    def send(self, to: Observer, host: Host) -> None:
        to.on_rank_exit(host, self)


@dataclass(frozen=True)
class Stacks(Event):
    """The answer to a ``stacks`` request ``id``: per rank (the host's own) its dump;
    ``native``: py-spy's dumps that follow the first answer (``pyspy``: they will)."""

    id: str = "None"
    ranks: Mapping[str, Any] = field(default_factory=dict)
    native: bool = False
    pyspy: bool = False
    error: str | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_stacks(host, self)


@dataclass(frozen=True)
class Flight(Event):
    """The flight recorder's dumps a node had at the end: rank -> base64 text."""

    files: Mapping[str, str] = field(default_factory=dict)

    def send(self, to: Observer, host: Host) -> None:
        to.on_flight(host, self)


@dataclass(frozen=True)
class Nccl(Event):
    """NCCL's lines of one of the host's ranks (docs/fabric.md)."""

    rank: int = -1
    lines: tuple[str, ...] = ()

    def send(self, to: Observer, host: Host) -> None:
        to.on_nccl(host, self)


@dataclass(frozen=True)
class Stopping(Event):
    """The supervisor began stopping its job, and why."""

    reason: str | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_stopping(host, self)


@dataclass(frozen=True)
class Exit(Event):
    """The job ended: its code and signal, the supervisor's stop reason if it stopped it,
    each rank's exit report (the host's own), the container's end (--image)."""

    code: int | None = None
    signal: int | None = None
    stopped: str | None = None
    ranks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    container: Mapping[str, Any] | None = None

    def send(self, to: Observer, host: Host) -> None:
        to.on_exit(host, self)


@dataclass(frozen=True)
class Heartbeat(Event):
    """The supervisor is alive (the session's liveness; never handed to observers)."""


@dataclass(frozen=True)
class Other(Event):
    """A message of a type the launcher does not know (a newer supervisor's): handed on,
    ignored by every observer of today."""

    kind: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)


def decode(data: bytes | str, ranks: Container[int] | None) -> Event | None:
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
    msg = nodemsg.checked(raw, ranks)
    return None if msg is None else typed(msg)


def typed(msg: Mapping[str, Any]) -> Event:
    """A checked message (job/nodemsg.py ``checked``) as its event."""
    kind = msg.get("type")
    t = number(msg.get("t"))
    if kind == "hello":
        return Hello(t, pid=integer(msg.get("pid")),
                     supervisor_pid=integer(msg.get("supervisor_pid")),
                     hostname=text(msg.get("hostname")), error=text(msg.get("error")),
                     code=integer(msg.get("code")))
    if kind == "rank_start":
        return RankStart(t, rank=msg["rank"], agent=instant(msg.get("agent_t")))
    if kind == "rank_raised":
        exc = text(msg.get("exc"))
        return RankRaised(t, rank=msg["rank"], exc=exc[:120] if exc else None)
    if kind == "rank_exit":
        return RankExit(t, rank=msg["rank"], code=integer(msg.get("code")),
                        signal=integer(msg.get("signal")),
                        stop_signal=integer(msg.get("stop_signal")),
                        duration=number(msg.get("duration")),
                        evidence=mapping(msg.get("evidence")),
                        script=instant(msg.get("script_t")))
    if kind == "stacks":
        ranks = msg.get("ranks")
        return Stacks(t, id=str(msg.get("id")), ranks=ranks if isinstance(ranks, dict) else {},
                      native=bool(msg.get("native")), pyspy=bool(msg.get("pyspy")),
                      error=text(msg.get("error")))
    if kind == "flight":
        return Flight(t, files=msg["files"])
    if kind == "nccl":
        return Nccl(t, rank=msg["rank"], lines=tuple(msg["lines"]))
    if kind == "stopping":
        return Stopping(t, reason=text(msg.get("reason")))
    if kind == "exit":
        ranks = msg.get("ranks")
        return Exit(t, code=integer(msg.get("code")), signal=integer(msg.get("signal")),
                    stopped=text(msg.get("stopped")),
                    ranks=ranks if isinstance(ranks, dict) else {},
                    container=mapping(msg.get("container")))
    if kind == "hb":
        return Heartbeat(t)
    return Other(t, kind=kind if isinstance(kind, str) else None, fields=dict(msg))


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
    if msg.get("type") == "hello":
        return SamplerHello(integer(msg.get("pid")))
    if msg.get("type") == "sample":
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

