"""The connection keeper (--persist, docs/connections.md) against the real-sshd cluster:
warm commands ride on kept connections without importing asyncssh, the keeper closes what
changed or idled, falls back to direct connections, serves only its own user, and its death
tears down what ran through it, as a launcher's does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from launcher.models import Host
from tests.util import REPO, assert_exit, dtrain, end_pid, pid_alive, wait_until

pytestmark = pytest.mark.ssh



def _listing(env: dict[str, str]) -> dict:
    res = dtrain(["connections", "--json"], env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)



@pytest.fixture
def kenv(cluster) -> Iterator[dict[str, str]]:
    """The client environment with a private runtime directory of its own (its own keeper),
    whose keeper is closed (and, failing that, ended by its pid) afterwards. It lies in the
    cluster's shared directory, so that another local user can reach it when a test opens
    it (pytest's tmp_path is 0700)."""
    runtime = Path(cluster.shared_dir) / f"keeper-{uuid.uuid4().hex[:8]}"
    runtime.mkdir(mode=0o700)
    env = cluster.client_env(XDG_RUNTIME_DIR=str(runtime))
    yield env
    doc = _listing(env)
    dtrain(["connections", "close"], env=env)
    pid = (doc.get("keeper") or {}).get("pid")
    if pid:
        end_pid(pid)
    subprocess.run(["rm", "-rf", str(runtime)], check=False)


def test_warm_exec_rides_the_keeper_without_asyncssh(kenv):
    res = dtrain(["exec", "-H", "node[1-2]", "--persist", "1m", "--", "hostname"], env=kenv)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["node1: node1", "node2: node2"]
    doc = _listing(kenv)
    assert doc["schema"] == "dtrain.connections/1"
    schema = json.loads((REPO / "launcher/output/schemas/connections.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert sorted(c["host"] for c in doc["connections"]) == ["node1", "node2"]
    pid = doc["keeper"]["pid"]
    # the second command: the same keeper, no asyncssh import, the same output (an ordinary
    # start: a warm start's imports are the resident's, tests/test_resident.py)
    env = {**kenv, "DTRAIN_PERSIST": "1m", "DTRAIN_RESIDENT": "0"}
    warm = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", "exec", "-H",
                           "node[1-2]", "-v", "--", "hostname"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert warm.returncode == 0, warm.stderr
    assert sorted(warm.stdout.splitlines()) == ["node1: node1", "node2: node2"]
    assert "asyncssh" not in warm.stderr, "a warm command imported asyncssh"
    assert "keeper not used" not in warm.stderr
    assert _listing(kenv)["keeper"]["pid"] == pid


def test_exit_codes_stdin_and_stderr_pass_through(kenv):
    res = dtrain(["exec", "-H", "node1", "--persist", "1m", "--",
                  "echo out; echo err >&2; exit 7"], env=kenv)
    assert_exit(res, 7)
    assert "node1: out" in res.stdout and "node1: err" in res.stderr


def test_a_keeper_directory_open_to_others_is_not_used(cluster, tmp_path: Path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    (runtime / "dtrain").mkdir(mode=0o755)
    os.chmod(runtime / "dtrain", 0o755)
    env = cluster.client_env(XDG_RUNTIME_DIR=str(runtime))
    res = dtrain(["exec", "-H", "node1", "--persist", "1m", "-v", "--", "hostname"], env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "node1: node1\n"
    assert res.stderr.count("connection keeper not used") == 1
    assert "open to others" in res.stderr
    assert not (runtime / "dtrain" / "keeper.sock").exists()


def test_a_changed_known_hosts_closes_the_kept_connection(kenv, cluster, tmp_path: Path):
    # a copy of the client's home whose known_hosts this test may change
    home = tmp_path / "home"
    subprocess.run(["cp", "-a", kenv["HOME"], str(home)], check=True)
    ssh = home / ".ssh"
    config = (ssh / "config").read_text().replace(str(Path(kenv["HOME"])), str(home))
    (ssh / "config").write_text(config)
    env = {**kenv, "HOME": str(home)}
    res = dtrain(["exec", "-H", "node1", "--persist", "1m", "--", "true"], env=env)
    assert res.returncode == 0, res.stderr
    assert [c["host"] for c in _listing(env)["connections"]] == ["node1"]
    known = Path(config.split("UserKnownHostsFile", 1)[1].split()[0]) \
        if "UserKnownHostsFile" in config else ssh / "known_hosts"
    with open(known, "a") as fh:
        fh.write("# changed\n")
    wait_until(lambda: not _listing(env)["connections"], what="the stale connection to close")


def test_the_keeper_exits_when_idle(kenv):
    res = dtrain(["exec", "-H", "node1", "--persist", "2s", "--", "true"], env=kenv)
    assert res.returncode == 0, res.stderr
    pid = _listing(kenv)["keeper"]["pid"]
    wait_until(lambda: not pid_alive(pid), timeout=20, what="the idle keeper to exit")
    assert _listing(kenv)["keeper"] is None


def test_close_names_hosts(kenv):
    assert dtrain(["exec", "-H", "node[1-3]", "--persist", "1m", "--", "true"],
                  env=kenv).returncode == 0
    res = dtrain(["connections", "close", "node[1-2]"], env=kenv)
    assert res.returncode == 0, res.stderr
    assert "closed 2 connections" in res.stderr
    assert [c["host"] for c in _listing(kenv)["connections"]] == ["node3"]


def test_a_dead_keeper_tears_down_what_ran_through_it(kenv, cluster):
    marker = f"keeper-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node1",
                             "--persist", "1m", "--", f"exec -a {marker} sleep 300"],
                            env=kenv, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: cluster.node_pids(1, match=marker), what="the remote command")
        pid = _listing(kenv)["keeper"]["pid"]
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode != 0, err
        wait_until(lambda: not cluster.node_pids(1, match=marker), timeout=30,
              what="the remote command to be torn down")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("agent", ["0", "1"], ids=["channels", "agent"])
def test_more_commands_at_once_than_sshd_allows_sessions_all_succeed(kenv, agent):
    """sshd's MaxSessions (10 by default) bounds the channels of one kept connection: on
    channels of their own (DTRAIN_NODE_AGENT=0, or a command line with --setup), the
    commands past it connect directly (said with -v), none fails (it did: 'remote shell
    exited with status None', 24 execs at once). Through the node agent, which forks them
    all on its one session, none needs to."""
    assert dtrain(["exec", "-H", "node1", "--persist", "1m", "--", "true"],
                  env=kenv).returncode == 0
    env = {**kenv, "DTRAIN_PERSIST": "1m", "DTRAIN_RESIDENT": "0", "DTRAIN_NODE_AGENT": agent}
    procs = [subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node1", "-v",
                               "--", f"echo {i}; sleep 2"], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(14)]
    outs = [p.communicate(timeout=120) for p in procs]
    for i, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err
        assert out == f"node1: {i}\n", err
    direct = [err for _, err in outs if "connecting directly" in err]
    if agent == "1":
        assert not direct, direct[0]
        return
    assert direct, "no command met sshd's MaxSessions: the test proves nothing"
    assert all("MaxSessions" in err for err in direct), direct[0]


def _agents(env: dict[str, str], host: str) -> list[dict]:
    rows = [c for c in _listing(env)["connections"] if c["host"] == host]
    return [a for c in rows for a in c.get("agents", [])]


def test_warm_node_programs_are_forked_by_the_node_agent(kenv, cluster):
    """The second warm exec's supervisor is a child of the agent the first one started: no
    new session, shell or interpreter on the node (docs/connections.md)."""
    env = {**kenv, "DTRAIN_PERSIST": "1m"}
    parent = "awk '/^PPid/{print $2}' /proc/$PPID/status"  # the supervisor's parent
    first = dtrain(["exec", "-H", "node1,node2", "--", parent], env=env)
    assert first.returncode == 0, first.stderr
    agents = {h: _agents(env, h) for h in ("node1", "node2")}
    assert all(len(a) == 1 for a in agents.values()), agents
    again = dtrain(["exec", "-H", "node1,node2", "--", parent], env=env)
    assert again.returncode == 0, again.stderr
    for h in ("node1", "node2"):
        assert f"{h}: {agents[h][0]['pid']}" in first.stdout.splitlines(), first.stdout
        assert f"{h}: {agents[h][0]['pid']}" in again.stdout.splitlines(), again.stdout
        assert [a["pid"] for a in _agents(env, h)] == [agents[h][0]["pid"]]
    assert cluster.node_pids(1, match="dtrain-agent")  # named so in ps on the node
    # off: a channel of its own, whose parent is sshd's session (the shell exec'd python)
    off = dtrain(["exec", "-H", "node1", "--", parent], env={**env, "DTRAIN_NODE_AGENT": "0"})
    assert off.returncode == 0, off.stderr
    assert off.stdout != f"node1: {agents['node1'][0]['pid']}\n"


def test_a_killed_agent_drops_its_jobs_and_the_next_command_gets_a_new_one(kenv, cluster):
    env = {**kenv, "DTRAIN_PERSIST": "1m"}
    marker = f"agent-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node1", "--",
                             f"exec -a {marker} sleep 300"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: cluster.node_pids(1, match=marker), what="the remote command")
        (agent,) = _agents(env, "node1")
        os.kill(agent["pid"], signal.SIGKILL)  # on the node (the cluster shares pids)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 255, err  # a lost channel, as when sshd's session dies
        wait_until(lambda: not cluster.node_pids(1, match=marker), timeout=30,
                   what="the remote command to be torn down")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    res = dtrain(["exec", "-H", "node1", "--", "echo back"], env=env)
    assert (res.returncode, res.stdout) == (0, "node1: back\n"), res.stderr
    assert [a["pid"] for a in _agents(env, "node1")] != [agent["pid"]]


def test_a_slow_reader_holds_back_its_own_job_only(kenv):
    """One agent carries every job of a node: a command that does not read its output
    stops that job on the node (PAUSE), never the others on the same agent."""
    env = {**kenv, "DTRAIN_PERSIST": "1m"}
    assert dtrain(["exec", "-H", "node1", "--", "true"], env=env).returncode == 0
    lines = 60_000  # ~61 MB: more than every buffer on the way (exec's own holds 16 MiB)
    awk = ('BEGIN { s = sprintf("%1000s", ""); gsub(/ /, "x", s); '
           f'for (i = 1; i <= {lines}; i++) print "line " i " of the slow reader " s }}')
    slow = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node1", "--",
                             f"awk '{awk}'"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        wait_until(lambda: any(a["held"] for a in _agents(env, "node1")), timeout=60,
                   what="the slow job held back on the node")
        quick = dtrain(["exec", "-H", "node1", "--", "echo quick"], env=env, timeout=60)
        assert (quick.returncode, quick.stdout) == (0, "node1: quick\n"), quick.stderr
        assert slow.poll() is None  # still held back: nobody has read its output yet
        out, err = slow.communicate(timeout=300)
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.wait()
    assert slow.returncode == 0, err[-2000:]
    got = out.splitlines()
    assert len(got) == lines
    pad = b" " + b"x" * 1000
    assert got[0] == b"node1: line 1 of the slow reader" + pad
    assert got[-1] == f"node1: line {lines} of the slow reader".encode() + pad


def test_only_its_own_user_may_talk_to_the_keeper(kenv, cluster):
    assert dtrain(["exec", "-H", "node1", "--persist", "1m", "--", "true"],
                  env=kenv).returncode == 0
    directory = Path(kenv["XDG_RUNTIME_DIR"]) / "dtrain"
    sock = directory / "keeper.sock"
    # open the way for the test only: the keeper's own peer check must still refuse
    os.chmod(kenv["XDG_RUNTIME_DIR"], 0o711)
    os.chmod(directory, 0o711)
    os.chmod(sock, 0o666)
    try:
        probe = ("import socket,struct,json,sys\n"
                 "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                 "p=json.dumps({'op':'list'}).encode()\n"
                 "try: s.sendall(struct.pack('>cI',b'Q',len(p))+p)\n"
                 "except BrokenPipeError: pass\n"  # refused before it read: the answer waits
                 "h=s.recv(5); print(s.recv(struct.unpack('>cI',h)[1]).decode())\n")
        res = subprocess.run(["runuser", "-u", cluster.user, "--", sys.executable, "-c", probe,
                              str(sock)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        reply = json.loads(res.stdout)
        assert reply == {"ok": False, "why": "not your keeper"}
    finally:
        os.chmod(directory, 0o700)
        os.chmod(kenv["XDG_RUNTIME_DIR"], 0o700)


# ---------------------------------------------------------------------- pure parts, no nodes

def test_persist_durations() -> None:
    from launcher.transports.keeper.frames import parse_persist

    assert parse_persist("10m") == 600 and parse_persist("90s") == 90
    assert parse_persist("1h") == 3600 and parse_persist("45") == 45
    for off in (None, "", "0", "off", "no"):
        assert parse_persist(off) is None
    for bad in ("ten", "-5m", "8d", "1x", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_persist(bad)


def test_bad_persist_is_exit_2_before_anything_connects() -> None:
    res = dtrain(["exec", "-H", "node1", "--persist", "soon", "--", "true"])
    assert_exit(res, 2)
    assert "--persist 'soon'" in res.stderr


def test_settings_travel_to_the_keeper_whole() -> None:
    from launcher.transports.keeper.client import settings_dict
    from launcher.transports.keeper.server import settings_from
    from launcher.transports.ssh.settings import SSHSettings

    s = SSHSettings(connect_timeout=3.5, accept_new=True, identities=("/k/id",),
                    home=Path("/h"), options=("Port 2222",),
                    user_known_hosts=(Path("/h/kh"),), password="secret", persist=60.0)
    data = settings_dict(s)
    assert "password" not in data and "secret" not in json.dumps(data)
    back = settings_from(json.loads(json.dumps(data)))
    assert back == SSHSettings(connect_timeout=3.5, accept_new=True, identities=("/k/id",),
                               home=Path("/h"), options=("Port 2222",),
                               user_known_hosts=(Path("/h/kh"),))


def test_frames_refuse_what_breaks_the_protocol() -> None:
    import asyncio

    from launcher.transports.keeper import frames

    async def read(data: bytes):
        r = asyncio.StreamReader()
        r.feed_data(data)
        r.feed_eof()
        return await frames.read_frame(r)

    assert asyncio.run(read(frames.encode(frames.OUT, b"abc"))) == (frames.OUT, b"abc")
    assert asyncio.run(read(b"")) is None
    for broken in (b"O\x00", b"O\x00\x00\x00\x05ab", b"O\xff\xff\xff\xff"):
        with pytest.raises(frames.FrameError):
            asyncio.run(read(broken))
    with pytest.raises(frames.FrameError):
        frames.decode_json(b"[1]")


def test_a_private_directory_is_checked(tmp_path: Path) -> None:
    from launcher.transports.keeper.frames import keeper_dir, private_dir

    d = tmp_path / "k"
    assert private_dir(d, create=False) is not None
    assert private_dir(d, create=True) is None and (d.stat().st_mode & 0o777) == 0o700
    os.chmod(d, 0o750)
    assert "open to others" in (private_dir(d, create=False) or "")
    link = tmp_path / "l"
    link.symlink_to(d)
    assert "symbolic link" in (private_dir(link, create=False) or "")
    assert keeper_dir({}, uid=4242) == Path("/tmp/dtrain-keeper-4242")
    os.chmod(d, 0o700)
    assert keeper_dir({"XDG_RUNTIME_DIR": str(d)}) == d / "dtrain"


def test_run_and_smoke_never_ride_on_the_keeper() -> None:
    from launcher.transports import AutoTransport
    from launcher.transports.keeper.client import KeeperTransport
    from launcher.transports.ssh.settings import SSHSettings

    warm = SSHSettings(persist=60.0)
    assert isinstance(AutoTransport(warm, "ssh").remote(), KeeperTransport)
    assert not isinstance(AutoTransport(warm, "ssh", keeper=False).remote(), KeeperTransport)
    assert not isinstance(AutoTransport(SSHSettings(), "ssh").remote(), KeeperTransport)
    keys = SSHSettings(persist=60.0, password="pw")
    assert not isinstance(AutoTransport(keys, "ssh").remote(), KeeperTransport)


def test_a_write_after_a_fast_job_ended_never_loses_its_output_or_status(kenv, cluster):
    """The keeper used to close a finished request at once: the command's next write (the
    heartbeat right after a job that ended within milliseconds, as the node agent's do) then
    failed with EPIPE, and asyncio raised that on its reader before the frames buffered
    there, so the job read as 'exited with status None' (1 run in 20 at 128 nodes). It now
    shuts down its side for writing and lets the command hang up."""
    from launcher.transports import AutoTransport
    from launcher.transports.keeper.frames import keeper_dir
    from launcher.transports.ssh.settings import SSHSettings

    settings = SSHSettings(connect_timeout=10, home=cluster.client_home, persist=60.0)
    directory = keeper_dir({"XDG_RUNTIME_DIR": kenv["XDG_RUNTIME_DIR"]})

    async def once() -> tuple[bytes, int | None]:
        async with AutoTransport(settings, "ssh") as auto:
            transport = auto.remote()
            transport.directory = directory  # the test's own keeper
            transport.sock = directory / "keeper.sock"
            conn = await transport.connect(Host(name="node1"))
            proc = await conn.start("echo hi")
            # the command is busy (a loaded box): its loop reads nothing while the job ends
            # and the keeper finishes the request
            time.sleep(1.5)
            with contextlib.suppress(ConnectionError):
                await proc.write(b"x" * 65536)  # a late write, as a heartbeat is
            out = await proc.read_stdout(100)
            status = await proc.wait()
            await conn.aclose()
            return out, status

    assert asyncio.run(once()) == (b"hi\n", 0)
