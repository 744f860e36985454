"""`dtrain cp`'s broadcast mode on the real-sshd cluster: a chain of relays on real nodes.

The command runs in-process (``cp_async``) so that the test hook in commands/cp/relay.py can see
the relays start (proof that the chain, not SFTP, carried the file) and kill one of them
in the middle of a transfer. Files are checked through each node's home on the host.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from launcher.commands.cp import CopyRequest, cp_async
from launcher.commands.cp import relay as cpmod
from launcher.hosts.hostfile import resolve_hosts
from launcher.transports.ssh import SSHSettings
from tests import cluster as tc
from tests.util import interrupt_when

pytestmark = pytest.mark.ssh

SIZE = 40 << 20


@pytest.fixture
def remote_dir(cluster: tc.Cluster) -> Iterator[str]:
    name = f"cp-bcast-{uuid.uuid4().hex[:8]}"
    yield name
    for node in cluster.nodes:
        shutil.rmtree(node.home / name, ignore_errors=True)


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(SIZE + 12345))
    os.chmod(path, 0o640)
    os.utime(path, (1_600_000_000, 1_600_000_000))
    return path


def _run(cluster: tc.Cluster, src: Path, dest: str, **kw: Any) -> int:
    hosts = resolve_hosts(hostfile=None, hosts="node[1-4]", include=None, exclude=None)
    req = CopyRequest(sources=(str(src),), dest=dest, preserve=True, progress=False,
                      broadcast_min=16 << 20, **kw)
    settings = SSHSettings(connect_timeout=10, home=cluster.client_home)
    return asyncio.run(cp_async(hosts, req, settings))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _temps(cluster: tc.Cluster, name: str) -> list[str]:
    return [str(p) for n in cluster.nodes[:4] for p in (n.home / name).rglob(".dtrain-cp-*")]


def test_large_file_is_broadcast_to_four_nodes_with_sha256_on_every_node(
        cluster, big_file, remote_dir, monkeypatch):
    started: list[Mapping[str, Any]] = []

    async def hook(event: str, data: Mapping[str, Any]) -> None:
        if event == "started":
            started.append(dict(data))

    monkeypatch.setattr(cpmod, "_hook", hook)
    assert _run(cluster, big_file, f"{remote_dir}/") == 0
    assert len(started) == 1 and sorted(started[0]) == ["node1", "node2", "node3", "node4"]
    want = _sha(big_file)
    for node in cluster.nodes[:4]:
        got = node.home / remote_dir / "weights.bin"
        assert _sha(got) == want, node.name
        assert got.stat().st_mode & 0o7777 == 0o640
        assert int(got.stat().st_mtime) == 1_600_000_000
    assert _temps(cluster, remote_dir) == []


def test_no_broadcast_sends_directly(cluster, big_file, remote_dir, monkeypatch):
    started: list[object] = []

    async def hook(event: str, data: Mapping[str, Any]) -> None:
        started.append(event)

    monkeypatch.setattr(cpmod, "_hook", hook)
    assert _run(cluster, big_file, f"{remote_dir}/", broadcast=False) == 0
    assert started == []
    assert all(_sha(n.home / remote_dir / "weights.bin") == _sha(big_file)
               for n in cluster.nodes[:4])


def test_a_relay_killed_mid_transfer_falls_back_and_leaves_no_temps(
        cluster, big_file, remote_dir, monkeypatch, capsys):
    pids: dict[str, int] = {}

    async def hook(event: str, data: Mapping[str, Any]) -> None:
        if event == "started":
            pids.update(data)
        elif event == "chunk" and data["chunks"] == 2:
            pid = pids["node3"]
            # no PID namespace in the test cluster: the node's pid is this machine's
            assert b"dtrain cp relay" in Path(f"/proc/{pid}/cmdline").read_bytes()
            os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(cpmod, "_hook", hook)
    assert _run(cluster, big_file, f"{remote_dir}/") == 0
    err = capsys.readouterr().err
    assert "node3:" in err and "its relay was lost; sending it directly" in err, err
    assert "node4:" in err and "chain broken at node3" in err, err
    want = _sha(big_file)
    for node in cluster.nodes[:4]:
        assert _sha(node.home / remote_dir / "weights.bin") == want, node.name
    assert _temps(cluster, remote_dir) == []


def test_ctrl_c_during_a_broadcast_leaves_no_temps(cluster, tmp_path, remote_dir):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(512 << 20)  # sparse here; 512 MiB of zeros down the chain
    homes = [n.home for n in cluster.nodes[:4]]
    for h in homes:
        (h / remote_dir).mkdir()
        os.chown(h / remote_dir, h.stat().st_uid, h.stat().st_gid)
    rc, out, err = interrupt_when(
        ["cp", "-H", "node[1-4]", "--broadcast-min", "1M", str(big), f"~/{remote_dir}/"],
        cluster.client_env(),
        lambda: all(list((h / remote_dir).glob(".dtrain-cp-*")) for h in homes))
    assert rc == 130, (out, err)
    # the relays notice the closed channel (or their upstream's EOF) and remove their temp
    deadline = time.monotonic() + 10
    while any(list((h / remote_dir).iterdir()) for h in homes) and time.monotonic() < deadline:
        time.sleep(0.1)
    for h in homes:
        assert list((h / remote_dir).iterdir()) == [], "a temp or partial file was left"


def test_a_relay_gone_before_the_chain_links_cuts_it_there_without_waiting(
        cluster, big_file, remote_dir, monkeypatch, capsys):
    async def hook(event: str, data: Mapping[str, Any]) -> None:
        if event == "started":  # ports reported, nobody told where to connect yet
            pid = data["node3"]
            assert b"dtrain cp relay" in Path(f"/proc/{pid}/cmdline").read_bytes()
            os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(cpmod, "_hook", hook)
    t0 = time.monotonic()
    assert _run(cluster, big_file, f"{remote_dir}/") == 0
    assert time.monotonic() - t0 < cpmod.RELAY_IDLE_S  # nobody waited out a timeout
    err = capsys.readouterr().err
    # which side notices first is a race: node2 failing to connect to the dead relay, or
    # the launcher seeing node3's channel close; both cut the chain at node3, at once
    assert re.search(r"node3: \S+: broadcast failed: (its relay was lost|chain broken after "
                     r"node2 \(cannot connect to the next node)", err), err
    assert re.search(r"node4: \S+: broadcast failed: chain broken (at node3|after node2)", err), err
    assert "node1:" not in err and "node2:" not in err, err
    want = _sha(big_file)
    for node in cluster.nodes[:4]:
        assert _sha(node.home / remote_dir / "weights.bin") == want, node.name
    assert _temps(cluster, remote_dir) == []
