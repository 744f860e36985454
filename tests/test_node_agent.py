"""The node agent (launcher/nodeside/agent.py) on its own: started with the very command line
a node program's channel runs, it forks each program it is asked for, and what a program
sees (stdin, stdout, stderr, its exit status, a dropped channel, a dead keeper) is what it
sees on a channel of its own. The keeper's side rides on the cluster in test_keeper.py."""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.nodeside import agent as node_agent
from launcher.nodeside import wire
from launcher.transports.keeper import nodeagent

HEAD = struct.Struct("!BII")


class AgentUnderTest:
    def __init__(self, command: str) -> None:
        self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdin and self.proc.stdout
        self.buf = b""
        self.proc.stdin.write(wire.agent_payload())
        self.proc.stdin.flush()
        self._fill_until(lambda: nodeagent.MAGIC in self.buf)
        self.buf = self.buf[self.buf.index(nodeagent.MAGIC) + len(nodeagent.MAGIC):]
        kind, _, data = self.frame()
        assert kind == nodeagent.READY
        self.pid = int(data)

    def _fill_until(self, cond, timeout: float = 20.0) -> None:
        assert self.proc.stdout
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while not cond():
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; have {self.buf[-300:]!r}"
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError(self.buf)
                self.buf += chunk

    def frame(self) -> tuple[int, int, bytes]:
        self._fill_until(lambda: len(self.buf) >= HEAD.size
                         and len(self.buf) >= HEAD.size + HEAD.unpack_from(self.buf)[2])
        kind, jid, size = HEAD.unpack_from(self.buf)
        data = self.buf[HEAD.size:HEAD.size + size]
        self.buf = self.buf[HEAD.size + size:]
        return kind, jid, data

    def send(self, kind: int, jid: int, data: bytes = b"") -> None:
        assert self.proc.stdin
        self.proc.stdin.write(HEAD.pack(kind, jid, len(data)) + data)
        self.proc.stdin.flush()

    def until_exit(self, jid: int) -> tuple[bytes, bytes, int, int]:
        """Its stdout, stderr, exit status and the bytes acknowledged."""
        out, err, acked = b"", b"", 0
        while True:
            kind, j, data = self.frame()
            if j != jid:
                continue
            if kind == nodeagent.A_OUT:
                out += data
            elif kind == nodeagent.A_ERR:
                err += data
            elif kind == nodeagent.ACK:
                acked += struct.unpack("!I", data)[0]
            elif kind == nodeagent.A_EXIT:
                return out, err, int(data), acked

    def spawn(self, jid: int, source: bytes) -> int:
        self.send(nodeagent.SPAWN, jid)
        while True:
            kind, j, data = self.frame()
            if j == jid and kind == nodeagent.STARTED:
                break
        self.send(nodeagent.A_IN, jid, wire.payload(source))
        return int(data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agent():
    a = AgentUnderTest(wire.remote_command(sys.executable, stdlib_only=True))
    yield a
    a.close()


ECHO = (b"import os, sys\n"
        b"data = b''\n"
        b"while True:\n"
        b"    c = os.read(0, 65536)\n"
        b"    if not c:\n"
        b"        break\n"
        b"    data += c\n"
        b"os.write(1, data.upper())\n"
        b"me = (os.getpid(), os.getsid(0), sys.flags.isolated)\n"
        b"os.write(2, b'pid %d sid %d flags %r' % me)\n"
        b"sys.exit(3)\n")


def test_a_forked_program_sees_a_channel_of_its_own(agent: AgentUnderTest) -> None:
    pid = agent.spawn(1, ECHO)
    body = b"hello agent " * 20000  # more than one pipe's worth: written as the child reads
    agent.send(nodeagent.A_IN, 1, body)
    agent.send(nodeagent.A_EOF, 1)
    out, err, status, acked = agent.until_exit(1)
    assert out == body.upper()
    assert err == b"pid %d sid %d flags 1" % (pid, pid)  # its own session, run isolated (-I)
    assert status == 3
    assert acked == len(wire.payload(ECHO)) + len(body)  # every byte of stdin acknowledged
    assert pid != agent.pid


def test_jobs_run_side_by_side_and_a_signal_reads_as_sshd_does(agent: AgentUnderTest) -> None:
    sleeper = b"import time\ntime.sleep(60)\n"
    a = agent.spawn(7, sleeper)
    b = agent.spawn(8, ECHO)
    agent.send(nodeagent.A_IN, 8, b"x")
    agent.send(nodeagent.A_EOF, 8)
    assert agent.until_exit(8)[:3] == (b"X", agent_err_for(b), 3)
    os.kill(a, signal.SIGKILL)
    assert agent.until_exit(7)[2] == -1  # an exit signal: asyncssh's exit_status reads -1


def agent_err_for(pid: int) -> bytes:
    return b"pid %d sid %d flags 1" % (pid, pid)


WAITER = (b"import os\n"
          b"while os.read(0, 100):\n"
          b"    pass\n"
          b"open(os.environ['DTRAIN_T_MARK'], 'w').write('eof')\n")


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def test_a_dropped_job_sees_eof_and_no_exit_is_sent(tmp_path: Path, monkeypatch) -> None:
    mark = tmp_path / "mark"
    monkeypatch.setenv("DTRAIN_T_MARK", str(mark))
    a = AgentUnderTest(wire.remote_command(sys.executable, stdlib_only=True))
    try:
        pid = a.spawn(3, WAITER)
        a.send(nodeagent.DROP, 3)
        assert _gone(pid)
        assert mark.read_text() == "eof"
        a.send(nodeagent.A_IN, 3, b"late!")  # bytes for a dropped job: acknowledged only
        seen = []
        while not seen or seen[-1] != (nodeagent.ACK, 5):
            kind, jid, data = a.frame()
            assert jid == 3
            seen.append((kind, struct.unpack("!I", data)[0] if kind == nodeagent.ACK else data))
        assert [k for k, _ in seen] == [nodeagent.ACK] * len(seen)  # and never an EXIT
    finally:
        a.close()


def test_a_dead_keeper_drops_every_job_and_the_agent_leaves(tmp_path: Path,
                                                            monkeypatch) -> None:
    mark = tmp_path / "mark"
    monkeypatch.setenv("DTRAIN_T_MARK", str(mark))
    a = AgentUnderTest(wire.remote_command(sys.executable, stdlib_only=True))
    try:
        pid = a.spawn(1, WAITER)
        assert a.proc.stdin
        a.proc.stdin.close()  # the channel is gone: the keeper died, or the connection
        assert a.proc.wait(10) == 0
        assert _gone(pid)
        assert mark.read_text() == "eof"
    finally:
        a.close()


def test_a_paused_job_waits_and_goes_on(agent: AgentUnderTest) -> None:
    talker = (b"import os\nfor i in range(200):\n    os.write(1, b'y' * 4096)\n")
    agent.send(nodeagent.PAUSE, 5)  # unknown job: ignored
    agent.spawn(5, talker)
    agent.send(nodeagent.PAUSE, 5)
    agent.send(nodeagent.A_EOF, 5)
    time.sleep(0.5)
    agent.send(nodeagent.RESUME, 5)
    out, _, status, _ = agent.until_exit(5)
    assert (len(out), status) == (200 * 4096, 0)


HELD_TOTAL = 4 << 20  # far more than a pipe holds: the child must wait for its reader
HOLDER = (b"import os\n"
          b"mark, total, n = os.environ['DTRAIN_T_MARK'], %d, 0\n"
          b"def say(name, text):\n"
          b"    with open(mark + '.tmp', 'w') as f:\n"
          b"        f.write(text)\n"
          b"    os.replace(mark + '.tmp', mark + name)\n"
          b"os.set_blocking(1, False)\n"
          b"while True:\n"
          b"    try:\n"
          b"        n += os.write(1, b'y' * 4096)\n"
          b"    except BlockingIOError:\n"
          b"        break\n"
          b"say('.full', str(n))\n"
          b"os.set_blocking(1, True)\n"
          b"while n < total:\n"
          b"    n += os.write(1, b'y' * min(4096, total - n))\n"
          b"say('.done', str(n))\n") % HELD_TOTAL


def test_a_paused_job_is_held_until_resumed(tmp_path: Path, monkeypatch) -> None:
    """PAUSE (the keeper's client reads slowly) stops the agent reading that job's output,
    so the program itself waits, as on a channel whose window is shut: its stdout pipe fills
    (its non-blocking write says so), nothing of it reaches the keeper, and it cannot go
    on; RESUME lets everything through. Observed, not slept on: the pipe full is the child's
    own word; two round trips through the agent (IN for a job that is gone: an ACK) show
    that the agent's loop turned while the job's output was readable and sent none of it."""
    mark = tmp_path / "mark"
    monkeypatch.setenv("DTRAIN_T_MARK", str(mark))
    a = AgentUnderTest(wire.remote_command(sys.executable, stdlib_only=True))
    try:
        a.send(nodeagent.SPAWN, 5)
        while a.frame()[:2] != (nodeagent.STARTED, 5):
            pass
        a.send(nodeagent.PAUSE, 5)  # before the program's first byte: nothing read yet
        a.send(nodeagent.A_IN, 5, wire.payload(HOLDER))
        a.send(nodeagent.A_EOF, 5)
        assert a.proc.stdout
        fd = a.proc.stdout.fileno()
        full = Path(f"{mark}.full")
        deadline = time.monotonic() + 30
        while not full.exists():  # the child's pipe is full: wait for its word
            assert time.monotonic() < deadline, "the paused job never filled its pipe"
            while select.select([fd], [], [], 0.05)[0]:  # kept read: the agent never waits
                chunk = os.read(fd, 65536)
                assert chunk, "the agent ended"
                a.buf += chunk
        seen: list[tuple[int, int, bytes]] = []
        for barrier in (901, 902):  # the second answer comes after the first turn's output
            a.send(nodeagent.A_IN, barrier, b"x")
            while (frame := a.frame())[:2] != (nodeagent.ACK, barrier):
                seen.append(frame)
        held = int(full.read_text())
        assert 0 < held < HELD_TOTAL
        mine = [f for f in seen if f[1] == 5]
        assert {kind for kind, _, _ in mine} == {nodeagent.ACK}, "a paused job's output read"
        assert sum(struct.unpack("!I", d)[0] for _, _, d in mine) == len(wire.payload(HOLDER))
        assert not Path(f"{mark}.done").exists()  # still waiting on its full pipe
        a.send(nodeagent.RESUME, 5)
        out, _, status, _ = a.until_exit(5)
        assert (len(out), status) == (HELD_TOTAL, 0)
        assert Path(f"{mark}.done").read_text() == str(HELD_TOTAL)
    finally:
        a.close()


async def test_the_keeper_pauses_the_job_of_a_client_that_reads_slowly() -> None:
    """The keeper's half (nodeagent.AgentJob): a job's output for a command that does not
    read piles up in the keeper; past HIGH bytes it sends the agent PAUSE for that job (the
    test above: the program then waits), and RESUME only once the command has read it down;
    the output itself is relayed whole. Each step waited for as it happens."""
    import asyncio
    import socket

    from launcher.transports.keeper import frames

    class Agent:  # what of NodeAgent a job uses
        def __init__(self) -> None:
            self.sent: list[tuple[int, int]] = []
            self.changed = asyncio.Event()
            self.tasks: set[asyncio.Task[None]] = set()

        def spawn_task(self, coro) -> None:  # type: ignore[no-untyped-def]
            self.tasks.add(asyncio.ensure_future(coro))

        async def send(self, kind: int, jid: int, data: bytes = b"") -> None:
            self.sent.append((kind, jid))
            self.changed.set()

    agent = Agent()
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    try:
        job = nodeagent.AgentJob(agent, 5, writer)  # type: ignore[arg-type]
        chunk = b"y" * 65536
        given = 0
        while not job.paused and given <= 2 * nodeagent.HIGH:
            job.output(nodeagent.OUT, chunk)
            given += len(chunk)
        assert job.paused, "no PAUSE for a client that reads nothing"
        assert given > nodeagent.HIGH
        await asyncio.wait_for(agent.changed.wait(), 30)
        assert agent.sent == [(nodeagent.PAUSE, 5)]  # and no RESUME: nothing was read
        agent.changed.clear()
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        want = given // len(chunk) * len(frames.encode(nodeagent.OUT, chunk))
        got = 0
        while got < want:  # the command catches up
            data = await asyncio.wait_for(loop.sock_recv(theirs, 1 << 20), 30)
            assert data
            got += len(data)
        await asyncio.wait_for(agent.changed.wait(), 30)
        assert agent.sent == [(nodeagent.PAUSE, 5), (nodeagent.RESUME, 5)]
        assert (got, job.paused) == (want, False)
        await asyncio.gather(*agent.tasks)
    finally:
        writer.close()
        theirs.close()


def test_the_keeper_and_the_agent_agree_on_the_wire() -> None:
    for name in ("MAGIC", "SPAWN", "DROP", "PAUSE", "RESUME", "READY", "STARTED", "FAILED",
                 "ACK"):
        assert getattr(node_agent, name) == getattr(nodeagent, name), name
    assert (node_agent.IN, node_agent.EOF, node_agent.OUT, node_agent.ERR, node_agent.EXIT) == (
        nodeagent.A_IN, nodeagent.A_EOF, nodeagent.A_OUT, nodeagent.A_ERR, nodeagent.A_EXIT)
    assert node_agent.HEAD.format == nodeagent.HEAD.format


def test_the_agent_imports_nothing_heavy(tmp_path: Path) -> None:
    """Every module the agent holds is in every fork: the exec path's own (the supervisor's
    lean set) and nothing of test_supervisor_lean's HEAVY list, which took a forked exec from
    ~8 to ~13 ms of CPU when the agent preloaded json, subprocess, threading and the like."""
    from tests.test_supervisor_lean import HEAVY, _imported, _importing_python

    a = AgentUnderTest(wire.remote_command(_importing_python(tmp_path), stdlib_only=True))
    try:
        pid = a.spawn(1, b"import sys\nsys.exit(0)\n")
        assert a.until_exit(1)[2] == 0 and pid
    finally:
        assert a.proc.stdin
        a.proc.stdin.close()
        a.proc.wait(10)
        err = a.proc.stderr.read() if a.proc.stderr else b""
        a.close()
    imported = _imported(err)
    assert set(node_agent.PRELOAD) <= imported | set(sys.builtin_module_names)
    assert not imported & HEAVY, imported & HEAVY


def test_which_command_lines_an_agent_may_start() -> None:
    plain = [wire.remote_command("python3", stdlib_only=True),
             wire.remote_command("/opt/py 3/bin/python", no_site=True),
             wire.remote_command("~/venv/bin/python"),
             wire.remote_command("python3.11")]
    assert all(wire.plain_program(c) for c in plain)
    other = [wire.remote_command("python3", workdir="/w", stdlib_only=True),
             wire.remote_command("python3", setup="source venv/bin/activate",
                                 stdlib_only=True),
             "exec python3 -c x", "command -v python3", "uptime", "'",
             wire.remote_command("python3", stdlib_only=True) + "\nrm -rf ~"]
    assert not any(wire.plain_program(c) for c in other)


def _through(cut: nodeagent.SourceCut, data: bytes, step: int,
             kept: dict[bytes, bytes]) -> tuple[bytes, list[bytes]]:
    """What the agent's child reads for ``data`` fed in ``step``-byte frames, and the keys
    of the SOURCE frames sent (kept as the agent keeps them)."""
    got, learned = b"", []
    for i in range(0, len(data), step):
        for kind, payload in cut.feed(data[i:i + step]):
            if kind == nodeagent.A_IN:
                got += payload
            elif kind == nodeagent.IN_SOURCE:
                got += kept[payload]
            else:
                assert kind == nodeagent.SOURCE
                key, _, source = payload.partition(b"\n")
                kept[key] = source
                learned.append(key)
    got += b"".join(p for _, p in cut.flush())  # the command's EOF
    return got, learned


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.binary(max_size=3000), st.integers(1, 700), st.binary(max_size=300))
def test_a_source_crosses_once_and_the_child_reads_the_same_bytes(source: bytes, step: int,
                                                                  spec: bytes) -> None:
    payload = wire.payload(source) + spec
    known: set[bytes] = set()
    kept: dict[bytes, bytes] = {}
    got, learned = _through(nodeagent.SourceCut(known), payload, step, kept)
    assert got == payload
    assert learned == ([wire.source_key(source).encode()] if source else [])
    known.update(learned)
    cut = nodeagent.SourceCut(known)
    sent = [p for i in range(0, len(payload), step) for k, p in cut.feed(payload[i:i + step])
            if k == nodeagent.A_IN]
    assert sum(map(len, sent)) + len(b"".join(p for _, p in cut.flush())) == \
        len(payload) - len(source)  # the source stayed home
    again, learned = _through(nodeagent.SourceCut(known), payload, step, kept)
    assert (again, learned) == (payload, [])


@given(st.binary(max_size=500).filter(lambda b: wire.payload_header(
    b.partition(b"\n")[0] + b"\n") is None), st.integers(1, 64))
def test_a_stdin_that_is_not_a_payload_passes_unchanged(data: bytes, step: int) -> None:
    got, learned = _through(nodeagent.SourceCut(set()), data, step, {})
    assert (got, learned) == (data, [])


def test_the_agent_puts_a_kept_source_in_its_place(agent: AgentUnderTest) -> None:
    payload = wire.payload(ECHO)
    header, _, _ = payload.partition(b"\n")
    key = wire.source_key(ECHO).encode()
    agent.send(nodeagent.SOURCE, 0, key + b"\n" + ECHO)
    for jid in (1, 2):
        agent.send(nodeagent.SPAWN, jid)
        agent.send(nodeagent.A_IN, jid, header + b"\n")
        agent.send(nodeagent.IN_SOURCE, jid, key)
        agent.send(nodeagent.A_IN, jid, b"kept")
        agent.send(nodeagent.A_EOF, jid)
        assert agent.until_exit(jid)[0::2][:2] == (b"KEPT", 3)
    agent.send(nodeagent.SPAWN, 3)
    agent.send(nodeagent.A_IN, 3, header + b"\n")
    agent.send(nodeagent.IN_SOURCE, 3, b"0" * 32)  # a key it was never sent: dropped
    while True:
        kind, jid, _ = agent.frame()
        assert not (kind == nodeagent.A_EXIT and jid == 3)
        if kind == nodeagent.STARTED and jid == 3:
            break
    agent.send(nodeagent.SPAWN, 4)  # and the agent goes on
    agent.send(nodeagent.A_IN, 4, payload + b"on")
    agent.send(nodeagent.A_EOF, 4)
    assert agent.until_exit(4)[0] == b"ON"
