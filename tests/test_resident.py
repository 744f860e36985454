"""Warm starts (launcher/start.py, launcher/cli/resident.py, docs/connections.md): with a
keeper up, `dtrain exec` and `dtrain cp` run in a child of the resident, with this process's
streams, argv, environment, working directory and umask, and end as that child ends. Against
the real-sshd cluster: the output, exit codes and signals are a fresh process's; a killed
client kills its child and tears the nodes down; other code and other users are refused."""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.util import REPO, assert_exit, dtrain, end_pid, pid_alive, wait_until

pytestmark = pytest.mark.ssh



def _keeper(env: dict[str, str]) -> dict | None:
    res = dtrain(["connections", "--json"], env={**env, "DTRAIN_RESIDENT": "0"})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["keeper"]



def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _serving(env: dict[str, str]) -> bool:
    """The keeper's resident is up and has said so in its directory."""
    from launcher.start import ABOUT_NAME, socket_dir

    pid = (_keeper(env) or {}).get("resident")
    try:
        about = json.loads((Path(socket_dir(env, os.getuid())) / ABOUT_NAME).read_text())
    except (OSError, ValueError):
        return False
    return bool(pid) and about.get("pid") == pid


@pytest.fixture
def warm(cluster) -> Iterator[dict[str, str]]:
    """A client environment with its own runtime directory, whose keeper (and so its
    resident) is up and serving; both are ended afterwards (by pid, failing all else)."""
    runtime = Path(cluster.shared_dir) / f"resident-{uuid.uuid4().hex[:8]}"
    runtime.mkdir(mode=0o700)
    env = cluster.client_env(XDG_RUNTIME_DIR=str(runtime), DTRAIN_PERSIST="1m")
    res = dtrain(["exec", "-H", "node[1-2]", "--", "true"], env=env)
    assert res.returncode == 0, res.stderr
    wait_until(lambda: _serving(env), what="the resident")
    yield env
    keeper = _keeper(env) or {}
    dtrain(["connections", "close"], env={**env, "DTRAIN_RESIDENT": "0"})
    for pid in (keeper.get("pid"), keeper.get("resident")):
        if pid:
            end_pid(pid)
    subprocess.run(["rm", "-rf", str(runtime)], check=False)


def _importtime(args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", *args],
                          env=env, cwd=kw.pop("cwd", REPO), capture_output=True, text=True,
                          timeout=60, **kw)


def test_a_warm_exec_runs_in_the_residents_child_as_a_fresh_process_would(warm):
    resident = (_keeper(warm) or {})["resident"]
    before = set(_children(resident))
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node[1-2]", "--",
                             "sleep 1; hostname; echo err >&2; exit 3"], env=warm, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: set(_children(resident)) - before or proc.poll() is not None,
          what="the command to start")
    assert set(_children(resident)) - before, "the command did not run in the resident's child"
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert sorted(out.splitlines()) == ["node1: node1", "node2: node2"]
    assert "node1: err" in err and "exit 3" in err
    # DTRAIN_RESIDENT=0: an ordinary start, the same answer
    cold = dtrain(["exec", "-H", "node[1-2]", "--", "hostname; echo err >&2; exit 3"],
                  env={**warm, "DTRAIN_RESIDENT": "0"})
    assert cold.returncode == 3, cold.stderr
    assert sorted(cold.stdout.splitlines()) == sorted(out.splitlines())
    assert sorted(cold.stderr.splitlines()) == sorted(err.splitlines())


def test_a_client_in_another_python_setup_starts_normally(warm, tmp_path: Path):
    """-X importtime, or a sitecustomize that watches the process (tests/util.dial_watch):
    the resident would run the command without them, so the client does not even connect."""
    res = _importtime(["exec", "-H", "node1", "-v", "--", "hostname"], warm)
    assert res.returncode == 0 and res.stdout == "node1: node1\n", res.stderr
    assert "| typer" in res.stderr  # this process imported the CLI itself
    assert res.stderr.count("an ordinary start (the resident: it runs another dtrain or "
                            "another Python setup)") == 1
    from tests.util import dial_watch

    env, log = dial_watch(warm, tmp_path / "site")
    res = dtrain(["exec", "-H", "node1", "--", "hostname"], env=env)
    assert res.returncode == 0 and res.stdout == "node1: node1\n", res.stderr
    dials = log.read_text()
    assert "resident.sock" not in dials and "keeper.sock" in dials, dials  # watched: itself


def test_a_warm_cp_copies_and_reports_as_an_ordinary_one(warm, cluster, tmp_path: Path):
    import re

    src = tmp_path / "tree"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("payload\n")
    remote = f"resident-cp-{uuid.uuid4().hex[:8]}"
    args = ["cp", "-H", "node[1-2]", "--no-progress", "-r", str(src), f"~/{remote}/"]
    try:
        res = dtrain(args, env=warm)
        assert res.returncode == 0, res.stderr
        for n in cluster.nodes[:2]:
            assert (n.home / remote / "tree/d/f.txt").read_text() == "payload\n"
        # again, unchanged: skipped, and said as an ordinary start says it (times aside)
        again = dtrain(args, env=warm)
        plain = dtrain(args, env={**warm, "DTRAIN_RESIDENT": "0"})
        assert again.returncode == plain.returncode == 0, again.stderr + plain.stderr

        def shape(text: str) -> str:
            return re.sub(r"\d+(\.\d+)?", "N", text)

        assert shape(again.stdout + again.stderr) == shape(plain.stdout + plain.stderr)
        assert "skipped" in (again.stdout + again.stderr) or "unchanged" in \
            (again.stdout + again.stderr), again.stderr
    finally:
        for n in cluster.nodes[:2]:
            subprocess.run(["rm", "-rf", str(n.home / remote)], check=False)


def _shape(doc: object) -> object:
    """A JSON document without its measurements (numbers and times vary run to run)."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(v) for v in doc]
    return type(doc).__name__ if isinstance(doc, int | float) and not isinstance(doc, bool) \
        else doc


@pytest.mark.parametrize("args", [
    ["doctor", "-H", "node[1-2]", "--json"],
    ["top", "-H", "node[1-2]", "--once", "--json"],
], ids=["doctor", "top --once"])
def test_doctor_and_top_once_answer_as_an_ordinary_start(warm, args: list[str]):
    import re

    served = dtrain(args, env=warm)
    plain = dtrain(args, env={**warm, "DTRAIN_RESIDENT": "0"})
    assert served.returncode == plain.returncode, served.stderr + plain.stderr
    one, two = json.loads(served.stdout), json.loads(plain.stdout)
    assert one["schema"] == two["schema"]
    times = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+\S*|\d+(\.\d+)?")
    assert times.sub("N", json.dumps(_shape(one), sort_keys=True)) == \
        times.sub("N", json.dumps(_shape(two), sort_keys=True))


def test_only_one_shot_commands_are_served() -> None:
    from launcher.start import resident_may_serve

    for argv in (["dtrain", "exec"], ["dtrain", "cp"], ["dtrain", "doctor"],
                 ["dtrain", "stacks"], ["dtrain", "top", "-H", "n1", "--once"]):
        assert resident_may_serve(argv), argv
    for argv in (["dtrain"], ["dtrain", "run"], ["dtrain", "smoke"], ["dtrain", "top"],
                 ["dtrain", "keys", "setup"], ["dtrain", "attach"], ["dtrain", "--help"],
                 ["dtrain", "logs"], ["dtrain", "image", "push"]):
        assert not resident_may_serve(argv), argv


def test_usage_errors_json_and_help_come_from_the_child(warm):
    assert_exit(dtrain(["exec", "-H", "node1", "--bogus", "--", "true"], env=warm), 2)
    res = dtrain(["exec", "-H", "node1", "--json", "--", "echo hi"], env=warm)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"].startswith("dtrain.exec/")
    helped = dtrain(["exec", "--help"], env=warm)
    assert helped.returncode == 0, helped.stderr
    assert "Usage: python -m launcher exec" in helped.stdout  # as started: click's name
    assert helped.stdout == dtrain(["exec", "--help"], env={**warm, "DTRAIN_RESIDENT": "0"}).stdout


def test_the_working_directory_environment_and_umask_are_the_clients(warm, tmp_path: Path):
    (tmp_path / "hosts").write_text("node2\n")  # a relative hostfile: the client's cwd
    config = tmp_path / "config" / "dtrain"
    config.mkdir(parents=True)
    (config / "config.toml").write_text('hostfile = "%s"\n' % (tmp_path / "hosts"))
    res = dtrain(["exec", "-f", "hosts", "--", "hostname"], env=warm, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "node2: node2\n"
    # the environment: the config file found through this client's XDG_CONFIG_HOME
    res = dtrain(["exec", "--", "hostname"], cwd=REPO,
                 env={**warm, "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert res.returncode == 0, res.stderr
    assert res.stdout == "node2: node2\n"
    # the umask: the directory the child makes for the JUnit file has the client's mode
    probe = ("import os,sys,subprocess; os.umask(0o077); sys.exit(subprocess.call("
             "[sys.executable,'-m','launcher',*sys.argv[1:]]))")
    out = tmp_path / "made" / "j.xml"
    res = subprocess.run([sys.executable, "-c", probe, "exec", "-H", "node1", "--junit",
                          str(out), "--", "true"], env=warm, cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert out.exists()
    assert out.parent.stat().st_mode & 0o777 == 0o700


def test_ctrl_c_reaches_the_child_and_exits_130(warm, cluster):
    marker = f"resident-int-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node1", "--",
                             f"exec -a {marker} sleep 300"], env=warm, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: cluster.node_pids(1, match=marker), what="the remote command")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Ctrl-C" in err
        wait_until(lambda: not cluster.node_pids(1, match=marker), timeout=30,
              what="the remote command to stop")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_client_kills_its_child_and_the_nodes_tear_down(warm, cluster):
    resident = (_keeper(warm) or {})["resident"]
    marker = f"resident-kill-{uuid.uuid4().hex[:8]}"
    before = set(_children(resident))
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node[1-2]", "--",
                             f"exec -a {marker} sleep 300"], env=warm, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: cluster.node_pids(1, match=marker)
                   and cluster.node_pids(2, match=marker), what="the remote commands")
        new = set(_children(resident)) - before
        assert len(new) == 1, "the command did not run in a child of the resident"
        (child,) = new
        proc.kill()
        proc.wait()
        wait_until(lambda: not pid_alive(child), timeout=10,
                   what="the child to die with its client")
        wait_until(lambda: not (cluster.node_pids(1, match=marker)
                           or cluster.node_pids(2, match=marker)),
              timeout=30, what="the nodes to tear down")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_child_killed_by_a_signal_ends_its_client_by_the_same_signal(warm):
    resident = (_keeper(warm) or {})["resident"]
    before = set(_children(resident))
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node1", "--",
                             "sleep 300"], env=warm, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: set(_children(resident)) - before, what="the child")
        (child,) = set(_children(resident)) - before
        os.kill(child, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _request(sock: Path, req: dict, fds: list[int]) -> dict:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(sock))
    s.sendmsg([json.dumps(req).encode() + b"\n"],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    line = s.makefile("rb").readline()
    s.close()
    return json.loads(line)


def test_other_code_is_refused_and_a_new_resident_takes_over(warm):
    from launcher.start import ABOUT_NAME, SOCKET_NAME, socket_dir

    old = (_keeper(warm) or {})["resident"]
    sock = Path(socket_dir(warm, os.getuid())) / SOCKET_NAME
    about = json.loads((sock.parent / ABOUT_NAME).read_text())
    assert about["pid"] == old
    req = {"argv": ["dtrain", "exec", "--help"], "cwd": "/", "env": {}, "umask": 0o22,
           "package": about["package"], "runtime": about["runtime"], "stamp": "00000000:1",
           "streams": [["utf-8", "strict"]] * 3, "fds": [1]}
    with open(os.devnull, "w") as null:
        reply = _request(sock, req, [null.fileno()])
    assert "other code" in reply.get("refused", ""), reply
    # the refused stamp names this very package: the resident ends, the keeper starts another
    wait_until(lambda: not pid_alive(old), what="the stale resident to end")
    wait_until(lambda: (_keeper(warm) or {}).get("resident") not in (None, old)
          and _serving(warm), what="a new resident")
    res = dtrain(["exec", "-H", "node1", "--", "hostname"], env=warm)
    assert res.returncode == 0 and res.stdout == "node1: node1\n", res.stderr


def test_a_bad_request_is_refused_and_the_resident_goes_on(warm):
    from launcher.start import SOCKET_NAME, socket_dir

    sock = Path(socket_dir(warm, os.getuid())) / SOCKET_NAME
    with open(os.devnull, "w") as null:
        reply = _request(sock, {"argv": "exec", "fds": [1]}, [null.fileno()])
        assert reply["refused"].startswith("bad request"), reply
        reply = _request(sock, {"argv": ["dtrain"], "fds": [0, 1]}, [null.fileno()])
        assert "descriptors" in reply["refused"], reply
    res = dtrain(["exec", "-H", "node1", "--", "hostname"], env=warm)
    assert res.returncode == 0 and res.stdout == "node1: node1\n", res.stderr


def test_only_its_own_user_may_use_the_resident(warm, cluster):
    from launcher.start import SOCKET_NAME, socket_dir

    directory = Path(socket_dir(warm, os.getuid()))
    sock = directory / SOCKET_NAME
    os.chmod(warm["XDG_RUNTIME_DIR"], 0o711)  # the way opened for the test only: the
    os.chmod(directory, 0o711)  # resident's own peer check must still refuse
    os.chmod(sock, 0o666)
    try:
        probe = ("import socket,sys\n"  # refused at once: before any request is read
                 "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                 "print(s.makefile().readline())\n")
        res = subprocess.run(["runuser", "-u", cluster.user, "--", sys.executable, "-c", probe,
                              str(sock)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == {"refused": "not your resident"}
    finally:
        os.chmod(directory, 0o700)
        os.chmod(warm["XDG_RUNTIME_DIR"], 0o700)


def test_the_resident_ends_with_its_keeper(warm):
    keeper = _keeper(warm) or {}
    res = dtrain(["connections", "close"], env=warm)
    assert res.returncode == 0, res.stderr
    wait_until(lambda: not pid_alive(keeper["pid"]), what="the keeper to exit")
    wait_until(lambda: not pid_alive(keeper["resident"]), what="the resident to exit")
    # no keeper: an ordinary start says so with -v only when a socket was there to try
    res = dtrain(["exec", "-H", "node1", "-v", "--persist", "off", "--", "hostname"],
                 env=warm)
    assert res.returncode == 0 and res.stdout == "node1: node1\n", res.stderr
    assert "resident" not in res.stderr


def test_a_resident_whose_keeper_died_while_it_started_ends(tmp_path: Path) -> None:
    """The keeper SIGKILLed while its resident still imports: the resident must not take
    its new parent (init) for its keeper and serve forever (it did, found after
    test_keeper's SIGKILLed keeper left two behind)."""
    directory = tmp_path / "dtrain"
    directory.mkdir(mode=0o700)
    keeper = ("import os, subprocess, sys\n"
              "p = subprocess.Popen([sys.executable, '-P', '-m', 'launcher.cli.resident',"
              " '--dir', sys.argv[1], '--keeper', str(os.getpid())], cwd='/',"
              " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              "print(p.pid, flush=True)\n"
              "os._exit(0)\n")  # gone before the resident's imports end
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", keeper, str(directory)], env=env,
                         capture_output=True, text=True, timeout=60)
    pid = int(res.stdout)
    try:
        wait_until(lambda: not pid_alive(pid) or _zombie(pid), timeout=20,
                   what="the orphaned resident to end")
    finally:
        if pid_alive(pid) and not _zombie(pid):
            os.kill(pid, signal.SIGKILL)
    assert not (directory / "resident.sock").exists()


def _zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True


class _FakeResident:
    """A resident of the test's own: a socket and resident.json that match this process,
    answering each request after ``delay`` with ``replies`` (lines), for the client's
    signal handling around the request."""

    def __init__(self, runtime_dir: Path, replies: list[dict], delay: float) -> None:
        import threading

        import launcher
        from launcher.start import ABOUT_NAME, SOCKET_NAME, code_stamp, runtime

        self.dir = runtime_dir / "dtrain"
        self.dir.mkdir(mode=0o700)
        package = os.path.dirname(launcher.__file__)
        (self.dir / ABOUT_NAME).write_text(json.dumps({
            "pid": os.getpid(), "package": package, "stamp": code_stamp(package),
            "runtime": json.loads(json.dumps(runtime(package)))}))
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.dir / SOCKET_NAME))
        self.sock.listen(1)
        self.replies, self.delay = replies, delay
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * 4))
        for reply in self.replies:
            time.sleep(self.delay)
            conn.sendall(json.dumps(reply).encode() + b"\n")
        conn.close()


def test_ctrl_c_before_the_child_is_made_is_130_when_not_served(tmp_path, monkeypatch):
    from launcher.start import serve_here

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    _FakeResident(tmp_path, [{"refused": "for the test"}], delay=0.5)
    threading_timer = __import__("threading").Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    threading_timer.start()
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as exc:
        serve_here(["dtrain", "exec", "--", "true"])
    assert exc.value.code == 130
    assert signal.getsignal(signal.SIGINT) is previous  # the handlers as they were


def test_ctrl_c_before_the_child_is_made_reaches_it(tmp_path, monkeypatch):
    from launcher.start import FORWARDED, serve_here

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake = _FakeResident(tmp_path, [{"pid": stand_in.pid}], delay=0.5)
        fake.replies.append({"status": 0})  # the resident's second line: the child's end
        __import__("threading").Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        before = {name: signal.getsignal(getattr(signal, name))
                  for name in (*FORWARDED, "SIGTSTP")}
        try:
            serve_here(["dtrain", "exec", "--", "true"])
        finally:
            for name, handler in before.items():
                signal.signal(getattr(signal, name), handler)
        assert stand_in.wait(10) == -signal.SIGINT  # the held Ctrl-C was passed on
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()


# ---------------------------------------------------------------------- pure parts, no nodes

def test_the_entry_point_finds_the_keepers_directory(tmp_path: Path) -> None:
    from launcher.start import socket_dir
    from launcher.transports.keeper.frames import keeper_dir

    own = tmp_path / "run"
    own.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    for env in ({}, {"XDG_RUNTIME_DIR": str(own)}, {"XDG_RUNTIME_DIR": str(shared)},
                {"XDG_RUNTIME_DIR": str(tmp_path / "missing")}):
        assert socket_dir(env, os.getuid()) == str(keeper_dir(env, os.getuid())), env


def test_the_code_stamp_changes_with_any_module(tmp_path: Path) -> None:
    from launcher.start import code_stamp

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("a = 1\n")
    (pkg / "sub" / "b.py").write_text("b = 1\n")
    first = code_stamp(str(pkg))
    assert code_stamp(str(pkg)) == first
    (pkg / "sub" / "b.py").write_text("b = 22\n")
    assert code_stamp(str(pkg)) != first
    second = code_stamp(str(pkg))
    (pkg / "c.py").write_text("")
    assert code_stamp(str(pkg)) != second


def test_the_entry_point_imports_nothing_heavy(tmp_path: Path) -> None:
    """Cold numbers must not get worse: without a resident, the entry point costs a stat
    and no import beyond itself before the CLI's own."""
    os.chmod(tmp_path, 0o700)
    code = ("import sys, launcher.start as s\n"
            "assert s.serve_here(['dtrain', 'exec', '--', 'true']) is None\n")
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                         capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines()
                if line.startswith("import time:")}
    assert "launcher.start" in imported
    assert not {"typer", "asyncio", "launcher.cli", "json", "socket"} & imported, imported


# what a warm command's client imports: all of it before the resident's child runs, on
# every warm exec (docs/connections.md, "Where a warm command's time goes")
WARM_CLIENT_IMPORTS = {"launcher.private", "launcher.text.hops", "json", "socket", "signal",
                       "array", "zlib", "stat"}


def test_the_warm_clients_path_imports_nothing_it_does_not_use() -> None:
    """The entry point's own imports on the warm path, and the package's __init__ before
    them, pull in no typing (launcher/_quiet_import.py used it for annotations only: ~3 ms
    of every warm start), nor any of the CLI's. Run with -S: this box's site-packages .pth
    files import typing themselves, a fresh venv's do not."""
    import ast

    import launcher.start

    tree = ast.parse(Path(launcher.start.__file__).read_text())
    warm = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in (
        "socket_dir", "runtime", "code_stamp", "serve_here", "_read_line", "exit_as")]
    assert len(warm) == 6
    used = {a.name for f in warm for n in ast.walk(f) if isinstance(n, ast.Import)
            for a in n.names}
    used |= {f"{n.module}.{a.name}" for f in warm for n in ast.walk(f)
             if isinstance(n, ast.ImportFrom) for a in n.names}
    assert used <= WARM_CLIENT_IMPORTS | {"launcher"}, used  # a new one: list it, and check it
    code = ("import sys\nimport launcher.start\n"
            f"for m in {sorted(WARM_CLIENT_IMPORTS)!r}: __import__(m)\n"
            "print('\\n'.join(sorted(sys.modules)))\n")
    res = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr
    imported = set(res.stdout.split())
    assert "launcher.start" in imported
    heavy = {"typing", "pathlib", "dataclasses", "inspect", "asyncio", "typer", "threading",
             "subprocess", "launcher.cli", "launcher.transports"}
    assert not heavy & imported, sorted(heavy & imported)
