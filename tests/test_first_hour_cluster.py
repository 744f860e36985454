"""What a new user trips over in the first hour, on the real-sshd cluster: start errors,
missing programs, unreachable hosts (issue 12)."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.util import dtrain

pytestmark = pytest.mark.ssh


def test_exec_argv_start_error_is_shown_per_node_folded(cluster):
    """Several args run without a shell: the supervisor's exec error is what the user sees."""
    res = dtrain(["exec", "-H", "node[1-3]", "--", "nvidia-smi", "-L"], env=cluster.client_env())
    assert res.returncode == 127
    assert "dtrain: node[1-3]: nvidia-smi: command not found (exit 127)\n" in res.stderr
    assert "exit 127\n" not in res.stderr.replace("(exit 127)\n", "")


def test_exec_argv_start_errors_differ_per_node(cluster):
    home = cluster.node(1).home
    tool = home / "dtrain-tool.sh"
    tool.write_text("#!/bin/sh\necho tool $1\n")
    tool.chmod(0o755)
    os.chown(tool, home.stat().st_uid, home.stat().st_gid)
    try:
        res = dtrain(["exec", "-H", "node[1-3]", "--", "./dtrain-tool.sh", "x"],
                     env=cluster.client_env())
    finally:
        tool.unlink()
    assert res.returncode == 127
    assert res.stdout == "node1: tool x\n"
    assert "dtrain: node[2-3]: ./dtrain-tool.sh: No such file or directory (exit 127)\n" \
        in res.stderr


NODES = "node[1-3]"


def _run(cluster, *args, python=None):
    return dtrain(["run", "-H", NODES, "--python", python or cluster.python,
                   "--nproc-per-node", "1", *args], env=cluster.client_env())


def test_torch_missing_is_one_folded_line_with_the_fix(cluster):
    res = _run(cluster, "examples/ddp_smoke.py", python="/usr/bin/python3")
    assert res.returncode == 1, res.stderr
    assert ("dtrain: error: node[1-3]: torch: torch is not installed for /usr/bin/python3\n"
            in res.stderr)
    assert "hint: point dtrain at a Python that has torch on those nodes: --python" in res.stderr
    assert "--no-preflight" not in res.stderr and "dtrain: run " not in res.stderr


def test_python_missing_is_one_folded_line_with_the_fix(cluster):
    res = _run(cluster, "examples/ddp_smoke.py", python="python3.99")
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("python3.99 not found") == 1
    assert "dtrain: error: node[1-3]: python3.99 not found\n" in res.stderr
    assert "--setup 'source /path/to/venv/bin/activate'" in res.stderr


def test_python_missing_by_path_is_said_once(cluster):
    """Issue 24.7: the error, its 'dtrain:' and its fix once each (it said 'probe failed:
    dtrain: ... not found on this node (set --python or the hostfile's python=)' and then
    the same fix again in the hint)."""
    res = _run(cluster, "examples/ddp_smoke.py", python="/nope/python3")
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith("dtrain: error: node[1-3]: /nope/python3 not found\n")
    assert res.stderr.count("dtrain:") == 1, res.stderr
    assert res.stderr.count("python=") == 1, res.stderr


BAD_SETUP = "source /nonexist/bin/activate"


def test_failing_setup_is_reported_as_the_setup_not_as_missing_torch(cluster):
    """Issue 24.9: the setup's own stderr and exit status, its fix; not 'torch is not
    installed' (the probe used to run on without the venv, in a Python without torch)."""
    res = _run(cluster, "--setup", BAD_SETUP, "examples/ddp_smoke.py", python="/usr/bin/python3")
    assert res.returncode == 1, res.stderr
    first = res.stderr.splitlines()[0]
    assert first.startswith("dtrain: error: node[1-3]: --setup failed (exit 1): "), res.stderr
    assert "/nonexist/bin/activate: No such file or directory" in first
    assert "torch" not in res.stderr
    assert "hint: --setup runs in the node's shell" in res.stderr
    assert "dtrain: run " not in res.stderr


def test_doctor_has_a_setup_row(cluster):
    """Issue 24.9: doctor --setup says whether the setup ran, per node, failed ones first."""
    bad = dtrain(["doctor", "-H", NODES, "--setup", BAD_SETUP], env=cluster.client_env())
    assert bad.returncode == 1, bad.stderr
    rows = [ln.split(None, 3) for ln in bad.stdout.splitlines()]
    setup = [r for r in rows if r and r[0] == "setup"]
    assert setup and all(r[2] == "FAIL" for r in setup), bad.stdout
    assert "--setup failed (exit 1)" in setup[0][3] and "No such file" in setup[0][3]
    assert not any(r[0] == "torch" for r in rows), bad.stdout
    good = dtrain(["doctor", "-H", NODES, "--python", cluster.python, "--setup", "true"],
                  env=cluster.client_env())
    assert good.returncode == 0, good.stdout + good.stderr
    assert {r[2] for r in (ln.split(None, 3) for ln in good.stdout.splitlines())
            if r and r[0] == "setup"} == {"ok"}, good.stdout


@pytest.fixture
def private_workdir(cluster):
    """/home/dtuser/private on node1..3: root's, mode 0700, holding the script."""
    made = []
    for k in (1, 2, 3):
        d = cluster.node(k).home / "private"
        d.mkdir(exist_ok=True)
        (d / "ddp_smoke.py").write_text("print('hi')\n")
        d.chmod(0o700)
        os.chown(d, 0, 0)
        made.append(d)
    yield "/home/dtuser/private"
    for d in made:
        (d / "ddp_smoke.py").unlink()
        d.rmdir()


def test_unreadable_workdir_is_permission_denied_not_script_missing(cluster, private_workdir):
    """Issue 24.9: a 0700 directory of another user is 'permission denied' (it was
    'ddp_smoke.py not found in ...')."""
    res = _run(cluster, "--workdir", private_workdir, "ddp_smoke.py")
    assert res.returncode == 1, res.stderr
    assert (f"dtrain: error: working directory {private_workdir} on node[1-3]: permission "
            "denied (it exists, but dtuser may not enter or read it)") in res.stderr
    assert "not found" not in res.stderr
    assert "dtrain: run " not in res.stderr


def test_script_missing_on_some_nodes_is_refused_before_anything_starts(cluster):
    home = cluster.node(1).home
    script = home / "dtrain_first_hour.py"
    script.write_text("print('hi')\n")
    try:
        res = _run(cluster, "--workdir", "/home/dtuser", "dtrain_first_hour.py")
    finally:
        script.unlink()
    assert res.returncode == 1, res.stderr
    assert ("dtrain: error: dtrain_first_hour.py not found in /home/dtuser on node[2-3]; "
            "nothing was started\n") in res.stderr
    assert "dtrain: run " not in res.stderr


def test_module_missing_is_refused_before_anything_starts(cluster):
    res = _run(cluster, "-m", "no_such_module_dtrain")
    assert res.returncode == 1, res.stderr
    assert "module no_such_module_dtrain not found on node[1-3]" in res.stderr
    assert "dtrain: run " not in res.stderr


@pytest.fixture
def hostfile_with_a_dead_port(tmp_path):
    """node3, node1, an entry whose port has no sshd (line 3), node2."""
    path = tmp_path / "hosts.txt"
    path.write_text("node3\nnode1\n198.18.0.11:2299\nnode2\n")
    return path


def test_exec_unreachable_host_once_with_its_line_and_exclude(cluster, hostfile_with_a_dead_port):
    hf = hostfile_with_a_dead_port
    res = dtrain(["exec", "-f", str(hf), "--gather", "--", "hostname"], env=cluster.client_env())
    assert res.returncode == 255
    assert res.stderr.count("connection refused") == 1, res.stderr
    assert f"dtrain: 198.18.0.11:2299 ({hf}:3): not reached: connection refused" in res.stderr
    assert "--exclude 198.18.0.11:2299\n" in res.stderr  # as the hostfile wrote it (issue 55)
    headers = [ln for ln in res.stdout.splitlines() if ln.startswith("node")][::2]
    assert headers == ["node3", "node1", "node2"]  # hostfile order, not arrival order


def test_run_unreachable_host_once_with_its_line_and_exclude(cluster, hostfile_with_a_dead_port):
    hf = hostfile_with_a_dead_port
    res = dtrain(["run", "-f", str(hf), "--python", cluster.python, "--nproc-per-node", "1",
                  "examples/ddp_smoke.py"], env=cluster.client_env())
    assert res.returncode == 255
    assert res.stderr.count("connection refused") == 1, res.stderr
    assert (f"dtrain: error: cannot reach 198.18.0.11:2299 ({hf}:3): connection refused"
            in res.stderr)
    assert "hint: fix it, or leave it out: --exclude 198.18.0.11:2299\n" in res.stderr


def test_smoke_unreachable_host_is_named_as_run_names_it(cluster, hostfile_with_a_dead_port):
    """smoke and run share one prepare phase (job/prepare.py): the same message."""
    hf = hostfile_with_a_dead_port
    res = dtrain(["smoke", "-f", str(hf), "--python", cluster.python],
                 env=cluster.client_env())
    assert res.returncode == 255
    assert res.stderr.count("connection refused") == 1, res.stderr
    assert (f"dtrain: error: cannot reach 198.18.0.11:2299 ({hf}:3): connection refused"
            in res.stderr)
    assert "hint: fix it, or leave it out: --exclude 198.18.0.11:2299\n" in res.stderr


@pytest.mark.torch
def test_torchrun_temp_dirs_are_removed_with_the_job(cluster, tmp_path):
    """torchrun's torchelastic_* log dir lives in the supervisor's private dir (gone after
    the run); the workers keep their own TMPDIR (unset here)."""
    import json
    from pathlib import Path

    res = dtrain(["run", "-H", "node[1-2]", "--python", cluster.python, "--nproc-per-node",
                  "1", "--archive-dir", str(tmp_path / "runs"), "--no-color",
                  "tests/workloads/env_report.py", "TORCHELASTIC_ERROR_FILE", "TMPDIR"],
                 env=cluster.client_env(), timeout=150)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    reports = [json.loads(ln.split("REPORT ", 1)[1]) for ln in res.stdout.splitlines()
               if "REPORT " in ln]
    assert len(reports) == 2
    for report in reports:
        assert report["env"]["TMPDIR"] is None
        error_file = Path(report["env"]["TORCHELASTIC_ERROR_FILE"])
        elastic = next(p for p in error_file.parents if p.name.startswith("torchelastic_"))
        assert elastic.parent.name.startswith("dtrain-"), error_file  # our private dir
        assert not elastic.parent.exists()  # removed with the job (/tmp is shared here)


def test_console_folds_repeated_stderr_and_torchrun_s_shutdown_chatter(cluster, tmp_path):
    """The same warning on 6 ranks is one console line; rank 1's traceback (the root cause)
    is shown; the other nodes' torchrun shutdown chatter is one line per node on the
    console; the archive (`dtrain logs`) keeps every line."""
    runs = tmp_path / "runs"
    res = dtrain(["run", "-H", NODES, "--python", cluster.python, "--nproc-per-node", "2",
                  "--archive-dir", str(runs), "--no-color", "tests/workloads/warn_fail.py"],
                 env=cluster.client_env(), timeout=150)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    console = res.stdout
    warning = "train.py:1: UserWarning: the same warning on every rank"
    assert f"node[1-3] r0-5 [err]: {warning}\n" in console, console
    tagged = [ln for ln in console.splitlines() if not ln.startswith("dtrain:")]
    assert sum(warning in ln for ln in tagged) == 1  # (the summary's stderr tail repeats it)
    assert "node1 r1 [err]: Traceback (most recent call last):\n" in console
    assert "node1 r1 [err]: RuntimeError: boom on purpose\n" in console
    logs = dtrain(["logs", "--archive-dir", str(runs), "--no-color"],
                  env=cluster.client_env())
    assert logs.returncode == 0, logs.stderr
    archived = [ln for ln in logs.stdout.splitlines() if warning in ln]
    whole = dtrain(["logs", "--archive-dir", str(runs), "--json"], env=cluster.client_env())
    assert whole.returncode == 0, whole.stderr
    records = [json.loads(ln) for ln in whole.stdout.splitlines() if ln.startswith("{")]
    assert sorted(ln.split(" [err]")[0] for ln in archived if not ln.startswith("dtrain:")) \
        == [f"node{r // 2 + 1} r{r}" for r in range(6)]  # every rank's line, individually
    # torchrun's shutdown chatter: every stopped agent says it (the supervisor gives an agent
    # whose ranks have all exited its own grace to leave by itself), and the console folds
    # it into one line per node, never the raw lines
    for node in ("node2", "node3"):
        assert re.search(rf"^dtrain: {node}: torchrun shutting down \(\d+ lines? in the "
                         r"archive\)$", console, re.M), console
        assert not re.search(rf"^{node} \[err\]: .*(death signal|closing signal)", console,
                             re.M), console
        # `dtrain logs` folds it as the console did (issue 40); the archive keeps every line,
        # which `logs --json` gives whole
        assert not re.search(rf"^{node} \[err\]: .*Received 15 death signal", logs.stdout,
                             re.M), logs.stdout
        assert any(r.get("host") == node and "Received 15 death signal" in r.get("line", "")
                   for r in records), node
