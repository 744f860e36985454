"""A new user's second month (issue 55): each item as the user met it, without the cluster."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from launcher.output.archive import RunArchive
from launcher.output.runlock import LauncherLock
from tests.util import REPO, assert_exit, dtrain, need_module, need_root


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "SLURM_"))}
    env.pop("WCOLL", None)
    return {**env, "HOME": str(tmp_path), "DTRAIN_CONFIG": "",
            "XDG_STATE_HOME": str(tmp_path / "state"), **extra}


# -- 1. `dtrain top` with no RUN follows the running run, config hostfile or not --------------

def test_top_without_a_run_follows_the_running_run_when_the_config_names_a_hostfile(
        tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    archive = RunArchive.create(runs, "20260101-000000-live")
    archive.update_meta(hosts=["localhost"], world_size=1, state="running",
                        start=time.time() - 30, layout=[{"host": "localhost", "ranks": [0]}])
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    config = tmp_path / "config.toml"
    config.write_text(f'hostfile = "{hosts}"\n')
    lock = LauncherLock.acquire(archive.dir, detached=True)  # the run's launcher: alive
    try:
        res = dtrain(["top", "--once", "--no-gpu", "--archive-dir", str(runs)],
                     env=_env(tmp_path, DTRAIN_CONFIG=str(config)))
        assert_exit(res, 0)
        assert "run 20260101-000000-live" in res.stdout, res.stdout
        # -f names hosts: the cluster view of those hosts, as before
        res = dtrain(["top", "--once", "--no-gpu", "--archive-dir", str(runs), "-f", str(hosts)],
                     env=_env(tmp_path, DTRAIN_CONFIG=str(config)))
        assert_exit(res, 0)
        assert "run 20260101-000000-live" not in res.stdout, res.stdout
    finally:
        lock.release()


# -- 2. `dtrain ps`: a 5 s run's goodput is '-', with the reason under the table ---------------

def _finished(runs: Path, run_id: str, wall: float, highest: int, goodput: float) -> None:
    archive = RunArchive.create(runs, run_id)
    end = time.time() - 60
    archive.update_meta(hosts=["localhost"], world_size=2, state="running", start=end - wall,
                        end=end, exit_code=0, outcome="ok",
                        goodput={"schema": 1, "wall_s": wall, "goodput": goodput,
                                 "running": False, "seconds": {},
                                 "attempts": [{"n": 1, "wall_s": wall, "goodput": goodput,
                                               "seconds": {}, "resumed_at": 0,
                                               "highest_step": highest, "lost_steps": 0}]})


def test_ps_shows_no_goodput_for_a_short_run_and_says_why(tmp_path: Path) -> None:
    import json

    runs = tmp_path / "runs"
    _finished(runs, "20260101-000000-shrt", wall=5.2, highest=9, goodput=0.03)
    _finished(runs, "20260101-000001-long", wall=1800.0, highest=900, goodput=0.874)
    _finished(runs, "20260101-000002-many", wall=40.0, highest=99, goodput=0.6)
    res = dtrain(["ps", "--archive-dir", str(runs)], env=_env(tmp_path))
    assert_exit(res, 0)
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.startswith("2026")}
    assert " 3%" not in rows["20260101-000000-shrt"], res.stdout
    assert rows["20260101-000000-shrt"].split()[-2] == "-", res.stdout
    assert "87%" in rows["20260101-000001-long"] and "60%" in rows["20260101-000002-many"]
    legend = res.stdout.splitlines()[-1]
    assert legend.startswith("GOODPUT -:") and "5 min" in legend and "50 steps" in legend, \
        res.stdout
    res = dtrain(["ps", "--archive-dir", str(runs), "--json"], env=_env(tmp_path))
    doc = {r["run_id"]: r for r in json.loads(res.stdout)["runs"]}
    assert json.loads(res.stdout)["ps_version"] == 1  # an added field keeps the version
    assert (doc["20260101-000000-shrt"]["goodput"],
            doc["20260101-000000-shrt"]["goodput_meaningful"]) == (0.03, False)
    assert doc["20260101-000001-long"]["goodput_meaningful"] is True
    assert doc["20260101-000002-many"]["goodput_meaningful"] is True
    # no short run shown: no legend
    _finished(tmp_path / "long", "20260101-000001-long", wall=1800.0, highest=900, goodput=0.5)
    res = dtrain(["ps", "--archive-dir", str(tmp_path / "long")], env=_env(tmp_path))
    assert "50%" in res.stdout and "GOODPUT -:" not in res.stdout + res.stderr


# -- 3. smoke honours the hostfile's slots= as run does -----------------------------------------

def test_smoke_runs_the_hostfile_s_slots_on_a_cpu_node(tmp_path: Path) -> None:
    need_module("torch")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost slots=2\n")
    res = dtrain(["smoke", "-f", str(hosts), "--archive-dir", str(tmp_path / "runs"),
                  "--max-size", "256K", "--min-busbw", "0.001"], env=_env(tmp_path))
    out = res.stdout + res.stderr
    assert_exit(res, 0)
    assert "world size 2, gloo" in out and "1 node, 2 ranks, gloo" in out, out


def test_a_node_s_rank_count_is_slots_else_the_command_s_default() -> None:
    from launcher.decide.runplan.facts import NodeFacts
    from launcher.decide.runplan.plan import nproc_for
    from launcher.models import Host

    cpu = NodeFacts(gpus=0)
    assert nproc_for(Host("n1", slots=3), cpu, None, default="1") == ("3", 3)
    assert nproc_for(Host("n1"), cpu, None, default="1") == ("1", 1)  # smoke on gloo
    assert nproc_for(Host("n1", slots=3), cpu, "2", default="1") == ("2", 2)


# -- 4. hints that were off -----------------------------------------------------------------------

def test_no_pass_master_addr_hint_when_master_addr_was_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_root("a fake node's own hostname (a UTS namespace)")
    from typer.testing import CliRunner

    from launcher.cli import app
    from launcher.transports.fake import FakeTransport

    monkeypatch.chdir(REPO)

    def dry(*extra: str) -> str:
        # two fake nodes share this machine's network: no master address works between them
        with FakeTransport(own_hostname=True).installed():
            res = CliRunner().invoke(app, ["run", "-H", "n1,n2", "--nproc-per-node", "1",
                                           "--archive-dir", str(tmp_path / "runs"),
                                           "--no-color", "--dry-run", *extra,
                                           "examples/train.py"])
        assert res.exit_code == 1, res.output
        return res.output

    assert "pass --master-addr" in dry()  # chosen by dtrain: the option is the way out
    given = dry("--master-addr", "127.0.0.1")
    assert "pass --master-addr" not in given, given
    assert "--master-addr 127.0.0.1" in given.split("hint:")[1], given


def test_the_ssh_hint_and_host_block_keep_the_user_and_port() -> None:
    from launcher.commands.sshconfig import has_block, host_block, usage_lines
    from launcher.models import Host

    key = Path("/home/me/.config/dtrain/id_ed25519")
    hosts = [Host("login1", user="dtuser", port=2222), Host("gpu01"), Host("gpu02"),
             Host("gpu03", port=2200)]
    hint = usage_lines(key, hosts)[0]
    assert f"ssh -i {key} -p 2222 dtuser@login1;" in hint, hint
    assert f"rsync -e 'ssh -i {key} -p 2222' " in hint, hint
    block = host_block(hosts, key)
    assert (f"Host login1\n    IdentityFile {key}\n    User dtuser\n    Port 2222\n"
            in block), block
    assert f"Host gpu01 gpu02\n    IdentityFile {key}\n" in block, block
    assert f"Host gpu03\n    IdentityFile {key}\n    Port 2200\n" in block, block
    assert has_block(block, ["login1", "gpu01", "gpu02", "gpu03"], key)
    # one name on two ports (the test cluster's 127.0.0.1:2222 and :2223): ssh_config
    # matches names, not ports, so that name gets no Port, and a comment says why
    two = host_block([Host("127.0.0.1", port=2222), Host("127.0.0.1", port=2223)], key)
    assert "Port" not in two.replace("# ", "#").split("#", 2)[-1].split("\n", 1)[1], two
    assert "127.0.0.1" in two and "several ports or users" in two, two


# -- 6. small ones --------------------------------------------------------------------------------

def test_run_help_lists_the_container_group_after_the_everyday_ones(tmp_path: Path) -> None:
    res = dtrain(["run", "--help"], env={**_env(tmp_path), "COLUMNS": "100"})
    assert_exit(res, 0)
    panels = [line.split("─ ", 1)[1].split(" ─")[0] for line in res.stdout.splitlines()
              if line.startswith("╭─ ")]
    assert panels.index("Container") > max(panels.index(p) for p in (
        "Hosts", "Connection", "Node", "Environment", "Launch", "Reports", "Archive")), panels


def _offline(tmp_path: Path, hostfile: str) -> str:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(hostfile)
    res = dtrain(["run", "-f", str(hosts), "--dry-run", "--offline", "-v", "--archive-dir",
                  str(tmp_path / "runs"), "examples/train.py"], env=_env(tmp_path))
    assert_exit(res, 0)
    return res.stdout


def test_the_dry_run_shows_the_flight_recorder_s_file_without_quoting_noise(
        tmp_path: Path) -> None:
    out = _offline(tmp_path, "node1 slots=2\n")
    line = next(ln for ln in out.splitlines() if "TORCH_FR_DUMP_TEMP_FILE=" in ln)
    assert "TORCH_FR_DUMP_TEMP_FILE=<the supervisor's private dir>/flight/rank_  [" in line, line


def test_the_summary_names_the_hostfile_s_python(tmp_path: Path) -> None:
    out = _offline(tmp_path, "node1 python=/opt/venv/bin/python slots=2\n")
    assert "python python3  [built-in default]" not in out, out
    assert "python /opt/venv/bin/python  [hostfile python=]" in out, out
    some = _offline(tmp_path, "node1 python=/opt/venv/bin/python slots=2\nnode2 slots=2\n")
    assert ("python python3  [built-in default; node1: /opt/venv/bin/python, hostfile "
            "python=]") in some, some
    plain = _offline(tmp_path, "node1 slots=2\n")
    assert "python python3  [built-in default]" in plain, plain


def test_help_shows_the_archive_default_under_xdg_state_home(tmp_path: Path) -> None:
    state = tmp_path / "xdg-state"
    for command in (["ps"], ["run"]):
        res = dtrain([*command, "--help"], env={**_env(tmp_path, XDG_STATE_HOME=str(state)),
                                                "COLUMNS": "300"})
        assert_exit(res, 0)
        assert f"default: {state}/dtrain/runs" in res.stdout, res.stdout
        assert "~/.local/state/dtrain/runs" not in res.stdout


def test_pulled_files_land_in_a_directory_without_a_colon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`LOCALDIR/127.0.0.1:2222/` is a remote path to scp and rsync (HOST:PATH): the port
    joins the name with '_' instead (docs/cp.md)."""
    from typer.testing import CliRunner

    from launcher.cli import app
    from launcher.transports.fake import FakeTransport

    src = tmp_path / "src"
    src.mkdir()
    (src / "rank0.log").write_text("loss 1\n")
    monkeypatch.chdir(tmp_path)
    with FakeTransport().installed():
        res = CliRunner().invoke(app, ["cp", "--pull", "-H", "127.0.0.1:2222,node1",
                                       f"{src}/rank0.log", str(tmp_path / "logs")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "logs" / "127.0.0.1_2222" / "rank0.log").read_text() == "loss 1\n"
    assert (tmp_path / "logs" / "node1" / "rank0.log").is_file()
    assert not (tmp_path / "logs" / "127.0.0.1:2222").exists()
