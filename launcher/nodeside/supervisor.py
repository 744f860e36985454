"""dtrain node supervisor: THIS PROGRAM RUNS ON THE NODES, not on the login node.

Standard library only, Python >= 3.8. The launcher ships this file over the SSH channel
(see wire.py beside it: a length line, this source, then the job spec: marshal data after
a b"M", or JSON); nothing is installed on the nodes and no secret travels on a command line.

Start-up is paid by every node at every command, so the exec path imports only what is
built in or tiny (os, sys, select, struct, time, marshal, _thread, _signal, _json, _ctypes):
it forks and execs the job itself (``spawn``), polls with select.poll, writes JSON with
``to_json`` and decodes control lines with json only when one arrives. subprocess, json,
socket, tempfile and shutil are imported by run mode, the rank shim or a control line.
tests/test_supervisor_lean.py pins that import set; see launcher/nodeside/README.md.

Why it exists: OpenSSH ignores channel signals for root logins before 9.8, and a process
without a pty outlives its connection. So the supervisor owns the job:

- it becomes a child subreaper and starts the job in its own session, so every descendant
  (torchrun starts each worker in a session of its own) stays findable under our pid;
- it kills the whole descendant tree (TERM, grace, KILL) when told to (``stop``/``kill``),
  when its stdin reaches EOF (launcher or connection gone), on SIGTERM/SIGHUP/SIGINT, or when
  the launcher's heartbeats stop for ``launcher_timeout`` seconds (a partition TCP misses;
  three times the launcher's own ``heartbeat_timeout``, so a stalled launcher is waited for);
- it never kills by name: only processes descending from itself, each checked by pid AND
  start time (a pidfd where the kernel has them), so a recycled pid is never signalled;
- in ``run`` mode, once a stop is under way and every rank on the node has exited, what is
  left is torchrun's agent, which has nothing to save but its last log lines (its "Received
  15 death signal" and "Closing process" chatter): it gets ``agent_grace`` seconds (3) to exit
  by itself (it normally does in well under a second), then a TERM where it had none from us,
  then the KILL one second later, rather than the whole grace period, which is for the ranks.
  Whatever it printed meanwhile is drained to the launcher as any output is.

Threads: the main loop is the only writer of stdout (frames); a reader thread takes the
launcher's control lines from stdin (so a stdout write blocked by a slow or partitioned
launcher never delays a ``stop`` or the heartbeat bookkeeping); a watchdog thread enforces
the heartbeat timeout and the KILL deadline and, once the launcher is gone and the job tree
is empty, ends the supervisor even if the main loop is stuck writing to a dead channel.

Output goes to stdout as frames: ``struct "!BiI"`` (kind, rank, length) + payload, where kind
1 = job stdout bytes, 2 = job stderr bytes, 3 = a JSON control message. rank is the global
rank (-1 for the node-level program). Ranks are attributed at the source: in ``run`` mode the
job's workers are started through this same file in *shim* mode, which connects each rank's
stdout/stderr straight to the supervisor over a unix socket and reports its exit status.
"""

# signal.py only wraps _signal in enums, and importing enum costs ~3.5 ms of CPU per node
import _signal as signal  # type: ignore[import-not-found]  # (no stub: typeshed lacks it)
import _thread
import marshal
import os
import select
import struct
import sys
import time

if False:  # for mypy only: typing is not imported on the nodes
    from typing import Any  # noqa: F401

try:
    from _json import encode_basestring_ascii as _json_string
except ImportError:  # an interpreter without the accelerator: to_json falls back to json
    _json_string = None  # type: ignore[assignment]

PROTOCOL = 1
FRAME = struct.Struct("!BiI")
# written before the first frame: whatever the login shell printed before us (a chatty
# .bashrc) is told apart from the frames by the launcher (launcher/nodeside/wire.py has the twin)
MAGIC = b"\n\x00DTRAIN-FRAMES-1\x00\n"
OUT, ERR, CTL = 1, 2, 3
CHUNK = 65536
SHIM_ENV = "DTRAIN_SHIM_SOCK"
# torchrun's temp dir (its /tmp/torchelastic_* log dirs) goes into our private dir, which
# teardown removes; the shim gives each worker the TMPDIR it would have had
TMPDIR_ENV = "DTRAIN_WORKER_TMPDIR"
SHIM_PLACEHOLDER = "{DTRAIN_SHIM}"
# `python -m torch.distributed.run` puts the working directory first on sys.path, where a
# project's random.py would shadow torchrun's own imports (the `torchrun` script does not
# see it): the same agent, without that entry. The ranks get their script's directory
# from the rank shim, as under plain torchrun.
TORCHRUN_ISOLATED = ("import sys\nif sys.path and sys.path[0] in ('', '.'):\n    del sys.path[0]\n"
                     "import runpy\nrunpy.run_module('torch.distributed.run', "
                     "run_name='__main__', alter_sys=True)\n")
# in argv, replaced by the private directory holding the spec's ``files`` (dtrain smoke's job)
DIR_PLACEHOLDER = "{DTRAIN_DIR}"
PR_SET_CHILD_SUBREAPER = 36
# the titles of the rank's two processes in ps (set_title): the shim torchrun started, and
# the rank; is_shim knows a shim by its title
RANK_TITLE = b"dtrain rank "
# the first byte of a spec in marshal form (launcher/nodeside/wire.py has the twin); a JSON
# spec starts with "{" or white space
SPEC_MARSHAL = b"M"
# run mode, during a stop: how long torchrun's agent may take to exit by itself once every
# rank has exited (it normally needs well under a second; its last log lines come then)
AGENT_GRACE = 3.0
# the signals whose handlers tear the job down: blocked while a child is forked
TEARDOWN_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def now():
    return time.time()


def hostname():
    return os.uname().nodename  # what socket.gethostname() returns, without socket (~1 ms)


def to_json(value):
    """``json.dumps(value, separators=(",", ":"))``, the same text, without importing json.

    ``import json`` costs ~3 ms of CPU per node (it imports re): the control messages
    (hello, hb, exit ...) are dicts of str, int, float, bool, None, lists and dicts, which
    this writes with json's own C string encoder and int/float repr, as json does. Anything
    else (another type, a non-str key, inf/nan, no _json) goes to json itself.
    """
    parts = []  # type: list[str]
    if _json_string is not None and _json_parts(value, parts):
        return "".join(parts)
    import json

    return json.dumps(value, separators=(",", ":"))


def _json_parts(value, parts):
    """Append value's JSON text to parts; False for what only json.dumps may write."""
    kind = type(value)
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif kind is str:
        parts.append(_json_string(value))
    elif kind is int:
        parts.append(int.__repr__(value))
    elif kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return False
        parts.append(float.__repr__(value))
    elif kind is dict:
        parts.append("{")
        for i, (key, item) in enumerate(value.items()):
            if type(key) is not str:
                return False
            parts.append(("," if i else "") + _json_string(key) + ":")
            if not _json_parts(item, parts):
                return False
        parts.append("}")
    elif kind is list or kind is tuple:
        parts.append("[")
        for i, item in enumerate(value):
            if i:
                parts.append(",")
            if not _json_parts(item, parts):
                return False
        parts.append("]")
    else:
        return False
    return True


def from_json(data):
    import json  # only control lines (stop, kill, heartbeats) and run mode's shims need it

    return json.loads(data)


def load_spec(data):
    """The job spec: marshal after SPEC_MARSHAL (what dtrain sends), else JSON.

    marshal is read with the interpreter's builtins (json would cost ~3 ms per node); it
    comes from our own launcher, over the same authenticated channel as this program's
    source, so it is trusted exactly as much as the code that runs it.
    """
    if data[:1] == SPEC_MARSHAL:
        return marshal.loads(data[1:])
    return from_json(data)


class Writer:
    """Frame writer for stdout (only the main loop writes; the lock keeps frames whole)."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = _thread.allocate_lock()
        self.dead = False

    def frame(self, kind, rank, payload):
        if self.dead:
            return
        data = FRAME.pack(kind, rank, len(payload)) + payload
        with self.lock:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except OSError:
                self.dead = True

    def control(self, msg):
        self.frame(CTL, -1, to_json(msg).encode())


def set_subreaper():
    """Orphaned descendants reparent to us, so the tree walk finds double-forked processes."""
    try:
        return _prctl()(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        pass
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def _prctl():
    """libc's prctl through _ctypes, as ``ctypes.CDLL(None).prctl`` builds it (int result,
    int arguments) without importing ctypes itself, which costs ~1.5 ms of CPU per node.
    Any difference in _ctypes raises, and set_subreaper then goes through ctypes."""
    import _ctypes

    class Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # ctypes.c_int
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):  # ctypes.CDLL's _FuncPtr
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    class Program:  # ctypes.CDLL(None): the running program and the libraries it loaded
        _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)  # type: ignore[arg-type]

    prctl = Function(("prctl", Program))  # type: ignore[arg-type]
    return lambda *args: int(prctl(*args))


def _stat_fields(pid):
    """The fields of /proc/<pid>/stat after the comm field (state first), or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the comm field may contain spaces and parentheses: split after the last ')'
    return stat[stat.rfind(b")") + 2:].split()


def start_time(pid):
    """The process's start time (stat field 22, clock ticks since boot), or None if gone.

    A pid plus its start time names one process for good: a recycled pid has a later one.
    """
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def set_title(title, comm):
    """What a node's admin sees of this process: ``comm`` (15 bytes: top, ps -e) and
    ``title`` as its command line (ps -ef, ps aux). The title is written over the argv area
    that /proc/PID/cmdline reads, as setproctitle(3) does: the title, a NUL, and a last
    byte that is not NUL, which makes the kernel read up to the first NUL. Through /proc
    files, without ctypes (~1.5 ms per node); best effort, never raises. The probe, the
    sampler and cpnode carry a copy (one file each: tests/test_node_processes.py checks
    that the copies are the same)."""
    try:
        with open("/proc/self/comm", "wb", 0) as f:
            f.write(comm.encode("utf-8", "replace")[:15])
    except OSError:
        pass
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rfind(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (Linux >= 3.5)
        size = end - start
        if size < 2:
            return
        data = title.encode("utf-8", "replace")[:size - 1] + b"\0"
        if len(data) < size:
            data += b"\0" * (size - len(data) - 1) + b" "
        fd = os.open("/proc/self/mem", os.O_RDWR)
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        pass


def zombie_status(pid, started=None, wait=0.2):
    """The raw wait status of ``pid`` once it is a zombie (stat field 52, ``exit_code``,
    Linux >= 3.5), waiting up to ``wait`` seconds for it to become one (its sockets close
    a moment before it does); None when it is gone (its parent reaped it first), still
    running, another process (its start time is not ``started``), or the field is missing."""
    deadline = now() + wait
    while True:
        fields = _stat_fields(pid)
        if not fields or len(fields) < 50:
            return None
        if started is not None and int(fields[19]) != started:
            return None
        if fields[0] == b"Z":
            return int(fields[49])
        if now() >= deadline:
            return None
        time.sleep(0.002)


def descendants(root_pid, prune=None):
    """Every live process descending from root_pid as (pid, start time), via /proc ppid links.

    ``prune(pid)`` true: that process is listed, its own descendants are not.
    """
    children = {}  # type: dict[int, list[tuple[int, int]]]
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if not fields or len(fields) < 20 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append((int(name), int(fields[19])))
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            if prune is None or not prune(child[0]):
                todo.append(child[0])
    return found


def signal_pid(pid, started, sig):
    """Send sig to pid only if it is still the process that started at ``started``.

    Between the /proc scan and the kill the process may have exited and its pid been reused
    by an unrelated process. Where the kernel has pidfds (Linux >= 5.3, Python >= 3.9) the
    check and the signal are race-free: the pidfd pins the process we checked. Elsewhere the
    start time is checked right before kill(), which narrows the window to microseconds.
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    fd = None
    if pidfd_open is not None and send is not None:
        try:
            fd = pidfd_open(pid)
        except OSError:
            fd = None  # gone, or no pidfd support (ENOSYS): fall back
    try:
        if start_time(pid) != started:
            return False  # gone or recycled: not ours any more
        if fd is not None and send is not None:
            send(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def signal_tree(sig, prune=None, once=None):
    """Send sig to every descendant of this supervisor; returns how many were signalled.

    ``prune``: as for descendants (a rank shim's rank is not signalled: the shim forwards).
    ``once``: a set of (pid, start time) already sent this signal, skipped, and added to.
    """
    count = 0
    for key in descendants(os.getpid(), prune):
        if once is not None and key in once:
            continue
        if signal_pid(key[0], key[1], sig):
            count += 1
            if once is not None:
                once.add(key)
    return count


def cmdline(pid):
    """A process's argv as bytes, or () when it is gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return tuple(f.read().split(b"\0"))
    except OSError:
        return ()


def spawn(argv, env):
    """Start argv in a session of its own with stdin from /dev/null and stdout and stderr
    to new pipes; returns (pid, stdout fd, stderr fd), or raises OSError (the exec's errno)
    when it cannot be run.

    What ``subprocess.Popen(argv, stdin=DEVNULL, stdout=PIPE, stderr=PIPE, env=env,
    start_new_session=True)`` does (close_fds, restore_signals, PATH searched in env, the
    first exec error that is not ENOENT/ENOTDIR reported), without importing subprocess:
    that import costs ~7 ms of CPU on every node at every command (threading, enum, locale,
    re ...). The child runs Python only until its exec; the teardown signals are blocked
    around the fork so none of our handlers runs in it.
    """
    for key, value in env.items():
        if "=" in key or "\0" in key or "\0" in value:
            raise ValueError("illegal environment variable name or value: %r" % (key,))
    fds = []
    try:
        null = os.open(os.devnull, os.O_RDWR)  # as Popen opens it
        fds.append(null)
        out_r, out_w = os.pipe()
        fds += [out_r, out_w]
        err_r, err_w = os.pipe()
        fds += [err_r, err_w]
        fail_r, fail_w = os.pipe()
        fds += [fail_r, fail_w]
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, TEARDOWN_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                _exec_child(argv, env, null, out_w, err_w, fail_w, mask)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in (null, out_w, err_w, fail_w):
            os.close(fd)
            fds.remove(fd)
        report = b""
        while True:
            try:
                chunk = os.read(fail_r, 64)
            except InterruptedError:
                continue
            if not chunk:
                break
            report += chunk
        os.close(fail_r)
        fds.remove(fail_r)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    if not report:  # the exec closed fail_w (close-on-exec): the program runs
        return pid, out_r, err_r
    os.close(out_r)
    os.close(err_r)
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            break
    code, _, text = report.partition(b":")
    if code == b"OSError":
        number = int(text)
        raise OSError(number, os.strerror(number))
    raise RuntimeError("cannot start %r: %s" % (argv[0], text.decode(errors="replace")))


def _exec_child(argv, env, null, out_w, err_w, fail_w, mask):
    """In the forked child: become the job (execvpe) or report why not on fail_w, and exit."""
    try:
        for sig in TEARDOWN_SIGNALS + (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE and SIGXFSZ
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.setsid()
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        # close_fds: nothing but 0, 1, 2 reaches the job (ours are close-on-exec already;
        # this closes what our own parent left open)
        try:
            for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
                if fd > 2 and fd != fail_w:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        except OSError:  # no /proc
            os.closerange(3, fail_w)
            os.closerange(fail_w + 1, os.sysconf("SC_OPEN_MAX"))
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        report = b"OSError:%d" % (exc.errno or 0)
    except BaseException as exc:
        report = b"Error:" + repr(exc).encode(errors="replace")
    try:
        os.write(fail_w, report)
    finally:
        os._exit(255)


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
STACK_WAIT_S = 2.0  # how long a dump may take to appear in a worker's file
PYSPY_TIMEOUT_S = 8.0
MAX_DUMP = 256 * 1024  # bytes of one worker's dump shipped back
MAX_CRASH = 64 * 1024
MAX_FLIGHT = 8 * 1024 * 1024  # one flight recorder dump shipped back
KMSG_WORDS = ("Out of memory", "oom-kill", "Killed process", "oom_reaper", "Xid",
              "segfault", "Memory cgroup out of memory")
# PyTorch's flight recorder: every variable a user may have set for it (one set = hands off)
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_DUMP_VAR = "TORCH_NCCL_DUMP_ON_TIMEOUT"
FR_ENTRIES = "2000"  # the flight recorder tutorial's advice
FR_PREFIX = "rank_"


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


# NCCL's own account of the fabric (docs/fabric.md): its INIT and NET lines in one file per
# process in our private directory, only when nobody set NCCL_DEBUG; the lines that tell the
# transport are shipped as ``nccl`` messages (decide/nccl_account.py reads them)
NCCL_KEEP = (b"NCCL version", b"NET/IB", b"NET/Socket", b"Using network", b" via ",
             b"set by environment", b"Init COMPLETE", b"GPU Direct RDMA", b"NCCL WARN",
             b"Bootstrap")
NCCL_MAX_READ = 256 * 1024  # bytes read from one process's file, in all
NCCL_MAX_LINES = 400  # lines shipped for one process
NCCL_POLL_BYTES = 64 * 1024  # read in one poll, all files together (the rest: next poll)


def nccl_defaults(env, directory):
    """NCCL_DEBUG=INFO, SUBSYS=INIT,NET and a per-process file, unless the user set
    NCCL_DEBUG or NCCL_DEBUG_FILE (theirs wins, and we read nothing)."""
    if env.get("NCCL_DEBUG") or env.get("NCCL_DEBUG_FILE"):
        return {}
    add = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": os.path.join(directory, "nccl.%h.%p.log")}
    if not env.get("NCCL_DEBUG_SUBSYS"):
        add["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return add


class NcclFiles:
    """Reads NCCL's per-process files as they grow (bounded: NCCL_MAX_READ per file)."""

    def __init__(self, directory):
        self.dir = directory
        self.files = {}  # name -> [offset, partial line, lines shipped]
        self.more = False  # the last poll spent its budget: there may be more to read

    def poll(self, pids):
        """{pid: [new kept lines]} since the last poll, from the files of ``pids``."""
        out = {}  # type: dict[int, list[str]]
        budget = NCCL_POLL_BYTES  # one poll stays a few ms: the main loop forwards output
        try:
            names = sorted(os.listdir(self.dir))
        except OSError:
            return out
        for name in names:
            if budget <= 0:
                break
            parts = name.split(".")
            if len(parts) < 4 or parts[0] != "nccl" or not parts[-2].isdigit() \
                    or int(parts[-2]) not in pids:
                continue
            st = self.files.setdefault(name, [0, b"", 0])
            if st[0] >= NCCL_MAX_READ:
                continue
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    f.seek(st[0])
                    data = f.read(min(budget, NCCL_MAX_READ - st[0]))
            except OSError:
                continue
            budget -= len(data)
            if not data:
                continue
            st[0] += len(data)
            lines = (st[1] + data).split(b"\n")
            st[1] = lines.pop()
            keep = [ln.decode("utf-8", "replace")[:600] for ln in lines
                    if any(w in ln for w in NCCL_KEEP)][:max(0, NCCL_MAX_LINES - st[2])]
            st[2] += len(keep)
            if keep:
                out.setdefault(int(parts[-2]), []).extend(keep)
        self.more = budget <= 0
        return out


ATTEMPT_ENV = "DTRAIN_ATTEMPT"  # dtrain run --restarts: 1, 2, ... (decide/restarts.py)


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
        sock.sendall(json.dumps({
            "rank": rank, "stream": "arm", "pid": os.getpid(), "stacks": stack_path,
            "crash": crash_path, "signal": STACK_SIGNAL}).encode() + b"\n")
        keep.append(sock)
        _thread.start_new_thread(_arm_helper, (sock, json))
    except Exception:
        pass
    return keep


def _arm_helper(sock, json):
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
                sock.sendall(json.dumps(reply).encode() + b"\n")
            except Exception:
                pass


def _flight_dump(path):
    """The flight recorder's pickle (fr_trace's format) into ``path``, when torch.distributed
    is in use in this process (never imports torch itself)."""
    dist = sys.modules.get("torch.distributed")
    torch = sys.modules.get("torch")
    if dist is None or torch is None or not dist.is_initialized():
        return {"error": "torch.distributed not initialized"}
    dump = torch._C._distributed_c10d._dump_fr_trace
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
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
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


def _read_from(path, offset, limit):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode("utf-8", "replace")
    except (OSError, TypeError):
        return ""


def _b64(path, limit=MAX_FLIGHT):
    """A file's bytes as base64 text (for a JSON message), or None."""
    import base64

    try:
        with open(path, "rb") as f:
            return base64.b64encode(f.read(limit)).decode()
    except OSError:
        return None


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _size(path):
    try:
        return os.stat(path).st_size
    except (OSError, TypeError):
        return 0


def _status_kb(pid):
    """VmRSS and VmHWM of a process (kB), or None once it is gone."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            text = f.read()
    except OSError:
        return None
    out = {}  # type: dict[str, int]
    for line in text.splitlines():
        if line.startswith((b"VmRSS:", b"VmHWM:")):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out["rss_kb" if line.startswith(b"VmRSS") else "hwm_kb"] = int(parts[1])
    return out or None


def memory_events_path(pid):
    """The memory cgroup file that counts OOM kills for pid's cgroup (v2 memory.events,
    v1 memory.oom_control), or None."""
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            path = "/sys/fs/cgroup" + parts[2].rstrip("/") + "/memory.events"
        elif "memory" in parts[1].split(","):
            path = "/sys/fs/cgroup/memory" + parts[2].rstrip("/") + "/memory.oom_control"
        else:
            continue
        if os.path.exists(path):
            return path
    return None


def oom_kills(text):
    """The ``oom_kill N`` counter of memory.events / memory.oom_control text."""
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill" and parts[1].isdigit():
            return int(parts[1])
    return None


def kernel_lines(since, words=KMSG_WORDS, limit=60, path="/dev/kmsg"):
    """Kernel log records since ``since`` (seconds since boot) that mention one of
    ``words``, as "[seconds] text"; or an error string when the log is not readable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return "%s: %s" % (path, exc.strerror)
    records = []
    try:
        while True:  # /dev/kmsg: one record per read
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: overwritten while reading, go on
                    continue
                break
            if not record:
                break
            records.append(record)
    finally:
        os.close(fd)
    return kmsg_matches(records, since, words, limit)


def kmsg_matches(records, since, words=KMSG_WORDS, limit=60):
    """The /dev/kmsg records (``PRIO,SEQ,USEC,FLAGS;text`` then ``KEY=value``
    continuation lines) at or after ``since - 1`` s that mention one of ``words``."""
    found = []
    for record in records:
        head, _, text = record.decode("utf-8", "replace").partition(";")
        fields = head.split(",")
        try:
            t = int(fields[2]) / 1e6
        except (IndexError, ValueError):
            continue
        text = text.split("\n", 1)[0]
        if t >= since - 1 and any(w in text for w in words):
            found.append("[%.6f] %s" % (t, text))
    return found[-limit:]


def _uptime():
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def which(name, path):
    for folder in (path or "").split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def frame_sources(text, limit=400):
    """``{"path:line": source line}`` for the two innermost frames of each thread of a
    faulthandler dump, read on the node (the launcher may not see these files)."""
    import linecache

    out = {}  # type: dict[str, str]
    depth = 0
    for line in text.splitlines():
        if not line.startswith("  File "):
            depth = 0
            continue
        depth += 1
        if depth > 2 or len(out) >= limit:
            continue
        # the last separator: a path may hold '", line ' (a name never holds a quote)
        head, sep, rest = line.rpartition('", line ')
        if not sep:
            continue
        path = head[len('  File "'):]
        number = rest.split(" ", 1)[0]
        if number.isdigit() and path + ":" + number not in out:
            out[path + ":" + number] = linecache.getline(path, int(number)).strip()[:200]
    return out


class Evidence:
    """The supervisor's half of stacks and death evidence (mixed into Supervisor)."""

    # Supervisor.__init__ sets these (declared here for mypy)
    spec = None  # type: Any
    tmpdir = None  # type: Any
    out = None  # type: Any
    armed = None  # type: Any
    rank_status = None  # type: Any
    fr_shipped = None  # type: Any
    boot_start = None  # type: Any
    pyspy = None  # type: Any
    open_streams = 0
    nccl = None  # NcclFiles (run mode, when NCCL's account was asked for)

    def evidence_env(self, env):
        """Run mode: the flight recorder's defaults and, where py-spy can only read our
        ranks through PR_SET_PTRACER (Yama ptrace_scope 1), the pid to allow."""
        self.boot_start = _uptime()
        self.pyspy = which("py-spy", env.get("PATH"))
        flight = os.path.join(self.tmpdir, "flight")
        os.mkdir(flight, 0o700)
        if self.spec.get("flight_recorder"):
            env.update(flight_defaults(env, flight, self.spec["flight_recorder"]))
        if self.spec.get("nccl_account"):
            nccl = os.path.join(self.tmpdir, "nccl")
            os.mkdir(nccl, 0o700)
            added = nccl_defaults(env, nccl)
            env.update(added)
            self.nccl = NcclFiles(nccl) if added else None
        if self.pyspy:
            try:
                with open("/proc/sys/kernel/yama/ptrace_scope") as f:
                    if f.read().strip() == "1":
                        env[PTRACER_ENV] = str(os.getpid())
            except OSError:
                pass

    def ship_nccl(self):
        """NCCL's new lines, one ``nccl`` message per rank (a pid no rank armed: skipped)."""
        if self.nccl is None:
            return
        pids = {info["pid"]: rank for rank, info in self.armed.items()}
        for pid, lines in sorted(self.nccl.poll(pids).items()):
            if pid in pids:
                self.out.control({"type": "nccl", "rank": pids[pid], "lines": lines,
                                  "t": now()})

    def rank_started(self, hdr):
        """A rank's shim is up (its status connection): the hang watch counts the ranks
        alive only once every one has started (a slow start is not a hang)."""
        try:
            self.out.control({"type": "rank_start", "rank": int(hdr.get("rank", -1)),
                              "t": now()})
        except (TypeError, ValueError):
            pass

    def rank_armed(self, hdr, sock):
        try:
            rank, pid = int(hdr["rank"]), int(hdr["pid"])
        except (KeyError, TypeError, ValueError):
            return
        events = memory_events_path(pid)
        self.armed[rank] = {
            "pid": pid, "start": start_time(pid), "stacks": hdr.get("stacks"),
            "crash": hdr.get("crash"), "signal": int(hdr.get("signal") or STACK_SIGNAL),
            "sock": sock, "buf": b"", "replies": [], "events": events,
            "oom_before": oom_kills(_read_from(events, 0, 4096)) if events else None,
            "mem": _status_kb(pid),
        }
        self.open_streams -= 1  # not output: the job's end does not wait for it

    def arm_reply(self, rank, chunk):
        info = self.armed.get(rank)
        if info is None:
            return
        info["buf"] += chunk
        while b"\n" in info["buf"]:
            line, info["buf"] = info["buf"].split(b"\n", 1)
            try:
                info["replies"].append(from_json(line))
            except ValueError:
                pass

    def sample_ranks(self):
        """Each armed rank's memory, at the heartbeat: the last value is what it had when
        it died (read only while it lives)."""
        for rank, info in list(self.armed.items()):
            if str(rank) not in self.rank_status:
                mem = _status_kb(info["pid"])
                if mem:
                    info["mem"] = dict(mem, t=now())
                    events = memory_events_path(info["pid"])  # moved to another cgroup?
                    if events != info["events"]:
                        info["events"] = events
                        info["oom_before"] = oom_kills(_read_from(events, 0, 4096)) \
                            if events else None

    def stacks_requested(self, msg):
        _thread.start_new_thread(self.collect_stacks, (msg,))

    def collect_stacks(self, msg):
        """Every live armed rank's stacks (faulthandler, py-spy where the node has it, the
        flight recorder when asked), as one ``stacks`` message. Runs in its own thread."""
        try:
            self._collect_stacks(msg)
        except Exception as exc:  # never the supervisor's end
            self.out.control({"type": "stacks", "id": msg.get("id"), "ranks": {},
                              "error": repr(exc), "host": hostname(), "t": now()})

    def _collect_stacks(self, msg):
        t0 = now()
        ranks, waiting = {}, {}
        want_fr = bool(msg.get("fr")) and self.tmpdir is not None
        for rank, info in sorted(self.armed.items()):
            if str(rank) in self.rank_status:
                continue  # exited: its exit report tells the rest
            before = _size(info["stacks"])
            if not signal_pid(info["pid"], info["start"], info["signal"]):
                ranks[str(rank)] = {"pid": info["pid"], "error": "exited"}
                continue
            waiting[rank] = before
            if want_fr:
                info["replies"] = []
                path = os.path.join(self.tmpdir, "flight", FR_PREFIX + str(rank))
                try:
                    info["sock"].sendall(to_json({"op": "fr", "path": path}).encode() + b"\n")
                except OSError:
                    pass
        spies = self._start_pyspy(waiting) if msg.get("pyspy", True) and self.pyspy else {}
        seen = {}  # type: dict[int, int]
        deadline = t0 + float(msg.get("wait") or STACK_WAIT_S)
        while waiting and now() < deadline:
            time.sleep(0.02)
            for rank in list(waiting):
                size = _size(self.armed[rank]["stacks"])
                if size > waiting[rank] and seen.get(rank) == size:
                    text = _read_from(self.armed[rank]["stacks"], waiting[rank], MAX_DUMP)
                    ranks[str(rank)] = {"pid": self.armed[rank]["pid"], "text": text,
                                        "sources": frame_sources(text)}
                    del waiting[rank]
                seen[rank] = size
        for rank in waiting:
            ranks[str(rank)] = {"pid": self.armed[rank]["pid"],
                                "error": "no dump within %g s" % (deadline - t0)}
        if want_fr:
            fr_deadline = now() + 2.0
            while now() < fr_deadline and any(
                    not self.armed[int(r)]["replies"] for r, e in ranks.items() if "text" in e):
                time.sleep(0.02)
            for r, e in ranks.items():
                replies = self.armed[int(r)]["replies"]
                e["fr"] = replies[-1] if replies else {"error": "no answer"}
                if e["fr"].get("ok"):
                    self.fr_shipped[r] = _mtime(os.path.join(self.tmpdir, "flight",
                                                             FR_PREFIX + r))
                    e["fr"]["data"] = _b64(os.path.join(self.tmpdir, "flight",
                                                        FR_PREFIX + r))
        self.out.control({"type": "stacks", "id": msg.get("id"), "ranks": ranks,
                          "host": hostname(), "t": now(), "took": now() - t0,
                          "pyspy": bool(spies)})
        if spies:  # native frames follow: the fold does not wait for py-spy
            native = {}
            for rank, proc in spies.items():
                native[str(rank)] = {"pyspy": self._pyspy_result(proc, t0 + PYSPY_TIMEOUT_S)}
            self.out.control({"type": "stacks", "id": msg.get("id"), "native": True,
                              "ranks": native, "host": hostname(), "t": now(),
                              "took": now() - t0})

    def _start_pyspy(self, ranks):
        import subprocess

        procs = {}
        for rank in ranks:
            try:
                procs[rank] = subprocess.Popen(
                    [self.pyspy, "dump", "--native", "--pid", str(self.armed[rank]["pid"])],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT)
            except OSError:
                pass
        return procs

    def _pyspy_result(self, proc, deadline):
        import subprocess

        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - now()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"error": "py-spy did not answer within %g s" % PYSPY_TIMEOUT_S}
        text = out.decode("utf-8", "replace")[:MAX_DUMP]
        return {"text": text} if proc.returncode == 0 else {
            "error": "py-spy exited %s" % proc.returncode, "text": text}

    def ship_flight(self):
        """Flight recorder dumps the ranks left (NCCL's dump on timeout), before the private
        directory goes: one ``flight`` message."""
        if not self.tmpdir:
            return
        folder = os.path.join(self.tmpdir, "flight")
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return
        files = {}
        for name in names:
            rank = name[len(FR_PREFIX):]
            if name.startswith(FR_PREFIX) and rank.isdigit() and \
                    self.fr_shipped.get(rank) != _mtime(os.path.join(folder, name)):
                files[rank] = _b64(os.path.join(folder, name))
        if files:
            self.out.control({"type": "flight", "files": files, "host": hostname(),
                              "t": now()})

    def death_evidence(self, rank, msg):
        """What the node knows about a rank that did not exit 0: its faulthandler crash
        dump, its last memory, the cgroup OOM counter, the kernel log's OOM/Xid lines."""
        if msg.get("code") in (0, None):
            return None
        info = self.armed.get(rank) or {}
        evidence = {}
        crash = _read_from(info.get("crash"), 0, MAX_CRASH)
        if crash.strip():
            evidence["crash"] = crash
        if info.get("mem"):
            evidence["memory"] = info["mem"]
        if info.get("events"):
            evidence["memory_events"] = _read_from(info["events"], 0, 4096)
            evidence["oom_kill_before"] = info.get("oom_before")
        if self.boot_start is not None:
            cached = getattr(self, "_kmsg", None)
            if cached is None or now() - cached[0] > 1.0:
                cached = self._kmsg = (now(), kernel_lines(self.boot_start))
            evidence["kernel"] = cached[1]
        return evidence


class Supervisor(Evidence):
    """Runs one job, forwards its output as frames, and guarantees its teardown."""

    def __init__(self, spec, source):
        self.spec = spec
        self.source = source
        self.out = Writer(sys.stdout.fileno())
        self.poll = select.poll()
        self.watched = {}  # fd -> (kind, data, socket or None): what the main loop reads
        self.grace = float(spec.get("grace", 10))
        # how long without a line from the launcher before the job is torn down as orphaned:
        # the launcher sends more than its own --heartbeat-timeout (decide/liveness.py)
        self.hb_timeout = float(spec.get("launcher_timeout", spec.get("heartbeat_timeout", 30)))
        self.hb_interval = float(spec.get("heartbeat_interval", 2))
        self.last_hb = now()
        self.job = None  # its pid
        self.job_status = None  # raw wait status
        self.kill_at = None  # when set, KILL the tree at this time
        # every process this supervisor has sent SIGTERM, as (pid, start time): a stop is
        # one TERM per process however many times it is asked for (stop, then stdin EOF,
        # then SIGHUP ...); what follows is the KILL at the deadline
        self.termed = set()
        self.shim_path = None  # run mode: the rank shim's path (its argv names it)
        self.stopping = None  # reason
        self.stopping_sent = False
        self.orphaned = None  # why the launcher is gone (stdin EOF, heartbeat lost)
        self.rank_status = {}
        self.ctl_open = 0  # rank shims whose status connection is open
        self.ctl_seen = False
        # run mode, during a stop: when every rank had exited (the agent's grace runs from
        # there), and whether its TERM has gone out
        self.agent_grace = float(spec.get("agent_grace", AGENT_GRACE))
        self.ranks_gone_at = None
        self.agent_termed = False
        self.open_streams = 0
        self.tmpdir = None
        self.container = None  # --image: the runtime around the job (Container)
        self.sparing = False  # removing the container: no KILLs into our tree from now on
        self.start_code = 127  # the shell's code for a job that could not start
        self.done = False
        self.subreaper = False
        self.childless = False  # the last reap found no child at all
        self.armed = {}  # rank -> what its wrapper reported (pid, stack file, signal ...)
        self.boot_start = None  # the job's start in kernel-log time (s since boot)
        self.pyspy = None  # its path, where the node has it (run mode)
        self.fr_shipped = {}  # rank -> mtime of the flight dump a stacks message carried
        # re-entrant: a signal handler runs teardown on the main thread, maybe inside it
        self.lock = _thread.RLock()

    def watch(self, fd, kind, data, sock=None):
        self.watched[fd] = (kind, data, sock)
        self.poll.register(fd, select.POLLIN)

    def unwatch(self, fd):
        self.poll.unregister(fd)
        del self.watched[fd]

    # -- teardown ---------------------------------------------------------------------------
    def teardown(self, reason, grace=None):
        """TERM the tree now and schedule KILL after the grace period (idempotent).

        Never writes to stdout (any thread, or a signal handler, may call it): the main
        loop reports the stop; a blocked stdout must not delay a kill.
        """
        with self.lock:
            if grace is None:
                grace = self.grace
            grace = max(0.0, float(grace))
            if self.stopping is None:
                self.stopping = reason
            deadline = now() + grace
            if self.kill_at is None or deadline < self.kill_at:
                self.kill_at = deadline
            if grace > 0:
                self.term_tree()
        if self.container is not None:
            self.container.stop(grace)  # by name: a runtime's daemon is not in our tree
        if grace <= 0:
            if not self.sparing:  # our own runtime commands (container removal) live
                signal_tree(signal.SIGKILL)

    def term_tree(self):
        """SIGTERM every process of the tree that has not had one from us yet, except the
        ranks: each rank's shim forwards the first stop signal it gets (ours, or torchrun's
        killpg) to its rank and no other, so a rank sees exactly one TERM per stop."""
        with self.lock:
            return signal_tree(signal.SIGTERM, self.is_shim, self.termed)

    def is_shim(self, pid):
        """A rank shim (torchrun's worker: ``python -u <our dir>/dtrain_shim.py ...``)."""
        argv = cmdline(pid)
        if argv and argv[0].startswith(RANK_TITLE):  # its title (set_title)
            return b" shim: " in argv[0]
        return self.shim_path is not None and self.shim_path in argv[:3]

    def launcher_gone(self, why, grace=None):
        self.orphaned = self.orphaned or why
        self.teardown(why, grace)

    def watchdog(self):
        """Independent of the main loop: a blocked stdout write must not stop the kill."""
        empty_since = None
        while True:
            time.sleep(0.1)
            if self.hb_timeout > 0 and self.orphaned is None \
                    and now() - self.last_hb > self.hb_timeout:
                self.launcher_gone("no heartbeat from the launcher for %g s" % self.hb_timeout,
                                   grace=min(self.grace, 5.0))
            kill_at = self.kill_at
            if kill_at is not None and now() >= kill_at:
                if not self.sparing:  # our own runtime commands (container removal) live
                    signal_tree(signal.SIGKILL)
            if self.orphaned is not None and not self.done:
                # nobody reads our frames any more: once the job tree is gone, give the main
                # loop a moment to finish, then leave even if it is stuck on a dead channel
                if descendants(os.getpid()):
                    empty_since = None
                elif empty_since is None:
                    empty_since = now()
                elif now() - empty_since > 3.0:
                    self.cleanup_files()
                    os._exit(self.exit_code()[0] if self.job_status is not None else 255)

    def read_stdin(self):
        """Control lines from the launcher; EOF means it is gone (or dropped us)."""
        buf = b""
        while True:
            try:
                chunk = os.read(0, CHUNK)
            except InterruptedError:
                continue
            except BlockingIOError:  # a non-blocking stdin: wait for it instead
                select.select([0], [], [], 1.0)
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.launcher_gone("launcher connection closed (stdin EOF)")
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.on_control_line(line)

    # -- job --------------------------------------------------------------------------------
    def job_argv(self):
        spec = self.spec
        if spec.get("shell") is not None:
            # in an image the login shell of the host may not exist: its /bin/sh
            shell = "/bin/sh" if spec.get("container") else os.environ.get("SHELL") or "/bin/sh"
            command = spec["shell"]
            # one argument starting with '-' is a command, not an option of the shell:
            # '--' ends the options of sh, bash, dash, zsh, ksh and fish; csh and tcsh
            # take the next word as the command anyway, so a space keeps it from looking
            # like an option there
            if os.path.basename(shell) in ("csh", "tcsh"):
                return [shell, "-c", " " + command if command.startswith("-") else command]
            return [shell, "-c", "--", command]
        argv = list(spec["argv"])
        if self.tmpdir:
            shim = os.path.join(self.tmpdir, "dtrain_shim.py")
            self.shim_path = shim.encode()
            argv = [shim if a == SHIM_PLACEHOLDER else a.replace(DIR_PLACEHOLDER, self.tmpdir)
                    for a in argv]
            for i in range(1, len(argv) - 1):
                if argv[i:i + 2] == ["-m", "torch.distributed.run"]:
                    argv[i:i + 2] = ["-c", TORCHRUN_ISOLATED]
                    break
        return argv

    def start(self):
        env = dict(os.environ)
        env.update(self.spec.get("env") or {})
        ctr = self.spec.get("container")
        if self.spec.get("rank_shim") or ctr:
            import tempfile  # only run mode needs it: exec's start-up stays lean

            self.tmpdir = tempfile.mkdtemp(prefix="dtrain-")
        if self.spec.get("rank_shim"):
            with open(os.path.join(self.tmpdir, "dtrain_shim.py"), "wb") as f:
                f.write(self.source)
            for name, text in sorted((self.spec.get("files") or {}).items()):
                # plain names only: the files live in our private directory and nowhere else
                if os.path.basename(name) != name or name in ("", ".", "..", "ranks.sock",
                                                              "dtrain_shim.py"):
                    raise ValueError("bad file name in the job spec: %r" % (name,))
                with open(os.path.join(self.tmpdir, name), "w") as f:
                    f.write(text)
            path = os.path.join(self.tmpdir, "ranks.sock")
            import socket  # run mode only, as tempfile

            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(256)
            listener.setblocking(False)
            self.watch(listener.fileno(), "listen", None, listener)
            env[SHIM_ENV] = path
            # torchrun KILLs its workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT s (30) after its own
            # TERM; the grace is dtrain's to give (the KILL at its end is ours)
            env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(max(30, int(self.grace) + 5)))
            self.evidence_env(env)
            env[TMPDIR_ENV] = env.get("TMPDIR", "")
            env["TMPDIR"] = self.tmpdir
        argv = self.job_argv()
        try:
            if ctr:
                self.container = Container(ctr, self.tmpdir, self.grace)
                argv = self.container.argv(env, argv)
            self.job, out_fd, err_fd = spawn(argv, env)
        except OSError as exc:
            error, self.start_code = start_error(argv[0], exc)
            self.out.control({"type": "hello", "v": PROTOCOL, "error": error,
                              "code": self.start_code, "hostname": hostname()})
            return False
        for fd, kind in ((out_fd, OUT), (err_fd, ERR)):
            os.set_blocking(fd, False)
            self.watch(fd, "pipe", (kind, -1))
            self.open_streams += 1
        self.out.control({
            "type": "hello", "v": PROTOCOL, "pid": self.job, "pgid": self.job,
            "supervisor_pid": os.getpid(), "hostname": hostname(), "t": now(),
        })
        return True

    def reap(self):
        """Reap every exited child (we are a subreaper); remember the job's own status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.childless = True
                return
            if pid == 0:
                self.childless = False
                return
            if pid == self.job:
                self.job_status = status

    # -- main loop --------------------------------------------------------------------------
    def on_control_line(self, line):
        try:
            msg = from_json(line)
        except ValueError:
            return
        op = msg.get("op")
        if op == "hb":
            self.last_hb = now()
        elif op == "stop":
            self.teardown(msg.get("reason") or "stopped by dtrain", msg.get("grace"))
        elif op == "kill":
            self.teardown(msg.get("reason") or "killed by dtrain", 0)
        elif op == "signal":
            try:
                signal_tree(int(msg["sig"]))
            except (KeyError, TypeError, ValueError):
                pass
        elif op == "stacks":
            self.stacks_requested(msg)

    def handle(self, fd):
        kind, data, sock = self.watched[fd]
        if kind == "listen":
            conn, _ = sock.accept()
            conn.setblocking(False)
            self.open_streams += 1
            self.watch(conn.fileno(), "shim", {"buf": b"", "hdr": None}, conn)
        elif kind == "pipe":
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:
                return
            if chunk:
                self.out.frame(data[0], data[1], chunk)
            else:
                self.unwatch(fd)
                os.close(fd)
                self.open_streams -= 1
        elif kind == "shim":
            self.on_shim(fd, sock, data)

    def on_shim(self, fd, sock, st):
        """One rank connection: a JSON header line, then raw bytes (out/err) or status (ctl)."""
        try:
            chunk = sock.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.unwatch(fd)
            sock.close()
            if st["hdr"] is None or st["hdr"].get("stream") != "arm":
                self.open_streams -= 1  # (an arm stream stopped counting when it armed)
            if st["hdr"] is not None and st["hdr"].get("stream") == "ctl":
                self.ctl_open -= 1
                if not st.get("reported") and self.stopping is None:
                    self.shim_died(st)
            return
        if st["hdr"] is None:
            st["buf"] += chunk
            if b"\n" not in st["buf"]:
                return
            line, chunk = st["buf"].split(b"\n", 1)
            st["buf"] = b""
            try:
                st["hdr"] = from_json(line)
            except ValueError:
                st["hdr"] = {}
            if st["hdr"].get("stream") == "ctl":  # type: ignore[attr-defined]
                self.ctl_open += 1
                self.ctl_seen = True
                st["t0"] = now()
                pid = st["hdr"].get("pid")  # type: ignore[attr-defined]
                st["start"] = start_time(pid) if type(pid) is int and pid > 0 else None
                self.rank_started(st["hdr"])
            if st["hdr"].get("stream") == "arm":  # type: ignore[attr-defined]
                self.rank_armed(st["hdr"], sock)
            if not chunk:
                return
        rank = int(st["hdr"].get("rank", -1))
        stream = st["hdr"].get("stream")
        if stream == "arm":
            self.arm_reply(rank, chunk)
            return
        if stream == "ctl":
            st["buf"] += chunk
            while b"\n" in st["buf"]:
                line, st["buf"] = st["buf"].split(b"\n", 1)
                try:
                    msg = from_json(line)
                except ValueError:
                    continue
                st["reported"] = True
                msg.update({"type": "rank_exit", "rank": rank})
                evidence = self.death_evidence(rank, msg)
                self.rank_status[str(rank)] = msg
                if evidence:
                    msg = dict(msg, evidence=evidence)  # the exit report stays small
                self.out.control(msg)
        else:
            self.out.frame(OUT if stream == "out" else ERR, rank, chunk)

    def shim_died(self, st):
        """A rank's status connection closed without its exit report: the rank shim itself
        died (a kill -9 or the OOM killer hit the outer process, torchrun's child, not the
        rank), and the rank died with it (PR_SET_PDEATHSIG). Reported as the rank's exit,
        with the shim's own status, read from its zombie before torchrun reaps it (torchrun
        polls every 0.1 s); when torchrun was first, as the SIGKILL the rank got."""
        hdr = st["hdr"]
        try:
            rank, pid = int(hdr.get("rank", -1)), int(hdr["pid"])
        except (KeyError, TypeError, ValueError):
            return
        status = zombie_status(pid, st.get("start")) if st.get("start") is not None else None
        if status is None:
            code, sig = 128 + signal.SIGKILL, signal.SIGKILL
        else:
            code, sig = exit_code(status)
        msg = {"code": code, "signal": sig, "t": now(),
               "duration": now() - st.get("t0", now()), "pid": pid,
               "shim": {"pid": pid, "status": "known" if status is not None else "reaped"},
               "type": "rank_exit", "rank": rank}
        evidence = self.death_evidence(rank, msg)
        self.rank_status[str(rank)] = msg
        if evidence:
            msg = dict(msg, evidence=dict(evidence, shim_pid=pid))
        self.out.control(msg)

    def on_signal(self, signum, frame):
        self.teardown("supervisor got signal %d" % signum)

    def title(self):
        """``dtrain supervisor RUN node1`` (run mode), ``dtrain supervisor exec node1``."""
        run_id = (self.spec.get("env") or {}).get("DTRAIN_RUN_ID")
        what = run_id if self.spec.get("rank_shim") and run_id else "exec"
        return "dtrain supervisor %s %s" % (what, hostname())

    def run(self):
        os.write(self.out.fd, MAGIC)
        self.subreaper = set_subreaper()
        for sig in TEARDOWN_SIGNALS:
            signal.signal(sig, self.on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        if not self.start():
            return self.start_code
        for target in (self.read_stdin, self.watchdog):
            _thread.start_new_thread(target, ())  # never joined: as daemon threads
        next_hb = now() + self.hb_interval
        next_nccl = now() + 0.5
        drain_until = None
        tree_empty = False
        while True:
            for fd, _ in self.poll.poll(50):
                if fd in self.watched:
                    try:
                        self.handle(fd)
                    except OSError:
                        pass
            self.reap()
            if self.stopping is not None and not self.stopping_sent:
                self.stopping_sent = True
                self.out.control({"type": "stopping", "reason": self.stopping, "t": now()})
            if self.stopping is not None and self.ctl_seen and self.ctl_open <= 0 \
                    and self.job_status is None:
                self.agent_left()
            if self.nccl is not None and now() >= next_nccl:
                self.ship_nccl()
                next_nccl = now() + 0.5
            if now() >= next_hb:
                self.sample_ranks()
                self.out.control({"type": "hb", "t": now()})
                next_hb = now() + self.hb_interval
            if self.job_status is not None:
                if drain_until is None:
                    # the job is over: nothing of it may outlive it (background children too)
                    drain_until = now() + 2.0
                    # an empty tree cannot grow again (nobody is left to fork): remember it,
                    # and spare the final /proc scans (each reads every process's stat).
                    # A subreaper without children has no descendants at all (an orphan
                    # is reparented to us), so then not even one scan is needed.
                    tree_empty = (self.subreaper and self.childless) \
                        or not descendants(os.getpid())
                    if not tree_empty:
                        self.teardown_leftovers()
                if self.open_streams <= 0 or now() >= drain_until:
                    break
        self.drain_pipes()
        if not tree_empty:
            self.kill_all()
        return self.finish()

    def agent_left(self):
        """Every rank has exited during a stop: only the agent is left. It has nothing to save
        but its last log lines, so it does not get the ranks' grace: ``agent_grace`` seconds to
        exit by itself, then a TERM (to whatever has had none from us), then the KILL 1 s on."""
        t = now()
        if self.ranks_gone_at is None:
            self.ranks_gone_at = t
        if not self.agent_termed and t - self.ranks_gone_at >= self.agent_grace:
            self.agent_termed = True
            self.term_tree()
            with self.lock:
                if self.kill_at is None or t + 1.0 < self.kill_at:
                    self.kill_at = t + 1.0

    def teardown_leftovers(self):
        self.term_tree()
        with self.lock:
            if self.kill_at is None:
                self.kill_at = now() + 1.0

    def kill_all(self, wait=1.0):
        """KILL whatever is left of the tree and wait (briefly) until it is really gone."""
        deadline = now() + wait
        while True:
            if not self.sparing:  # our own runtime commands (container removal) live
                signal_tree(signal.SIGKILL)
            self.reap()
            if not descendants(os.getpid()) or now() >= deadline:
                return
            time.sleep(0.01)

    def drain_pipes(self):
        for fd, (kind, data, _) in list(self.watched.items()):
            if kind == "pipe":
                try:
                    chunk = os.read(fd, CHUNK)
                    while chunk:
                        self.out.frame(data[0], data[1], chunk)
                        chunk = os.read(fd, CHUNK)
                except OSError:
                    pass

    def exit_code(self):
        """(code, signal) of the job: its exit status, or 128+N when killed by signal N."""
        return exit_code(self.job_status or 0)

    def finish(self):
        self.ship_flight()
        self.ship_nccl()
        for _ in range(64):  # the rest of what a bounded poll left (at most 4 MiB)
            if self.nccl is None or not self.nccl.more:
                break
            self.ship_nccl()
        code, sig = self.exit_code()
        extra = {}
        if self.container is not None:
            self.remove_container()  # before the verdict: "nothing left" is part of it
            extra["container"] = {"name": self.container.spec.get("name"),
                                  "left": self.container.left,
                                  "remaining": self.container.remaining}
        self.out.control(dict({"type": "exit", "code": code, "signal": sig, "t": now(),
                               "stopped": self.stopping, "ranks": self.rank_status}, **extra))
        self.done = True
        self.cleanup_files()
        return code

    def remove_container(self):
        """Remove the container by name once the job's tree is gone; the runtime's commands
        doing it are our children too, and a KILL mid-way would leave the container stuck
        (podman: "Stopping")."""
        self.sparing = True
        if self.container is not None:
            self.container.remove()

    def cleanup_files(self):
        if self.container is not None:
            self.remove_container()
        if self.tmpdir:
            import shutil  # run mode only; the dir is ours (mkdtemp), torchrun's temp dir too

            shutil.rmtree(self.tmpdir, ignore_errors=True)


def run_quiet(argv, timeout=60.0):
    """Run a runtime's command to its end (output dropped); its exit code, or None."""
    import subprocess  # container mode only

    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=timeout).returncode
    except (OSError, subprocess.SubprocessError):
        return None


def run_output(argv, timeout=30.0):
    import subprocess

    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=timeout).stdout.decode(
                                  "utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return ""


def sh_quote(value):
    return "'" + value.replace("'", "'\"'\"'") + "'"


class Container:
    """The job inside a container image (launcher/decide/container.py decided the words):
    the environment goes by name (``-e NAME``, values from the runtime's own environment) or
    in a private 0600 file, never as values in argv; stop and removal go by name."""

    def __init__(self, spec, tmpdir, grace):
        self.spec = spec
        self.tmpdir = tmpdir
        self.grace = grace
        self.stopping = False
        self.removed = False
        self.left = []  # the run's containers still listed after our own removal
        self.remaining = []  # and still there when we gave up

    def words(self, words):
        return [w.replace(DIR_PLACEHOLDER, self.tmpdir) for w in words]

    def argv(self, env, argv):
        names = sorted(k for k, v in env.items() if os.environ.get(k) != v)
        extra = []
        if self.spec.get("env_flag"):
            for name in names:
                extra += [self.spec["env_flag"], name]
        elif self.spec.get("env_file_flag"):
            path = os.path.join(self.tmpdir, "container.env")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                for name in names:
                    f.write("%s=%s\n" % (name, sh_quote(env[name])))
            extra = [self.spec["env_file_flag"], path]
        for cmd in self.spec.get("prepare") or []:
            if run_quiet(self.words(cmd), timeout=600.0) != 0:
                raise OSError(5, "%s failed" % " ".join(cmd[:2]))
        return self.words(self.spec["head"]) + extra + self.words(self.spec["image"]) + argv

    def stop(self, grace):
        """Ask the runtime to stop the container by name (grace, then kill), off-thread:
        a signal handler may call this. Once."""
        if self.stopping or not self.spec.get("stop"):
            return
        self.stopping = True
        cmds = []
        for cmd in self.spec["stop"]:
            cmd = list(cmd)
            if grace <= 0 and "-t" in cmd:
                cmd[cmd.index("-t") + 1] = "0"
            cmds.append(cmd)

        def work():
            for cmd in cmds:
                run_quiet(cmd, timeout=max(10.0, grace + 10.0))
        _thread.start_new_thread(work, ())

    def remove(self):
        """Remove the container by name, then every container the run's label still
        lists (``leftovers``) on this node: nothing of the run is left. Idempotent."""
        if self.removed:
            return
        self.removed = True
        for cmd in self.spec.get("remove") or []:
            run_quiet(cmd)
        listing = self.spec.get("leftovers")
        remove = list((self.spec.get("remove") or [[]])[0])
        if not listing or not remove:
            return
        prefix = self.spec.get("prefix") or ""
        # a runtime still busy with the container (its cleanup, a lock held by a CLI we
        # killed) may refuse the first removal: list by label and retry, for a few seconds
        deadline = now() + 15.0
        while True:
            names = [n.strip() for n in run_output(listing).splitlines()]
            left = [n for n in names if n and n.startswith(prefix)]
            if not self.left:
                self.left = left  # what was left when we first looked (reported)
            if not left or now() >= deadline:
                self.left = left if left else self.left
                self.remaining = left
                return
            for name in left:
                run_quiet(remove[:-1] + [name])
            time.sleep(0.5)


def start_error(program, exc):
    """Why the job could not start, worded as a shell says it, and the shell's exit code.

    ``nvidia-smi: command not found`` (127) for a bare name missing from PATH; the file's
    own error otherwise (``./run.sh: Permission denied``, 126).
    """
    import errno  # only the failure path needs it

    if exc.errno == errno.ENOENT and "/" not in program:
        return "%s: command not found" % program, 127
    code = 127 if exc.errno == errno.ENOENT else 126
    return "%s: %s" % (program, exc.strerror or exc), code


def exit_code(status):
    """A raw wait status as (exit code, signal): 128+N and N for a death by signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status), os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


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
    waited = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    out, err, ctl = connect("out"), connect("err"), connect("ctl")
    set_title(rank_title(argv, shim=True), "dtrain-shim")
    ours = {0, os.getpid(), os.getppid()}  # 0: the kernel, or a sender in another pid namespace
    try:
        ours.add(struct.unpack("3i", ctl.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0])
    except (OSError, AttributeError, struct.error):
        pass
    child = subprocess.Popen(rank_argv(argv, path), stdout=out.fileno(), stderr=err.fileno(),
                             env=rank_env(path), start_new_session=True,
                             preexec_fn=_die_with_parent(os.getpid(), waited))
    out.close()
    err.close()
    started = now()
    stop = None
    outside = None
    code = child.poll()
    while code is None:
        info = signal.sigwaitinfo(waited)
        if info.si_signo != signal.SIGCHLD and stop is None:
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
    for other in waited[:3]:
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


def main():
    if os.environ.get(SHIM_ENV) and len(sys.argv) > 1:
        sys.exit(shim_main(sys.argv[1:]))
    if os.environ.get(ARM_ENV) and len(sys.argv) > 1:
        rank_main(sys.argv[1:])  # never returns: the user's script ends the process
        return
    # shipped by launcher/nodeside/wire.py: the bootstrap hands us our source and the spec, having
    # read exactly their lengths from fd 0, so the rest of fd 0 is ours, unbuffered
    source = globals().get("DTRAIN_SOURCE")
    spec = globals().get("DTRAIN_SPEC")
    if source is None:
        with open(__file__, "rb") as f:
            source = f.read()
    if spec is None:
        line = b""
        while not line.endswith(b"\n"):
            c = os.read(0, 1)
            if not c:
                break
            line += c
        spec = line
    sup = Supervisor(load_spec(spec), source)
    set_title(sup.title(), "dtrain-sup")
    code = sup.run()
    # Every frame is out (os.write, unbuffered) and the private files are gone: leave now.
    # A normal interpreter exit would tear down every module first, ~2.5 ms of CPU per node.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
