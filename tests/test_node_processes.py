"""The processes dtrain leaves on a node, as a node's admin and the verdict see them
(issue 40, items 1 and 5), on the real-sshd cluster.

- A rank runs as two processes: the shim torchrun started (the outer, its child) and the
  rank itself (the inner, the user's script). Killing the outer one, which is what a stray
  ``kill -9`` may hit, is reported as the rank's death, the same way killing the inner one
  is: exit 137, the rank named as the root cause with a ``why:`` line, torchrun's block
  folded off the console.
- Each node-side process has a title that says what it is (its comm and its command line).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from launcher.nodeside import nodecommon, nodeprocs, wire
from tests import cluster as tc
from tests.test_failures import TRAIN, Dtrain, JobWatch, meta, new_id, run_args
from tests.util import proc_environ

pytestmark = [pytest.mark.timeout(120)]


def _rank_pids(k: int, run_id: str, timeout: float = 30.0) -> tuple[int, int]:
    """(outer, inner) pid of the one rank of the run on node k: the outer one (the shim
    torchrun started) has DTRAIN_SHIM_SOCK in its initial environment (so has torchrun);
    the inner one is its child, which has not, or (forked from the node's warm process,
    docs/warm-start.md) the process titled as its rank whose environment has its RANK."""
    tag = f"DTRAIN_RUN_ID={run_id}".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = tc.node_pids(k)
        outer = [p for p in pids if tag in (env := proc_environ(p))
                 and any(v.startswith(b"DTRAIN_SHIM_SOCK=") for v in env)]
        for pid in outer:
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if not any(v.startswith(b"DTRAIN_SHIM_SOCK=") for v in proc_environ(child)):
                    return pid, child
            rank = [v for v in proc_environ(pid) if v.startswith(b"RANK=")]
            for p in pids:
                env = proc_environ(p)
                if rank and tag in env and rank[0] in env and not any(
                        v.startswith(b"DTRAIN_SHIM_SOCK=") for v in env):
                    try:
                        line = _cmdline(p)
                    except OSError:
                        continue
                    if line.startswith("dtrain rank ") and " shim: " not in line:
                        return pid, p
        time.sleep(0.1)
    raise AssertionError(f"no rank shim of {run_id} on node{k}")


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


@pytest.mark.ssh
@pytest.mark.torch
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "kill"])
def test_killing_the_rank_shim_is_the_rank_killed(cluster: tc.Cluster, tmp_path: Path,
                                                  jobs, sig: int) -> None:
    """kill -9 (or a plain kill) of rank 1's outer process (torchrun's child) on node2:
    exit 128+N, rank 1 on node2 is the root cause with a why: line, no "no exit report",
    torchrun's ChildFailedError block is folded off the console (as when the rank itself
    is killed)."""
    run_id = new_id("shimkill")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, hosts="node[1-2]",
                                   env={"WL_COLLECTIVE": "1"}))
    jobs.append(job)
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job.wait_line(r"step 2", timeout=60)
        outer, inner = _rank_pids(2, run_id)
        os.kill(outer, sig)
        rc = job.wait(90)
        watch.assert_clean(1.0, since=job.ended)
    out = job.output
    name = signal.Signals(sig).name
    assert rc == 128 + sig, out
    assert "FAILED: rank 1 on node2" in out, out
    assert "no exit report" not in out, out
    assert re.search(rf"node2 \(node 1\): r1 {name} \({128 + sig}\).*ROOT CAUSE", out), out
    why = [line for line in out.splitlines() if line.startswith("dtrain: why: ")]
    assert why and f"rank 1 on node2 was killed by {name}" in why[0], out
    if sig == signal.SIGKILL:
        assert f"shim (pid {outer}" in why[0], out
    else:  # the shim passed the signal on to the rank, which died of it: not a stop
        assert "(not by dtrain)" in why[0], out
    # torchrun's ChildFailedError block, every line of it, is folded
    folded = r"ChildFailedError|Root Cause|FAILED$|NO_OTHER_FAILURES|exitcode"
    assert not re.search(folded, out, re.M), out
    m = meta(tmp_path, run_id)
    assert (m["exit_code"], m["root_cause"]["host"], m["root_cause"]["rank"]) == (
        128 + sig, "node2", 1)
    assert m["root_cause"]["signal"] == sig


def _torchrun_pid(k: int, run_id: str, timeout: float = 30.0) -> int:
    """torchrun of the run on node k: titled ``dtrain torchrun RUN nodeK`` (comm
    pt_elastic), or still its own command line in the moment before it titles itself
    (not the supervisor's, nor a rank's: their titles start otherwise)."""
    tag = f"DTRAIN_RUN_ID={run_id}".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in tc.node_pids(k):
            try:
                line = _cmdline(p)
            except OSError:
                continue
            if tag in proc_environ(p) and (line.startswith("dtrain torchrun ") or (
                    not line.startswith("dtrain ") and "torch.distributed.run" in line)):
                return p
        time.sleep(0.1)
    raise AssertionError(f"no torchrun of {run_id} on node{k}")


@pytest.mark.ssh
@pytest.mark.torch
def test_a_stopped_torchrun_is_a_hang_on_its_node_not_a_timeout(
        cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """SIGSTOP of torchrun on node2 (issue 39's torchrun-stop): the ranks run to their end,
    torchrun cannot; its supervisor sees it stopped after its ranks ended and ends the job:
    exit 125, the hang on node2 named, nothing left on the nodes; before, the run waited
    for --timeout (124) and named nothing."""
    run_id = new_id("agentstop")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, "--timeout", "90",
                                   hosts="node[1-2]", env={"WL_STEPS": "15"}))
    jobs.append(job)
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job.wait_line(r"step 2", timeout=60)
        agent = _torchrun_pid(2, run_id)
        os.kill(agent, signal.SIGSTOP)
        rc = job.wait(80)
        watch.assert_clean(5.0, since=job.ended)
    out = job.output
    assert rc == 125, out
    assert "FAILED: torchrun on node2 was stopped (SIGSTOP or SIGTSTP, not from dtrain)" \
        in out, out
    m = meta(tmp_path, run_id)
    assert (m["exit_code"], m["root_cause"]["kind"], m["root_cause"]["host"]) == (
        125, "hang", "node2"), m["root_cause"]


# -- titles (issue 40, item 5) ----------------------------------------------------------------

PROGRAMS = ("supervisor", "probe", "sampler", "cpnode")


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_node_program_ships_the_one_set_title(name: str) -> None:
    """One copy: nodetitle.set_title, first in every program's bundle (wire.PROGRAMS), and
    no program defines its own (each used to carry a copy that could drift)."""
    source = wire.program_source(name).decode()
    assert source.count("\ndef set_title(") == 1
    assert wire.program_modules(name)[0] == "nodetitle"


@pytest.mark.parametrize("python", ["python3", "python3.8"])
def test_set_title_in_ps(tmp_path: Path, python: str) -> None:
    """comm and /proc/PID/cmdline (what ps -e and ps -ef show), on the oldest Python too."""
    import shutil
    import subprocess
    import sys

    exe = sys.executable if python == "python3" else (
        next(iter(sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8"))), None)
        or shutil.which("python3.8"))
    if exe is None:
        from tests.util import cannot_run

        cannot_run("no python3.8 here (scripts/test installs one)")
    script = tmp_path / "t.py"
    script.write_text(
        "import sys\nsys.path.insert(0, sys.argv[1])\n"
        "from launcher.nodeside.nodetitle import set_title\n"
        "set_title('dtrain rank 3 train.py --lr 1', 'dtrain-r3')\n"
        "print(open('/proc/self/comm').read().strip())\n"
        "print(open('/proc/self/cmdline', 'rb').read())\n")
    repo = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([str(exe), "-I", "-S", str(script), repo, "x" * 200],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["dtrain-r3", repr(b"dtrain rank 3 train.py --lr 1\x00")]


@pytest.mark.ssh
@pytest.mark.torch
def test_node_processes_have_titles(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """On node2 of a running job: the supervisor, the rank's shim, the rank, the warm
    process it was forked from and the sampler say what they are in ps (comm and command
    line)."""
    run_id = new_id("titles")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, "--sample-interval", "1",
                                   hosts="node[1-2]"))
    jobs.append(job)
    job.wait_line(r"step 2", timeout=60)
    outer, inner = _rank_pids(2, run_id)
    assert (_comm(outer), _cmdline(outer)) == ("dtrain-shim", f"dtrain rank 1 shim: {TRAIN}")
    assert (_comm(inner), _cmdline(inner)) == ("dtrain-r1", f"dtrain rank 1 {TRAIN}")
    # other sessions' jobs may run on node2 too: ours is the one with our run id
    want = {("dtrain-sup", f"dtrain supervisor {run_id} node2"),
            ("pt_elastic", f"dtrain torchrun {run_id} node2"),
            ("dtrain-sampler", "dtrain sampler node2"),
            ("dtrain-warm", f"dtrain warm {run_id} node2")}  # docs/warm-start.md
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not want <= seen:
        for pid in tc.node_pids(2):
            try:
                seen.add((_comm(pid), _cmdline(pid)))
            except OSError:
                pass
        time.sleep(0.2)
    assert want <= seen, sorted(t for t in seen if t[0].startswith("dtrain"))
    job.signal(signal.SIGINT)
    job.wait(60)


@pytest.mark.parametrize("python", ["python3", "python3.8"])
def test_torchrun_titles_itself(tmp_path: Path, python: str) -> None:
    """rankshim.TORCHRUN_ISOLATED, as the supervisor starts torchrun (``python -c``), with
    the shim's bundle beside the ranks' socket and a stand-in torch: torchrun's process is
    ``dtrain torchrun RUN HOST`` (comm pt_elastic, torch's own) by the time torch.distributed.run
    runs, which still gets its own arguments; the agent line still goes out."""
    import shutil
    import socket
    import subprocess
    import sys

    from launcher.nodeside import rankshim
    from tests.util import node_program

    exe = sys.executable if python == "python3" else (
        next(iter(sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8"))), None)
        or shutil.which("python3.8"))
    if exe is None:
        from tests.util import cannot_run

        cannot_run("no python3.8 here (scripts/test installs one)")
    fake = tmp_path / "site"
    pkg = fake / "torch" / "distributed" / "launcher"
    pkg.mkdir(parents=True)
    for d in (fake / "torch", fake / "torch" / "distributed", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api.py").write_text("")
    (fake / "torch" / "distributed" / "run.py").write_text(
        "import sys\nif __name__ == '__main__':\n"
        "    print(open('/proc/self/comm').read().strip())\n"
        "    print(open('/proc/self/cmdline', 'rb').read())\n"
        "    print(sys.argv[1:])\n")
    private = tmp_path / "dtrain-x"
    private.mkdir()
    shutil.copy(node_program("supervisor"), private / "dtrain_shim.py")
    sock = str(private / "ranks.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock)
    listener.listen(1)
    env = {**os.environ, "PYTHONPATH": str(fake), rankshim.SHIM_ENV: sock,
           "DTRAIN_RUN_ID": "20261207-1200-ab12"}
    try:
        proc = subprocess.run([str(exe), "-c", rankshim.TORCHRUN_ISOLATED, "--nnodes", "2",
                               "x" * 100], env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        conn, _ = listener.accept()
        header = conn.makefile().readline()
        conn.close()
    finally:
        listener.close()
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    title = f"dtrain torchrun 20261207-1200-ab12 {os.uname().nodename}"
    assert proc.stdout.splitlines() == [
        "pt_elastic", repr(title.encode() + b"\x00"), "['--nnodes', '2', '" + "x" * 100 + "']"]
    assert '"stream": "agent"' in header


def test_zombie_status_reads_a_dead_process_s_status_before_its_parent_reaps_it() -> None:
    """What the supervisor reads of a shim that died (its parent, torchrun, not yet
    having reaped it): the raw wait status, as waitpid would return it."""

    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        status = nodeprocs.zombie_status(pid, wait=2.0)
        assert status is not None and os.WIFSIGNALED(status)
        assert nodeprocs.exit_code(status) == (137, signal.SIGKILL)
        # another process under that pid (its start time differs): not believed
        fields = nodecommon._stat_fields(pid)
        assert fields is not None
        assert nodeprocs.zombie_status(pid, int(fields[19]) + 1, wait=0) is None
    finally:
        os.waitpid(pid, 0)
    assert nodeprocs.zombie_status(pid, wait=0) is None  # reaped: gone
