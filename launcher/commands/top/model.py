"""What `dtrain top` knows at any moment, and the dtrain.top/1 document built from it.

``TopState`` takes the samplers' samples and state changes (job/sampling.py callbacks) and,
for a run, what ``RunWatch`` reads from the archive; ``document()`` is the one snapshot every
view draws (launcher/output/schemas/top.schema.json, docs/schemas.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher import __version__
from launcher.decide.outcome.stragglers import StragglerDetector, StragglerSettings
from launcher.job.events import sample_cpu
from launcher.job.sampling import CONNECTING, OK
from launcher.output.samplelog import sample_fields

if TYPE_CHECKING:
    from launcher.commands.top.runwatch import RunWatch

SCHEMA = "dtrain.top/1"
@dataclass
class NodeView:
    """One node: its sampler's state and last sample."""

    host: str
    state: str = CONNECTING
    error: str | None = None
    since: float = field(default_factory=time.time)
    sample: dict[str, Any] | None = None
    received: float | None = None  # wall time the last sample arrived
    samples: int = 0


class TopState:
    """Every node's latest sample and state, plus the run (when following one)."""

    def __init__(self, hosts: Sequence[str], interval: float, *,
                 run: RunWatch | None = None,
                 settings: StragglerSettings | None = None) -> None:
        self.order = list(hosts)
        self.nodes = {h: NodeView(h) for h in hosts}
        self.interval = interval
        self.run = run
        self.detector = StragglerDetector(settings or StragglerSettings())
        self.changed = 0  # bumped at every sample or state change (the screen redraws)

    def on_sample(self, host: str, msg: dict[str, Any]) -> None:
        node = self.nodes.get(host)
        if node is None:
            return
        node.sample, node.received = sample_fields(msg), time.time()
        node.samples += 1
        if node.state != OK:
            node.state, node.error, node.since = OK, None, time.time()
        found = sample_cpu(msg)  # job/events.py decoded and checked it
        if found is not None:
            self.detector.add(host, *found)
            self.detector.evaluate(time.time())
        self.changed += 1

    def poll_run(self) -> None:
        """Re-read the followed run's archive; its samples feed the straggler evidence."""
        if self.run is None:
            return
        self.run.poll()
        for host, t, cpu in self.run.history():
            self.detector.add(host, t, cpu)
        self.detector.evaluate(time.time())

    def on_state(self, host: str, state: str, why: str | None) -> None:
        node = self.nodes.get(host)
        if node is None:
            return
        if state == OK and node.state == OK:
            return
        node.state, node.error, node.since = state, why, time.time()
        self.changed += 1

    def all_reported(self) -> bool:
        """Every node has sampled once, or is known unreachable/lost (--once may print)."""
        return all(n.samples or n.state not in (CONNECTING, OK) for n in self.nodes.values())

    def document(self, now: float | None = None) -> dict[str, Any]:
        """The dtrain.top/1 snapshot."""
        now = time.time() if now is None else now
        run = self.run.document(now) if self.run is not None else None
        layout: Mapping[str, Sequence[int]] = self.run.layout if self.run is not None else {}
        busy = self.detector.busy()
        flagged = {h for h, s in self.detector.flagged.items() if s.cleared is None}
        stragglers = self.detector.as_json()
        if self.run is not None:  # the run's own flags first; ours only for other nodes
            flagged |= self.run.flagged_hosts()
            theirs = self.run.stragglers()
            hosts = {s.get("host") for s in theirs}
            stragglers = [*theirs, *(s for s in stragglers if s["host"] not in hosts)]
        nodes = []
        for host in self.order:
            n = self.nodes[host]
            ranks = list(layout.get(host, ()))
            entry: dict[str, Any] = {
                "host": host, "state": n.state, "error": n.error,
                "age": round(now - n.received, 2) if n.received is not None else None,
                "sample": n.sample, "ranks": ranks, "straggler": host in flagged}
            if self.run is not None:
                entry["rank_info"] = {
                    str(r): {"age": self.run.line_age(r, now), "busy": _r(busy.get(r)),
                             "state": ((n.sample or {}).get("ranks") or {}).get(str(r), {})
                             .get("state")}
                    for r in ranks}
            nodes.append(entry)
        return {"schema": SCHEMA, "dtrain_version": __version__, "t": round(now, 3),
                "interval": self.interval, "run": run, "nodes": nodes,
                "stragglers": stragglers}


def _r(v: float | None) -> float | None:
    return round(v, 3) if v is not None else None
