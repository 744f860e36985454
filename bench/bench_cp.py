"""`dtrain cp` against `pdcp -R ssh` and `clush --copy/--rcopy` on the cluster.

    python bench/bench_cp.py [--reps 3] [--nodes 16] [--files 2000] [--large-mib 256]
                             [--only tree,delta,large,pull,bcast] [--json results.json]
                             [--bcast-mib 256] [--uplink 1gbit] [--bcast-tools ...]

Cases (issue #16):

* ``tree``: a directory of --files small files (1-8 KiB, 40 per directory) pushed to every
  node, into a directory emptied before each run;
* ``delta``: the same push again with nothing changed (dtrain skips by size+mtime; pdcp
  and clush have no delta and send it all again), with ``dtrain exec true`` on the same
  nodes beside it: the floor of any dtrain command there (connect, start a node program);
* ``large``: one --large-mib file to every node, on the unlimited bridge (dtrain
  broadcasts it by default: the file is above --broadcast-min);
* ``bcast``: one --bcast-mib file with the login node's uplink limited to --uplink
  (docs/benchmarks.md): dtrain to 1 node, dtrain to --nodes nodes with broadcast (the
  default) and without (--no-broadcast: naive fan-out), pdcp and clush. The limit is an
  HTB class on the bridge device dtbr0 (the login node's own port on the bridge: only
  traffic the login node sends goes through it; node-to-node traffic is switched between
  the veths and is not limited), matched on the benchmark nodes' addresses only, so the
  tests' nodes 1-4 are not slowed. Removed in a finally;
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
import subprocess
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
    provenance,
    ratio_rows,
    revision,
    rounds,
    save_json,
    series_json,
    table,
    wall_table,
)

BRIDGE = "dtbr0"  # tests/cluster: the login node's port on the cluster's bridge
PDCP = shutil.which("pdcp") or "pdcp"
RPDCP = shutil.which("rpdcp") or "rpdcp"
TOOLS = ("dtrain", "pdcp", "clush")
EXEC_FLOOR = "dtrain exec true"  # beside the re-push: its floor (connect, a node program)
BCAST_TOOLS = ("dtrain 1 node", "dtrain", "dtrain naive", "pdcp", "clush")
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


def limit_uplink(ips: list[str], rate: str) -> None:
    """The login node's sends to these nodes share one class of ``rate`` (HTB on dtbr0)."""
    tc = ["tc"]
    unlimit_uplink()
    subprocess.run([*tc, "qdisc", "add", "dev", BRIDGE, "root", "handle", "1:", "htb",
                    "default", "20"], check=True, capture_output=True)
    subprocess.run([*tc, "class", "add", "dev", BRIDGE, "parent", "1:", "classid", "1:10",
                    "htb", "rate", rate, "ceil", rate, "burst", "1mb", "cburst", "1mb"],
                   check=True, capture_output=True)
    subprocess.run([*tc, "class", "add", "dev", BRIDGE, "parent", "1:", "classid", "1:20",
                    "htb", "rate", "100gbit"], check=True, capture_output=True)
    for ip in ips:
        subprocess.run([*tc, "filter", "add", "dev", BRIDGE, "parent", "1:", "protocol", "ip",
                        "prio", "1", "u32", "match", "ip", "dst", f"{ip}/32", "flowid", "1:10"],
                       check=True, capture_output=True)


def unlimit_uplink() -> None:
    """Remove any root qdisc on dtbr0 (back to the bridge's default noqueue)."""
    subprocess.run(["tc", "qdisc", "del", "dev", BRIDGE, "root"], check=False,
                   capture_output=True)


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

    def push(self, tool: str, src: Path, *, recursive: bool, k: int | None = None,
             extra: tuple[str, ...] = ()) -> list[str]:
        hosts = self.env.hostlist(k or self.k)
        r = ["-r"] if recursive else []
        dest = f"/home/{self.user}/{REMOTE_DIR}/{tool}"
        if tool == "dtrain":
            return [DTRAIN, "cp", "-H", f"{self.user}@{hosts}", "--fanout", str(FANOUT),
                    "--no-progress", *extra, *r, str(src), f"{dest}/"]
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

    def check_push(self, tool: str, name: str, want: tuple[int, int] | str,
                   k: int | None = None) -> list[str]:
        bad = []
        for n in self.nodes[:k or self.k]:
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
         fn: Callable[[str, int], Run], tools: tuple[str, ...] = TOOLS) -> Series:
    series = Series(name)
    log(f"{name}: {reps} rounds of {', '.join(tools)}")
    rounds(series, [(t, lambda r, t=t: fn(t, r)) for t in tools], reps,
           max_busy=args.max_busy, patience=args.patience)
    return series


def main() -> int:
    parser = bench_parser(__doc__, reps=3, only="tree,delta,large,pull,bcast")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--large-mib", type=int, default=256)
    parser.add_argument("--bcast-mib", type=int, default=256)
    parser.add_argument("--uplink", default="1gbit", help="the login node's limited rate")
    parser.add_argument("--bcast-tools", default=",".join(BCAST_TOOLS))
    args = parser.parse_args()
    only = set(args.only.split(","))
    env = Env.setup(args.nodes, first=args.first_node)
    b = CpBench(env, args.nodes)
    tree = env.tmp / "tree"
    want_tree = make_tree(tree, args.files)
    series: list[Series] = []

    def timed(tool: str, argv: list[str], out: str) -> Run:
        return env.checked(tool, argv, env.tmp / out)

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
                if tool == EXEC_FLOOR:  # connecting and starting a node program, no copy
                    return timed(tool, env.dtrain_exec(args.nodes, "true"), f"exec-{r}.out")
                if r == -1:  # the warm-up round seeds each tool's copy
                    push_tree(tool, r, fresh=True)
                return push_tree(tool, r, fresh=False)
            series.append(case(b, f"unchanged re-push x {args.nodes} nodes", args.reps, args,
                               delta, (*TOOLS, EXEC_FLOOR)))
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
        if "bcast" in only:
            big = env.tmp / "bcast.bin"
            make_large(big, args.bcast_mib)
            want_b = ends_sum(big)
            tools = [t for t in args.bcast_tools.split(",") if t]

            def bcast(tool: str, r: int) -> Run:
                base = tool.split()[0]  # dtrain / pdcp / clush: its own directory
                k = 1 if tool == "dtrain 1 node" else args.nodes
                extra = ("--no-broadcast",) if tool == "dtrain naive" else ()
                b.reset_remote(base)
                run = timed(tool, b.push(base, big, recursive=False, k=k, extra=extra),
                            f"bcast-{tool.replace(' ', '_')}-{r}.out")
                run.problems += b.check_push(base, "bcast.bin", want_b, k=k)
                return run

            name = f"{args.bcast_mib} MiB x {args.nodes} nodes, uplink {args.uplink}"
            bs = Series(name)
            log(f"{name}: {args.reps} rounds of {', '.join(tools)}")
            limit_uplink([n.ip for n in b.nodes], args.uplink)
            try:
                rounds(bs, [(t, lambda r, t=t: bcast(t, r)) for t in tools], args.reps,
                       max_busy=args.max_busy, patience=args.patience)
            finally:
                unlimit_uplink()
            series.append(bs)
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
        unlimit_uplink()
        for n in b.nodes:
            shutil.rmtree(n.home / REMOTE_DIR, ignore_errors=True)
        env.cleanup()

    print(f"\n{machine()}\n{revision()}\n")
    plain = [s for s in series if "uplink" not in s.case]
    if plain:
        print(wall_table(plain, others=(*TOOLS[1:], EXEC_FLOOR)))
    for s in series:
        if "uplink" in s.case:
            print()
            print(wall_table([s], others=[t for t in BCAST_TOOLS if t != "dtrain"]))
    targets = {"files x": 0.5, "unchanged": 0.1}
    rows = []
    for s in series:
        if "uplink" in s.case:
            one = s.median("dtrain 1 node")
            rows.append([s.case, f"broadcast / 1 node = {s.median('dtrain') / one:.2f}",
                         "<= 1.5", "met" if s.median("dtrain") / one <= 1.5 else "NOT met"])
            rows.append([s.case, f"naive / 1 node = {s.median('dtrain naive') / one:.2f}",
                         "~N (reference)", "-"])
            continue
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
    payload: dict[str, Any] = {**provenance(), "machine": machine(), "revision": revision(),
                               "rows": ratio_rows(series),
                               "series": {s.case: series_json(s) for s in series}}
    save_json(args.json, payload)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
