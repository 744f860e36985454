"""A run's job from its plan to its verdict: the output pipeline, the live status line, the
archive directory held and locked, meta.json, and one supervised job (``supervise``), which
`run` (once, or once per attempt with --restarts: commands/restarts.py) and `smoke` share.

The package's modules (docs/architecture.md): ``result`` (``Payload``, ``RunResult``),
``pipeline`` (the output pipeline and its folds), ``board`` (the status line, the failure
evidence, the hang watch), ``recorder`` (the archive held, meta.json, --notify: ``RunRecorder``) and
``attempt`` (``Attempt``: one job built and run; ``supervise`` does both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.commands.launch.attempt import STOP_NOTE, Attempt, supervise
from launcher.commands.launch.board import Evidence, NodeBoard, hang_watch
from launcher.commands.launch.pipeline import RunPipeline
from launcher.commands.launch.recorder import (
    RunRecorder,
    ended,
    held_run,
    start_meta,
    title_launcher,
    with_ledger,
)
from launcher.commands.launch.result import NO_PAYLOAD, Payload, RunResult, Word, run_extra
from launcher.decide.runplan.plan import LaunchPlan, RunRequest
from launcher.decide.runplan.runoptions import RunOptions
from launcher.job.prepare import Prepared

if TYPE_CHECKING:
    from launcher.commands.detach import Detacher
    from launcher.output.archive import RunArchive

__all__ = ["NO_PAYLOAD", "STOP_NOTE", "Attempt", "Evidence", "NodeBoard", "Payload",
           "RunPipeline", "RunRecorder", "RunResult", "Word", "ended", "hang_watch", "held_run",
           "launch", "launch_held", "run_extra", "start_meta", "supervise", "title_launcher",
           "with_ledger"]


async def launch(prep: Prepared, plan: LaunchPlan, req: RunRequest, opts: RunOptions, *,
                 detacher: Detacher | None = None, payload: Payload = NO_PAYLOAD,
                 ending: Callable[[RunResult], Word] | None = None) -> RunResult:
    """Start torchrun on every node and follow the job to its verdict (``ending``: called
    with the result once its goodput ledger is made, held_run's)."""
    result, _archive = await launch_held(prep, plan, req, opts, detacher=detacher,
                                         payload=payload, ending=ending)
    return result


async def launch_held(prep: Prepared, plan: LaunchPlan, req: RunRequest, opts: RunOptions, *,
                      detacher: Detacher | None = None, payload: Payload = NO_PAYLOAD,
                      ending: Callable[[RunResult], Word] | None = None
                      ) -> tuple[RunResult, RunArchive]:
    """``launch``, and the run's archive, which still holds the run directory after the
    launch (smoke adds its results to meta.json)."""
    got: list[RunResult] = []

    def end(archive: RunArchive) -> Word:
        return ending(with_ledger(got[0], archive)) if ending is not None and got else None

    with held_run(req, opts, detacher, end) as archive:
        start_meta(archive, req, opts, plan, prep, detacher)
        archive.update_meta(kind=payload.kind)  # what `dtrain ps` shows in KIND
        title_launcher(payload.kind, req.run_id, len(plan.nodes))
        got.append(await supervise(plan, req, opts, prep, archive, detacher, payload))
    return with_ledger(got[0], archive), archive
