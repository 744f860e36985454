"""Warm start: each rank forked from one interpreter per node that has imported torch once.

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``), before the rank
shim; runs on the nodes, standard library only, Python >= 3.8 (no os.pidfd_open, no
socket.send_fds: both 3.9+). Three sides live here (docs/warm-start.md):

- the supervisor's (``WarmStart.start_warm``): in run mode, before torchrun starts, it binds
  ``warm.sock`` in its private directory (0700) and starts the *warm process* with the job's
  python, in a session of its own, beside torchrun's agent;
- the warm process's (``warm_main``): it imports torch and the ``--preload`` modules, checks
  that forking is safe (one thread left, CUDA not initialised), then forks a rank for each
  request and tells the asking shim its pid and, later, its end. When anything of that
  fails it says why once on the node's stderr stream and exits: every shim starts its rank
  cold, as ``--no-preload`` does;
- the rank shim's (``warm_spawn``, ``WarmRank``): instead of starting ``python -u
  dtrain_shim.py SCRIPT`` it sends the warm process the rank's argv, environment and working
  directory, and its stdin/stdout/stderr as descriptors (SCM_RIGHTS).

A forked rank returns from ``warm_main`` into the bundle's ``main`` with its own sys.argv and
environment and goes on exactly as a cold rank (``rank_main``), so its exit (codes, an
uncaught exception, a signal death, atexit, threads joined) is the interpreter's own.
"""

# signal.py only wraps _signal in enums (see rankshim.py)
import _signal as signal  # type: ignore[import-not-found]  # (no stub: typeshed lacks it)
import os
import struct
import sys

from launcher.nodeside.nodecommon import (
    _prctl,
    hostname,
)
from launcher.nodeside.nodetitle import set_title

WARM_FD_ENV = "DTRAIN_WARM_FD"  # warm mode: the listening socket's descriptor
WARM_SOCK_ENV = "DTRAIN_WARM_SOCK"  # the rank shim: where the warm process listens
PRELOAD_ENV = "DTRAIN_WARM_PRELOAD"  # the --preload modules, comma-separated
# the warm process's last environment variable: room in its environment area for a forked
# rank's own (``environ_block``), which /proc/PID/environ shows (the sampler finds ranks by it)
PAD_ENV = "DTRAIN_WARM_PAD"
PAD_BYTES = 65536
# the ranks' socket, for the warm process's one note (not DTRAIN_SHIM_SOCK: what has that in
# its environment is torchrun or a rank shim, to the supervisor's tests and a node's admin)
NOTE_ENV = "DTRAIN_WARM_NOTE"
PARENT_ENV = "DTRAIN_WARM_PARENT"  # the supervisor's pid: the warm process dies with it
# the warm process's last argument: room in its argv area for the rank's title (set_title)
TITLE_ROOM = 256
# how long a shim waits for the warm process's answer (it may still be importing) before it
# starts its rank cold
WARM_WAIT_S = 600.0
REQUEST_V = 1
# what a request asks for: a rank (the shim's), or torchrun's agent (the supervisor's: forked
# twice, so that the supervisor, a child subreaper, becomes its parent: warmclient.py)
ROLE_RANK, ROLE_AGENT = "rank", "agent"
# what the warm process imports besides torch and --preload when it serves torchrun's agent
# too: what torch.distributed.run imports (all but 2 modules, 1 ms), not that module itself,
# which the agent runs as __main__ (runpy warns when it is in sys.modules already)
AGENT_MODULES = ("torch.distributed.launcher.api",)
MAX_REQUEST = 16 << 20
# what the warm process ignores (a stray signal to the supervisor's tree must not end it and,
# through PR_SET_PDEATHSIG, every rank); a forked rank gets the defaults back
WARM_IGNORED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM")
# the variables a node's tools look for first: kept first when a rank's environment does
# not fit the area
ENV_FIRST = ("DTRAIN_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK")
WARM_NOTE = ("dtrain: warm start off on this node (%s): its ranks start cold, as with "
             "--no-preload\n")


# -- pure parts (tests/test_warm_unit.py) --------------------------------------------------
def encode_request(argv, env, cwd, role=ROLE_RANK):
    """A request to the warm process (``role``: a rank, or torchrun's agent): 4-byte
    length, then JSON."""
    import json

    body = json.dumps({"v": REQUEST_V, "argv": list(argv), "env": dict(env),
                       "cwd": cwd, "role": role}).encode()
    return struct.pack("!I", len(body)) + body


def request_size(buf):
    """The whole request's size once its length is in ``buf``, else None."""
    if len(buf) < 4:
        return None
    size = struct.unpack("!I", buf[:4])[0]
    if size > MAX_REQUEST:
        raise ValueError("request of %d bytes" % size)
    return 4 + size


def decode_request(data):
    """(argv, env, cwd, role) of an encoded request; ValueError when it is not one."""
    import json

    size = request_size(data)
    if size is None or len(data) != size:
        raise ValueError("incomplete request")
    req = json.loads(data[4:].decode())
    argv, env, cwd = req.get("argv"), req.get("env"), req.get("cwd")
    role = req.get("role", ROLE_RANK)
    if role not in (ROLE_RANK, ROLE_AGENT) or req.get("v") != REQUEST_V \
            or not isinstance(argv, list) or not argv \
            or not all(isinstance(a, str) for a in argv) or not isinstance(env, dict) \
            or not all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                       and "\0" not in k + v for k, v in env.items()) \
            or not isinstance(cwd, str) or not cwd:
        raise ValueError("not a rank request")
    return argv, env, cwd, role


def fork_safety(threads, cuda_initialized):
    """Why forking this process is not safe, or None: a thread left running would be missing
    (with whatever lock it held) in every child; an initialised CUDA context cannot be used
    across fork."""
    if cuda_initialized:
        return "CUDA initialised before fork"
    if threads != 1:
        return "%d threads running before fork" % threads
    return None


def exit_of(si_code, si_status):
    """A waitid result as subprocess's returncode: the exit code, or -N for signal N."""
    if si_code == getattr(os, "CLD_EXITED", 1):
        return si_status
    return -si_status


def environ_block(env, size):
    """``size`` bytes for a process's environment area: NAME=VALUE entries, NUL-ended, the
    ones in ENV_FIRST first, those that do not fit left out, NUL padding after."""
    keys = [k for k in ENV_FIRST if k in env] + sorted(k for k in env if k not in ENV_FIRST)
    out = bytearray()
    for key in keys:
        item = (key + "=" + env[key]).encode("utf-8", "surrogateescape") + b"\0"
        if len(out) + len(item) <= size:
            out += item
    return bytes(out) + b"\0" * (size - len(out))


# -- the warm process ------------------------------------------------------------------------
def warm_main():
    """The warm process: preload, check, serve. Returns only in a forked rank or agent:
    (role, argv), its environment set (the bundle's ``main`` then runs a rank as a cold
    rank, ``rank_main``, and the agent as ``python -c``: warmclient.agent_main)."""
    fd = int(os.environ.pop(WARM_FD_ENV))
    mods = [m for m in os.environ.pop(PRELOAD_ENV, "").split(",") if m]
    note = os.environ.pop(NOTE_ENV, "")
    parent = os.environ.pop(PARENT_ENV, "")
    try:  # a supervisor KILLed leaves no warm process (nor, through theirs, its ranks)
        _prctl()(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(0)  # it died before that took effect
    os.environ.pop(PAD_ENV, None)
    run_id = os.environ.get("DTRAIN_RUN_ID")
    set_title("dtrain warm %s%s" % (run_id + " " if run_id else "", hostname()), "dtrain-warm")
    for name in WARM_IGNORED:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    import gc

    # Python's advice for a process that forks without exec: no collection in the parent
    # (no freed holes in its pages), its objects frozen before the fork (a child's
    # collections leave their pages shared); each child enables the collector again
    gc.disable()
    try:
        import socket

        listener = socket.socket(fileno=fd)
        why = _preload(["torch"] + list(AGENT_MODULES) + mods)
        if why is None:
            why = _fork_check()
    except Exception as exc:
        why = "%s: %s" % (type(exc).__name__, exc)
    if why is not None:
        _note(note, why)
        os._exit(0)
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    return _serve(listener)


def _preload(mods):
    """None, or why a module could not be imported."""
    import importlib

    for name in mods:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a module's SystemExit or KeyboardInterrupt too
            return "import %s failed: %s: %s" % (name, type(exc).__name__, str(exc)[:200])
    return None


def _fork_check():
    """fork_safety after one throwaway fork: its prepare handlers park the thread pools of
    the libraries that know fork (OpenBLAS, under numpy, joins its threads then and starts
    them again when next used); what still runs after that would run in no child."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    torch = sys.modules.get("torch")
    try:
        cuda = bool(torch.cuda.is_initialized()) if torch is not None else False
    except Exception:
        cuda = False
    return fork_safety(len(os.listdir("/proc/self/task")), cuda)


def _note(path, why):
    """The one line that says this node's ranks start cold, on the node's stderr stream
    (the ranks' socket, as node-level output: rank -1)."""
    try:
        import json
        import socket

        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(json.dumps({"rank": -1, "stream": "err", "pid": os.getpid()}).encode()
                  + b"\n" + (WARM_NOTE % why.replace("\n", " ")).encode("utf-8", "replace"))
        s.close()
    except Exception:
        pass


class _Conn:
    """One shim's connection: its request as it arrives, then its rank."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.fds = []  # type: list[int]
        self.pid = None  # the forked rank
        self.exited = False  # its end sent (the zombie is reaped when the shim closes)
        self.agent = False  # it asked for torchrun's agent: nothing more is asked or owed


def _serve(listener):
    import select
    import socket

    listener.setblocking(False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, _woken)
    poll = select.poll()
    poll.register(listener.fileno(), select.POLLIN)
    poll.register(wake_r, select.POLLIN)
    conns = {}  # fd -> _Conn
    uid = os.getuid()
    while True:
        for fd, _ in poll.poll():
            if fd == listener.fileno():
                try:
                    sock, _ = listener.accept()
                except OSError:
                    continue
                peer = struct.unpack("3i", sock.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
                if peer[1] != uid:  # the directory is 0700: only ours (or root) get here
                    sock.close()
                    continue
                sock.setblocking(False)
                conns[sock.fileno()] = _Conn(sock)
                poll.register(sock.fileno(), select.POLLIN)
            elif fd == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except OSError:
                    pass
            elif fd in conns:
                argv = _readable(conns[fd], conns, poll, (listener, wake_r, wake_w))
                if argv is not None:
                    return argv  # in the forked rank
        _ended(conns, poll)


def _woken(signum, frame):
    """SIGCHLD: the wake-up descriptor wakes the poll."""


def _readable(conn, conns, poll, own):
    """Read a shim's connection: the request (then fork: returns the argv in the child), or
    its close (the rank is KILLed if it still runs: the shim died, as PR_SET_PDEATHSIG)."""
    import socket

    try:
        data, anc, _, _ = conn.sock.recvmsg(1 << 16, socket.CMSG_SPACE(16))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        data, anc = b"", []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            n = len(payload) // 4
            conn.fds += list(struct.unpack("%di" % n, payload[:4 * n]))
    if not data:
        _drop(conn, conns, poll)
        return None
    if conn.pid is not None or conn.agent:
        return None  # nothing more is asked of a connection once its rank runs
    conn.buf += data
    try:
        size = request_size(conn.buf)
        if size is None or len(conn.buf) < size:
            return None
        argv, env, cwd, role = decode_request(conn.buf[:size])
        if len(conn.fds) != 3:
            raise ValueError("%d descriptors, not 3" % len(conn.fds))
    except ValueError:
        _drop(conn, conns, poll)
        return None
    if role == ROLE_AGENT:
        return _fork_agent(conn, argv, env, cwd, conns, own)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _become_rank(argv, env, cwd, conn.fds, conns, own, parent)
        except BaseException:
            os._exit(127)
        return ROLE_RANK, argv
    conn.pid = pid
    _close_fds(conn)
    try:
        conn.sock.sendall(b'{"pid": %d}\n' % pid)
    except OSError:
        pass  # its close comes next: the rank is KILLed then
    return None


def _fork_agent(conn, argv, env, cwd, conns, own):
    """torchrun's agent (the supervisor asked, warmclient.spawn_agent), forked twice: the
    middle process tells the asker the agent's pid and exits at once, so the agent is
    reparented to the supervisor (a child subreaper), which waits for it, signals it and
    tears its tree down exactly as a cold agent's. Not the warm process's child: it keeps
    nothing of it (no PR_SET_PDEATHSIG on the warm process either: a cold agent has none)."""
    pid = os.fork()
    if pid == 0:
        try:
            agent = os.fork()
            if agent == 0:
                _become_rank(argv, env, cwd, conn.fds, conns, own, None)
                return ROLE_AGENT, argv
            conn.sock.setblocking(True)
            conn.sock.sendall(b'{"pid": %d}\n' % agent)
        except BaseException:
            pass
        os._exit(0)
    conn.agent = True
    _close_fds(conn)
    _ORPHANS.append(pid)  # reaped once it has exited
    return None


def _close_fds(conn):
    for f in conn.fds:
        try:
            os.close(f)
        except OSError:
            pass
    conn.fds = []


def _drop(conn, conns, poll):
    """The shim closed its connection (or sent no request): KILL its rank's group if the
    rank still runs, reap it if it ended."""
    _close_fds(conn)
    fd = conn.sock.fileno()
    poll.unregister(fd)
    del conns[fd]
    conn.sock.close()
    if conn.pid is None:
        return
    if not conn.exited:
        try:
            os.killpg(conn.pid, signal.SIGKILL)  # our unreaped child: the group is its own
        except OSError:
            pass
    _ORPHANS.append(conn.pid)


_ORPHANS = []  # type: list[int]  # ranks whose shim is gone: reaped once they end


def _ended(conns, poll):
    """Each rank that ended: its end to its shim (the zombie kept, so that the pid and its
    group stay the shim's to signal until it has read it); those whose shim is gone reaped."""
    for conn in list(conns.values()):
        if conn.pid is None or conn.exited:
            continue
        try:
            info = os.waitid(os.P_PID, conn.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is None or info.si_pid == 0:
            continue
        conn.exited = True
        try:
            conn.sock.setblocking(True)
            conn.sock.sendall(b'{"exit": %d}\n' % exit_of(info.si_code, info.si_status))
            conn.sock.setblocking(False)
        except OSError:
            pass
    for pid in list(_ORPHANS):
        try:
            done = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            done = True
        if done:
            _ORPHANS.remove(pid)


def _become_rank(argv, env, cwd, fds, conns, own, parent):
    """In the forked child: a session of its own, the shim's descriptors as 0/1/2, the
    rank's environment (os.environ and /proc/PID/environ) and working directory, fresh
    seeds, the signals' defaults; nothing of the warm process's sockets left open."""
    signal.set_wakeup_fd(-1)
    for name in WARM_IGNORED + ("SIGCHLD",):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    if parent is not None:  # a rank (not the agent: warmclient.py)
        try:
            _prctl()(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the warm process's death
        except Exception:
            pass
        if os.getppid() != parent:  # it died before that took effect
            os.kill(os.getpid(), signal.SIGKILL)
    for other in conns.values():
        other.sock.close()
    own[0].close()
    for f in own[1:]:
        os.close(f)
    for i, f in enumerate(fds):
        os.dup2(f, i)
    for f in fds:
        if f > 2:
            os.close(f)
    os.chdir(cwd)
    os.environ.clear()  # unsetenv each: C's environ holds only the rank's from here
    os.environ.update(env)
    _show_environ(env)
    _threads(env)
    np = sys.modules.get("numpy")
    if np is not None:  # numpy's legacy global RandomState is not reseeded at fork
        try:
            np.random.seed()
        except Exception:
            pass
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:  # a cold rank has an authkey of its own
        try:
            mp.current_process().authkey = os.urandom(32)
        except Exception:
            pass
    sys.argv = sys.argv[:1] + list(argv)
    import gc

    gc.enable()


def forked(run, argv):
    """Run a forked rank (``run``: rank_main) and end it as the interpreter ends a cold one:
    the same exit code (SystemExit's code, a message and 1, an uncaught exception's 1, a
    KeyboardInterrupt's death by SIGINT), non-daemon threads joined, atexit handlers run,
    stdout and stderr flushed; then os._exit, without the interpreter's teardown of every
    module and object, which in a forked process writes to (and so copies) every page it
    shares with the warm process: seconds with torch loaded, for nothing the rank keeps."""
    code, interrupted = 0, False
    try:
        run(argv)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 130, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # what Py_FinalizeEx calls first
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if interrupted:  # Python >= 3.8: an uncaught KeyboardInterrupt dies by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_code(code):
    """SystemExit's code as the interpreter's exit status (Py_HandleSystemExit)."""
    if code is None:
        return 0
    if type(code) is int:
        return code & 0xFF
    try:
        sys.stderr.write("%s\n" % (code,))
    except Exception:
        pass
    return 1


def _threads(env):
    """torch's intra-op threads as a cold rank's torch sets them from its environment
    (OMP_NUM_THREADS, else MKL_NUM_THREADS): OpenMP read the warm process's at import."""
    torch = sys.modules.get("torch")
    value = env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS") or ""
    if torch is not None and value.isdigit() and int(value) > 0:
        try:
            torch.set_num_threads(int(value))
        except Exception:
            pass


def _show_environ(env):
    """The rank's environment into this process's environment area, which
    /proc/PID/environ reads (the warm process's own, with PAD_ENV's room), as set_title
    writes the argv area. Nothing points there any more: os.environ.clear() unset each."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rfind(b")") + 2:].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (Linux >= 3.5)
        if end - start < 2:
            return
        fd = os.open("/proc/self/mem", os.O_RDWR)
        try:
            os.pwrite(fd, environ_block(env, end - start), start)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        pass
