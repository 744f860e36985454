"""`dtrain report [RUN] [-o FILE]`: a run's archive as one self-contained HTML page.

Shape (docs/report.md): ``load`` reads the archive (guarded opens, capped reads, streamed
records); the pure summary, the ``--json`` document and the page are in
``launcher.output.runreport``; this module decides where the result goes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.commands.report.load import Loaded, load
from launcher.errors import UsageError
from launcher.output import render
from launcher.output.archive import resolve_run
from launcher.output.runreport import curves, document, page, safe
from launcher.output.runreport.summary import RunSummary

LANES = ("auto", "rank", "node")


@dataclass(frozen=True)
class ReportRequest:
    runs: tuple[str | None, ...]  # one run (None: the latest) or two (--compare)
    archive_dir: Path
    output: str | None = None  # None: ./dtrain-report-<run>.html; "-": stdout
    as_json: bool = False
    metrics: tuple[str, ...] = ()
    lanes: str = "auto"


def default_name(summaries: list[RunSummary]) -> str:
    ids = [s.header.run_id for s in summaries]
    return f"dtrain-report-{ids[0]}.html" if len(ids) == 1 else \
        f"dtrain-compare-{ids[0]}-vs-{ids[1]}.html"


def write_private(path: Path, body: str) -> None:
    """Write through a temp file in the same directory and rename (0600: the page holds
    the run's output, as the archive does)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def report(req: ReportRequest) -> int:
    if req.lanes not in LANES:
        raise UsageError(f"--lanes {req.lanes!r}: use one of {', '.join(LANES)}")
    pats = curves.patterns(list(req.metrics))  # a bad --metric: exit 2 before reading
    dirs = [resolve_run(req.archive_dir, r) for r in req.runs]
    loaded: list[Loaded] = [load(d, pats, lanes=req.lanes) for d in dirs]
    for item in loaded:
        for w in item.warnings:
            render.note(f"report: {w}")
    summaries = [x.summary for x in loaded]
    if req.as_json:
        sys.stdout.write(json.dumps(safe.finite_data(document.document(summaries)), indent=1,
                                    allow_nan=False) + "\n")
        sys.stdout.flush()
        if req.output is None:
            return 0
    html = page.render(summaries, generated=time.time())
    if req.output == "-":
        sys.stdout.write(html)
        sys.stdout.flush()
        return 0
    out = Path(req.output) if req.output else Path(default_name(summaries))
    if out.is_dir():
        out = out / default_name(summaries)
    try:
        write_private(out, html)
    except OSError as exc:
        raise UsageError(f"cannot write the report to {out}: {exc.strerror or exc}",
                         hint="choose another place with -o FILE") from None
    size = len(html.encode())
    render.note(f"report: {out} ({size / 1024:.0f} KiB; one self-contained file, open it "
                "in any browser)")
    return 0
