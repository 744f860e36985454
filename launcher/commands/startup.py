"""The start-up split's instants (docs/goodput.md, "Where start-up goes"), collected as an
observer of one attempt's job and stored in meta.json's ``startup[]`` at its end.

Per node: its supervisor's ``hello``, the first ``rank_start`` (and the ``agent_t`` it
carries: torchrun's agent imported torch), and the first hand-over to the user's script
(``script_t`` of the ranks' exit reports). Each is the node's clock; the probe's clock
offset (job/probes.py, doctor's ``clock`` rule) takes it to the launcher's. The split
itself is pure (decide/outcome/startup.py), made by the goodput ledger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from launcher.decide.outcome.startup import to_launcher
from launcher.job.events import Hello, Observer, RankExit, RankStart
from launcher.models import Host
from launcher.runrecord import Startup, StartupNode


def _first(have: float | None, t: float | None) -> float | None:
    return t if have is None else have if t is None else min(have, t)


class StartupClock(Observer):
    """One attempt's node instants (node clocks, as reported)."""

    def __init__(self, labels: Sequence[str], clock: Mapping[str, tuple[float, float]]
                 ) -> None:
        self.labels = list(labels)
        self.clock = dict(clock)
        self.seen: dict[str, dict[str, float | None]] = {
            h: dict.fromkeys(("supervisor", "agent", "rank_start", "script")) for h in labels}

    def _node(self, host: Host) -> dict[str, float | None] | None:
        return self.seen.get(host.label)

    def on_hello(self, host: Host, ev: Hello) -> None:
        node = self._node(host)
        if node is not None and ev.error is None and node["supervisor"] is None:
            node["supervisor"] = ev.t

    def on_rank_start(self, host: Host, ev: RankStart) -> None:
        node = self._node(host)
        if node is not None:
            node["rank_start"] = _first(node["rank_start"], ev.t)
            node["agent"] = _first(node["agent"], ev.agent)

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        node = self._node(host)
        if node is not None:
            node["script"] = _first(node["script"], ev.end.script)

    def record(self, attempt: int) -> Startup:
        """meta.json ``startup[]``'s entry of this attempt."""
        nodes: list[StartupNode] = []
        for h in self.labels:
            seen = self.seen[h]
            offset, slack = self.clock.get(h, (None, None))
            nodes.append({"host": h,
                          "supervisor": to_launcher(seen["supervisor"], offset),
                          "agent": to_launcher(seen["agent"], offset),
                          "rank_start": to_launcher(seen["rank_start"], offset),
                          "script": to_launcher(seen["script"], offset),
                          "clock_offset": None if offset is None else round(offset, 6),
                          "clock_slack": None if slack is None else round(slack, 6)})
        return {"attempt": attempt, "nodes": nodes}

    def meta(self, earlier: object, attempt: int) -> list[Startup]:
        """``startup[]`` with this attempt's entry (replacing one of the same attempt)."""
        kept: list[Any] = [s for s in earlier if isinstance(s, dict)
                           and s.get("attempt") != attempt] if isinstance(earlier, list) else []
        return [*kept, self.record(attempt)]
