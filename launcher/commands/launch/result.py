"""What a run's job takes from its command (``Payload``) and what it returns
(``RunResult``), and dtrain.run/1's ``run`` section of that result."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.decide.outcome.failures import FailureReason
from launcher.decide.outcome.hang import Hang
from launcher.decide.outcome.outcomes import JobOutcome
from launcher.decide.outcome.verdict import TailKeeper, Verdict
from launcher.models import OutputLine
from launcher.runrecord import Attempt, NodeResult, RootCause


@dataclass(frozen=True)
class Payload:
    """What a command adds to a run's job: files shipped in every supervisor's spec (written
    to its private directory), and the output lines it takes out of the console and the
    archive (dtrain smoke's report lines)."""

    files: Mapping[str, str] = field(default_factory=dict)
    take: Callable[[OutputLine], bool] | None = None
    # the job is part of a command with its own verdict (smoke's PASS/FAIL): its summary
    # says how the job ended, never "ok", which the verdict may contradict
    judged: bool = False
    kind: str = "run"  # the command, as `dtrain ps` lists it (run, smoke)


NO_PAYLOAD = Payload()


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a launch returned (torch elastic's vocabulary: the plan is the spec, the Job the
    group of workers, this the run's result): the verdict and its evidence, as plain data
    built by keyword. It holds no live object: the archive stays with the launch
    (``launch_held``), the hang watch with its ``Attempt`` (the restart loop's next attempt
    goes on from it)."""

    verdict: Verdict  # the exit code (``code``), the outcome, the root cause
    outcome: JobOutcome  # how the job ended, node by node (decide/outcome/outcomes.py)
    run_id: str
    world_size: int
    master: str  # ADDR:PORT
    archive_path: Path
    nodes: list[NodeResult]  # meta.json's per-node results
    root_cause: RootCause  # meta.json's
    tails: TailKeeper  # each rank's last stderr lines
    failure: FailureReason | None = None  # why the root-cause rank died
    hangs: list[Hang] = field(default_factory=list)  # dicts only at the output's edge
    progressed: bool = False  # a progress line was seen (--restarts: decide.outcome.restarts)
    fabric: dict[str, Any] | None = None  # NCCL's account (docs/fabric.md), None: none
    # meta.json's torch_versions and nccl_versions as the attempt started: "torch"/"nccl" ->
    # host -> version (None: unknown)
    versions: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)  # meta.json's, --restarts
    goodput: dict[str, Any] | None = None  # meta.json's ledger, once the run is over

    @property
    def code(self) -> int:
        """The run's exit code: the verdict's."""
        return self.verdict.code


def run_extra(result: RunResult | None) -> dict[str, Any]:
    """dtrain.run/1's ``run`` section (None: the run never got a result, e.g. Ctrl-C while
    connecting)."""
    if result is None:
        return {"run_id": None, "world_size": 0, "master": None, "stop_reason": None,
                "hangs": [], "attempts": [], "fabric": None, "goodput": None, "restarts": 0}
    return {"run_id": result.run_id, "world_size": result.world_size,
            "master": result.master, "stop_reason": result.outcome.stop_reason,
            "hangs": [h.json() for h in result.hangs], "attempts": result.attempts,
            "fabric": result.fabric,
            "goodput": result.goodput,
            "restarts": sum(1 for a in result.attempts if a.get("relaunched") is not None)}


# what a run's end hands --notify's ``ended`` besides the verdict: a word and its fields
# (the last failed attempt's fingerprint, docs/incidents.md); None: nothing
Word = tuple[str, Mapping[str, Any]] | None
