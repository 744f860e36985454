"""One node's job, seen from the launcher: ship the supervisor, stream frames, heartbeat.

A NodeSession owns one channel. It writes the supervisor and the job spec, then runs three
loops: frames from stdout (output chunks and control messages), raw stderr (anything the
remote shell printed before the supervisor started), and heartbeats both ways. It never
decides policy (who to stop, when): the orchestrator does, through ``stop`` and ``kill``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher import defaults

if TYPE_CHECKING:
    from launcher.decide.runplan.plan import RunRequest
    from launcher.decide.runplan.runoptions import RunOptions
from launcher.decide.outcome.liveness import Silence, launcher_timeout
from launcher.decide.outcome.outcomes import NodeOutcome
from launcher.errors import ConnectError
from launcher.exitcodes import EXIT_NOT_FOUND
from launcher.job import events
from launcher.job.events import Event, Exit, Heartbeat, Hello
from launcher.models import Host
from launcher.nodeside import wire
from launcher.transports.base import Connection, Process

ChunkSink = Callable[[Host, int | None, str, bytes], None]
EventSink = Callable[[Host, Event], None]
READ_SIZE = 1 << 18


@dataclass(frozen=True)
class JobSpec:
    """What the supervisor runs on one node (the env may hold secrets: it goes over stdin)."""

    argv: tuple[str, ...] | None = None
    shell: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    rank_shim: bool = False
    grace: float = defaults.GRACE_S
    heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT_S
    heartbeat_interval: float = defaults.HEARTBEAT_INTERVAL_S
    # name -> text, written beside the rank shim in the supervisor's private directory;
    # "{DTRAIN_DIR}" in argv names that directory (needs rank_shim)
    files: Mapping[str, str] = field(default_factory=dict)
    # PyTorch's flight recorder defaults on the node (decide.outcome.flight.flight_names), None: off
    flight_recorder: str | None = None
    # --image: decide/runplan/container.py's ContainerCommand.wire(), the runtime around the job
    container: Mapping[str, object] | None = None
    # ask NCCL for its INIT/NET lines in per-process files (docs/fabric.md)
    nccl_account: bool = False
    # the warm start: the modules besides torch the node's warm interpreter imports; None:
    # every rank starts cold (nodeside/warm.py, docs/warm-start.md)
    warm: tuple[str, ...] | None = None
    # the node session of a --restarts run (nodeside/nodesession.py): key (the run's id),
    # last (no attempt follows), linger (seconds it waits for the next); None: none
    session: Mapping[str, object] | None = None

    def wire(self) -> dict[str, object]:
        return {
            "v": 1, "argv": list(self.argv) if self.argv is not None else None,
            "shell": self.shell, "env": dict(self.env), "rank_shim": self.rank_shim,
            "grace": self.grace, "heartbeat_timeout": self.heartbeat_timeout,
            "launcher_timeout": launcher_timeout(self.heartbeat_timeout),
            "heartbeat_interval": self.heartbeat_interval,
            **({"files": dict(self.files)} if self.files else {}),
            **({"flight_recorder": self.flight_recorder} if self.flight_recorder else {}),
            **({"container": dict(self.container)} if self.container else {}),
            **({"nccl_account": True} if self.nccl_account else {}),
            **({"warm": {"preload": list(self.warm)}} if self.warm is not None else {}),
            **({"session": dict(self.session)} if self.session else {}),
        }


KEEP_WARM_ENV = "DTRAIN_KEEP_WARM"  # "1": the node session, for now only when asked
SESSION_LINGER_S = 120.0  # how long a node session waits for the next attempt


def node_session(req: RunRequest, opts: RunOptions) -> dict[str, object] | None:
    """The node session that keeps each node's warm process from one attempt of a warm
    --restarts run to the next (nodeside/nodesession.py, docs/warm-start.md); None: none."""
    budget = opts.watch.restart.restarts
    if os.environ.get(KEEP_WARM_ENV) != "1" or opts.preload is None or budget <= 0 \
            or not req.run_id:
        return None
    return {"key": req.run_id, "last": req.attempt > budget, "linger": SESSION_LINGER_S}


class NodeSession:
    """Runs a JobSpec on one node under the dtrain supervisor."""

    def __init__(self, conn: Connection, spec: JobSpec, *, python: str = "python3",
                 workdir: str | None = None, setup: str | None = None,
                 on_chunk: ChunkSink, on_event: EventSink,
                 backpressure: Callable[[], Awaitable[None]] | None = None,
                 adopt: Callable[[], Awaitable[Process | None]] | None = None,
                 ranks: Container[int] | None = None) -> None:
        self.conn = conn
        # the plan's ranks on this node: the only ones its messages may speak for
        # (job/events.py decodes them against it); None: any (exec, where no ranks are planned)
        self.ranks = ranks
        # a process already running the supervisor's interpreter there (the preflight's
        # probe, turned into it: job/probes.py become); None from it: started as usual
        self.adopt = adopt
        # awaited between reads: an output sink that never drops (exec) slows the reads
        # instead, which the SSH window carries back to the node like pdsh's pipes do
        self.backpressure = backpressure
        self._throttled = False
        self.host = conn.host
        self.spec = spec
        self.python = python
        self.workdir = workdir
        self.setup = setup
        self.on_chunk = on_chunk
        self.on_event = on_event
        self.proc: Process | None = None
        self._shipped = False
        self.hello: Hello | None = None
        self.started = asyncio.Event()  # hello received (or start failed)
        self.exit_msg: Exit | None = None
        # the node's silence in the launcher's own running time (decide/outcome/liveness.py)
        self._silence = Silence(spec.heartbeat_timeout, time.monotonic())
        self._lost = False
        self._raw_err: list[bytes] = []
        self._pending: bytes | None = None  # a stop/kill asked for before the job was sent
        self._abandoned: str | None = None
        self._bad: str | None = None  # the node sent what no supervisor sends: its error
        self._give_up = asyncio.Event()

    async def _send(self, data: bytes) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ConnectionError, OSError):
            async with asyncio.timeout(5):
                await self.proc.write(data)

    async def stop(self, reason: str, grace: float | None = None) -> None:
        """Ask the supervisor to TERM the job, then KILL after the grace period."""
        await self._request(wire.control("stop", reason=reason, grace=grace))

    async def kill(self, reason: str) -> None:
        """Ask the supervisor to KILL the job now."""
        await self._request(wire.control("kill", reason=reason))

    async def request_stacks(self, dump_id: str, **options: object) -> None:
        """Ask the supervisor for every rank's stacks (answered by a ``stacks`` message)."""
        await self._request(wire.control("stacks", id=dump_id, **options))

    async def _request(self, line: bytes) -> None:
        if not self._shipped:
            # still starting: the supervisor gets it right after its spec (not lost)
            self._pending = (self._pending or b"") + line
            return
        await self._send(line)

    def abort(self) -> None:
        """Drop the channel: the supervisor sees EOF and tears the job down by itself."""
        if self.proc is not None:
            self.proc.abort()

    def abandon(self, reason: str) -> None:
        """Stop following this node now (it did not start or stop in time): drop the channel
        (its supervisor cleans up on EOF) and make ``run`` return at once."""
        if self._abandoned is None:
            self._abandoned = reason
        self.abort()
        self._give_up.set()

    async def run(self) -> NodeOutcome:
        """Start the job and follow it to the end; never raises for a node-level failure."""
        cmd = wire.remote_command(self.python, workdir=self.workdir, setup=self.setup,
                                  stdlib_only=True)
        try:
            self.proc = await self.adopt() if self.adopt is not None else None
            if self.proc is None:
                self.proc = await self.conn.start(cmd)
            await self._send(wire.supervisor_payload(self.spec.wire()))
        except ConnectError as exc:
            self.started.set()
            return NodeOutcome(self.host, None, error=str(exc.message), ended=time.time())
        self._shipped = True
        if self._pending:
            await self._send(self._pending)
        try:
            async with asyncio.TaskGroup() as tg:
                frames = tg.create_task(self._frames(), name=f"{self.host.label}:frames")
                errs = tg.create_task(self._stderr(), name=f"{self.host.label}:stderr")
                beat = tg.create_task(self._heartbeat(), name=f"{self.host.label}:hb")
                give_up = tg.create_task(self._give_up.wait(), name=f"{self.host.label}:give-up")
                await asyncio.wait([frames, beat, give_up], return_when=asyncio.FIRST_COMPLETED)
                beat.cancel()
                give_up.cancel()
                if self._lost or self._abandoned or self._bad:
                    frames.cancel()
                    errs.cancel()
                else:
                    await asyncio.wait([errs], timeout=1.0)
                    errs.cancel()
        finally:
            self.started.set()
            if self.exit_msg is None:
                self.abort()
        status = None
        if not (self._lost or self._abandoned or self._bad):  # a dropped channel may never report
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    status = await self.proc.wait()
        return self._outcome(status)

    async def _frames(self) -> None:
        assert self.proc is not None
        decoder = wire.FrameDecoder()
        while True:
            data = await self.proc.read_stdout(READ_SIZE)
            if not data:
                return
            self._silence.heard(time.monotonic())
            try:
                frames = decoder.feed(data)
                messages = [self._message(f) if f.kind == wire.KIND_CTL else None
                            for f in frames]
            except wire.FrameError as exc:  # that node's error: drop its channel
                self._bad = f"the node's supervisor stream is not dtrain's: {exc}; refused"
                self.abort()
                return
            for frame, msg in zip(frames, messages, strict=True):
                if frame.kind == wire.KIND_CTL:
                    if msg is not None:
                        self._control(msg)
                elif frame.kind == wire.KIND_NOISE:
                    self.on_chunk(self.host, None, "out", frame.data)  # the shell's banner
                else:
                    stream = "out" if frame.kind == wire.KIND_OUT else "err"
                    # a rank this node does not run: its output is the node's, not that rank's
                    rank = frame.rank if frame.rank >= 0 and (
                        self.ranks is None or frame.rank in self.ranks) else None
                    self.on_chunk(self.host, rank, stream, frame.data)
            if self.backpressure is not None:
                self._throttled = True
                try:
                    await self.backpressure()
                finally:
                    self._throttled = False
                # time spent waiting for our own console is not the node's silence
                self._silence.heard(time.monotonic())

    def _message(self, frame: wire.Frame) -> Event | None:
        """A control frame's event, checked against the plan (None: dropped)."""
        try:
            return events.decode(frame.data, self.ranks)
        except events.BadMessage as exc:  # what no supervisor sends: that node's error
            raise wire.FrameError(str(exc)) from None

    def _control(self, ev: Event) -> None:
        if isinstance(ev, Hello):
            self.hello = ev
            self.started.set()
        elif isinstance(ev, Exit):
            self.exit_msg = ev
        if not isinstance(ev, Heartbeat):
            self.on_event(self.host, ev)

    async def _stderr(self) -> None:
        assert self.proc is not None
        while data := await self.proc.read_stderr(READ_SIZE):
            self._raw_err.append(data)
            if self.hello is not None:  # the supervisor itself crashed: show it
                self.on_chunk(self.host, None, "err", data)

    async def _heartbeat(self) -> None:
        """Send ours; return (node lost) when nothing came from the node for heartbeat_timeout
        of the launcher's own running time (a stall of the launcher is not the node's)."""
        interval = self.spec.heartbeat_interval
        while True:
            await self._send(wire.control("hb"))
            due = time.monotonic() + interval
            await asyncio.sleep(interval)
            now = time.monotonic()
            if self._throttled:
                self._silence.heard(now)  # we are not reading: the node's silence is ours
                continue
            if self._silence.look(now, due, interval):
                self._lost = True
                self.abort()
                return

    def _outcome(self, status: int | None) -> NodeOutcome:
        raw = b"".join(self._raw_err).decode(errors="replace").strip()
        tail = tuple(raw.splitlines()[-5:])
        hello = self.hello
        pids: dict[str, Any] = {
            "supervisor_pid": hello.supervisor_pid if hello else None,
            "pid": hello.pid if hello else None, "started": hello.t if hello else None}
        if self._bad:
            return NodeOutcome(self.host, None, ended=time.time(), error=self._bad, **pids)
        if self._lost:
            return NodeOutcome(self.host, None, lost=True, ended=time.time(), **pids,
                               error=f"no heartbeat for {self.spec.heartbeat_timeout:g} s "
                                     "(node or network down)")
        if self._abandoned and self.exit_msg is None:
            return NodeOutcome(self.host, None, ended=time.time(), abandoned=True, **pids,
                               error=self._abandoned, stderr_tail=tail)
        if hello is not None and hello.error:
            code = hello.code if hello.code is not None else EXIT_NOT_FOUND
            return NodeOutcome(self.host, code, error=hello.error, ended=time.time())
        if self.exit_msg is None:
            if self.hello is None:
                why = tail[-1] if tail else f"remote shell exited with status {status}"
                return NodeOutcome(self.host, None, error=why, stderr_tail=tail,
                                   ended=time.time())
            return NodeOutcome(self.host, None, lost=True, ended=time.time(), **pids,
                               error="connection lost before the job ended")
        ev = self.exit_msg
        return NodeOutcome(self.host, ev.code, signal=ev.signal, stopped=ev.stopped,
                           ranks=ev.ranks, ended=ev.t or time.time(), stderr_tail=tail, **pids)
