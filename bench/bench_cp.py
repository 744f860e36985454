"""`dtrain cp` against `pdcp -R ssh` and `clush --copy/--rcopy` on the cluster.

    python bench/bench_cp.py [--reps 3] [--nodes 16] [--files 2000] [--large-mib 256]
                             [--only tree,delta,large,pull] [--json results.json]

Cases (issue #16):

* ``tree``: a directory of --files small files (1-8 KiB, 40 per directory) pushed to every
  node, into a directory emptied before each run;
* ``delta``: the same push again with nothing changed (dtrain skips by size+mtime; pdcp
  and clush have no delta and send it all again);
* ``large``: one --large-mib file to every node (a naive fan-out: the login node's link
  carries it N times; broadcast mode is not built yet, docs/cp.md);
* ``pull``: the tree back from every node (dtrain cp --pull, rpdcp, clush --rcopy).

After every run each node's copy is checked (file count and bytes; for the large file the
size and the sha256 of its first and last MiB): a run that copied wrongly is a problem,
reported and retried, never timed as a success. Uses node<--first-node>... (the tests cut
links and swap keys on node1-4). pdcp needs pdcp on the nodes: the cluster's nodes see
this machine's /usr/bin. Targets (reported, not asserted): tree <= 0.5 x pdcp, delta
<= 0.1 x pdcp.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    CLUSH,
    DTRAIN,
    FANOUT,
    Env,
    Run,
    Series,
    bench_parser,
    log,
    machine,
    revision,
    rounds,
    run_timed,
    save_json,
    series_json,
    table,
    wall_table,
)

PDCP = shutil.which("pdcp") or "pdcp"
RPDCP = shutil.which("rpdcp") or "rpdcp"
TOOLS = ("dtrain", "pdcp", "clush")
REMOTE_DIR = "bench-cp"  # under each node's home


def make_tree(root: Path, files: int) -> tuple[int, int]:
    """--files small files, 40 per directory; returns (files, bytes)."""
    total = 0
    for i in range(files):
        d = root / f"d{i // 40:03d}"
        d.mkdir(parents=True, exist_ok=True)
        data = os.urandom(1024 + (i * 7919) % 7168)
        (d / f"f{i:05d}.py").write_bytes(data)
        total += len(data)
    return files, total


def make_large(path: Path, mib: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)


def tree_stats(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def ends_sum(path: Path) -> str:
    """sha256 of the first and last MiB (a full hash per node would dominate the run)."""
    with open(path, "rb") as f:
        head = f.read(1 << 20)
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        return hashlib.sha256(head + f.read()).hexdigest()


class CpBench:
    """How each tool pushes/pulls, and the per-node checks."""

    def __init__(self, env: Env, k: int) -> None:
        self.env, self.k = env, k
        self.nodes = env.nodes(k)
        self.user = env.cluster.user

    def reset_remote(self, tool: str) -> None:
        """Empty the tool's own directory on every node (each tool keeps its own copy, so
        the delta case re-pushes onto what the same tool left)."""
        for n in self.nodes:
            st = n.home.stat()
            for d in (n.home / REMOTE_DIR, n.home / REMOTE_DIR / tool):
                if d.name == tool:
                    shutil.rmtree(d, ignore_errors=True)
                d.mkdir(exist_ok=True)
                os.chown(d, st.st_uid, st.st_gid)

    def push(self, tool: str, src: Path, *, recursive: bool) -> list[str]:
        hosts = self.env.hostlist(self.k)
        r = ["-r"] if recursive else []
        dest = f"/home/{self.user}/{REMOTE_DIR}/{tool}"
        if tool == "dtrain":
            return [DTRAIN, "cp", "-H", f"{self.user}@{hosts}", "--fanout", str(FANOUT),
                    "--no-progress", *r, str(src), f"{dest}/"]
        if tool == "pdcp":
            return [PDCP, "-R", "ssh", "-f", str(FANOUT), "-l", self.user, "-w", hosts, *r,
                    str(src), dest]
        return [CLUSH, "-f", str(FANOUT), "-l", self.user, "-o", " ".join(self.env.ssh_opts()),
                "-w", hosts, "--copy", str(src), "--dest", dest]

    def pull(self, tool: str, local: Path) -> list[str]:
        hosts = self.env.hostlist(self.k)
        src = f"/home/{self.user}/{REMOTE_DIR}/dtrain/tree"
        if tool == "dtrain":
            return [DTRAIN, "cp", "--pull", "-H", f"{self.user}@{hosts}", "--fanout",
                    str(FANOUT), "--no-progress", "-r", src, str(local)]
        if tool == "pdcp":
            return [RPDCP, "-R", "ssh", "-f", str(FANOUT), "-l", self.user, "-w", hosts, "-r",
                    src, str(local)]
        return [CLUSH, "-f", str(FANOUT), "-l", self.user, "-o", " ".join(self.env.ssh_opts()),
                "-w", hosts, "--rcopy", src, "--dest", str(local)]

    def check_push(self, tool: str, name: str, want: tuple[int, int] | str) -> list[str]:
        bad = []
        for n in self.nodes:
            got = n.home / REMOTE_DIR / tool / name
            if isinstance(want, str):
                ok = got.is_file() and ends_sum(got) == want
            else:
                ok = got.is_dir() and tree_stats(got) == want
            if not ok:
                bad.append(f"{n.name}: {name} wrong or missing")
        return bad

    def check_pull(self, local: Path, want: tuple[int, int]) -> list[str]:
        # dtrain: LOCAL/<host>/tree; rpdcp: LOCAL/tree.<host>; clush: LOCAL/tree.<host>
        bad = []
        for n in self.nodes:
            cands = [local / n.name / "tree", local / f"tree.{n.name}"]
            if not any(c.is_dir() and tree_stats(c) == want for c in cands):
                bad.append(f"{n.name}: pulled tree wrong or missing")
        return bad


def case(b: CpBench, name: str, reps: int, args: argparse.Namespace,
         fn: Callable[[str, int], Run]) -> Series:
    series = Series(name)
    log(f"{name}: {reps} rounds of {', '.join(TOOLS)}")
    rounds(series, [(t, lambda r, t=t: fn(t, r)) for t in TOOLS], reps,
           max_busy=args.max_busy, patience=args.patience)
    return series


def main() -> int:
    parser = bench_parser(__doc__, reps=3, only="tree,delta,large,pull")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--large-mib", type=int, default=256)
    args = parser.parse_args()
    only = set(args.only.split(","))
    env = Env.setup(args.nodes, first=args.first_node)
    b = CpBench(env, args.nodes)
    cenv = env.env()
    tree = env.tmp / "tree"
    want_tree = make_tree(tree, args.files)
    series: list[Series] = []

    def timed(tool: str, argv: list[str], out: str) -> Run:
        run = run_timed(tool, argv, env=cenv, out=env.tmp / out)
        if run.rc != 0:
            run.problems.append(f"exit {run.rc}: {run.stderr.strip()[-300:]}")
        return run

    def push_tree(tool: str, r: int, *, fresh: bool) -> Run:
        if fresh:
            b.reset_remote(tool)
        run = timed(tool, b.push(tool, tree, recursive=True), f"tree-{tool}-{r}.out")
        run.problems += b.check_push(tool, "tree", want_tree)
        return run

    try:
        if "tree" in only:
            series.append(case(b, f"{args.files} files x {args.nodes} nodes", args.reps, args,
                               lambda t, r: push_tree(t, r, fresh=True)))
        if "delta" in only:
            def delta(tool: str, r: int) -> Run:
                if r == -1:  # the warm-up round seeds each tool's copy
                    push_tree(tool, r, fresh=True)
                return push_tree(tool, r, fresh=False)
            series.append(case(b, f"unchanged re-push x {args.nodes} nodes", args.reps, args,
                               delta))
        if "large" in only:
            big = env.tmp / "large.bin"
            make_large(big, args.large_mib)
            want = ends_sum(big)

            def large(tool: str, r: int) -> Run:
                b.reset_remote(tool)
                run = timed(tool, b.push(tool, big, recursive=False), f"large-{tool}-{r}.out")
                run.problems += b.check_push(tool, "large.bin", want)
                return run
            series.append(case(b, f"{args.large_mib} MiB x {args.nodes} nodes", args.reps,
                               args, large))
        if "pull" in only:
            b.reset_remote("dtrain")
            seed = timed("dtrain", b.push("dtrain", tree, recursive=True), "seed.out")
            if seed.rc != 0:
                raise SystemExit(f"bench: could not seed the pull case: {seed.stderr}")

            def pull(tool: str, r: int) -> Run:
                local = env.tmp / f"pull-{tool}-{r}"
                shutil.rmtree(local, ignore_errors=True)
                local.mkdir()
                run = timed(tool, b.pull(tool, local), f"pull-{tool}-{r}.out")
                run.problems += b.check_pull(local, want_tree)
                shutil.rmtree(local, ignore_errors=True)
                return run
            series.append(case(b, f"pull {args.files} files x {args.nodes} nodes", args.reps,
                               args, pull))
    finally:
        for n in b.nodes:
            shutil.rmtree(n.home / REMOTE_DIR, ignore_errors=True)
        env.cleanup()

    print(f"\n{machine()}\n{revision()}\n")
    print(wall_table(series, others=TOOLS[1:]))
    targets = {"files x": 0.5, "unchanged": 0.1}
    rows = []
    for s in series:
        limit = next((v for k, v in targets.items() if k in s.case), None)
        ratio = s.median("dtrain") / s.median("pdcp")
        rows.append([s.case, f"dtrain/pdcp = {ratio:.2f}", f"<= {limit}" if limit else "-",
                     "-" if limit is None else ("met" if ratio <= limit else "NOT met")])
    print("\ntargets (reported, not asserted):")
    print(table(["case", "measured", "target", "verdict"], rows))
    problems = [p for s in series for p in s.problems()]
    print(f"\nwrong copies / failed runs: {len(problems) or 'none'}")
    for p in problems:
        print(f"  {p}")
    payload: dict[str, Any] = {"machine": machine(), "revision": revision(),
                               "series": {s.case: series_json(s) for s in series}}
    save_json(args.json, payload)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
