"""The rank shim and the rank itself: how each worker torchrun starts is wired to the node.

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``); runs on the nodes,
standard library only, Python >= 3.8. The shipped bundle is written to the supervisor's
private directory and torchrun starts it as each worker: in *shim* mode (``shim_main``) it
connects the rank's stdout/stderr to the supervisor and reports its exit; in *rank* mode
(``rank_main``) it arms the stack dumper and the flight recorder, then runs the user's
script as ``__main__``.
"""

# signal.py only wraps _signal in enums, and importing enum costs ~3.5 ms of CPU per node
import _signal as signal  # type: ignore[import-not-found]  # (no stub: typeshed lacks it)
import _thread
import os
import struct
import sys

from launcher.nodeside.nodecommon import (
    DIR_PLACEHOLDER,
    _prctl,
    hostname,
    now,
)
from launcher.nodeside.nodetitle import set_title
from launcher.nodeside.warm import WARM_SOCK_ENV
from launcher.nodeside.warmclient import warm_spawn

SHIM_ENV = "DTRAIN_SHIM_SOCK"
# torchrun's temp dir (its /tmp/torchelastic_* log dirs) goes into our private dir, which
# teardown removes; the shim gives each worker the TMPDIR it would have had
TMPDIR_ENV = "DTRAIN_WORKER_TMPDIR"
SHIM_PLACEHOLDER = "{DTRAIN_SHIM}"
# `python -m torch.distributed.run` puts the working directory first on sys.path, where a
# project's random.py would shadow torchrun's own imports (the `torchrun` script does not
# see it): the same agent, without that entry. The ranks get their script's directory
# from the rank shim, as under plain torchrun.
# First it gives torchrun's agent its title in ps (``agent_title``, from the shim's bundle
# beside the ranks' socket: set_title stays one copy; compiling the bundle costs what each
# rank shim's start costs, once per node, against torch's seconds of import).
# Before it runs torchrun, the line tells the supervisor when torchrun's agent has imported
# torch and its launcher (an ``agent`` header on the ranks' socket: the start-up split's
# agent_start/rendezvous bound, docs/goodput.md); nothing of that ever stops torchrun.
TORCHRUN_ISOLATED = ("import sys\nif sys.path and sys.path[0] in ('', '.'):\n    del sys.path[0]\n"
                     "try:\n    import os\n"
                     "    p = os.path.join(os.path.dirname(os.environ['" + SHIM_ENV + "']), "
                     "'dtrain_shim.py')\n"
                     "    with open(p, 'rb') as f:\n        c = compile(f.read(), p, 'exec')\n"
                     "    g = {'__name__': 'dtrain_agent'}\n    exec(c, g)\n"
                     "    g['agent_title']()\n    del c, g\n"
                     "except Exception:\n    pass\n"
                     "try:\n    import torch.distributed.launcher.api\n"
                     "    import os, json, socket, time\n"
                     "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                     "    s.connect(os.environ['" + SHIM_ENV + "'])\n"
                     "    s.sendall(json.dumps({'stream': 'agent', 'pid': os.getpid(), "
                     "'t': time.time()}).encode() + b'\\n')\n    s.close()\n"
                     "except Exception:\n    pass\n"
                     "import runpy\nrunpy.run_module('torch.distributed.run', "
                     "run_name='__main__', alter_sys=True)\n")
# the titles of the rank's two processes in ps (set_title): the shim torchrun started, and
# the rank; is_shim knows a shim by its title
RANK_TITLE = b"dtrain rank "
# torchrun's comm: torch names its agent's main thread so once torchrun's run() starts
# (torch.multiprocessing._set_thread_name); the same name from the first instant, not two
AGENT_COMM = "pt_elastic"


def job_argv(spec, tmpdir):
    """The job's command line from the spec (and, in run mode, our private directory ``tmpdir``:
    the rank shim's path put in, torchrun made to run isolated): (argv, the shim's path as
    bytes, or None)."""
    if spec.get("shell") is not None:
        # in an image the login shell of the host may not exist: its /bin/sh
        shell = "/bin/sh" if spec.get("container") else os.environ.get("SHELL") or "/bin/sh"
        command = spec["shell"]
        # one argument starting with '-' is a command, not an option of the shell:
        # '--' ends the options of sh, bash, dash, zsh, ksh and fish; csh and tcsh
        # take the next word as the command anyway, so a space keeps it from looking
        # like an option there
        if os.path.basename(shell) in ("csh", "tcsh"):
            return [shell, "-c", " " + command if command.startswith("-") else command], None
        return [shell, "-c", "--", command], None
    argv = list(spec["argv"])
    if not tmpdir:
        return argv, None
    shim = os.path.join(tmpdir, "dtrain_shim.py")
    argv = [shim if a == SHIM_PLACEHOLDER else a.replace(DIR_PLACEHOLDER, tmpdir) for a in argv]
    for i in range(1, len(argv) - 1):
        if argv[i:i + 2] == ["-m", "torch.distributed.run"]:
            argv[i:i + 2] = ["-c", TORCHRUN_ISOLATED]
            break
    return argv, shim.encode()


def agent_title():
    """torchrun's agent in ps: ``dtrain torchrun RUN node2`` (the supervisor's is ``dtrain
    supervisor RUN node2``), comm ``pt_elastic``, torch's own; TORCHRUN_ISOLATED calls it."""
    run_id = os.environ.get("DTRAIN_RUN_ID")
    set_title("dtrain torchrun %s%s" % (run_id + " " if run_id else "", hostname()),
              AGENT_COMM)


# -- evidence: stacks on demand, why a rank died (docs/hangs.md) -------------------------------
# The rank shim starts each worker through this same file in *rank* mode (``rank_main``):
# before the user's script runs, faulthandler is armed on STACK_SIGNAL (all threads, into a
# per-rank file of the supervisor's private directory) and on fatal signals (into a crash
# file), and one more unix socket tells the supervisor the worker's pid. A ``stacks`` control
# line makes the supervisor signal every armed worker and ship the new text back as a
# ``stacks`` message. Nothing here ever raises into the user's job: arming that fails leaves
# the worker exactly as it would have run.
ARM_ENV = "DTRAIN_ARM_SOCK"
STACKS_OFF_ENV = "DTRAIN_STACKS"  # "0": no wrapper, no dumper (docs/hangs.md)
PTRACER_ENV = "DTRAIN_PTRACER"
# a real-time signal: no library we know uses it, and its default action (terminate) never
# applies: the supervisor signals only workers that reported the handler armed
STACK_SIGNAL = getattr(signal, "SIGRTMAX", 64) - 4
PR_SET_PTRACER = 0x59616D61
# PyTorch's flight recorder: every variable a user may have set for it (one set = hands off)
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_DUMP_VAR = "TORCH_NCCL_DUMP_ON_TIMEOUT"
FR_ENTRIES = "2000"  # the flight recorder tutorial's advice
FR_PREFIX = "rank_"
# the arm socket, once armed, and the lock its two writers share (the helper thread's
# replies, the main thread's ``raised`` note)
_ARMED = []  # type: list[object]


def flight_defaults(env, directory, names="current"):
    """The flight recorder's variables dtrain adds to a rank's environment: none when the
    user set any of its buffer variables; otherwise a 2000-entry buffer, dump on timeout,
    and the dumps into ``directory`` (``<directory>/rank_<N>``, the analyzer's layout).
    ``names``: "current" (TORCH_FR_*, torch >= 2.9), "legacy" (TORCH_NCCL_*), "both"."""
    if any(env.get(name) for name in FR_BUFFER_VARS):
        return {}
    pick = {"current": (0,), "legacy": (1,)}.get(names, (0, 1))
    add = {FR_BUFFER_VARS[i]: FR_ENTRIES for i in pick}
    if not env.get(FR_DUMP_VAR):
        add[FR_DUMP_VAR] = "1"
    if not any(env.get(name) for name in FR_FILE_VARS):
        for i in pick:
            add[FR_FILE_VARS[i]] = os.path.join(directory, FR_PREFIX)
    return add


ATTEMPT_ENV = "DTRAIN_ATTEMPT"  # dtrain run --restarts: 1, 2, ... (decide/outcome/restarts.py)


def rank_argv(argv, sock_path):
    """The worker's command line: the user's script through this file's rank mode."""
    if os.environ.get(STACKS_OFF_ENV) == "0":
        return [sys.executable, "-u"] + argv
    return [sys.executable, "-u", os.path.abspath(rank_argv.__code__.co_filename)] + argv


def rank_env(sock_path):
    env = dict(os.environ)
    attempt = env.get(ATTEMPT_ENV, "")
    if attempt.isdigit() and int(attempt) > 1:
        # torchrun sets its own restart count (0 on a fresh agent): dtrain's relaunches of
        # the whole gang count too, as the snapshot convention expects (docs/restarts.md)
        own = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        own_n = int(own) if own.isdigit() else 0
        env["TORCHELASTIC_RESTART_COUNT"] = str(own_n + int(attempt) - 1)
    if env.get(STACKS_OFF_ENV) != "0":
        env[ARM_ENV] = sock_path
    return env


def rank_title(argv, shim=False):
    """``dtrain rank 3 train.py --lr 1`` (the rank), ``dtrain rank 3 shim: train.py ...``."""
    rank = os.environ.get("RANK", "?")
    return "dtrain rank %s %s%s" % (rank, "shim: " if shim else "", " ".join(argv))


def rank_main(argv):
    """Rank mode: arm the dumpers, then become the user's script (as ``python SCRIPT``)."""
    set_title(rank_title(argv), "dtrain-r" + os.environ.get("RANK", "?"))
    keep = _arm(os.environ.pop(ARM_ENV, ""))
    os.environ.pop(PTRACER_ENV, None)
    _run_user(argv)
    del keep


def _arm(sock_path):
    """faulthandler on STACK_SIGNAL and fatal signals, and the supervisor told; the open
    files and the socket are returned to be kept alive. Never raises."""
    keep = []  # type: list[object]
    try:
        import faulthandler
        import json
        import socket

        rank = int(os.environ.get("RANK", "-1"))
        folder = os.path.join(os.path.dirname(sock_path), "stacks")
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        stack_path = os.path.join(folder, "r%d.txt" % rank)
        dump = open(stack_path, "a")
        keep.append(dump)
        faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True, chain=False)
        crash_path = None
        if not faulthandler.is_enabled():  # PYTHONFAULTHANDLER / -X faulthandler: theirs
            crash_path = os.path.join(folder, "r%d.crash" % rank)
            crash = open(crash_path, "a")
            keep.append(crash)
            faulthandler.enable(file=crash, all_threads=True)
        tracer = os.environ.get(PTRACER_ENV)
        if tracer:  # Yama ptrace_scope 1: let the supervisor's py-spy read this process
            try:
                import ctypes

                ctypes.CDLL(None).prctl(PR_SET_PTRACER, int(tracer), 0, 0, 0)
            except Exception:
                pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(sock_path)
        # t: the hand-over to the user's script, next (the start-up split, docs/goodput.md)
        sock.sendall(json.dumps({
            "rank": rank, "stream": "arm", "pid": os.getpid(), "stacks": stack_path,
            "crash": crash_path, "signal": STACK_SIGNAL, "t": now()}).encode() + b"\n")
        keep.append(sock)
        lock = _thread.allocate_lock()
        _ARMED[:] = [sock, lock]
        _thread.start_new_thread(_arm_helper, (sock, json, lock))
    except Exception:
        pass
    return keep


def _arm_helper(sock, json, lock):
    """In the worker, idle until asked: a flight recorder dump (``fr``) into a file.

    Started with _thread (threading.enumerate() does not list it). It runs only on a
    request, and takes the GIL only then: a main thread holding the GIL in C leaves the
    request unanswered (the supervisor's wait is bounded), never stuck.
    """
    buf = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
                reply = {"op": req.get("op"), "ok": False}
                if req.get("op") == "fr":
                    reply.update(_flight_dump(req.get("path")))
                with lock:
                    sock.sendall(json.dumps(reply).encode() + b"\n")
            except Exception:
                pass


def _tell_raised(name):
    """Tell the supervisor this rank is failing of its own (an uncaught exception, a
    non-zero sys.exit), before the interpreter's exit closes its gloo/NCCL connections: a
    peer that aborts on the closed connection is then known for a victim, however long this
    process takes to end (docs/failure-semantics.md). Never raises."""
    if not _ARMED:
        return
    sock, lock = _ARMED
    try:
        import json

        with lock:  # type: ignore[attr-defined]
            sock.sendall(json.dumps({"op": "raised", "exc": str(name)[:120]}).encode()  # type: ignore[attr-defined]
                         + b"\n")
    except Exception:
        pass


def _flight_dump(path):
    """The flight recorder's pickle (fr_trace's format) into ``path``, when torch.distributed
    is in use in this process (never imports torch itself)."""
    dist = sys.modules.get("torch.distributed")
    torch = sys.modules.get("torch")
    if dist is None or torch is None or not dist.is_initialized():
        return {"error": "torch.distributed not initialized"}
    c10d = torch._C._distributed_c10d
    try:
        backend = str(dist.get_backend()).lower()  # "nccl", "gloo", "cpu:gloo,cuda:nccl"
    except Exception:
        backend = ""
    # NCCL's collectives are in their own recorder: _dump_fr_trace holds only the other
    # backends' and gives an empty dump for an NCCL job (seen on an H200, docs/gpu-check.md)
    names = ("_dump_nccl_trace", "_dump_fr_trace") if "nccl" in backend else (
        "_dump_fr_trace", "_dump_nccl_trace")
    dump = next((getattr(c10d, n) for n in names if hasattr(c10d, n)), None)
    if dump is None:
        return {"error": "flight recorder: this torch has none"}
    try:
        try:
            # without the call sites' stacks: their first symbolization takes seconds, and
            # the rank's own stacks come from faulthandler anyway
            data = dump(includeStackTraces=False)
        except TypeError:  # an older torch without the keyword
            data = dump()
    except Exception as exc:
        return {"error": "flight recorder: %s" % (exc,)}
    with open(path, "wb") as f:
        f.write(data)
    return {"ok": True, "size": len(data)}


def _run_user(argv):
    """Run the user's script (or ``-m module``) as ``python -u SCRIPT ARGS`` would: a fresh
    ``__main__``, sys.argv, sys.path[0]; an uncaught exception prints the same traceback
    (our own frames left out) and exits 1."""
    import types

    if argv[0] == "-m" and len(argv) > 1:
        import runpy

        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        sys.modules["__main__"] = types.ModuleType("__main__")
        _guarded(lambda: runpy._run_module_as_main(argv[1], True))  # type: ignore[attr-defined]  # what -m does
        return
    path = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    if os.path.isdir(path) or not path.endswith(".py") and _is_zip(path):
        import runpy

        _guarded(lambda: runpy.run_path(path, run_name="__main__"))
        return
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (
            sys.executable, path, exc.errno or 0, exc.strerror))
        sys.exit(2)
    import builtins
    from importlib.machinery import SourceFileLoader

    filename = os.path.abspath(path)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=filename, __builtins__=builtins, __cached__=None,
                         __loader__=SourceFileLoader("__main__", filename))
    sys.modules["__main__"] = main
    # compiled inside the guard: a SyntaxError is shown at the user's file:line, not here
    _guarded(lambda: exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__))


def _is_zip(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _guarded(run):
    """An uncaught exception is printed as Python prints it, without this file's frames."""
    try:
        run()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _tell_raised("SystemExit")
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _tell_raised(type(exc).__name__)
        own = _guarded.__code__.co_filename
        tb = exc.__traceback__
        while tb is not None and (tb.tb_frame.f_code.co_filename == own
                                  or tb.tb_frame.f_code.co_filename.endswith("runpy.py")
                                  or tb.tb_frame.f_code.co_filename == "<frozen runpy>"):
            tb = tb.tb_next
        exc.__traceback__ = tb  # hooks that format exc itself (torch's) see the same
        sys.excepthook(type(exc), exc, tb)
        del exc, tb
        sys.exit(1)


def shim_main(argv):
    """Rank shim: run one worker with stdout/stderr wired straight to the supervisor.

    torchrun starts ``python -u dtrain_shim.py [-m] script args`` as each worker; we connect
    three unix sockets (out, err, ctl), start the real worker with the first two as its
    stdout/stderr, forward a stop, report its exit status and exit the same way.

    One stop, one signal: the rank runs in a process group of its own (so torchrun's killpg
    of its worker reaches only us), and the first SIGTERM/SIGINT/SIGHUP we get, from the
    supervisor or from torchrun, is sent on to the rank's group; later ones are the same
    stop arriving by another road (the supervisor, torchrun and the user each send one) and
    are not repeated. A first one from anyone else is passed on too, and reported as what
    killed the rank (``signal_from``), not as a stop. The KILL after the grace comes from
    the supervisor; if we are KILLed ourselves, the rank is too (PR_SET_PDEATHSIG), as
    torchrun's killpg would have done.
    """
    import json  # the shim runs once per rank under torchrun: not on the exec path
    import socket
    import subprocess

    path = os.environ.pop(SHIM_ENV)
    warm_path = os.environ.pop(WARM_SOCK_ENV, None)  # the node's warm process (warm.py)
    rank = int(os.environ.get("RANK", "-1"))
    tmpdir = os.environ.pop(TMPDIR_ENV, None)
    if tmpdir:
        os.environ["TMPDIR"] = tmpdir
    elif tmpdir is not None:
        os.environ.pop("TMPDIR", None)

    def connect(stream):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(json.dumps({"rank": rank, "stream": stream, "pid": os.getpid()}).encode()
                  + b"\n")
        return s

    # The stop signals (and SIGCHLD) are taken with sigwaitinfo, which says who sent each:
    # a stop from torchrun (our parent) or the supervisor (the sockets' peer) is a stop; a
    # signal from anyone else (a stray `kill`, a watchdog) kills the rank as it would have
    # killed it, and the report carries no stop_signal: the rank's death is a root cause,
    # as it is when the signal hits the rank itself (issue 40)
    # SIGIO: a rank forked by the warm process ended (its socket has the news, warm.py)
    waited = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGIO)
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    out, err, ctl = connect("out"), connect("err"), connect("ctl")
    set_title(rank_title(argv, shim=True), "dtrain-shim")
    ours = {0, os.getpid(), os.getppid()}  # 0: the kernel, or a sender in another pid namespace
    try:
        ours.add(struct.unpack("3i", ctl.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0])
    except (OSError, AttributeError, struct.error):
        pass
    env = rank_env(path)
    # forked from the node's warm interpreter when there is one (its own session, these
    # descriptors, env and cwd); else started cold, as `python -u dtrain_shim.py ARGV`
    child = warm_spawn(warm_path, argv, env, [0, out.fileno(), err.fileno()]) \
        if warm_path and os.environ.get(STACKS_OFF_ENV) != "0" else None
    cold = child is None
    if child is None:
        child = subprocess.Popen(rank_argv(argv, path), stdout=out.fileno(),
                                 stderr=err.fileno(), env=env, start_new_session=True,
                                 preexec_fn=_die_with_parent(os.getpid(), waited))
    out.close()
    err.close()
    started = now()
    stop = None
    outside = None
    code = child.poll()
    while code is None:
        # a warm rank's end is a SIGIO (the 1 s bound only a second guard against a lost one)
        info = signal.sigwaitinfo(waited) if cold else signal.sigtimedwait(waited, 1.0)
        if info is not None and info.si_signo not in (signal.SIGCHLD, signal.SIGIO) \
                and stop is None:
            stop = info.si_signo  # one stop, one signal: later ones are the same stop
            if info.si_pid not in ours:
                outside = info.si_pid
            try:
                os.killpg(child.pid, stop)
            except OSError:
                pass
        code = child.poll()
    sig = -code if code < 0 else None
    msg = {"code": 128 + sig if sig else code, "signal": sig, "t": now(),
           "duration": now() - started, "pid": child.pid}
    if stop is not None and outside is None:
        msg["stop_signal"] = stop  # it was asked to stop: whatever it exited with
    elif outside is not None:
        msg["signal_from"] = outside  # someone else's signal, passed on to the rank
    try:
        ctl.sendall(json.dumps(msg).encode() + b"\n")
        ctl.close()
    except OSError:
        pass
    # later stop signals are the same stop: dropped; then die the same way as the rank, so
    # torchrun sees the worker's signal (SIGKILL/SIGSTOP cannot have a handler: setting
    # SIG_DFL for them raises)
    for other in waited[:3] + (signal.SIGIO,):
        signal.signal(other, signal.SIG_IGN)
    if sig:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
    if sig:
        os.kill(os.getpid(), sig)
    return code


def _die_with_parent(parent, blocked=()):
    """A preexec_fn: the rank gets SIGKILL when the shim dies (PR_SET_PDEATHSIG), and the
    signals the shim blocked (to wait for them) unblocked."""
    PR_SET_PDEATHSIG = 1
    try:
        prctl = _prctl()
    except Exception:
        prctl = None

    def preexec():
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the shim died before that took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec
