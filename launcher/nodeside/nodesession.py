"""The node session: one process per (user, run, node) that supervises each attempt of a
``--restarts`` run in turn and keeps the warm process between them (docs/warm-start.md,
"Across --restarts attempts").

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``), before supervisor.py;
runs on the nodes, standard library only, Python >= 3.8.

When the spec has ``session`` (``key``: the run's id, ``last``: no attempt follows this one,
``linger``: how long to wait for the next), the attempt's channel program (``session_main``)
hands its stdin, stdout and stderr (SCM_RIGHTS) and the spec to the session over a unix
socket in this user's private directory, and stays as a stand-in until the session answers
the attempt's exit code. No session yet: it starts one first (a fork of itself, in a session
of its own). The session ``dup2``s the three descriptors onto 0/1/2 and runs the attempt's
``Supervisor`` in-process: every frame, control line, heartbeat and teardown as without it.
The supervisor process is thus the same from attempt to attempt, so the warm process, and
the agent and the ranks forked from it, stay inside its process tree (it is the child
subreaper that the forked agent is reparented to). Between attempts the warm process is
SPARED by every KILL of the tree; the session ends after the last attempt, after an attempt
whose launcher went away, or after ``linger`` seconds with no attempt, and the warm process
with it.

Trust: the directory is ``<tmp>/dtrain-<uid>``, made 0700 and checked with ``lstat`` (a
directory, this user's, nobody else's bits) before every use; the socket's peer is checked
with SO_PEERCRED on both ends. A directory that fails the check: no session (the attempt
runs as without one).
"""

import _signal as signal  # type: ignore[import-not-found]  # (no stub: typeshed lacks it)
import os
import struct
import sys

from launcher.nodeside.nodecommon import hostname
from launcher.nodeside.nodeprocs import SPARED
from launcher.nodeside.nodetitle import set_title

SESSION_V = 1
MAX_SESSION_SPEC = 64 << 20
SESSION_LINGER_S = 120.0


def session_dir(base=None, uid=None):
    """This user's private directory for node sessions (``<tmp>/dtrain-<uid>``, made 0700),
    or None when what is there is not a directory of this user's alone (lstat: a symbolic
    link, another user's, group or other bits set)."""
    import stat
    import tempfile

    uid = os.getuid() if uid is None else uid
    path = os.path.join(base or tempfile.gettempdir(), "dtrain-%d" % uid)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        return None
    return path


def session_path(directory, key, host):
    """The session's socket: one per run and node (``host``: a /tmp that several nodes share,
    as the test cluster's namespaces do, must not lead one node to another's session)."""
    import hashlib

    digest = hashlib.sha1(("%s\0%s" % (key, host)).encode()).hexdigest()[:16]
    return os.path.join(directory, "s-%s.sock" % digest)


def _peer_ok(sock):
    import socket

    try:
        peer = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                   struct.calcsize("3i")))
    except OSError:
        return False
    return peer[1] == os.getuid()


def _connect(path):
    """A connection to the session at ``path`` (its peer checked), or None."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    if not _peer_ok(s):
        s.close()
        return None
    return s


def session_main(spec, source, make):
    """The attempt run by the node session (its exit code), or None: no session could be
    had (the directory failed its check): the caller supervises the attempt itself."""
    sess = spec.get("session") or {}
    directory = session_dir()
    if directory is None or not sess.get("key"):
        return None
    path = session_path(directory, sess["key"], hostname())
    conn = _connect(path) or _start(path, source, make, sess)
    if conn is None:
        return None
    return _hand_over(conn, spec)


def _start(path, source, make, sess):
    """Start the session (a fork of this process) listening at ``path``; a connection to it."""
    import socket

    try:
        os.unlink(path)  # a session that is gone left its socket (our own directory)
    except OSError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(8)
    except OSError:
        listener.close()
        return _connect(path)  # another attempt's program started it meanwhile
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            linger = float(sess.get("linger") or SESSION_LINGER_S)
            _session_serve(listener, path, source, make, linger)
        finally:
            os._exit(0)
    listener.close()
    return _connect(path)


def _hand_over(conn, spec):
    """Send the spec and our 0/1/2; wait for the attempt's code (255: the session died)."""
    import array
    import json
    import socket

    body = json.dumps({"v": SESSION_V, "spec": spec, "host": hostname()}).encode()
    data = struct.pack("!I", len(body)) + body
    try:
        sent = conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      array.array("i", [0, 1, 2]).tobytes())])
        conn.sendall(data[sent:])
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                return 255
            buf += chunk
        code = json.loads(buf.split(b"\n", 1)[0].decode()).get("code")
        return code if type(code) is int else 255
    except (OSError, ValueError):
        return 255
    finally:
        conn.close()


def _receive(conn):
    """(spec, [fd0, fd1, fd2]) of one attempt's hand-over, or (None, fds) when it is not one."""
    import json
    import socket

    fds, buf = [], b""  # type: list[int], bytes
    conn.settimeout(30.0)
    try:
        while len(buf) < 4 or len(buf) < 4 + struct.unpack("!I", buf[:4])[0]:
            if len(buf) >= 4 and struct.unpack("!I", buf[:4])[0] > MAX_SESSION_SPEC:
                return None, fds
            data, anc, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(12))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    n = len(payload) // 4
                    fds += list(struct.unpack("%di" % n, payload[:4 * n]))
            if not data:
                return None, fds
            buf += data
        req = json.loads(buf[4:4 + struct.unpack("!I", buf[:4])[0]].decode())
    except (OSError, ValueError):
        return None, fds
    spec = req.get("spec") if isinstance(req, dict) and req.get("v") == SESSION_V \
        and req.get("host") == hostname() else None
    if not isinstance(spec, dict) or len(fds) != 3:
        return None, fds
    return spec, fds


def _session_serve(listener, path, source, make, linger):
    """The session: each attempt's Supervisor in turn, the warm process kept between them."""
    import socket

    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the first channel is its program's, not ours to hold open
        os.dup2(null, fd)
    import tempfile

    home = tempfile.mkdtemp(prefix="dtrain-session-")  # the warm process's socket and log
    kept = None  # the warm process: (pid, socket path, what it was started for)
    listener.settimeout(linger)
    try:
        while True:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, _idle_stop)  # idle: a stop ends the session, its warm
                #                                 process and its files
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                break
            except OSError:
                continue
            if not _peer_ok(conn):
                conn.close()
                continue
            spec, fds = _receive(conn)
            if spec is None:
                for f in fds:
                    os.close(f)
                conn.close()
                continue
            code, sup = _attempt(spec, fds, source, make, home, kept, null)
            try:
                conn.sendall(b'{"code": %d}\n' % code)
            except OSError:
                pass
            conn.close()
            kept = sup.warm.kept() if sup is not None else None
            if kept is None or sup.orphaned or (spec.get("session") or {}).get("last"):
                break
    finally:
        _end(kept, home, path, listener)


def _idle_stop(signum, frame):
    raise SystemExit(0)


def _attempt(spec, fds, source, make, home, kept, null):
    """One attempt's Supervisor on the handed descriptors: (its exit code, the supervisor)."""
    for i, f in enumerate(fds):
        os.dup2(f, i)
        if f > 2:
            os.close(f)
    sup = None
    try:
        sup = make(spec, source)
        sup.warm.session = (home, kept)
        set_title(sup.title() + " (session)", "dtrain-sup")
        code = sup.run()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    for fd in (0, 1, 2):  # the attempt's channel closes when its program exits
        os.dup2(null, fd)
    return code, sup


def _end(kept, home, path, listener):
    """The session is over: the warm process KILLed (and reaped), its files and socket gone."""
    import shutil

    listener.close()
    if kept is not None:
        SPARED.discard(kept[0])
        try:
            os.kill(kept[0], signal.SIGKILL)
            os.waitpid(kept[0], 0)
        except OSError:
            pass
    shutil.rmtree(home, ignore_errors=True)
    try:
        if os.path.exists(path):
            os.unlink(path)
    except OSError:
        pass
