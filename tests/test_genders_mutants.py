"""hosts/genders.py: what issue 51's mutation round (docs/testing.md, "Mutation score") found
no test for: every refusal's words and its hint (what failed, where, what next), the 16 MiB
bound, where the genders file is looked for, a node with no attribute, and which of -g and -X
refuses a group no host has."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.errors import DtrainError, HostfileError, UsageError
from launcher.hosts import genders as gd
from launcher.models import Host


def refused(fn: object, *args: object) -> DtrainError:
    with pytest.raises(DtrainError) as err:
        fn(*args)  # type: ignore[operator]
    return err.value


def test_each_bad_line_says_what_where_and_what_to_do() -> None:
    e = refused(gd.parse_genders, "n1 gpu, rack=1\n", "g.txt")
    assert (e.message, e.hint) == (
        "g.txt:1: blank inside the attribute list (genders: `nodes attr,attr=v`, no blanks "
        "between attributes)", "join the attributes with commas: gpu,rack=1")
    e = refused(gd.parse_genders, "\nn[1-\n", "g.txt")
    assert e.message.startswith("g.txt:2: bad node list 'n[1-': ")
    assert e.hint == "e.g. node[1-4] or node1,node2"
    e = refused(gd.parse_genders, "n1 a=b=c\n", "g.txt")
    assert (e.message, e.hint) == ("g.txt:1: bad attribute 'a=b=c'",
                                   "attr or attr=value, no blank, ',' or '=' inside")
    e = refused(gd.parse_genders, "n1 gpu\nn[0-1] gpu\n", "g.txt")
    assert (e.message, e.hint) == ("g.txt:2: node n1 has attribute 'gpu' twice",
                                   "give each node an attribute once")
    e = refused(gd.parse_genders, f"n[0-{gd.MAX_NODES}] gpu\n", "g.txt")
    assert f"more than {gd.MAX_NODES} nodes" in e.message
    # exactly the bound: read
    assert len(gd.parse_genders(f"n[1-{gd.MAX_NODES}] x\n", "g").nodes) == gd.MAX_NODES


def test_a_node_alone_or_in_a_comma_list_and_its_source() -> None:
    g = gd.parse_genders("n9\nn1,n2 gpu\n", "g.txt")
    assert g.source == "g.txt" and g.nodes == {"n9": {}, "n1": {"gpu": None},
                                               "n2": {"gpu": None}}
    assert g.groups_of("n9") == {} and g.groups_of("absent") == {}
    assert g.attrs() == ["gpu"] and gd.Genders("x").attrs() == []
    # a host the genders file does not name: its hostfile groups only
    assert gd.host_groups(Host("absent", groups=("a",)), g) == {"a": None}


def test_reading_the_file(tmp_path: Path) -> None:
    e = refused(gd.load_genders, str(tmp_path / "none"))
    assert (e.message, e.hint) == (f"genders file not found: {tmp_path / 'none'}",
                                   "give --genders FILE, or a groups: key in a YAML hostfile")
    e = refused(gd.load_genders, str(tmp_path))
    assert e.message.startswith(f"cannot read genders file {tmp_path}: ")
    bad = tmp_path / "latin1"
    bad.write_bytes(b"n1 caf\xe9\n")
    e = refused(gd.load_genders, str(bad))
    assert e.message == f"genders file is not UTF-8 text: {bad} (invalid continuation byte)"
    big = tmp_path / "big"
    line = b"n1 a\n" + b"#" * 1023 + b"\n"
    big.write_bytes(line + b"#" * (gd.MAX_BYTES - len(line)))
    assert gd.load_genders(str(big)).source == str(big)  # 16 MiB exactly: read
    with open(big, "ab") as fh:
        fh.write(b"#")
    e = refused(gd.load_genders, str(big))
    assert e.message == f"genders file {big} is larger than 16 MiB"


def test_where_the_genders_file_is_looked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gd.genders_path("g.txt", {gd.ENV_GENDERS: "e"}) == "g.txt"
    assert gd.genders_path(None, {gd.ENV_GENDERS: "e"}) == "e"
    monkeypatch.setattr(os.path, "exists", lambda p: p == gd.DEFAULT_GENDERS)
    assert gd.genders_path(None, {}) == "/etc/genders"
    monkeypatch.setattr(os.path, "exists", lambda p: False)
    assert gd.genders_path(None, {gd.ENV_GENDERS: ""}) is None


def test_a_bad_selector_and_a_group_no_host_has() -> None:
    e = refused(gd.parse_selector, "gpu,a b", "-X")
    assert isinstance(e, UsageError)
    assert (e.message, e.hint) == ("-X 'gpu,a b': 'a b' is not a group name",
                                   "-X GROUP or -X attr=value, several separated by commas")
    hosts = [Host("n1", groups=("gpu",)), Host("n2", groups=("cpu",))]
    e = refused(gd.select, hosts, "tpu", None, None)
    assert (e.message, e.hint) == (
        "-g tpu: no host is in group 'tpu' (the hostfile's groups:; no genders file given: "
        "--genders FILE)", "known groups: cpu, gpu")
    g = gd.parse_genders("n1 rack=1\n", "/etc/g")
    e = refused(gd.select, [Host("n3")], "tpu", None, g)
    assert (e.message, e.hint) == (
        "-g tpu: no host is in group 'tpu' (the hostfile's groups: and /etc/g)",
        "known groups: none")
    e = refused(gd.select, hosts, "a b", None, None)
    assert e.message == "-g 'a b': 'a b' is not a group name"
    # one of several -g groups known: no refusal; -X of a group no host has: nothing dropped
    assert gd.select(hosts, "tpu,gpu", None, None) == hosts[:1]
    assert gd.select(hosts, None, "tpu", None) == hosts
    assert gd.select(hosts, "gpu", "tpu", None) == hosts[:1]


def test_a_selection_that_leaves_nothing() -> None:
    hosts = [Host(f"n{i}", groups=("gpu",)) for i in range(10)]
    e = refused(gd.select, hosts, None, "gpu", None)
    assert isinstance(e, HostfileError)
    assert (e.message, e.hint) == ("no hosts left after -X gpu",
                                   "the hosts are n0,n1,n2,n3,n4,n5,n6,n7")


def test_g_alone_names_the_nodes_of_the_file() -> None:
    g = gd.parse_genders("n1 gpu\nn2 cpu\n", "/etc/g")
    assert gd.genders_hosts(g, "gpu") == [Host("n1", source="/etc/g")]
    e = refused(gd.genders_hosts, g, "tpu")
    assert (e.message, e.hint) == ("-g tpu: no node of /etc/g is in that group",
                                   "its groups: cpu, gpu")
    e = refused(gd.genders_hosts, gd.parse_genders("n1\n", "/etc/g"), "tpu")
    assert e.hint == "its groups: none"
    e = refused(gd.genders_hosts, g, "a b")
    assert e.message.startswith("-g 'a b': ")
