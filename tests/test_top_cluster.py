"""`dtrain top` on the real-sshd cluster: the fake GPUs read exactly, CPU-only nodes, the
schema of --once/--json, the live screen under tmux, a node that drops during the view."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import cluster as tc
from tests.cluster import gpus as fake_gpus
from tests.reports import validate_top
from tests.util import REPO, assert_exit, cannot_run, dtrain

pytestmark = pytest.mark.ssh

HOSTS = "node[1-4]"  # node4 has the fake nvidia-smi (tests/cluster/gpus.py), 1-3 have none


def expected_gpus() -> list[dict[str, Any]]:
    return [{"index": g["index"], "name": g["name"], "util_pct": g["utilization.gpu"],
             "mem_used_mib": g["memory.used"], "mem_total_mib": g["memory.total"],
             "temp_c": g["temperature.gpu"], "power_w": g["power.draw"],
             "power_limit_w": g["power.limit"]} for g in fake_gpus.FAKE_GPUS]


def table(text: str) -> dict[str, dict[str, str]]:
    """The plain table as {host: {column: cell}} (columns cut at the header's offsets)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("NODE"))
    head = lines[at]
    # headers are apart by 2+ spaces ("NET rx/tx" and "POWER W" are one header each)
    names = [(m.start(), re.sub(r" [v^]$", "", m.group()))  # the live view's sort mark
             for m in re.finditer(r"\S+(?: \S+)*", head)]
    out = {}
    for line in lines[at + 1:]:
        if not line.strip():
            break
        cells = {}
        for i, (s, name) in enumerate(names):
            end = names[i + 1][0] if i + 1 < len(names) else len(line)
            cells[name] = line[s:end].strip()
        out[cells["NODE"]] = cells
    return out


def test_once_reads_the_fake_gpus_exactly_and_cpu_only_nodes_show_none(cluster):
    assert fake_gpus.is_gpu_node(4) and not any(fake_gpus.is_gpu_node(k) for k in (1, 2, 3))
    res = dtrain(["top", "-H", HOSTS, "--once"], env=cluster.client_env())
    assert_exit(res, 0)
    rows = table(res.stdout)
    assert list(rows) == ["node1", "node2", "node3", "node4"]
    g4 = rows["node4"]
    assert (g4["GPU"], g4["UTIL%"], g4["GMEM"], g4["TEMP"], g4["POWER W"]) == \
        ("2", "37 81", "41.0/159.3G", "45", "580/1400")
    for host in ("node1", "node2", "node3"):
        r = rows[host]
        assert r["STATE"] == "ok"
        assert (r["GPU"], r["UTIL%"], r["GMEM"], r["TEMP"], r["POWER W"]) == ("-",) * 5
        assert r["CPU%"] != "-" and r["MEM"] != "-"
    assert "\x1b[" not in res.stdout  # --once is plain: no screen control, no colour


def test_once_json_is_one_valid_document_with_exact_readings(cluster):
    res = dtrain(["top", "-H", HOSTS, "--once", "--json"], env=cluster.client_env())
    assert_exit(res, 0)
    lines = res.stdout.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    validate_top(doc)
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert nodes["node4"]["sample"]["gpus"] == expected_gpus()
    assert nodes["node4"]["sample"]["gpu_source"] == "nvidia-smi"
    for host in ("node1", "node2", "node3"):
        s = nodes[host]["sample"]
        assert s["gpus"] == [] and s["gpu_source"] is None and s["gpu_error"] is None
    # the NET column is the interface towards this machine: each node's own name
    ifname = {f"node{k}": cluster.node(k).ifname for k in range(1, 5)}
    assert {h: n["sample"]["net"]["iface"] for h, n in nodes.items()} == ifname
    assert doc["run"] is None and doc["stragglers"] == []


def test_json_stream_and_a_pipe_stream_snapshots(cluster):
    res = dtrain(["top", "-H", "node[1-2]", "--json", "--count", "3", "--interval", "0.5"],
                 env=cluster.client_env())
    assert_exit(res, 0)
    docs = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(docs) == 3
    for doc in docs:
        validate_top(doc)
    assert docs[0]["t"] < docs[1]["t"] < docs[2]["t"]
    piped = dtrain(["top", "-H", "node[1-2]", "--count", "2", "--interval", "0.5"],
                   env=cluster.client_env())
    assert_exit(piped, 0)
    assert piped.stdout.count("dtrain top  ") == 2 and "\x1b[" not in piped.stdout


def test_unreachable_host_in_once_exits_255_with_the_reason(cluster):
    res = dtrain(["top", "-H", "node1,198.18.0.99", "--once", "--connect-timeout", "1"],
                 env=cluster.client_env())
    assert_exit(res, 255)
    rows = table(res.stdout)
    assert rows["node1"]["STATE"] == "ok"
    assert rows["198.18.0.99"]["STATE"] == "unreachable"


def test_bad_input_exits_2_before_connecting(cluster):
    for args in (["--sort", "nope"], ["--iface", "a b"], ["--progress", "("]):
        res = dtrain(["top", "-H", "node1", "--once", *args], env=cluster.client_env())
        assert_exit(res, 2)


# -- the live screen, as a person sees it (tmux) ---------------------------------------------

class Tmux:
    """A detached tmux session running one command; its screen read with capture-pane."""

    def __init__(self, command: str, *, width: int = 180, height: int = 40) -> None:
        if subprocess.run(["which", "tmux"], capture_output=True).returncode:
            cannot_run("tmux is not installed")
        self.name = f"dtrain-top-{os.getpid()}-{time.monotonic_ns()}"
        # a tmux server of its own (-L): another test's server ending meanwhile (its last
        # session closed) made new-session fail (exit 1) on the shared default one
        self.tmux = ["tmux", "-L", self.name, "-f", "/dev/null"]
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", str(width),
                        "-y", str(height), command], check=True)

    def screen(self, *, escapes: bool = False) -> str:
        res = subprocess.run([*self.tmux, "capture-pane", "-p", *(["-e"] if escapes else []),
                              "-t", self.name], capture_output=True, text=True)
        return res.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def wait(self, cond: Callable[[str], bool], timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if cond(text):
                return text
            assert time.monotonic() < deadline, f"the screen never showed it:\n{text}"
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def live_command(cluster: tc.Cluster, args: str, *, sub: str = "top", **extra: str) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**cluster.client_env(), **extra}.items()
                   if k in ("HOME", "PATH", *extra))
    # no COLUMNS/LINES from pytest's environment (rich honours them): the pane's own size
    return (f"cd {shlex.quote(str(REPO))} && env -u COLUMNS -u LINES {env} "
            f"{shlex.quote(sys.executable)} -m "
            f"launcher {sub} {args}; echo DTRAIN-TOP-EXIT=$?; sleep 600")


def row(screen: str, host: str) -> str:
    return next((line for line in screen.splitlines() if line.startswith(host + " ")), "")


def rx_bytes(screen: str, host: str) -> float:
    """A host's NET rx in bytes/s (K/M suffixes) from the screen's table."""
    cell = table(screen).get(host, {}).get("NET rx/tx", "")
    m = re.match(r"(\d+(?:\.\d+)?)([KMG]?)/", cell)
    assert m, f"no NET rx for {host} in:\n{screen}"
    return float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


class Blaster:
    """UDP datagrams to a node's discard port from a thread, until stopped."""

    def __init__(self, ip: str) -> None:
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._send, args=(ip,), daemon=True)
        self.thread.start()

    def _send(self, ip: str) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while not self.done.wait(0.004):
                with contextlib.suppress(OSError):
                    sock.sendto(b"x" * 1400, (ip, 9))

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


def test_the_live_screen_updates_a_row_and_the_keys_work(cluster):
    tmux = Tmux(live_command(cluster, f"-H {HOSTS}"))
    ping: Blaster | None = None
    try:
        first = tmux.wait(lambda s: all(" ok " in row(s, f"node{k}") for k in range(1, 5)))
        assert "37 81" in row(first, "node4") and "s/S sort" in first
        before = rx_bytes(first, "node1")
        assert before < 50 << 10  # a sampler's own channel: well under 50 KiB/s
        # traffic towards node1 (UDP, ~300 KiB/s while the test waits): its row changes
        ping = Blaster(cluster.node(1).ip)
        tmux.wait(lambda s: rx_bytes(s, "node1") >= 50 << 10)
        tmux.keys("f")  # fold: node[1-3] look alike (coarse), node4 has GPUs
        tmux.wait(lambda s: "folded" in s and "node4" in s)
        tmux.keys("f", "/")
        tmux.keys("node4", "Enter")
        shown = tmux.wait(lambda s: "filter 'node4': 1 shown" in s)
        assert not row(shown, "node1") and row(shown, "node4")
        tmux.keys("q")
        gone = tmux.wait(lambda s: "DTRAIN-TOP-EXIT=" in s)
        assert "DTRAIN-TOP-EXIT=0" in gone and "Traceback" not in gone
    finally:
        if ping is not None:
            ping.stop()
        tmux.close()


COLOUR = re.compile(r"\x1b\[[0-9;]*3[0-7](?:;[0-9;]*)?m|\x1b\[[0-9;]*38;")  # a foreground colour


@pytest.mark.parametrize("no_color", [False, True])
def test_rows_are_coloured_by_state_unless_no_color(cluster, no_color):
    extra = {"NO_COLOR": "1"} if no_color else {}
    tmux = Tmux(live_command(cluster, "-H node1,198.18.0.99 --connect-timeout 1", **extra))
    try:
        tmux.wait(lambda s: " unreachable " in row(s, "198.18.0.99") and " ok " in
                  row(s, "node1"))
        coloured = tmux.screen(escapes=True)
        bad = next(line for line in coloured.splitlines() if "198.18.0.99" in line)
        if no_color:
            assert not COLOUR.search(coloured), coloured
        else:
            assert COLOUR.search(bad), bad  # the unreachable row is red
        tmux.keys("q")
        tmux.wait(lambda s: "DTRAIN-TOP-EXIT=0" in s)
    finally:
        tmux.close()


@pytest.fixture(scope="module")
def six(cluster: tc.Cluster) -> tc.Cluster:
    """Nodes 5 and 6 exist (the link cut below is kinder to others on node > 4)."""
    return tc.up(6)


def test_a_node_that_drops_shows_as_lost_and_the_view_goes_on(six):
    tmux = Tmux(live_command(six, "-H 'node[1-2],node6' --interval 0.5"))
    try:
        tmux.wait(lambda s: all(" ok " in row(s, h) for h in ("node1", "node2", "node6")))
        six.link_down(6)
        try:
            lost = tmux.wait(lambda s: " lost " in row(s, "node6"))
            assert " ok " in row(lost, "node1") and " ok " in row(lost, "node2")
            assert "no sample for" in row(lost, "node6")
            clock = re.search(r"dtrain top  (\S+)", lost)
            assert clock
            # the view goes on: the clock moves while node6 stays lost
            tmux.wait(lambda s: (m := re.search(r"dtrain top  (\S+)", s)) is not None
                      and m.group(1) != clock.group(1) and " lost " in row(s, "node6"))
        finally:
            six.link_up(6)
        # and when the link is back, top connects again by itself
        tmux.wait(lambda s: " ok " in row(s, "node6"), timeout=120)
        tmux.keys("q")
        tmux.wait(lambda s: "DTRAIN-TOP-EXIT=0" in s)
    finally:
        tmux.close()


def test_a_stopped_top_finds_no_node_lost_when_it_resumes(cluster):
    """`dtrain top` itself is SIGSTOPped 20 s (past its lost 5 s and reconnect 15 s; under
    the nodes' 30 s wait for it) while the nodes go on sampling: SIGCONTed, no node is shown
    lost or reconnected, its own stop is not their silence (decide/outcome/liveness.py)."""
    from tests.test_failures import Dtrain

    job = Dtrain(cluster, ["top", "-H", "node[1-2]", "--count", "36", "--interval", "0.5",
                           "--no-gpu"])
    try:
        job.wait_line(r"^node2\s+ok\b", timeout=60, count=3)
        job.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(20.0)
        finally:
            job.proc.send_signal(signal.SIGCONT)
        assert job.proc.wait(90) == 0, job.output
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
    out = job.output
    states = [(m.group(1), m.group(2)) for m in re.finditer(r"^(node[12])\s+(\S+)", out, re.M)]
    first_ok = next(i for i, (_, st) in enumerate(states) if st == "ok")
    after = states[first_ok + 2:]
    assert len(after) > 20 and all(st == "ok" for _, st in after), out


# -- a run, followed from another shell: detached, or in the foreground of its own terminal --

STRAGGLER_ARGS = ("--nproc-per-node 1 --sample-interval 1 --straggler-window 6 "
                  "--straggler-hold 6 tests/workloads/straggler.py {stop} node3")


@pytest.mark.torch
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["detached", "foreground"])
def test_top_follows_a_run_started_in_another_shell(cluster, tmp_path, how):
    """`dtrain top RUN` (detached) and `dtrain top` (the latest running run, a foreground
    run in another terminal) show the run's line, each node's ranks, and node3 as the
    straggler, live; when the run ends the view says so and goes on."""
    import uuid

    archive = tmp_path / "runs"
    stop = Path(cluster.shared_dir) / f"top-run-stop-{uuid.uuid4().hex}"
    run_id = f"top-{how}"
    run_args = (f"run -H 'node[1-4]' --python {shlex.quote(cluster.python)} --archive-dir "
                f"{shlex.quote(str(archive))} --run-id {run_id} --no-color "
                + STRAGGLER_ARGS.format(stop=shlex.quote(str(stop))))
    job: Tmux | None = None
    if how == "detached":
        res = dtrain(shlex.split(run_args.replace("run ", "run --detach ", 1)),
                     env=cluster.client_env(), timeout=120)
        assert_exit(res, 0)
        assert "detached" in res.stderr + res.stdout, res.stderr
        target = run_id
    else:  # the run's own terminal; top in another one finds the latest running run
        job = Tmux(live_command(cluster, run_args.split(" ", 1)[1], sub="run"))
        job.wait(lambda s: "r0: step 10" in s, timeout=300)
        target = ""
    tmux = Tmux(live_command(cluster, f"{target} --archive-dir {shlex.quote(str(archive))}"))
    try:
        # (node4's first GPU reading may come a sample after the flag, primed from the
        # run's samples.jsonl)
        screen = tmux.wait(lambda s: "STRAGGLER" in row(s, "node3") and "37 81" in
                           row(s, "node4") and f"run {run_id}  running" in s, timeout=300)
        cells = {h: c for h, c in table(screen).items() if h.startswith("node")}
        assert {h: cells[h]["RANKS"] for h in cells} == \
            {"node1": "0", "node2": "1", "node3": "2", "node4": "3"}
        assert all("STRAGGLER" not in cells[h]["NOTE"] for h in ("node1", "node2", "node4"))
        assert re.search(r"straggler: node3 \(rank 2\) busy", screen), screen
        assert cells["node4"]["UTIL%"] == "37 81"  # the fake nvidia-smi, as without a run
        (tmp_path / "screen.txt").write_text(screen)  # docs/top.md's capture comes from here
        stop.touch()
        tmux.wait(lambda s: f"run {run_id}  finished" in s, timeout=120)
        tmux.keys("q")
        gone = tmux.wait(lambda s: "DTRAIN-TOP-EXIT=" in s)
        assert "DTRAIN-TOP-EXIT=0" in gone and "Traceback" not in gone
    finally:
        stop.touch()
        tmux.close()
        if job is not None:
            with contextlib.suppress(AssertionError):
                job.wait(lambda s: "DTRAIN-TOP-EXIT=" in s, timeout=120)
            job.close()
        if how == "detached":
            dtrain(["stop", run_id, "--archive-dir", str(archive)], env=cluster.client_env())
        stop.unlink(missing_ok=True)


def test_top_of_a_run_logs_in_as_the_user_l_names(cluster, tmp_path):
    """`dtrain top RUN -l USER`: USER on the run's hosts that name none, and on -H's, as
    -l means in every command that connects (it was dropped for a run: top connected as
    the default user)."""
    archive = tmp_path / "runs"
    run = archive / "top-l"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({
        "archive_version": 1, "run_id": run.name, "state": "running", "hosts": ["node1"],
        "layout": [{"host": "node1", "node_rank": 0, "ranks": [0]}]}))
    for hosts in ([], ["-H", "node1"]):
        base = ["top", run.name, "--archive-dir", str(archive), "--once", "--no-gpu",
                "-t", "5", *hosts]
        res = dtrain([*base, "-l", "nobody"], env=cluster.client_env())  # no key lets us in
        assert_exit(res, 255)
        assert table(res.stdout)["node1"]["STATE"] != "ok", res.stdout
        res = dtrain([*base, "-l", cluster.user], env=cluster.client_env())
        assert_exit(res, 0)
        assert table(res.stdout)["node1"]["STATE"] == "ok", res.stdout


def test_key_g_gives_each_gpu_its_own_row(cluster):
    """Issue 40.9: a node's GPUs in one cell (`37 81`) is too long for 8 GPUs: `g` expands
    each node into a row per GPU (util, memory, temperature, power), `g` again folds back."""
    tmux = Tmux(live_command(cluster, "-H node[3-4]"))
    try:
        first = tmux.wait(lambda s: " ok " in row(s, "node4") and " ok " in row(s, "node3"))
        assert "37 81" in row(first, "node4") and "g GPUs" in first
        tmux.keys("g")
        shown = tmux.wait(lambda s: "a row per GPU" in s and "node4 gpu1" in s)
        gpu_rows = [ln for ln in shown.splitlines() if ln.startswith("node4 gpu")]
        assert [ln.split()[1] for ln in gpu_rows] == ["gpu0", "gpu1"], shown
        assert gpu_rows[0].split()[2] == "37" and gpu_rows[1].split()[2] == "81", shown
        assert not any(ln.startswith("node3 gpu") for ln in shown.splitlines())  # no GPUs
        assert "59 avg" in row(shown, "node4"), shown
        tmux.keys("g")
        tmux.wait(lambda s: "node4 gpu" not in s and "37 81" in row(s, "node4"))
        tmux.keys("q")
        assert "DTRAIN-TOP-EXIT=0" in tmux.wait(lambda s: "DTRAIN-TOP-EXIT=" in s)
    finally:
        tmux.close()
