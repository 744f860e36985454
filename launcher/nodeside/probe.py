"""dtrain node probe: this program RUNS ON THE NODES, not on the launcher machine.

It is shipped over the SSH channel, bundled with the modules it imports (nodetitle,
probenet: launcher/nodeside/wire.py ``PROGRAMS``), and started as ``python3 -c BOOTSTRAP``
(the bootstrap exec()s that source with ``__name__ == "__main__"``), or run directly as
``python3 probe-bundle.py < params``. It reads ONE JSON line of parameters from stdin and writes ONE
JSON object to stdout. Hence: standard library only, Python 3.8 syntax, no torch import (1-2 s).

Modes (``params["mode"]``):

* ``facts`` (default): everything the launcher needs to decide the network environment and run
  preflight checks -- interfaces and addresses, the route to each target, site NCCL config, the
  RDMA (InfiniBand / RoCE / EFA) tree with GID tables, GPUs, limits. See ``collect_facts``.
* ``listen``: bind+listen on ``addr:port``, print ``{"ok": true, "port": N}`` at once, accept and
  close connections until stdin reaches EOF (the launcher closes the channel).
* ``runs``: every user's dtrain runs on this node, from the process table (runscan.py):
  ``{"ok", "mode", "hostname", "hidden", "denied", "runs"}``.
* ``connect``: one TCP connect to ``addr:port``; print ``{"ok": bool, "error"?: str, "ms": float}``.

``facts`` with ``"stay": true`` (what `dtrain run` sends: one interpreter per node for the
whole preflight): after the facts the program stays, reads one JSON op a line from stdin
and answers each with one JSON line, until EOF: ``{"op": "routes", "targets"}`` → the route
to each (``{"ok", "routes"}``); ``{"op": "listen", "addr", "port"}`` → ``listen``'s answer,
and the port stays bound, its connections accepted and closed, until EOF or
``{"op": "unlisten"}`` (answered ``{"ok": true}`` once the port is closed: the launcher
starts the job without waiting for the probes' exits); ``{"op": "connect", ...}`` →
``connect``'s answer.
``{"op": "become", "workdir", "bootstrap"}``: the probe's process becomes the job's
supervisor (``become``: an exec, answered ``{"ok": true}`` just before it).

Every file is read through a ``root`` prefix and every command through an injectable runner
(``System``), so tests point the readers at fake sysfs trees instead of patching ``open``.
Unreadable files (EINVAL, ENOENT, EISDIR, any OSError) count as absent, never as errors: the
kernel answers EINVAL for unpopulated GID attributes and containers hide parts of /sys.
"""


from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from launcher.nodeside.nodetitle import set_title
from launcher.nodeside.runscan import scan

if TYPE_CHECKING:  # annotations only: never evaluated, so 3.8 never sees list[str]
    from collections.abc import Callable, Iterable
    from typing import TextIO

    Json = dict[str, Any]
    CmdResult = tuple[int, str, str] | None
    Runner = Callable[[list[str]], CmdResult]

from launcher.nodeside.probenet import (
    EXTRA_FILES,
    System,
    default_iface,
    ib_dir,
    listdir,
    parse_proc_route,
    read_addresses,
    read_interfaces,
    read_rdma,
    read_routes,
    read_site_env,
    read_text,
)

PROBE_VERSION = 1
UNLIMITED = -1  # how RLIM_INFINITY is written in the JSON
# the environment the shell (after --setup) gave us, before site or anything else ran: what
# a supervisor started by that shell would get (``become``)
START_ENV = dict(os.environ)


# --------------------------------------------------------------------------- the rest


# a wheel's dist-info directory: the normalized name and the version (what pip writes)
_DIST_INFO = re.compile(r"^(torch|nvidia_nccl_cu(\d+))-([^-]+)\.dist-info$")
_EGG_INFO = re.compile(r"^torch(-[^-]+)?\.egg-info$")


def _metadata_version(path: str) -> str | None:
    """The ``Version:`` header of a dist's METADATA/PKG-INFO (read up to the body)."""
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, name), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    if line.lower().startswith("version:"):
                        return line.split(":", 1)[1].strip() or None
        except OSError:
            continue
    return None


def read_packages(path: list[str] | None = None) -> Json:
    """torch and NCCL wheel versions from dist metadata, without importing torch, and
    without importlib.metadata either (its import is ~15-35 ms of every node's probe): the
    first ``torch-*.dist-info`` (or a develop install's ``torch.egg-info``) on sys.path, in
    sys.path order, as ``importlib.metadata.version("torch")`` finds it."""
    out: Json = {"torch": None, "nccl": None, "nccl_dist": None}
    for d in sys.path if path is None else path:
        for name in listdir(d or "."):
            m = _DIST_INFO.match(name)
            if m is None:
                if out["torch"] is None and _EGG_INFO.match(name):
                    out["torch"] = _metadata_version(os.path.join(d or ".", name))
                continue
            if m.group(1) == "torch":
                if out["torch"] is None:
                    out["torch"] = (_metadata_version(os.path.join(d or ".", name))
                                    or m.group(3))
            elif out["nccl"] is None:
                out["nccl"], out["nccl_dist"] = m.group(3), "nvidia-nccl-cu" + m.group(2)
    return out


def _pth_paths(sitedir: str, name: str, known_paths: Any) -> Any:
    """site.addpackage without its import lines: the directories a .pth file names."""
    import site

    if known_paths is None:  # as site's own: None means "the paths on sys.path now"
        return site.addpackage(sitedir, name, known_paths)
    try:
        with open(os.path.join(sitedir, name)) as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return known_paths
    for line in lines:
        if line.startswith("#") or not line.strip() or line.startswith(("import ", "import\t")):
            continue
        path, case = site.makepath(sitedir, line.rstrip())
        if case not in known_paths and os.path.exists(path):
            sys.path.append(path)
            known_paths.add(case)
    return known_paths


def load_site(full: bool) -> bool:
    """sys.path as the job's interpreter has it, for a probe started with -S (site not run).

    site's .pth files run code (their import lines: editable installs' finders, setuptools'
    distutils hack, ...): ~50 ms of every node's probe, and read_packages only needs the
    directories. ``full`` (a module entry, which importlib's finders look up, an editable
    install's finder too) runs site as the interpreter would; otherwise site runs with the
    .pth files' import lines skipped. False when site had run already (no -S).
    """
    if not sys.flags.no_site:
        return False
    import site

    if full:
        site.main()
        return True
    saved = site.addpackage
    site.addpackage = _pth_paths  # type: ignore[assignment]
    try:
        site.main()
    finally:
        site.addpackage = saved
    return True


def read_gpus(sys_: System) -> Json:
    """GPU count from the driver's proc tree (else /dev/nvidiaN) and the driver version."""
    gpus = listdir(sys_.path("/proc/driver/nvidia/gpus"))
    count = len(gpus) or len([n for n in listdir(sys_.path("/dev"))
                              if re.match(r"^nvidia\d+$", n)])
    version = read_text(sys_.path("/proc/driver/nvidia/version")) or ""
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", version)
    return {"count": count, "driver": m.group(1) if m else None}


# a multi-node NVLink machine (GB200 NVL72 and the like): its IMEX channel device or its IMEX
# daemon's node list; elsewhere NVLink stops at the node and nvidia-smi is not asked at all
IMEX_MARKS = ("/dev/nvidia-caps-imex-channels", "/etc/nvidia-imex/nodes_config.cfg")
FABRIC_FIELDS = "fabric.state,fabric.status,fabric.clusterUuid,fabric.cliqueId"


def read_fabric(sys_: System) -> "Json | None":
    """GPU 0's NVLink fabric as nvidia-smi says it (the values are the machine's), only on
    a machine with IMEX (``IMEX_MARKS``): {state, status, cluster_uuid, clique_id}, raw
    text; None elsewhere or when nvidia-smi cannot say (an older driver refuses the fields).
    What counts as a domain is the launcher's decision (decide/runplan/placement.nvlink_domain)."""
    if not any(os.path.exists(sys_.path(p)) for p in IMEX_MARKS):
        return None
    res = sys_.run(["nvidia-smi", "--query-gpu=" + FABRIC_FIELDS, "--format=csv,noheader",
                    "-i", "0"])  # (3 s at most: run_command's bound)
    if res is None or res[0] != 0:
        return None
    line = (res[1].strip().splitlines() or [""])[0]
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    names = ("state", "status", "cluster_uuid", "clique_id")
    return {names[i]: parts[i] for i in range(4)}


def read_limits() -> Json:
    """Soft RLIMIT_MEMLOCK/NOFILE/STACK (-1 = unlimited): NCCL IB needs unlimited memlock."""
    try:
        import resource
    except ImportError:
        return {}
    out = {}
    for key, res in (("memlock", "RLIMIT_MEMLOCK"), ("nofile", "RLIMIT_NOFILE"),
                     ("stack", "RLIMIT_STACK")):
        soft = resource.getrlimit(getattr(resource, res))[0]
        out[key] = UNLIMITED if soft == resource.RLIM_INFINITY else soft
    return out


def read_shm(sys_: System) -> int | None:
    """Size of /dev/shm in bytes (Docker's default 64 MiB breaks NCCL), or None."""
    try:
        st = os.statvfs(sys_.path("/dev/shm"))
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def read_user() -> Json:
    """uid, user name and home directory of the probing account."""
    uid = os.getuid()
    try:
        import pwd

        pw = pwd.getpwuid(uid)
        # the home '~' means on this node: $HOME first, as the shell and expanduser do
        return {"uid": uid, "user": pw.pw_name, "home": os.environ.get("HOME") or pw.pw_dir}
    except (ImportError, KeyError):
        return {"uid": uid, "user": os.environ.get("USER"), "home": os.path.expanduser("~")}


def read_workdir(path: str) -> Json:
    """Whether the job's working directory exists, is a directory, may be entered and read
    (a 0700 directory of another user exists but is "permission denied", not empty), and is
    writable."""
    full = os.path.expanduser(path)
    is_dir = os.path.isdir(full)
    return {"path": path, "exists": os.path.exists(full), "is_dir": is_dir,
            "accessible": is_dir and os.access(full, os.R_OK | os.X_OK),
            "writable": os.access(full, os.W_OK)}


def read_entry(workdir: str, entry: Json) -> Json:
    """Whether the job's script (a path, relative to the working directory) or module exists.

    A module is looked up as ``python -m`` will: the working directory first, then sys.path
    (this is the job's interpreter, after --setup). Nothing is imported: the top-level name
    goes through importlib's finders (an editable install's finder too), the rest of a
    dotted name through the package directories found.
    """
    base = os.path.expanduser(workdir or ".")
    name = str(entry.get("name") or "")
    if not entry.get("module"):
        path = os.path.join(base, os.path.expanduser(name))
        found = os.path.isfile(path)
        # not found because a directory on the way may not be searched, or found but not
        # readable: "permission denied", not "not found"
        denied = (not found and _denied_on_the_way(path)) or (
            found and not os.access(path, os.R_OK))
        return {"name": name, "module": False, "found": found, "path": path,
                "denied": denied}
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    sys.path.insert(0, base)
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path.remove(base)
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if locations is None:
            spec = None
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]),
                                                        list(locations))
    return {"name": name, "module": True, "found": spec is not None}


def _denied_on_the_way(path: str) -> bool:
    """A directory above ``path`` exists but may not be searched by this user."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.isdir(parent):
        up = os.path.dirname(parent)
        if up == parent:
            return False
        parent = up
    return bool(parent) and not os.access(parent, os.X_OK)


def _section(errors: dict[str, str], name: str, fn: Callable[[], Any], default: Any) -> Any:
    """One reader failing must not cost the launcher all the other facts."""
    try:
        return fn()
    except Exception as exc:  # a probe bug or an exotic node: report, carry on
        errors[name] = f"{type(exc).__name__}: {exc}"
        return default


def collect_facts(params: Json, sys_: System | None = None) -> Json:
    """The ``facts`` mode: one JSON-ready dict describing this node."""
    sys_ = sys_ or System()
    errors: dict[str, str] = {}
    out = {"probe_version": PROBE_VERSION, "mode": "facts", "ok": True,
           "hostname": socket.gethostname(), "time": time.time()}
    out.update(_section(errors, "user", read_user, {}))
    out["python"] = {"version": "{}.{}.{}".format(*sys.version_info[:3]),
                     "executable": sys.executable, "implementation": sys.implementation.name}
    entry = params.get("entry")
    _section(errors, "site", lambda: load_site(bool(entry and entry.get("module"))), False)
    if params.get("python_check", True):
        out["packages"] = _section(errors, "packages", read_packages, {})
    ifaces = _section(errors, "interfaces", lambda: read_interfaces(sys_), [])
    addrs, method = _section(errors, "addresses",
                             lambda: read_addresses(sys_, [i["name"] for i in ifaces]), ({}, None))
    for iface in ifaces:
        iface["addrs"] = addrs.get(iface["name"], [])
    out["interfaces"], out["addr_method"] = ifaces, method
    proc_routes = _section(errors, "proc_route",
                           lambda: parse_proc_route(read_text(sys_.path("/proc/net/route"))), [])
    out["default_iface"] = _section(errors, "default_iface",
                                    lambda: default_iface(sys_, proc_routes), None)
    out["routes"] = _section(errors, "routes", lambda: read_routes(
        sys_, params.get("targets"), ifaces, proc_routes), {})
    out["site_env"] = _section(errors, "site_env", lambda: read_site_env(sys_), [])
    out["gpus"] = _section(errors, "gpus", lambda: read_gpus(sys_), {"count": 0})
    out["fabric"] = _section(errors, "fabric", lambda: read_fabric(sys_), None)
    base = ib_dir(sys_)
    out["rdma"] = {"dir": base, "devices": _section(errors, "rdma", lambda: read_rdma(base), [])}
    out["shm_bytes"] = _section(errors, "shm", lambda: read_shm(sys_), None)
    out["limits"] = _section(errors, "limits", read_limits, {})
    out["files"] = [f for f in EXTRA_FILES if os.path.exists(sys_.path(f))]
    try:
        out["netns"] = os.readlink(sys_.path("/proc/self/ns/net"))
    except OSError:
        out["netns"] = None
    if params.get("workdir"):
        out["workdir"] = _section(errors, "workdir", lambda: read_workdir(params["workdir"]), None)
    if params.get("entry"):
        out["entry"] = _section(errors, "entry", lambda: read_entry(
            params.get("workdir") or ".", params["entry"]), None)
    if params.get("container"):
        out["container"] = _section(errors, "container",
                                    lambda: read_container(params["container"]), None)
    # other users' dtrain runs on this node (docs/runs.md): the shared-nodes warning
    out["others"] = _section(errors, "others", lambda: scan(
        os.uname().nodename, launchers=False, skip_uid=os.getuid()), None)
    out["errors"] = errors
    return out


CONTAINER_RUNTIMES = ("podman", "docker", "enroot", "apptainer")  # decide/runplan/container.py's
def in_image(op: Json) -> Json:
    """``{"op": "in_image", "argv", "input", "timeout"}``: the probe run inside the image
    (the runtime's command decided by the launcher, decide/runplan/container.py), so the plan's
    facts are the container's: its facts JSON, or why it gave none."""
    argv = op.get("argv")
    steps = [c for c in (op.get("prepare") or []) if isinstance(c, list)]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not argv \
            or not all(isinstance(a, str) for c in steps for a in c):
        return {"ok": False, "error": "bad in_image op"}
    for step in steps:  # enroot: create the container from the image first
        try:
            subprocess.run(step, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=600, check=False)
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        done = subprocess.run(argv, input=str(op.get("input") or "").encode(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=float(op.get("timeout") or 120))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"ok": False, "error": f"{argv[0]}: {exc}"}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        if line.lstrip().startswith("{"):
            try:
                facts = json.loads(line)
            except ValueError:
                continue
            if isinstance(facts, dict):
                return {"ok": True, "facts": facts}
    err = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return {"ok": False, "error": "the probe inside the image gave no answer (exit %d): %s"
            % (done.returncode, " / ".join(err[-3:]) or "no output")}


def read_container(req: Json) -> Json:
    """``--image``: which runtime this node has (the one asked for, else the first found),
    its version, and whether the image is there with which id (docker/podman: the image id,
    which ``save``/``load`` keep; enroot/apptainer: the image file exists)."""
    import shutil  # --image only: the probe's usual start stays lean

    asked = req.get("runtime")
    order = [asked] if asked else list(req.get("runtimes") or CONTAINER_RUNTIMES)
    for name in order:
        path = shutil.which(str(name))
        if path:
            break
    else:
        return {"runtime": None, "error": "no container runtime (%s) on PATH" % ", ".join(
            str(n) for n in order)}

    def run(argv: list[str]) -> tuple[int, str]:
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return -1, str(exc)
        return done.returncode, (done.stdout or done.stderr).decode("utf-8", "replace")

    out: Json = {"runtime": name, "path": path, "image_present": False, "image_id": None}
    code, text = run([path, "version" if name == "enroot" else "--version"])
    m = re.search(r"(\d+\.\d+[\w.+~-]*)", text) if code == 0 else None
    out["version"] = m.group(1) if m else None
    image = str(req.get("image") or "")
    if name in ("podman", "docker"):
        out["rootless"] = name == "podman" and os.geteuid() != 0
        code, text = run([path, "image", "inspect", "--format", "{{.Id}}", image])
        ident = text.strip().splitlines()[0].strip() if code == 0 and text.strip() else ""
        if ident:
            out["image_present"] = True
            out["image_id"] = ident if ":" in ident else "sha256:" + ident
    else:
        out["image_present"] = os.path.isfile(os.path.expanduser(image))
    return out


# --------------------------------------------------------------------------- sockets


def _emit(obj: Json, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def bind_listen(params: Json) -> tuple[socket.socket | None, Json]:
    """Bind+listen on ``addr:port`` (port 0: any free one); (the socket, the answer)."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            params.get("addr") or "0.0.0.0", int(params.get("port") or 0),
            0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
        srv = socket.socket(family, kind, proto)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(sockaddr)
        srv.listen(64)
    except (OSError, ValueError) as exc:
        return None, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return srv, {"ok": True, "port": srv.getsockname()[1]}


def listen(params: Json, stdin_fd: int = 0, stream: TextIO | None = None) -> int:
    """Bind+listen, report the port, accept and close until stdin EOF."""
    import select

    srv, answer = bind_listen(params)
    _emit(answer, stream)
    if srv is None:
        return 0
    try:
        while True:
            ready, _, _ = select.select([srv.fileno(), stdin_fd], [], [])
            if srv.fileno() in ready:
                try:
                    srv.accept()[0].close()
                except OSError:
                    pass
            if stdin_fd in ready and not os.read(stdin_fd, 4096):
                return 0
    finally:
        srv.close()


def connect(params: Json, stream: TextIO | None = None) -> int:
    """One TCP connect; how long it took or why it failed."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((params["addr"], int(params["port"])),
                                        timeout=float(params.get("timeout") or 2.0))
        sock.close()
        result: Json = {"ok": True}
    except (OSError, ValueError) as exc:
        detail = getattr(exc, "strerror", None) or exc
        reason = ("timed out" if isinstance(exc, socket.timeout)
                  else f"{type(exc).__name__}: {detail}")
        result = {"ok": False, "error": reason}
    result["ms"] = round((time.monotonic() - start) * 1000.0, 3)
    _emit(result, stream)
    return 0


def routes_to(targets: Iterable[Any] | None, sys_: System | None = None) -> Json:
    """The route from this node to each target (what ``facts`` reports as ``routes``)."""
    sys_ = sys_ or System()
    ifaces = read_interfaces(sys_)
    addrs, _ = read_addresses(sys_, [i["name"] for i in ifaces])
    for iface in ifaces:
        iface["addrs"] = addrs.get(iface["name"], [])
    proc_routes = parse_proc_route(read_text(sys_.path("/proc/net/route")))
    return read_routes(sys_, targets, ifaces, proc_routes)


def become(op: Json, rest: bytes, stream: TextIO | None = None) -> Json:
    """The ``become`` op: this process turns into the job's supervisor interpreter, an exec
    of ``python -u -I -S -c BOOTSTRAP`` (the op's) in the working directory, with the
    environment this probe started with (the shell's, after --setup) and PWD/OLDPWD as the
    shell's ``cd`` sets them: what a supervisor started by that shell line gets, without a
    new channel, shell and --setup (issue 26). Answers ``{"ok": true}`` just before the
    exec (the launcher then sends the supervisor's payload); an error answer and the probe
    stays otherwise. Never returns when it worked."""
    boot = op.get("bootstrap")
    if not isinstance(boot, str) or not sys.executable or rest:
        return {"ok": False, "error": "become: no bootstrap, no sys.executable, or input "
                                      "after the op"}
    env = dict(START_ENV)
    workdir = op.get("workdir")
    if workdir:
        old = env.get("PWD") or os.getcwd()
        path = os.path.expanduser(str(workdir))
        logical = os.path.normpath(os.path.join(old, path))
        try:
            os.chdir(path)
        except OSError as exc:
            return {"ok": False, "error": f"become: cd {workdir}: {exc}"}
        env["OLDPWD"], env["PWD"] = old, logical
    argv = [sys.executable, "-u", "-I", "-S", "-c", boot]
    _emit({"ok": True}, stream)
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:  # the answer is out: fail as a supervisor that did not start
        sys.stderr.write(f"dtrain: cannot start the supervisor ({sys.executable}): {exc}\n")
        os._exit(127)
    return {}  # not reached


def stay(stdin_fd: int = 0, stream: TextIO | None = None, sys_: System | None = None) -> int:
    """After the facts: one JSON op a line until EOF (routes, listen, connect; see the
    module's docstring). A bound listen socket accepts (and closes) while we wait."""
    import select

    srv: socket.socket | None = None
    buf = b""
    try:
        while True:
            fds = [stdin_fd] + ([srv.fileno()] if srv is not None else [])
            ready = select.select(fds, [], [])[0]
            if srv is not None and srv.fileno() in ready:
                try:
                    srv.accept()[0].close()
                except OSError:
                    pass
            if stdin_fd not in ready:
                continue
            data = os.read(stdin_fd, 65536)
            if not data:
                return 0
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    op = json.loads(line)
                    kind = op.get("op")
                except (ValueError, AttributeError) as exc:
                    _emit({"ok": False, "error": f"bad op: {exc}"}, stream)
                    continue
                if kind == "routes":
                    _emit({"ok": True, "routes": routes_to(op.get("targets"), sys_)}, stream)
                elif kind == "listen" and srv is None:
                    srv, answer = bind_listen(op)
                    _emit(answer, stream)
                elif kind == "connect":
                    connect(op, stream)
                elif kind == "become":
                    if srv is not None:
                        srv.close()
                        srv = None
                    _emit(become(op, buf, stream), stream)
                elif kind == "in_image":
                    _emit(in_image(op), stream)
                elif kind == "unlisten":  # the port is free once this is answered
                    if srv is not None:
                        srv.close()
                        srv = None
                    _emit({"ok": True}, stream)
                else:
                    _emit({"ok": False, "error": f"unexpected op {kind!r}"}, stream)
    finally:
        if srv is not None:
            srv.close()




def main() -> int:
    """Read one JSON line of parameters, run the mode, write one JSON object."""
    spec = globals().get("DTRAIN_SPEC")  # the bootstrap may hand the params over directly
    line = spec.decode() if isinstance(spec, bytes) else sys.stdin.readline()
    try:
        params = json.loads(line) if line.strip() else {}
        if not isinstance(params, dict):
            raise ValueError("parameters must be a JSON object")
    except ValueError as exc:
        _emit({"ok": False, "error": f"bad parameters: {exc}"})
        return 2
    mode = params.get("mode", "facts")
    if globals().get("DTRAIN_SOURCE") is not None:  # shipped (not imported by a test)
        set_title(f"dtrain probe {mode} {os.uname().nodename}", "dtrain-probe")
    if mode == "facts":
        _emit(collect_facts(params))
        return stay() if params.get("stay") else 0
    if mode == "runs":  # `dtrain ps --everyone -w HOSTS`: every user's runs on this node
        _emit({"ok": True, "mode": "runs", "hostname": socket.gethostname(),
               **scan(os.uname().nodename, launchers=False)})
        return 0
    if mode == "listen":
        return listen(params)
    if mode == "connect":
        return connect(params)
    _emit({"ok": False, "error": f"unknown mode {mode!r}"})
    return 2


if __name__ == "__main__":
    sys.exit(main())
