"""The warm process's clients (docs/warm-start.md): the rank shim, which asks it for a rank
(``warm_spawn``, ``WarmRank``), and the supervisor, which asks it for torchrun's agent
(``spawn_agent``; the forked agent then runs as ``python -c`` would: ``agent_main``).

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``), after warm.py and
before the rank shim; runs on the nodes, standard library only, Python >= 3.8.

The agent is forked twice by the warm process: the middle process sends its pid and exits,
so the agent is reparented to the supervisor, a child subreaper (PR_SET_CHILD_SUBREAPER).
The supervisor then waits for it, signals it and tears its tree down exactly as for a cold
agent, which it started itself. Until the warm process answers (it may still be importing
torch) a *starter* waits in its place: a fork of the supervisor, the job's pid until then,
that either hands the agent's pid over (a pipe, then exit 0) or, when the warm process is
gone, becomes the cold agent itself (exec, as ``nodeprocs.spawn``'s child does).
"""

# signal.py only wraps _signal in enums (see rankshim.py)
import _signal as signal  # type: ignore[import-not-found]  # (no stub: typeshed lacks it)
import os
import struct
import sys

from launcher.nodeside.nodeprocs import SPARED, TEARDOWN_SIGNALS, _exec_child, spawn
from launcher.nodeside.warm import (
    MAX_REQUEST,
    NOTE_ENV,
    PAD_BYTES,
    PAD_ENV,
    PARENT_ENV,
    PRELOAD_ENV,
    ROLE_AGENT,
    ROLE_RANK,
    TITLE_ROOM,
    WARM_FD_ENV,
    WARM_SOCK_ENV,
    WARM_WAIT_S,
    encode_request,
)


class WarmRank:
    """A rank forked by the warm process, as the shim knows it: its pid and, once the warm
    process has sent it, its end (``poll``: subprocess's returncode, or None)."""

    def __init__(self, sock, pid, buf):
        self.sock = sock
        self.pid = pid
        self.buf = buf
        self.code = None

    def poll(self):
        if self.code is not None:
            return self.code
        eof = False
        while True:
            try:
                chunk = self.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                eof = True
                break
            self.buf += chunk
        while b"\n" in self.buf and self.code is None:
            line, self.buf = self.buf.split(b"\n", 1)
            code = _field(line, "exit")
            if code is not None:
                self.code = code
        if self.code is None and eof:
            # the warm process died: its ranks went with it (PR_SET_PDEATHSIG)
            self.code = -signal.SIGKILL
        if self.code is not None:
            self.sock.close()  # the warm process reaps the rank then
        return self.code


def _field(line, name):
    import json

    try:
        value = json.loads(line).get(name)
    except (ValueError, AttributeError):
        return None
    return value if type(value) is int else None


def _request(path, argv, env, fds, role):
    """Ask the warm process at ``path`` (a uid-checked peer) for a ``role`` with ``fds`` as
    its 0/1/2; (the connection, the pid it answered, what followed the pid's line). Raises
    OSError or ValueError when there is no answer: start cold."""
    import array
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(WARM_WAIT_S)
        s.connect(path)
        peer = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                struct.calcsize("3i")))
        if peer[1] != os.getuid():
            raise OSError("the warm socket's peer is another user's")
        data = encode_request(argv, env, os.getcwd(), role)
        if len(data) > MAX_REQUEST:
            raise ValueError("request of %d bytes" % len(data))
        sent = s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   array.array("i", fds).tobytes())])
        s.sendall(data[sent:])
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                raise OSError("the warm process went cold")
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        pid = _field(line, "pid")
        if pid is None or pid <= 0:
            raise OSError("no pid from the warm process")
    except BaseException:
        s.close()
        raise
    return s, pid, buf


def warm_spawn(path, argv, env, fds):
    """Ask the warm process at ``path`` for a rank (``argv`` as after ``python -u
    dtrain_shim.py``, its ``env``, this working directory, ``fds`` as its 0/1/2); a WarmRank
    whose end raises SIGIO in this process, or None: start the rank cold."""
    import fcntl

    try:
        s, pid, buf = _request(path, argv, env, fds, ROLE_RANK)
    except (OSError, ValueError):
        return None
    try:
        s.setblocking(False)
        fcntl.fcntl(s.fileno(), fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(s.fileno(), fcntl.F_SETFL,
                    fcntl.fcntl(s.fileno(), fcntl.F_GETFL) | os.O_ASYNC)
    except OSError:
        s.close()  # the warm process KILLs the rank it forked: start it cold
        return None
    return WarmRank(s, pid, buf)


# -- the supervisor's side --------------------------------------------------------------------
class WarmStart:
    """The supervisor's part (``sup.warm``): the warm process, started once, and the job
    started as torchrun's agent forked from it; reads and sets the supervisor's spec,
    private directory, job and job status through ``sup``."""

    def __init__(self, sup):
        self.sup = sup
        self.pid = None  # the warm process's
        self.proc = None
        self.handoff = None  # a forked agent's starter is the job until it hands over (a pipe)
        self.reaped_early = None  # type: dict[int, int] | None  # the agent may end first
        # in a node session (nodesession.py): (its directory, the warm process it kept from
        # the attempt before: (pid, socket path, what it was started for), or None)
        self.session = None  # type: tuple[str, tuple[int, str, str] | None] | None
        self.path = None  # where it listens
        self.made_for = None  # the python and --preload it was started with

    def start(self, env, argv):
        """Start the warm process when the spec asks (``warm``) and the job is torchrun
        (``argv``: python -c TORCHRUN_ISOLATED ...), and tell torchrun's workers where it is
        (``env``). Not with --image (the ranks run in the container) or DTRAIN_STACKS=0 (no
        rank wrapper). Never fails the job: a warm process that cannot start leaves the
        ranks to start cold."""
        job = self.sup.spec
        spec = job.get("warm")
        if not isinstance(spec, dict) or job.get("container") \
                or len(argv) < 3 or argv[1] != "-c" or "torch.distributed.run" not in argv[2] \
                or env.get("DTRAIN_STACKS") == "0" or not self.sup.shim_path:
            return
        made_for = "%s %s" % (argv[0], ",".join(str(m) for m in spec.get("preload") or ()))
        home, kept = self.session if self.session is not None else (self.sup.tmpdir, None)
        if kept is not None and kept[2] == made_for and _alive(kept[0]):
            self.pid, self.path, self.made_for = kept  # the session's, from the attempt before
            env[WARM_SOCK_ENV] = self.path
            return
        if kept is not None:  # started for another python or --preload, or gone
            _kill(kept[0])
        import socket
        import subprocess

        path = os.path.join(home, "warm.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        log = None
        try:
            listener.bind(path)
            listener.listen(256)
            preload = [str(m) for m in spec.get("preload") or () if str(m)]
            wenv = dict(env)
            wenv[NOTE_ENV] = wenv.pop("DTRAIN_SHIM_SOCK", "")
            wenv[PARENT_ENV] = str(os.getpid())
            if "OMP_NUM_THREADS" not in wenv and _nproc(argv) > 1:
                # what torchrun gives each worker (torch.distributed.run's config_from_args),
                # read at import by OpenMP and OpenBLAS, whose pools the ranks inherit
                wenv["OMP_NUM_THREADS"] = "1"
            wenv.update({WARM_FD_ENV: str(listener.fileno()), PRELOAD_ENV: ",".join(preload)})
            wenv[PAD_ENV] = "x" * PAD_BYTES  # last: its room follows the others
            log = os.open(os.path.join(home, "warm.log"),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            self.proc = subprocess.Popen(
                [argv[0], "-u", self.sup.shim_path.decode(), " " * TITLE_ROOM],
                env=wenv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=(listener.fileno(),), start_new_session=True)
            self.pid, self.path, self.made_for = self.proc.pid, path, made_for
            if self.session is not None:
                SPARED.add(self.pid)  # the attempt's KILLs leave it to the next attempt
            env[WARM_SOCK_ENV] = path
        except (OSError, ValueError):
            pass
        finally:
            listener.close()
            if log is not None:
                os.close(log)

    def kept(self):
        """What a node session keeps for its next attempt: (pid, socket path, what it was
        started for) of a warm process still there, or None."""
        if self.session is None or self.pid is None or not _alive(self.pid):
            return None
        return self.pid, self.path, self.made_for

    def pruned(self, pid):
        """What the supervisor's TERM leaves the descendants of: a rank shim (it forwards
        the stop to its rank) and the warm process (its children are ranks whose shims
        forward it; the warm process itself ignores the TERM and goes with the KILL)."""
        return pid == self.pid or self.sup.is_shim(pid)

    def spawn_job(self, argv, env, ctr):
        """``spawn`` the job; with a warm process, torchrun's agent forked from it (it then
        becomes our child: the starter stands in for it until it hands over)."""
        if self.pid is not None and self.sup.subreaper and not ctr:
            job, out_fd, err_fd, self.handoff = spawn_agent(argv, env, env[WARM_SOCK_ENV])
            self.reaped_early = {}
            return job, out_fd, err_fd
        return spawn(argv, env)

    def reaped_other(self, pid, status):
        """A reaped child that is not the job (``self.sup.job``) as the supervisor knows it."""
        if pid == self.sup.job and self.handoff is not None:
            self.handed(status)  # the starter ended: the agent's pid, or it was the job
        elif self.reaped_early is not None:  # the agent may end before its starter
            self.reaped_early[pid] = status

    def handed(self, status):
        """The starter ended: from now on the agent is the job (``self.sup.job``); when it
        handed over none, the starter was the job (it became the cold agent)."""
        agent = handed_over(self.handoff, status)
        self.handoff = None
        early = self.reaped_early or {}
        self.reaped_early = None
        if agent is None:
            self.sup.job_status = status
            return
        self.sup.job = agent
        if agent in early:
            self.sup.job_status = early[agent]


def _alive(pid):
    """The warm process is still there (not a zombie, not another process's pid: its title)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().startswith(b"dtrain warm ")
    except OSError:
        return False


def _kill(pid):
    SPARED.discard(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _nproc(argv):
    """torchrun's --nproc-per-node in ``argv`` as a number (0: not a number: gpu, auto)."""
    for flag in ("--nproc-per-node", "--nproc_per_node"):
        if flag in argv[:-1]:
            value = argv[argv.index(flag) + 1]
            return int(value) if value.isdigit() else 0
    return 0



# -- torchrun's agent, forked ------------------------------------------------------------------
def spawn_agent(argv, env, warm_path):
    """``nodeprocs.spawn`` for torchrun's agent (``argv``: python -c TORCHRUN_ISOLATED ...) on
    a node with a warm process at ``warm_path``: (the starter's pid, stdout fd, stderr fd,
    the hand-over fd). The starter is the job until it hands over: ``handed_over`` then says
    the agent's pid (or None: the starter became the cold agent, or could not start it)."""
    for key, value in env.items():
        if "=" in key or "\0" in key or "\0" in value:
            raise ValueError("illegal environment variable name or value: %r" % (key,))
    fds = []
    try:
        null = os.open(os.devnull, os.O_RDWR)
        fds.append(null)
        for _ in range(3):
            fds += list(os.pipe())
        out_r, out_w, err_r, err_w, hand_r, hand_w = fds[1:]
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, TEARDOWN_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                _starter(argv, env, warm_path, (null, out_w, err_w, hand_w), mask)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for fd in (null, out_w, err_w, hand_w):
        os.close(fd)
    os.set_blocking(hand_r, False)
    return pid, out_r, err_r, hand_r


def _starter(argv, env, warm_path, fds, mask):
    """In the forked starter: the agent from the warm process (its pid on the hand-over
    pipe, exit 0), else become the cold agent (``_exec_child``: its exec error, if any, on
    the same pipe). Never returns."""
    null, out_w, err_w, hand_w = fds
    try:
        for sig in TEARDOWN_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)  # a stop meanwhile ends the starter: the job
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        s, pid, _ = _request(warm_path, argv[1:], env, [null, out_w, err_w], ROLE_AGENT)
        s.close()
        os.write(hand_w, b"%d\n" % pid)
        os._exit(0)
    except BaseException:
        pass
    _exec_child(argv, env, null, out_w, err_w, hand_w, mask)


def handed_over(hand_r, status):
    """The agent's pid once the starter has ended with ``status`` and its hand-over said
    one; None when the starter itself was the job (the cold agent, or its exec error)."""
    data = b""
    try:
        while True:
            chunk = os.read(hand_r, 64)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    os.close(hand_r)
    line = data.strip()
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and line.isdigit():
        return int(line)
    return None


def agent_main(argv):
    """torchrun's agent forked from the warm process: what ``python -c CODE ARGS`` does (the
    code in a fresh ``__main__`` namespace, ``sys.argv`` ``['-c', ARGS...]``, ``''`` first
    on sys.path); ``warm.forked`` ends it as the interpreter would."""
    import builtins

    code = argv[1]
    sys.argv = ["-c"] + list(argv[2:])
    if sys.path:
        sys.path[0] = ""
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__",
                                            "__builtins__": builtins})
