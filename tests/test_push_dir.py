"""dtrain image push --via DIR: the node-side check of the archive's directory
(launcher/nodeside/pushdir.py, docs/containers.md, docs/security.md; issue 50).

c8e93c7 checked the last directory alone (``[ -O DIR ]`` and no group/other write bit). A
parent that belongs to another user passed, and that user can rename the checked directory
away and put one of theirs, holding their archive, in its place before the node's
``podman load`` reads it: ``test_the_old_check_let_another_users_parent_swap_the_archive``
does exactly that as a second local user (dtrain-intruder). The check now walks every
directory from ``/`` down (OpenSSH's rule for ~/.ssh) and refuses that path, naming the
parent and its owner.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.nodeside import pushdir, wire
from tests.test_private import INTRUDER, as_intruder

# c8e93c7's marker step, verbatim but for the quoting (launcher/commands/image.py then)
OLD_CHECK = ("umask 077 && mkdir -p -- \"$1\" || exit 0; "
             "if [ ! -O \"$1\" ] || [ -n \"$(find \"$1\" -maxdepth 0 -perm /022)\" ]; then "
             "echo unsafe; exit 0; fi; exit 0")


def old_check(directory: Path) -> bool:
    """True when c8e93c7's check let ``directory`` pass."""
    out = subprocess.run(["sh", "-c", OLD_CHECK, "sh", str(directory)], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return out.strip() != "unsafe"


def check(path: str | Path, uid: int | None = None, make: bool = False) -> str | None:
    why, fd = pushdir.open_private_dir(str(path), os.geteuid() if uid is None else uid, make)
    if fd is not None:
        os.close(fd)
    return why


@pytest.fixture
def under_tmp() -> Iterator[Path]:
    """A fresh directory straight under /tmp (tmp_path's parents are 0700: no other user
    could reach into them)."""
    d = Path("/tmp") / f"dtrain-pushdir-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_old_check_let_another_users_parent_swap_the_archive(intruder, under_tmp: Path
                                                                  ) -> None:
    """/tmp/X is dtrain-intruder's, /tmp/X/Y this user's, 0700. c8e93c7's check passed Y;
    the intruder then renamed Y away and made a Y of theirs with their archive in it, and
    the path the node loads from gave the intruder's bytes. The new check refuses the path
    before anything is copied, naming /tmp/X and its owner."""
    x = under_tmp / "X"
    x.mkdir(mode=0o755)
    os.chown(x, intruder.pw_uid, intruder.pw_gid)
    y = x / "Y"
    y.mkdir(mode=0o700)
    archive = y / "dtrain-image-0123456789ab.tar"
    assert old_check(y)  # the hole: passed
    why = check(y)
    assert why == (f"{x} belongs to {INTRUDER} (uid {intruder.pw_uid}), who could rename "
                   "what lies below it and put a directory of their own in its place "
                   f"(on the way to {y})")
    # what the old check let happen, between the check and podman load
    swap = as_intruder(
        "import os, sys\n"
        "y = sys.argv[1]\n"
        "os.rename(y, y + '.gone')\n"
        "os.mkdir(y, 0o755)\n"
        "open(os.path.join(y, sys.argv[2]), 'w').write('the intruder archive')\n",
        str(y), archive.name)
    out, err = swap.communicate(timeout=30)
    assert swap.returncode == 0, err
    assert archive.read_text() == "the intruder archive"
    assert archive.stat().st_uid == intruder.pw_uid
    assert old_check(y) is False  # once swapped, the old check would see it; too late
    assert "belongs to" in (check(y) or "")


def test_a_sticky_parent_is_fine_but_another_users_directory_in_it_is_not(intruder,
                                                                          under_tmp: Path
                                                                          ) -> None:
    """/tmp itself (root's, 1777) is on the way to every --via under it: others cannot
    rename what they do not own there. A directory in it of the intruder's, or one of
    theirs with the sticky bit (they own it: they rename what they like), is refused; a
    symbolic link of theirs that points at the user's own directory too (they could point it
    elsewhere)."""
    assert stat.S_IMODE(os.stat("/tmp").st_mode) & stat.S_ISVTX
    mine = under_tmp / "mine"
    mine.mkdir(mode=0o700)
    assert check(mine) is None
    theirs = under_tmp / "theirs"
    theirs.mkdir(mode=0o1777)
    os.chown(theirs, intruder.pw_uid, intruder.pw_gid)
    (theirs / "d").mkdir(mode=0o700)
    assert old_check(theirs / "d")
    assert (check(theirs / "d") or "").startswith(f"{theirs} belongs to {INTRUDER}")
    link = under_tmp / "link"
    link.symlink_to(mine)
    os.lchown(link, intruder.pw_uid, intruder.pw_gid)
    assert not old_check(link)  # refused then too, by luck: find saw the link's own mode 777
    assert check(link) == (f"{link} is a symbolic link of {INTRUDER} (uid "
                           f"{intruder.pw_uid})'s, who could point it elsewhere")


def test_the_walk_from_the_root(tmp_path: Path) -> None:
    """Without a second user: the rule on this user's own tree (as root, or as anyone,
    ``uid`` chosen so that the tree is another's)."""
    me = os.geteuid()
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    # made on the way, 0700, and this user's
    deep = base / "a" / "b"
    assert check(deep, make=True) is None
    assert stat.S_IMODE(deep.stat().st_mode) == 0o700
    assert stat.S_IMODE((base / "a").stat().st_mode) == 0o700
    # the directory itself writable by its group: refused, as before
    (base / "g").mkdir()
    os.chmod(base / "g", 0o770)
    assert check(base / "g") == (f"{base}/g is not this user's alone ({check_owner(me)}'s, "
                                 "mode 770)")
    # a parent writable by its group, not sticky: refused (its group could swap what is in)
    os.chmod(base, 0o775)
    assert (check(deep) or "").startswith(f"{base} is writable by its group (mode 775, not "
                                          "sticky)")
    os.chmod(base, 0o1775)
    assert check(deep) is None
    os.chmod(base, 0o755)
    # links of the user's are followed, and so is .., on the physical path
    (base / "to-a").symlink_to("a")
    assert check(base / "to-a" / "b") is None
    assert check(f"{base}/to-a/b/../b") is None
    (base / "file").write_text("")
    assert check(base / "file") == f"{base}/file is not a directory"
    assert check(base / "missing") == f"{base}/missing does not exist"
    # the same tree as another uid's: the first directory of this user's on the way
    if me != 0:
        why = check(deep, uid=me + 1) or ""
        assert "belongs to" in why and why.endswith(f"(on the way to {deep})")


def check_owner(uid: int) -> str:
    return pushdir._whose(uid)


def test_prepare_writes_the_marker_once_and_the_program_runs_as_shipped(tmp_path: Path
                                                                        ) -> None:
    """The marker step: the directory made, the marker created exclusively (a second node
    sharing it leaves the first one's index); run as the node runs it (wire's bootstrap,
    python3 -I -S, the spec on stdin) it prints one JSON line."""
    d = tmp_path / "images"
    assert pushdir.prepare({"dir": str(d), "marker": ".m", "index": 3}) == {"ok": True}
    assert pushdir.prepare({"dir": str(d), "marker": ".m", "index": 5}) == {"ok": True}
    assert (d / ".m").read_text() == "3\n"
    os.chmod(d, 0o777)
    done = subprocess.run(["sh", "-c", wire.remote_command("python3", stdlib_only=True)],
                          input=wire.payload(wire.program_source("pushdir"),
                                             {"dir": str(d), "marker": ".n", "index": 1}),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.decode().strip())
    assert answer["unsafe"].startswith(f"{d} is not this user's alone")
    assert not (d / ".n").exists()
