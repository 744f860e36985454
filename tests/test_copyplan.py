"""decide.copies.copyplan: where sources land and what to send, skip or delete (no I/O)."""

from __future__ import annotations

import pytest

from launcher.decide.copies import copyplan as cpl
from launcher.decide.copies.copyplan import DIR, FILE, LINK, OTHER, Entry
from launcher.models import CopyResult


def f(rel: str, size: int = 3, mtime: int = 100, mode: int = 0o644) -> Entry:
    return Entry(rel, FILE, size, mtime, mode)


def d(rel: str, mode: int = 0o755, mtime: int = 100) -> Entry:
    return Entry(rel, DIR, 0, mtime, mode)


def ln(rel: str, target: str) -> Entry:
    return Entry(rel, LINK, 0, 100, 0o777, target)


def tree(*entries: Entry) -> dict[str, Entry]:
    return {e.rel: e for e in entries}


def rels(entries: list[Entry]) -> list[str]:
    return [e.rel for e in entries]


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize(("typed", "want"), [
    pytest.param("~", "/home/u", id="home"),
    pytest.param("~/", "/home/u", id="home-slash"),
    pytest.param("~/a/b", "/home/u/a/b", id="under-home"),
    pytest.param("data/x", "/home/u/data/x", id="relative-is-home"),
    pytest.param("/srv/x/", "/srv/x", id="absolute"),
    pytest.param("/srv/../etc", "/etc", id="normalised"),
])
def test_remote_path(typed: str, want: str) -> None:
    assert cpl.remote_path(typed, "/home/u") == want


def test_remote_path_refuses_other_users_home() -> None:
    with pytest.raises(ValueError, match="~user"):
        cpl.remote_path("~bob/x", "/home/u")


@pytest.mark.parametrize(("path", "name"), [("a/b/", "b"), ("/x/file.txt", "file.txt"),
                                           ("é ü", "é ü")])
def test_source_name(path: str, name: str) -> None:
    assert cpl.source_name(path) == name


@pytest.mark.parametrize("path", ["/", ".", "a/..", "..", "//", "x/../.."])
def test_source_name_refuses_nameless(path: str) -> None:
    with pytest.raises(ValueError):
        cpl.source_name(path)


def test_layout_one_file_onto_missing_dest_is_the_dest() -> None:
    assert cpl.layout(["f"], [FILE], "/d/x", None, dest_slash=False) == (["/d/x"], False)


def test_layout_into_an_existing_directory() -> None:
    assert cpl.layout(["f"], [FILE], "/d", DIR, dest_slash=False) == (["/d/f"], False)


def test_layout_several_sources_make_a_directory() -> None:
    assert cpl.layout(["a", "b"], [FILE, DIR], "/d", None, dest_slash=False) == \
        (["/d/a", "/d/b"], True)


def test_layout_trailing_slash_means_directory() -> None:
    assert cpl.layout(["a"], [DIR], "/d", None, dest_slash=True) == (["/d/a"], True)


def test_layout_directory_into_missing_dest_becomes_it() -> None:
    assert cpl.layout(["src"], [DIR], "/d/new", None, dest_slash=False) == (["/d/new"], False)


@pytest.mark.parametrize(("names", "kinds", "slash"), [
    (["a", "b"], [FILE, FILE], False), (["a"], [DIR], False), (["a"], [FILE], True)])
def test_layout_dest_is_a_file(names: list[str], kinds: list[str], slash: bool) -> None:
    with pytest.raises(cpl.LayoutError, match="not a directory"):
        cpl.layout(names, kinds, "/d/f", FILE, dest_slash=slash)


def test_names_keep_their_own_characters() -> None:
    """A name is what basename gives: a trailing space or an X is part of it."""
    assert cpl.source_name("data ") == "data "
    assert cpl.source_name("/srv/boX/") == "boX"
    assert cpl.source_name("/srv/boX//") == "boX"


def test_inside_the_root_directory_and_roots_ending_in_any_character() -> None:
    assert cpl.inside("/x", "/") and not cpl.inside("/", "/")
    assert cpl.inside("/rootX/b", "/rootX") and cpl.inside("/rootX/b", "/rootX/")
    assert not cpl.inside("/rootXb", "/rootX")


def test_is_temp_needs_both_ends() -> None:
    assert not cpl.is_temp("/d/.dtrain-cp-ab12cd34-f")
    assert not cpl.is_temp("/d/f.tmp")
    assert cpl.is_temp("/d/.dtrain-cp-ab12cd34-f.tmp")


def test_a_temp_name_uses_every_byte_a_name_may_have() -> None:
    long = cpl.temp_name("/d/" + "x" * 255, "ab12cd34")
    assert len(long.rsplit("/", 1)[1].encode()) == 255


def test_inside() -> None:
    assert cpl.inside("/d/x/y", "/d/x")
    assert not cpl.inside("/d/x", "/d/x")
    assert not cpl.inside("/d/xy", "/d/x")
    assert not cpl.inside("/d/x/../y", "/d/x")


def test_temp_name_same_directory_recognised_and_bounded() -> None:
    t = cpl.temp_name("/d/sub/é.txt", "ab12cd34")
    assert t == "/d/sub/.dtrain-cp-ab12cd34-é.txt.tmp"
    assert cpl.is_temp(t) and not cpl.is_temp("/d/sub/é.txt")
    long = cpl.temp_name("/d/" + "é" * 127, "ab12cd34")  # 254 bytes of name
    assert len(long.rsplit("/", 1)[1].encode()) <= 255 and cpl.is_temp(long)


def test_pull_root_is_per_host() -> None:
    assert cpl.pull_root("/out", "node1", "/var/log/x.log") == "/out/node1/x.log"


# ---------------------------------------------------------------- plan_sync


def test_everything_new_is_sent_parents_first() -> None:
    src = [f("a/b/c"), d(""), d("a/b"), d("a"), ln("l", "a/b/c")]
    plan = cpl.plan_sync(src, {})
    assert rels(plan.mkdirs) == ["", "a", "a/b"]
    assert rels(plan.send) == ["a/b/c"] and rels(plan.links) == ["l"]
    assert plan.delete == [] and plan.skip == []


def test_delta_skips_same_size_and_mtime_sends_the_rest() -> None:
    src = [d(""), f("same"), f("newer", mtime=200), f("bigger", size=9)]
    dst = tree(d(""), f("same"), f("newer"), f("bigger"))
    plan = cpl.plan_sync(src, dst)
    assert rels(plan.skip) == ["same"]
    assert sorted(rels(plan.send)) == ["bigger", "newer"]
    assert plan.mkdirs == []


def test_a_destination_newer_than_the_source_is_sent_too() -> None:
    """Same size, the node's copy newer (edited there, or a clock ahead): it diverged, so it
    is replaced. Only an equal mtime means "the same file" (rsync's quick check)."""
    src = [d(""), f("edited-there", mtime=100), f("older-there", mtime=100), f("same")]
    dst = tree(d(""), f("edited-there", mtime=300), f("older-there", mtime=99), f("same"))
    plan = cpl.plan_sync(src, dst)
    assert sorted(rels(plan.send)) == ["edited-there", "older-there"]
    assert rels(plan.skip) == ["same"]


def test_what_cannot_be_copied_says_why() -> None:
    src = [d(""), Entry("fifo", OTHER), f("x")]
    plan = cpl.plan_sync(src, tree(d(""), d("x")))
    assert plan.errors == [("fifo", "not a regular file, directory or symlink: skipped"),
                           ("x", "is a directory on the destination; remove it first")]


def test_directory_attrs_only_with_preserve_deepest_first() -> None:
    src = [d("", mode=0o700), d("a", mode=0o700), d("a/b", mode=0o700, mtime=5), d("c")]
    dst = tree(d(""), d("a"), d("a/b", mode=0o700), d("c"))
    assert cpl.plan_sync(src, dst).dir_attrs == []
    plan = cpl.plan_sync(src, dst, preserve=True)
    assert rels(plan.dir_attrs) == ["a/b", "a", ""]  # c is equal: not touched
    new = cpl.plan_sync([d(""), d("z"), d("z/y"), d("z/y/x"), d("b")], {}, preserve=True)
    assert rels(new.dir_attrs) == ["z/y/x", "z/y", "b", "z", ""]


def test_resolve_compare_settles_every_entry() -> None:
    src = [d(""), f("differs"), f("same-mode"), f("same", mode=0o600)]
    dst = tree(d(""), f("differs"), f("same-mode", mode=0o600), f("same", mode=0o644))
    plan = cpl.plan_sync(src, dst, checksum=True)
    sums = {"differs": "1", "same-mode": "2", "same": "3"}
    cpl.resolve_compare(plan, dst, sums, {"differs": "9", "same-mode": "2", "same": "3"})
    assert plan.compare == []
    assert rels(plan.send) == ["differs"]
    assert sorted(rels(plan.skip)) == ["same", "same-mode"]
    assert plan.fix_attrs == []  # equal content and mtime; modes only count with preserve
    plan = cpl.plan_sync(src, dst, checksum=True, preserve=True)
    cpl.resolve_compare(plan, dst, sums, {"differs": "9", "same-mode": "2", "same": "3"},
                        preserve=True)
    assert sorted(rels(plan.fix_attrs)) == ["same", "same-mode"]


def test_checksum_compares_equal_sizes_only() -> None:
    src = [d(""), f("same"), f("newer", mtime=200), f("bigger", size=9)]
    dst = tree(d(""), f("same"), f("newer"), f("bigger"))
    plan = cpl.plan_sync(src, dst, checksum=True)
    assert rels(plan.send) == ["bigger"] and sorted(rels(plan.compare)) == ["newer", "same"]
    cpl.resolve_compare(plan, dst, {"newer": "h1", "same": "h2"},
                        {"newer": "h1", "same": "other"})
    assert sorted(rels(plan.send)) == ["bigger", "same"]
    assert rels(plan.skip) == ["newer"] and rels(plan.fix_attrs) == ["newer"]  # mtime fixed


def test_checksum_missing_remote_sum_sends() -> None:
    dst = tree(f("x"))
    plan = cpl.plan_sync([f("x")], dst, checksum=True)
    cpl.resolve_compare(plan, dst, {"x": "h"}, {"x": None})
    assert rels(plan.send) == ["x"]


def test_preserve_fixes_modes_without_resending() -> None:
    src = [d("", mode=0o700), f("x", mode=0o600)]
    dst = tree(d("", mode=0o755), f("x", mode=0o644))
    plan = cpl.plan_sync(src, dst, preserve=True)
    assert rels(plan.skip) == ["x"] and rels(plan.fix_attrs) == ["x"]
    assert rels(plan.dir_attrs) == [""]
    assert cpl.plan_sync(src, dst).fix_attrs == []  # without -p modes are left alone


def test_symlinks_compared_by_target() -> None:
    src = [d(""), ln("same", "t"), ln("moved", "new")]
    dst = tree(d(""), ln("same", "t"), ln("moved", "old"))
    plan = cpl.plan_sync(src, dst)
    assert rels(plan.skip) == ["same"] and rels(plan.links) == ["moved"]


def test_delete_only_with_the_flag_deepest_first_never_the_root() -> None:
    src = [d(""), f("keep")]
    dst = tree(d(""), f("keep"), d("gone"), f("gone/x"), ln("oldlink", "/etc"), f("extra"))
    assert cpl.plan_sync(src, dst).delete == []
    plan = cpl.plan_sync(src, dst, delete=True)
    assert rels(plan.delete) == ["gone/x", "extra", "gone", "oldlink"]
    assert "" not in rels(plan.delete)


def test_stale_temps_removed_and_never_counted_as_deletions() -> None:
    dst = tree(d(""), f(".dtrain-cp-00000000-x.tmp"), f("sub/.dtrain-cp-1-y.tmp"))
    plan = cpl.plan_sync([d("")], dst, delete=True)
    assert plan.stale == [".dtrain-cp-00000000-x.tmp", "sub/.dtrain-cp-1-y.tmp"]
    assert plan.delete == []


def test_dir_replaces_file_file_never_replaces_dir() -> None:
    src = [d(""), d("was-file"), f("was-dir")]
    dst = tree(d(""), f("was-file"), d("was-dir"), f("was-dir/inner"))
    plan = cpl.plan_sync(src, dst, delete=True)
    assert plan.unlink_first == ["was-file"] and rels(plan.mkdirs) == ["was-file"]
    assert [rel for rel, _ in plan.errors] == ["was-dir"]
    assert "was-dir/inner" not in rels(plan.delete)  # not deleted under a refused entry


def test_special_files_reported_not_sent() -> None:
    plan = cpl.plan_sync([d(""), Entry("fifo", OTHER)], {})
    assert plan.send == [] and plan.errors[0][0] == "fifo"


def test_new_mode() -> None:
    assert cpl.new_mode(f("x", mode=0o4755), preserve=False) == 0o755
    assert cpl.new_mode(f("x", mode=0o4755), preserve=True) == 0o4755


def test_exit_code() -> None:
    ok, bad, lost = CopyResult("a"), CopyResult("b", errors=["x"]), CopyResult("c")
    lost.unreachable = "timed out"
    assert cpl.exit_code([ok]) == 0
    assert cpl.exit_code([ok, bad]) == 1
    assert cpl.exit_code([ok, bad, lost]) == 255
    assert cpl.exit_code([]) == 0


# ---------------------------------------------------------------- the node-side diff


def _row(e: Entry) -> list[object]:
    """A node's walk row of an entry (cpnode.walk_tree's format)."""
    return [e.rel, e.kind, e.size, e.mtime, e.mode, e.target]


def _variants(e: Entry) -> list[Entry | None]:
    """What a node may have where the source has e: the same, absent, or one field off."""
    r = e.rel
    out: list[Entry | None] = [e, None, Entry(r, e.kind, e.size, e.mtime + 7, e.mode, e.target),
                               Entry(r, e.kind, e.size, e.mtime, e.mode ^ 0o020, e.target)]
    if e.kind == FILE:
        out += [Entry(r, FILE, e.size + 1, e.mtime, e.mode), d(r), ln(r, "x")]
    elif e.kind == DIR and r:
        out += [f(r), ln(r, "elsewhere")]
    elif e.kind == LINK:
        out += [ln(r, e.target + "2"), f(r, size=0)]
    return out


def _random_case(seed: int) -> tuple[list[Entry], dict[str, Entry]]:
    import random

    rng = random.Random(seed)
    src = [d("", mtime=50), d("a", mtime=60), d("a/b", mode=0o700), f("x"), f("a/y", 9, 120),
           f("a/b/z", 1, 130, 0o600), ln("a/l", "y"), Entry("sock", OTHER, 0, 100, 0o644)]
    dst: dict[str, Entry] = {}
    for e in src:
        have = rng.choice(_variants(e))
        if have is not None:
            dst[have.rel] = have
    for extra in (f("gone"), d("a/old"), f("a/old/f"), f(".dtrain-cp-dead-x.tmp"),
                  f("a/.dtrain-cp-dead-y.tmp"), ln("a/b/oldlink", "z")):
        if rng.random() < 0.5:
            dst[extra.rel] = extra
    return src, dst


@pytest.mark.parametrize("seed", range(300))
def test_the_plan_from_a_node_side_diff_is_the_plan_from_the_full_listing(seed: int) -> None:
    """cpnode's diff answers only where the node differs from the source's rows; rebuilt
    by tree_from_diff, the plan must be exactly the full listing's, for every option."""
    from launcher.nodeside import cpnode

    src, dst = _random_case(seed)
    for preserve in (False, True):
        for delete in (False, True):
            want = cpl.plan_sync(src, dst, preserve=preserve, delete=delete)
            reply = cpnode.diff_rows([_row(e) for e in dst.values()],
                                     cpl.manifest_rows(src, preserve=preserve), delete)
            got = cpl.plan_sync(src, cpl.tree_from_diff(src, reply), preserve=preserve,
                                delete=delete)
            assert got == want, (seed, preserve, delete, reply)


def test_an_unchanged_tree_answers_nothing_but_its_temps() -> None:
    from launcher.nodeside import cpnode

    src = [d("", mtime=50), d("a"), f("a/y"), ln("l", "a/y")]
    node = [d("", mtime=999), d("a", mtime=5), f("a/y"), ln("l", "a/y"), f("mine"),
            f("a/.dtrain-cp-dead-y.tmp")]
    reply = cpnode.diff_rows([_row(e) for e in node], cpl.manifest_rows(src, preserve=False),
                             False)
    assert reply == {"differ": [], "missing": [], "extra": [_row(node[-1])]}
    with_attrs = cpnode.diff_rows([_row(e) for e in node],
                                  cpl.manifest_rows(src, preserve=True), True)
    assert [r[0] for r in with_attrs["differ"]] == ["", "a"]  # directory mtimes count now
    assert [r[0] for r in with_attrs["extra"]] == ["mine", "a/.dtrain-cp-dead-y.tmp"]


def test_the_messages_that_name_what_to_do() -> None:
    with pytest.raises(ValueError) as exc:
        cpl.source_name("a/..")
    assert str(exc.value) == ("a/..: cannot tell the name to copy it under; name the "
                              "directory itself (its absolute path, or ../NAME with its own name)")
    with pytest.raises(cpl.LayoutError) as err:
        cpl.layout(["d"], [DIR], "/d/f", FILE, dest_slash=False)
    assert str(err.value) == ("/d/f exists and is not a directory; cannot copy a directory "
                              "onto it")


def test_only_a_symlink_has_a_target() -> None:
    import stat

    assert cpl.Entry.from_stat("f", stat.S_IFREG | 0o640, 3, 7.9) == Entry("f", FILE, 3, 7,
                                                                            0o640, "")
    assert cpl.Entry.from_stat("l", stat.S_IFLNK | 0o777, 9, 1, "t").target == "t"
