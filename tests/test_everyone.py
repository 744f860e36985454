"""Issue 55's three asks that no pdsh replacement has: `dtrain ps --everyone` (every user's
runs on a shared login node and on its nodes, from the process table only), the warning (and
`--exclusive`'s refusal) when another user's run is on a node before the gang starts, and a
`run --dry-run --offline` short enough to read (one screen for 4 nodes; `-v` the full form).

Each failed on the code before: no `--everyone`, no `others` in the probe, no launcher
title, no `--exclusive`, and a 71-line, 202-column offline dry run for 4 nodes.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.decide.runplan.facts import NodeFacts
from launcher.decide.runplan.sharing import refuse, sharing
from launcher.exitcodes import EXIT_FAILED
from launcher.nodeside.runscan import parse_title, proc_hidden, scan
from launcher.output.report import schema_text
from tests.util import INTRUDER, REPO, assert_exit, dtrain, need_root

SECRET = "--lr-secret-" + uuid.uuid4().hex[:8]  # a rank's argument: never reported


def _stop(proc: subprocess.Popen[Any]) -> None:
    """End a process this test started (by its pid: SIGTERM, then SIGKILL)."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the title and the scan (nodeside/runscan.py) ---------------------------------------------

@pytest.mark.parametrize(("head", "want"), [
    (b"dtrain supervisor 20261207-1-ab node2\0 ", ("supervisor", "20261207-1-ab", "node2", None)),
    (b"dtrain torchrun r1 node2\0", ("torchrun", "r1", "node2", None)),
    (b"dtrain run r1 4 nodes\0 ", ("run", "r1", None, 4)),
    (b"dtrain smoke s1 1 node\0", ("smoke", "s1", None, 1)),
    (b"dtrain run r1\0", ("run", "r1", None, None)),
    (b"dtrain supervisor exec node2\0", None),  # dtrain exec: no run
    (b"dtrain rank 3 train.py " + SECRET.encode() + b"\0", None),  # a rank: never matched
    (b"dtrain probe facts node2\0", None),
    (b"dtrain\0run\0r1\0", None),  # argv words, not a title
    (b"dtrain supervisor r\x1b[31m node2\0", None),
    (b"dtrain supervisor r1 node2", None),  # cut before its NUL: not the whole title
])
def test_a_title_gives_kind_run_node_and_nothing_else(head: bytes, want: Any) -> None:
    assert parse_title(head) == want


def _proc(root: Path, pid: int, cmdline: bytes, uid: int, start_ticks: int = 100) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(cmdline)
    (d / "stat").write_bytes(f"{pid} (x y) S 1 ".encode() + b"0 " * 17 + f"{start_ticks} 0\n"
                             .encode())
    (d / "environ").write_bytes(b"HF_TOKEN=" + SECRET.encode() + b"\0")
    os.chown(d, uid, uid)


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    need_root("chown of the fake /proc entries")
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (root / "self").mkdir()
    (root / "self" / "mountinfo").write_text("22 27 0:21 / /proc rw,relatime - proc proc rw\n")
    _proc(root, 10, b"dtrain supervisor alice-run node2\0 ", 1001, 500)
    _proc(root, 11, b"dtrain torchrun alice-run node2\0 ", 1001, 600)
    _proc(root, 12, b"dtrain rank 0 train.py " + SECRET.encode() + b"\0 ", 1001)
    _proc(root, 13, b"dtrain supervisor bob-run node3\0 ", 1002)  # another node's
    _proc(root, 14, b"dtrain run mine 2 nodes\0 ", 0, 300)
    _proc(root, 15, b"/usr/bin/python3\0train.py\0" + SECRET.encode() + b"\0", 1001)
    return root


def test_the_scan_reports_user_run_node_and_start_only(fake_proc: Path) -> None:
    got = scan("node2", root=str(fake_proc), launchers=False)
    assert got["hidden"] is None and got["denied"] == 0
    [run] = got["runs"]
    assert (run["uid"], run["run_id"], run["kinds"], run["nodes"]) == (
        1001, "alice-run", ["supervisor", "torchrun"], None)
    assert run["started"] == 1700000000 + 500 / os.sysconf("SC_CLK_TCK")  # the earliest
    assert SECRET not in json.dumps(got) and "train.py" not in json.dumps(got)
    # the login node: launchers too; another user's runs only when asked to skip ours
    login = scan("vm", root=str(fake_proc))
    assert [(r["run_id"], r["kinds"], r["nodes"], r["user"]) for r in login["runs"]] == [
        ("mine", ["run"], 2, pwd.getpwuid(0).pw_name)]
    assert scan("node2", root=str(fake_proc), launchers=False, skip_uid=1001)["runs"] == []


def test_hidepid_is_said_unless_root(fake_proc: Path) -> None:
    (fake_proc / "self" / "mountinfo").write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw,hidepid=invisible\n")
    assert proc_hidden(str(fake_proc), euid=1000) == "hidepid=invisible"
    assert proc_hidden(str(fake_proc), euid=0) is None
    (fake_proc / "self" / "mountinfo").write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw,hidepid=0\n")
    assert proc_hidden(str(fake_proc), euid=1000) is None


# -- the shared-nodes decision (decide/runplan/sharing.py) -----------------------------------------

def _facts(runs: list[dict[str, Any]], hidden: str | None = None) -> NodeFacts:
    return NodeFacts.from_json({"hostname": "n", "others": {"hidden": hidden, "denied": 0,
                                                            "runs": runs}})


def test_another_users_run_is_one_warning_per_node_and_exclusive_refuses() -> None:
    facts = {"node1": _facts([]),
             "node2": _facts([{"uid": 1001, "user": "alice", "run_id": "a-1", "started": 5.0},
                              {"uid": 1002, "user": "bob", "run_id": "b-1"}]),
             "node3": _facts([], hidden="hidepid=2")}
    found = sharing(facts, ["node1", "node2", "node3"])
    assert found.lines == [
        "node2 is in use by alice's run a-1, bob's run b-1: two users' jobs would share it "
        "(`dtrain ps --everyone -w node2`)",
        "other users' processes are hidden on node3 (/proc hidepid=2): whether another run "
        "shares it is not known"]
    error = refuse(found)
    assert error.exit_code == EXIT_FAILED == 1
    assert "--exclusive: 1 node already run" in error.message and "nothing was started" in \
        error.message
    assert "--exclude node2" in (error.hint or "")
    assert sharing({"node1": _facts([])}, ["node1"]).lines == []
    # an old probe (no "others"): nothing known, nothing said
    assert not NodeFacts.from_json({"hostname": "n"}).others_seen


# -- dtrain ps --everyone on this machine -------------------------------------------------------

@pytest.fixture
def titled() -> Iterator[tuple[str, int]]:
    """A process of ours titled as a launcher of a run on 3 nodes."""
    run_id = f"fake-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(["bash", "-c", f'exec -a "dtrain run {run_id} 3 nodes" sleep 60'])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"dtrain run"):
            break
        time.sleep(0.05)
    try:
        yield run_id, proc.pid
    finally:
        _stop(proc)


def test_ps_everyone_lists_a_launcher_with_its_user_and_a_valid_document(
        titled: tuple[str, int]) -> None:
    import jsonschema

    run_id, _ = titled
    res = dtrain(["ps", "--everyone", "--json"], timeout=60)
    assert_exit(res, 0)
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, json.loads(schema_text("ps-everyone")))
    [login] = [m for m in doc["machines"] if m["role"] == "login"]
    [run] = [r for r in login["runs"] if r["run_id"] == run_id]
    assert (run["user"], run["processes"], run["nodes"], run["yours"]) == (
        pwd.getpwuid(os.getuid()).pw_name, ["run"], 3, True)
    table = dtrain(["ps", "--everyone"], timeout=60)
    assert_exit(table, 0)
    row = next(ln for ln in table.stdout.splitlines() if run_id in ln)
    assert "run launcher (3 nodes)" in row and pwd.getpwuid(os.getuid()).pw_name in row
    assert table.stdout.startswith("HOST  ")


# -- the short offline dry run ------------------------------------------------------------------

def _offline(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=2\nnode2 slots=2 python=/opt/venv/bin/python\n"
                     "node3 slots=2\nnode4 slots=4\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    res = dtrain(["run", "-f", str(hosts), "--dry-run", "--offline", "--run-id", "r55",
                  "--archive-dir", str(tmp_path / "runs"), "-e", "WANDB_PROJECT=p", *extra,
                  "train.py", "--lr", "1"],
                 env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert_exit(res, 0)
    return res


def test_the_offline_dry_run_of_4_nodes_fits_one_screen(tmp_path: Path) -> None:
    out = _offline(tmp_path).stdout
    lines = out.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 120, out  # was 71 lines, 202 wide
    nodes = [ln for ln in lines if ln.startswith("node ")]
    assert nodes == ["node 0  node1  ranks 0-1  nproc 2  python python3",
                     "node 1  node2  ranks 2-3  nproc 2  python /opt/venv/bin/python",
                     "node 2  node3  ranks 4-5  nproc 2  python python3",
                     "node 3  node4  ranks 6-9  nproc 4  python python3"], out
    command = out.split("command on every node: ", 1)[1].split("\n\n", 1)[0]
    assert "<PYTHON> -m torch.distributed.run --nnodes 4 --nproc-per-node <NPROC>" in \
        " ".join(command.split())
    assert "--node-rank <N>" in command and "train.py --lr 1" in command
    # the shared variables once, not once per node
    assert out.count("WANDB_PROJECT=p") == 1 and out.count("DTRAIN_NNODES=4") == 1
    assert "DTRAIN_NODE_RANK=<N>" in out and "DTRAIN_RUN_ID=r55" in out
    assert out.count("TORCH_FR_BUFFER_SIZE=2000") == 1 and "NCCL_DEBUG=INFO" in out


def test_verbose_is_the_full_form_and_json_is_unchanged(tmp_path: Path) -> None:
    full = _offline(tmp_path, "-v").stdout
    assert full.count("WANDB_PROJECT=p  [user: --env]") == 4  # every node's block
    assert "node 3  node4  ranks 6-9\n" in full
    short = json.loads(_offline(tmp_path, "--json").stdout)
    assert short == json.loads(_offline(tmp_path, "--json", "-v").stdout)
    assert [n["nproc"] for n in short["nodes"]] == [2, 2, 2, 4]


# -- on the cluster: another user's run on node2 ------------------------------------------------

@pytest.fixture
def intruders_run(cluster: Any, intruder: pwd.struct_passwd) -> Iterator[str]:
    """A process of `dtrain-intruder`'s inside node2 (its mount, hostname and network),
    titled as a supervisor of its run there, for as long as the test needs it."""
    from tests import cluster as tc

    run_id = f"intr-{uuid.uuid4().hex[:8]}"
    sshd = tc.sshd_pid(2, cluster.state_dir)
    assert sshd is not None
    proc = subprocess.Popen(
        ["nsenter", "-t", str(sshd), "-m", "-u", "-n", "--", "setpriv",
         f"--reuid={intruder.pw_uid}", f"--regid={intruder.pw_gid}", "--clear-groups", "--",
         "bash", "-c", f'exec -a "dtrain supervisor {run_id} node2" sleep 300'], cwd="/")
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"dtrain super"):
        assert time.monotonic() < deadline, "the intruder's process never got its title"
        time.sleep(0.05)
    try:
        yield run_id
    finally:
        _stop(proc)


@pytest.mark.ssh
def test_a_run_on_another_users_node_warns_and_exclusive_refuses(
        cluster: Any, intruders_run: str, tmp_path: Path) -> None:
    base = ["run", "-H", "node[1-2]", "--nproc-per-node", "1", "--python", cluster.python,
            "--archive-dir", str(tmp_path / "runs"), "--no-color", "-e", "TICK_N=2",
            "-e", "TICK_S=0.1"]
    warning = (f"dtrain: warning: node2 is in use by {INTRUDER}'s run {intruders_run}: "
               "two users' jobs would share it")
    env = cluster.client_env()
    dry = dtrain([*base, "--dry-run", "tests/workloads/tick.py"], env=env, cwd=REPO)
    assert_exit(dry, 0)
    assert warning in dry.stderr, dry.stderr
    assert "node1 is in use" not in dry.stderr
    ran = dtrain([*base, "tests/workloads/tick.py"], env=env, cwd=REPO)
    assert_exit(ran, 0)
    assert ran.stderr.count(warning) == 1, ran.stderr
    refused = dtrain([*base, "--exclusive", "--run-id", "excl-" + intruders_run,
                      "tests/workloads/tick.py"], env=env, cwd=REPO)
    assert_exit(refused, EXIT_FAILED)
    assert f"--exclusive: 1 node already run another user's dtrain job (node2: {INTRUDER}'s " \
        f"run {intruders_run}); nothing was started" in refused.stderr, refused.stderr
    assert "--exclude node2" in refused.stderr
    assert not (tmp_path / "runs" / ("excl-" + intruders_run)).exists()  # nothing started
    # whose run holds which node, over the same transport
    ps = dtrain(["ps", "--everyone", "-w", "node[1-2]", "--json"], env=cluster.client_env(),
                timeout=90)
    assert_exit(ps, 0)
    doc = json.loads(ps.stdout)
    import jsonschema

    jsonschema.validate(doc, json.loads(schema_text("ps-everyone")))
    node2 = next(m for m in doc["machines"] if m["host"] == "node2")
    assert node2["reachable"] and {(r["user"], r["run_id"], tuple(r["processes"]))
                                   for r in node2["runs"]} >= {
        (INTRUDER, intruders_run, ("supervisor",))}
    node1 = next(m for m in doc["machines"] if m["host"] == "node1")
    assert intruders_run not in json.dumps(node1)
    table = dtrain(["ps", "--everyone", "-w", "node2"], env=cluster.client_env(), timeout=90)
    assert_exit(table, 0)
    assert any(ln.split()[:3] == ["node2", INTRUDER, intruders_run]
               for ln in table.stdout.splitlines()), table.stdout


@pytest.mark.ssh
@pytest.mark.parametrize("restarts", [[], ["--restarts", "1"]], ids=["plain", "restarts"])
def test_a_launcher_is_titled_with_its_run_for_everyone(cluster: Any, tmp_path: Path,
                                                        restarts: list[str]) -> None:
    """`dtrain run` on the login node shows `dtrain run RUN 2 nodes` in ps (not the script's
    arguments), and `ps --everyone` lists it with its user (--restarts' loop too)."""
    run_id = f"title-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "run", "-H", "node[1-2]", "--nproc-per-node", "1",
         "--python", cluster.python, "--archive-dir", str(tmp_path / "runs"), "--run-id", run_id,
         "-e", "TICK_S=0.2", "-e", "TICK_N=150", *restarts, "tests/workloads/tick.py", SECRET],
        cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cluster.client_env())
    try:
        deadline = time.monotonic() + 60
        seen = b""
        while time.monotonic() < deadline and proc.poll() is None:
            seen = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            if seen.startswith(b"dtrain run"):
                break
            time.sleep(0.1)
        assert seen.split(b"\0")[0] == f"dtrain run {run_id} 2 nodes".encode(), seen
        assert SECRET.encode() not in seen
        doc = json.loads(dtrain(["ps", "--everyone", "--json"], timeout=60).stdout)
        login = next(m for m in doc["machines"] if m["role"] == "login")
        run = next(r for r in login["runs"] if r["run_id"] == run_id)
        assert (run["processes"], run["nodes"], run["yours"]) == (["run"], 2, True)
    finally:
        _stop(proc)
