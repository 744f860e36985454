"""Values someone else chose (a directory name on a shared filesystem, an interpreter path,
a hostfile's python=) reach the nodes as data, never as shell code (issue 11)."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from launcher.errors import HostfileError
from launcher.hosts.hostfile import parse_hostfile_text, parse_hostfile_yaml
from tests.util import REPO, dtrain

SCRIPT = "import os, sys\nprint('CWD=' + os.getcwd(), flush=True)\n"


def test_expand_home_is_the_probes_home():
    from launcher.decide.runplan.plan import expand_home

    assert expand_home("~/venv/bin/python", "/home/u") == "/home/u/venv/bin/python"
    assert expand_home("~", "/home/u/") == "/home/u/"
    assert expand_home("/opt/py ~/x", "/home/u") == "/opt/py ~/x"
    assert expand_home("~/py", None) == "~/py"


@pytest.mark.parametrize("value", ["py\x1bthon", "~root/bin/python", "-c"])
def test_hostfile_python_gets_the_same_rules(value):
    with pytest.raises(HostfileError, match="^hosts.txt:2: invalid python"):
        parse_hostfile_text(f"node1\nnode2 python={value}\n", "hosts.txt")
    with pytest.raises(HostfileError, match=r"^h.yaml:3: hosts\[1\].python: invalid python"):
        escaped = value.encode("unicode_escape").decode()  # YAML's "\x1b" is ESC
        parse_hostfile_yaml(f'hosts:\n- node1\n- {{host: node2, python: "{escaped}"}}\n',
                            "h.yaml")


@pytest.mark.parametrize(("args", "origin"), [
    (["exec", "--python", "py\nthon", "--", "true"], "--python"),
    (["doctor", "--python", "py\x00thon"], None),  # argv cannot carry NUL: the OS refuses
    (["run", "--python", "py\x1b]0;x\x07", "t.py"], "--python"),
    (["run", "--workdir", "/tmp/a\nb", "t.py"], "--workdir"),
    (["run", "--workdir", "/tmp/a\x1b[2Jb", "t.py"], "--workdir"),
])
def test_control_characters_exit_2_naming_the_origin(args, origin):
    if origin is None:
        return
    res = dtrain([*args[:1], "-H", "198.18.0.250", *args[1:]], timeout=30)
    assert res.returncode == 2, res.stderr
    assert f"{origin}: " in res.stderr and "control character" in res.stderr
    assert "Traceback" not in res.stderr


def test_current_directory_with_a_newline_exits_2(tmp_path):
    odd = tmp_path / "a\nb"
    odd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = dtrain(["run", "-H", "198.18.0.250", "t.py"], cwd=odd, env=env, timeout=30)
    assert res.returncode == 2, res.stderr
    assert "the current directory (the default --workdir): " in res.stderr


# -- on the cluster ---------------------------------------------------------------------------

def _hostile(shared: Path) -> tuple[Path, list[str]]:
    tag = uuid.uuid4().hex[:8]
    pwned = shared / f"pwned-{tag}"
    return pwned, [f'{shared}/x-{tag}"; id > {pwned}; #', f"{shared}/$(touch {pwned})-{tag}"]


@pytest.mark.ssh
def test_exec_with_a_hostile_missing_python_names_it_and_runs_nothing(cluster):
    pwned, names = _hostile(cluster.shared_dir)
    for name in names:
        res = dtrain(["exec", "-H", "node[1-2]", "--python", name, "--", "true"],
                     env=cluster.client_env(), timeout=60)
        assert res.returncode != 0
        assert f"{name} not found on this node" in res.stderr, res.stderr
        assert not pwned.exists(), name


@pytest.mark.ssh
def test_exec_one_argument_starting_with_dash_is_a_command(cluster):
    res = dtrain(["exec", "-H", "node1", "--", "-x"], env=cluster.client_env(), timeout=60)
    assert res.returncode == 127, res.stdout + res.stderr
    assert "-x: command not found" in res.stdout + res.stderr


@pytest.mark.ssh
@pytest.mark.torch
def test_run_works_in_hostile_directories_and_nothing_else_runs(cluster, tmp_path):
    pwned, names = _hostile(cluster.shared_dir)
    try:
        for i, name in enumerate(names):
            os.makedirs(name)
            Path(name, "cwd.py").write_text(SCRIPT)
            args = ["run", "-H", "node[1-2]", "--python", cluster.python, "--nproc-per-node",
                    "1", "--archive-dir", str(tmp_path / "runs"), "--no-color"]
            if i == 0:  # given with --workdir
                res = dtrain([*args, "--workdir", name, "cwd.py"], env=cluster.client_env(),
                             timeout=150)
            else:  # the default: the launcher's current directory
                env = cluster.client_env(PYTHONPATH=str(REPO))
                res = dtrain([*args, "cwd.py"], env=env, cwd=Path(name), timeout=150)
            assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
            assert res.stdout.count(f"CWD={name}\n") == 2, res.stdout
            assert not pwned.exists(), name
            # where it does not exist, the name is shown as it is and nothing starts
            missing = name + "-missing"
            res = dtrain([*args, "--workdir", missing, "cwd.py"], env=cluster.client_env(),
                         timeout=150)
            assert res.returncode == 1 and f"working directory {missing} does not exist" \
                in res.stderr, res.stderr
            assert not pwned.exists(), name
    finally:
        for name in names:
            top = Path(name).relative_to(cluster.shared_dir).parts[0]
            shutil.rmtree(cluster.shared_dir / top, ignore_errors=True)
        pwned.unlink(missing_ok=True)


@pytest.mark.ssh
@pytest.mark.torch
def test_tilde_means_the_remote_home_for_probe_cd_and_torchrun(cluster, tmp_path):
    made = []
    try:
        for k in (1, 2):
            home = cluster.node(k).home
            (home / "dt wd").mkdir(exist_ok=True)
            (home / "dt wd" / "cwd.py").write_text(
                SCRIPT + "print('EXE=' + sys.executable, flush=True)\n")
            # the interpreter's whole tree, not the executable alone: a venv's python started
            # through a bare symlink finds no pyvenv.cfg beside it, runs as the base
            # interpreter and has no torch (README command 1 leaves such a venv active)
            link = home / "dt-py"
            link.unlink(missing_ok=True)
            os.symlink(Path(cluster.python).parent.parent, link)
            for p in (home / "dt wd", home / "dt wd" / "cwd.py"):
                os.chown(p, home.stat().st_uid, home.stat().st_gid)
            os.lchown(link, home.stat().st_uid, home.stat().st_gid)
            made.append(home)
        exe = Path(cluster.python).name
        args = ["run", "-H", "node[1-2]", "--python", f"~/dt-py/bin/{exe}", "--workdir", "~/dt wd",
                "--nproc-per-node", "1", "--archive-dir", str(tmp_path / "runs"), "--no-color",
                "cwd.py"]
        res = dtrain([*args[:-1], "--dry-run", "cwd.py"], env=cluster.client_env(),
                     timeout=150)
        assert res.returncode == 0, res.stderr
        assert f"command: /home/dtuser/dt-py/bin/{exe} -m torch.distributed.run" in res.stdout
        res = dtrain(args, env=cluster.client_env(), timeout=150)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert res.stdout.count("CWD=/home/dtuser/dt wd\n") == 2, res.stdout
    finally:
        for home in made:
            shutil.rmtree(home / "dt wd", ignore_errors=True)
            (home / "dt-py").unlink(missing_ok=True)
