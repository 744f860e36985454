"""One filter spelling everywhere (issue 24 item 6): `--rank RANKS` (ranges) and `--host
HOSTS` (hostlist expressions, matched on the name the console prints) on run, logs and
attach; an unknown host is exit 2 naming the known ones; never a pydantic message. The
decisions are launcher/decide/copies/filters.py's; the CLI only parses."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.decide.copies.filters import check_choice, host_name, parse_ranks, select_hosts
from launcher.errors import UsageError
from launcher.models import OutputLine
from launcher.output.archive import RunArchive
from tests.util import assert_exit, dtrain

# ------------------------------------------------------------------------------ decisions


@pytest.mark.parametrize(("text", "ranks"), [
    ("0", {0}), ("0,3", {0, 3}), ("0-3,7", {0, 1, 2, 3, 7}), (" 1 - 2 ,", {1, 2}),
])
def test_rank_lists_and_ranges(text: str, ranks: set[int]) -> None:
    assert parse_ranks(text) == ranks


@pytest.mark.parametrize(("text", "message"), [
    ("a", "'a' is not a rank"), ("3-1", "runs backwards"), ("", "no rank given"),
    ("0-99999999", "beyond any job"), ("-1", "not a rank"),
])
def test_bad_ranks_are_usage_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_ranks(text)


LABELS = ["dtuser@node1", "dtuser@node2:2222", "node3", "[::1]:22"]


def test_hosts_match_the_printed_name_or_the_label() -> None:
    assert host_name("dtuser@node2:2222") == "node2" and host_name("[::1]:22") == "::1"
    assert select_hosts("node2", LABELS) == {"dtuser@node2:2222"}
    assert select_hosts("node[1-2]", LABELS) == {"dtuser@node1", "dtuser@node2:2222"}
    assert select_hosts("dtuser@node1", LABELS) == {"dtuser@node1"}


def test_an_unknown_host_names_the_known_ones() -> None:
    with pytest.raises(UsageError) as err:
        select_hosts("node[2,9]", LABELS)
    assert "node9 is not one of the run's hosts" in err.value.message
    assert "node[1-3]" in (err.value.hint or "")


def _error(call) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError) as err:
        call()
    return err.value.message, err.value.hint


def test_rank_errors_whole_and_the_cap() -> None:
    hint = "e.g. --ranks 0-3,7"
    assert _error(lambda: parse_ranks("a", "--ranks")) == (
        "--ranks 'a': 'a' is not a rank or a range", hint)
    assert _error(lambda: parse_ranks(" 1- ", "--ranks")) == (
        "--ranks ' 1- ': '1-' is not a rank or a range", hint)
    assert _error(lambda: parse_ranks("3-1", "--ranks")) == (
        "--ranks '3-1': the range 3-1 runs backwards", "write it 1-3")
    assert _error(lambda: parse_ranks(" , ", "--ranks")) == ("--ranks ' , ': no rank given", hint)
    assert _error(lambda: parse_ranks("0-1048577")) == (
        "--rank '0-1048577': rank 1048577 is beyond any job (at most 1048576)", None)
    assert parse_ranks("1048576") == {1048576} and parse_ranks("2-2") == {2}
    assert parse_ranks(",3,,5") == {3, 5}  # empty parts are skipped, not the end


def test_host_names_and_expression_errors_whole() -> None:
    from launcher.decide.copies.filters import expand

    assert [host_name(lb) for lb in ("a@b@node2:22", "node2", "[::1]", "[fe80::1%eth0]:22",
                                     "fe80::1", "u@h:1:2")] == [
        "node2", "node2", "::1", "fe80::1%eth0", "fe80::1", "h:1:2"]
    assert expand("node[1-2] node4") == ["node1", "node2", "node4"]
    # never ClusterShell's groups of the machine (its example config lists @all)
    assert expand("@all") == ["@all"]
    assert _error(lambda: expand("n[1-2000000]", "--hosts")) == (
        "--hosts: 'n[1-2000000]' makes 2000000 hosts, over the cap of 65536 hosts per job",
        "check the range bounds")
    assert _error(lambda: select_hosts("node[1-", ["a"], "--hosts")) == (
        "--hosts 'node[1-': not a host list (missing bracket: \"node[1-\")",
        "e.g. --hosts node[1-2],node4")
    assert _error(lambda: expand("node[1-")) == (
        "--host 'node[1-': not a host list (missing bracket: \"node[1-\")",
        "e.g. --host node[1-2],node4")
    assert _error(lambda: select_hosts("node9,node[1-2]", ["node1", "node1", "x@node2"],
                                       "--hosts")) == (
        "--hosts 'node9,node[1-2]': node9 is not one of the run's hosts",
        "the hosts are node[1-2]")
    assert _error(lambda: select_hosts("node9", [])) == (
        "--host 'node9': node9 is not one of the run's hosts", "the hosts are none")
    assert select_hosts("node1", ["node1", "u@node1:22"]) == {"node1", "u@node1:22"}
    assert _error(lambda: check_choice("--backend", "x", ("nccl", "gloo", "mpi"))) == (
        "--backend 'x': use nccl, gloo or mpi", None)

def test_choices() -> None:
    assert check_choice("--rdzv", "c10d", ("static", "c10d")) == "c10d"
    assert check_choice("--backend", None, ("nccl", "gloo")) is None
    with pytest.raises(UsageError, match="--rdzv 'x': use static or c10d"):
        check_choice("--rdzv", "x", ("static", "c10d"))


# ------------------------------------------------------------------------- the commands


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    archive = RunArchive.create(tmp_path / "runs", "r1")
    archive.update_meta(hosts=["dtuser@node1", "dtuser@node2"], world_size=4)
    archive.write_lines([
        OutputLine("dtuser@node1", "out", "from r0", rank=0, node_rank=0, t=1.0),
        OutputLine("dtuser@node1", "out", "from r1", rank=1, node_rank=0, t=1.1),
        OutputLine("dtuser@node2", "out", "from r2", rank=2, node_rank=1, t=1.2),
        OutputLine("dtuser@node2", "out", "from r3", rank=3, node_rank=1, t=1.3),
    ])
    archive.close()
    return tmp_path / "runs"


def _logs(runs: Path, *args: str) -> tuple[int, str, str]:
    res = dtrain(["logs", "r1", "--archive-dir", str(runs), "--no-color", *args])
    return res.returncode, res.stdout, res.stderr


def test_logs_takes_rank_lists_and_ranges(runs: Path) -> None:
    """Failed on the old main: `--rank 0,1` was 'Input should be a valid integer'."""
    code, out, err = _logs(runs, "--rank", "0,1")
    assert code == 0, err
    assert "from r0" in out and "from r1" in out and "from r2" not in out
    code, out, _ = _logs(runs, "--rank", "1-3")
    assert "from r0" not in out and "from r3" in out
    code, out, _ = _logs(runs, "--rank", "0", "--rank", "3")  # repeatable, as before
    assert "from r0" in out and "from r3" in out and "from r1" not in out


def test_logs_host_is_the_printed_name(runs: Path) -> None:
    """Failed on the old main: `--host node2` (the name the console prints) showed nothing
    and exited 0."""
    code, out, err = _logs(runs, "--host", "node2")
    assert code == 0, err
    assert "from r2" in out and "from r0" not in out


def test_logs_unknown_host_is_exit_2_naming_the_known_ones(runs: Path) -> None:
    res = dtrain(["logs", "r1", "--archive-dir", str(runs), "--host", "node7"])
    assert_exit(res, 2)
    assert "node7 is not one of the run's hosts" in res.stderr
    assert "node[1-2]" in res.stderr


@pytest.mark.parametrize("args", [["logs", "--rank", "x"], ["attach", "--rank", "0,x"],
                                  ["run", "-H", "localhost", "--rank", "1-a", "s.py"]])
def test_a_bad_rank_is_exit_2_without_pydantic(args: list[str], runs: Path) -> None:
    res = dtrain([args[0], "--archive-dir", str(runs), *args[1:]])
    assert_exit(res, 2)
    assert "is not a rank or a range" in res.stderr
    assert "valid integer" not in res.stderr and "pydantic" not in res.stderr


def test_run_takes_the_same_spelling_and_keeps_the_old_one(tmp_path: Path) -> None:
    """`run --rank/--host` (and the old --ranks/--hosts-filter, hidden) reach the plan."""
    for flags in (["--rank", "0-1", "--host", "localhost"],
                  ["--ranks", "0,1", "--hosts-filter", "localhost"]):
        res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--dry-run",
                      "--no-preflight", *flags, "examples/ddp_smoke.py"])
        assert_exit(res, 0)
    res = dtrain(["run", "-H", "localhost", "--host", "node9", "--dry-run",
                  "examples/ddp_smoke.py"])
    assert_exit(res, 2)
    assert "node9 is not one of the run's hosts" in res.stderr


def test_attach_unknown_host_is_exit_2(runs: Path) -> None:
    res = dtrain(["attach", "r1", "--archive-dir", str(runs), "--host", "node7"])
    assert_exit(res, 2)
    assert "node7 is not one of the run's hosts" in res.stderr
