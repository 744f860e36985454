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
from launcher.decide import copyplan as cpl
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
