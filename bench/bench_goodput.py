"""The goodput ledger (docs/goodput.md) of a synthetic 64-rank, 1-hour archive: its time
(issue #38: "the ledger of a 64-rank x 1 h archive takes <= 2 s").

    python bench/bench_goodput.py [--nodes 8] [--per-node 8] [--seconds 3600] [--reps 5]

The archive is tests/report_archives.py ``synthetic`` (every rank prints ``step=N loss=...``
every second: 230 400 lines). Measured in-process (``commands.goodput.archive_ledger``: the
archive read and the pure ledger), the median wall and CPU time over ``--reps``; reported,
never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from launcher.commands.goodput import archive_ledger  # noqa: E402
from launcher.output.archive import read_meta  # noqa: E402
from tests.report_archives import synthetic  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = synthetic(Path(tmp) / "synthetic", nodes=a.nodes, per_node=a.per_node,
                        seconds=a.seconds)
        lines = sum(1 for _ in open(run / "output.jsonl"))
        meta = read_meta(run)
        wall, cpu = [], []
        for _ in range(a.reps):
            t, c = time.perf_counter(), time.process_time()
            ledger = archive_ledger(run, meta)
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    print(f"archive: {a.nodes * a.per_node} ranks x {a.seconds:g} s, {lines} lines")
    print(f"ledger: median wall {statistics.median(wall):.2f} s, CPU "
          f"{statistics.median(cpu):.2f} s over {a.reps} (budget 2 s); goodput "
          f"{ledger.goodput:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
