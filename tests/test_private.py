"""The login node's other users (docs/threat-model.md, launcher/private.py): a second local
user, `dtrain-intruder`, attacks every place dtrain keeps on the login node.

The attacks run as that user through `runuser` with Debian's /usr/bin/python3, as a real
second account would. Each one failed on c033402 (issue 50): a resident pre-made in
/tmp/dtrain-keeper-UID was handed the command's environment, argv and terminal and decided
its exit status.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher import private
from launcher.exitcodes import EXIT_UNREACHABLE
from tests.util import INTRUDER, REPO, SYSTEM_PYTHON, dtrain, end_pid, pid_alive


def as_intruder(code: str, *args: str) -> subprocess.Popen[str]:
    """A program of the second user's, started in the background."""
    return subprocess.Popen(["runuser", "-u", INTRUDER, "--", SYSTEM_PYTHON, "-c", code, *args],
                            cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# The fake resident the review used: it takes the request (environment, argv, descriptors),
# keeps it, and ends the command with "exit 0" without running it.
FAKE_RESIDENT = r"""
import json, os, socket, sys
directory, about, record = sys.argv[1], sys.argv[2], sys.argv[3]
sock_path = os.path.join(directory, "resident.sock")
listener = socket.socket(socket.AF_UNIX)
listener.bind(sock_path)
os.chmod(sock_path, 0o777)
listener.listen(8)
with open(os.path.join(directory, "resident.json"), "w") as fh:
    fh.write(about)
os.chmod(os.path.join(directory, "resident.json"), 0o644)
print("ready", flush=True)
while True:
    conn, _ = listener.accept()
    data = conn.recv(1 << 20)
    with open(record, "ab") as fh:
        fh.write(data)
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    conn.sendall(json.dumps({"status": 0}).encode() + b"\n")
    conn.close()
"""


def _about_for_victim(env: dict[str, str]) -> str:
    """resident.json as the victim's own dtrain would accept it (an attacker can compute
    it: the package is world-readable)."""
    code = ("import json, os, launcher\n"
            "from launcher.start import code_stamp, runtime\n"
            "pkg = os.path.dirname(launcher.__file__)\n"
            "print(json.dumps({'pid': 1, 'package': pkg, 'runtime': runtime(pkg),"
            " 'stamp': code_stamp(pkg)}))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return res.stdout.strip()


@pytest.fixture
def victim_tmp_dir() -> Iterator[Path]:
    """/tmp/dtrain-keeper-UID, free for the attacker to make (an earlier test's own
    directory is put aside meanwhile and put back)."""
    path = Path(f"/tmp/dtrain-keeper-{os.getuid()}")
    aside = None
    if os.path.lexists(path):
        aside = path.with_name(f"{path.name}.aside-{uuid.uuid4().hex[:8]}")
        path.rename(aside)
    try:
        yield path
    finally:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        if aside is not None:
            aside.rename(path)


@pytest.fixture
def lair(intruder) -> Iterator[Path]:
    """A directory of the intruder's own in /tmp (pytest's tmp_path is root's alone)."""
    path = Path(f"/tmp/dtrain-test-lair-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o755)
    os.chown(path, intruder.pw_uid, intruder.pw_gid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _victim_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    env.pop("XDG_RUNTIME_DIR", None)  # cron, su, sudo, Slurm jobs: the /tmp fallback
    env["HF_TOKEN"] = "hf_SECRET_" + uuid.uuid4().hex
    return env


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_a_fake_resident_of_another_user_gets_nothing(intruder, victim_tmp_dir, lair, how):
    env = _victim_env()
    about = _about_for_victim(env)
    record = lair / "record"
    if how == "directory":
        # made by the intruder itself, as in /tmp anyone may
        subprocess.run(["runuser", "-u", INTRUDER, "--", "mkdir", "-m", "755",
                        str(victim_tmp_dir)], check=True, timeout=30)
        home = victim_tmp_dir
    else:  # a link in /tmp to a directory the intruder owns
        home = lair / "home"
        subprocess.run(["runuser", "-u", INTRUDER, "--", "mkdir", "-m", "700", str(home)],
                       check=True, timeout=30)
        subprocess.run(["runuser", "-u", INTRUDER, "--", "ln", "-s", str(home),
                        str(victim_tmp_dir)], check=True, timeout=30)
    fake = as_intruder(FAKE_RESIDENT, str(home), about, str(record))
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "ready", \
            fake.stderr.read() if fake.stderr else ""
        res = dtrain(["exec", "-H", "localhost", "--", "echo", "ran-for-real"], env=env)
    finally:
        fake.kill()
        fake.wait(10)
    assert not record.exists() or record.read_bytes() == b"", \
        "the fake resident was handed the command"
    assert res.returncode == 0 and res.stdout == "localhost: ran-for-real\n", res.stderr
    assert re.search(rf"warning: {victim_tmp_dir} is not used: .*(belongs to uid "
                     rf"{intruder.pw_uid}|symbolic link)", res.stderr), res.stderr
    assert env["HF_TOKEN"] not in res.stderr


def test_a_socket_of_another_user_is_refused_before_a_byte_is_sent(intruder, lair):
    """The peer check itself (client side), through the helper and the keeper client: each
    asks the kernel who listens."""
    sock_path = lair / "s.sock"
    record = lair / "record"
    server = as_intruder(
        "import socket, sys, os\n"
        "l = socket.socket(socket.AF_UNIX); l.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777)\n"
        "l.listen(8); print('ready', flush=True)\n"
        "while True:\n"
        "    c, _ = l.accept(); c.settimeout(1)\n"
        "    try: d = c.recv(65536)\n"
        "    except OSError: d = b''\n"
        "    open(sys.argv[2], 'ab').write(d); c.close()\n", str(sock_path), str(record))
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        with pytest.raises(private.NotPrivate, match="belongs to uid"):
            private.connect_private(str(sock_path), timeout=2)
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(str(sock_path))  # connected: the peer check alone must refuse it
        assert re.search(rf"runs as uid {intruder.pw_uid}, not as you", private.peer_is_me(raw)
                         or "")
        raw.close()

        import asyncio

        from launcher.transports.keeper import client

        with pytest.raises(client.KeeperUnavailable, match=f"uid {intruder.pw_uid}"):
            asyncio.run(client.call(sock_path, {"op": "ping", "secret": "KEEPER-SECRET"}))
        time.sleep(1.2)
    finally:
        server.kill()
        server.wait(10)
    assert not record.exists() or b"SECRET" not in record.read_bytes()


def test_read_private_refuses_links_others_files_and_open_modes(intruder, tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    mine.chmod(0o600)
    assert private.read_private(mine, 100) == b"{}"
    link = tmp_path / "link.json"
    link.symlink_to(mine)
    with pytest.raises(private.NotPrivate, match="symbolic link"):
        private.read_private(link, 100)
    theirs = tmp_path / "theirs.json"
    theirs.write_text("{}")
    os.chown(theirs, intruder.pw_uid, intruder.pw_gid)
    with pytest.raises(private.NotPrivate, match=f"belongs to uid {intruder.pw_uid}"):
        private.read_private(theirs, 100)
    loose = tmp_path / "loose.json"
    loose.write_text("{}")
    loose.chmod(0o666)
    with pytest.raises(private.NotPrivate, match="writable by others"):
        private.read_private(loose, 100)
    with pytest.raises(FileNotFoundError):
        private.read_private(tmp_path / "none", 100)


def test_private_dir_refuses_others_links_and_open_modes(intruder, tmp_path):
    d = tmp_path / "d"
    assert private.private_dir(d, create=True) is None and (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o755)
    assert "open to others" in (private.private_dir(d, create=False) or "")
    d.chmod(0o700)
    os.chown(d, intruder.pw_uid, intruder.pw_gid)
    assert f"belongs to uid {intruder.pw_uid}" in (private.private_dir(d, create=False) or "")
    os.chown(d, 0, 0)
    link = tmp_path / "l"
    link.symlink_to(d)
    assert "symbolic link" in (private.private_dir(link, create=False) or "")


def test_a_resident_naming_a_pid_that_is_not_its_child_gets_no_signal(tmp_path, monkeypatch):
    """A resident of this user's that names any process (here one of our own) as its child:
    the entry point refuses it, and forwards nothing."""
    from launcher.start import serve_here
    from tests.test_resident import _FakeResident

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    # a process that is not the resident's child (nor this test's: its parent has left)
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], text=True,
                         capture_output=True, check=True, timeout=30)
    bystander = int(out.stdout)
    try:
        fake = _FakeResident(tmp_path, [{"pid": bystander}], delay=0.0)
        fake.replies.append({"status": 0})
        status = serve_here(["dtrain", "exec", "--", "true"])
        assert status == EXIT_UNREACHABLE << 8
        assert pid_alive(bystander)  # nothing was sent to it
    finally:
        end_pid(bystander)


# --------------------------------------------------------------- the rule, kept by a test

ALLOWED_RAW = {  # module -> why it may open or check unix sockets without launcher/private.py
    "launcher/private.py": "the helper itself",
    "launcher/nodeside/nodecommon.py": "a node program (stdlib only, shipped to the node): "
                                       "the rank's socket to its supervisor, on the node",
    "launcher/nodeside/rankshim.py": "a node program: the rank side of that socket",
    "launcher/nodeside/supervisor.py": "a node program: the supervisor side of that socket",
    "launcher/nodeside/warm.py": "a node program: the warm process's socket in the "
                                 "supervisor's private directory (0700) and the rank shim's "
                                 "side of it, each peer's uid checked (SO_PEERCRED)",
    "launcher/nodeside/warmclient.py": "a node program: the clients of that socket (the rank "
                                       "shim, the supervisor's agent starter), the peer's uid "
                                       "checked (SO_PEERCRED)",
    "launcher/nodeside/nodesession.py": "a node program: the node session's socket in this "
                                        "user's directory (0700, lstat-checked), each peer's "
                                        "uid checked (SO_PEERCRED) on both ends",
}
UNIX_SOCKET = re.compile(r"socket\.AF_UNIX|open_unix_connection\(|start_unix_server\(|"
                         r"socket\.SO_PEERCRED")


def test_every_unix_socket_goes_through_the_private_helper() -> None:
    """A module of the login node's side that opens a unix socket imports launcher.private;
    SO_PEERCRED is read only there (one helper per boundary: docs/threat-model.md)."""
    bad = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text()
        if not UNIX_SOCKET.search(text) or rel in ALLOWED_RAW:
            continue
        if "socket.SO_PEERCRED" in text:
            bad.append(f"{rel}: reads SO_PEERCRED itself (use private.peer_uid_pid)")
        if "from launcher import private" not in text:
            bad.append(f"{rel}: opens a unix socket without launcher/private.py")
    assert bad == []


def test_the_rule_sees_a_raw_socket(tmp_path) -> None:
    """The scan above is not blind: the pattern it looks for is in a module it covers."""
    assert UNIX_SOCKET.search((REPO / "launcher/job/control.py").read_text())
    assert "from launcher import private" in (REPO / "launcher/job/control.py").read_text()
    assert not UNIX_SOCKET.search(json.dumps({"x": "no socket here"}))


def test_the_health_gate_s_xid_file_is_never_written_through_another_users_place(
        intruder, lair):
    """The state directory's Xid file (commands/health.py): a state directory of another
    user's gets nothing, and a link planted at the file is not read."""
    from launcher.commands.health import load_xids, save_xids

    theirs = lair / "state"  # the intruder's, as XDG_STATE_HOME pointed into /tmp would be
    subprocess.run(["runuser", "-u", INTRUDER, "--", "mkdir", "-m", "777", str(theirs)],
                   check=True, timeout=30)
    save_xids({"node1": ["Xid 79"]}, theirs)
    assert list(theirs.iterdir()) == []
    planted = lair / "planted.json"
    planted.write_text('{"version": 1, "hosts": {"node9": ["Xid 48"]}}')
    mine = Path(f"/tmp/dtrain-test-state-{uuid.uuid4().hex[:8]}")
    mine.mkdir(mode=0o700)
    try:
        (mine / "health-xids.json").symlink_to(planted)
        assert load_xids(mine) == {}  # a link is as good as no file
        (mine / "health-xids.json").unlink()
        save_xids({"node1": ["Xid 79"]}, mine)
        assert load_xids(mine) == {"node1": ["Xid 79"]}
    finally:
        shutil.rmtree(mine, ignore_errors=True)


# module -> why its os.open/open-for-writing without O_NOFOLLOW is right
OPEN_OK = {
    "launcher/cli/keys.py": "/dev/tty, the terminal's device",
    "launcher/commands/runs.py": "the archive directory itself, opened to list and prune "
                                 "runs by dir_fd; each run is then checked (is_dtrain_run)",
    "launcher/commands/sshconfig.py": "the user's own ~/.ssh/config, with consent",
    "launcher/job/incidents.py": "relative to the held, checked state directory (dir_fd) "
                                 "with _READ's flags, O_NOFOLLOW among them",
    "launcher/output/archive.py": "RunDir.append: relative to the run directory's held "
                                  "descriptor, O_NOFOLLOW inside (output/rundir.py)",
    "launcher/output/rundir.py": "the archive directory, then checked by fstat (owner, mode)",
    "launcher/output/samplelog.py": "RunDir.append, as archive.py",
    "launcher/transports/confined.py": "every part with _DIR (O_NOFOLLOW) from the root's "
                                       "descriptor; the root itself is the user's choice",
    "launcher/transports/ssh/hostkeys.py": "the user's own known_hosts, as OpenSSH writes it",
}


def _unguarded_opens(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        text = ast.unparse(node)
        if name == "os.open" and "NOFOLLOW" not in text and "_FLAGS" not in text \
                and "_READ" not in text:
            lines.append(node.lineno)
        elif name == "open" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and any(c in str(node.args[1].value) for c in "wax") \
                and not isinstance(node.args[0], ast.Name):
            lines.append(node.lineno)  # a path opened for writing (a checked fd is a Name)
    return lines


def test_every_open_on_the_login_node_refuses_links_or_says_why() -> None:
    """A state path is opened with O_NOFOLLOW (or relative to a checked directory): a new
    os.open or open(..., "w") without it fails here unless named in OPEN_OK with a reason."""
    bad = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("launcher/nodeside/") or rel in OPEN_OK:
            continue  # node programs: the node's side (docs/threat-model.md)
        bad += [f"{rel}:{line}" for line in _unguarded_opens(ast.parse(path.read_text()))]
    assert bad == []


def test_the_open_rule_sees_one() -> None:
    sample = ast.parse("os.open(p, os.O_WRONLY | os.O_CREAT)\nopen(p / 'x', 'w')\n"
                       "os.open(p, os.O_RDONLY | os.O_NOFOLLOW)\nopen(fd, 'w')\n")
    assert _unguarded_opens(sample) == [1, 2]
