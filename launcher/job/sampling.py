"""The node sampler's channel, seen from the launcher: start it, read its samples, keep it fed.

One ``NodeSampler`` per node runs ``nodeside/sampler.py`` over a connection (a channel of
its own: for ``dtrain run`` the job's connection, beside the supervisor's channel), reads
its JSON lines and hands each sample to a callback. It writes a heartbeat line every
``hb_timeout / 4`` s; the sampler leaves when they stop (a cut network) or at EOF.

``follow`` (``dtrain top``) keeps one going per node for as long as the view lives: it
connects, and when a node's samples stop (``lost_after``) it says so, and after
``reconnect_after`` it drops the channel and connects again, every ``retry`` s, without
ever stopping the others. ``dtrain run`` uses ``NodeSampler.run`` once per node and never
retries: the job decides what a lost node means.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher import defaults
from launcher.aio import cleanup
from launcher.decide.outcome.liveness import LOST as LIVENESS_LOST
from launcher.decide.outcome.liveness import RECONNECT, Silence, sampler_verdict
from launcher.errors import DtrainError
from launcher.job import events
from launcher.job.orchestrate import connect_one
from launcher.job.remote import start_program
from launcher.models import Host
from launcher.nodeside import wire
from launcher.transports.base import Connection, Process, Transport

SampleSink = Callable[[str, dict[str, Any]], None]
StateSink = Callable[[str, str, str | None], None]  # host, state, why
# node states as the views show them
CONNECTING, OK, LOST, UNREACHABLE = "connecting", "ok", "lost", "unreachable"
# the longest sample line read from a node: a sample is a few KiB (8 GPUs, 64 ranks: under 10 KiB);
# a line past this is not dtrain's sampler (or a broken one), and that node's error
MAX_LINE = 4 << 20


@dataclass(frozen=True)
class SamplerParams:
    """What one node's sampler is asked for (JSON over the channel: data, not shell)."""

    interval: float = 1.0
    first: float | None = None  # the first sample after this many seconds (default interval)
    run_id: str | None = None
    ranks: tuple[int, ...] | None = None
    ifaces: tuple[str, ...] = ()
    hb_timeout: float = 30.0
    gpu: bool = True

    def wire(self) -> dict[str, object]:
        return {"mode": "sample", "v": 1, "interval": self.interval,
                "first": self.first if self.first is not None else self.interval,
                "run_id": self.run_id, "ranks": list(self.ranks) if self.ranks else None,
                "ifaces": list(self.ifaces), "hb_timeout": self.hb_timeout, "gpu": self.gpu}


class NodeSampler:
    """One node's sampler channel."""

    def __init__(self, conn: Connection, params: SamplerParams, on_sample: SampleSink, *,
                 python: str = "python3", max_line: int = MAX_LINE) -> None:
        self.conn = conn
        self.label = conn.host.label
        self.params = params
        self.on_sample = on_sample
        self.python = python
        self.proc: Process | None = None
        self.hello: events.SamplerHello | None = None
        self.last_sample = 0.0  # monotonic time of the last sample (0: none yet)
        self.error: str | None = None
        self.max_line = max_line

    async def run(self) -> str | None:
        """Sample until the channel ends; returns why it ended (None: asked to)."""
        try:
            self.proc = await start_program(self.conn, "sampler", self.params.wire(),
                                            python=self.python)
        except DtrainError as exc:
            self.error = exc.message
            return self.error
        try:
            async with asyncio.TaskGroup() as tg:
                beat = tg.create_task(self._heartbeat(), name=f"{self.label}:sampler-hb")
                why = await self._read()
                beat.cancel()
        finally:
            self.abort()
        self.error = why
        return why

    def abort(self) -> None:
        """Drop the channel (the sampler sees EOF and leaves)."""
        if self.proc is not None:
            self.proc.abort()

    async def set_interval(self, seconds: float) -> None:
        await self._send(wire.control("interval", s=seconds))

    async def stop(self) -> None:
        await self._send(wire.control("stop"))

    async def _send(self, line: bytes) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            async with asyncio.timeout(5):
                await self.proc.write(line)

    async def _heartbeat(self) -> None:
        every = max(0.5, self.params.hb_timeout / 4) if self.params.hb_timeout > 0 else 5.0
        while True:
            await self._send(wire.control("hb"))
            await asyncio.sleep(every)

    async def _read(self) -> str | None:
        """Hand each sample line on; a line over ``max_line`` ends this node's channel (the
        buffer never holds more than that, whatever the node sends)."""
        assert self.proc is not None
        parts: list[bytes] = []  # the line so far (before its newline)
        size = 0
        while True:
            chunk = await self.proc.read_stdout(65536)
            if not chunk:
                return await self._ended()
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                end = len(chunk) if nl < 0 else nl
                size += end - start
                if size > self.max_line:
                    return (f"the sampler sent a line of more than {_mib(self.max_line)} "
                            "(a sample is a few KiB): not dtrain's sampler, or a broken one; "
                            "check the node's python (--python, the hostfile's python=)")
                if nl < 0:
                    if start < len(chunk):
                        parts.append(chunk[start:])
                    break
                parts.append(chunk[start:nl])
                self._line(b"".join(parts))
                parts, size, start = [], 0, nl + 1

    def _line(self, line: bytes) -> None:
        # decoded once (job/events.py): only the ranks the plan put on this node, each with
        # a plausible cpu; a login shell's chatter, or a line nested too deeply: skipped
        ev = events.decode_sample(line, self.params.ranks)
        if isinstance(ev, events.SamplerHello):
            self.hello = ev
        elif isinstance(ev, events.Sample):
            self.last_sample = time.monotonic()
            self.on_sample(self.label, ev.data)

    async def _ended(self) -> str:
        err = b""
        assert self.proc is not None
        with contextlib.suppress(Exception):  # not a cleanup: a read, what came in 1 s is it
            async with asyncio.timeout(1):
                while chunk := await self.proc.read_stderr(65536):
                    err += chunk
        lines = err.decode(errors="replace").strip().splitlines()
        if self.hello is None:
            return lines[-1] if lines else "the sampler ended before it started"
        return lines[-1] if lines else "the sampler's channel closed"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n} bytes"


@dataclass(frozen=True)
class FollowPolicy:
    """How ``follow`` treats silence and failures (seconds)."""

    connect_timeout: float = defaults.CONNECT_TIMEOUT_S
    lost_after: float = 5.0  # no sample this long: the node shows as lost
    reconnect_after: float = 15.0  # ... and this long: drop the channel, connect again
    retry: float = 5.0  # between connection attempts to an unreachable node
    fanout: int = defaults.FANOUT


async def follow(transport: Transport, hosts: Sequence[Host], params: SamplerParams,
                 on_sample: SampleSink, on_state: StateSink, policy: FollowPolicy,
                 python: Mapping[str, str], per_host: Mapping[str, SamplerParams] | None = None
                 ) -> None:
    """Keep a sampler running on every host until cancelled (the view quits)."""
    sem = asyncio.Semaphore(policy.fanout)
    async with asyncio.TaskGroup() as tg:
        for host in hosts:
            p = (per_host or {}).get(host.label, params)
            tg.create_task(_follow_one(transport, host, p, on_sample, on_state, policy,
                                       python.get(host.label, "python3"), sem),
                           name=f"top:{host.label}")


async def _follow_one(transport: Transport, host: Host, params: SamplerParams,
                      on_sample: SampleSink, on_state: StateSink, policy: FollowPolicy,
                      python: str, sem: asyncio.Semaphore) -> None:
    label = host.label
    while True:
        on_state(label, CONNECTING, None)
        try:
            async with sem:
                conn = await connect_one(transport, host, policy.connect_timeout)
        except DtrainError as exc:
            on_state(label, UNREACHABLE, exc.message)
            await asyncio.sleep(policy.retry)
            continue
        except TimeoutError:
            on_state(label, UNREACHABLE,
                     f"timed out connecting after {policy.connect_timeout:g} s")
            await asyncio.sleep(policy.retry)
            continue
        try:
            why = await _watch(conn, params, on_sample, on_state, policy, python)
        finally:
            await cleanup(conn.aclose(), 2)
        on_state(label, LOST, why)
        await asyncio.sleep(policy.retry)


async def _watch(conn: Connection, params: SamplerParams, on_sample: SampleSink,
                 on_state: StateSink, policy: FollowPolicy, python: str) -> str | None:
    """One sampler channel: OK while samples come, LOST when they stop; returns why it
    ended (the channel closed, or silence past ``reconnect_after``)."""
    label = conn.host.label
    shown = [CONNECTING]

    def sample(host: str, msg: dict[str, Any]) -> None:
        if shown[0] != OK:
            shown[0] = OK
            on_state(label, OK, None)
        on_sample(host, msg)

    sampler = NodeSampler(conn, params, sample, python=python)
    # the node's silence in the launcher's own running time (decide/outcome/liveness.py)
    silence = Silence(0.0, time.monotonic())
    interval = min(1.0, policy.lost_after / 2)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(sampler.run(), name=f"{label}:sampler")
        while not task.done():
            due = time.monotonic() + interval
            await asyncio.wait([task], timeout=interval)
            if task.done():
                break
            if sampler.last_sample > silence.heard_at:
                silence.heard(sampler.last_sample)
            # before its first sample the sampler may take connect_timeout to start
            grace = 0.0 if sampler.last_sample else policy.connect_timeout
            now = time.monotonic()
            verdict = sampler_verdict(silence, now, due, interval,
                                      lost_after=policy.lost_after + grace,
                                      reconnect_after=policy.reconnect_after + grace)
            silent = silence.silent(now)
            if verdict == RECONNECT:
                sampler.abort()
                task.cancel()
                return f"no sample for {silent:.0f} s (node or network down)"
            if verdict == LIVENESS_LOST and shown[0] != LOST:
                shown[0] = LOST
                on_state(label, LOST, f"no sample for {silent:.0f} s")
    return task.result()
