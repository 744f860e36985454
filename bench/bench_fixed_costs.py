"""Issue 26 in one run: the fixed costs a user pays on every command, each next to the tool
it replaces (or its floor), and one table of ratios against the issue's goals.

    python bench/bench_fixed_costs.py [--reps 7] [--only startup,exec32,exec128,run,cp]
                                      [--out DIR] [--max-busy 0.2] [--patience 60]

It runs the case benchmarks one after the other, each interleaving its tools round by round
in rotated order after a warm-up round (bench/common.py ``rounds``), and reads back their
JSON (every run's numbers, kept in --out):

* ``startup`` (bench_startup.py): ``dtrain --help`` and ``dtrain exec -H localhost -- true``
  next to ``python -c pass``; ``exec`` to one SSH node next to ``pdsh -w node true``,
  ``ssh node true`` and the bare asyncssh loop (with and without dtrain's node program);
* ``exec32`` / ``exec128`` (bench_exec.py --only true): ``exec -- true`` on 32 and on 128
  nodes against pdsh, clush and the asyncssh floors (``-f``/``--fanout`` = node count);
  client CPU per host = the rise of dtrain's client CPU from 32 to 128 nodes / 96, and the
  whole client CPU / 128;
* ``run`` (bench_run_overhead.py): 3 nodes x 2 ranks DDP against the same torchruns started
  by hand over ssh with the NIC names typed in; the launcher's added time before the first
  rank line = dtrain's first rank line - the ssh loop's;
* ``cp`` (bench_cp.py): unchanged re-push of 2,000 files to 4 and to 16 nodes against pdcp
  (and ``dtrain exec true`` on the same nodes: the floor of any dtrain command there);
  256 MiB broadcast to 16 nodes against the same file to one node, uplink at 1 Gbit/s.

The cluster is grown to 128 nodes for ``exec128`` and shrunk back afterwards to what it held
before (at least 64: the test suite's big-cluster size), so other sessions keep their nodes.
Numbers are reported, never asserted. Exit 1 when a case benchmark failed or lost output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import machine, revision, table  # noqa: E402  (bench/ is on sys.path)

CASES = ("startup", "exec32", "exec128", "run", "cp")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_avg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Results:
    """The JSON of every case benchmark, and medians out of it."""

    def __init__(self) -> None:
        self.series: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.revisions: dict[str, str] = {}  # file -> the commit it measured

    def add(self, path: Path) -> None:
        if path.exists():
            data = json.loads(path.read_text())
            self.series.update(data["series"])
            self.revisions[path.stem] = data.get("revision", "?")

    def find(self, case_part: str) -> str | None:
        return next((c for c in self.series if case_part in c), None)

    def med(self, case_part: str, tool: str, key: str = "wall") -> float:
        case = self.find(case_part)
        runs = self.series.get(case or "", {}).get(tool, [])
        values = [r[key] for r in runs if not r["problems"] and r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    def paired(self, case_part: str, a: str, b: str, key: str = "wall") -> float:
        """Median over rounds of a / b within the same round (the two ran a few seconds
        apart, so a drift of the machine's load cancels): the figure to trust on a busy box.
        A run retried after a problem shifts nothing: only rounds where both were good
        count, matched by their order among the good runs."""
        case = self.find(case_part) or ""
        ra = [r[key] for r in self.series.get(case, {}).get(a, []) if not r["problems"]]
        rb = [r[key] for r in self.series.get(case, {}).get(b, []) if not r["problems"]]
        pairs = [x / y for x, y in zip(ra, rb, strict=False) if y]
        return statistics.median(pairs) if pairs else float("nan")


def bench(script: str, args: list[str], out: Path, name: str, extra_env: dict[str, str],
          common: list[str]) -> tuple[int, Path]:
    """Run one case benchmark; its Markdown goes to out/name.md, its runs to out/name.json."""
    js = out / f"{name}.json"
    argv = [sys.executable, str(HERE / script), *args, *common, "--json", str(js)]
    log(f"== {name}: {' '.join(argv[1:])} (load {load_avg()})")
    t0 = time.monotonic()
    with open(out / f"{name}.md", "w") as md, open(out / f"{name}.log", "w") as lg:
        rc = subprocess.run(argv, stdout=md, stderr=lg, cwd=REPO,
                            env={**os.environ, **extra_env}).returncode
    log(f"   {name}: exit {rc} in {time.monotonic() - t0:.0f} s (load {load_avg()})")
    return rc, js


def ratio(a: float, b: float) -> float:
    return a / b if b == b and b else float("nan")


def fmt(x: float, unit: str = "s") -> str:
    if x != x:
        return "-"
    if unit == "x":
        return f"{x:.2f}x"
    if unit == "ms":
        return f"{x * 1000:.1f} ms"
    return f"{x:.3f} s" if x < 10 else f"{x:.2f} s"


def verdict(value: float, goal: float) -> str:
    return "-" if value != value else ("met" if value <= goal else "NOT met")


def summary(res: Results) -> list[list[str]]:
    """case | measured | median (dtrain) | reference | goal | verdict | per-round | floor."""
    rows: list[list[str]] = []
    m = res.med

    def row(case: str, value: float, unit: str, dtrain: float, ref: str, goal: float,
            floor: str, pair: tuple[str, str, str] | None = None) -> None:
        """pair: (case, dtrain's tool, the reference tool) for the per-round ratios."""
        extra = "-"
        if pair:
            extra = (f"{fmt(res.paired(*pair), 'x')} / "
                     f"{fmt(res.paired(*pair, key='client_cpu'), 'x')}")
        rows.append([case, fmt(value, unit), fmt(dtrain), ref,
                     f"<= {fmt(goal, unit) if unit != 'x' else f'{goal}x'}", verdict(value, goal),
                     extra, floor])

    if res.find("dtrain --help"):
        h = m("dtrain --help", "dtrain --help")
        pp = m("dtrain --help", "python -c pass")
        row("dtrain --help", h, "s", h, f"python -c pass {fmt(pp)}", 0.3,
            f"{ratio(h, pp):.2f}x python -c pass; CPU "
            f"{fmt(m('dtrain --help', 'dtrain --help', 'client_cpu'))} vs "
            f"{fmt(m('dtrain --help', 'python -c pass', 'client_cpu'))}")
    if res.find("localhost"):
        w = m("localhost", "dtrain")
        p = m("localhost", "python -c pass")
        row("exec -H localhost -- true (wall)", w, "s", w, f"python -c pass {fmt(p)}", 0.25,
            f"{ratio(w, p):.2f}x python -c pass; CPU {fmt(m('localhost', 'dtrain', 'client_cpu'))}"
            f" vs {fmt(m('localhost', 'python -c pass', 'client_cpu'))}")
    one = res.find("exec -H node")
    if one:
        d, p = m(one, "dtrain"), m(one, "pdsh")
        fl = m(one, "asyncssh loop")
        fs = m(one, "asyncssh+supervisor")
        row(f"{one}: dtrain / pdsh", ratio(d, p), "x", d, f"pdsh {fmt(p)}", 1.0,
            f"asyncssh loop {ratio(fl, p):.2f}x pdsh, +node program {ratio(fs, p):.2f}x; "
            f"dtrain {ratio(d, fs):.2f}x that", (one, "dtrain", "pdsh"))
    for n, goal in ((32, 0.5), (128, 0.4)):
        case = res.find(f"true x {n} nodes")
        if not case:
            continue
        d, p = m(case, "dtrain"), m(case, "pdsh")
        fs = m(case, "asyncssh+supervisor")
        row(f"exec -- true x {n}: dtrain / pdsh", ratio(d, p), "x", d, f"pdsh {fmt(p)}", goal,
            f"asyncssh+node program {ratio(fs, p):.2f}x pdsh; dtrain {ratio(d, fs):.2f}x that",
            (case, "dtrain", "pdsh"))
    c32, c128 = res.find("true x 32 nodes"), res.find("true x 128 nodes")
    if c32 and c128:
        d32, d128 = m(c32, "dtrain", "client_cpu"), m(c128, "dtrain", "client_cpu")
        f32, f128 = (m(c32, "asyncssh loop", "client_cpu"),
                     m(c128, "asyncssh loop", "client_cpu"))
        per = (d128 - d32) / 96
        row("client CPU per host at 128 (marginal, 32 -> 128)", per, "ms", d128,
            f"pdsh {fmt(m(c128, 'pdsh', 'client_cpu') / 128, 'ms')}/host", 0.008,
            f"asyncssh loop {fmt((f128 - f32) / 96, 'ms')}/host; dtrain whole "
            f"{fmt(d128 / 128, 'ms')}/host")
    runc = res.find("ranks")
    if runc:
        d, s = m(runc, "dtrain run"), m(runc, "ssh loop")
        row("run 3x2 DDP: dtrain / hand ssh launch", ratio(d, s), "x", d,
            f"ssh loop {fmt(s)}", 1.05,
            f"pdsh {ratio(m(runc, 'pdsh'), s):.2f}x ssh loop", (runc, "dtrain run", "ssh loop"))
        fd, fs_ = m(runc, "dtrain run", "first_rank_line"), m(runc, "ssh loop", "first_rank_line")
        row("run: added time before the first rank line", fd - fs_, "s", fd,
            f"ssh loop {fmt(fs_)}", 0.3,
            f"pre-flight (start -> archive) {fmt(m(runc, 'dtrain run', 'preflight'))}")
    for n in (4, 16):
        case = res.find(f"unchanged re-push x {n} nodes")
        if not case:
            continue
        d, p = m(case, "dtrain"), m(case, "pdcp")
        e = m(case, "dtrain exec true")
        row(f"cp unchanged re-push 2000 files x {n}: dtrain / pdcp", ratio(d, p), "x", d,
            f"pdcp {fmt(p)}", 0.1,
            f"dtrain exec true there {fmt(e)} = {ratio(e, p):.2f}x pdcp; re-push "
            f"{ratio(d, e):.2f}x exec true", (case, "dtrain", "pdcp"))
    bc = res.find("uplink")
    if bc:
        d, one1 = m(bc, "dtrain"), m(bc, "dtrain 1 node")
        row("cp 256 MiB broadcast x 16 / 1 node", ratio(d, one1), "x", d,
            f"1 node {fmt(one1)}", 1.5,
            f"machine CPU {fmt(m(bc, 'dtrain', 'machine_cpu'))} in {fmt(d)} wall (2 CPUs)",
            (bc, "dtrain", "dtrain 1 node"))
    return rows


def cluster_nodes() -> int:
    from tests import cluster as tc

    c = tc.load(tc.DEFAULT_STATE_DIR)
    return len(c.nodes) if c else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=7, help="rounds of the quick cases")
    p.add_argument("--slow-reps", type=int, default=3,
                   help="rounds of exec128, run and cp")
    p.add_argument("--only", default=",".join(CASES))
    p.add_argument("--out", default=None, help="where each case's Markdown and JSON go")
    p.add_argument("--max-busy", default="0.2")
    p.add_argument("--patience", default="60")
    p.add_argument("--from", dest="from_dir", default=None,
                   help="only print the summary of an earlier --out directory")
    args = p.parse_args()
    only = [c for c in args.only.split(",") if c]
    unknown = set(only) - set(CASES)
    if unknown:
        p.error(f"unknown case(s) {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    out = Path(args.from_dir or args.out or f"/tmp/dtrain-fixed-costs-{os.getpid()}")
    out.mkdir(parents=True, exist_ok=True)
    common = ["--max-busy", args.max_busy, "--patience", args.patience]
    reps, slow = str(args.reps), str(args.slow_reps)
    loads = [f"start {load_avg()}"]
    failed: list[str] = []
    plan: list[tuple[str, str, list[str], dict[str, str]]] = []
    if "startup" in only:
        plan.append(("startup", "bench_startup.py", ["--reps", reps], {}))
    if "exec32" in only:
        plan.append(("exec32", "bench_exec.py", ["--nodes", "32", "--only", "true",
                                                 "--reps", reps], {"BENCH_FANOUT": "32"}))
    if "run" in only:
        plan.append(("run", "bench_run_overhead.py", ["--reps", slow], {}))
    if "cp" in only:
        plan.append(("cp4", "bench_cp.py", ["--nodes", "4", "--only", "delta", "--reps", reps],
                     {}))
        plan.append(("cp16", "bench_cp.py", ["--nodes", "16", "--only", "delta,bcast",
                                             "--bcast-tools", "dtrain 1 node,dtrain",
                                             "--reps", slow], {}))
    if "exec128" in only:
        plan.append(("exec128", "bench_exec.py", ["--nodes", "128", "--only", "true",
                                                  "--reps", slow], {"BENCH_FANOUT": "128"}))
    res = Results()
    if args.from_dir:
        for js in sorted(out.glob("*.json")):
            res.add(js)
    else:
        before = cluster_nodes()
        try:
            for name, script, cargs, env in plan:
                rc, js = bench(script, cargs, out, name, env, common)
                loads.append(f"after {name} {load_avg()}")
                if rc:
                    failed.append(f"{name} (exit {rc}; see {out / name}.md/.log)")
                res.add(js)
        finally:
            if "exec128" in only and before:
                keep = max(before, 64)
                if cluster_nodes() > keep:
                    from tests import cluster as tc

                    log(f"shrinking the cluster back to {keep} nodes")
                    tc.up(keep, shrink=True)

    if args.from_dir:
        print(f"summary of {out}: "
              + "; ".join(f"{k}: {v}" for k, v in sorted(res.revisions.items())) + "\n")
    else:
        print(f"{machine()}\n{revision()}\nload average (1/5/15 min): {'; '.join(loads)}\n")
    print(table(["case", "measured", "dtrain (median)", "reference (median)", "goal",
                 "verdict", "per-round ratio: wall / client CPU",
                 "floor measured in the same run"], summary(res)))
    for md in sorted(out.glob("*.md")):
        print(f"\n### {md.stem}\n")
        print(md.read_text().strip())
    if failed:
        print(f"\nfailed case benchmarks: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
