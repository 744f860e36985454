"""cpnode.py's unpack mode (`dtrain cp`'s push of a tree as one stream), run locally.

Two levels, no cluster (tests/test_cp.py does the same on real nodes):
- the node side alone: an ``Unpacker`` fed from a file as its stdin, with the ops the
  launcher sends (path traversal refused, a truncated stream leaves no temp);
- the launcher's ``push_node`` through a LocalConnection: the node program is shipped and
  started exactly as over SSH, and the result is checked file by file (delta decisions).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from launcher.commands import cp
from launcher.commands.cp.view import CopyView
from launcher.decide.copies import copyplan as cpl
from launcher.models import CopyResult, Host
from launcher.nodeside import cpnode
from launcher.transports.local import LocalConnection

TOKEN = "abcd1234"


def unpacker(tmp_path: Path, data: bytes) -> cpnode.Unpacker:
    stream = tmp_path / "stdin.bin"
    stream.write_bytes(data)
    fd = os.open(stream, os.O_RDONLY)
    return cpnode.Unpacker(cpnode.Input(fd), idle=2.0)


def tmpname(root: Path, rel: str) -> str:
    return os.path.basename(cpl.temp_name(str(root / rel), TOKEN))


def file_row(root: Path, rel: str, size: int) -> list[Any]:
    return [rel, size, 0o644, None, 1_600_000_000, tmpname(root, rel)]


def temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if cpl.is_temp(p.name)]


# ---------------------------------------------------------------- the node side


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/x", "./x", "a//x", "a/."])
def test_a_path_leaving_the_root_is_refused(tmp_path: Path, rel: str) -> None:
    root = tmp_path / "dest"
    (root / "a").mkdir(parents=True)
    u = unpacker(tmp_path, b"evil\x01ok\x01")
    res = u.apply({"root": str(root), "files": [file_row(root, rel, 4),
                                                file_row(root, "good", 2)],
                   "mkdirs": [rel], "delete": [[rel, "file"]], "links": [[rel, "t", "x"]]})
    assert [e[1] for e in res["errors"]] and all("refused" in e[1] for e in res["errors"])
    assert len(res["errors"]) == 4
    assert not (tmp_path / "x").exists() and not Path("/etc/x").exists()
    # the refused file's bytes were consumed: the next file is intact
    assert (root / "good").read_bytes() == b"ok" and res["sent"] == 1
    assert temps(tmp_path) == []


def test_nothing_is_written_or_removed_through_a_symlink(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("p")
    (root / "esc").symlink_to(outside)
    u = unpacker(tmp_path, b"evil\x01")
    res = u.apply({"root": str(root), "files": [file_row(root, "esc/precious", 4)],
                   "delete": [["esc/precious", "file"]], "mkdirs": ["esc/d"],
                   "fix_attrs": [["esc/precious", 0o777, 1]]})
    assert len(res["errors"]) == 4, res
    assert all("not a directory" in e[1] for e in res["errors"])
    assert (outside / "precious").read_text() == "p"
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert oct((outside / "precious").stat().st_mode & 0o777) != oct(0o777)


def test_a_temp_name_must_be_a_dtrain_temp_in_the_files_directory(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    root.mkdir()
    u = unpacker(tmp_path, b"x\x01")
    res = u.apply({"root": str(root), "files": [["f", 1, 0o644, None, 1, "../../x.tmp"]]})
    assert res["sent"] == 0 and "not a dtrain cp temp name" in res["errors"][0][1]
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("name", [".dtrain-cp-x/../../../evil.tmp", ".dtrain-cp-x/evil.tmp"])
def test_a_temp_name_with_a_slash_is_refused_although_it_looks_like_one(
        tmp_path: Path, name: str) -> None:
    """Prefix and suffix are right, so only the '/' guard stands between the name and a
    write outside the file's directory."""
    root = tmp_path / "dest"
    (root / ".dtrain-cp-x").mkdir(parents=True)
    u = unpacker(tmp_path, b"x\x01x\x01")
    res = u.apply({"root": str(root), "files": [["f", 1, 0o644, None, 1, name]],
                   "links": [["l", "target", name]]})
    assert res["sent"] == 0
    assert [e[1] for e in res["errors"]] == [f"{name}: refused: not a dtrain cp temp name"] * 2
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.name != "stdin.bin") == ["dest", "dest/.dtrain-cp-x"]


@pytest.mark.parametrize("root", ["dest", "", "/tmp/a\0b"])
def test_the_root_must_be_absolute(tmp_path: Path, root: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    u = unpacker(tmp_path, b"x\x01")
    res = u.apply({"root": root, "files": [["f", 1, 0o644, None, 1, tmpname(tmp_path, "f")]],
                   "mkdirs": [""]})
    assert res["sent"] == 0
    assert [e[1] for e in res["errors"]] == [f"{root}: the root must be an absolute path"] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stdin.bin"]


def test_a_nul_in_a_path_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    root.mkdir()
    u = unpacker(tmp_path, b"x\x01")
    res = u.apply({"root": str(root), "files": [file_row(root, "a\0b", 1)]})
    assert res["sent"] == 0 and "refused: the path leaves" in res["errors"][0][1]


@pytest.mark.parametrize("kind", ["fix_attrs", "dir_attrs"])
def test_modes_and_times_are_never_set_through_a_symlinked_leaf(tmp_path: Path,
                                                                kind: str) -> None:
    """The leaf itself a symlink (its directory checked, its name a link to a file outside):
    chmod and utime would follow it, so it is refused and the target keeps its mode and
    mtime."""
    root = tmp_path / "dest"
    root.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("o")
    os.chmod(outside, 0o600)
    os.utime(outside, (1_000_000, 1_000_000))
    (root / "leaf").symlink_to(outside)
    (root / "plain").write_text("p")
    u = unpacker(tmp_path, b"")
    res = u.apply({"root": str(root), kind: [["leaf", 0o777, 1_600_000_000],
                                             ["plain", 0o640, 1_600_000_000]]})
    assert res["errors"] == [["", f"{root}/leaf: refused: a symlink on this node"]]
    st = outside.stat()
    assert (st.st_mode & 0o777, int(st.st_mtime)) == (0o600, 1_000_000)
    st = (root / "plain").stat()
    assert (st.st_mode & 0o777, int(st.st_mtime)) == (0o640, 1_600_000_000)


def test_a_truncated_stream_leaves_no_temp(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    root.mkdir()
    ops = json.dumps({"op": "apply", "root": str(root),
                      "files": [file_row(root, "a", 3), file_row(root, "b", 1000)]})
    u = unpacker(tmp_path, ops.encode() + b"\nabc\x01" + b"b" * 500)  # then EOF
    out = io.StringIO()
    real = cpnode.sys.stdout
    cpnode.sys.stdout = out
    try:
        status = u.serve(timeout=2.0)
    finally:
        cpnode.sys.stdout = real
    assert status == 1
    assert "ended 500 bytes early" in json.loads(out.getvalue())["fatal"]
    assert sorted(p.name for p in root.iterdir()) == ["a"]  # a landed; b never appeared


def test_a_file_the_launcher_could_not_read_is_dropped(tmp_path: Path) -> None:
    root = tmp_path / "dest"
    root.mkdir()
    u = unpacker(tmp_path, b"\x00\x00\x00\x00ok\x01")
    res = u.apply({"root": str(root), "files": [file_row(root, "bad", 3),
                                                file_row(root, "good", 2)]})
    assert res["sent"] == 1 and res["errors"] == []
    assert sorted(p.name for p in root.iterdir()) == ["good"]


# ---------------------------------------------------------------- launcher + node, locally


def make_src(src: Path) -> None:
    (src / "sub dir").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub dir" / "é ü.txt").write_text("unicode\n")
    (src / "run.sh").write_text("#!/bin/sh\necho run\n")
    (src / "run.sh").chmod(0o750)
    (src / "link").symlink_to("run.sh")
    (src / "big.bin").write_bytes(os.urandom((1 << 20) + 5))  # above SMALL_MAX: chunked


class StreamOnly(LocalConnection):
    """A node without SFTP: a push that works went through the node program."""

    async def files(self) -> Any:
        raise AssertionError("the push used SFTP")


def push(src: Path, dest: str, *, sftp: bool = False, bcast: bool = False,
         **kw: Any) -> CopyResult:
    req = cp.CopyRequest(sources=(str(src),), dest=dest, recursive=True, progress=False,
                         broadcast=bcast, **kw)
    result = CopyResult("local")

    async def go() -> None:
        sources = await cp.prepare_push(req)
        view = CopyView(1, live=False, out=io.StringIO(), err=io.StringIO())
        conn = (LocalConnection if sftp else StreamOnly)(Host("local"))
        broadcaster = cp.Broadcaster(["local"], len(sources), req, view) if bcast else None
        await cp.push_node(conn, cp.Copy(req, view, sources, bcast=broadcaster), result)

    asyncio.run(go())
    return result


def same(src: Path, dst: Path) -> None:
    for p in src.rglob("*"):
        q = dst / p.relative_to(src)
        assert q.is_symlink() == p.is_symlink(), q
        if p.is_symlink():
            assert os.readlink(q) == os.readlink(p)
        elif p.is_file():
            assert q.read_bytes() == p.read_bytes(), q
            assert int(q.stat().st_mtime) == int(p.stat().st_mtime)
            assert q.stat().st_mode & 0o7777 == p.stat().st_mode & 0o7777, q


def test_push_then_delta_then_delete_locally(tmp_path: Path) -> None:
    src = tmp_path / "proj"
    make_src(src)
    dest = tmp_path / "dest"
    first = push(src, f"{dest}/", preserve=True)
    assert first.errors == [] and (first.sent, first.skipped) == (5, 0), first
    same(src, dest / "proj")
    again = push(src, f"{dest}/", preserve=True)
    assert (again.sent, again.sent_bytes, again.skipped) == (0, 0, 5), again
    (src / "a.txt").write_text("alpha, longer\n")
    (dest / "proj" / "extra").write_text("x")
    (dest / "proj" / ".dtrain-cp-dead-a.txt.tmp").write_text("stale")
    third = push(src, f"{dest}/", delete=True)
    assert (third.sent, third.skipped, third.deleted, third.stale) == (1, 4, 1, 1), third
    assert third.sent_bytes == len("alpha, longer\n")
    same(src, dest / "proj")
    assert temps(dest) == []


def test_checksum_compares_on_the_node(tmp_path: Path) -> None:
    src = tmp_path / "proj"
    make_src(src)
    dest = tmp_path / "dest"
    assert push(src, f"{dest}/").errors == []
    on_node = dest / "proj" / "a.txt"
    st = on_node.stat()
    on_node.write_text("ALPHA\n")  # same size and mtime
    os.utime(on_node, (st.st_atime, st.st_mtime))
    assert push(src, f"{dest}/").sent == 0
    summed = push(src, f"{dest}/", checksum=True)
    assert (summed.sent, summed.skipped) == (1, 4), summed
    assert on_node.read_text() == "alpha\n"


def test_missing_python_falls_back_to_sftp_path(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "proj"
    make_src(src)
    dest = tmp_path / "dest"
    res = push(src, f"{dest}/", python="/nonexistent/python3", sftp=True)
    assert res.errors == [] and res.sent == 5
    assert "copying over SFTP instead" in capsys.readouterr().err
    same(src, dest / "proj")


def test_drop_removes_only_dtrain_temps(tmp_path: Path) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("k")
    temp = tmp_path / ".dtrain-cp-abcd1234-big.bin.tmp"
    temp.write_text("t")
    u = unpacker(tmp_path, b"")
    out = u.handle({"op": "drop", "paths": [str(keep), str(temp), "relative.dtrain-cp-x.tmp"]})
    assert out == {"dropped": 1} and keep.exists() and not temp.exists()


def test_drop_refuses_a_relative_path_even_to_a_temp(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path would be resolved against the node program's working directory: only
    absolute paths are dropped (this name passes every other check)."""
    monkeypatch.chdir(tmp_path)
    temp = tmp_path / ".dtrain-cp-abcd1234-big.bin.tmp"
    temp.write_text("t")
    u = unpacker(tmp_path, b"")
    out = u.handle({"op": "drop", "paths": [temp.name, f"./{temp.name}"]})
    assert out == {"dropped": 0} and temp.exists()


def test_large_files_handed_back_by_the_broadcaster_go_in_a_second_apply(
        tmp_path: Path) -> None:
    src = tmp_path / "proj"
    make_src(src)
    dest = tmp_path / "dest"
    # one node, a localhost one: no chain; big.bin (> 1 MiB) is handed back and sent
    res = push(src, f"{dest}/", bcast=True, broadcast_min=1 << 20, preserve=True)
    assert res.errors == [] and res.sent == 5, res
    same(src, dest / "proj")
    assert temps(dest) == []


# ---------------------------------------------------------------- the node side, whole
# cpnode's in-process functions compared whole (issue #25, the mutation score of cpnode.py):
# the tree rows, the diff, every refusal's words, each op's answer and the serve loop's.


def _serve(u: cpnode.Unpacker, timeout: float) -> tuple[int, list[Any]]:
    out = io.StringIO()
    real = cpnode.sys.stdout
    cpnode.sys.stdout = out
    try:
        rc = u.serve(timeout)
    finally:
        cpnode.sys.stdout = real
    return rc, [json.loads(line) for line in out.getvalue().splitlines()]


def test_walk_rows_whole(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "d").mkdir(parents=True)
    (root / "a").write_bytes(b"abc")
    os.chmod(root / "a", 0o640)
    (root / "d" / "b").write_bytes(b"12345")
    os.symlink("../a", root / "d" / "l")
    os.mkfifo(root / "p")
    os.chmod(root / "d", 0o750)
    for i, rel in enumerate(["a", "d/b", "d", ""]):
        os.utime(root / rel, (1_600_000_000 + i, 1_600_000_000 + i))
    rows = cpnode.walk_tree(str(root))
    link_mtime = int(os.lstat(root / "d" / "l").st_mtime)
    fifo_mtime = int(os.lstat(root / "p").st_mtime)
    assert rows[0] == ["", "dir", 0, 1_600_000_003, 0o755, ""]
    assert sorted(rows[1:]) == [
        ["a", "file", 3, 1_600_000_000, 0o640, ""],
        ["d", "dir", 0, 1_600_000_002, 0o750, ""],
        ["d/b", "file", 5, 1_600_000_001, 0o644, ""],
        ["d/l", "link", 0, link_mtime, 0o777, "../a"],
        ["p", "other", 0, fifo_mtime, 0o644, ""]]
    assert cpnode.walk_tree(str(tmp_path / "none")) == []
    assert cpnode.walk_tree(str(root / "a")) == [["", "file", 3, 1_600_000_000, 0o640, ""]]
    assert cpnode.walk_tree(str(root / "d" / "l")) == [["", "link", 0, link_mtime, 0o777, "../a"]]
    assert [cpnode.is_temp(n) for n in (".dtrain-cp-1-x.tmp", "a/.dtrain-cp-1.tmp",
                                         "a/b/.dtrain-cp-1.tmp", ".dtrain-cp-1.tmp/x",
                                         "dtrain-cp-1.tmp", ".dtrain-cp-1.tmpx")] == [
        True, True, True, False, False, False]


def test_diff_rows_whole() -> None:
    have = [["", "dir", 0, 1, 0o755, ""], ["a", "file", 3, 5, 0o644, ""],
            ["b", "file", 1, 5, 0o644, ""], ["c", "link", 0, 5, 0o777, "x"],
            ["x/.dtrain-cp-1-y.tmp", "file", 1, 1, 0o600, ""], ["e", "file", 1, 1, 0o644, ""]]
    rows = [["", "dir", None, None, None, None], ["a", "file", 3, 5, None, ""],
            ["b", "file", 2, 5, 0o644, ""], ["c", "link", 0, None, None, "y"],
            ["m", "file", 1, 1, 1, ""], ["n", "dir", 0, 0, 0, ""]]
    differ = [["b", "file", 1, 5, 0o644, ""], ["c", "link", 0, 5, 0o777, "x"]]
    temp = ["x/.dtrain-cp-1-y.tmp", "file", 1, 1, 0o600, ""]
    assert cpnode.diff_rows(have, rows, False) == {"differ": differ, "missing": ["m", "n"],
                                                   "extra": [temp]}
    assert cpnode.diff_rows(have, rows, True) == {
        "differ": differ, "missing": ["m", "n"],
        "extra": [temp, ["e", "file", 1, 1, 0o644, ""]]}


def test_every_refusal_of_a_path_whole(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "d").mkdir(parents=True)
    (root / "a").write_bytes(b"x")
    os.symlink("../a", root / "d" / "l")
    u = unpacker(tmp_path, b"")
    r = str(root)

    def refused(root_: str, rel: str) -> str:
        with pytest.raises(cpnode.Unsafe) as err:
            u.path(root_, rel, set())
        return str(err.value)

    assert refused("rel", "a") == "rel: the root must be an absolute path"
    assert refused("/x\0", "a") == "/x\0: the root must be an absolute path"
    assert refused(r, "a\0") == f"a\0: refused: the path leaves {r}"
    assert refused(r, "a/x") == (f"a/x: refused: {r}/a is not a directory (a symlink is never "
                                 "followed)")
    assert refused(r, "d/l/x") == (f"d/l/x: refused: {r}/d/l is not a directory (a symlink is "
                                   "never followed)")
    assert refused(r, "q/x") == f"{r}/q: no such file or directory"
    assert u.path(r, "", set()) == r and u.path(r, "d/b", set()) == f"{r}/d/b"
    # a directory made in this op is not looked up again
    dirs = {f"{r}/q"}
    assert u.path(r, "q/x", dirs) == f"{r}/q/x" and dirs == {f"{r}/q"}
    with pytest.raises(cpnode.Unsafe) as err:  # below a known directory: still looked up
        u.path(r, "q/x/y", dirs)
    assert str(err.value) == f"{r}/q/x: no such file or directory"
    made: set[str] = set()
    u.path(r, "d/x", made)
    assert made == {f"{r}/d"}
    assert u.temp("/r/d/f", ".dtrain-cp-1-f.tmp") == "/r/d/.dtrain-cp-1-f.tmp"
    for bad in (".dtrain-cp-1-f", "x.tmp", "a/.dtrain-cp-1.tmp"):
        with pytest.raises(cpnode.Unsafe) as err:
            u.temp("/r/f", bad)
        assert str(err.value) == f"{bad}: refused: not a dtrain cp temp name"


def test_an_apply_s_counts_and_errors_whole(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / ".dtrain-cp-00-x.tmp").write_bytes(b"")
    (root / "d2").mkdir()
    (root / "full").mkdir()
    (root / "full" / "f").write_bytes(b"")
    (root / "a").write_bytes(b"old")
    (root / "was").write_bytes(b"")
    os.symlink("a", root / "l")
    u = unpacker(tmp_path, b"hello\x01")
    res = u.apply({
        "root": str(root), "stale": [".dtrain-cp-00-x.tmp", ".dtrain-cp-00-gone.tmp"],
        "delete": [["gone", "file"], ["d2", "dir"], ["full", "dir"], ["a", "file"]],
        "unlink_first": ["was"], "mkdirs": ["was", "new", "new/sub"],
        "files": [["new/f", 5, 0o600, 0o640, 1_600_000_000, ".dtrain-cp-01-f.tmp"]],
        "links": [["new/ln", "../x", ".dtrain-cp-02-ln.tmp"]],
        "fix_attrs": [["new/f", None, 1_600_000_001], ["l", 0o600, 1]],
        "dir_attrs": [["new", 0o700, 1_600_000_002], ["", None, 1_600_000_003]]})
    r = str(root)
    assert res == {"sent": 2, "sent_bytes": 5, "deleted": 2, "stale": 1, "errors": [
        [f"{r}/.dtrain-cp-00-gone.tmp", "no such file or directory"],
        [f"{r}/gone", "no such file or directory"], [f"{r}/full", "directory not empty"],
        ["", f"{r}/l: refused: a symlink on this node"]]}
    st = {str(p.relative_to(root)): os.lstat(p) for p in root.rglob("*")}
    assert sorted(st) == ["full", "full/f", "l", "new", "new/f", "new/ln", "new/sub", "was"]
    assert (st["new/f"].st_mode & 0o7777, int(st["new/f"].st_mtime)) == (0o640, 1_600_000_001)
    assert (root / "new" / "f").read_bytes() == b"hello"
    assert (st["new"].st_mode & 0o7777, int(st["new"].st_mtime)) == (0o700, 1_600_000_002)
    assert int(os.stat(root).st_mtime) == 1_600_000_003
    assert os.readlink(root / "new" / "ln") == "../x" and (root / "was").is_dir()
    assert os.readlink(root / "l") == "a"


def test_each_op_s_answer_whole(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "d").mkdir(parents=True)
    (root / "a").write_bytes(b"abc")
    os.symlink("a", root / "l")
    u = unpacker(tmp_path, b"")
    assert u.handle({"op": "stat", "path": str(root / "a")}) == {"kind": "file"}
    assert u.handle({"op": "stat", "path": str(root / "d")}) == {"kind": "dir"}
    assert u.handle({"op": "stat", "path": str(root / "l")}) == {"kind": "file"}  # followed
    assert u.handle({"op": "stat", "path": str(root / "none")}) == {"kind": None}
    abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256("abc")
    assert u.handle({"op": "hash", "paths": [str(root / "a"), str(root / "none")]}) == {
        "sha256": {str(root / "a"): abc, str(root / "none"): None}}
    assert u.handle({"op": "hash"}) == {"sha256": {}}
    assert u.handle({"op": "mkdir", "path": str(root / "m" / "n")}) == {}
    assert (root / "m" / "n").is_dir()
    assert u.handle({"op": "mkdir", "path": str(root / "m" / "n")}) == {}  # already there
    assert u.handle({"op": "walk", "root": str(root / "m")})["tree"][1][:2] == ["n", "dir"]
    assert u.handle({"op": "diff", "root": str(root / "m"), "rows": []}) == {
        "differ": [], "missing": [], "extra": []}
    assert u.handle({"op": "diff", "root": str(root / "m"), "all_extras": 1})["extra"][1][0] \
        == "n"
    assert u.handle({"op": "diff", "root": str(root / "m"), "rows": [
        ["", "dir", None, None, None, None], ["n", "dir", None, None, None, None],
        ["o", "file", 1, 1, 0o644, ""]]}) == {"differ": [], "missing": ["o"], "extra": []}
    assert u.handle({"op": "drop"}) == {"dropped": 0}
    for name in (".dtrain-cp-1-a.tmp", ".dtrain-cp-2-b.tmp", "keep"):
        (root / name).write_bytes(b"")
    drop = [str(root / n) for n in (".dtrain-cp-1-a.tmp", ".dtrain-cp-2-b.tmp", "keep",
                                     ".dtrain-cp-3-gone.tmp")]
    assert u.handle({"op": "drop", "paths": [*drop, ".dtrain-cp-4-rel.tmp"]}) == {"dropped": 2}
    assert sorted(p.name for p in root.iterdir()) == ["a", "d", "keep", "l", "m"]
    for op in ({"op": "x"}, {}):
        with pytest.raises(ValueError) as err:
            u.handle(op)
        assert str(err.value) == f"unknown op {op.get('op')!r}"


def test_the_serve_loop_answers_each_line_and_a_broken_stream_is_fatal(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    lines = [b"", b"   ", json.dumps({"op": "stat", "path": str(root)}).encode(), b"not json",
             b'{"op": "walk"}', b'{"op": "x"}']
    assert _serve(unpacker(tmp_path, b"\n".join(lines) + b"\n"), 1.0) == (0, [
        {"kind": "dir"}, {"error": "Expecting value: line 1 column 1 (char 0)"},
        {"error": "'root'"}, {"error": "unknown op 'x'"}])
    link = json.dumps({"op": "apply", "root": str(root),
                       "links": [["ln", "../x", ".dtrain-cp-05-ln.tmp"]]}).encode()
    assert _serve(unpacker(tmp_path, link + b"\n"), 1.0) == (0, [
        {"sent": 1, "sent_bytes": 0, "deleted": 0, "stale": 0, "errors": []}])
    assert os.readlink(root / "ln") == "../x"
    os.unlink(root / "ln")
    short = json.dumps({"op": "apply", "root": str(root), "files": [
        ["z", 10, 0o600, None, 1, ".dtrain-cp-03-z.tmp"]]}).encode() + b"\nabc"
    assert _serve(unpacker(tmp_path, short), 1.0) == (
        1, [{"fatal": "the launcher's stream ended 7 bytes early"}])
    assert os.listdir(root) == []  # the temp is gone
    r, w = os.pipe()
    try:
        assert _serve(cpnode.Unpacker(cpnode.Input(r), idle=0.2), 0.2) == (
            1, [{"fatal": "nothing from the launcher for 0.2 s (waiting for the next operation)"}])
        os.write(w, short)
        assert _serve(cpnode.Unpacker(cpnode.Input(r), idle=0.2), 5.0) == (
            1, [{"fatal": "nothing from the launcher for 0.2 s (in the middle of a file)"}])
    finally:
        os.close(r)
        os.close(w)
    assert os.listdir(root) == []


def test_receive_s_errors_keep_the_stream_in_step(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each failure of one file is that file's error, its bytes are still consumed, and the
    next file arrives whole; the counts add up over several files."""
    import errno

    root = tmp_path / "r"
    (root / "busy" / "x").mkdir(parents=True)
    (root / "d").mkdir()
    taken = root / ".dtrain-cp-02-taken.tmp"
    taken.write_bytes(b"someone else's")
    for n in (".dtrain-cp-00-a.tmp", ".dtrain-cp-00-b.tmp"):
        (root / n).write_bytes(b"")
    data = b"abc\x01" + b"1234\x01" + b"zz\x01" + b"full\x01" + b"q\x01" + b"xy\x01"
    u = unpacker(tmp_path, data)
    r = str(root)
    real_write = os.write
    full: list[int] = []

    def write(fd: int, buf: Any) -> int:
        if fd in full:  # once: receive closes it, and the number is reused
            full.remove(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, buf)

    real_open = os.open

    def open_(path: Any, flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        if str(path).endswith("-full.tmp"):
            full.append(fd)
        return fd

    monkeypatch.setattr(cpnode.os, "write", write)
    monkeypatch.setattr(cpnode.os, "open", open_)
    res = u.apply({"root": r, "stale": [".dtrain-cp-00-a.tmp", ".dtrain-cp-00-b.tmp"],
                   "mkdirs": [""], "files": [
        ["one", 3, 0o600, None, 1_500_000_000, ".dtrain-cp-01-one.tmp"],
        ["taken", 4, 0o600, None, 1, ".dtrain-cp-02-taken.tmp"],
        ["../out", 2, 0o600, None, 1, ".dtrain-cp-03-out.tmp"],
        ["full", 4, 0o600, None, 1, ".dtrain-cp-04-full.tmp"],
        ["busy", 1, 0o600, None, 1, ".dtrain-cp-05-busy.tmp"],
        ["d/two", 2, 0o600, None, 1_500_000_001, ".dtrain-cp-06-two.tmp"]]})
    monkeypatch.undo()
    assert res == {"sent": 2, "sent_bytes": 5, "deleted": 0, "stale": 2, "errors": [
        [r, "file exists"],
        [str(taken), "file exists"],
        ["", f"../out: refused: the path leaves {r}"],
        [f"{r}/.dtrain-cp-04-full.tmp", "no space left on device"],
        [f"{r}/busy", "is a directory"]]}
    assert (root / "one").read_bytes() == b"abc" and (root / "d" / "two").read_bytes() == b"xy"
    assert int(os.stat(root / "one").st_mtime) == 1_500_000_000
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(root / "one").st_mode & 0o777 == 0o600 & ~umask  # created with its bits
    assert int(os.stat(root / "d" / "two").st_mtime) == 1_500_000_001
    # none of our bytes went into the temp someone else made (whether it is removed after
    # is test_the_node_never_writes_into_a_temp_someone_made_first's)
    assert not taken.exists() or taken.read_bytes() == b"someone else's"
    assert sorted(p.name for p in root.iterdir() if p != taken) == ["busy", "d", "one"]


def test_the_root_is_made_with_its_parents_the_rest_one_level_each(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "root"
    u = unpacker(tmp_path, b"")
    assert u.apply({"root": str(root), "mkdirs": ["", "d"]})["errors"] == []
    assert (root / "d").is_dir()
