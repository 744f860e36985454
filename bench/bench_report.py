"""`dtrain report` on a synthetic 64-rank, 1-hour archive: the page's size and the time to
make it (issue #30: "state the size for a 64-rank, 1-hour run").

    python bench/bench_report.py [--nodes 8] [--per-node 8] [--seconds 3600] [--every 1]
                                 [--reps 3] [--phased] [--browser N]
                                 [--json results.json]

The archive (tests/report_archives.py ``synthetic``): every rank prints ``step=N loss=...
lr=... tokens_per_s=...`` every ``--every`` seconds, one utilisation sample per node every
10 s with 8 GPUs, one straggler. Reported, never asserted: the archive's size, the page's
size (and gzip'd, as it would be attached to a ticket), the ``--json`` size, and the median
wall and CPU time of `dtrain report` (a fresh process each time; on a shared box the CPU
time is the number to compare).
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.report_archives import synthetic  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--phased", action="store_true",
                    help="each node samples at its own instant (as real samplers do), not "
                         "all at once")
    ap.add_argument("--browser", type=int, default=0, metavar="N",
                    help="open the page N times in headless Chromium (tests/browser.py): "
                         "the time from navigation to the page drawn (its own clock)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = synthetic(Path(tmp) / "synthetic", nodes=a.nodes, per_node=a.per_node,
                        seconds=a.seconds, every=a.every, phased=a.phased)
        archive = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
        lines = sum(1 for _ in open(run / "output.jsonl"))
        out = Path(tmp) / "report.html"
        times, cpu = [], []
        for _ in range(a.reps):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "launcher", "report", str(run), "-o",
                            str(out)], cwd=REPO, check=True, capture_output=True)
            times.append(time.perf_counter() - t)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        page = out.read_bytes()
        doc = subprocess.run([sys.executable, "-m", "launcher", "report", str(run), "--json"],
                             cwd=REPO, check=True, capture_output=True).stdout
        drawn = []
        for _ in range(a.browser):
            from tests.browser import open_page

            got = open_page(out, evaluate={
                "ms": "Number(document.documentElement.dataset.readyMs)"}, timeout=120)
            if not got.ready or got.errors:
                raise SystemExit(f"the page did not draw cleanly: {got.errors[:3]}")
            drawn.append(float(got.values["ms"]) / 1000)
    result = {
        "ranks": a.nodes * a.per_node, "nodes": a.nodes, "phased": a.phased,
        "seconds": a.seconds, "lines": lines,
        "archive_bytes": archive, "page_bytes": len(page),
        "page_gzip_bytes": len(gzip.compress(page)), "json_bytes": len(doc),
        "report_s_median": round(statistics.median(times), 2),
        "report_s_all": [round(x, 2) for x in times],
        "report_cpu_s_median": round(statistics.median(cpu), 2),
    }
    if drawn:
        result["browser_drawn_s_median"] = round(statistics.median(drawn), 2)
        result["browser_drawn_s_all"] = [round(x, 2) for x in drawn]
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
