"""The node supervisor, run locally: shipped with nodeside.wire exactly as NodeSession ships it
(the bootstrap under /bin/sh -c, then header + source + spec on stdin), frames read back.

Fast (no sshd, no torch): teardown on stop / stdin EOF / heartbeat loss / signal, setsid
escapees, exit code and signal mapping, the rank shim, and the node-side constraints on
supervisor.py (Python 3.8 syntax, standard library only).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from launcher.nodeside import nodecommon, nodeprocs, rankshim, wire
from tests.util import node_program

SOURCE = node_program().read_text()  # the bundle the nodes get


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wchan(pid: int) -> str:
    """Where in the kernel pid sleeps ("pipe_write", "anon_pipe_write": a full pipe)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def wait_for(cond, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


class Sup:
    """One supervisor started through the real bootstrap, with its frames collected."""

    def __init__(self, spec: dict, *, read: bool = True, cwd: str | None = None) -> None:
        full = {"v": 1, "argv": None, "shell": None, "env": {}, "rank_shim": False,
                "grace": 5.0, "heartbeat_timeout": 0, "heartbeat_interval": 0.2, **spec}
        cmd = wire.remote_command(sys.executable, workdir=cwd)
        self.proc = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        assert self.proc.stdin is not None
        self.proc.stdin.write(wire.payload(wire.program_source("supervisor"), full))
        self.proc.stdin.flush()
        self.msgs: list[dict] = []
        self.out: dict[int, bytes] = {}
        self.err: dict[int, bytes] = {}
        self.cond = threading.Condition()
        self.reader: threading.Thread | None = None
        if read:
            self.start_reading()

    def start_reading(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        decoder = wire.FrameDecoder()
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while data := os.read(fd, 1 << 16):
            with self.cond:
                for frame in decoder.feed(data):
                    if frame.kind == wire.KIND_CTL:
                        self.msgs.append(frame.message())
                    else:
                        box = self.out if frame.kind == wire.KIND_OUT else self.err
                        box[frame.rank] = box.get(frame.rank, b"") + frame.data
                self.cond.notify_all()
        with self.cond:
            self.msgs.append({"type": "_eof"})
            self.cond.notify_all()

    def message(self, kind: str, timeout: float = 10.0) -> dict:
        with self.cond:
            ok = self.cond.wait_for(lambda: any(m.get("type") in (kind, "_eof")
                                                for m in self.msgs), timeout)
            found = [m for m in self.msgs if m.get("type") == kind]
        assert ok and found, f"no {kind!r} message; got {self.msgs}"
        return found[0]

    def output(self, rank: int = -1) -> bytes:
        with self.cond:
            return self.out.get(rank, b"")

    def wait_output(self, text: bytes, rank: int = -1, timeout: float = 10.0) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: text in self.out.get(rank, b""), timeout)
        assert ok, f"no {text!r} in the output of rank {rank}: {self.out}"

    def send(self, op: str, **fields: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(wire.control(op, **fields))
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout)

    def pid(self) -> int:
        """The supervisor's pid (the bootstrap shell execs it: same as the Popen pid)."""
        return int(self.message("hello")["supervisor_pid"])

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture
def sups():
    started: list[Sup] = []

    def make(spec: dict, **kw: object) -> Sup:
        s = Sup(spec, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.cleanup()


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


# -- node-side constraints --------------------------------------------------------------------

def test_supervisor_is_python38_stdlib_only() -> None:
    tree = ast.parse(SOURCE, feature_version=(3, 8))
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module
            mods.add(node.module.split(".")[0])
    assert mods and mods <= sys.stdlib_module_names, mods - sys.stdlib_module_names


def test_supervisor_never_kills_by_name() -> None:
    for word in ("pkill", "killall", "pgrep"):
        assert word not in SOURCE.replace("Never pkill", "")


# -- never a recycled pid ----------------------------------------------------------------------

@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


def test_descendants_carry_the_start_time(sleeper) -> None:
    started = nodecommon.start_time(sleeper.pid)
    assert started is not None and started > 0
    assert (sleeper.pid, started) in nodeprocs.descendants(os.getpid())


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "kill"])
def test_a_recycled_pid_is_never_signalled(sleeper, monkeypatch, pidfd: bool) -> None:
    if not pidfd:  # Python 3.8 or a kernel without pidfds: the start-time check before kill()
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    # The scan saw pid P start at time T; by the kill, P is another process (a later start).
    # That other process must survive: here the "newcomer" is our sleeper.
    started = nodecommon.start_time(sleeper.pid)
    assert started is not None
    stale = [(sleeper.pid, started - 1)]
    monkeypatch.setattr(nodeprocs, "descendants", lambda root, prune=None: stale)
    assert nodeprocs.signal_tree(signal.SIGKILL) == 0
    time.sleep(0.1)
    assert sleeper.poll() is None and alive(sleeper.pid)
    assert not nodeprocs.signal_pid(sleeper.pid, started + 1, signal.SIGKILL)
    assert sleeper.poll() is None
    # the process the scan really saw is signalled
    monkeypatch.setattr(nodeprocs, "descendants",
                        lambda root, prune=None: [(sleeper.pid, started)])
    assert nodeprocs.signal_tree(signal.SIGKILL) == 1
    assert sleeper.wait(5) == -signal.SIGKILL


def test_a_gone_pid_is_not_signalled() -> None:
    proc = subprocess.Popen(["true"])
    started = nodecommon.start_time(proc.pid)
    proc.wait()
    assert started is None or not nodeprocs.signal_pid(proc.pid, started, signal.SIGKILL)


@pytest.mark.parametrize(("status", "expected"), [
    (0, (0, None)), (3 << 8, (3, None)), (255 << 8, (255, None)),
    (signal.SIGKILL, (137, 9)), (signal.SIGTERM, (143, 15)), (signal.SIGINT, (130, 2)),
])
def test_exit_code_mapping(status: int, expected: tuple[int, int | None]) -> None:
    assert nodeprocs.exit_code(status) == expected


# -- exit codes end to end ---------------------------------------------------------------------

def test_hello_own_session_and_exit_code(sups) -> None:
    s = sups({"argv": py("import sys, time; print('hi', flush=True); time.sleep(0.3); "
                         "sys.exit(3)")})
    hello = s.message("hello")
    pid = int(hello["pid"])
    assert hello["pgid"] == pid and hello["supervisor_pid"] == s.proc.pid
    assert os.getsid(pid) == pid and os.getpgid(pid) == pid  # its own session
    assert s.wait() == 3
    end = s.message("exit")
    assert (end["code"], end["signal"], end["stopped"]) == (3, None, None)
    assert s.output() == b"hi\n"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_job_killed_by_signal_is_128_plus_n(sups, sig: int) -> None:
    s = sups({"shell": f"kill -{int(sig)} $$"})
    assert s.wait() == 128 + sig
    end = s.message("exit")
    assert (end["code"], end["signal"]) == (128 + sig, int(sig))


@pytest.mark.parametrize("program, error, code", [
    pytest.param("/nonexistent/program", "/nonexistent/program: No such file or directory",
                 127, id="path"),
    pytest.param("dtrain-no-such-command", "dtrain-no-such-command: command not found", 127,
                 id="bare-name"),
    pytest.param("/etc/passwd", "/etc/passwd: Permission denied", 126, id="not-executable"),
])
def test_cannot_start_reports_error_as_a_shell(sups, program, error, code) -> None:
    s = sups({"argv": [program, "-L"]})
    hello = s.message("hello")
    assert (hello["error"], hello["code"]) == (error, code)
    assert s.wait() == code


# -- teardown ----------------------------------------------------------------------------------

TREE = """
    import os, subprocess, sys, time
    kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)'])
            for _ in range(2)]
    print(' '.join(str(k.pid) for k in kids), flush=True)
    time.sleep(100)
"""


def _pids(s: Sup) -> list[int]:
    s.wait_output(b"\n")
    return [int(p) for p in s.output().split()]


def test_stop_kills_the_whole_tree(sups) -> None:
    s = sups({"argv": py(TREE)})
    pids = _pids(s) + [int(s.message("hello")["pid"])]
    t0 = time.monotonic()
    s.send("stop", reason="test", grace=120)
    assert s.wait() == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 60, "a job honouring TERM must not wait for the grace"
    assert not [p for p in pids if alive(p)]
    assert s.message("stopping")["reason"] == "test"
    assert s.message("exit")["stopped"] == "test"


def test_kill_is_immediate_even_for_term_ignoring_jobs(sups) -> None:
    s = sups({"argv": py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ready', flush=True)
        time.sleep(100)
    """)})
    s.wait_output(b"ready")
    s.send("kill", reason="now")
    assert s.wait(3) == 128 + signal.SIGKILL


def test_term_ignoring_job_is_killed_after_the_grace(sups) -> None:
    s = sups({"argv": py("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kid = subprocess.Popen([sys.executable, '-c', 'import signal, time; '
                                'signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(100)'])
        print(kid.pid, flush=True)
        time.sleep(100)
    """), "grace": 1.0})
    pids = _pids(s)
    t0 = time.monotonic()
    s.send("stop", reason="test")  # no grace in the message: the spec's
    assert s.wait(5) == 128 + signal.SIGKILL
    took = time.monotonic() - t0
    assert 0.9 <= took < 3.0, took
    assert not [p for p in pids if alive(p)]


ESCAPEE = """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print(os.getpid(), flush=True)  # a daemon: setsid + double fork
            time.sleep(100)
        os._exit(0)
    time.sleep(100)
"""


def test_stdin_eof_kills_a_setsid_double_forked_escapee(sups) -> None:
    s = sups({"argv": py(ESCAPEE)})
    (escapee,) = _pids(s)
    job = int(s.message("hello")["pid"])
    assert os.getsid(escapee) != job  # it left the job's session: killpg would miss it
    s.close_stdin()  # the launcher is gone
    assert s.wait(5) == 128 + signal.SIGTERM
    assert wait_for(lambda: not alive(escapee) and not alive(job), 2)
    assert "stdin EOF" in s.message("exit")["stopped"]


def test_background_children_do_not_outlive_the_job(sups) -> None:
    s = sups({"argv": py("""
        import subprocess, sys
        kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)'],
                               start_new_session=True, stdout=subprocess.DEVNULL)
        print(kid.pid, flush=True)
    """)})
    (kid,) = _pids(s)
    assert s.wait(5) == 0  # the job's own code, not the leftover's
    assert not alive(kid)


def test_heartbeat_loss_tears_down_and_exits(sups) -> None:
    s = sups({"argv": py(TREE), "heartbeat_timeout": 1.0})
    pids = _pids(s)
    # stdin stays open, but no heartbeat ever comes: a partition TCP does not see
    assert s.wait(6) == 128 + signal.SIGTERM
    assert not [p for p in pids if alive(p)]
    assert "heartbeat" in s.message("exit")["stopped"]


def test_heartbeats_keep_it_alive(sups) -> None:
    s = sups({"argv": py("import time; time.sleep(2); print('done', flush=True)"),
              "heartbeat_timeout": 0.8})
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            try:
                s.send("hb")
            except OSError:  # it ended
                return
            time.sleep(0.2)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        assert s.wait(6) == 0
    finally:
        stop.set()
    assert s.message("exit")["stopped"] is None
    assert sum(m.get("type") == "hb" for m in s.msgs) >= 3  # and it sends its own


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_to_the_supervisor_tears_down(sups, sig: int) -> None:
    s = sups({"argv": py(TREE)})
    pids = _pids(s)
    os.kill(s.pid(), sig)
    assert s.wait(5) == 128 + signal.SIGTERM
    assert not [p for p in pids if alive(p)]
    assert s.message("exit")["stopped"] == f"supervisor got signal {int(sig)}"


def test_signal_op_is_forwarded_to_the_tree(sups) -> None:
    s = sups({"argv": py("""
        import signal, sys, time
        signal.signal(signal.SIGUSR1, lambda *a: (print('usr1', flush=True), sys.exit(4)))
        print('ready', flush=True)
        time.sleep(100)
    """)})
    s.wait_output(b"ready")
    s.send("signal", sig=int(signal.SIGUSR1))
    assert s.wait(5) == 4
    assert b"usr1" in s.output()


def test_stop_works_while_stdout_is_blocked(sups) -> None:
    """A launcher that does not read (slow, or the network stalls) fills the pipe: the main
    loop blocks on write, but a stop still kills the job at once."""
    s = sups({"argv": py("""
        import os, sys
        print(os.getpid(), flush=True)
        while True:
            sys.stdout.write('x' * 65536)
    """)}, read=False)
    # wait (not sleep) until the pipes are full: the supervisor is blocked writing a frame
    assert wait_for(lambda: "pipe_write" in _wchan(s.proc.pid), 20), _wchan(s.proc.pid)
    before = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    job = [p for p in before if alive(p) and _ppid(p) == s.proc.pid]
    assert job
    s.send("stop", reason="blocked", grace=5)
    assert wait_for(lambda: not any(alive(p) for p in job), 3)
    s.start_reading()  # unblock: the supervisor reports and exits
    assert s.wait(10) == 128 + signal.SIGTERM


def test_orphaned_supervisor_leaves_even_if_stdout_is_stuck(sups) -> None:
    """Heartbeats lost and stdout stuck (a partition): the job is killed and the supervisor
    exits by itself rather than hang on a dead channel."""
    s = sups({"argv": py("""
        import sys
        while True:
            sys.stdout.write('x' * 65536)
    """), "heartbeat_timeout": 1.0}, read=False)
    assert s.wait(10) != 0


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


# -- the rank shim -----------------------------------------------------------------------------

def test_rank_shim_attributes_output_and_reports_exit(sups, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        print('out of', os.environ['RANK'], flush=True)
        print('err of', os.environ['RANK'], file=sys.stderr, flush=True)
        sys.exit(int(os.environ['RANK']) + 2)
    """))
    launcher = py(f"""
        import os, subprocess, sys
        procs = [subprocess.Popen([sys.executable, '-u', sys.argv[1], {str(script)!r}],
                                  env={{**os.environ, 'RANK': str(r)}}) for r in (4, 5)]
        sys.exit(max(p.wait() for p in procs) and 1)
    """) + [rankshim.SHIM_PLACEHOLDER]
    s = sups({"argv": launcher, "rank_shim": True})
    assert s.wait() == 1
    for rank in (4, 5):
        assert s.output(rank) == f"out of {rank}\n".encode()
        assert s.err[rank] == f"err of {rank}\n".encode()
    exits = {m["rank"]: m for m in s.msgs if m.get("type") == "rank_exit"}
    assert {r: m["code"] for r, m in exits.items()} == {4: 6, 5: 7}
    assert all(m["duration"] >= 0 and m["signal"] is None for m in exits.values())
    assert json.loads(json.dumps(s.message("exit")["ranks"]))["4"]["code"] == 6


def test_a_rank_failing_of_its_own_says_so_before_its_slow_end(sups, tmp_path: Path) -> None:
    """An uncaught exception and a non-zero sys.exit are told (``rank_raised``) before the
    interpreter's end (here an atexit hook 0.6 s long, as a loaded torch's teardown): the
    launcher then holds a peer's abort for the raiser's exit. A clean exit says nothing."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import atexit, os, sys, time
        atexit.register(time.sleep, 0.6)
        rank = int(os.environ['RANK'])
        if rank == 4:
            raise ValueError('bad batch')
        sys.exit(3 if rank == 5 else 0)
    """))
    launcher = py(f"""
        import os, subprocess, sys
        procs = [subprocess.Popen([sys.executable, '-u', sys.argv[1], {str(script)!r}],
                                  env={{**os.environ, 'RANK': str(r)}}) for r in (4, 5, 6)]
        sys.exit(max(p.wait() for p in procs) and 1)
    """) + [rankshim.SHIM_PLACEHOLDER]
    s = sups({"argv": launcher, "rank_shim": True})
    assert s.wait() == 1
    told = [m for m in s.msgs if m.get("type") in ("rank_raised", "rank_exit")]
    raised = {m["rank"]: m for m in told if m["type"] == "rank_raised"}
    exits = {m["rank"]: m for m in told if m["type"] == "rank_exit"}
    assert {r: m["exc"] for r, m in raised.items()} == {4: "ValueError", 5: "SystemExit"}
    assert {r: m["code"] for r, m in exits.items()} == {4: 1, 5: 3, 6: 0}
    for rank in (4, 5):
        assert told.index(raised[rank]) < told.index(exits[rank])
        assert exits[rank]["t"] - raised[rank]["t"] >= 0.5
    assert b"ValueError: bad batch" in s.err[4]


def test_rank_shim_reports_a_signal(sups, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    launcher = py("""
        import os, subprocess, sys
        p = subprocess.Popen([sys.executable, '-u', sys.argv[1], sys.argv[2]],
                             env={**os.environ, 'RANK': '0'})
        sys.exit(0 if p.wait() == -9 else 1)
    """) + [rankshim.SHIM_PLACEHOLDER, str(script)]
    s = sups({"argv": launcher, "rank_shim": True})
    assert s.wait() == 0  # the shim dies by the same signal: its parent sees -9
    (m,) = [m for m in s.msgs if m.get("type") == "rank_exit"]
    assert (m["code"], m["signal"]) == (137, 9)


# a torchrun-like agent: its workers in sessions of their own, and on SIGTERM it does what
# torchrun's shutdown does: killpg(worker, SIGTERM) each one, then waits for them
TORCHRUN_LIKE = """
    import os, signal, subprocess, sys, time
    procs = [subprocess.Popen([sys.executable, '-u', sys.argv[1], sys.argv[2]],
                              env={**os.environ, 'RANK': str(r)}, start_new_session=True)
             for r in (0, 1)]
    def shutdown(*a):
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
    signal.signal(signal.SIGTERM, shutdown)
    while any(p.poll() is None for p in procs):
        time.sleep(0.05)
    sys.exit(1)
"""


def _counting_worker(tmp_path: Path) -> Path:
    """A rank that writes one line per SIGTERM, saves for 1 s, then exits 143 by itself."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        got = []
        def on_term(*a):
            got.append(1)
            with open({str(tmp_path)!r} + '/r' + os.environ['RANK'], 'a') as f:
                f.write('TERM\\n')
        signal.signal(signal.SIGTERM, on_term)
        print('up', flush=True)
        while not got:
            time.sleep(0.02)
        time.sleep(1.0)
        os._exit(143)
    """))
    return script


def test_one_stop_is_one_term_per_rank_however_it_arrives(sups, tmp_path: Path) -> None:
    """stop, stop again, SIGHUP to the supervisor, and the agent's own killpg: each rank
    gets exactly one SIGTERM, and its exit report says it was asked to stop."""
    script = _counting_worker(tmp_path)
    s = sups({"argv": py(TORCHRUN_LIKE) + [rankshim.SHIM_PLACEHOLDER, str(script)],
              "rank_shim": True, "grace": 20})
    s.wait_output(b"up", rank=0)
    s.wait_output(b"up", rank=1)
    s.send("stop", reason="test")
    s.send("stop", reason="test again")
    os.kill(s.pid(), signal.SIGHUP)
    s.wait(30)
    assert {r: (tmp_path / f"r{r}").read_text() for r in (0, 1)} == {0: "TERM\n", 1: "TERM\n"}
    exits = {m["rank"]: m for m in s.msgs if m.get("type") == "rank_exit"}
    assert {r: (m["code"], m["signal"], m.get("stop_signal")) for r, m in exits.items()} == \
        {0: (143, None, 15), 1: (143, None, 15)}


def test_a_rank_dies_with_its_shim(sups, tmp_path: Path) -> None:
    """The rank is in a process group of its own; a KILLed shim takes it along (as
    torchrun's killpg(worker, SIGKILL) would have)."""
    script = tmp_path / "worker.py"
    script.write_text("import os, time\nprint('up', os.getpid(), os.getppid(), flush=True)\n"
                      "time.sleep(100)\n")
    s = sups({"argv": py(TORCHRUN_LIKE) + [rankshim.SHIM_PLACEHOLDER, str(script)],
              "rank_shim": True, "grace": 20})
    s.wait_output(b"\n", rank=0)  # the whole line: "up <pid> <ppid>"
    _, pid, shim = s.output(0).split()[:3]
    assert os.getpgid(int(pid)) == int(pid)  # not in the shim's group
    os.kill(int(shim), signal.SIGKILL)
    assert wait_for(lambda: not alive(int(pid)), 10)
    s.send("kill")
    s.wait(10)


def test_stop_kills_the_agent_once_every_rank_is_gone(sups, tmp_path: Path) -> None:
    """The grace period is for the ranks: an agent (torchrun) that lingers after its ranks
    exited on TERM gets its own short grace (here 0.5 s), then the KILL: not the 20 s."""
    script = tmp_path / "worker.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(100)\n")
    agent = py(f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, lambda *a: None)  # a slow agent (not SIG_IGN:
        # that would be inherited by the ranks)
        procs = [subprocess.Popen([sys.executable, '-u', sys.argv[1], {str(script)!r}],
                                  env={{**os.environ, 'RANK': str(r)}}) for r in (0, 1)]
        time.sleep(100)
    """) + [rankshim.SHIM_PLACEHOLDER]
    s = sups({"argv": agent, "rank_shim": True, "grace": 20, "agent_grace": 0.5})
    s.wait_output(b"up", rank=0)
    s.wait_output(b"up", rank=1)
    t0 = time.monotonic()
    s.send("stop", reason="test")
    assert s.wait(15) == 128 + signal.SIGKILL
    assert time.monotonic() - t0 < 15.0  # the 20 s grace is for the ranks, not the agent
    exits = {m["rank"]: m["code"] for m in s.msgs if m.get("type") == "rank_exit"}
    assert exits == {0: 143, 1: 143}


def test_the_agent_s_last_words_after_its_ranks_exited_reach_the_launcher(
        sups, tmp_path: Path) -> None:
    """torchrun logs its shutdown after its workers are gone: an agent that waits for its
    ranks, then says so and exits 0 by itself, is not KILLed first (its line arrives, the
    job's code is its own)."""
    script = tmp_path / "worker.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(100)\n")
    agent = py(f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, lambda *a: None)
        procs = [subprocess.Popen([sys.executable, '-u', sys.argv[1], {str(script)!r}],
                                  env={{**os.environ, 'RANK': str(r)}}) for r in (0, 1)]
        while any(p.poll() is None for p in procs):
            time.sleep(0.05)
        time.sleep(0.5)  # torchrun's own shutdown (its rendezvous, its log handlers)
        sys.stderr.write('agent: Received 15 death signal, shutting down workers\\n')
        sys.exit(0)
    """) + [rankshim.SHIM_PLACEHOLDER]
    s = sups({"argv": agent, "rank_shim": True, "grace": 20})
    s.wait_output(b"up", rank=0)
    s.wait_output(b"up", rank=1)
    s.send("stop", reason="test")
    assert s.wait(15) == 0
    assert s.message("exit")["code"] == 0
    with s.cond:
        assert s.err.get(-1, b"") == b"agent: Received 15 death signal, shutting down workers\n"
