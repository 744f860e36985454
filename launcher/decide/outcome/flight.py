"""Pure: PyTorch flight recorder dumps of every rank -> which rank is behind.

A dump (``torch._C._distributed_c10d._dump_fr_trace()``, the pickle torch's ``fr_trace``
analyzer reads) holds per process group ``last_enqueued_collective``,
``last_started_collective`` and ``last_completed_collective``, and the last collectives
(``entries``: ``collective_seq_id``, ``profiling_name``, ``state``). In a hang every rank but
the stuck one has enqueued collective N and waits for it; the stuck one is still at N-1.

The pickle is read with an unpickler that refuses every class (``find_class`` raises): a
dump holds dicts, lists, tuples, strings and numbers only, and a file that holds anything
else is not loaded, so nothing a dump contains can run code here.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.text.words import rank_ranges


def flight_names(torch_version: str | None) -> str:
    """Which names of the flight recorder's variables a node's torch reads: "current"
    (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE) from torch 2.9 on, where the old ones
    print a deprecation warning on every rank; "both" before (or unknown): the old names are
    the ones older releases read."""
    try:
        major, minor = (int(p) for p in (torch_version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return "both"
    return "current" if (major, minor) >= (2, 9) else "both"


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def load_dump(data: bytes) -> dict[str, Any] | None:
    """A flight recorder pickle as plain data, or None when it is not one."""
    try:
        # every length the pickle declares is checked against the data first: the unpickler
        # allocates a counted string's declared size before reading it (b"B\0\0\0\4", five
        # bytes, was 64 MiB; BINBYTES8 up to 2**64)
        for _ in pickletools.genops(io.BytesIO(data)):
            pass
        value = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception:  # a truncated file, a class in it, not a pickle
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class RankFlight:
    rank: int
    enqueued: int  # the default group's last enqueued collective (sequence number)
    completed: int
    last_op: str | None  # the profiling name of that collective (gloo:all_reduce)


def rank_flight(rank: int, dump: Mapping[str, Any]) -> RankFlight | None:
    """The default process group's position in a rank's dump."""
    status = dump.get("pg_status")
    if not isinstance(status, dict) or not status:
        return None
    pg = status.get("0", next(iter(status.values())))
    if not isinstance(pg, dict):
        return None
    enq, done = pg.get("last_enqueued_collective"), pg.get("last_completed_collective")
    if not isinstance(enq, int) or not isinstance(done, int):
        return None
    name = None
    entries = dump.get("entries")
    for entry in reversed(entries if isinstance(entries, list) else []):
        if isinstance(entry, dict) and entry.get("collective_seq_id") == enq \
                and str(entry.get("pg_id", 0)) in ("0", ""):
            name = str(entry.get("profiling_name") or "") or None
            break
    return RankFlight(rank, enq, done, name)


@dataclass(frozen=True)
class FlightSummary:
    lines: tuple[str, ...]
    behind: tuple[int, ...]  # ranks that have not enqueued the collective the others wait in


def summarize(ranks: Mapping[int, RankFlight]) -> FlightSummary | None:
    """``ranks 0,2-5 wait in collective #4 (gloo:all_reduce); rank 1 is at #3: it has not
    entered #4`` (None without usable dumps)."""
    if not ranks:
        return None
    front = max(r.enqueued for r in ranks.values())
    ahead = sorted(r.rank for r in ranks.values() if r.enqueued == front)
    behind = sorted(r.rank for r in ranks.values() if r.enqueued < front)
    op = next((r.last_op for r in ranks.values() if r.enqueued == front and r.last_op), None)
    waiting = [r for r in ahead if ranks[r].completed < front]
    what = f"collective #{front}" + (f" ({op})" if op else "")
    lines = []
    if waiting:
        lines.append(f"{_ranks(waiting)} wait{'s' if len(waiting) == 1 else ''} in {what}")
    done = [r for r in ahead if r not in waiting]
    if done:
        lines.append(f"{_ranks(done)} completed {what}")
    for r in behind:
        lines.append(f"rank {r} is at collective #{ranks[r].enqueued}: it has not entered "
                     f"#{front}")
    return FlightSummary(tuple(lines), tuple(behind))


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"
