"""Issue 37: `dtrain run --image` against the same run on the host, and `dtrain image push`
to 16 nodes against one node, on the test cluster's rootless podman (tests/cluster/podman.py).

    python bench/bench_containers.py [--reps 3] [--only run,push] [--mib 500]
                                     [--push-nodes 16] [--push-first 9] [--shared]
                                     [--json F]

* ``run 3x2``: tests/workloads/env_report.py (gloo, 2 ranks per node) on node1-3, ``host``
  (as today) and ``podman`` (``--image localhost/dtrain-test:2`` with /usr and the Python
  mounted read-only), interleaved; the total wall and the time to the first rank's line
  (the first ``REPORT`` line's arrival). Goal: podman <= 1.15x host.
* ``image push``: an image of ``--mib`` MiB of random data (the skeleton rootfs plus one
  file) saved by this machine's podman, pushed to 1 node and to ``--push-nodes`` nodes
  (node<push-first>...); the image is removed from those nodes before every push. Goal:
  16 nodes <= 2x one node. The archive goes over cp's broadcast chain from 3 nodes on.
  ``--shared`` adds the 16 nodes through a directory they all see (``--via``): one copy.

Ratios are reported, never asserted (bench/common.py: medians, quiet-machine waits).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import (  # noqa: E402  (bench/ is on sys.path)
    DTRAIN,
    PYTHON,
    Env,
    Run,
    Series,
    arrival_time,
    bench_parser,
    log,
    machine,
    revision,
    rounds,
    save_json,
    series_json,
    wall_table,
)

from tests.cluster import podman  # noqa: E402

WORKLOAD = "tests/workloads/env_report.py"


def first_line_s(run: Run, marker: bytes = b"REPORT ") -> float:
    data = run.stdout.read_bytes()
    at = data.find(marker)
    return arrival_time(run, at) - run.t_start if at >= 0 else float("nan")


def run_case(env_: Env, args: object) -> Series:
    s = Series("run 3x2 (gloo)")
    podman.ensure_image(env_.cluster, [1, 2, 3])
    base = [DTRAIN, "run", "-H", "node[1-3]", "--nproc-per-node", "2", "--python", PYTHON,
            "--archive-dir", str(env_.tmp / "runs"), "--no-color"]
    ctr = ["--image", podman.TEST_IMAGE, *podman.run_mounts()]

    def one(tool: str, extra: list[str]) -> Run:
        out = env_.tmp / f"run-{tool}-{uuid.uuid4().hex[:6]}"
        run = env_.checked(tool, [*base, *extra, WORKLOAD, "GLOO_SOCKET_IFNAME"], out,
                           pipe=True, timeout=300)
        run.extra["first_line_s"] = first_line_s(run)
        if run.text().count("REPORT ") != 6:
            run.problems.append(f"{run.text().count('REPORT ')} of 6 rank lines")
        return run

    rounds(s, [("host", lambda r: one("host", [])), ("podman", lambda r: one("podman", ctr))],
           args.reps, max_busy=args.max_busy, patience=args.patience)  # type: ignore[attr-defined]
    return s


def make_image(tag: str, mib: int, tmp: Path) -> None:
    """The skeleton rootfs plus MiB of random data, imported into this machine's podman."""
    import io
    import tarfile

    skel = io.BytesIO(podman.skeleton_tar([sys.prefix]))
    with tarfile.open(fileobj=skel) as src, tarfile.open(tmp / "img.tar", "w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        blob = tmp / "blob"
        with open(blob, "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        dst.add(blob, "opt/blob")
        blob.unlink()
    subprocess.run(["podman", "import", "-q", str(tmp / "img.tar"), tag], check=True,
                   capture_output=True)
    (tmp / "img.tar").unlink()


def push_case(env_: Env, args: object, tag: str) -> Series:
    n = args.push_nodes  # type: ignore[attr-defined]
    first = args.push_first  # type: ignore[attr-defined]
    s = Series(f"image push {args.mib} MiB")  # type: ignore[attr-defined]
    cluster = env_.cluster

    def clear(ks: range) -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda k: podman.remove_image(cluster, k, tag), ks))

    shared = cluster.shared_dir / f"bench-images-{uuid.uuid4().hex[:8]}"

    def one(k: int, via: bool = False) -> Run:
        ks = range(first, first + k)
        clear(ks)
        hosts = f"node[{first}-{first + k - 1}]" if k > 1 else f"node{first}"
        out = env_.tmp / f"push-{k}-{uuid.uuid4().hex[:6]}"
        extra = ["--via", str(shared)] if via else []
        run = env_.checked(f"{k} node(s)" + (", shared dir" if via else ""),
                           [DTRAIN, "image", "push", "-H", hosts, tag, "--no-progress",
                            *extra], out, timeout=1800)
        if f"loaded {tag}" not in run.stderr:
            run.problems.append("not loaded: " + run.stderr[-300:])
        # the delivery alone (cp's chain to every node), as dtrain says it
        m = re.search(r"copied to \d+ nodes? in ([0-9.]+) s", run.stderr)
        if m:
            run.extra["copy_s"] = float(m.group(1))
        return run

    cases = [("1 node(s)", lambda r: one(1)), (f"{n} node(s)", lambda r: one(n))]
    if args.shared:  # type: ignore[attr-defined]
        cases.append((f"{n} node(s), shared dir", lambda r: one(n, via=True)))
    try:
        rounds(s, cases, args.reps, warmup=False,
               max_busy=args.max_busy,  # type: ignore[attr-defined]
               patience=args.patience)  # type: ignore[attr-defined]
    finally:
        clear(range(first, first + n))
        if shared.exists():
            shutil.rmtree(shared, ignore_errors=True)
    return s


def main() -> int:
    ap = bench_parser(__doc__, reps=3, only="run,push", first_node=None)
    ap.add_argument("--mib", type=int, default=500, help="size of the pushed image")
    ap.add_argument("--push-nodes", type=int, default=16)
    ap.add_argument("--shared", action="store_true",
                    help="also push to the nodes through a directory they share (--via): "
                    "one copy for all, as with an NFS home")
    ap.add_argument("--push-first", type=int, default=9,
                    help="the push's nodes start here (the suite uses node1-8)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if podman.available():
        raise SystemExit(f"bench: {podman.available()}")
    env_ = Env.setup(args.push_first + args.push_nodes - 1 if "push" in only else 3, 1)
    series = []
    tag = f"localhost/dtrain-bench-push:{uuid.uuid4().hex[:8]}"
    try:
        if "run" in only:
            log("== run 3x2: host vs podman")
            series.append(run_case(env_, args))
        if "push" in only:
            log(f"== image push of {args.mib} MiB: 1 node vs {args.push_nodes}")
            with tempfile.TemporaryDirectory(prefix="dtrain-bench-img-") as tmp:
                make_image(tag, args.mib, Path(tmp))
            series.append(push_case(env_, args, tag))
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)
        env_.cleanup()
    print(f"machine: {machine()}\n{revision()}\n")
    print(wall_table(series, ref="podman" if "run" in only else f"{args.push_nodes} node(s)",
                     others=("host", "1 node(s)")))
    for s in series:
        if s.case.startswith("run"):
            firsts = {t: s.median(t, key=lambda r: r.extra.get("first_line_s", float("nan")))
                      for t in ("host", "podman")}
            print(f"\nfirst rank line (median): host {firsts['host']:.2f} s, podman "
                  f"{firsts['podman']:.2f} s, ratio {firsts['podman'] / firsts['host']:.2f}x")
            print(f"total (median): ratio podman/host "
                  f"{s.median('podman') / s.median('host'):.2f}x (goal <= 1.15x)")
        else:
            n = f"{args.push_nodes} node(s)"
            print(f"\nimage push: {n} / 1 node = {s.median(n) / s.median('1 node(s)'):.2f}x "
                  f"(goal <= 2x)")
            shared_n = f"{n}, shared dir"
            tools = ("1 node(s)", n) + ((shared_n,) if args.shared else ())
            copies = {t: s.median(t, key=lambda r: r.extra.get("copy_s", float("nan")))
                      for t in tools}
            print(f"the copy alone (median, as dtrain reports it): 1 node "
                  f"{copies['1 node(s)']:.1f} s, {n} {copies[n]:.1f} s, ratio "
                  f"{copies[n] / copies['1 node(s)']:.2f}x; the rest is the nodes' loads")
            if args.shared:
                print(f"through a shared directory (--via): {n} "
                      f"{s.median(shared_n) / s.median('1 node(s)'):.2f}x one node, the copy "
                      f"{copies[shared_n]:.1f} s")
        for p in s.problems():
            print("problem:", p)
    save_json(args.json, {"revision": revision(), "series": [series_json(s) for s in series]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
