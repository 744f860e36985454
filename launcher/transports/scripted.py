"""A scripted node for FakeTransport (issue 54 item 5): the node's real probe answers the
preflight, then, where the probe would turn into the supervisor (its ``become`` op) or a
supervisor's payload arrives, a script plays the supervisor's part on the wire: hello,
each rank's start, its lines and exits at the script's instants, heartbeats, the answers
to ``stop``/``kill``/``stacks``, the job's exit. Nothing is started for the job, so the
stop policy, the hang watch and the restart loop run without root, torchrun or torch.

    FAIL = Script(steps=(Step(0.2, rank=1, exit=3),), hang=True)   # rank 1 exits 3 at 0.2 s
    HANG = Script(hang=True)                                       # no progress, no end
    LOST = Script(lost_at=0.3)                                     # its link goes silent
    OK = Script(steps=(Step(0.1, rank=0, line="done"),))           # every rank exits 0
    FakeTransport(scripts={"n1": [FAIL, OK]})                      # attempt 1, then 2 on

A script's ranks are the node's (``ranks``); a rank no step ends exits 0 after the last
step, unless ``hang``: then it runs until stopped (TERM: EXIT_TERMINATED). ``lost_at``: from then on
the node sends nothing, heartbeats included, and ends only when the launcher drops it.
"""

from __future__ import annotations

import asyncio
import json
import marshal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.exitcodes import EXIT_KILLED, EXIT_TERMINATED, SIGNAL_BASE
from launcher.nodeside import nodemessages as names
from launcher.nodeside.wire import FRAME, KIND_CTL, KIND_OUT, MAGIC, SPEC_MARSHAL
from launcher.transports.base import Process

PROTOCOL = 1  # the supervisor's (nodeside/nodecommon.PROTOCOL)


@dataclass(frozen=True)
class Step:
    """At ``at`` seconds after the job's start: a line on ``rank``'s stdout, or its exit."""

    at: float
    rank: int = 0
    line: str | None = None
    exit: int | None = None


@dataclass(frozen=True)
class Script:
    """One attempt of a scripted node (see the module's docstring)."""

    steps: tuple[Step, ...] = ()
    ranks: tuple[int, ...] = (0, 1)
    hang: bool = False
    lost_at: float | None = None


def script_for(scripts: Script | Sequence[Script], attempt: int) -> Script:
    """The attempt's script (1 the first); the last one for every later attempt."""
    if isinstance(scripts, Script):
        return scripts
    return scripts[min(attempt, len(scripts)) - 1]


class ScriptedProcess(Process):
    """A node program's channel: the real probe until ``become``, then the script."""

    def __init__(self, scripts: Script | Sequence[Script],
                 start_real: Callable[[], Awaitable[Process]]) -> None:
        self._scripts = scripts
        self._start_real = start_real
        self._real: Process | None = None
        self._inbuf = b""  # stdin not yet read: a payload's header and body, control lines
        # "new" (no payload yet), "probe" (the real probe's), "become" (the supervisor's
        # payload is next), "script" (the script plays the supervisor)
        self._state = "new"
        self._out: list[bytes] = []
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()
        self._code: int | None = None
        self._aborted = False
        self._t0 = 0.0
        self._script = Script()
        self._pending: list[Step] = []
        self._running: dict[int, float] = {}  # rank -> its start
        self._reports: dict[str, dict[str, Any]] = {}
        self._stopping: str | None = None
        self._stop_code = 0
        self._next_hb = 0.0
        self._hb = 1.0
        self._eof = False

    # ------------------------------------------------------------------ stdin

    async def write(self, data: bytes) -> None:
        if self._aborted or self._ended.is_set():
            raise ConnectionError("the scripted node's channel is closed")
        if self._state == "probe":
            await self._probe_input(data)
            return
        self._inbuf += data
        if self._state == "script":
            self._controls()
        else:
            await self._payload()

    async def _payload(self) -> None:
        """The first payload: the supervisor's starts the script; another (the probe's)
        starts the real program and goes to it."""
        head, nl, rest = self._inbuf.partition(b"\n")
        if not nl:
            return
        fields = head.split()
        sized = len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit()
        size = int(fields[0]) + int(fields[1]) if sized else 0
        if len(rest) < size:
            return
        body = rest[int(fields[0]):size] if sized else b""
        if body[:1] == SPEC_MARSHAL:
            self._inbuf = rest[size:]
            self._begin(marshal.loads(body[1:]))
            self._controls()
            return
        data, self._inbuf = self._inbuf, b""
        self._state = "probe"
        self._wake.set()
        self._real = await self._start_real()
        await self._real.write(data)

    async def _probe_input(self, data: bytes) -> None:
        """The probe's ops go to it, but ``become``: answered here, and the probe ended."""
        assert self._real is not None
        self._inbuf += data
        while b"\n" in self._inbuf:
            line, self._inbuf = self._inbuf.split(b"\n", 1)
            try:
                op = json.loads(line)
            except ValueError:
                op = None
            if isinstance(op, dict) and op.get("op") == "become":
                self._state = "become"  # the next payload is the supervisor's
                self._out.append(json.dumps({"ok": True}).encode() + b"\n")
                self._wake.set()
                self._real.write_eof()
                rest, self._inbuf = self._inbuf, b""
                if rest:
                    await self.write(rest)
                return
            await self._real.write(line + b"\n")

    def _controls(self) -> None:
        while b"\n" in self._inbuf:
            line, self._inbuf = self._inbuf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and not self._lost():
                self._op(msg)
        self._wake.set()

    def _op(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op in ("stop", "kill") and self._stopping is None and self._running:
            self._stopping = str(msg.get("reason") or op)
            self._stop_code = EXIT_TERMINATED if op == "stop" else EXIT_KILLED
            self._control({"type": names.MSG_STOPPING, "reason": self._stopping})
        elif op == "stacks":
            self._control({"type": names.MSG_STACKS, "id": msg.get("id"), "ranks": {},
                           "error": "a scripted node has no stacks"})

    def write_eof(self) -> None:
        if self._state == "probe":
            assert self._real is not None
            self._real.write_eof()
        elif not self._lost() and self._running:
            self._stopping = self._stopping or "the launcher closed the channel"
            self._stop_code = EXIT_TERMINATED
        self._wake.set()

    # ------------------------------------------------------------------ the script

    def _begin(self, spec: dict[str, Any]) -> None:
        env = spec.get("env") or {}
        attempt = int(env.get("DTRAIN_ATTEMPT") or 1)
        self._script = script_for(self._scripts, attempt)
        self._hb = float(spec.get("heartbeat_interval") or 1.0)
        self._t0 = time.monotonic()
        self._state = "script"
        self._pending = sorted(self._script.steps, key=lambda s: s.at)
        self._out.append(MAGIC)
        self._control({"type": names.MSG_HELLO, "v": PROTOCOL, "pid": 0, "pgid": 0,
                       "supervisor_pid": 0, "hostname": "scripted"})
        for rank in self._script.ranks:
            self._running[rank] = self._t0
            self._control({"type": names.MSG_RANK_START, "rank": rank})

    def _lost(self) -> bool:
        at = self._script.lost_at
        return self._state == "script" and at is not None and time.monotonic() - self._t0 >= at

    def _control(self, msg: dict[str, Any]) -> None:
        data = json.dumps({**msg, "t": time.time()}).encode()
        self._out.append(FRAME.pack(KIND_CTL, -1, len(data)) + data)

    def _rank_exit(self, rank: int, code: int) -> None:
        start = self._running.pop(rank)
        sig = code - SIGNAL_BASE if code > SIGNAL_BASE else None
        report = {"code": code, "signal": sig, "duration": time.monotonic() - start,
                  "pid": 0}
        self._reports[str(rank)] = report
        self._control({"type": names.MSG_RANK_EXIT, "rank": rank, **report})

    def _advance(self) -> None:
        """Everything due by now, into the output."""
        now = time.monotonic()
        if self._state != "script" or self._ended.is_set() or self._lost():
            return
        while self._pending and self._t0 + self._pending[0].at <= now:
            step = self._pending.pop(0)
            if step.rank not in self._running:
                continue
            if step.line is not None:
                data = step.line.encode() + b"\n"
                self._out.append(FRAME.pack(KIND_OUT, step.rank, len(data)) + data)
            if step.exit is not None:
                self._rank_exit(step.rank, step.exit)
        if self._stopping is not None:
            for rank in list(self._running):
                self._rank_exit(rank, self._stop_code)
        elif not self._pending and not self._script.hang:
            for rank in list(self._running):
                self._rank_exit(rank, 0)
        if now >= self._next_hb:
            self._control({"type": names.MSG_HB})
            self._next_hb = now + self._hb
        if not self._running:
            codes = [r["code"] for r in self._reports.values()]
            self._code = max(codes, default=0)
            self._control({"type": names.MSG_EXIT, "code": self._code, "signal": None,
                           "stopped": self._stopping, "ranks": self._reports})
            self._eof = True
            self._ended.set()

    def _due(self) -> float | None:
        """Seconds until the script's next instant (None: nothing is due but input)."""
        if self._state != "script" or self._lost() or self._ended.is_set():
            return None
        times = [self._next_hb]
        if self._pending:
            times.append(self._t0 + self._pending[0].at)
        at = self._script.lost_at
        if at is not None:
            times.append(self._t0 + at)
        return max(0.0, min(times) - time.monotonic())

    # ------------------------------------------------------------------ stdout and the end

    async def read_stdout(self, n: int) -> bytes:
        while True:
            if self._state == "probe" and not self._out:
                assert self._real is not None
                data = await self._real.read_stdout(n)
                if self._state == "probe":
                    return data
                continue  # the probe's end after become: not the channel's
            self._advance()
            if self._out:
                data, self._out = b"".join(self._out), []
                return data
            if self._eof or self._aborted:
                return b""
            self._wake.clear()
            try:
                async with asyncio.timeout(self._due()):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def read_stderr(self, n: int) -> bytes:
        if self._state == "probe":
            assert self._real is not None
            data = await self._real.read_stderr(n)
            if self._state == "probe":
                return data
        await self._ended.wait()
        return b""

    async def wait(self) -> int | None:
        if self._state == "probe":
            assert self._real is not None
            return await self._real.wait()
        await self._ended.wait()
        return None if self._aborted and self._code is None else self._code

    def abort(self) -> None:
        if self._real is not None and self._state == "probe":
            self._real.abort()
        self._aborted = True
        self._eof = True
        self._wake.set()
        self._ended.set()
