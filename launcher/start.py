"""The console script's entry point: a warm start through the resident, else the CLI.

With the connection keeper on (``--persist``, docs/connections.md), the keeper also runs a
*resident*: a process that has already imported the CLI, typer and the command modules
(``launcher/cli/resident.py``). ``exec``, ``cp``, ``doctor``, ``stacks`` and ``top --once``
then ask it to fork a child that runs the very same CLI on this process's argv,
environment, working directory, umask and standard streams (passed as file descriptors),
while this process only forwards signals and waits. The child's exit status becomes this
process's, a death by a signal included. A warm command thus pays neither Python's imports
nor asyncssh's handshake.

Anything the resident cannot serve (none running, another uid, other code, another Python
setup) is an ordinary start, said once with ``-v``. ``DTRAIN_RESIDENT=0`` turns it off.

Standard library only, and nothing heavy: this runs before every command.
"""

from __future__ import annotations

import os
import sys

from launcher.exitcodes import EXIT_UNREACHABLE, exit_for_signal

_ENTRY = __import__("time").time()  # DTRAIN_HOPS's "entry" mark (text/hops.py)

# the one-shot commands issue 41 names, whose start is much of their time; never `run` or
# `smoke` (a training run must not depend on the keeper's process), nor `keys` (a password
# prompt wants a controlling terminal), nor top's live view (a full-screen program)
RESIDENT_COMMANDS = ("exec", "cp", "doctor", "stacks", "top")


def resident_may_serve(argv: list[str]) -> bool:
    """Whether this command line is one a resident's child may run."""
    name = argv[1] if len(argv) > 1 else ""
    if name == "top":
        return "--once" in argv[2:]
    return name in RESIDENT_COMMANDS
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH",
             "SIGCONT")
REPLY_WAIT = 2.0  # seconds for the resident to fork (it answers in milliseconds)
MAX_LINE = 1 << 16


def socket_dir(environ: dict[str, str] | os._Environ[str], uid: int) -> str:
    """The keeper's private directory (transports/keeper/frames.keeper_dir, which this must
    not import: it would pull in asyncio). tests/test_resident.py checks they agree."""
    import stat

    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
            if st.st_uid == uid and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o077:
                return os.path.join(runtime, "dtrain")
        except OSError:
            pass
    return f"/tmp/dtrain-keeper-{uid}"


SOCKET_NAME = "resident.sock"
ABOUT_NAME = "resident.json"  # what the resident runs: read before connecting
_FLAGS_IGNORED = ("safe_path", "inspect", "interactive", "quiet")  # -P is the resident's own


def runtime(package_dir: str) -> list[object]:
    """What this interpreter would run the CLI with, beyond dtrain's own modules: the
    interpreter, its flags and -X options, the module search path (without the script's
    directory and dtrain's own parent, which the keeper puts there), and a sitecustomize or
    usercustomize. A client whose runtime is not the resident's (``-X importtime``, a
    PYTHONPATH with other packages, a sitecustomize that watches the process) starts
    normally: the resident would run its command without them."""
    flags = {name: getattr(sys.flags, name) for name in dir(sys.flags)
             if not name.startswith(("_", "n_")) and name not in ("count", "index")
             and name not in _FLAGS_IGNORED}
    entries = list(sys.path) if sys.flags.safe_path else list(sys.path)[1:]
    parent = os.path.dirname(package_dir)
    path = [p for p in entries if p and os.path.abspath(p) != parent]  # as given: an
    # entry may be no directory at all (setuptools' editable finder hook)
    custom = [getattr(sys.modules.get(m), "__file__", None)
              for m in ("sitecustomize", "usercustomize")]
    # the binary, not the name it was started by (python, python3.11: one interpreter)
    return [os.path.realpath(sys.executable), sys.version, sorted(flags.items()),
            sorted(sys._xoptions.items()), list(sys.warnoptions), path, custom]


def code_stamp(package_dir: str) -> str:
    """Which code this is: every module of the package by path, size and mtime. The
    resident serves only a client whose stamp equals its own (an edited or upgraded dtrain
    is never run by an old resident)."""
    import zlib

    rows = [package_dir]
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(root, name))
                rows.append(f"{root[len(package_dir):]}/{name}:{st.st_size}:{st.st_mtime_ns}")
    return f"{zlib.crc32(chr(0).join(rows).encode()):08x}:{len(rows)}"


def _verbose(argv: list[str]) -> bool:
    args = argv[2:argv.index("--")] if "--" in argv else argv[2:]
    return "-v" in args or "--verbose" in args


def _read_line(sock: object, buf: bytearray) -> bytes | None:
    """One line from the resident (None at EOF)."""
    while b"\n" not in buf:
        chunk = sock.recv(4096)  # type: ignore[attr-defined]
        if not chunk:
            return None
        buf += chunk
        if len(buf) > MAX_LINE:
            return None
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def serve_here(argv: list[str]) -> int | None:
    """Run this command in a child of the resident; its wait status, or None when the
    resident cannot serve it (then the caller starts normally)."""
    directory = socket_dir(os.environ, os.getuid())
    if not os.path.lexists(directory):
        return None  # no resident: an ordinary start, which paid one lstat and nothing more
    from launcher import private

    path = os.path.join(directory, SOCKET_NAME)
    verbose = _verbose(argv)

    def unserved(why: str) -> None:
        if verbose:
            print(f"dtrain: an ordinary start (the resident: {why})", file=sys.stderr)

    # another user may have made this directory first (in /tmp when XDG_RUNTIME_DIR is
    # unset) with a resident of their own, to be handed this command's environment and
    # terminal: nothing in it is read unless it is this user's alone (launcher/private.py)
    why = private.private_dir(directory, create=False)
    if why is not None:
        if os.path.lexists(directory):
            print(f"dtrain: warning: {directory} is not used: {why}. Another user may have "
                  f"made it; remove it, or set XDG_RUNTIME_DIR to a directory of your own.",
                  file=sys.stderr)
        return None  # no resident: an ordinary start, which paid nothing more
    try:
        about_text = private.read_private(os.path.join(directory, ABOUT_NAME), MAX_LINE)
    except private.NotPrivate as exc:
        print(f"dtrain: warning: the resident is not used: {exc}", file=sys.stderr)
        return None
    except OSError:
        return None  # no resident: an ordinary start, which paid nothing more
    import json

    import launcher

    package = os.path.dirname(launcher.__file__)
    here = runtime(package)
    stamp = code_stamp(package)
    try:
        about = json.loads(about_text)
        ours = about["package"] == package
        changed = ours and about["stamp"] != stamp  # told below: it retires
        same = ours and (changed or about["runtime"] == json.loads(json.dumps(here)))
    except (ValueError, KeyError, TypeError):
        same = False
    if not same:  # another dtrain or another interpreter setup: not even connected to
        unserved("it runs another dtrain or another Python setup")
        return None
    import array
    import signal
    import socket

    # from here on a signal is the child's: held until its pid is known, then passed on (a
    # Ctrl-C in the milliseconds before it must not become a traceback or a lost stop)
    child: list[int] = []
    pending: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if not child:
            pending.append(signum)
            return
        if child[0] <= 0:  # ended before it could be checked: nobody to pass it to
            return
        try:
            os.kill(child[0], signum)
        except OSError:
            pass

    def stop(signum: int, frame: object) -> None:  # Ctrl-Z: both stop, both go on with fg
        forward(signal.SIGSTOP, frame)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)  # stopped by SIGTSTP, as the shell
        os.kill(os.getpid(), signal.SIGTSTP)  # expects (its $? is 148 for a job on hold)
        signal.signal(signal.SIGTSTP, stop)  # continued (SIGCONT, forwarded too)

    before = {name: signal.signal(getattr(signal, name), forward) for name in FORWARDED}
    before["SIGTSTP"] = signal.signal(signal.SIGTSTP, stop)

    def unserved_now(why: str) -> None:
        """Not served after all: the signals as they were, one that came meanwhile acted
        on as the ordinary start would have (Ctrl-C: 130, no traceback)."""
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)
        ends = [sig for sig in pending if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
        if ends:
            raise SystemExit(exit_for_signal(ends[0]))
        unserved(why)

    buf = bytearray()
    try:  # the socket, its directory and the uid at the other end, before a byte is sent
        sock, resident_pid = private.connect_private(path, timeout=REPLY_WAIT)
    except private.NotPrivate as exc:
        print(f"dtrain: warning: the resident is not used: {exc}", file=sys.stderr)
        unserved_now(str(exc))
        return None
    except OSError as exc:
        unserved_now(f"{path}: {exc}")
        return None
    try:
        if os.environ.get("DTRAIN_HOPS") == "1":
            from launcher.text import hops

            hops.carry(sent=__import__("time").time())
        req = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(),
               "package": package, "runtime": here, "stamp": stamp,
               # how this process was started, for the usage line ("dtrain", "python -m
               # launcher"): click reads it from __main__
               "main_package": getattr(sys.modules.get("__main__"), "__package__", None),
               "streams": [[getattr(s, "encoding", None) or "utf-8",
                            getattr(s, "errors", None) or "strict"]
                           for s in (sys.stdin, sys.stdout, sys.stderr)]}
        fds = [fd for fd in (0, 1, 2) if _is_open(fd)]
        req["fds"] = fds
        sock.sendmsg([json.dumps(req).encode() + b"\n"],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        first = _read_line(sock, buf)
        reply = json.loads(first) if first else {"refused": "no answer"}
    except (OSError, ValueError) as exc:
        sock.close()
        unserved_now(f"{path}: {exc}")
        return None
    pid = reply.get("pid") if isinstance(reply, dict) else None
    if not isinstance(pid, int) or pid <= 0:
        sock.close()
        unserved_now(str(reply.get("refused") if isinstance(reply, dict) else reply))
        return None
    # signals go only to the resident's own child, running as this user: never to a pid
    # the other end merely names
    # (one already ended and reaped, a fast command's, has no parent to read: nothing is
    # forwarded then, since its pid may be anyone's by now)
    family = private.process_parent_and_uid(pid)
    if family is not None and family != (resident_pid, os.getuid()):
        sock.close()
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)
        print(f"dtrain: error: the resident (pid {resident_pid}) named process {pid}, which "
              f"is not its child; nothing is forwarded to it. Check `dtrain connections`, "
              f"or set DTRAIN_RESIDENT=0.", file=sys.stderr)
        return EXIT_UNREACHABLE << 8
    child.append(pid if family is not None else 0)
    for sig in pending:  # what came while the child was being made
        forward(sig, None)
    sock.settimeout(None)
    while True:
        try:
            line = _read_line(sock, buf)
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
    try:
        status = json.loads(line)["status"] if line else None
    except (ValueError, KeyError, TypeError):
        status = None
    if not isinstance(status, int):
        print(f"dtrain: the resident (process {pid}'s parent) ended before the command; its "
              f"exit status is unknown. Check `dtrain connections`, or set DTRAIN_RESIDENT=0.",
              file=sys.stderr)
        return EXIT_UNREACHABLE << 8  # as a command that could not start
    return status


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def exit_as(status: int) -> None:
    """End this process as the child ended: its exit code, or the same signal."""
    if os.WIFSIGNALED(status):
        import signal

        sig = os.WTERMSIG(status)
        sys.stdout.flush()
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # whose handlers cannot be set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(exit_for_signal(sig))  # a signal that does not end a process
    raise SystemExit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else EXIT_UNREACHABLE)


def main() -> None:
    argv = list(sys.argv)
    if os.environ.get("DTRAIN_HOPS") == "1":  # where the time goes (text/hops.py)
        from launcher.text import hops

        hops.carry(process=hops.process_start(), entry=_ENTRY)
    if (resident_may_serve(argv) and os.environ.get("DTRAIN_RESIDENT", "1") != "0"
            and not os.environ.get("_DTRAIN_COMPLETE")):
        status = serve_here(argv)
        if status is not None:
            exit_as(status)
    from launcher.cli import main as cli_main

    cli_main()
