"""samples.jsonl: each node's sampler readings during a run, one JSON line per node per
sample (fields: docs/output-and-archive.md; schema: schemas/top.schema.json $defs/record).

Samples are rare (one per node every ``--sample-interval`` s, 10 by default), so each line
is written and flushed as it comes: on disk at once, like output.jsonl within a second.
A write that fails (a full disk) turns the log off with one note instead of failing the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from launcher.output import render
from launcher.output.rundir import RunDir

SAMPLES = "samples.jsonl"

# what a sample carries that the document passes on unchanged (docs/top.md)
SAMPLE_FIELDS = ("t", "dt", "cpu_pct", "ncpu", "load", "mem_used", "mem_total", "net", "gpus",
                 "gpu_source", "gpu_error", "gpu_age", "ranks", "self_cpu_ms")


def sample_fields(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The documented fields of a sampler's sample (anything else is dropped)."""
    return {k: msg[k] for k in SAMPLE_FIELDS if k in msg}


class SampleLog:
    """Append-only samples.jsonl of one run directory (0600, as the rest of the archive),
    opened through the run directory's held descriptor (output/rundir.py)."""

    def __init__(self, run_dir: RunDir) -> None:
        self.path: Path = run_dir.path / SAMPLES
        self._fh: TextIO | None = open(  # closed by close()
            run_dir.append(SAMPLES), "a", encoding="utf-8")
        self.lines = 0

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        try:
            self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._fh.flush()
            self.lines += 1
        except OSError as exc:
            render.note(f"warning: cannot write {self.path} ({exc.strerror or exc}): "
                        "no more samples are archived for this run")
            self.close()

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError:
                pass
