"""dtrain image push: the archive's directory on a node, checked before anything is copied
into it (docs/containers.md, docs/security.md).

Shipped like the health collector (nodeside/wire.py: the bootstrap runs it as __main__ with
its spec, JSON, in ``DTRAIN_SPEC``); standard library only, Python >= 3.8. It prints one JSON
line: ``{"ok": true}`` or ``{"unsafe": why}``.

A node loads whatever archive lies in that directory under the image's name, so no other
user may be able to put one there, nor to swap the directory, or any directory above it,
for one of theirs between this check and the load. The rule is OpenSSH's for ~/.ssh
(``safe_path``): every directory from ``/`` down is walked without following a link
(``lstat``, then opened ``O_DIRECTORY|O_NOFOLLOW`` relative to its parent's descriptor and
the two compared), and each must be root's or the user's and writable by no group or other
user unless sticky (``/tmp``: others cannot rename what they do not own there). A symbolic
link on the way is followed only when root or the user owns it. The directory itself must be
the user's and writable by no one else. What passes cannot be changed by another user
afterwards: only root and the user can rename or replace anything on that path.

Spec: ``{"dir": path (relative: to the home), "marker": name, "index": i}``: missing
directories are made (0700) on the way; once the path passes, ``marker`` is created in it
exclusively (``O_EXCL|O_NOFOLLOW``) holding ``index``, where it is not there yet.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import sys
from typing import Any

MAX_LINKS = 40  # as the kernel's ELOOP
# O_PATH: a directory one may search but not read (mode 711) is walked too
_DIR_FLAGS = (getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW
              | getattr(os, "O_CLOEXEC", 0))


class Refused(str):
    """A reason of the check's: another user could change what the node would load. A
    plain str is a directory that cannot be used at all (not a directory, unreadable): the
    copy then names the node, as for any other place it cannot write."""


def _whose(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _join(parent: str, name: str) -> str:
    return parent.rstrip("/") + "/" + name


def _on_the_way(st: os.stat_result, uid: int, shown: str) -> str | None:
    """Why a directory on the way down lets another user swap what lies below it,
    or None."""
    if st.st_uid not in (0, uid):
        return Refused(f"{shown} belongs to {_whose(st.st_uid)}, who could rename what "
                       "lies below it and put a directory of their own in its place")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        who = "others" if mode & 0o002 else "its group"
        return Refused(f"{shown} is writable by {who} (mode {mode:o}, not sticky): they "
                       "could rename what lies below it and put a directory of their own in "
                       "its place")
    return None


def _tail(shown: str, target: str) -> str:
    return "" if shown == target else f" (on the way to {target})"


def open_private_dir(path: str, uid: int, make: bool = False
                     ) -> tuple[str | None, int | None]:
    """(None, descriptor of the directory) when ``path`` and every directory above it pass
    (module docstring); else (why, None). With ``make``, missing directories are created
    0700 on the way. The caller closes the descriptor."""
    target = path or "."
    if not target.startswith("/"):
        target = _join(os.getcwd(), target)
    todo = [c for c in target.split("/") if c and c != "."]
    todo.reverse()
    stack: list[tuple[int, str]] = []  # (descriptor, shown path) from / down
    try:
        root = os.open("/", _DIR_FLAGS)
        stack.append((root, "/"))
        why = _on_the_way(os.fstat(root), uid, "/")
        if why:
            return Refused(why + _tail("/", target)), None
        links = 0
        while todo:
            name = todo.pop()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            fd, parent = stack[-1]
            shown = _join(parent, name)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not make:
                    return f"{shown} does not exist", None
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in (0, uid):
                    return Refused(f"{shown} is a symbolic link of {_whose(st.st_uid)}'s, "
                                   f"who could point it elsewhere{_tail(shown, target)}"), None
                links += 1
                if links > MAX_LINKS:
                    return f"{target}: too many symbolic links", None
                link = os.readlink(name, dir_fd=fd)
                if link.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                todo.extend(reversed([c for c in link.split("/") if c and c != "."]))
                continue
            if not stat.S_ISDIR(st.st_mode):
                return f"{shown} is not a directory", None
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            stack.append((sub, shown))
            got = os.fstat(sub)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                return f"{shown} changed while it was checked", None
            why = _on_the_way(got, uid, shown) if todo else None  # the last: below
            if why:
                return Refused(why + _tail(shown, target)), None
        fd, shown = stack[-1]
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != uid or mode & 0o022:
            return Refused(f"{shown} is not this user's alone ({_whose(st.st_uid)}'s, "
                           f"mode {mode:o})"), None
        stack.pop()
        return None, fd
    except OSError as exc:
        return (f"cannot check {getattr(exc, 'filename', None) or target}: "
                f"{exc.strerror or exc}"), None
    finally:
        for fd, _ in stack:
            os.close(fd)


def prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """The marker step of image push on this node (module docstring)."""
    why, fd = open_private_dir(str(spec.get("dir") or "."), os.geteuid(), make=True)
    if isinstance(why, Refused):
        return {"unsafe": why}
    if why or fd is None:
        return {"ok": False, "unusable": why}  # no marker: a copy of its own, named there
    try:
        marker = str(spec.get("marker") or "")
        if marker and "/" not in marker:
            try:
                m = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                            0o600, dir_fd=fd)
            except OSError:
                pass  # there already (a shared directory) or not writable: read back later
            else:
                with os.fdopen(m, "w") as f:
                    f.write(f"{spec.get('index', 0)}\n")
    finally:
        os.close(fd)
    return {"ok": True}


def main() -> None:
    raw = globals().get("DTRAIN_SPEC") or b"{}"
    try:
        spec = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        out = prepare(spec if isinstance(spec, dict) else {})
    except Exception as exc:  # the launcher reports it, naming the node
        out = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
