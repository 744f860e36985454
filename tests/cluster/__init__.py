"""A real-sshd test cluster: one network namespace + one Debian sshd per node.

Why: dtrain's hard cases (kill semantics, AcceptEnv, host keys, Debian's 127.0.1.1,
interface names, link loss) only show up against real OpenSSH on real Linux networking;
an in-process fake server behaves differently. Namespaces make N "machines" on one box.

Layout (see docs/test-cluster.md):

* root namespace = login node, bridge ``dtbr0`` 198.18.0.1/24; ``blackhole 198.18.0.0/15``
  so nothing meant for a test node ever leaves the machine;
* node k: netns ``dtn<k>``, veth ``dtv<k>`` (root side) <-> ``ens1f0``/``eth0``/``enp3s0``
  (node side, cycling) with 198.18.0.(10+k), a carrier-less ``docker0`` 172.17.0.1/16;
* sshd for node k runs in its own mount+UTS namespace: hostname ``node<k>``, its own
  /etc/hosts (``127.0.1.1 node<k>``, Debian's trap), its own /home/dtuser, its own host key;
  it listens on port 22 and 2222 (the ``alt<k>`` ssh-config aliases use 2222).

Everything the cluster needs lives in the state dir (default /var/lib/dtrain-cluster).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import gpus, podman

__all__ = [
    "ALT_PORT",
    "BRIDGE",
    "DEFAULT_STATE_DIR",
    "LOGIN_IP",
    "SSH_PORT",
    "USER",
    "Cluster",
    "ClusterError",
    "ClusterUnavailable",
    "Node",
    "down",
    "healthy",
    "link_down",
    "link_up",
    "load",
    "node_command",
    "node_exec",
    "node_pids",
    "set_authorized_keys",
    "sshd_pid",
    "unavailable_reason",
    "up",
]

DEFAULT_STATE_DIR = Path("/var/lib/dtrain-cluster")
LOCK_FILE = Path("/run/lock/dtrain-cluster.lock")  # namespaces and IPs are global: one lock
SUBNET = "198.18.0"
LOGIN_IP = f"{SUBNET}.1"
BLACKHOLE = "198.18.0.0/15"
BRIDGE = "dtbr0"
IFNAMES = ("ens1f0", "eth0", "enp3s0")
DOCKER_BRIDGE = "docker0"
DOCKER_CIDR = "172.17.0.1/16"
USER = "dtuser"
SSH_PORT = 22
ALT_PORT = 2222
MAX_NODES = 244  # 198.18.0.(10+k) must stay <= .254
SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parents[2]
_TOOLS = ("ip", "unshare", "nsenter", "setpriv", "setsid", "ssh-keygen", "useradd", "chpasswd",
          "mount")


class ClusterError(RuntimeError):
    """The cluster could not be built or driven."""


class ClusterUnavailable(ClusterError):
    """This machine cannot host the cluster (not root, no netns, no sshd): tests skip."""


# ---------------------------------------------------------------- model


@dataclass(frozen=True)
class Node:
    """One simulated machine. ``home`` is the host path bind-mounted at /home/dtuser."""

    index: int
    name: str
    ip: str
    ifname: str
    ns: str
    veth: str
    alias: str  # ssh-config alias of the same node on ALT_PORT
    dir: Path
    home: Path


@dataclass(frozen=True)
class Cluster:
    """A built cluster. Run dtrain with ``env=cluster.client_env()``: asyncssh reads ~/.ssh."""

    state_dir: Path
    nodes: tuple[Node, ...]
    user: str
    password: str
    client_home: Path
    known_hosts: Path
    identity: Path
    ssh_config: Path
    python: str  # this process's interpreter (with torch); dtuser can run it on every node
    repo: Path  # this checkout, readable by dtuser on every node (shared filesystem)
    shared_dir: Path  # mode 1777, same path on every node: for files the nodes must read

    def node(self, k: int) -> Node:
        """Node k (1-based, as in its name)."""
        return self.nodes[k - 1]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def client_env(self, **extra: str) -> dict[str, str]:
        """os.environ minus NCCL_/GLOO_/DTRAIN_ vars, HOME at the client home, plus extra."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("NCCL_", "GLOO_", "DTRAIN_"))}
        env["HOME"] = str(self.client_home)
        env.update(extra)
        return env

    def ssh_options(self) -> dict[str, object]:
        """Keyword arguments for asyncssh.connect() that work without touching HOME."""
        return {"username": self.user, "client_keys": [str(self.identity)],
                "known_hosts": str(self.known_hosts), "config": [str(self.ssh_config)],
                "agent_path": None}

    def node_exec(self, k: int, argv: Sequence[str], user: str | None = None, *,
                  input: str | None = None, env: Mapping[str, str] | None = None,
                  timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        return node_exec(k, argv, user or self.user, input=input, env=env, timeout=timeout,
                         check=check, state_dir=self.state_dir)

    def node_pids(self, k: int, *, user: str | None = None, match: str | None = None) -> list[int]:
        return node_pids(k, user=user, match=match, state_dir=self.state_dir)

    def link_down(self, k: int) -> None:
        link_down(k)

    def link_up(self, k: int) -> None:
        link_up(k)


def _node(state_dir: Path, k: int) -> Node:
    d = state_dir / f"node{k}"
    return Node(index=k, name=f"node{k}", ip=f"{SUBNET}.{10 + k}",
                ifname=IFNAMES[(k - 1) % len(IFNAMES)], ns=f"dtn{k}", veth=f"dtv{k}",
                alias=f"alt{k}", dir=d, home=d / "home")


class _Paths:
    """File names inside the state dir, in one place."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir
        self.meta = state_dir / "cluster.json"
        self.password = state_dir / "password"
        self.client_home = state_dir / "client" / "home"
        self.ssh_dir = self.client_home / ".ssh"
        self.identity = self.ssh_dir / "id_ed25519"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.ssh_config = self.ssh_dir / "config"
        self.shared = state_dir / "shared"


# ---------------------------------------------------------------- small helpers


def _run(argv: Sequence[str], *, input: str | None = None, check: bool = True,
         timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _write(path: Path, text: str, mode: int = 0o644, *, in_place: bool = False) -> None:
    """Write with the final mode from the start (keys!). in_place keeps the inode (bind mounts)."""
    if in_place and path.exists():
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        return
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _ns_inode(k: int) -> int | None:
    try:
        return os.stat(f"/run/netns/dtn{k}").st_ino
    except OSError:
        return None


def _proc_ns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time, comm) of a live process; None once it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19]), comm


def _is_zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _alive(pid: int) -> bool:
    return not _is_zombie(pid)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _pids_in_ns(ns_ino: int) -> list[int]:
    """Live (non-zombie) pids whose network namespace is ns_ino."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pid = int(entry)
            if _proc_ns_inode(pid) == ns_ino and not _is_zombie(pid):
                pids.append(pid)
    return sorted(pids)


def _link_up(ifname: str) -> bool:
    try:
        return bool(int(Path(f"/sys/class/net/{ifname}/flags").read_text(), 16) & 0x1)
    except (OSError, ValueError):
        return False


def _banner(ip: str, port: int = SSH_PORT, timeout: float = 1.0) -> bool:
    """True when an sshd answers with its SSH- banner (a bare connect proves less)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _wait_banner(ip: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _banner(ip, timeout=0.5):
            return True
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialize up/down across processes: several test sessions may start at once."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------- public helpers


def unavailable_reason() -> str | None:
    """Why this machine cannot host the cluster, or None when it can."""
    if os.geteuid() != 0:
        return "the test cluster needs root (network namespaces, sshd)"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"the test cluster needs {', '.join(missing)}"
    if not os.access(SSHD, os.X_OK):
        return f"the test cluster needs OpenSSH server ({SSHD})"
    if _run(["ip", "netns", "list"], check=False).returncode != 0:
        return "`ip netns` does not work here"
    return None


def sshd_pid(k: int, state_dir: Path = DEFAULT_STATE_DIR) -> int | None:
    """The pid of node k's sshd listener, when it is alive inside dtn<k>."""
    try:
        pid = int((Path(state_dir) / f"node{k}" / "sshd.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    ns = _ns_inode(k)
    if ns is None or not _alive(pid) or _proc_ns_inode(pid) != ns or _comm(pid) != "sshd":
        return None
    return pid


def node_pids(k: int, *, user: str | None = None, match: str | None = None,
              state_dir: Path = DEFAULT_STATE_DIR) -> list[int]:
    """Live pids in node k's network namespace, except its sshd listener.

    ``user`` keeps processes owned by that user; ``match`` keeps those whose command
    line contains the substring (e.g. "python"). Zombies are left out.
    """
    ns = _ns_inode(k)
    if ns is None:
        return []
    listener = sshd_pid(k, state_dir)
    uid = pwd.getpwnam(user).pw_uid if user else None
    out = []
    for pid in _pids_in_ns(ns):
        if pid == listener:
            continue
        if uid is not None:
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:
                    continue
            except OSError:
                continue
        if match is not None and match not in _cmdline(pid):
            continue
        out.append(pid)
    return out


def node_command(k: int, argv: Sequence[str], user: str = USER, *,
                 env: Mapping[str, str] | None = None,
                 state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """The host argv that runs argv on node k as ``user`` (for Popen / exec).

    Enters the sshd listener's mount, UTS and net namespaces (so: the node's home,
    hostname and /etc/hosts) and starts in the user's home with a clean login-like
    environment (setpriv --reset-env) plus ``env``.
    """
    pid = sshd_pid(k, state_dir)
    if pid is None:
        raise ClusterError(f"node{k} is not running (python -m tests.cluster up)")
    pw = pwd.getpwnam(user)
    extra = [f"{key}={val}" for key, val in (env or {}).items()]
    # cwd must be set *inside*: nsenter --wd=PATH opens PATH before entering the mount ns
    return ["nsenter", "-t", str(pid), "-m", "-u", "-n", "--",
            "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
            "--reset-env", "--", "env", "-C", pw.pw_dir, *extra, *argv]


def node_exec(k: int, argv: Sequence[str], user: str = USER, *, input: str | None = None,
              env: Mapping[str, str] | None = None, timeout: float = 60, check: bool = False,
              state_dir: Path = DEFAULT_STATE_DIR) -> subprocess.CompletedProcess[str]:
    """Run argv on node k as ``user`` and capture its output (see node_command)."""
    cmd = node_command(k, argv, user, env=env, state_dir=state_dir)
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout,
                          check=False, cwd="/")
    if check and proc.returncode != 0:
        raise ClusterError(f"node{k}: {' '.join(argv)} exited {proc.returncode}: "
                           f"{proc.stderr.strip()}")
    return proc


def link_down(k: int) -> None:
    """Cut node k off the bridge (established TCP connections hang: no RST, no FIN)."""
    _run(["ip", "link", "set", f"dtv{k}", "down"])


def link_up(k: int) -> None:
    """Reconnect node k."""
    _run(["ip", "link", "set", f"dtv{k}", "up"])


def set_authorized_keys(cluster: Cluster, k: int, text: str | None = None) -> None:
    """Replace dtuser's authorized_keys on node k; None restores the default (client key)."""
    paths = _Paths(cluster.state_dir)
    _install_ssh_dir(cluster.node(k).home, text if text is not None else _client_pub(paths))


SFTP_SERVER = "/usr/lib/openssh/sftp-server"


@contextlib.contextmanager
def hostile_sftp(cluster: Cluster, k: int, rename: Mapping[str, str]) -> Iterator[None]:
    """Node k's SFTP server lists names as ``rename`` says until the block ends: a hostile
    node (the proxy in tests/cluster/hostile_sftp.py, bind-mounted over the node's
    sftp-server in its own mount namespace; sshd itself is untouched). Every SFTP session to
    node k goes through it meanwhile, other tests' too: rename only names no one else uses."""
    d = cluster.state_dir / "hostile-sftp"
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(d, 0o755)
    real = d / "sftp-server.real"
    if not real.exists():
        tmp = d / f".sftp-server.{os.getpid()}"
        shutil.copy2(SFTP_SERVER, tmp)  # the node's own path is shadowed while hostile
        os.replace(tmp, real)
    prog = d / "hostile_sftp.py"
    _write(prog, (Path(__file__).parent / "hostile_sftp.py").read_text())
    config = d / f"node{k}.json"
    _write(config, json.dumps({"server": str(real), "rename": dict(rename)}))
    launcher = d / f"node{k}.sh"
    _write(launcher, f'#!/bin/sh\nexec {cluster.python} {prog} {config} "$@"\n', 0o755)
    pid = sshd_pid(k, cluster.state_dir)
    if pid is None:
        raise ClusterError(f"node{k} is not running (python -m tests.cluster up)")
    _run(["nsenter", "-t", str(pid), "-m", "mount", "--bind", str(launcher), SFTP_SERVER])
    try:
        yield
    finally:
        _run(["nsenter", "-t", str(pid), "-m", "umount", SFTP_SERVER], check=False)


def healthy(cluster: Cluster) -> bool:
    """Every node's sshd answers on port 22 (checked in parallel, ~1 s timeout)."""
    if not cluster.nodes:
        return False
    with ThreadPoolExecutor(max_workers=min(32, len(cluster.nodes))) as pool:
        return all(pool.map(lambda n: _banner(n.ip), cluster.nodes))


def load(state_dir: Path = DEFAULT_STATE_DIR) -> Cluster | None:
    """The cluster recorded in state_dir (all its nodes), or None when there is none."""
    paths = _Paths(Path(state_dir))
    try:
        meta = json.loads(paths.meta.read_text())
        password = paths.password.read_text().strip()
    except (OSError, ValueError):
        return None
    return _cluster(Path(state_dir), int(meta["n_nodes"]), meta, password)


def _cluster(state_dir: Path, n: int, meta: Mapping[str, object], password: str) -> Cluster:
    paths = _Paths(state_dir)
    return Cluster(state_dir=state_dir, nodes=tuple(_node(state_dir, k) for k in range(1, n + 1)),
                   user=str(meta["user"]), password=password, client_home=paths.client_home,
                   known_hosts=paths.known_hosts, identity=paths.identity,
                   ssh_config=paths.ssh_config, python=sys.executable, repo=REPO,
                   shared_dir=paths.shared)


def _meta(cluster: Cluster) -> dict[str, object]:
    return {"n_nodes": len(cluster.nodes), "user": cluster.user}


# ---------------------------------------------------------------- up / down


def up(n_nodes: int = 4, state_dir: Path = DEFAULT_STATE_DIR, *,
       shrink: bool = False) -> Cluster:
    """Build or repair the cluster so nodes 1..n_nodes answer; returns those n nodes.

    Idempotent and cheap when healthy. Nodes beyond n_nodes recorded earlier (a 32-node
    benchmark) are kept and repaired too unless ``shrink``: another session may use them.
    """
    if not 1 <= n_nodes <= MAX_NODES:
        raise ClusterError(f"n_nodes must be in 1..{MAX_NODES}")
    reason = unavailable_reason()
    if reason:
        raise ClusterUnavailable(reason)
    state_dir = Path(state_dir)
    with _locked():
        # First of all: nothing addressed to a test node may leave this machine.
        _run(["ip", "route", "replace", "blackhole", BLACKHOLE])
        # The shared filesystem is whatever this process runs from (cheap: a few stats).
        _ensure_traversable([REPO, Path(sys.executable).parent, Path(sys.prefix),
                             Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent])
        paths = _Paths(state_dir)
        paths.shared.mkdir(parents=True, exist_ok=True)
        os.chmod(paths.shared, 0o1777)  # pytest's tmp_path is 0700 root: nodes can't read it
        existing = load(state_dir)
        recorded = len(existing.nodes) if existing else 0
        if shrink and recorded > n_nodes:
            for k in range(n_nodes + 1, recorded + 1):
                _teardown_node(state_dir, k)
            recorded = n_nodes
            existing = None  # rewrite known_hosts, ssh config, hosts files and cluster.json
        if existing and recorded >= n_nodes and _all_nodes_ok(existing):
            cluster = existing
        else:
            cluster = _build(state_dir, max(n_nodes, recorded))
        # the fake-GPU trap (tests/cluster/gpus.py): nvidia-smi on nodes 4, 6, 8, ...
        gpus.ensure((n.index, n.dir, sshd_pid(n.index, state_dir)) for n in cluster.nodes)
        # podman in every node's mount namespace (tests/cluster/podman.py), sshd untouched
        podman.ensure(state_dir, ((n.index, sshd_pid(n.index, state_dir)) for n in cluster.nodes),
                      authorized=_client_pub(paths))
    return _cluster(state_dir, n_nodes, _meta(cluster), cluster.password)


def down(state_dir: Path = DEFAULT_STATE_DIR, *, purge: bool = False) -> None:
    """Stop every node and remove namespaces and bridge; purge also deletes the state dir.

    Without purge, keys and password stay so the next ``up`` keeps the same identities.
    The blackhole route stays: it is harmless and keeps the range from leaking.
    """
    state_dir = Path(state_dir)
    with _locked():
        ks: set[int] = set()
        with contextlib.suppress(OSError):
            ks |= {int(n[3:]) for n in os.listdir("/run/netns")
                   if n.startswith("dtn") and n[3:].isdigit()}
        with contextlib.suppress(OSError):
            ks |= {int(n[4:]) for n in os.listdir(state_dir)
                   if n.startswith("node") and n[4:].isdigit()}
        if ks:
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(lambda k: _teardown_node(state_dir, k), sorted(ks)))
        _run(["ip", "link", "del", BRIDGE], check=False)
        _Paths(state_dir).meta.unlink(missing_ok=True)
        if purge:
            shutil.rmtree(state_dir, ignore_errors=True)


def _all_nodes_ok(cluster: Cluster) -> bool:
    def ok(node: Node) -> bool:  # cheap local checks first: a cut link costs a timeout
        return (sshd_pid(node.index, cluster.state_dir) is not None and _link_up(node.veth)
                and _banner(node.ip))
    with ThreadPoolExecutor(max_workers=min(32, len(cluster.nodes))) as pool:
        return all(pool.map(ok, cluster.nodes))


def _build(state_dir: Path, n: int) -> Cluster:
    paths = _Paths(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o711)
    password = _ensure_user(paths)
    _ensure_client(paths)
    _ensure_bridge()
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privsep chroot
    with ThreadPoolExecutor(max_workers=min(16, n)) as pool:
        list(pool.map(lambda k: _ensure_node(state_dir, k), range(1, n + 1)))
    cluster = _cluster(state_dir, n, {"user": USER}, password)
    _write_client_files(cluster)
    for node in cluster.nodes:  # peers resolve like DNS; rewritten in place (bind-mounted)
        _write(node.dir / "hosts", _hosts_text(node, cluster.nodes), in_place=True)
    _write(paths.meta, json.dumps(_meta(cluster), indent=2) + "\n")
    return cluster


def _ensure_user(paths: _Paths) -> str:
    """dtuser exists with bash and the password recorded (0600) in the state dir."""
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        _run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", USER])
        pw = pwd.getpwnam(USER)
    if pw.pw_shell != "/bin/bash":
        _run(["usermod", "--shell", "/bin/bash", USER])
    Path(pw.pw_dir).mkdir(exist_ok=True)  # the per-node homes are mounted over it
    if paths.password.exists():
        password = paths.password.read_text().strip()
    else:
        password = secrets.token_urlsafe(18)
        _write(paths.password, password + "\n", 0o600)
    os.chmod(paths.password, 0o600)
    _run(["chpasswd"], input=f"{USER}:{password}\n")
    return password


def _ensure_traversable(paths: Sequence[Path]) -> None:
    """Shared filesystem: dtuser must reach the repo and the interpreter (/root is 0700).

    Adds o+x to every ancestor and o+rx to the target directories; never removes bits.
    """
    for target in paths:
        target = target.resolve()
        for d in [*reversed(target.parents), target]:
            mode = d.stat().st_mode
            want = stat.S_IXOTH | (stat.S_IROTH if d == target else 0)
            if mode & want != want:
                os.chmod(d, stat.S_IMODE(mode) | want)


def _ensure_client(paths: _Paths) -> None:
    paths.ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.client_home, 0o700)
    os.chmod(paths.ssh_dir, 0o700)
    if not paths.identity.exists() or not paths.identity.with_suffix(".pub").exists():
        paths.identity.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtrain-test-client",
              "-f", str(paths.identity)])
    os.chmod(paths.identity, 0o600)


def _client_pub(paths: _Paths) -> str:
    return paths.identity.with_suffix(".pub").read_text()


def _ensure_bridge() -> None:
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    _run(["ip", "addr", "replace", f"{LOGIN_IP}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])


def _write_client_files(cluster: Cluster) -> None:
    lines = []
    for node in cluster.nodes:
        key = " ".join((node.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])
        lines += [f"{node.ip} {key}", f"[{node.ip}]:{ALT_PORT} {key}"]
    _write(cluster.known_hosts, "\n".join(lines) + "\n", 0o644)
    blocks = ["# generated by tests/cluster: node<k> = port 22, alt<k> = same node, port 2222\n"]
    for node in cluster.nodes:
        blocks.append(f"Host {node.name}\n    HostName {node.ip}\n    User {cluster.user}\n")
        blocks.append(f"Host {node.alias}\n    HostName {node.ip}\n    Port {ALT_PORT}\n"
                      f"    User {cluster.user}\n")
    blocks.append(f"Host *\n    IdentityFile {cluster.identity}\n"
                  f"    UserKnownHostsFile {cluster.known_hosts}\n"
                  "    StrictHostKeyChecking yes\n")
    _write(cluster.ssh_config, "\n".join(blocks), 0o600)


def _hosts_text(node: Node, nodes: Sequence[Node]) -> str:
    peers = "".join(f"{p.ip}\t{p.name}\n" for p in nodes if p.index != node.index)
    return ("127.0.0.1\tlocalhost\n"
            f"127.0.1.1\t{node.name}\n"  # Debian's default: own name -> loopback (the trap)
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
            "# peers, as DNS would answer them\n" + peers)


def _sshd_config(node: Node) -> str:
    return f"""# generated by tests/cluster for {node.name}; no AcceptEnv on purpose
ListenAddress {node.ip}:{SSH_PORT}
ListenAddress {node.ip}:{ALT_PORT}
HostKey {node.dir}/ssh_host_ed25519_key
PidFile {node.dir}/sshd.pid
PubkeyAuthentication yes
PasswordAuthentication yes
KbdInteractiveAuthentication yes
UsePAM yes
PermitRootLogin prohibit-password
AuthorizedKeysFile .ssh/authorized_keys
MaxStartups 100:30:200
UseDNS no
PrintMotd no
LogLevel VERBOSE
Subsystem sftp /usr/lib/openssh/sftp-server
"""


def _install_ssh_dir(home: Path, authorized: str) -> None:
    """~/.ssh 0700 and authorized_keys 0600, owned by dtuser (sshd StrictModes)."""
    pw = pwd.getpwnam(USER)
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    os.chown(ssh, pw.pw_uid, pw.pw_gid)
    os.chmod(ssh, 0o700)
    _write(ssh / "authorized_keys", authorized, 0o600)
    os.chown(ssh / "authorized_keys", pw.pw_uid, pw.pw_gid)


def _teardown_node(state_dir: Path, k: int) -> None:
    """Kill everything in dtn<k> (and a stray recorded sshd), delete veth and netns."""
    victims: set[int] = set()
    ns = _ns_inode(k)
    if ns is not None:
        victims |= set(_pids_in_ns(ns))
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((state_dir / f"node{k}" / "sshd.pid").read_text().split()[0])
        if _alive(pid) and f"{state_dir}/node{k}/sshd_config" in _cmdline(pid):
            victims.add(pid)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in victims) and time.monotonic() < deadline:
        time.sleep(0.01)
    # deleting the root end destroys the pair now; netns deletion would do it asynchronously
    _run(["ip", "link", "del", f"dtv{k}"], check=False)
    _run(["ip", "netns", "del", f"dtn{k}"], check=False)
    (state_dir / f"node{k}" / "sshd.pid").unlink(missing_ok=True)


def _ensure_node(state_dir: Path, k: int) -> None:
    """Reuse node k when its sshd answers, else rebuild it from scratch."""
    node = _node(state_dir, k)
    if sshd_pid(k, state_dir) is not None and Path(f"/sys/class/net/{node.veth}").exists():
        _run(["ip", "link", "set", node.veth, "master", BRIDGE, "up"])  # a test may have cut it
        if _wait_banner(node.ip, 2.0):
            return
    _teardown_node(state_dir, k)
    _create_node(state_dir, node)


def _create_node(state_dir: Path, node: Node) -> None:
    paths = _Paths(state_dir)
    pw = pwd.getpwnam(USER)
    node.dir.mkdir(mode=0o711, exist_ok=True)
    hostkey = node.dir / "ssh_host_ed25519_key"
    if not hostkey.exists() or not hostkey.with_suffix(".pub").exists():
        hostkey.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(hostkey)])
    if not node.home.exists():
        shutil.copytree("/etc/skel", node.home, symlinks=True)
        _install_ssh_dir(node.home, _client_pub(paths))
    _run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(node.home)])
    os.chmod(node.home, 0o755)
    _write(node.dir / "hostname", node.name + "\n", in_place=True)
    if not (node.dir / "hosts").exists():
        _write(node.dir / "hosts", _hosts_text(node, [node]))
    _write(node.dir / "sshd_config", _sshd_config(node))

    _run(["ip", "-batch", "-"], input=(
        f"netns add {node.ns}\n"
        f"link add {node.veth} address {_mac(1, node.index)} type veth"
        f" peer name {node.ifname} address {_mac(0, node.index)} netns {node.ns}\n"
        f"link set {node.veth} master {BRIDGE} up\n"))
    _run(["ip", "-n", node.ns, "-batch", "-"], input=(
        "link set lo up\n"
        f"addr add {node.ip}/24 dev {node.ifname}\n"
        f"link set {node.ifname} up\n"
        f"link add {DOCKER_BRIDGE} type bridge\n"
        f"addr add {DOCKER_CIDR} dev {DOCKER_BRIDGE}\n"
        f"link set {DOCKER_BRIDGE} up\n"))

    # setsid -f: sshd is detached (own session, child of init) and outlives this process,
    # which keeps no Popen to it. ip netns exec, unshare and sh all exec in place, so $$ is
    # sshd's pid; sshd also writes its PidFile before it serves a banner.
    launch = node.dir / "launch.pid"
    launch.unlink(missing_ok=True)
    script = (f"echo $$ > {launch} && hostname {node.name}"
              f" && mount --bind {node.dir}/hosts /etc/hosts"
              f" && mount --bind {node.dir}/hostname /etc/hostname"
              f" && mount --bind {node.home} {pw.pw_dir}"
              f" && exec {SSHD} -D -f {node.dir}/sshd_config -E {node.dir}/sshd.log")
    (node.dir / "sshd.pid").unlink(missing_ok=True)
    errfile = node.dir / "start.err"
    with open(errfile, "w") as err:
        subprocess.run(["setsid", "-f", "ip", "netns", "exec", node.ns, "unshare", "--mount",
                        "--uts", "--propagation", "private", "sh", "-c", script],
                       stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd="/", check=True)
    deadline = time.monotonic() + 10
    while not _banner(node.ip, timeout=0.5):
        try:
            died = not _alive(int(launch.read_text()))  # config errors go to sshd.log
        except (OSError, ValueError):
            died = False  # not written yet
        if died or time.monotonic() > deadline:
            why = errfile.read_text() + _tail(node.dir / "sshd.log")
            raise ClusterError(f"{node.name}: sshd did not start: {why.strip()}")
        time.sleep(0.01)
    if sshd_pid(node.index, state_dir) is None:
        raise ClusterError(f"{node.name}: sshd answers but {node.dir}/sshd.pid is not its pid")


def _mac(side: int, k: int) -> str:
    """Fixed MACs per node: a rebuilt node keeps its MAC, so stale ARP caches stay right."""
    return f"02:d7:00:{side:02x}:{k >> 8:02x}:{k & 0xFF:02x}"


def _tail(path: Path, n: int = 5) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-n:])
    except OSError:
        return ""
