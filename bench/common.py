"""Shared pieces of the end-to-end benchmarks (bench_exec, bench_stream, bench_run_overhead).

Every benchmark runs dtrain and the tools it replaces against the real-sshd test cluster
(tests/cluster), in the same process, interleaved round by round (dtrain, pdsh, clush, ...,
then again, each round starting one tool further on), so a disturbance or a warm cache hits
every tool alike; it reports the median. Before each run it waits (a bounded time) for the
machine to be quiet, because other test sessions share this box; a run that had to start on
a busy machine is counted and reported. pdsh, clush and ssh are given dtrain's cipher order
(AES-GCM first; OpenSSH's default puts chacha20 first), unless ``--ssh-ciphers openssh``.

Wall times are reported, never asserted: the tests do not depend on them.

Also runnable: ``python bench/common.py asyncssh-loop [--supervisor] NAME=ADDR... -- CMD``
is the reference floor, a bare asyncssh client with dtrain's algorithms (connect to every
node at once, run the command, tag and print its lines as ``host: line``) and nothing
else; with --supervisor the command runs under dtrain's node supervisor, as dtrain runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from launcher.transports.ssh import CIPHERS as DTRAIN_CIPHERS  # noqa: E402

PYTHON = sys.executable  # the interpreter with torch; dtuser can run it on every node
# what pdsh/clush/ssh are told to prefer: dtrain's own list (launcher/transports/ssh/
# settings.py), so the comparison is of the tools, not of the ciphers; "openssh" keeps
# OpenSSH's default
SSH_CIPHERS = {"dtrain": ",".join(DTRAIN_CIPHERS), "openssh": None}
BIN = Path(PYTHON).parent


def _tool(name: str) -> str:
    """The real executable, not a pyenv shim (a shim costs ~0.4 s per call)."""
    direct = BIN / name
    if direct.is_file() and os.access(direct, os.X_OK):
        return str(direct)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"bench: {name} not found")
    return found


DTRAIN = _tool("dtrain")
PDSH = shutil.which("pdsh") or "pdsh"
CLUSH = _tool("clush")
FANOUT = int(os.environ.get("BENCH_FANOUT", "64"))  # pdsh -f, clush -f, dtrain --fanout


# ---------------------------------------------------------------- machine load


def cpu_times() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return (total - idle) / hz, total / hz


def busy_fraction(window: float = 0.5) -> float:
    """Share of all CPUs busy during ``window`` seconds (0..1), while we only sleep."""
    b0, t0 = cpu_times()
    time.sleep(window)
    b1, t1 = cpu_times()
    return (b1 - b0) / max(t1 - t0, 1e-9)


def wait_quiet(max_busy: float = 0.2, patience: float = 60.0) -> bool:
    """Wait until the machine is (nearly) idle; False when it stayed busy for ``patience``."""
    deadline = time.monotonic() + patience
    while True:
        if busy_fraction() <= max_busy:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


# ---------------------------------------------------------------- the cluster and the tools


@dataclasses.dataclass
class Env:
    """The cluster, the client's ssh files and how each tool is invoked against them."""

    cluster: Any  # tests.cluster.Cluster
    tmp: Path
    first: int = 1  # the benchmark's nodes are node<first>...
    ciphers: str | None = SSH_CIPHERS["dtrain"]  # -o Ciphers= for pdsh/clush/ssh

    @classmethod
    def setup(cls, nodes: int, first: int = 1, *, ciphers: str = "dtrain") -> Env:
        """Build or grow the cluster to node<first + nodes - 1> (never shrinks it)."""
        from tests import cluster as tc

        reason = tc.unavailable_reason()
        if reason:
            raise SystemExit(f"bench: {reason}")
        t0 = time.monotonic()
        cluster = tc.up(first + nodes - 1)
        log(f"cluster: {len(cluster.nodes)} nodes up in {time.monotonic() - t0:.1f} s; "
            f"benchmark nodes node{first}..node{first + nodes - 1}")
        tmp = Path(tempfile.mkdtemp(prefix="dtrain-bench-"))
        log(f"pdsh/clush/ssh ciphers: {SSH_CIPHERS[ciphers] or 'OpenSSH default order'}")
        return cls(cluster, tmp, first, SSH_CIPHERS[ciphers])

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # OpenSSH reads ~/.ssh of the passwd entry, not $HOME: everything is passed explicitly
    def ssh_opts(self) -> list[str]:
        c = self.cluster
        cipher = ["-o", f"Ciphers={self.ciphers}"] if self.ciphers else []
        return ["-F", str(c.ssh_config), "-i", str(c.identity),
                "-o", f"UserKnownHostsFile={c.known_hosts}", "-o", "BatchMode=yes", *cipher]

    def env(self, **extra: str) -> dict[str, str]:
        """Client environment for every tool (HOME for asyncssh, pdsh's ssh arguments)."""
        env = self.cluster.client_env(**extra)
        env["PDSH_SSH_ARGS_APPEND"] = " ".join(self.ssh_opts())
        # the dtrain of this tree (the console script would find the installed one), with
        # its .pyc files written as an installed package has them
        paths = [str(REPO), *filter(None, [env.get("PYTHONPATH")])]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("PDSH_RCMD_TYPE", None)
        env.pop("NO_COLOR", None)
        return env

    def run(self, tool: str, argv: Sequence[str] | Sequence[Sequence[str]], out: Path,
            **kw: Any) -> Run:
        """``run_timed`` as the cluster's client: under ``self.env()``."""
        return run_timed(tool, argv, env=self.env(), out=out, **kw)

    def checked(self, tool: str, argv: Sequence[str] | Sequence[Sequence[str]], out: Path,
                *, tail: int = 300, **kw: Any) -> Run:
        """``run``, a non-zero exit noted as the run's problem (with the end of its stderr)."""
        run = self.run(tool, argv, out, **kw)
        if run.rc != 0:
            run.problems.append(f"exit {run.rc}: {run.stderr.strip()[-tail:]}")
        return run

    def nodes(self, k: int) -> list[Any]:
        """The benchmark's first k nodes (tests.cluster.Node)."""
        return list(self.cluster.nodes[self.first - 1:self.first - 1 + k])

    def names(self, k: int) -> list[str]:
        return [n.name for n in self.nodes(k)]

    def hostlist(self, k: int) -> str:
        last = self.first + k - 1
        return f"node[{self.first}-{last}]" if k > 1 else f"node{self.first}"

    def dtrain_exec(self, k: int, command: str) -> list[str]:
        return [DTRAIN, "exec", "-H", f"{self.cluster.user}@{self.hostlist(k)}",
                "--fanout", str(FANOUT), "--no-color", "--", command]

    # -S: exit with the largest remote exit code, as dtrain does
    def pdsh(self, k: int, command: str) -> list[str]:
        return [PDSH, "-S", "-R", "ssh", "-f", str(FANOUT), "-l", self.cluster.user,
                "-w", self.hostlist(k), command]

    def clush(self, k: int, command: str) -> list[str]:
        return [CLUSH, "-S", "-f", str(FANOUT), "-l", self.cluster.user,
                "-o", " ".join(self.ssh_opts()), "-w", self.hostlist(k), command]

    def floor(self, k: int, command: str, *, supervisor: bool = False) -> list[str]:
        """The bare asyncssh loop (by address: no ssh config to read)."""
        return [PYTHON, str(Path(__file__)), "asyncssh-loop",
                *(["--supervisor"] if supervisor else []),
                *[f"{n.name}={n.ip}" for n in self.nodes(k)], "--", command]

    def ssh(self, node: str, command: str) -> list[str]:
        return ["ssh", *self.ssh_opts(), "-l", self.cluster.user, node, command]


# ---------------------------------------------------------------- one timed run


@dataclasses.dataclass
class Run:
    """One execution of one tool."""

    tool: str
    wall: float  # seconds, fork to exit
    client_cpu: float  # user+sys seconds of the tool and every child it waited for
    machine_cpu: float  # busy CPU seconds of the whole machine (sshd, remote side, noise)
    rc: int
    stdout: Path
    stderr: str
    quiet: bool  # the round started on a quiet machine
    chunks: list[tuple[float, int]] | None = None  # (arrival time, cumulative bytes) if piped
    t_start: float = 0.0  # time.time() at start (the workers' clock)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        return self.stdout.read_text(errors="replace")


def run_timed(tool: str, argv: Sequence[str] | Sequence[Sequence[str]], *,
              env: Mapping[str, str], out: Path, quiet: bool = True, pipe: bool = False,
              timeout: float = 600, cwd: str | Path | None = None) -> Run:
    """Run argv (or several argvs at once, waiting for all: the hand-written ssh loop).

    With ``pipe`` the benchmark reads stdout itself and records when each chunk arrived
    (for streaming throughput); otherwise stdout goes straight to the file ``out``.
    """
    argvs: list[list[str]] = ([list(a) for a in argv] if argv and not isinstance(argv[0], str)
                              else [list(argv)])  # type: ignore[arg-type]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, _ = cpu_times()
    err_path = out.with_suffix(".err")
    chunks: list[tuple[float, int]] | None = [] if pipe else None
    with open(out, "wb") as fout, open(err_path, "wb") as ferr:
        t_start = time.time()
        t0 = time.perf_counter()
        procs = [subprocess.Popen(a, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE if pipe else fout, stderr=ferr,
                                  env=dict(env), cwd=cwd) for a in argvs]
        if pipe:
            assert chunks is not None
            _pump([p.stdout for p in procs], fout, chunks)  # type: ignore[misc]
        deadline = time.monotonic() + timeout
        rcs = []
        for p in procs:
            try:
                rcs.append(wait_exact(p, max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs.append(p.wait())
        wall = time.perf_counter() - t0
    busy1, _ = cpu_times()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rc = max(rcs, key=abs)
    return Run(tool, wall, cpu, busy1 - busy0, rc, out, err_path.read_text(errors="replace"),
               quiet, chunks, t_start)


def wait_exact(p: subprocess.Popen[bytes], timeout: float) -> int:
    """``p.wait(timeout)`` without its polling: CPython's timed wait sleeps 0.5, 1, 2, ...
    up to 50 ms between checks, so a tool ending at 172 ms was measured at 213.5 ms and one
    ending at 220 ms at 263.5 ms (every sub-second wall of the benchmarks before 2026-12-04
    sat on that ladder). Here the exit is seen when it happens: the process's pidfd becomes
    readable (Linux 5.3+), and the untimed wait then reaps it at once."""
    import select

    try:
        fd = os.pidfd_open(p.pid)
    except (AttributeError, OSError):  # no pidfd (or the process is already reaped)
        return p.wait(timeout=timeout)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        raise subprocess.TimeoutExpired(p.args, timeout)
    return p.wait()


def _pump(streams: Sequence[Any], fout: Any, chunks: list[tuple[float, int]]) -> None:
    """Copy the tools' stdout into fout, noting (time.time(), bytes so far) per chunk."""
    import selectors

    sel = selectors.DefaultSelector()
    for s in streams:
        sel.register(s, selectors.EVENT_READ)
    total = 0
    several = len(streams) > 1
    tails: dict[int, bytes] = {}  # several streams: whole lines only, never half of one
    while sel.get_map():
        for key, _ in sel.select():
            data = os.read(key.fd, 1 << 20)
            if not data:
                data = tails.pop(key.fd, b"")
                sel.unregister(key.fileobj)
                key.fileobj.close()
                if not data:
                    continue
            elif several:
                data = tails.pop(key.fd, b"") + data
                cut = data.rfind(b"\n") + 1
                if cut < len(data):
                    tails[key.fd] = data[cut:]
                    data = data[:cut]
                if not data:
                    continue
            fout.write(data)
            total += len(data)
            chunks.append((time.time(), total))


def arrival_time(run: Run, offset: int) -> float:
    """When the byte at ``offset`` of a piped run's stdout arrived."""
    assert run.chunks is not None
    for t, total in run.chunks:
        if total > offset:
            return t
    return run.chunks[-1][0] if run.chunks else run.t_start


# ---------------------------------------------------------------- series and tables


class Series:
    """Runs of several tools for one case, taken in interleaved rounds."""

    def __init__(self, case: str) -> None:
        self.case = case
        self.runs: dict[str, list[Run]] = {}

    def add(self, run: Run) -> None:
        self.runs.setdefault(run.tool, []).append(run)

    def median(self, tool: str, key: Callable[[Run], float] = lambda r: r.wall) -> float:
        values = [key(r) for r in self.runs.get(tool, []) if not r.problems]
        return statistics.median(values) if values else float("nan")

    def problems(self) -> list[str]:
        return [f"{self.case} / {r.tool}: {p}" for rs in self.runs.values() for r in rs
                for p in r.problems]

    def busy_rounds(self) -> int:
        return sum(1 for rs in self.runs.values() for r in rs if not r.quiet)


def rounds(series: Series, tools: Sequence[tuple[str, Callable[[int], Run]]], reps: int,
           *, warmup: bool = True, max_busy: float = 0.2, patience: float = 60.0,
           retries: int = 2) -> None:
    """Interleave: round r runs every tool once (each preceded by a quiet check), starting
    with tool r mod n: no tool always runs first (after an idle gap) or right after another.

    A run with a problem (lost lines, a failed node) stays recorded and reported, and is
    retried up to ``retries`` times: other sessions cut links and swap authorized_keys on
    the shared cluster, and one such accident must not leave a tool without a median.
    """
    if warmup:  # page cache, pyc files, sshd's first fork: not measured
        for name, fn in tools:
            fn(-1)
            log(f"  warm-up {name} done")
    for r in range(reps):
        shift = r % len(tools) if tools else 0
        for name, fn in [*tools[shift:], *tools[:shift]]:
            for _attempt in range(retries + 1):
                quiet = wait_quiet(max_busy, patience)
                run = fn(r)
                run.quiet = quiet
                series.add(run)
                flag = "" if quiet else " (machine busy)"
                bad = f"  PROBLEM: {'; '.join(run.problems)[-400:]}" if run.problems else ""
                log(f"  round {r + 1}/{reps} {name:<16} {run.wall:7.3f} s  client CPU "
                    f"{run.client_cpu:6.2f} s  machine CPU {run.machine_cpu:6.2f} s{flag}{bad}")
                if not run.problems:
                    break


def bench_parser(doc: str | None, *, reps: int, only: str,
                 first_node: int | None = 5) -> argparse.ArgumentParser:
    """The options every benchmark shares: rounds, a subset, quiet-machine wait, JSON out."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--only", default=only)
    if first_node is not None:
        parser.add_argument("--first-node", type=int, default=first_node,
                            help="use node<N>...: the test suite cuts links and swaps keys "
                                 "on node1-4")
    parser.add_argument("--max-busy", type=float, default=0.2,
                        help="wait for the machine to be less busy than this before a run")
    parser.add_argument("--patience", type=float, default=60.0,
                        help="seconds to wait for a quiet machine before running anyway")
    parser.add_argument("--json", help="write every run's numbers here")
    parser.add_argument("--ssh-ciphers", choices=sorted(SSH_CIPHERS), default="dtrain",
                        help="cipher order for pdsh/clush/ssh: dtrain's (default, AES-GCM "
                             "first) or OpenSSH's default (chacha20 first)")
    return parser


def fmt_s(x: float) -> str:
    return "-" if x != x else (f"{x:.3f} s" if x < 10 else f"{x:.2f} s")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain Markdown table (pastes into docs/benchmarks.md as is)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def wall_table(series_list: Sequence[Series], ref: str = "dtrain",
               others: Sequence[str] = ("pdsh", "clush")) -> str:
    """Case, tool, median wall, range, client CPU, machine CPU, ratio of ref to the tools."""
    rows = []
    for s in series_list:
        first = True
        for tool, runs in s.runs.items():
            good = [r for r in runs if not r.problems]
            walls = sorted(r.wall for r in good)
            rng = f"{walls[0]:.2f}-{walls[-1]:.2f}" if walls else "-"
            ratios = []
            for o in others:
                if tool == ref and o in s.runs:
                    ratios.append(f"{s.median(ref) / s.median(o):.2f}")
                else:
                    ratios.append("")
            rows.append([s.case if first else "", tool, fmt_s(s.median(tool)), rng,
                         fmt_s(s.median(tool, lambda r: r.client_cpu)),
                         fmt_s(s.median(tool, lambda r: r.machine_cpu)),
                         f"{len(good)}/{len(runs)}", *ratios])
            first = False
    headers = ["case", "tool", "wall (median)", "range", "client CPU", "machine CPU", "ok runs",
               *[f"{ref}/{o}" for o in others]]
    return table(headers, rows)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine() -> str:
    """One line about this machine, for the report."""
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    import asyncssh

    return (f"{os.cpu_count()} CPUs ({model}), {mem:.0f} GiB, Linux {os.uname().release}; "
            f"Python {sys.version.split()[0]}, asyncssh {asyncssh.__version__}, {ssh}, "
            f"{_version([PDSH, '-V'])}, clush {_version([CLUSH, '--version']).split()[-1]}")


def revision() -> str:
    """The commit measured, and whether launcher/ had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                              text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--", "launcher")
    stamp = time.strftime("%Y-%m-%d %H:%M %Z")
    return (f"dtrain {git('rev-parse', '--short', 'HEAD')}"
            f"{' + uncommitted changes in launcher/' if dirty else ''}, measured {stamp}")


def _version(argv: list[str]) -> str:
    p = subprocess.run(argv, capture_output=True, text=True)
    return (p.stdout or p.stderr).strip().splitlines()[0]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


# taken when the bench starts, not when it writes its file: HEAD may move during a long run
_STARTED = {"commit": _git("rev-parse", "--short=7", "HEAD"),
            "launcher_changed": bool(_git("status", "--porcelain", "--", "launcher")),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def provenance() -> dict[str, Any]:
    """What bench/results/README.md asks of a results file: the command, and the commit and
    date when the bench started (with whether launcher/ had uncommitted changes then)."""
    return {"command": " ".join(["python", os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
            "commit": _STARTED["commit"], "date": _STARTED["date"],
            "uncommitted_launcher_changes_at_start": _STARTED["launcher_changed"]}


def ratio_rows(series: Sequence[Series], ref: str = "dtrain") -> list[dict[str, Any]]:
    """A results file's rows: per case and tool the median wall, its range and ``ref / tool``
    (the ratio of the medians, as the wall tables print it)."""
    rows: list[dict[str, Any]] = []
    for s in series:
        for tool, runs in s.runs.items():
            good = sorted(r.wall for r in runs if not r.problems)
            row: dict[str, Any] = {"case": s.case, "tool": tool,
                                   "wall (median)": round(s.median(tool), 3),
                                   "range": f"{good[0]:.2f}-{good[-1]:.2f}" if good else "-",
                                   "ok runs": f"{len(good)}/{len(runs)}"}
            if tool != ref:
                row[f"{ref} / tool"] = f"{s.median(ref) / s.median(tool):.2f}"
            rows.append(row)
    return rows


def save_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        log(f"results written to {path}")


def series_json(s: Series) -> dict[str, Any]:
    return {tool: [{"wall": r.wall, "client_cpu": r.client_cpu, "machine_cpu": r.machine_cpu,
                    "rc": r.rc, "quiet": r.quiet, "problems": r.problems, **r.extra}
                   for r in runs] for tool, runs in s.runs.items()}


# ---------------------------------------------------------------- output checks


def check_tagged(text: str, expect: Mapping[str, Callable[[list[str]], str | None]]) -> list[str]:
    """Group ``host: line`` output by host and let each host's checker judge its lines."""
    by_host: dict[str, list[str]] = {}
    stray = 0
    for line in text.splitlines():
        host, sep, rest = line.partition(": ")
        if not sep or host not in expect:
            stray += 1
            continue
        by_host.setdefault(host, []).append(rest)
    problems = [f"{stray} lines without a known host tag"] if stray else []
    for host, check in expect.items():
        verdict = check(by_host.get(host, []))
        if verdict:
            problems.append(f"{host}: {verdict}")
    return problems


# ---------------------------------------------------------------- the asyncssh floor


def _floor_main(argv: list[str]) -> int:
    """``asyncssh-loop [--supervisor] NAME=ADDR... -- CMD``: connect to all, run CMD, print
    ``NAME: line``.

    With --supervisor, CMD runs under dtrain's own node supervisor, shipped and spoken to
    exactly as dtrain does it (launcher.nodeside.wire), with none of the rest of dtrain: the floor
    of dtrain's protocol.
    """
    import asyncio

    import asyncssh

    from launcher.job.node import JobSpec
    from launcher.nodeside import wire
    from launcher.transports.ssh import CIPHERS, KEX_ALGS  # the same algorithms as dtrain

    supervised = argv[:1] == ["--supervisor"]
    argv = argv[1:] if supervised else argv
    split = argv.index("--")
    hosts, command = argv[:split], " ".join(argv[split + 1:])
    ssh_dir = Path(os.environ["HOME"]) / ".ssh"
    keys = asyncssh.load_keypairs([str(ssh_dir / "id_ed25519")])
    known = str(ssh_dir / "known_hosts")
    out = sys.stdout.buffer
    worst = 0

    def tagger(host: str) -> Callable[[bytes], None]:
        prefix, nl, tail = f"{host}: ".encode(), b"\n" + f"{host}: ".encode(), [b""]

        def emit(data: bytes) -> None:
            if not data:  # end of stream
                if tail[0]:
                    out.write(prefix + tail[0] + b"\n")
                return
            data = tail[0] + data
            cut = data.rfind(b"\n") + 1
            tail[0] = data[cut:]
            if cut:
                out.write(prefix + nl.join(data[:cut - 1].split(b"\n")) + b"\n")
        return emit

    async def one(spec: str) -> None:
        nonlocal worst
        host, _, addr = spec.partition("=")
        emit = tagger(host)
        async with asyncssh.connect(addr or host, username="dtuser", client_keys=keys,
                                    known_hosts=known, config=[], agent_path=None,
                                    kex_algs=KEX_ALGS, encryption_algs=CIPHERS) as conn:
            if not supervised:
                proc = await conn.create_process(command, encoding=None,
                                                 stdin=asyncssh.DEVNULL)
                while data := await proc.stdout.read(1 << 18):
                    emit(data)
                emit(b"")
                result = await proc.wait()
                worst = max(worst, result.exit_status or 0)
                return
            # the command line and payload of NodeSession.run (launcher/job/node.py)
            proc = await conn.create_process(wire.remote_command("python3", stdlib_only=True),
                                             encoding=None)
            job = JobSpec(shell=command, grace=2.0)
            proc.stdin.write(wire.supervisor_payload(job.wire()))
            decoder = wire.FrameDecoder()
            code = None
            while data := await proc.stdout.read(1 << 18):
                for frame in decoder.feed(data):
                    if frame.kind == wire.KIND_OUT:
                        emit(frame.data)
                    elif frame.kind == wire.KIND_CTL and frame.message().get("type") == "exit":
                        code = int(frame.message().get("code") or 0)
            emit(b"")
            proc.stdin.write_eof()
            worst = max(worst, 255 if code is None else code)

    async def main() -> None:
        await asyncio.gather(*(one(h) for h in hosts))

    asyncio.run(main())
    out.flush()
    return worst


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "asyncssh-loop":
        sys.exit(_floor_main(sys.argv[2:]))
    raise SystemExit(__doc__)
