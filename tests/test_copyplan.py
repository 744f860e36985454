"""decide.copyplan: where sources land and what to send, skip or delete (no I/O)."""

from __future__ import annotations

import pytest

from launcher.decide import copyplan as cpl
from launcher.decide.copyplan import DIR, FILE, LINK, OTHER, Entry
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


@pytest.mark.parametrize("path", ["/", ".", "a/.."])
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
