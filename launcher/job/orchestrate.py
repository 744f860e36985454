"""Launch -> supervise -> tear down: the one place that owns concurrency and stop policy.

Every node runs under its supervisor in one TaskGroup. This module decides when to stop
the others (first failure, Ctrl-C, SIGTERM, --timeout, a node lost) and how hard (TERM with
a grace period, then KILL); the supervisors carry it out on the nodes. A second Ctrl-C kills
at once. SIGHUP (the terminal closed) stops the job like SIGTERM, unless the policy says a
detached launcher ignores it; `dtrain stop` (``request_stop``) stops it like Ctrl-C. Output
chunks are cut into whole lines per (host, rank, stream) and handed to the output sink as
OutputLine records.

Root cause: failures are recorded in the order the launcher learns of them, until dtrain
starts stopping the job; the first one is the root cause, everything that fails after the
stop began is a follower (stopped by dtrain, or collateral of the root cause). Every stop is
bounded: a node that has not ended ``grace + STOP_MARGIN`` s after the stop (``KILL_MARGIN``
after a kill) is abandoned: its channel is dropped, and its supervisor, seeing stdin EOF,
cleans up by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import signal
import time
from collections.abc import Awaitable, Callable, Container, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from launcher import defaults
from launcher.aio import CLOSE_S, cancel_and_wait, cleanup
from launcher.decide.outcome.outcomes import Failure, JobOutcome, NodeOutcome
from launcher.errors import ConnectError
from launcher.exitcodes import EXIT_UNREACHABLE
from launcher.job.events import Event, Hello, Observer, Observers, RankExit, RankRaised
from launcher.job.limits import ensure_nofile
from launcher.job.node import JobSpec, NodeSession
from launcher.job.stoppable import Signals, signal_name
from launcher.models import Host
from launcher.output.pipeline import OutputPipeline
from launcher.transports.base import Connection, Process, Transport

STOP_MARGIN = 5.0  # beyond the grace period, for the supervisors to report the end
KILL_MARGIN = 5.0


class JobState(enum.Enum):
    """Lifecycle of a job; transitions only move forward."""

    PLANNED = 0
    LAUNCHING = 1
    RUNNING = 2
    TEARING_DOWN = 3
    DONE = 4


@dataclass(frozen=True)
class NodeLaunch:
    """What to start on one node."""

    spec: JobSpec
    python: str = "python3"
    workdir: str | None = None
    setup: str | None = None
    node_rank: int | None = None
    # the supervisor's interpreter already running there (the preflight's probe turned into
    # it, NodeSession.adopt); None from it, or no adopt: started on a new channel
    adopt: Callable[[], Awaitable[Process | None]] | None = None
    ranks: Container[int] | None = None  # the ranks it may speak for (job/nodemsg.py); None: any


@dataclass(frozen=True)
class Policy:
    """Stop policy and bounds for one job."""

    grace: float = defaults.GRACE_S
    timeout: float | None = None  # whole job; exit 124
    start_timeout: float | None = None  # every node's supervisor said hello
    fail_fast: bool = True  # stop every node at the first failure (run); exec lets all finish
    rank_fail_fast: bool = True  # a rank's failure stops the job (not with --max-restarts:
    #                              torchrun restarts the ranks; its own exit is the failure)
    fanout: int = defaults.FANOUT
    fanout_whole_job: bool = False  # exec: bound running commands too, like pdsh
    hangup_stops: bool = True  # SIGHUP stops the job (a detached launcher ignores it)
    # a first failure that looks like a victim (its rank saw a peer go away, or aborted) holds
    # the stop this long: a rank failing of its own meanwhile is the root cause instead
    # (docs/failure-semantics.md, "a victim's failure holds the stop")
    peer_hold: float = 2.0
    # ... and while a rank that said it raised (job/events.py ``RankRaised``) has not ended,
    # up to this long: its exit, however slow its interpreter's end, is the root cause
    raise_hold: float = 20.0


class Output(Protocol):
    """Where a job's output goes: the run pipeline (LineRouter) or exec's byte path."""

    def chunk(self, host: Host, rank: int | None, stream: str, data: bytes) -> None:
        """Raw bytes of one (host, rank, stream) source."""

    def flush(self, host: str) -> None:
        """The host's output is over: emit its unfinished last lines."""

    def say(self, host: str, text: str) -> None:
        """A message of dtrain's own."""


class LineRouter:
    """Routes supervisor chunks into the output pipeline, tracking each host's sources."""

    def __init__(self, out: OutputPipeline, node_ranks: dict[str, int] | None = None) -> None:
        self._out = out
        self._sources: dict[str, set[tuple[int | None, str]]] = {}
        self._node_ranks = node_ranks or {}

    def chunk(self, host: Host, rank: int | None, stream: str, data: bytes) -> None:
        self._sources.setdefault(host.label, set()).add((rank, stream))
        self._out.feed(host.label, rank, stream, data, node_rank=self._node_ranks.get(host.label))

    def flush(self, host: str) -> None:
        """Emit a host's partial last lines (its output is over)."""
        for rank, stream in self._sources.pop(host, ()):
            self._out.eof(host, rank, stream)

    def say(self, host: str, text: str) -> None:
        """A message of dtrain's own, about a host ("dtrain" for the job as a whole)."""
        self._out.message(text, host="" if host == "dtrain" else host)


async def connect_one(transport: Transport, host: Host, timeout: float) -> Connection:
    """Connect with an overall bound (the transport bounds each attempt too)."""
    async with asyncio.timeout(timeout * 2 + 5):
        return await transport.connect(host)


async def connect_all(transport: Transport, hosts: Sequence[Host], *, fanout: int,
                      timeout: float) -> tuple[dict[str, Connection], dict[str, str]]:
    """Connect to every host in parallel (at most ``fanout`` at once).

    The open-files soft limit is raised first to what the whole host list needs
    (``limits.ensure_nofile``): every connection stays open for the job.
    """
    ensure_nofile(len(hosts))
    sem = asyncio.Semaphore(fanout)
    conns: dict[str, Connection] = {}
    errors: dict[str, str] = {}

    async def one(host: Host) -> None:
        async with sem:
            try:
                conns[host.label] = await connect_one(transport, host, timeout)
            except ConnectError as exc:
                errors[host.label] = _one_line(exc)
            except TimeoutError:
                errors[host.label] = f"timed out connecting after {timeout:g} s"

    async with asyncio.TaskGroup() as tg:
        for host in hosts:
            tg.create_task(one(host), name=f"connect:{host.label}")
    order = [h.label for h in hosts]  # messages list hosts in hostfile order, not arrival
    return ({h: conns[h] for h in order if h in conns},
            {h: errors[h] for h in order if h in errors})


def _one_line(exc: ConnectError) -> str:
    return f"{exc.message} ({exc.hint})" if exc.hint else exc.message


class Job:
    """One job across nodes: start every node's session, apply the stop policy."""

    def __init__(self, hosts: Sequence[Host], launches: dict[str, NodeLaunch],
                 policy: Policy, router: Output,
                 on_state: Callable[[JobState], None] | None = None,
                 victim: Callable[[Failure], bool] | None = None) -> None:
        self.hosts = list(hosts)
        self.victim = victim  # does this rank failure look like a peer's victim?
        self._hold: asyncio.Task[None] | None = None
        # (host, rank): every rank that said it raised, and every rank that ended
        self._raised: set[tuple[str, int]] = set()
        self._ended: set[tuple[str, int]] = set()
        self.on_state = on_state
        self.launches = launches
        self.policy = policy
        self.router = router
        # who listens to the nodes' events (job/events.py), in the order they registered
        self.observers = Observers()
        self.state = JobState.PLANNED
        self.outcome = JobOutcome()
        self.sessions: dict[str, NodeSession] = {}
        self._stopping = False
        self._interrupts = 0
        self._repeat_said = False
        self._bound: asyncio.Task[None] | None = None
        self._bounds: list[asyncio.Task[None]] = []  # replaced/ended ones, awaited by run()
        self._bound_s = 0.0
        self._tg: asyncio.TaskGroup | None = None
        self._pending_stop: tuple[str, float | None, bool] | None = None

    def observe(self, observer: Observer) -> None:
        """Register an observer of the nodes' events (called after the job's own rules)."""
        self.observers.add(observer)

    def _advance(self, state: JobState) -> None:
        if state.value < self.state.value:
            raise RuntimeError(f"job state cannot go from {self.state.name} to {state.name}")
        changed = state is not self.state
        self.state = state
        if changed and self.on_state is not None:
            self.on_state(state)

    # -- stop policy ------------------------------------------------------------------------
    async def stop_all(self, reason: str, *, kill: bool = False,
                       grace: float | None = None) -> None:
        """Ask every running node to stop (TERM + grace, or KILL); bounded (see module doc)."""
        grace = self.policy.grace if grace is None else grace
        if self.state.value < JobState.TEARING_DOWN.value:
            self._advance(JobState.TEARING_DOWN)
        if self.outcome.stop_reason is None:
            self.outcome.stop_reason = reason
            self.outcome.stop_t = time.time()
        self._stopping = True
        bound = KILL_MARGIN if kill else grace + STOP_MARGIN
        if self._bound is None or bound < self._bound_s:
            if self._bound is not None:
                self._bound.cancel()
                self._bounds.append(self._bound)  # awaited at the end of run()
            self._bound_s = bound
            self._bound = asyncio.get_running_loop().create_task(self._stop_bound(bound),
                                                                 name="stop-bound")
        async with asyncio.TaskGroup() as tg:
            for label, session in self.sessions.items():
                if label not in self.outcome.nodes:
                    coro = session.kill(reason) if kill else session.stop(reason, grace)
                    tg.create_task(coro, name=f"stop:{label}")

    async def _stop_bound(self, seconds: float) -> None:
        """Cut off every node still running ``seconds`` after the stop."""
        await asyncio.sleep(seconds)
        late = [label for label in self.sessions if label not in self.outcome.nodes]
        self.outcome.abandoned = tuple(sorted(set(self.outcome.abandoned) | set(late)))
        for label in late:
            self.router.say(label, f"did not stop within {seconds:g} s of the stop: dropping "
                                   "the connection (its supervisor kills the job on EOF)")
            self.sessions[label].abandon(f"did not stop within {seconds:g} s")

    def _stopping_now(self, reason: str, tg: asyncio.TaskGroup,
                      grace: float | None = None) -> None:
        """Start stopping every node (synchronously marks the job as stopping)."""
        if self.outcome.stop_t is None:
            self.outcome.stop_t = time.time()
        self._stopping = True
        tg.create_task(self.stop_all(reason, grace=grace), name="stop-all")

    def request_stop(self, who: str, *, grace: float | None = None, kill: bool = False) -> None:
        """A stop asked from outside (`dtrain stop`): the same as Ctrl-C (exit 130), with
        another grace period or an immediate KILL if asked."""
        tg = self._tg
        if tg is None:
            self._pending_stop = (who, grace, kill)  # applied as soon as the job runs
            return
        if self.state is JobState.DONE:
            return
        self._interrupts += 1
        if self.outcome.interrupted is None:
            self.outcome.interrupted = signal.SIGINT
            self.outcome.interrupted_t = time.time()
            self.outcome.stopped_by = who
        try:
            if kill:
                self.outcome.killed = True
                self.router.say("dtrain", f"stop requested by {who}: killing every node now")
                tg.create_task(self.stop_all(f"stop requested by {who}", kill=True),
                               name="kill-all")
            else:
                g = self.policy.grace if grace is None else grace
                self.router.say("dtrain", f"stop requested by {who}: stopping every node "
                                          f"(TERM, KILL after {g:g} s)")
                self._stopping_now(f"stop requested by {who}", tg, grace)
        except RuntimeError:
            pass  # the task group is finishing: the job is ending anyway

    def declare_failure(self, failure: Failure) -> None:
        """A failure found outside the nodes' own reports (a hang, by the hang watch): the
        root cause if it is the first, and the job is stopped as for any failure."""
        if self._tg is not None and self.state is not JobState.DONE:
            with contextlib.suppress(RuntimeError):  # the task group is finishing
                self._failed(failure, self._tg)

    def _signal(self, signum: int) -> None:
        """A stop signal (job/stoppable.Signals, installed once the task group runs)."""
        if self._tg is not None:
            self._interrupt(signum, self._tg)

    def _interrupt(self, signum: int, tg: asyncio.TaskGroup) -> None:
        """Ctrl-C, SIGTERM, SIGHUP: the first starts a graceful stop. Only a Ctrl-C once a
        stop is under way escalates to KILL: a closing terminal delivers several SIGHUPs
        (and maybe a SIGTERM), and an init system repeats SIGTERM; those are the same
        request, and must not cut the ranks' checkpoints short."""
        self._interrupts += 1
        first = self.outcome.interrupted is None
        if self.outcome.interrupted is None:
            self.outcome.interrupted = signum
            self.outcome.interrupted_t = time.time()
        name = signal_name(signum)
        if first:
            why = " (the terminal closed)" if signum == signal.SIGHUP else ""
            again = "again " if signum == signal.SIGINT else ""
            self.router.say("dtrain", f"{name}{why}: stopping every node "
                                      f"(Ctrl-C {again}to kill now)")
            self._stopping_now(f"{name} from the user", tg)
        elif signum == signal.SIGINT and not self.outcome.killed:
            self.outcome.killed = True
            self.router.say("dtrain", f"{name} again: killing every node now")
            tg.create_task(self.stop_all(f"{name} from the user", kill=True), name="kill-all")
        elif not self._repeat_said and signum != signal.SIGINT:
            self._repeat_said = True
            self.router.say("dtrain", f"{name}: already stopping (the grace period holds; "
                                      "Ctrl-C to kill now)")

    def _failed(self, failure: Failure, tg: asyncio.TaskGroup) -> None:
        """Record a failure; the first one before any stop is the root cause. A first failure
        that looks like a victim (``self.victim``) holds the stop for ``policy.peer_hold``
        seconds: a rank failing of its own meanwhile becomes the root cause."""
        if self._stopping:
            return  # a follower: the job is being stopped already
        if self._hold is not None and (failure.own_stop or failure.led or failure.kind == "rank"
                                       and not self._is_victim(failure)):
            # the culprit, a few milliseconds behind its victim: the root cause after all (a
            # node whose supervisor stopped the job by itself, a signal from outside; a node
            # whose torchrun ended first, SIGKILLed or SIGTERMed, its ranks stopped by it)
            self.outcome.failures.insert(0, failure)
            self.outcome.first_failure = failure.host
            self._hold.cancel()
            self._hold = None
            self._stopping_now(_why(failure), tg)
            return
        self.outcome.failures.append(failure)
        if self.outcome.first_failure is None:
            self.outcome.first_failure = failure.host
        if self.policy.fail_fast and any(label not in self.outcome.nodes
                                         for label in self.sessions):
            if self._hold is not None and failure.kind != "lost":
                return  # a victim's failure holds the stop: this one follows it
            if self._hold is None and len(self.outcome.failures) == 1 \
                    and failure.kind == "rank" and self.policy.peer_hold > 0 \
                    and self._is_victim(failure):
                self._hold = tg.create_task(self._hold_stop(_why(failure), tg), name="hold")
                return
            if self._hold is not None:
                self._hold.cancel()
                self._hold = None
            self._stopping_now(_why(failure), tg)

    def _is_victim(self, failure: Failure) -> bool:
        if self.victim is None:
            return False
        if failure.rank is not None and (failure.host, failure.rank) in self._raised:
            # it raised of its own: a SIGABRT after that is gloo's abort as its interpreter
            # ended (torch-facts), not a peer's doing; only its own words (a peer went away)
            # make it a victim
            failure = replace(failure, signal=None)
        return self.victim(failure)

    async def _hold_stop(self, why: str, tg: asyncio.TaskGroup) -> None:
        await asyncio.sleep(self.policy.peer_hold)
        # a rank that raised is on its way out (a loaded machine's interpreter can take
        # seconds to end after its connections closed): its exit ends the hold in _failed
        waited = 0.0
        while self._raised - self._ended and waited < self.policy.raise_hold:
            await asyncio.sleep(0.05)
            waited += 0.05
        self._hold = None
        if not self._stopping and self.state is not JobState.DONE:
            self._stopping_now(why, tg)

    def _node_done(self, label: str, outcome: NodeOutcome, tg: asyncio.TaskGroup) -> None:
        self.outcome.nodes[label] = outcome
        self.router.flush(label)
        now = time.time()
        if outcome.lost:
            self._failed(Failure("lost", label, code=EXIT_UNREACHABLE, t=now, seen=now,
                                 error=outcome.error), tg)
        elif outcome.exit_code not in (0, None) or outcome.error:
            # stopped though dtrain asked no one to stop: by itself (its supervisor got a
            # signal, or gave up on the launcher)
            own = outcome.stopped if outcome.stopped and not self._stopping else None
            led = not self._stopping and bool(outcome.ranks) and all(
                r.stop_signal is not None or r.code == 0 for r in outcome.ranks.values())
            self._failed(Failure("node", label, code=outcome.exit_code, signal=outcome.signal,
                                 t=now, seen=now, error=outcome.error, own_stop=own, led=led),
                         tg)

    def _event(self, host: Host, ev: Event, tg: asyncio.TaskGroup) -> None:
        """A node's event: the job's own rules first (a rank that fails is the first failure,
        before its agent even notices; every node said hello: running), then the
        observers, in the order they registered."""
        # a rank that was asked to stop (its shim forwarded a stop from dtrain or torchrun)
        # and then exited is a follower whatever its code, never a root-cause candidate
        if isinstance(ev, RankRaised):
            self._raised.add((host.label, ev.rank))
        if isinstance(ev, RankExit):
            self._ended.add((host.label, ev.end.rank))
        if isinstance(ev, RankExit) and ev.end.failed and ev.end.stop_signal is None \
                and self.policy.rank_fail_fast:
            now, end = time.time(), ev.end
            self._failed(Failure("rank", host.label, rank=end.rank, code=end.code,
                                 signal=end.signal, t=now if ev.t is None else ev.t, seen=now),
                         tg)
        if isinstance(ev, Hello) and self.state is JobState.LAUNCHING and all(
                label in self.sessions and self.sessions[label].hello is not None
                for label in (h.label for h in self.hosts)):
            self._advance(JobState.RUNNING)  # every node's job has started
        self.observers.event(host, ev)

    # -- run --------------------------------------------------------------------------------
    async def run(self, transport: Transport, conns: dict[str, Connection] | None = None,
                  ) -> JobOutcome:
        """Connect (unless given connections), run every node, return the outcome."""
        if conns is None:  # given connections were opened by connect_all, which raised it
            ensure_nofile(len(self.hosts))
        self._advance(JobState.LAUNCHING)
        conns = dict(conns or {})
        sem = asyncio.Semaphore(self.policy.fanout)
        signals = Signals(self._signal, hangup=self.policy.hangup_stops)
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                signals.install()
                if self._pending_stop is not None:
                    who, grace, kill = self._pending_stop
                    self.request_stop(who, grace=grace, kill=kill)
                nodes = [tg.create_task(self._node(h, transport, conns, sem, tg),
                                        name=f"node:{h.label}") for h in self.hosts]
                deadlines = tg.create_task(self._deadlines(nodes, tg), name="deadlines")
                await asyncio.wait(nodes)
                deadlines.cancel()
                if self._hold is not None:  # every node ended on its own meanwhile
                    self._hold.cancel()
                    self._hold = None
        finally:
            if self._bound is not None:
                self._bound.cancel()
                self._bounds.append(self._bound)
            if self._bounds:  # every task started is awaited, even through a cancel
                bounds, self._bounds = self._bounds, []
                await cancel_and_wait(*bounds)
            signals.remove()
            for conn in conns.values():
                await cleanup(conn.aclose(), CLOSE_S)
        self.outcome.ended = time.time()
        self._advance(JobState.DONE)
        return self.outcome

    async def _node(self, host: Host, transport: Transport, conns: dict[str, Connection],
                    sem: asyncio.Semaphore, tg: asyncio.TaskGroup) -> None:
        label = host.label
        bound = sem if self.policy.fanout_whole_job else contextlib.nullcontext()
        async with bound:
            conn = conns.get(label)
            if conn is None:
                async with sem if not self.policy.fanout_whole_job else contextlib.nullcontext():
                    try:
                        conn = conns[label] = await connect_one(transport, host, 30)
                    except (ConnectError, TimeoutError) as exc:
                        why = _one_line(exc) if isinstance(exc, ConnectError) else "timed out"
                        # said once, by the command's summary (with the hostfile line)
                        self.outcome.connect_errors[label] = why
                        short = exc.message if isinstance(exc, ConnectError) else why
                        self._node_done(label, NodeOutcome(host, None, error=short), tg)
                        return
            if self._stopping:
                return  # never started: the job was stopped while we connected
            launch = self.launches[label]
            session = NodeSession(conn, launch.spec, python=launch.python,
                                  workdir=launch.workdir, setup=launch.setup,
                                  on_chunk=self.router.chunk,
                                  on_event=lambda h, ev: self._event(h, ev, tg),
                                  backpressure=getattr(self.router, "backpressure", None),
                                  adopt=launch.adopt, ranks=launch.ranks)
            self.sessions[label] = session
            outcome = await session.run()
            if outcome.error and not outcome.lost and outcome.exit_code is None:
                self.router.say(label, outcome.error)
            elif outcome.lost:
                self.router.say(label, f"node lost: {outcome.error}")
            self._node_done(label, outcome, tg)
            await cleanup(conn.aclose(), CLOSE_S)

    async def _deadlines(self, nodes: list[asyncio.Task[None]], tg: asyncio.TaskGroup) -> None:
        """--start-timeout and --timeout (cancelled when every node task is done)."""
        start = time.monotonic()
        if self.policy.start_timeout:
            def all_started() -> bool:
                return self._stopping or all(
                    h.label in self.outcome.nodes or (h.label in self.sessions and
                                                      self.sessions[h.label].started.is_set())
                    for h in self.hosts)

            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.policy.start_timeout):
                    while not all_started():
                        await asyncio.sleep(0.05)
            late = [h.label for h in self.hosts if h.label not in self.outcome.nodes
                    and (h.label not in self.sessions
                         or not self.sessions[h.label].started.is_set())]
            if late and not self._stopping:
                self.outcome.start_timed_out = tuple(late)
                now = time.time()
                for label in late:
                    why = f"did not start within {self.policy.start_timeout:g} s"
                    self.router.say(label, why)
                    self.outcome.failures.append(Failure("start", label, t=now, seen=now,
                                                         error=why))
                    if label in self.sessions:
                        self.sessions[label].abandon(why)
                if self.outcome.first_failure is None:
                    self.outcome.first_failure = late[0]
                await self.stop_all("start timeout")
        if self.policy.timeout:
            remaining = self.policy.timeout - (time.monotonic() - start)
            done, _ = await asyncio.wait(nodes, timeout=max(0.0, remaining))
            if len(done) < len(nodes) and not self._stopping:
                self.outcome.timed_out = True
                self.router.say("dtrain", f"--timeout {self.policy.timeout:g} s reached: "
                                          "stopping every node")
                await self.stop_all("timeout")


def _why(failure: Failure) -> str:
    """The stop's reason for a failure."""
    if failure.kind == "rank":
        return f"{failure.host} rank {failure.rank} exited {failure.code}"
    if failure.kind == "lost":
        return f"{failure.host} lost"
    if failure.kind == "hang":
        return failure.error or "hang"
    return f"{failure.host} failed ({failure.error or f'exit {failure.code}'})"
