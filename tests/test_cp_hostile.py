"""`dtrain cp` against a hostile node (issue 22, High and Low 3): what a node lists, globs
or answers is a node's word, and changes nothing on the login node outside LOCALDIR/<host>/.

Without the cluster: the confined filesystem a pull writes through, the name and glob
checks, a walk and a pull over a fake node whose listing is hostile, the stream's answers.
The same on the real-sshd cluster, with node3 hostile: tests/test_cp_hostile_cluster.py.
"""

from __future__ import annotations

import asyncio
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.commands import cp
from launcher.commands.cp.request import walk
from launcher.commands.cp.sftp import pull_node
from launcher.commands.cp.stream import checked_diff, walk_tree
from launcher.commands.cp.view import CopyView
from launcher.decide.copies import copyplan as cpl
from launcher.errors import DtrainError, RemoteCommandError, TransferError
from launcher.models import CopyResult, Host
from launcher.transports.base import FileStat
from launcher.transports.confined import ConfinedFileSystem
from launcher.transports.local import LocalConnection, LocalFileSystem

FILE_ST = FileStat(stat.S_IFREG | 0o644, 3, 1_700_000_000)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def as_cp_does(coro: Any, result: CopyResult) -> None:
    """A node's part of a copy as ``cp_async`` runs it: its DtrainError is its error."""
    try:
        await coro
    except DtrainError as exc:
        result.errors.append(exc.message)


# -- the pure checks --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "x\0y", "x" * 256])
def test_a_listed_name_must_be_one_component(name: str) -> None:
    assert cpl.bad_name(name)


@pytest.mark.parametrize("name", ["a", ".hidden", "x\x1b]0;title\x07", "é ü", "a..b", "x" * 255])
def test_any_other_name_is_fine(name: str) -> None:
    assert cpl.bad_name(name) is None


@pytest.mark.parametrize(("match", "ok"), [
    ("/home/u/t/g1", True), ("/home/u/t/gx.txt", True), ("/", False), ("/home/u/t/..", False),
    ("/home/u/t/g1/../..", False), ("/etc/passwd", False), ("/home/u/s/g1", False),
    ("/home/u/t/h1", False), ("/home/u/t/g\0x", False), ("home/u/t/g1", False),
    ("/home/u/t/g1/x", False)])
def test_a_glob_match_must_be_one_of_the_pattern_s(match: str, ok: bool) -> None:
    assert (cpl.bad_match("/home/u/t/g*", match) is None) is ok


# -- the confined filesystem ----------------------------------------------------------------

@pytest.fixture
def confined(tmp_path: Path) -> Iterator[tuple[ConfinedFileSystem, Path, Path]]:
    """(the filesystem, its root LOCALDIR/node3, a victim directory beside LOCALDIR)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "authorized_keys").write_text("mine\n")
    yield ConfinedFileSystem(str(tmp_path / "got" / "node3"), host="node3"), \
        tmp_path / "got" / "node3", victim


def _write(fs: ConfinedFileSystem, path: str, data: bytes, mode: int = 0o644) -> None:
    async def go() -> None:
        async with fs.open_write(path, mode) as w:
            await w.write(data)
    run(go())


def test_nothing_outside_the_root_is_reached(confined: Any) -> None:
    fs, root, victim = confined
    run(fs.mkdir(str(root), parents=True))
    outside = [str(victim / "x"), f"{root}/../../victim/x", f"{root}/./x", f"{root}//x",
               f"{root}/a/../../victim/x", f"{root}x"]
    for path in outside:
        with pytest.raises(TransferError, match="refused"):
            _write(fs, path, b"evil")
        for op in (fs.mkdir(path, parents=True), fs.remove(path), fs.symlink("/", path),
                   fs.set_attrs(path, mode=0o777), fs.rename(str(root / "a"), path),
                   fs.lstat(path), fs.listdir(path)):
            with pytest.raises(TransferError, match="refused"):
                run(op)
    assert sorted(p.name for p in victim.iterdir()) == ["authorized_keys"]


def test_a_symlink_below_the_root_is_never_followed(confined: Any) -> None:
    """The pull made root/a -> victim (a node listed a symlink), then the node lists a file
    "inside" it: writing, making, chmod'ing through it all fail; the victim is untouched."""
    fs, root, victim = confined
    run(fs.mkdir(str(root), parents=True))
    run(fs.symlink(str(victim), str(root / "a")))
    for path in (root / "a" / "authorized_keys", root / "a" / "new"):
        with pytest.raises(TransferError):
            _write(fs, str(path), b"evil")
    with pytest.raises(TransferError):
        run(fs.mkdir(str(root / "a" / "sub"), parents=True))
    with pytest.raises(TransferError):
        run(fs.set_attrs(str(root / "a"), mode=0o777, mtime=1))
    with pytest.raises(TransferError):
        run(fs.set_attrs(str(root / "a" / "authorized_keys"), mode=0o777))
    with pytest.raises(TransferError):
        run(fs.rename(str(root / "a" / "authorized_keys"), str(root / "stolen")))
    with pytest.raises(TransferError):
        run(fs.listdir(str(root / "a")))
    assert (victim / "authorized_keys").read_text() == "mine\n"
    assert stat.S_IMODE(victim.stat().st_mode) != 0o777
    assert sorted(p.name for p in victim.iterdir()) == ["authorized_keys"]
    run(fs.remove(str(root / "a")))  # the link itself can go
    assert victim.exists() and not (root / "a").exists()


def test_files_are_new_and_setuid_bits_are_dropped(confined: Any, tmp_path: Path) -> None:
    fs, root, _ = confined
    run(fs.mkdir(str(root / "d"), parents=True))
    _write(fs, str(root / "d" / "tool"), b"#!/bin/sh\n", 0o4755)
    assert stat.S_IMODE((root / "d" / "tool").stat().st_mode) & 0o6000 == 0
    with pytest.raises(TransferError):  # O_EXCL: never into a file that is there
        _write(fs, str(root / "d" / "tool"), b"again")
    run(fs.set_attrs(str(root / "d" / "tool"), mode=0o6755, mtime=1_600_000_000))
    st = (root / "d" / "tool").stat()
    assert (stat.S_IMODE(st.st_mode), int(st.st_mtime)) == (0o755, 1_600_000_000)
    run(fs.set_attrs(str(root / "d"), mode=0o2755))
    assert stat.S_IMODE((root / "d").stat().st_mode) == 0o755
    keep = ConfinedFileSystem(str(root), host="node3", keep_setid=True)
    run(keep.set_attrs(str(root / "d" / "tool"), mode=0o4755))
    assert stat.S_IMODE((root / "d" / "tool").stat().st_mode) == 0o4755


def test_a_mode_000_file_still_gets_its_mtime(confined: Any) -> None:
    fs, root, _ = confined
    run(fs.mkdir(str(root), parents=True))
    _write(fs, str(root / "locked"), b"x", 0o000)
    run(fs.set_attrs(str(root / "locked"), mode=0o000, mtime=1_600_000_000))
    assert int((root / "locked").stat().st_mtime) == 1_600_000_000


# -- a fake node: walk, and a pull, over a hostile listing ----------------------------------

class HostileFS(LocalFileSystem):
    """A node's files (this machine's) whose listings and glob results are rewritten."""

    def __init__(self, rename: dict[str, str], globbed: list[str] | None = None) -> None:
        super().__init__("node3")
        self.rename = rename
        self.globbed = globbed

    async def listdir(self, path: str) -> list[tuple[str, FileStat]]:
        return [(self.rename.get(n, n), st) for n, st in await super().listdir(path)]

    async def glob(self, pattern: str) -> list[str]:
        return self.globbed if self.globbed is not None else await super().glob(pattern)


class HostileNode(LocalConnection):
    def __init__(self, fs: HostileFS) -> None:
        super().__init__(Host("node3"))
        self.fs = fs

    async def files(self) -> Any:
        return self.fs


@pytest.mark.parametrize("bad", ["../../../x", "a/b", "..", "", "x\0y"])
def test_walk_refuses_a_listing_with_a_name_that_is_not_one_component(tmp_path: Path,
                                                                       bad: str) -> None:
    (tmp_path / "evil").write_text("x")
    with pytest.raises(TransferError, match="refused"):
        run(walk(HostileFS({"evil": bad}), str(tmp_path)))


def test_walk_refuses_a_name_listed_twice(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").write_text("x")
    with pytest.raises(TransferError, match="listed twice"):
        run(walk(HostileFS({"b": "a"}), str(tmp_path)))


def _pull(node: HostileNode, sources: tuple[str, ...], dest: Path, **kw: Any) -> CopyResult:
    req = cp.CopyRequest(sources=sources, dest=str(dest), pull=True, progress=False, **kw)
    result = CopyResult("node3")
    view = CopyView(1, live=False, out=io.StringIO(), err=io.StringIO())
    run(as_cp_does(pull_node(node, cp.Copy(req, view), result), result))
    return result


def test_a_pull_of_a_hostile_listing_writes_nothing_outside(tmp_path: Path) -> None:
    remote = tmp_path / "node" / "t" / "u" / "d"
    remote.mkdir(parents=True)
    (remote / "ok.txt").write_text("fine\n")
    (remote / "evil").write_text("evil\n")
    (tmp_path / "node" / "t" / "x").write_text("what the node wanted written\n")
    got = tmp_path / "got"
    res = _pull(HostileNode(HostileFS({"evil": "../../../x"})), (str(remote),), got,
                recursive=True)
    assert res.errors and "'../../../x': a name with '/'; refused" in res.errors[0]
    assert not (tmp_path / "x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) in (["node"], ["got", "node"])
    assert not got.exists() or not any(p.is_file() for p in got.rglob("*"))


@pytest.mark.parametrize("globbed", [["/"], ["{d}/.."], ["{d}/g1/../../.."], ["/etc/passwd"],
                                     ["{d}/g\0x"]])
def test_a_hostile_glob_result_is_the_node_s_error(tmp_path: Path, globbed: list[str]) -> None:
    d = tmp_path / "node"
    d.mkdir()
    (d / "g1").write_text("one\n")
    matches = [g.format(d=d) for g in globbed]
    res = _pull(HostileNode(HostileFS({}, matches)), (f"{d}/g*",), tmp_path / "got")
    assert len(res.errors) == 1 and "the node's glob returned" in res.errors[0], res.errors
    assert "refused" in res.errors[0]
    assert not (tmp_path / "got").exists() or not any((tmp_path / "got").rglob("*"))


def test_a_pull_with_p_drops_setuid_unless_asked(tmp_path: Path) -> None:
    remote = tmp_path / "node" / "d"
    remote.mkdir(parents=True)
    (remote / "tool").write_text("#!/bin/sh\n")
    os.chmod(remote / "tool", 0o4755)
    for keep, want in ((False, 0o755), (True, 0o4755)):
        got = tmp_path / f"got-{keep}"
        res = _pull(HostileNode(HostileFS({})), (str(remote),), got, recursive=True,
                    preserve=True, keep_setuid=keep)
        assert res.errors == [] and res.sent == 1
        assert stat.S_IMODE((got / "node3" / "d" / "tool").stat().st_mode) == want


def test_the_sftp_push_with_delete_refuses_a_hostile_listing(tmp_path: Path) -> None:
    """The push falls back to SFTP; the destination's listing names ../../victim: an error
    of that node, nothing deleted outside, no AssertionError."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    dest = tmp_path / "dest"
    (dest / "src").mkdir(parents=True)
    (dest / "src" / "extra").write_text("extra\n")
    (tmp_path / "victim").write_text("keep me\n")
    req = cp.CopyRequest(sources=(str(src),), dest=str(dest), recursive=True, delete=True,
                         progress=False, stream=False)
    result = CopyResult("node3")

    async def go() -> None:
        sources = await cp.prepare_push(req)
        view = CopyView(1, live=False, out=io.StringIO(), err=io.StringIO())
        await as_cp_does(cp.push_node(HostileNode(HostileFS({"extra": "../../victim"})),
                                      cp.Copy(req, view, sources), result), result)

    run(go())
    assert result.errors and "refused" in result.errors[0]
    assert (tmp_path / "victim").read_text() == "keep me\n"
    assert (dest / "src" / "extra").exists()


# -- the stream's answers -----------------------------------------------------------------

@pytest.mark.parametrize("rows", [
    "not a list", [["x"]], [["", "dir", 0, 0, 0o755, ""], ["../x", "file", 1, 0, 0o644, ""]],
    [["", "dir", 0, 0, 0o755, ""], ["a/b", "file", 1, 0, 0o644, ""]],
    [["", "dir", 0, 0, 0o755, ""], ["a", "file", "1", 0, 0o644, ""]],
    [["", "dir", 0, 0, 0o755, ""], ["a", "socket", 1, 0, 0o644, ""]],
    [["", "dir", 0, 0, 0o755, ""], ["a", "file", 1, 0, 0o644, ""], ["a", "dir", 0, 0, 0, ""]],
    [["", "file", 1, 0, 0o644, ""], ["a", "file", 1, 0, 0o644, ""]],
    [["a", "file", 1, 0, 0o644, ""]],
], ids=str)
def test_a_hostile_walk_answer_is_the_node_s_error(rows: Any) -> None:
    with pytest.raises(RemoteCommandError, match="refused"):
        walk_tree(rows, "node3")


@pytest.mark.parametrize("reply", [
    {}, {"differ": [], "missing": [], "extra": "x"}, {"differ": [["x"]], "missing": [],
                                                     "extra": []},
    {"differ": [], "missing": ["../x"], "extra": []},
    {"differ": [], "missing": [7], "extra": []},
    {"differ": [], "missing": [], "extra": [["a/../../x", "file", 1, 0, 0o644, ""]]},
], ids=str)
def test_a_hostile_diff_answer_is_the_node_s_error(reply: Any) -> None:
    with pytest.raises(RemoteCommandError, match="refused"):
        checked_diff(reply, "node3")


def test_an_honest_walk_answer_is_the_tree() -> None:
    rows = [["", "dir", 0, 5, 0o755, ""], ["a", "dir", 0, 5, 0o755, ""],
            ["a/f", "file", 3, 5, 0o644, ""], ["l", "link", 0, 5, 0o777, "a/f"]]
    tree = walk_tree(rows, "node3")
    assert sorted(tree) == ["", "a", "a/f", "l"] and tree["l"].target == "a/f"


# -- temps: a random name per file, created O_EXCL (Low 3) ----------------------------------

def test_each_file_gets_its_own_random_temp_name() -> None:
    node = cp.Target(None, CopyResult("n1"), "python3")
    a, b = node.temp("/d/a"), node.temp("/d/b")
    assert a != b and cpl.is_temp(a) and cpl.is_temp(b)
    assert node.temp("/d/a") == a  # the same until renewed
    assert a.split("-")[2] != b.split("-")[2]  # not one token per copy
    node.renew("/d/a")
    assert node.temp("/d/a") != a


def test_the_node_never_writes_into_a_temp_someone_made_first(tmp_path: Path) -> None:
    """Another user pre-creates the temp name in a shared DEST (/tmp): the file fails, their
    file gets none of our bytes (O_CREAT|O_EXCL, not O_TRUNC)."""
    from launcher.nodeside import cpnode

    root = tmp_path / "dest"
    root.mkdir()
    name = os.path.basename(cpl.temp_name(str(root / "secret"), "0123456789abcdef"))
    planted = root / name
    planted.write_text("")
    os.chmod(planted, 0o666)
    stream = tmp_path / "stdin.bin"
    stream.write_bytes(b"token\x01")
    u = cpnode.Unpacker(cpnode.Input(os.open(stream, os.O_RDONLY)), idle=2.0)
    res = u.apply({"root": str(root),
                   "files": [["secret", 5, 0o600, None, 1_600_000_000, name]]})
    assert res["sent"] == 0 and res["errors"], res
    assert not (root / "secret").exists()
    assert not planted.exists() or planted.read_text() == ""
