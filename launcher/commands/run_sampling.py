"""The samples of every run: the node sampler beside the supervisor, samples.jsonl, and the
straggler flag (one console line, meta.json ``stragglers``).

``RunSampling.run`` starts one sampler per node on the job's own connections (a channel of
its own, beside the supervisor's), every ``--sample-interval`` s (default 10; 0 = off).
Each sample becomes a samples.jsonl line and feeds the straggler detector
(decide/outcome/stragglers.py); a newly flagged node is said once on the console and recorded in
meta.json. Watching must never endanger the run: a sampler that cannot start, or whose
channel ends, only stops that node's samples; nothing here raises into the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from launcher import defaults
from launcher.decide.outcome.liveness import launcher_timeout
from launcher.decide.outcome.stragglers import StragglerDetector, StragglerSettings
from launcher.job.events import Exit, Observer, sample_cpu
from launcher.job.sampling import NodeSampler, SamplerParams
from launcher.output import render
from launcher.output.samplelog import SAMPLES, SampleLog, sample_fields
from launcher.runrecord import RunMeta

if TYPE_CHECKING:
    from launcher.decide.runplan.plan import LaunchPlan
    from launcher.models import Host
    from launcher.output.archive import RunArchive
    from launcher.transports.base import Connection

DEFAULT_SAMPLE_INTERVAL = 10.0
T = TypeVar("T")


def node_ifaces(plan: LaunchPlan) -> dict[str, str]:
    """Each node's socket interface, as the plan exports it (GLOO_SOCKET_IFNAME)."""
    out = {}
    for node in plan.nodes:
        env = {v.name: v.value for v in node.env}
        value = (env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME") or "")
        value = value.lstrip("=").split(",")[0].strip()
        if value and not value.startswith("^"):
            out[node.host.label] = value
    return out


class RunSampling(Observer):
    """One run's samplers, sample log and straggler detector; an observer of the job
    (job/events.py) for the nodes' ends."""

    def __init__(self, archive: RunArchive, plan: LaunchPlan, interval: float,
                 settings: StragglerSettings, say: Callable[[str], None], *,
                 heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT_S,
                 attempt: int | None = None) -> None:
        self.archive = archive
        self.plan = plan
        self.interval = interval
        self.settings = settings
        self.say = say
        self.detector = StragglerDetector(settings, attempt=attempt)
        # a later attempt (--restarts): the flags of the earlier ones stay in meta.json
        earlier = archive.meta.get("stragglers") if attempt is not None and attempt > 1 else None
        self.earlier: list[Any] = [s for s in earlier if isinstance(s, dict)] \
            if isinstance(earlier, list) else []
        self.log: SampleLog | None = None
        self.node_ranks = {n.host.label: n.node_rank for n in plan.nodes}
        ifaces = node_ifaces(plan)
        self.params = {
            n.host.label: SamplerParams(
                interval=interval, first=interval, run_id=archive.run_id,
                ranks=tuple(n.ranks), ifaces=(ifaces[n.host.label],)
                if n.host.label in ifaces else (),
                hb_timeout=max(launcher_timeout(heartbeat_timeout), interval * 3))
            for n in plan.nodes}
        # --image: the sampler runs on the host, with its python3 (docs/containers.md)
        self.pythons = {n.host.label: "python3" if n.container else n.python
                        for n in plan.nodes}
        self.errors: dict[str, str] = {}
        self.ended: set[str] = set()

    def meta(self) -> RunMeta:
        """What meta.json records about sampling (docs/output-and-archive.md)."""
        s = self.settings
        return {"samples": {"interval": self.interval, "file": SAMPLES,
                            "errors": dict(self.errors)},
                "straggler_settings": {"window": s.window, "hold": s.hold, "ratio": s.ratio,
                                       "min_gap": s.min_gap},
                "stragglers": self.stragglers()}

    def stragglers(self) -> list[Any]:
        """meta.json ``stragglers``: the earlier attempts' flags, then this one's."""
        return [*self.earlier, *self.detector.as_json()]

    async def run(self, conns: Mapping[str, Connection]) -> None:
        """Sample every node until cancelled (the job is over); never raises."""
        try:
            self.log = SampleLog(self.archive.dir)
        except OSError as exc:
            render.note(f"warning: no samples for this run: cannot create "
                        f"{self.archive.path / SAMPLES} ({exc.strerror or exc})")
            return
        try:
            async with asyncio.TaskGroup() as tg:
                for label, conn in conns.items():
                    if label in self.params:
                        tg.create_task(self._node(conn), name=f"samples:{label}")
        finally:
            self.log.close()

    async def _node(self, conn: Connection) -> None:
        label = conn.host.label
        sampler = NodeSampler(conn, self.params[label], self.on_sample,
                              python=self.pythons.get(label, "python3"))
        try:
            why = await sampler.run()
        except Exception as exc:  # watching must never end the run
            why = f"{type(exc).__name__}: {exc}"
        if why and label not in self.ended:  # after the node's job: its channel closes
            self.errors[label] = why

    def on_exit(self, host: Host, ev: Exit) -> None:
        """After a node's exit its connection closes, and with it the sampler's channel;
        that is the end, not a problem."""
        self.ended.add(host.label)

    def problems(self) -> list[str]:
        """One line per distinct reason a node's sampler ended early (hosts folded)."""
        from launcher.hosts.hostfile import fold

        by_why: dict[str, list[str]] = {}
        for host, why in self.errors.items():
            by_why.setdefault(why, []).append(host)
        return [f"no samples from {fold(hosts)}: {why}" for why, hosts in by_why.items()]

    def on_sample(self, host: str, msg: dict[str, Any]) -> None:
        record = {"t": msg.get("t"), "host": host, "node_rank": self.node_ranks.get(host),
                  **{k: v for k, v in sample_fields(msg).items() if k != "t"}}
        if self.log is not None:
            self.log.write(record)
        found = sample_cpu(msg)
        if found is None:
            return
        self.detector.add(host, *found)
        flagged = self.detector.evaluate(time.time())
        for flag in flagged:
            self.say(flag.line())
        if flagged or any(f.cleared is not None for f in self.detector.flagged.values()):
            self._record()

    def _record(self) -> None:
        stragglers = self.stragglers()
        if stragglers != self.archive.meta.get("stragglers"):
            with contextlib.suppress(OSError):
                self.archive.update_meta(stragglers=stragglers)


async def alongside(job: Awaitable[T], sampling: RunSampling | None,
                    conns: Mapping[str, Connection]) -> T:
    """Await the job with the run's samplers beside it; they stop when it ends."""
    if sampling is None:
        return await job
    async with asyncio.TaskGroup() as tg:
        watch = tg.create_task(sampling.run(conns), name="samples")
        try:
            return await job
        finally:
            watch.cancel()
