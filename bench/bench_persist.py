"""Issue 41: warm connections (`--persist`, the connection keeper) against pdsh and against
pdsh over OpenSSH's ControlPersist, the fairest peer, in one interleaved run.

    python bench/bench_persist.py [--reps 7] [--nodes 1,32] [--first-node 5] [--hops]
                                  [--client-python PY] [--json F]

Per node count, four tools run ``true`` on every node (rounds rotated, medians; bench/common):

* ``dtrain warm``: ``dtrain exec --persist 10m`` whose keeper already holds the connections
  (the warm-up round makes them), started warm by the keeper's resident (docs/connections.md);
* ``dtrain warm, no agent``: the same with ``DTRAIN_NODE_AGENT=0``: each node program on a
  channel of its own (sshd's session, a shell, a fresh interpreter), not forked by the node
  agent;
* ``dtrain warm, no resident``: the same with ``DTRAIN_RESIDENT=0``: this process imports the
  CLI itself, only the connections (and the node agents) are warm;
* ``dtrain warm, site python`` (only with ``--client-python``): ``dtrain warm`` run by the
  bench's own interpreter (this tree on its PYTHONPATH), with a keeper and resident of its
  own, so both installations are measured in the same rounds;
* ``dtrain cold``: ``dtrain exec`` as without the keeper (one handshake per node, and no
  resident: ``DTRAIN_RESIDENT=0``, a user who never turned ``--persist`` on);
* ``pdsh``: ``pdsh -R ssh`` (one ssh per node);
* ``pdsh ControlPersist``: the same, every ssh through an OpenSSH master kept 10 minutes.

With ``--hops``, ``dtrain warm`` runs with ``DTRAIN_HOPS=1`` (docs/connections.md, "Where a
warm command's time goes"): each run's spans are kept in the JSON (``hops``) and their
medians, with the fastest and slowest run's, are printed per node count.

With ``--client-python PY`` (a venv's ``bin/python`` with this tree installed, ``pip install
-e``), every dtrain command runs as that installation's user would run it: its console
script ``dtrain`` beside PY, without the PYTHONPATH the bench otherwise sets, and its
``site`` (that venv's .pth files, not this box's). The bench refuses a PY whose ``launcher``
is not this tree's. Either way the JSON's ``client`` says which interpreter and script ran,
and the medians of 15 ``PY -c pass`` and ``PY -S -c pass`` (its ``site``'s cost).

Ratios (reported, never asserted) against the issue's goals: warm exec to 1 node <= 0.7x
pdsh, to 32 nodes <= 0.15x, to 128 <= 0.1x. Also printed: the keeper's resident memory
after the largest count (goal: <= 150 MB at 128 connections).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import (  # noqa: E402  (bench/ is on sys.path)
    Env,
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
    wall_table,
)

SITE = "dtrain warm, site python"  # with --client-python: the bench's own interpreter's dtrain
TOOLS = ("dtrain warm", SITE, "dtrain warm, no agent", "dtrain warm, no resident", "dtrain cold",
         "pdsh", "pdsh ControlPersist")
REMOTE_DIR = "bench-persist"
PDCP = shutil.which("pdcp") or "pdcp"


def make_tree(root: Path, files: int) -> None:
    for i in range(files):
        d = root / f"d{i // 40:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.py").write_bytes(os.urandom(1024 + (i * 7919) % 7168))


def keeper_rss_mb(env: dict[str, str], which: str = "pid", *, python: str = sys.executable,
                  ) -> tuple[int | None, float | None]:
    """The keeper's (``pid``) or its resident's (``resident``) pid and resident memory."""
    res = subprocess.run([python, "-m", "launcher", "connections", "--json"], env=env,
                         capture_output=True, text=True)
    doc = json.loads(res.stdout)
    pid = (doc.get("keeper") or {}).get(which)
    if not pid:
        return None, None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return pid, int(line.split()[1]) / 1024
    return pid, None


def client_of(python: str | None) -> tuple[str, str]:
    """(the interpreter, its console script ``dtrain``) the dtrain commands run with."""
    from common import DTRAIN

    if not python:
        return sys.executable, DTRAIN
    script = Path(python).parent / "dtrain"
    if not (script.is_file() and os.access(script, os.X_OK)):
        raise SystemExit(f"bench: --client-python {python}: no console script {script} "
                         f"beside it (pip install -e {HERE.parent} into that environment)")
    res = subprocess.run([python, "-c", "import launcher; print(launcher.__file__)"],
                         capture_output=True, text=True, cwd="/")
    where = Path(res.stdout.strip()).resolve().parent.parent if res.returncode == 0 else None
    if where != HERE.parent:
        raise SystemExit(f"bench: --client-python {python} imports launcher from "
                         f"{res.stdout.strip() or res.stderr.strip()[-200:]}, not this tree "
                         f"({HERE.parent}): pip install -e {HERE.parent} there")
    return python, str(script)


def start_cost(python: str, reps: int = 15) -> dict[str, float]:
    """Medians (ms) of ``PY -c pass`` and ``PY -S -c pass``: the interpreter's start with
    and without its ``site`` (the .pth files of its site-packages)."""
    out = {}
    for name, flags in (("python -c pass", []), ("python -S -c pass", ["-S"])):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            subprocess.run([python, *flags, "-c", "pass"], check=True, cwd="/")
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = round(statistics.median(times), 1)
    return out


def main() -> int:
    ap = bench_parser(__doc__, reps=7, only="", first_node=5)
    ap.add_argument("--nodes", default="1,32", help="node counts, comma-separated")
    ap.add_argument("--cp-nodes", type=int, default=4,
                    help="nodes of the unchanged re-push case (0: leave it out)")
    ap.add_argument("--files", type=int, default=2000, help="files in the re-pushed tree")
    ap.add_argument("--hops", action="store_true",
                    help="time dtrain warm's hops too (DTRAIN_HOPS=1; text/hops.py)")
    ap.add_argument("--client-python", default="",
                    help="run the client dtrain of the installation of this interpreter "
                         "(a venv's bin/python; its console script, no PYTHONPATH)")
    args = ap.parse_args()
    client_py, client_bin = client_of(args.client_python)
    counts = [int(x) for x in args.nodes.split(",")]
    env_ = Env.setup(max([*counts, args.cp_nodes]), args.first_node, ciphers=args.ssh_ciphers)
    runtime = Path(tempfile.mkdtemp(prefix="dtrain-bench-run-"))
    os.chmod(runtime, 0o700)
    runtime_site = Path(tempfile.mkdtemp(prefix="dtrain-bench-run-site-"))
    os.chmod(runtime_site, 0o700)
    control = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))
    series_list = []
    memory = {}
    memory_resident = {}
    try:
        base = env_.env(XDG_RUNTIME_DIR=str(runtime))
        if args.client_python:  # as its user runs it: the venv's own sys.path only
            base = {**base, "PYTHONPATH": os.pathsep.join(
                p for p in base["PYTHONPATH"].split(os.pathsep) if Path(p) != HERE.parent)}
            if not base["PYTHONPATH"]:
                del base["PYTHONPATH"]
        # with --client-python, this box's own dtrain too, with its own keeper and resident
        site = env_.env(XDG_RUNTIME_DIR=str(runtime_site))
        plain = {**base, "DTRAIN_RESIDENT": "0"}
        no_agent = {**base, "DTRAIN_NODE_AGENT": "0"}
        cp_env = dict(base)
        cp_env["PDSH_SSH_ARGS_APPEND"] = base["PDSH_SSH_ARGS_APPEND"] + (
            f" -o ControlMaster=auto -o ControlPath={control}/%C -o ControlPersist=10m")
        for k in counts:
            s = Series(f"exec true x{k}")
            out = env_.tmp / f"out{k}"

            def exec_argv(k: int = k) -> list[str]:
                return [client_bin, *env_.dtrain_exec(k, "true")[1:]]

            def warm(r: int, k: int = k, out: Path = out) -> object:
                argv = exec_argv(k)
                argv.insert(argv.index("--"), "--persist")
                argv.insert(argv.index("--"), "10m")
                if not args.hops:
                    return _checked(env_, "dtrain warm", argv, out, base)
                run = _checked(env_, "dtrain warm", argv, out, {**base, "DTRAIN_HOPS": "1"})
                run.extra["hops"] = hop_spans(run.stderr)  # type: ignore[attr-defined]
                return run

            def warm_no_agent(r: int, k: int = k, out: Path = out) -> object:
                argv = exec_argv(k)
                argv.insert(argv.index("--"), "--persist")
                argv.insert(argv.index("--"), "10m")
                return _checked(env_, "dtrain warm, no agent", argv, out, no_agent)

            def warm_plain(r: int, k: int = k, out: Path = out) -> object:
                argv = exec_argv(k)
                argv.insert(argv.index("--"), "--persist")
                argv.insert(argv.index("--"), "10m")
                return _checked(env_, "dtrain warm, no resident", argv, out, plain)

            def cold(r: int, k: int = k, out: Path = out) -> object:
                return _checked(env_, "dtrain cold", exec_argv(k), out, plain)

            def pdsh(r: int, k: int = k, out: Path = out) -> object:
                return _checked(env_, "pdsh", env_.pdsh(k, "true"), out, base)

            def pdsh_cp(r: int, k: int = k, out: Path = out) -> object:
                return _checked(env_, "pdsh ControlPersist", env_.pdsh(k, "true"), out, cp_env)

            def warm_site(r: int, k: int = k, out: Path = out) -> object:
                argv = [*env_.dtrain_exec(k, "true")]
                argv.insert(argv.index("--"), "--persist")
                argv.insert(argv.index("--"), "10m")
                hops = {"DTRAIN_HOPS": "1"} if args.hops else {}
                run = _checked(env_, SITE, argv, out, {**site, **hops})
                if args.hops:
                    run.extra["hops"] = hop_spans(run.stderr)  # type: ignore[attr-defined]
                return run

            log(f"== exec true on {k} node(s)")
            also = [(SITE, warm_site)] if args.client_python else []
            rounds(s, [("dtrain warm", warm), *also, ("dtrain warm, no agent", warm_no_agent),
                       ("dtrain warm, no resident", warm_plain),
                       ("dtrain cold", cold), ("pdsh", pdsh),
                       ("pdsh ControlPersist", pdsh_cp)], args.reps,
                   max_busy=args.max_busy, patience=args.patience)
            series_list.append(s)
            memory[k] = keeper_rss_mb(base, python=client_py)
            memory_resident[k] = keeper_rss_mb(base, "resident", python=client_py)
        if args.cp_nodes:
            series_list.append(cp_case(env_, args, base, cp_env, client_py))
    finally:
        subprocess.run([client_py, "-m", "launcher", "connections", "close"],
                       env=env_.env(XDG_RUNTIME_DIR=str(runtime)), capture_output=True)
        subprocess.run([sys.executable, "-m", "launcher", "connections", "close"],
                       env=env_.env(XDG_RUNTIME_DIR=str(runtime_site)), capture_output=True)
        shutil.rmtree(runtime_site, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
        for sock in control.glob("*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                           capture_output=True)
        shutil.rmtree(control, ignore_errors=True)
        env_.cleanup()
    starts = start_cost(client_py)
    client = {"python": client_py, "dtrain": client_bin, "venv": bool(args.client_python),
              "start_ms": starts}
    if args.client_python:  # this box's own interpreter, for the site python column
        client["site_python"] = sys.executable
        client["site_start_ms"] = start_cost(sys.executable)
    print(f"machine: {machine()}\n{revision()}\nclient: {client_bin} ({client_py}: "
          + ", ".join(f"{n} {v:.1f} ms" for n, v in starts.items()) + ", medians of 15)\n")
    print(wall_table(series_list, ref="dtrain warm",
                     others=("pdsh", "pdsh ControlPersist", SITE, "pdcp", "pdcp ControlPersist",
                             "dtrain cold", "dtrain warm, no agent",
                             "dtrain warm, no resident")))
    print()
    for k, (pid, rss) in memory.items():
        print(f"keeper (pid {pid}) resident memory after {k} node(s): "
              f"{'-' if rss is None else f'{rss:.1f} MB'}")
    for k, (pid, rss) in memory_resident.items():
        print(f"resident (pid {pid}) memory after {k} node(s): "
              f"{'-' if rss is None else f'{rss:.1f} MB'}")
    hops: dict[str, dict[str, dict[str, float]]] = {}
    if args.hops:
        print()
        for s, tool in [(s, t) for s in series_list for t in ("dtrain warm", SITE)]:
            runs = [r for r in s.runs.get(tool, []) if r.extra.get("hops")]
            if runs:
                print(f"{s.case}: {tool}'s hops (ms), median [min, max] of {len(runs)}")
                key = s.case if tool == "dtrain warm" else f"{s.case}, {tool}"
                hops[key] = {}
                names = [n for r in runs for n in r.extra["hops"]]
                for name in sorted(set(names), key=names.index):
                    # a run the resident did not serve (retired: the code changed) has no
                    # "sent"/"forked": each hop over the runs that passed it
                    v = [r.extra["hops"][name] for r in runs if name in r.extra["hops"]]
                    hops[key][name] = {"median ms": round(statistics.median(v), 1),
                                          "min ms": min(v), "max ms": max(v), "runs": len(v)}
                    print(f"  {name:<28} {statistics.median(v):7.1f} "
                          f"[{min(v):.1f}, {max(v):.1f}] of {len(v)}")
    save_json(args.json, {**provenance(), "bench": "persist", "machine": machine(),
                          "revision": revision(), "client": client,
                          "rows": rows(series_list), "hops": hops,
                          "memory_mb": {str(k): v[1] for k, v in memory.items()},
                          "resident_memory_mb": {str(k): v[1] for k, v in
                                                 memory_resident.items()},
                          "series": {s.case: series_json(s) for s in series_list}})
    return 1 if any(s.problems() for s in series_list) else 0


def cp_case(env_: Env, args: object, base: dict[str, str], cp_env: dict[str, str],
            client_py: str = sys.executable) -> Series:
    """The same tree pushed again, nothing changed: dtrain skips by size and mtime, pdcp
    copies it whole (it has no delta), as bench/bench_cp.py's ``delta`` case."""
    k = args.cp_nodes  # type: ignore[attr-defined]
    src = env_.tmp / "tree"
    make_tree(src, args.files)  # type: ignore[attr-defined]
    hosts = env_.hostlist(k)
    user = env_.cluster.user
    for n in env_.nodes(k):
        st = n.home.stat()
        for tool in ("dtrain-warm", "dtrain-warm-na", "dtrain-cold", "pdcp", "pdcp-cp"):
            d = n.home / REMOTE_DIR / tool
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            for x in (n.home / REMOTE_DIR, d):
                os.chown(x, st.st_uid, st.st_gid)
    dest = f"/home/{user}/{REMOTE_DIR}"

    def dtrain_cp(tool: str, persist: bool) -> list[str]:
        extra = ["--persist", "10m"] if persist else []
        return [client_py, "-m", "launcher", "cp", "-H", f"{user}@{hosts}", "--fanout",
                "64", "--no-progress", *extra, "-r", str(src), f"{dest}/{tool}/"]

    def pdcp(tool: str) -> list[str]:
        return [PDCP, "-R", "ssh", "-f", "64", "-l", user, "-w", hosts, "-r", str(src),
                f"{dest}/{tool}"]

    out = env_.tmp / "cp-out"
    s = Series(f"cp re-push x{k} ({args.files} files)")  # type: ignore[attr-defined]
    log(f"== unchanged re-push of {args.files} files to {k} nodes")  # type: ignore[attr-defined]
    rounds(s, [
        ("dtrain warm", lambda r: _checked(env_, "dtrain warm", dtrain_cp("dtrain-warm", True),
                                           out, base)),
        ("dtrain warm, no agent", lambda r: _checked(
            env_, "dtrain warm, no agent", dtrain_cp("dtrain-warm-na", True), out,
            {**base, "DTRAIN_NODE_AGENT": "0"})),
        ("dtrain cold", lambda r: _checked(env_, "dtrain cold", dtrain_cp("dtrain-cold", False),
                                           out, {**base, "DTRAIN_RESIDENT": "0"})),
        ("pdcp", lambda r: _checked(env_, "pdcp", pdcp("pdcp"), out, base)),
        ("pdcp ControlPersist", lambda r: _checked(env_, "pdcp ControlPersist", pdcp("pdcp-cp"),
                                                   out, cp_env)),
    ], args.reps, max_busy=args.max_busy, patience=args.patience)  # type: ignore[attr-defined]
    for n in env_.nodes(k):
        shutil.rmtree(n.home / REMOTE_DIR, ignore_errors=True)
    return s


def rows(series_list: list[Series]) -> list[dict[str, object]]:
    """The results file's ratio rows: against ``dtrain warm``, and with ``--client-python``
    also against ``dtrain warm, site python`` (its own ratios to pdsh and ControlPersist)."""
    out = ratio_rows(series_list, ref="dtrain warm")
    if any(SITE in s.runs for s in series_list):
        out += [r for r in ratio_rows(series_list, ref=SITE)
                if r["tool"] in ("pdsh", "pdsh ControlPersist")]
    return out


def hop_spans(stderr: str) -> dict[str, float]:
    """The ``dtrain: hops (ms): a → b 1.2 | ... | total 9.9`` line's spans, in ms."""
    for line in stderr.splitlines():
        if line.startswith("dtrain: hops (ms): "):
            out = {}
            for part in line[len("dtrain: hops (ms): "):].split(" | "):
                name, _, ms = part.rpartition(" ")
                out[name] = float(ms)
            return out
    return {}


def _checked(env_: Env, tool: str, argv: list[str], out: Path, env: dict[str, str]) -> object:
    from common import run_timed

    run = run_timed(tool, argv, env=env, out=out)
    if run.rc != 0:
        run.problems.append(f"exit {run.rc}: {run.stderr.strip()[-300:]}")
    return run


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    time.sleep(0)
    sys.exit(main())
