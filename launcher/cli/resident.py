"""The resident: warm starts for exec, cp, doctor, stacks, top --once (docs/connections.md).

``python -m launcher.cli.resident --dir DIR``, started by the connection keeper next to its
own socket and ending with it. It imports the CLI and the commands once, then waits on
``DIR/resident.sock`` (0600 in the user's 0700 directory, the peer's uid checked). For each
request of ``launcher/start.py`` it forks a child that takes the client's standard streams
(passed as file descriptors), argv, environment, working directory and umask, and runs
``launcher.cli.main`` exactly as a fresh process would. The client forwards its signals to
the child; the resident sends the child's wait status back when it ends.

A client that dies (SIGKILL included) closes its socket: the child then kills itself with
SIGKILL, so its channels close as a killed launcher's do and the nodes tear down.
"""

from __future__ import annotations

import argparse
import array
import atexit
import contextlib
import gc
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import launcher
from launcher import private
from launcher.exitcodes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from launcher.start import ABOUT_NAME, SOCKET_NAME, code_stamp, runtime

MAX_REQUEST = 8 << 20  # argv and the environment; more is refused
READ_WAIT = 2.0  # seconds a client has to send its request
POLL = 1.0  # how often the resident checks that its keeper is still there
STALE = 3  # the exit status that asks the keeper for a new resident (dtrain was changed)


def preload() -> None:
    """What the commands it serves would import: the CLI (typer and every command's
    options), the commands, the keeper's client and the config reader."""
    import launcher.cli  # noqa: F401
    import launcher.cli.args  # noqa: F401
    import launcher.cli.configs  # noqa: F401
    import launcher.commands.cp  # noqa: F401
    import launcher.commands.doctor  # noqa: F401
    import launcher.commands.exec  # noqa: F401
    import launcher.commands.stacks  # noqa: F401
    import launcher.commands.top  # noqa: F401
    import launcher.hosts.userconfig  # noqa: F401
    import launcher.transports.keeper.client  # noqa: F401
    from launcher.cli import prebuild
    from launcher.start import RESIDENT_COMMANDS

    prebuild(RESIDENT_COMMANDS)


def read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The client's JSON request line and the descriptors that came with it."""
    conn.settimeout(READ_WAIT)
    fds = array.array("i")
    data, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    buf = bytearray(data)
    try:
        while not buf.endswith(b"\n"):
            if len(buf) > MAX_REQUEST:
                raise ValueError(f"a request over {MAX_REQUEST >> 20} MiB")
            chunk = conn.recv(65536)
            if not chunk:
                raise ValueError("the client closed before its request ended")
            buf += chunk
        req = json.loads(buf)
        if not isinstance(req, dict):
            raise ValueError("a request is a JSON object")
        want = req.get("fds")
        if not (isinstance(want, list) and len(want) == len(fds)
                and all(w in (0, 1, 2) for w in want)):
            raise ValueError("the descriptors do not match the request")
        fields: tuple[tuple[str, type], ...] = (
            ("argv", list), ("cwd", str), ("env", dict), ("umask", int), ("stamp", str),
            ("streams", list))
        for key, typ in fields:
            if not isinstance(req.get(key), typ):
                raise ValueError(f"{key!r} missing or of the wrong type")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return req, list(fds)


def exit_code(exc: SystemExit) -> int:
    """What CPython makes of an uncaught SystemExit."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def stream(fd: int, mode: str, encoding: str, errors: str, line: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, mode, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding, errors=errors)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, errors=errors,
                            line_buffering=line)


def become(req: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
    """In the forked child: take on the client's process state (never returns)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target in (0, 1, 2):
        if target in req["fds"]:
            os.dup2(fds[req["fds"].index(target)], target)
        else:
            os.close(target)
    keep = conn.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
    os.umask(req["umask"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in req["env"].items()})
    from launcher.text import hops

    hops.mark("forked")
    time.tzset()
    try:
        os.chdir(req["cwd"])
    except OSError as exc:
        print(f"dtrain: cannot enter the working directory {req['cwd']}: {exc.strerror}",
              file=sys.stderr)
    (ie, ierr), (oe, oerr), (ee, eerr) = (tuple(s) for s in req["streams"])
    # a descriptor the client had closed: None, as CPython leaves it
    sys.stdin = stream(0, "r", ie, ierr, False) if 0 in req["fds"] else None  # type: ignore[assignment,unused-ignore]
    sys.stdout = stream(1, "w", oe, oerr, os.isatty(1)) if 1 in req["fds"] else None  # type: ignore[assignment,unused-ignore]
    sys.stderr = stream(2, "w", ee, eerr, True) if 2 in req["fds"] else None  # type: ignore[assignment,unused-ignore]
    sys.argv = [str(a) for a in req["argv"]]
    main_package = req.get("main_package")  # click's program name: "dtrain", "python -m ..."
    sys.modules["__main__"].__package__ = main_package if isinstance(main_package, str) else None

    def watch() -> None:  # the client gone: die as a killed launcher dies
        with contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    conn.settimeout(None)
    threading.Thread(target=watch, name="dtrain-client-watch", daemon=True).start()
    gc.unfreeze()
    code = 1
    try:
        from launcher.cli import main

        main()
        code = 0
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:
        code = -1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                if s is not None:
                    s.flush()
    if code == -1:  # as CPython ends on an uncaught Ctrl-C: by SIGINT itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = EXIT_INTERRUPTED
    os._exit(code)


class Resident:
    def __init__(self, directory: Path, keeper: int) -> None:
        self.directory = directory
        self.path = directory / SOCKET_NAME
        self.package = os.path.dirname(launcher.__file__)
        self.stamp = code_stamp(self.package)
        self.runtime = json.loads(json.dumps(runtime(self.package)))
        self.parent = keeper  # its keeper's pid: when it is no longer the parent, it ended
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, client)
        self.stale = False

    def listen(self) -> socket.socket:
        why = private.private_dir(self.directory, create=False)
        if why is not None:  # the keeper checked it; a swap since then ends the resident
            raise SystemExit(f"dtrain resident: {why}")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(64)
        self.sel.register(listener, selectors.EVENT_READ, None)
        about = {"pid": os.getpid(), "package": self.package, "runtime": self.runtime,
                 "stamp": self.stamp}
        tmp = self.directory / f".{ABOUT_NAME}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(about, fh)
        os.replace(tmp, self.directory / ABOUT_NAME)
        return listener

    def refuse(self, conn: socket.socket, why: str) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"refused": why}).encode() + b"\n")
        conn.close()

    def accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        if private.peer_is_me(conn) is not None:
            self.refuse(conn, "not your resident")
            return
        try:
            req, fds = read_request(conn)
        except (OSError, ValueError) as exc:
            self.refuse(conn, f"bad request: {exc}")
            return
        try:
            if req.get("package") != self.package:
                self.refuse(conn, "it runs another dtrain or another Python setup")
                return
            if req["stamp"] != self.stamp:
                self.stale = True  # this dtrain was edited or upgraded: end, be replaced
                self.refuse(conn, "it runs other code (dtrain was changed since it started)")
                return
            if req.get("runtime") != self.runtime:
                self.refuse(conn, "it runs another dtrain or another Python setup")
                return
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's coverage is the commands' tests
                try:
                    become(req, fds, conn)
                finally:
                    os._exit(EXIT_FAILED)  # become() itself failed
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:  # pragma: no cover - Linux >= 5.3 has it
                pidfd = -1
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        if pidfd < 0:
            _, status = os.waitpid(pid, 0)
            self.report(conn, status)
            return
        self.children[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, pidfd)

    def report(self, conn: socket.socket, status: int) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"status": status}).encode() + b"\n")
        conn.close()

    def reap(self, pidfd: int) -> None:
        self.sel.unregister(pidfd)
        pid, conn = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        self.report(conn, status)

    def serve(self) -> int:
        listener = self.listen()
        print(f"dtrain resident {os.getpid()}: serving {self.path}", flush=True)
        gc.freeze()  # the forked children do not copy what a collection would touch
        try:
            while not self.stale and os.getppid() == self.parent:
                for key, _ in self.sel.select(POLL):
                    if key.data is None:
                        self.accept(listener)
                    else:
                        self.reap(key.data)
        finally:
            for name in (ABOUT_NAME, SOCKET_NAME):
                with contextlib.suppress(OSError):
                    (self.directory / name).unlink()
            listener.close()
        print(f"dtrain resident {os.getpid()}: exit"
              f"{' (dtrain changed)' if self.stale else ''}", flush=True)
        return STALE if self.stale else 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="dtrain-resident")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--keeper", type=int, required=True, help="the keeper's pid (the parent)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_OK))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    preload()
    return Resident(Path(args.dir), args.keeper).serve()


if __name__ == "__main__":
    sys.exit(main())
