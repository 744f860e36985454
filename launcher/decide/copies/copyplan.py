"""Pure decisions of `dtrain cp`: where each source lands, and what to send, skip or delete.

Nothing here touches a file or a socket. The command (``commands/cp/``) lists the source
tree and the destination tree into ``Entry`` records, asks ``plan_sync`` what to do, and
does it. The same functions serve push (local → node) and pull (node → local).

Decisions (docs/cp.md):

* Paths on the node: ``~`` and ``~/x`` are the remote home, a relative path is relative to
  the home (as scp), an absolute path is used as is. ``~user`` is refused.
* Layout (cp/pdcp semantics, decided per node because DEST may exist on one node only):
  DEST is a directory when it exists as one, ends with ``/``, or there are several
  sources; each source then lands at ``DEST/<basename>``. Otherwise the one source
  becomes DEST itself.
* Delta: a file is skipped when size and mtime (whole seconds) match; with ``checksum`` a
  file whose size matches is compared by sha256 instead. File mtimes are always carried
  over (the delta check needs them); ``preserve`` adds permission bits and directory mtimes.
* Symlinks are links on both sides, compared by target; never followed below a root, so a
  deletion can never leave the destination tree.
* A temp file is ``.dtrain-cp-<token>-<name>.tmp`` in the file's own directory, renamed
  over the final name when complete; the token is random per file (not guessable from
  another temp). Any such name met in a destination tree is a stale temp of an interrupted
  run, removed by the next run.
* What a node lists is not trusted: every name must be one path component (``bad_name``:
  no ``/``, NUL, ``.`` or ``..``), every glob match one of the pattern's own (``bad_match``),
  or the node gets an error and nothing of that listing is acted on.
"""

from __future__ import annotations

import fnmatch
import posixpath
import stat as stat_mod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.models import CopyResult

FILE, DIR, LINK, OTHER = "file", "dir", "link", "other"
TEMP_PREFIX, TEMP_SUFFIX = ".dtrain-cp-", ".tmp"
NAME_MAX = 255
GLOB_CHARS = frozenset("*?[")


class LayoutError(ValueError):
    """The sources cannot land at DEST on this node (a per-node error, not bad input)."""


@dataclass(frozen=True)
class Entry:
    """One file, directory or symlink of a tree, relative to the tree's root ('' = root)."""

    rel: str
    kind: str
    size: int = 0
    mtime: int = 0
    mode: int = 0o644  # permission bits (07777)
    target: str = ""  # a symlink's target

    @staticmethod
    def from_stat(rel: str, st_mode: int, size: int, mtime: float, target: str = "") -> Entry:
        """An entry from lstat fields."""
        if stat_mod.S_ISLNK(st_mode):
            kind = LINK
        elif stat_mod.S_ISDIR(st_mode):
            kind = DIR
        elif stat_mod.S_ISREG(st_mode):
            kind = FILE
        else:
            kind = OTHER
        return Entry(rel, kind, size if kind == FILE else 0, int(mtime),
                     stat_mod.S_IMODE(st_mode), target)


@dataclass
class SyncPlan:
    """What to do to make one destination tree match one source tree."""

    mkdirs: list[Entry] = field(default_factory=list)  # parents first
    unlink_first: list[str] = field(default_factory=list)  # non-dirs where a dir must go
    send: list[Entry] = field(default_factory=list)  # files to transfer
    links: list[Entry] = field(default_factory=list)  # symlinks to (re)create
    compare: list[Entry] = field(default_factory=list)  # size equal: decide by sha256
    skip: list[Entry] = field(default_factory=list)
    fix_attrs: list[Entry] = field(default_factory=list)  # content equal, mode/mtime not
    dir_attrs: list[Entry] = field(default_factory=list)  # deepest first (preserve only)
    delete: list[Entry] = field(default_factory=list)  # deepest first
    stale: list[str] = field(default_factory=list)  # temps of an interrupted run
    errors: list[tuple[str, str]] = field(default_factory=list)  # (rel, message)


# ---------------------------------------------------------------- paths


def remote_path(path: str, home: str) -> str:
    """A path as typed for the node → an absolute path there (``~`` = the remote home)."""
    if path == "~" or path.startswith("~/"):
        rest = path[2:]
        return posixpath.normpath(posixpath.join(home, rest)) if rest else home
    if path.startswith("~"):
        raise ValueError(f"{path}: ~user paths are not supported; write the absolute path")
    if not path.startswith("/"):
        return posixpath.normpath(posixpath.join(home, path))
    return posixpath.normpath(path)


def has_glob(path: str) -> bool:
    """Whether a remote path is a pattern the node expands."""
    return any(c in GLOB_CHARS for c in path)


def source_name(path: str) -> str:
    """The name a source gets under a destination directory (cp's basename)."""
    name = posixpath.basename(posixpath.normpath(path.rstrip("/") or "/"))
    if name in ("", ".", ".."):
        raise ValueError(f"{path}: cannot tell the name to copy it under; name the "
                         "directory itself (its absolute path, or ../NAME with its own name)")
    return name


def layout(names: Sequence[str], kinds: Sequence[str], dest: str, dest_kind: str | None,
           *, dest_slash: bool) -> tuple[list[str], bool]:
    """Where each source's root lands on one node: (paths, whether DEST must be created).

    ``dest`` is absolute (``remote_path``); ``dest_kind`` is what the node has there
    (None: nothing); ``dest_slash``: the user wrote DEST with a trailing ``/``.
    """
    as_dir = dest_kind == DIR or dest_slash or len(names) > 1
    if as_dir:
        if dest_kind not in (None, DIR):
            raise LayoutError(f"{dest} exists and is not a directory")
        return [posixpath.join(dest, n) for n in names], dest_kind is None
    if kinds[0] == DIR and dest_kind not in (None, DIR):
        raise LayoutError(f"{dest} exists and is not a directory; cannot copy a directory "
                          "onto it")
    return [dest], False


def bad_name(name: str) -> str | None:
    """Why ``name``, one entry a node listed in a directory, is not a single path component
    (None when it is one)."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name:
        return "a name with '/'"
    if "\0" in name:
        return "a name with NUL"
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"a name longer than {NAME_MAX} bytes"
    return None


def bad_rel(rel: str) -> str | None:
    """Why ``rel``, a path relative to a tree's root that a node listed ('' = the root), is
    not made of single components (None when it is)."""
    if rel == "":
        return None
    for name in rel.split("/"):
        why = bad_name(name)
        if why:
            return why
    return None


def bad_match(pattern: str, match: str) -> str | None:
    """Why ``match``, a path a node returned for the (absolute) glob ``pattern``, is not one
    of its matches: a plain absolute path as deep as the pattern, equal to it where it has
    no pattern characters and matching it (single components) where it has (None: it is)."""
    if not match.startswith("/") or posixpath.normpath(match) != match:
        return "not a plain absolute path"
    want, got = pattern.split("/"), match.split("/")
    if len(want) != len(got):
        return "not a match of the pattern (another depth)"
    for part, name in zip(want[1:], got[1:], strict=True):
        if has_glob(part):
            why = bad_name(name)
            if why:
                return why
            if not fnmatch.fnmatchcase(name, part):
                return "not a match of the pattern"
        elif part != name:
            return "not a match of the pattern (outside it)"
    return None


def inside(path: str, root: str) -> bool:
    """Whether path is strictly below root (both absolute, normalised)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path != root and path.startswith(root.rstrip("/") + "/")


def join(root: str, rel: str) -> str:
    """root/rel, with '' meaning root itself."""
    return posixpath.join(root, rel) if rel else root


def temp_name(path: str, token: str) -> str:
    """The temp file a transfer writes before renaming it over ``path`` (same directory)."""
    head, name = posixpath.split(path)
    room = NAME_MAX - len(TEMP_PREFIX) - len(token) - 1 - len(TEMP_SUFFIX)
    short = name.encode()[:room].decode(errors="ignore")
    return posixpath.join(head, f"{TEMP_PREFIX}{token}-{short}{TEMP_SUFFIX}")


def is_temp(name: str) -> bool:
    """A temp name of dtrain cp (this run's or an interrupted one's)."""
    base = posixpath.basename(name)
    return base.startswith(TEMP_PREFIX) and base.endswith(TEMP_SUFFIX)


# ---------------------------------------------------------------- the plan


def _depth(rel: str) -> int:
    return rel.count("/") + 1 if rel else 0


def plan_sync(src: Iterable[Entry], dst: Mapping[str, Entry], *, checksum: bool = False,
              delete: bool = False, preserve: bool = False) -> SyncPlan:
    """What to do so the destination tree ``dst`` matches the source tree ``src``.

    ``dst`` maps rel → entry for what already exists under the destination root (empty when
    the root does not exist). Entries of kind OTHER (sockets, devices) are reported, not sent.
    """
    plan = SyncPlan()
    wanted: set[str] = set()
    for e in sorted(src, key=lambda e: (_depth(e.rel), e.rel)):
        wanted.add(e.rel)
        have = dst.get(e.rel)
        if e.kind == OTHER:
            plan.errors.append((e.rel, "not a regular file, directory or symlink: skipped"))
        elif e.kind == DIR:
            _plan_dir(plan, e, have, preserve)
        elif have is not None and have.kind == DIR:
            plan.errors.append((e.rel, "is a directory on the destination; remove it first"))
        elif e.kind == LINK:
            if have is not None and have.kind == LINK and have.target == e.target:
                plan.skip.append(e)
            else:
                plan.links.append(e)
        else:
            _plan_file(plan, e, have, checksum, preserve)
    plan.stale = sorted(rel for rel in dst if is_temp(rel))
    if delete:
        blocked = {rel for rel, _ in plan.errors}
        extra = [d for rel, d in dst.items()
                 if rel and rel not in wanted and not is_temp(rel)
                 and not any(rel.startswith(b + "/") for b in blocked)]
        plan.delete = sorted(extra, key=lambda d: (-_depth(d.rel), d.rel))
    plan.dir_attrs.sort(key=lambda d: (-_depth(d.rel), d.rel))
    return plan


def _plan_dir(plan: SyncPlan, e: Entry, have: Entry | None, preserve: bool) -> None:
    if have is None or have.kind != DIR:
        if have is not None:
            plan.unlink_first.append(e.rel)
        plan.mkdirs.append(e)
        if preserve:
            plan.dir_attrs.append(e)
    elif preserve and (have.mode != e.mode or have.mtime != e.mtime):
        plan.dir_attrs.append(e)


def _plan_file(plan: SyncPlan, e: Entry, have: Entry | None, checksum: bool,
               preserve: bool) -> None:
    if have is None or have.kind != FILE or have.size != e.size:
        plan.send.append(e)
    elif checksum:
        plan.compare.append(e)
    elif have.mtime == e.mtime:
        plan.skip.append(e)
        if preserve and have.mode != e.mode:
            plan.fix_attrs.append(e)
    else:
        plan.send.append(e)


# ---------------------------------------------------------------- the node-side diff
#
# A re-push mostly finds the destination as the last push left it. Rather than list its
# whole tree back (a row per file, parsed and planned per node), the node compares its tree
# with the source's rows (``manifest_rows``; the same bytes for every node) and answers
# only where it differs (op "diff", cpnode.py). ``tree_from_diff`` turns the answer back
# into the destination tree as plan_sync sees it, so the plan is exactly the one a full
# listing gives: plan_sync reads a destination entry only at a source's path, at temps
# and (with delete) at extras, and of an entry only the fields a manifest row keeps.


def manifest_rows(src: Iterable[Entry], *, preserve: bool) -> list[list[object]]:
    """What a node compares its tree with: ``[rel, kind, size, mtime, mode, target]`` per
    source entry, None where plan_sync does not look (the node matches anything there): a
    file's mode without preserve; a directory's size and target, and its mode and mtime
    without preserve; a link's size, mtime and mode. Not for ``checksum`` (plan_sync's
    compare and resolve_compare read a file's mtime whatever its content)."""
    rows: list[list[object]] = []
    for e in src:
        if e.kind == FILE:
            rows.append([e.rel, FILE, e.size, e.mtime, e.mode if preserve else None, ""])
        elif e.kind == DIR:
            rows.append([e.rel, DIR, None, e.mtime if preserve else None,
                         e.mode if preserve else None, None])
        elif e.kind == LINK:
            rows.append([e.rel, LINK, None, None, None, e.target])
        else:  # never sent (plan_sync reports it): any difference is irrelevant
            rows.append([e.rel, None, None, None, None, None])
    return rows


def tree_from_diff(src: Iterable[Entry], reply: Mapping[str, Any]) -> dict[str, Entry]:
    """The destination tree for plan_sync from a node's diff reply: a source entry the node
    matched stands for its own (equal wherever plan_sync looks); ``differ`` and ``extra``
    rows are the node's entries; ``missing`` paths are absent."""
    tree = {e.rel: e for e in src}
    for rel in reply.get("missing", ()):
        tree.pop(str(rel), None)
    for r in (*reply.get("differ", ()), *reply.get("extra", ())):
        tree[r[0]] = Entry(r[0], r[1], r[2], r[3], r[4], r[5])
    return tree


def resolve_compare(plan: SyncPlan, dst: Mapping[str, Entry], src_sums: Mapping[str, str],
                    dst_sums: Mapping[str, str | None], *, preserve: bool = False) -> None:
    """Settle ``plan.compare`` with sha256 sums: equal content is skipped (its mtime, and
    mode with ``preserve``, fixed), anything else is sent."""
    for e in plan.compare:
        theirs = dst_sums.get(e.rel)
        if theirs is None or theirs != src_sums.get(e.rel):
            plan.send.append(e)
            continue
        plan.skip.append(e)
        have = dst[e.rel]
        if have.mtime != e.mtime or (preserve and have.mode != e.mode):
            plan.fix_attrs.append(e)
    plan.compare = []


def new_mode(e: Entry, preserve: bool) -> int:
    """The mode a sent file is created with: exact with ``preserve``, else the permission
    bits (the receiving side's umask applies, as cp without -p)."""
    return e.mode & 0o7777 if preserve else e.mode & 0o777


# ---------------------------------------------------------------- results



def exit_code(results: Iterable[CopyResult]) -> int:
    """The largest per-node code: 255 when a node was unreachable, else 1 on any error."""
    return max((r.exit_code for r in results), default=0)


def pull_dir(label: str) -> str:
    """A node's directory under LOCALDIR: its label with ``:`` as ``_`` (``127.0.0.1_2222``):
    scp and rsync read ``127.0.0.1:2222/x`` as HOST:PATH."""
    return label.replace(":", "_")


def pull_root(localdir: str, label: str, remote: str) -> str:
    """Where a pulled remote path lands: LOCALDIR/<pull_dir(host label)>/<basename>
    (rpdcp's layout, one directory per node)."""
    return posixpath.join(localdir, pull_dir(label), source_name(remote))
