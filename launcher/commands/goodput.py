"""The goodput ledger of an archived run: the I/O around ``decide.outcome.goodput``
(docs/goodput.md).

``archive_ledger`` streams a run's output.jsonl (the archive readers' checks: this user's
regular file, each record capped) into the pure ledger; ``record`` stores the ledger in
meta.json's ``goodput`` when a run ends. A ledger that cannot be made (an unreadable
archive) is left out, never a reason for the run to fail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.decide.outcome.goodput import GoodputLedger, ledger_of
from launcher.output.archive import open_output

if TYPE_CHECKING:
    from launcher.output.archive import RunArchive

RECORD_CAP = 4 * 1024 * 1024


def output_records(run_dir: Path) -> Iterator[dict[str, Any]]:
    """output.jsonl's records (a torn or oversized line is skipped)."""
    fd = open_output(run_dir)
    if fd is None:
        return
    decode = json.JSONDecoder().raw_decode
    with os.fdopen(fd, encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            if len(raw) > RECORD_CAP:
                continue
            try:
                rec = decode(raw)[0]
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec


def archive_ledger(run_dir: Path, meta: Mapping[str, Any], now: float | None = None,
                   checkpoint: str | None = None) -> GoodputLedger:
    """The ledger of the run in ``run_dir`` (``now``: the end of a run still going)."""
    return ledger_of(meta, output_records(run_dir), checkpoint, now)


def record(archive: RunArchive) -> dict[str, Any] | None:
    """Compute the finished run's ledger and store it in meta.json's ``goodput``."""
    try:
        archive.flush()
        ledger = archive_ledger(archive.path, archive.meta)
    except (OSError, ValueError):
        return None
    data = ledger.json()
    archive.update_meta(goodput=data)
    return data
