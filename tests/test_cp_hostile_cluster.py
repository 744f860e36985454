"""`dtrain cp` against a hostile node on the real-sshd cluster (issue 22, High): node3's SFTP
server is hostile (tests/cluster/hostile_sftp.py, ``tc.hostile_sftp``) or its Python's
cpnode answers are (a wrapper interpreter), while node1 and node2 are honest. node3 gets an
error of its own, the others their copy, nothing lands outside the destination, and no
traceback stops the other nodes. Only the CLI is used, so these run against any version.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cluster as tc
from tests.util import assert_exit, dtrain

pytestmark = pytest.mark.ssh


def _chown(cluster: tc.Cluster, k: int, path: Path) -> None:
    """Files a test made in node k's home (as root) handed to dtuser, who owns the home."""
    pw = pwd.getpwnam(cluster.user)
    for p in [path, *path.rglob("*")]:
        os.lchown(p, pw.pw_uid, pw.pw_gid)


@pytest.fixture
def remote_dir(cluster: tc.Cluster) -> Iterator[str]:
    name = f"hostile-{uuid.uuid4().hex[:8]}"
    yield name
    for k in (1, 2, 3):
        shutil.rmtree(cluster.node(k).home / name, ignore_errors=True)


NODES = "node[1-3]"


def test_pull_from_a_hostile_sftp_server_stays_in_its_directory(cluster: tc.Cluster,
                                                                 tmp_path: Path,
                                                                 remote_dir: str) -> None:
    """node3's SFTP lists a real file as ../../../x (which resolves, on the node, to a file
    it wants the login node to write beside LOCALDIR); node1's tree has a setuid file.
    node3 fails with its own error, nothing lands outside LOCALDIR, node1 and node2 get
    their trees (-p: modes, without the setuid bit), no traceback."""
    evil = f"dtrain-evil-{uuid.uuid4().hex[:8]}"
    for k in (1, 2, 3):
        base = cluster.node(k).home / remote_dir
        d = base / "t" / "u" / "d"
        (d / "sub").mkdir(parents=True)
        (d / "a.txt").write_text(f"a of node{k}\n")
        (d / "sub" / "b.txt").write_text("b\n")
        (d / evil).write_text("evil\n")
        (d / "tool").write_text("#!/bin/sh\n")
        os.chmod(d / "tool", 0o4755)
        (base / "x").write_text("written outside LOCALDIR\n")  # d/../../../x on the node
        _chown(cluster, k, base)
    got = tmp_path / "got"
    with tc.hostile_sftp(cluster, 3, {evil: "../../../x"}):
        res = dtrain(["cp", "--pull", "-r", "-p", "-H", NODES, f"~/{remote_dir}/t/u/d",
                      str(got)], env=cluster.client_env(), timeout=120)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["got"]  # no x beside LOCALDIR
    assert_exit(res, 1)
    assert "node3: " in res.stderr and "'../../../x': a name with '/'; refused" in res.stderr
    assert "1 node failed: node3" in res.stderr
    assert not (got / "node3").exists() or not any(p.is_file() for p in (got / "node3").rglob("*"))
    for k in (1, 2):
        d = got / f"node{k}" / "d"
        assert (d / "a.txt").read_text() == f"a of node{k}\n"
        assert (d / "sub" / "b.txt").read_text() == "b\n"
        assert stat.S_IMODE((d / "tool").stat().st_mode) == 0o755  # the setuid bit dropped
        assert (d / evil).read_text() == "evil\n"  # honest nodes: the name is just a name


def test_a_hostile_glob_match_is_that_node_s_error(cluster: tc.Cluster, tmp_path: Path,
                                                   remote_dir: str) -> None:
    """node3 lists g1 as g1<NUL>x, which its glob returns as a match: refused for node3."""
    g1 = f"g1-{uuid.uuid4().hex[:8]}"
    for k in (1, 2, 3):
        base = cluster.node(k).home / remote_dir
        base.mkdir()
        (base / g1).write_text(f"g1 of node{k}\n")
        _chown(cluster, k, base)
    got = tmp_path / "got"
    with tc.hostile_sftp(cluster, 3, {g1: g1 + "\0x"}):
        res = dtrain(["cp", "--pull", "-H", NODES, f"~/{remote_dir}/g*", str(got)],
                     env=cluster.client_env(), timeout=120)
    assert_exit(res, 1)
    assert "node3: " in res.stderr and "the node's glob returned" in res.stderr
    assert "a name with NUL; refused" in res.stderr
    for k in (1, 2):
        assert (got / f"node{k}" / g1).read_text() == f"g1 of node{k}\n"
    assert not (got / "node3").exists() or not any((got / "node3").rglob("*"))


def test_sftp_push_with_delete_to_a_hostile_node(cluster: tc.Cluster, tmp_path: Path,
                                                 remote_dir: str) -> None:
    """node3's listing of the destination names ../../victim: its error, no AssertionError
    traceback, nothing deleted there; node1 and node2 are synced (their extra deleted)."""
    extra = f"dtrain-extra-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("pushed\n")
    for k in (1, 2, 3):
        base = cluster.node(k).home / remote_dir
        (base / "src").mkdir(parents=True)
        (base / "src" / extra).write_text("extra\n")
        (base / "victim").write_text("keep me\n")
        _chown(cluster, k, base)
    with tc.hostile_sftp(cluster, 3, {extra: "../victim"}):
        res = dtrain(["cp", "--sftp", "-r", "--delete", "-H", NODES, str(src),
                      f"~/{remote_dir}/"], env=cluster.client_env(), timeout=120)
    assert_exit(res, 1)
    assert "'../victim': a name with '/'; refused" in res.stderr and "node3: " in res.stderr
    home3 = cluster.node(3).home / remote_dir
    assert (home3 / "victim").read_text() == "keep me\n" and (home3 / "src" / extra).exists()
    for k in (1, 2):
        base = cluster.node(k).home / remote_dir
        assert (base / "src" / "a.txt").read_text() == "pushed\n"
        assert not (base / "src" / extra).exists() and (base / "victim").exists()


FILTER = r'''
import json
import sys

# a hostile node's Python: cpnode's walk and diff answers get a row that is no row
for line in iter(sys.stdin.buffer.readline, b""):
    if line.startswith((b'{"tree"', b'{"differ"')):
        doc = json.loads(line)
        doc["tree" if "tree" in doc else "extra"].append(["dtrain-bad-row"])
        line = (json.dumps(doc) + "\n").encode()
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
'''


def test_stream_push_to_a_node_whose_cpnode_answers_are_hostile(cluster: tc.Cluster,
                                                                tmp_path: Path,
                                                                remote_dir: str) -> None:
    """node3's interpreter (python= in the hostfile) rewrites cpnode's walk answer with a
    malformed row: node3's error, no IndexError traceback; node1 and node2 get the files."""
    shared = cluster.shared_dir / f"hostile-python-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    (shared / "filter.py").write_text(FILTER)
    wrapper = shared / "python3"
    wrapper.write_text(f'#!/bin/sh\n{cluster.python} "$@" | {cluster.python} '
                       f'{shared / "filter.py"}\n')
    os.chmod(wrapper, 0o755)
    os.chmod(shared, 0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"node1\nnode2\nnode3 python={wrapper}\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("pushed\n")
    for k in (1, 2, 3):
        base = cluster.node(k).home / remote_dir
        base.mkdir()
        _chown(cluster, k, base)
    res = dtrain(["cp", "-r", "-f", str(hostfile), "--python", cluster.python, str(src),
                  f"~/{remote_dir}/"], env=cluster.client_env(), timeout=120)
    assert_exit(res, 1)
    assert "node3: cp node program: a walk row that is not [rel, kind, size, mtime, mode, " \
        "target]" in res.stderr, res.stderr
    for k in (1, 2):
        assert (cluster.node(k).home / remote_dir / "src" / "a.txt").read_text() == "pushed\n"
