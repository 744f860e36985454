"""The test cluster is what it claims: real sshd per node, per-node names, homes and traps."""

from __future__ import annotations

import os
import shlex
import socket
import stat
import subprocess
import time
import uuid

import asyncssh
import pytest

from tests import cluster as tc
from tests.util import need_module

pytestmark = pytest.mark.ssh


async def _run(cluster: tc.Cluster, host: str, command: str, *, via_config: bool = False,
               **kw: object) -> asyncssh.SSHCompletedProcess:
    """One command over a fresh key-only connection (no agent, no ~ of the test process).

    via_config: user and port come from the cluster's ssh config, as for a dtrain hostfile.
    """
    opts: dict[str, object] = {"client_keys": [str(cluster.identity)],
                               "known_hosts": str(cluster.known_hosts), "agent_path": None,
                               "connect_timeout": 30}  # a loaded CI machine
    if via_config:
        opts["config"] = [str(cluster.ssh_config)]
    else:
        opts.update(config=None, username=cluster.user)
    opts.update(kw)
    async with asyncssh.connect(host, **opts) as conn:  # type: ignore[arg-type]
        return await conn.run(command, check=False, timeout=30)


async def test_key_login_and_hostname(cluster: tc.Cluster) -> None:
    for node in cluster.nodes:
        result = await _run(cluster, node.ip, "hostname; id -un; pwd")
        assert result.exit_status == 0, result.stderr
        assert result.stdout.split() == [node.name, cluster.user, "/home/dtuser"]


async def test_ssh_config_aliases(cluster: tc.Cluster) -> None:
    """node<k> -> port 22 and alt<k> -> port 2222 of the same node, via the client config."""
    for host, port in (("node2", 22), ("alt2", tc.ALT_PORT)):
        result = await _run(cluster, host, "hostname; echo $SSH_CONNECTION", via_config=True)
        name, connection = result.stdout.splitlines()
        assert name == "node2"
        assert connection.split()[2:] == [cluster.node(2).ip, str(port)]


def test_client_home_is_what_asyncssh_reads(cluster: tc.Cluster) -> None:
    """dtrain runs with HOME=client_home: asyncssh must find config, key and known_hosts."""
    code = ("import asyncio, asyncssh\n"
            "async def main():\n"
            "    async with asyncssh.connect('node3', connect_timeout=10) as c:\n"
            "        print((await c.run('hostname', check=True)).stdout.strip())\n"
            "asyncio.run(main())\n")
    proc = subprocess.run([cluster.python, "-c", code], env=cluster.client_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "node3"


async def test_own_hostname_resolves_to_loopback(cluster: tc.Cluster) -> None:
    """Debian's trap: a node's own name is 127.0.1.1; peers resolve to their real address."""
    for node in cluster.nodes:
        peer = cluster.nodes[node.index % len(cluster.nodes)]
        result = await _run(cluster, node.ip, f"getent hosts {node.name}; getent hosts {peer.name}")
        own, other = (line.split()[0] for line in result.stdout.splitlines())
        assert own == "127.0.1.1"
        assert other == peer.ip


async def test_interface_names_differ_per_node(cluster: tc.Cluster) -> None:
    seen = set()
    for node in cluster.nodes:
        result = await _run(cluster, node.ip, "ip -o -4 addr show")
        addrs = {(f[1], f[3]) for f in map(str.split, result.stdout.splitlines())}
        assert (node.ifname, f"{node.ip}/24") in addrs
        seen.add(node.ifname)
    assert seen == {"ens1f0", "eth0", "enp3s0"}


async def test_docker0_trap_on_every_node(cluster: tc.Cluster) -> None:
    for node in cluster.nodes:
        result = await _run(cluster, node.ip, "ip -o -4 addr show dev docker0")
        assert result.exit_status == 0, result.stderr
        assert "inet 172.17.0.1/16" in result.stdout


async def test_password_login(cluster: tc.Cluster) -> None:
    result = await _run(cluster, cluster.node(1).ip, "hostname", client_keys=None,
                        password=cluster.password)
    assert result.stdout.strip() == "node1"
    with pytest.raises(asyncssh.PermissionDenied):
        await _run(cluster, cluster.node(1).ip, "true", client_keys=None,
                   password=cluster.password + "x")


async def test_env_is_not_accepted(cluster: tc.Cluster) -> None:
    """No AcceptEnv: env sent over the protocol is dropped, as on stock Debian for custom names."""
    result = await _run(cluster, cluster.node(1).ip, "echo \"[$DTRAIN_PROBE]\"",
                        env={"DTRAIN_PROBE": "leaked"})
    assert result.stdout.strip() == "[]"


async def test_homes_are_per_node(cluster: tc.Cluster) -> None:
    name = f"probe-{uuid.uuid4().hex}"
    first, second = cluster.node(1), cluster.node(2)
    try:
        await _run(cluster, first.ip, f"echo here > {name}")
        assert (first.home / name).read_text() == "here\n"
        result = await _run(cluster, second.ip, f"test -e {name}; echo $?")
        assert result.stdout.strip() == "1"
        assert not (second.home / name).exists()
    finally:
        (first.home / name).unlink(missing_ok=True)


async def test_set_authorized_keys_revokes_and_restores(cluster: tc.Cluster) -> None:
    node = cluster.nodes[-1]
    tc.set_authorized_keys(cluster, node.index, "")
    try:
        with pytest.raises(asyncssh.PermissionDenied):
            await _run(cluster, node.ip, "true")
        result = await _run(cluster, node.ip, "hostname", client_keys=None,
                            password=cluster.password)
        assert result.stdout.strip() == node.name
    finally:
        tc.set_authorized_keys(cluster, node.index)
    assert (await _run(cluster, node.ip, "hostname")).stdout.strip() == node.name


def test_shared_dir_is_readable_on_nodes(cluster: tc.Cluster) -> None:
    probe = cluster.shared_dir / f"probe-{uuid.uuid4().hex}"
    probe.write_text("shared\n")
    try:
        proc = cluster.node_exec(2, ["cat", str(probe)], check=True)
        assert proc.stdout == "shared\n"
    finally:
        probe.unlink()


def test_home_and_key_modes(cluster: tc.Cluster) -> None:
    for node in cluster.nodes:
        ssh = node.home / ".ssh"
        assert stat.S_IMODE(ssh.stat().st_mode) == 0o700
        assert stat.S_IMODE((ssh / "authorized_keys").stat().st_mode) == 0o600
        assert ssh.stat().st_uid == (ssh / "authorized_keys").stat().st_uid != 0
    assert stat.S_IMODE((cluster.state_dir / "password").stat().st_mode) == 0o600
    assert stat.S_IMODE(cluster.identity.stat().st_mode) == 0o600


@pytest.mark.torch
def test_dtuser_runs_project_python_with_torch(cluster: tc.Cluster) -> None:
    """Shared filesystem: the interpreter and the repo are reachable by dtuser on a node."""
    need_module("torch")
    code = "import torch, launcher; print(torch.__version__)"
    cmd = (f"cd {shlex.quote(str(cluster.repo))} && "
           f"{shlex.quote(cluster.python)} -c {shlex.quote(code)}")
    proc = subprocess.run(["ip", "netns", "exec", cluster.node(1).ns, "su", cluster.user,
                           "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_node_exec_sees_the_node(cluster: tc.Cluster) -> None:
    proc = cluster.node_exec(3, ["sh", "-c", "hostname; id -un; pwd; getent hosts node3"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[:3] == ["node3", cluster.user, "/home/dtuser"]
    assert lines[3] == "127.0.1.1"


def test_node_pids_finds_processes_in_the_node(cluster: tc.Cluster) -> None:
    marker = f"{uuid.uuid4().int % 10_000 + 50_000}.5"  # unique sleep argument
    proc = subprocess.Popen(tc.node_command(2, ["sleep", marker], state_dir=cluster.state_dir),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # nsenter -> setpriv -> env -> sleep exec in place: wait until it runs as dtuser
        deadline = time.monotonic() + 5
        while (not (pids := cluster.node_pids(2, user=cluster.user, match=marker))
               and time.monotonic() < deadline):
            time.sleep(0.02)
        assert pids == [proc.pid], "sleep did not show up in dtn2"
        assert cluster.node_pids(2, match=marker) == pids
        assert cluster.node_pids(1, match=marker) == []
        assert tc.sshd_pid(2, cluster.state_dir) not in cluster.node_pids(2)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while cluster.node_pids(2, match=marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cluster.node_pids(2, match=marker) == []


def test_link_down_and_up(cluster: tc.Cluster) -> None:
    node = cluster.nodes[-1]
    cluster.link_down(node.index)
    try:
        with pytest.raises(OSError):
            socket.create_connection((node.ip, 22), timeout=0.5).close()
    finally:
        cluster.link_up(node.index)
    deadline = time.monotonic() + 10
    while not tc.healthy(cluster) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tc.healthy(cluster)


def test_login_node_untouched_and_range_blackholed(cluster: tc.Cluster) -> None:
    """Node mounts/hostnames stay private; 198.18/15 outside the bridge never leaves."""
    assert "node" not in socket.gethostname()
    with open("/etc/hosts") as f:
        assert "127.0.1.1\tnode" not in f.read()
    route = subprocess.run(["ip", "route", "get", "198.19.0.5"], capture_output=True, text=True)
    assert route.returncode != 0 or "blackhole" in route.stdout


def test_up_is_idempotent_and_fast(cluster: tc.Cluster) -> None:
    before = [tc.sshd_pid(n.index, cluster.state_dir) for n in cluster.nodes]
    t0 = time.monotonic()
    again = tc.up(len(cluster.nodes), cluster.state_dir)
    assert time.monotonic() - t0 < 5
    assert again.nodes == cluster.nodes
    assert [tc.sshd_pid(n.index, cluster.state_dir) for n in cluster.nodes] == before
    loaded = tc.load(cluster.state_dir)
    assert loaded is not None and loaded.nodes[: len(cluster.nodes)] == cluster.nodes
    assert tc.healthy(cluster)


def test_no_job_env_leaks_into_tests() -> None:
    # DTRAIN_CONFIG="" is conftest's own: no user config file (docs/config.md)
    assert os.environ.get("DTRAIN_CONFIG") == ""
    assert not [k for k in os.environ if k.startswith(("NCCL_", "GLOO_", "DTRAIN_"))
                and k != "DTRAIN_CONFIG"]
