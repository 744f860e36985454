"""`dtrain cp` against the real-sshd cluster: push and pull trees, delta, --delete, atomicity.

Every node has its own home (docs/test-cluster.md), so results are checked per node through
its host path ``cluster.node(k).home``. Each test works under a directory of its own name
(other sessions share the homes) and removes it afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cluster as tc
from tests.util import dial_watch, dtrain, interrupt_when

pytestmark = pytest.mark.ssh

NODES = "node[1-4]"
UNREACHABLE = "dtuser@198.18.0.250"


@pytest.fixture
def remote_dir(cluster: tc.Cluster) -> Iterator[str]:
    """A fresh directory name under each node's home, removed afterwards on every node."""
    name = f"cp-test-{uuid.uuid4().hex[:8]}"
    yield name
    for node in cluster.nodes:
        shutil.rmtree(node.home / name, ignore_errors=True)


def make_tree(root: Path) -> dict[str, tuple[str, int]]:
    """A source tree with modes, symlinks, unicode and spaces; returns rel -> (kind, mode)."""
    (root / "sub dir" / "deep").mkdir(parents=True)
    (root / "priv").mkdir()
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "sub dir" / "é ü ñ.txt").write_text("unicode and spaces\n")
    (root / "sub dir" / "deep" / "data.bin").write_bytes(os.urandom(300_000))
    (root / "priv" / "secret").write_text("s3cret\n")
    (root / "empty").write_bytes(b"")
    (root / "link to run").symlink_to("run.sh")
    (root / "dirlink").symlink_to("sub dir")
    (root / "dangling").symlink_to("/nonexistent/target")
    os.chmod(root / "run.sh", 0o750)
    os.chmod(root / "priv" / "secret", 0o600)
    os.chmod(root / "priv", 0o700)
    os.utime(root / "run.sh", (1_600_000_000, 1_600_000_000))
    return {"run.sh": ("file", 0o750), "sub dir/é ü ñ.txt": ("file", 0o644),
            "sub dir/deep/data.bin": ("file", 0o644), "priv/secret": ("file", 0o600),
            "empty": ("file", 0o644), "priv": ("dir", 0o700)}


def assert_same_tree(src: Path, dst: Path, *, modes: bool = True) -> None:
    """dst mirrors src: same names, kinds, content, link targets, file mtimes (and modes)."""
    def listing(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*")}

    assert listing(dst) == listing(src)
    for rel in listing(src):
        s, d = src / rel, dst / rel
        if s.is_symlink():
            assert d.is_symlink() and os.readlink(d) == os.readlink(s), rel
        elif s.is_dir():
            assert d.is_dir() and not d.is_symlink(), rel
        else:
            assert d.is_file() and not d.is_symlink(), rel
            assert d.read_bytes() == s.read_bytes(), rel
            assert int(d.stat().st_mtime) == int(s.stat().st_mtime), rel
        if modes and not s.is_symlink():
            assert oct(d.lstat().st_mode & 0o7777) == oct(s.lstat().st_mode & 0o7777), rel


def chown_to_dtuser(cluster: tc.Cluster, k: int, path: Path) -> None:
    """Files a test made on a node's home (as root) handed to dtuser, who owns the home."""
    home = cluster.node(k).home.stat()
    subprocess.run(["chown", "-hR", f"{home.st_uid}:{home.st_gid}", str(path)], check=True)


def temps_under(root: Path) -> list[Path]:
    return [p for p in root.rglob(".dtrain-cp-*") if p.name.endswith(".tmp")]


def test_push_tree_with_modes_symlinks_unicode_to_every_node(cluster, tmp_path, remote_dir):
    src = tmp_path / "proj"
    src.mkdir()
    make_tree(src)
    res = dtrain(["cp", "-H", NODES, "-r", "-p", str(src), f"~/{remote_dir}"],
                 env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    for k in range(1, 5):
        dst = cluster.node(k).home / remote_dir
        assert_same_tree(src, dst)
        assert (dst / "run.sh").stat().st_uid == cluster.node(k).home.stat().st_uid
        assert f"node{k}: sent 8 " in res.stdout  # 5 files + 3 symlinks
        assert temps_under(dst) == []
    # the copy runs as itself on the node
    run = cluster.node_exec(2, [f"./{remote_dir}/link to run"])
    assert run.stdout == "run\n"


def test_delta_repush_sends_nothing_then_only_the_change(cluster, tmp_path, remote_dir):
    src = tmp_path / "proj"
    src.mkdir()
    make_tree(src)
    env = cluster.client_env()
    # DEST/ (a directory, created if missing): the same layout on every run
    assert dtrain(["cp", "-H", NODES, "-r", str(src), f"~/{remote_dir}/"],
                  env=env).returncode == 0
    again = dtrain(["cp", "-H", NODES, "-r", str(src), f"{remote_dir}/"], env=env)
    assert again.returncode == 0, again.stderr
    for k in range(1, 5):
        assert f"node{k}: sent 0 (0 B), skipped 8, deleted 0" in again.stdout, again.stdout
    (src / "sub dir" / "é ü ñ.txt").write_text("changed, and longer than before\n")
    third = dtrain(["cp", "-H", NODES, "-r", str(src), f"~/{remote_dir}/"], env=env)
    assert third.returncode == 0
    for k in range(1, 5):
        assert f"node{k}: sent 1 (32 B), skipped 7" in third.stdout, third.stdout
        assert (cluster.node(k).home / remote_dir / "proj" / "sub dir" / "é ü ñ.txt").read_text() \
            == "changed, and longer than before\n"


def test_checksum_compares_content_not_mtime(cluster, tmp_path, remote_dir):
    src = tmp_path / "f.txt"
    src.write_text("version A\n")
    env = cluster.client_env()
    assert dtrain(["cp", "-H", "node1", str(src), f"~/{remote_dir}/"], env=env).returncode == 0
    on_node = cluster.node(1).home / remote_dir / "f.txt"
    st = on_node.stat()
    on_node.write_text("version B\n")  # same size, same mtime: the delta check cannot tell
    os.utime(on_node, (st.st_atime, st.st_mtime))
    plain = dtrain(["cp", "-H", "node1", str(src), f"~/{remote_dir}/"], env=env)
    assert "sent 0" in plain.stdout and on_node.read_text() == "version B\n"
    summed = dtrain(["cp", "-H", "node1", "--checksum", str(src), f"~/{remote_dir}/"], env=env)
    assert summed.returncode == 0, summed.stderr
    assert "node1: sent 1" in summed.stdout and on_node.read_text() == "version A\n"
    os.utime(src, (1_500_000_000, 1_500_000_000))  # same content, other mtime: fixed, not sent
    touched = dtrain(["cp", "-H", "node1", "--checksum", str(src), f"~/{remote_dir}/"], env=env)
    assert "node1: sent 0 (0 B), skipped 1" in touched.stdout, touched.stdout
    assert int(on_node.stat().st_mtime) == 1_500_000_000


def test_delete_is_confined_to_dest(cluster, tmp_path, remote_dir):
    src = tmp_path / "proj"
    src.mkdir()
    (src / "keep").write_text("k\n")
    home = cluster.node(3).home
    dest = home / remote_dir / "proj"
    (dest / "old dir").mkdir(parents=True)
    (dest / "old dir" / "x").write_text("x")
    (dest / "extra").write_text("e")
    outside = home / remote_dir / "outside"
    outside.mkdir()
    (outside / "precious").write_text("p")
    (dest / "link-out").symlink_to(outside)
    (home / remote_dir / "sibling").write_text("s")
    chown_to_dtuser(cluster, 3, home / remote_dir)
    res = dtrain(["cp", "-H", "node3", "-r", "--delete", str(src), f"~/{remote_dir}/"],
                 env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    assert "node3: sent 1 (2 B), skipped 0, deleted 4" in res.stdout, res.stdout
    assert sorted(p.name for p in dest.iterdir()) == ["keep"]
    assert (outside / "precious").read_text() == "p"  # the link went, not its target
    assert (home / remote_dir / "sibling").read_text() == "s"  # DEST's siblings untouched


def test_stale_temps_of_an_interrupted_run_are_removed(cluster, tmp_path, remote_dir):
    src = tmp_path / "proj"
    src.mkdir()
    (src / "a").write_text("a\n")
    dest = cluster.node(2).home / remote_dir / "proj"
    dest.mkdir(parents=True)
    (dest / ".dtrain-cp-deadbeef-a.tmp").write_text("half")
    chown_to_dtuser(cluster, 2, dest.parent)
    res = dtrain(["cp", "-H", "node2", "-r", str(src), f"~/{remote_dir}/"],
                 env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    assert "1 stale temp removed" in res.stdout
    assert sorted(p.name for p in dest.iterdir()) == ["a"]


def test_interrupted_copy_leaves_nothing_behind(cluster, tmp_path, remote_dir):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(512 << 20)  # sparse here; 512 MiB of zeros on the wire
    homes = [cluster.node(k).home for k in (1, 2)]
    for h in homes:
        (h / remote_dir).mkdir()
        os.chown(h / remote_dir, h.stat().st_uid, h.stat().st_gid)
    rc, out, err = interrupt_when(["cp", "-H", "node[1-2]", str(big), f"~/{remote_dir}/"],
                                  cluster.client_env(),
                                  lambda: all(temps_under(h / remote_dir) for h in homes))
    assert rc == 130, (out, err)
    for h in homes:
        assert list((h / remote_dir).iterdir()) == [], "a temp or partial file was left"


def test_unreachable_node_is_255_and_the_others_are_done(cluster, tmp_path, remote_dir):
    src = tmp_path / "f.txt"
    src.write_text("hello\n")
    res = dtrain(["cp", "-H", f"node[1-3],{UNREACHABLE}", "--connect-timeout", "2", str(src),
                  f"~/{remote_dir}/"], env=cluster.client_env())
    assert res.returncode == 255
    assert "198.18.0.250: not reached: timed out" in res.stdout
    for k in (1, 2, 3):
        assert (cluster.node(k).home / remote_dir / "f.txt").read_text() == "hello\n"
        assert f"node{k}: sent 1 (6 B)" in res.stdout


def test_bad_input_exits_2_before_connecting(cluster, tmp_path):
    env, dials = dial_watch(cluster.client_env(), tmp_path / "site")
    missing = dtrain(["cp", "-H", UNREACHABLE, str(tmp_path / "nope"), "~/x"], env=env)
    assert missing.returncode == 2 and "no such file" in missing.stderr
    (tmp_path / "d").mkdir()
    no_r = dtrain(["cp", "-H", UNREACHABLE, str(tmp_path / "d"), "~/x"], env=env)
    assert no_r.returncode == 2 and "use -r" in no_r.stderr
    other_home = dtrain(["cp", "-H", UNREACHABLE, str(tmp_path / "d"), "-r", "~bob/x"],
                        env=env)
    assert other_home.returncode == 2, other_home.stderr
    assert "DEST ~bob/x: ~user paths are not supported; write the absolute path" in \
        other_home.stderr, other_home.stderr
    assert not dials.exists(), dials.read_text()  # nothing dialled the unreachable address


def test_pull_lands_per_host_with_globs_and_missing_files(cluster, tmp_path, remote_dir):
    for k in range(1, 5):
        base = cluster.node(k).home / remote_dir
        (base / "logs dir").mkdir(parents=True)
        (base / f"rank{k}.log").write_text(f"from node{k}\n")
        (base / "logs dir" / "é.txt").write_text(f"nested {k}\n")
        (base / "logs dir" / "ln").symlink_to("é.txt")
        if k != 4:
            (base / "only-123").write_text("x")
        os.chmod(base / f"rank{k}.log", 0o640)
        chown_to_dtuser(cluster, k, base)
    out = tmp_path / "pulled"
    res = dtrain(["cp", "--pull", "-H", NODES, "-r", "-p", f"~/{remote_dir}/*.log",
                  f"{remote_dir}/logs dir", f"~/{remote_dir}/only-123", str(out)],
                 env=cluster.client_env())
    assert res.returncode == 1, res.stderr  # node4 lacks only-123: its error, not an abort
    assert "only-123: no such file or directory" in res.stderr
    # issue 24.7: what a pull did is "received" (it said "sent"); the total comes last
    assert "node1: received 4 (" in res.stdout and " sent " not in res.stdout, res.stdout
    assert res.stdout.splitlines()[-1].startswith("total 4 nodes: received 15 ("), res.stdout
    for k in range(1, 5):
        got = out / f"node{k}"
        assert (got / f"rank{k}.log").read_text() == f"from node{k}\n"
        assert (got / f"rank{k}.log").stat().st_mode & 0o777 == 0o640
        assert (got / "logs dir" / "é.txt").read_text() == f"nested {k}\n"
        assert os.readlink(got / "logs dir" / "ln") == "é.txt"
        assert (got / "only-123").exists() == (k != 4)
    again = dtrain(["cp", "--pull", "-H", "node[1-3]", "-r", f"~/{remote_dir}/*.log",
                    f"{remote_dir}/logs dir", str(out)], env=cluster.client_env())
    assert again.returncode == 0, again.stderr
    assert "node1: received 0 (0 B), skipped 3" in again.stdout, again.stdout


def test_push_streams_through_the_node_program_or_falls_back_to_sftp(cluster, tmp_path,
                                                                    remote_dir):
    src = tmp_path / "proj"
    src.mkdir()
    make_tree(src)
    env = cluster.client_env()
    # the node's python is a wrapper that keeps a copy of what the node program reads on its
    # stdin: the stream path ran when the files' bytes went through it (an absent "SFTP" in
    # the output, or cpnode merely started, would not show it)
    seen = cluster.shared_dir / f"cpnode-stdin-{uuid.uuid4().hex[:8]}"
    wrapper = cluster.shared_dir / f"{seen.name}.sh"
    wrapper.write_text(f'#!/bin/sh\ntee -a {seen} | {cluster.python} "$@"\n')
    wrapper.chmod(0o755)
    try:
        streamed = dtrain(["cp", "-H", "node1", "-r", "-p", "--python", str(wrapper),
                           str(src), f"~/{remote_dir}/s/"], env=env)
        assert streamed.returncode == 0, streamed.stderr
        assert "SFTP" not in streamed.stderr
        stream = seen.read_bytes()
        for rel in ("run.sh", "sub dir/é ü ñ.txt", "sub dir/deep/data.bin", "priv/secret"):
            assert (src / rel).read_bytes() in stream, f"{rel} did not go through cpnode"
    finally:
        wrapper.unlink()
        seen.unlink(missing_ok=True)
    fallback = dtrain(["cp", "-H", "node1", "-r", "-p", "--python", "/nonexistent/python3",
                       str(src), f"~/{remote_dir}/f/"], env=env)
    assert fallback.returncode == 0, fallback.stderr
    assert "/nonexistent/python3 not found;" in fallback.stderr
    assert "copying over SFTP instead" in fallback.stderr
    for sub in ("s", "f"):
        assert_same_tree(src, cluster.node(1).home / remote_dir / sub / "proj")
