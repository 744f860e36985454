"""The warm process on this machine, without the cluster (docs/warm-start.md), on python3
and python3.8 (node programs are 3.8): the bundle started in warm mode with a stand-in
torch, asked for ranks as a rank shim asks (warmclient.warm_spawn): a rank forked with its own
argv, environment, working directory and descriptors, armed on its arm socket, its exit
code and its signal death reported; a shim that goes away takes its rank with it; a module
that cannot be preloaded: one note on the ranks' socket, the warm process gone, the next
ask answered with None (start cold)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.nodeside import rankshim, warm, warmclient
from tests.util import node_program

RANK = """import sys
WARM = "torch" in sys.modules
import json, os, signal
print(json.dumps({"warm": WARM, "rank": os.environ.get("RANK"), "cwd": os.getcwd(),
                  "argv": sys.argv, "ppid": os.getppid(), "sid": os.getsid(0),
                  "pad": "DTRAIN_WARM_PAD" in os.environ}), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1] == "sleep":
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def _python(which: str) -> str:
    if which == "python3":
        return sys.executable
    exe = next(iter(sorted(Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8"))), None) \
        or shutil.which("python3.8")
    if exe is None:
        from tests.util import cannot_run

        cannot_run("no python3.8 here (scripts/test installs one)")
    return str(exe)


class Node:
    """A private directory with the bundle, the ranks' socket, and one warm process."""

    def __init__(self, tmp_path: Path, exe: str, preload: str = "") -> None:
        fake = tmp_path / "site" / "torch"
        fake.mkdir(parents=True, exist_ok=True)
        (fake / "__init__.py").write_text(
            "class cuda:\n    @staticmethod\n    def is_initialized():\n        return False\n")
        (fake / "distributed").mkdir(exist_ok=True)  # what the warm process imports for the
        (fake / "distributed" / "__init__.py").write_text("")  # agent (warm.AGENT_MODULES)
        (fake / "distributed" / "launcher").mkdir(exist_ok=True)
        (fake / "distributed" / "launcher" / "__init__.py").write_text("")
        (fake / "distributed" / "launcher" / "api.py").write_text("")
        self.dir = tmp_path / "dtrain-x"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        shim = self.dir / "dtrain_shim.py"
        shutil.copy(node_program("supervisor"), shim)
        self.ranks = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # notes and arming
        self.ranks.bind(str(self.dir / "ranks.sock"))
        self.ranks.listen(16)
        self.ranks.settimeout(30)
        self.path = str(self.dir / f"warm{preload}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(16)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
        env.update({"PYTHONPATH": str(tmp_path / "site"), "DTRAIN_RUN_ID": "run-1",
                    warm.WARM_FD_ENV: str(listener.fileno()), warm.PRELOAD_ENV: preload,
                    warm.NOTE_ENV: str(self.dir / "ranks.sock"),
                    warm.PARENT_ENV: str(os.getpid())})
        env[warm.PAD_ENV] = "x" * warm.PAD_BYTES
        self.log = open(tmp_path / "warm.log", "ab")  # closed in stop()
        self.proc = subprocess.Popen([exe, "-u", str(shim), " " * warm.TITLE_ROOM], env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=self.log, pass_fds=(listener.fileno(),))
        listener.close()

    def ask(self, argv: list[str], rank: int) -> tuple[warmclient.WarmRank | None, int]:
        """A rank as a shim starts one: the warm rank and the read end of its stdout."""
        out_r, out_w = os.pipe()
        env = {"PATH": os.environ.get("PATH", ""), "RANK": str(rank), "DTRAIN_RUN_ID": "run-1",
               rankshim.ARM_ENV: str(self.dir / "ranks.sock")}
        with open(os.devnull, "rb") as null:
            child = warmclient.warm_spawn(self.path, argv, env, [null.fileno(), out_w, 2])
        os.close(out_w)
        return child, out_r

    def armed(self) -> dict:
        conn, _ = self.ranks.accept()
        with conn:
            return json.loads(conn.makefile().readline())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.ranks.close()
        self.log.close()


def _end(child: warmclient.WarmRank, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while (code := child.poll()) is None:
        assert time.monotonic() < deadline, "no end reported"
        time.sleep(0.02)
    return code


@pytest.fixture
def sigio():
    """The shim's side takes SIGIO (O_ASYNC): ignored in the test process."""
    old = signal.signal(signal.SIGIO, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGIO, old)


@pytest.mark.parametrize("python", ["python3", "python3.8"])
def test_ranks_forked_with_their_own_and_their_ends_reported(
        tmp_path: Path, monkeypatch, sigio, python: str) -> None:
    node = Node(tmp_path, _python(python))
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    try:
        child, out = node.ask([str(script), "3"], rank=5)
        assert child is not None
        arm = node.armed()  # the forked rank armed itself as a cold one does
        assert (arm["stream"], arm["rank"], arm["pid"]) == ("arm", 5, child.pid)
        assert _end(child) == 3
        said = json.loads(os.read(out, 65536))
        assert said == {"warm": True, "rank": "5", "cwd": str(work),
                        "argv": [str(script), "3"], "ppid": node.proc.pid,
                        "sid": child.pid, "pad": False}
        with open(f"/proc/{node.proc.pid}/cmdline", "rb") as f:
            assert f.read().startswith(b"dtrain warm run-1 ")

        killed, _ = node.ask([str(script), "kill"], rank=6)
        assert killed is not None
        node.armed()
        assert _end(killed) == -signal.SIGKILL

        # the shim goes away (its connection closes): its rank is KILLed, and reaped
        held, _ = node.ask([str(script), "sleep"], rank=7)
        assert held is not None
        node.armed()
        held.sock.close()
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{held.pid}"):
            assert time.monotonic() < deadline, "the rank outlived its shim"
            time.sleep(0.02)
    finally:
        node.stop()


@pytest.mark.parametrize("python", ["python3", "python3.8"])
def test_a_module_that_cannot_be_preloaded_says_so_once_and_leaves(
        tmp_path: Path, sigio, python: str) -> None:
    node = Node(tmp_path, _python(python), preload="dtrain_no_such_module")
    try:
        conn, _ = node.ranks.accept()
        with conn:
            header, note = conn.makefile().read().split("\n", 1)
        assert json.loads(header)["stream"] == "err" and json.loads(header)["rank"] == -1
        assert note == warm.WARM_NOTE % (
            "import dtrain_no_such_module failed: ModuleNotFoundError: No module named "
            "'dtrain_no_such_module'")
        assert node.proc.wait(30) == 0
        assert node.ask(["x.py"], rank=0)[0] is None  # nobody listens: the rank starts cold
    finally:
        node.stop()


AGENT = """import json, os, sys, time
deadline = time.monotonic() + 10
while os.getppid() != int(os.environ["DRIVER"]) and time.monotonic() < deadline:
    time.sleep(0.01)  # reparented once the middle process has exited
print(json.dumps({"argv": sys.argv, "ppid": os.getppid(), "sid": os.getsid(0),
                  "pid": os.getpid(), "warm": "torch" in sys.modules, "cwd": os.getcwd(),
                  "x": os.environ.get("X"), "path0": sys.path[0]}), flush=True)
sys.exit(7)
"""

# a stand-in supervisor: a child subreaper that starts the warm process, then the agent
DRIVER = """import json, os, socket, subprocess, sys
from launcher.nodeside import warm, warmclient
from launcher.nodeside.nodeprocs import set_subreaper
cfg = json.loads(sys.argv[1])
assert set_subreaper()
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(cfg["sock"])
listener.listen(4)
env = dict(cfg["env"], **{warm.WARM_FD_ENV: str(listener.fileno()),
                          warm.PARENT_ENV: str(os.getpid())})
env[warm.PAD_ENV] = "x" * warm.PAD_BYTES
w = subprocess.Popen([cfg["python"], "-u", cfg["shim"], " " * warm.TITLE_ROOM], env=env,
                     stdin=subprocess.DEVNULL, pass_fds=(listener.fileno(),))
listener.close()
agent_env = dict(cfg["env"], X="agent-x", DRIVER=str(os.getpid()))
job, out, err, hand = warmclient.spawn_agent([cfg["python"], "-c", cfg["code"], "a", "b"],
                                             agent_env, cfg["ask"])
result, early, status = {"starter": job, "driver": os.getpid()}, {}, None
while status is None:
    pid, st = os.waitpid(-1, 0)
    if pid == job and hand is not None:
        agent = warmclient.handed_over(hand, st)
        hand, result["agent"] = None, agent
        if agent is None:
            status = st
        else:
            job = agent
            status = early.pop(agent, None)
    elif pid == job:
        status = st
    else:
        early[pid] = st
result["code"] = os.waitstatus_to_exitcode(status)
result["said"] = json.loads(os.read(out, 65536))
w.kill()
w.wait()
print(json.dumps(result))
"""


@pytest.mark.parametrize("python", ["python3", "python3.8"])
@pytest.mark.parametrize("warm_there", [True, False], ids=["warm", "cold"])
def test_the_agent_is_forked_and_becomes_the_supervisors_child(
        tmp_path: Path, python: str, warm_there: bool) -> None:
    """warmclient.spawn_agent: torchrun's agent forked from the warm process, reparented to
    the (subreaper) supervisor, which waits for it as for a child it started: its own
    argv (python -c's), environment, session, working directory and exit code. Without a
    warm process the starter becomes the cold agent itself (the same pid, the same end)."""
    exe = _python(python)
    fake = tmp_path / "site" / "torch"
    (fake / "distributed").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_initialized():\n        return False\n")
    (fake / "distributed" / "__init__.py").write_text("")
    (fake / "distributed" / "launcher").mkdir(exist_ok=True)
    (fake / "distributed" / "launcher" / "__init__.py").write_text("")
    (fake / "distributed" / "launcher" / "api.py").write_text("")
    private = tmp_path / "dtrain-x"
    private.mkdir(mode=0o700)
    shim = private / "dtrain_shim.py"
    shutil.copy(node_program("supervisor"), shim)
    sock = str(private / "warm.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    env.update({"PYTHONPATH": str(tmp_path / "site"), "DTRAIN_RUN_ID": "run-1",
                warm.PRELOAD_ENV: "", warm.NOTE_ENV: ""})
    cfg = {"sock": sock, "ask": sock if warm_there else str(private / "nobody.sock"),
           "env": env, "python": exe, "shim": str(shim), "code": AGENT}
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cfg)], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=repo), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    said = result["said"]
    assert result["code"] == 7
    assert said["argv"] == ["-c", "a", "b"] and said["x"] == "agent-x"
    assert said["cwd"] == str(tmp_path) and said["path0"] == ""
    assert said["sid"] == said["pid"]  # a session of its own, as spawn's child
    assert said["ppid"] == result["driver"]  # the supervisor's child, whoever forked it
    if warm_there:
        assert said["warm"] is True  # forked: torch was imported already
        assert result["agent"] == said["pid"] != result["starter"]
    else:
        assert said["warm"] is False
        assert result["agent"] is None and said["pid"] == result["starter"]


def test_the_node_sessions_directory_is_the_users_alone(tmp_path: Path) -> None:
    """nodesession.session_dir: made 0700 when missing; refused (None) when what is there is
    a symbolic link, not a directory, another user's, or open to others; never changed."""
    from launcher.nodeside import nodesession

    uid = os.getuid()
    made = nodesession.session_dir(str(tmp_path), uid)
    assert made == str(tmp_path / f"dtrain-{uid}")
    assert os.stat(made).st_mode & 0o777 == 0o700
    assert nodesession.session_dir(str(tmp_path), uid) == made  # ours: used again
    os.chmod(made, 0o755)
    assert nodesession.session_dir(str(tmp_path), uid) is None  # others may read it
    assert os.stat(made).st_mode & 0o777 == 0o755  # left as it was
    other = tmp_path / "other"
    other.mkdir()
    for name, make in (("link", lambda p: p.symlink_to(other)),
                       ("file", lambda p: p.write_text(""))):
        base = tmp_path / name
        base.mkdir()
        make(base / f"dtrain-{uid}")
        assert nodesession.session_dir(str(base), uid) is None, name
    assert nodesession.session_dir(str(tmp_path), uid + 1) is None  # someone else's uid
    # one socket per run and host: a /tmp that several nodes share keeps them apart
    a = nodesession.session_path(made, "run-1", "node1")
    assert a != nodesession.session_path(made, "run-1", "node2")
    assert a != nodesession.session_path(made, "run-2", "node1")
    assert len(a.encode()) < 100  # an AF_UNIX path
