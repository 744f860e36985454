"""The supervisor's processes: its own children and every descendant, and nothing else.

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``); runs on the nodes,
standard library only, Python >= 3.8.

It becomes a child subreaper, starts the job with fork + exec (``spawn``), finds its
descendants under /proc and signals each one by pid AND start time (``signal_pid``), so a
recycled pid is never signalled and nothing is ever killed by name.
"""

# signal.py only wraps _signal in enums, and importing enum costs ~3.5 ms of CPU per node
import _signal as signal  # type: ignore[import-not-found]  # (no stub: typeshed lacks it)
import os
import time

from launcher.nodeside.nodecommon import (
    _prctl,
    _stat_fields,
    now,
    start_time,
)

PR_SET_CHILD_SUBREAPER = 36
# the signals whose handlers tear the job down: blocked while a child is forked
TEARDOWN_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


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


# processes of the tree that no signal_tree, kill_all or "is the tree empty" may count: the
# warm process a node session keeps between attempts (nodesession.py); their descendants are
# the tree's as any other's (prune permitting)
SPARED = set()  # type: set[int]


def descendants(root_pid, prune=None):
    """Every live process descending from root_pid as (pid, start time), via /proc ppid links.

    ``prune(pid)`` true: that process is listed, its own descendants are not. A process in
    SPARED is never listed; its descendants are, unless ``prune`` says no.
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
            if child[0] not in SPARED:
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
