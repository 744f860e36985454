"""The login node's trust boundary with other local users: one helper for every private
directory, file and unix socket dtrain keeps there (docs/threat-model.md).

A login node is shared. Another user can create any path in ``/tmp`` before dtrain does,
make it a symlink, or listen on a socket where dtrain expects its own keeper or resident.
So every place dtrain keeps state that lasts (the keeper's and the resident's directory, the
detached run's control socket) goes through these checks, on both sides of each socket,
before a byte is sent:

* a directory: ``lstat`` (not followed), a directory, owned by this uid, mode without group
  or other bits (as OpenSSH's ControlPath, ssh-agent's and tmux's socket directories);
* a file read from it: ``O_NOFOLLOW``, a regular file, owned by this uid, not writable by
  group or others, read on the descriptor that was checked (no check-then-open race);
* a unix socket: the socket file owned by this uid, and after ``connect`` the peer's uid
  from ``SO_PEERCRED`` (the kernel's word, not the peer's) equal to this uid; a server asks
  the same of each client.

Standard library only and nothing heavy: the console script's entry point
(launcher/start.py) imports it before every command. tests/test_private.py attacks each
check as a second local user; tests/test_layers.py fails when a module opens a unix socket
without it.
"""

from __future__ import annotations

import os
import socket
import stat
import struct

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotPrivate(Exception):
    """A path or peer that is not this user's alone; the message says what and whose."""


def private_dir(path: str | os.PathLike[str], *, create: bool) -> str | None:
    """None when ``path`` is a directory of this user's alone (0700, not a link); else why
    not. With ``create``, a missing one is made 0700 first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return f"{path} does not exist"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"cannot create {path}: {exc.strerror}"
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"{path}: {exc.strerror}"
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not to you"
    if st.st_mode & 0o077:
        return f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):o}; want 700)"
    return None


def read_private(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most ``limit`` bytes of a file of this user's alone. FileNotFoundError when there
    is none; NotPrivate for a link, another owner, a file others may write, or no file."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        if exc.errno == 40:  # ELOOP: O_NOFOLLOW met a symbolic link
            raise NotPrivate(f"{path} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotPrivate(f"{path} is not a regular file")
        if st.st_uid != os.getuid():
            raise NotPrivate(f"{path} belongs to uid {st.st_uid}, not to you")
        if st.st_mode & 0o022:
            raise NotPrivate(f"{path} is writable by others "
                             f"(mode {stat.S_IMODE(st.st_mode):o})")
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def socket_file(path: str | os.PathLike[str]) -> str | None:
    """None when ``path`` is a socket file of this user's; else why not (lstat: a link to
    someone else's socket is refused too)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not to you"
    return None


def peer_uid_pid(sock: socket.socket) -> tuple[int, int]:
    """The uid and pid of the process at the other end of a connected unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return uid, pid


def peer_is_me(sock: socket.socket) -> str | None:
    """None when the peer runs as this uid; else why not (for a server's refusal or a
    client's)."""
    try:
        uid, pid = peer_uid_pid(sock)
    except OSError as exc:
        return f"cannot tell who is at the other end: {exc.strerror}"
    if uid != os.getuid():
        return f"the other end (pid {pid}) runs as uid {uid}, not as you"
    return None


def connect_private(path: str, *, timeout: float) -> tuple[socket.socket, int]:
    """A connected socket to this user's own server at ``path``, and the server's pid.

    Its directory must be private, the socket file this user's, and the peer this uid, all
    checked before anything is sent. NotPrivate when any of those fails; OSError when nothing
    listens."""
    why = private_dir(os.path.dirname(path) or ".", create=False) or socket_file(path)
    if why is not None:
        raise NotPrivate(why)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        why = peer_is_me(sock)
        if why is not None:
            raise NotPrivate(f"{path}: {why}")
        return sock, peer_uid_pid(sock)[1]
    except BaseException:
        sock.close()
        raise


def process_parent_and_uid(pid: int) -> tuple[int, int] | None:
    """A process's parent pid and real uid from /proc (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read(8192).decode("ascii", "replace")
    except OSError:
        return None
    ppid = uid = None
    for line in text.splitlines():
        if line.startswith("PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith("Uid:"):
            uid = int(line.split()[1])
    if ppid is None or uid is None:
        return None
    return ppid, uid
