"""pdsh's groups (issue 40 item 10): ``-g GROUP`` / ``-X GROUP`` from a YAML hostfile's
``groups:`` or a genders file; bad input is exit 2 with file:line; every command that takes
hosts takes them; on the cluster ``exec -g`` reaches exactly the group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.errors import HostfileError, UsageError
from launcher.hosts.genders import parse_genders, select
from launcher.hosts.hostfile import parse_hostfile_yaml, resolve_hosts
from tests.util import dtrain

GENDERS = """# slc cluster genders file
slci,slcj,slc[0-3]  eth2=e%n,cluster=slc,all
slci passwdhost
slci,slcj  management   # two nodes
slc[1-3] compute
"""


def test_the_genders_format_as_libgenders_reads_it() -> None:
    g = parse_genders(GENDERS, "/etc/genders")
    assert list(g.nodes) == ["slci", "slcj", "slc0", "slc1", "slc2", "slc3"]
    assert g.groups_of("slci") == {"eth2": "eslci", "cluster": "slc", "all": None,
                                   "passwdhost": None, "management": None}
    assert g.groups_of("slc2")["compute"] is None and "management" not in g.groups_of("slc2")


@pytest.mark.parametrize(("text", "line", "what"), [
    ("node1 a\nnode2 a b\n", 2, "blank inside the attribute list"),
    ("node1 a,b\nnode1 a\n", 2, "attribute 'a' twice"),
    ("node[1-x] a\n", 1, "bad node list"),
    ("# ok\n\nnode1 a=\n", 3, "bad attribute 'a='"),
    ("node1 a=b=c\n", 1, "bad attribute"),
])
def test_a_bad_genders_line_names_its_file_and_line(text: str, line: int, what: str) -> None:
    with pytest.raises(HostfileError) as err:
        parse_genders(text, "g.txt")
    assert err.value.line == line and str(err.value).startswith(f"g.txt:{line}: ")
    assert what in str(err.value)


def test_group_and_exclude_group_over_genders() -> None:
    g = parse_genders(GENDERS, "genders")
    hosts = resolve_hosts(hostfile=None, hosts="slc[0-3],slci", environ={})
    names = [h.name for h in select(hosts, "compute", None, g)]
    assert names == ["slc1", "slc2", "slc3"]
    assert [h.name for h in select(hosts, "all", "compute,passwdhost", g)] == ["slc0"]
    assert [h.name for h in select(hosts, "eth2=eslc2", None, g)] == ["slc2"]
    with pytest.raises(HostfileError, match="no host is in group 'gpu'"):
        select(hosts, "gpu", None, g)
    with pytest.raises(HostfileError, match="no hosts left after -X all"):
        select(hosts, None, "all", g)
    with pytest.raises(UsageError, match="not a group name"):
        select(hosts, "a b", None, g)


def test_yaml_hostfile_groups() -> None:
    hosts = parse_hostfile_yaml(
        "defaults: {groups: [all]}\nhosts:\n  - {host: 'gpu[1-2]', groups: [gpu, rack1]}\n"
        "  - {host: cpu1, groups: 'login,rack1'}\n  - cpu2\n", "h.yaml")
    assert [h.groups for h in hosts] == [("all", "gpu", "rack1"), ("all", "gpu", "rack1"),
                                         ("all", "login", "rack1"), ("all",)]
    assert [h.name for h in select(hosts, "rack1", "login", None)] == ["gpu1", "gpu2"]


@pytest.mark.parametrize(("text", "where"), [
    ("hosts:\n  - {host: a, groups: [gpu, 'b c']}\n", "h.yaml:2: hosts[0].groups"),
    ("hosts:\n  - a\n  - {host: b, groups: {x: 1}}\n", "h.yaml:3: hosts[1].groups"),
    ("defaults:\n  groups: [true]\nhosts: [a]\n", "h.yaml:2: defaults.groups"),
])
def test_bad_yaml_groups_name_the_line(text: str, where: str) -> None:
    with pytest.raises(HostfileError) as err:
        parse_hostfile_yaml(text, "h.yaml")
    assert str(err.value).startswith(where), str(err.value)


def test_g_alone_takes_the_genders_files_nodes_as_pdsh_does(tmp_path: Path) -> None:
    gfile = tmp_path / "genders"
    gfile.write_text(GENDERS)
    got = resolve_hosts(hostfile=None, hosts=None, group="management", genders=str(gfile),
                        environ={})
    assert [h.name for h in got] == ["slci", "slcj"]
    env = {"DTRAIN_GENDERS": str(gfile)}
    got = resolve_hosts(hostfile=None, hosts=None, group="cluster=slc", exclude_group="compute",
                        environ=env)
    assert [h.name for h in got] == ["slci", "slcj", "slc0"]


COMMANDS = [(["exec"], ["true"]), (["run"], ["train.py"]), (["cp"], ["/etc/hostname", "/tmp/x"]),
            (["doctor"], []), (["smoke"], []), (["top"], []), (["image", "push"], ["img:1"]),
            (["keys", "setup"], []), (["keys", "check"], []), (["keys", "revoke"], [])]


@pytest.mark.parametrize(("cmd", "args"), COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_that_takes_hosts_takes_groups(cmd: list[str], args: list[str],
                                                     tmp_path: Path) -> None:
    help_text = dtrain([*cmd, "--help"], env={**os.environ, "COLUMNS": "200"}).stdout
    assert "--group" in help_text and "--exclude-group" in help_text and "--genders" in help_text
    bad = tmp_path / "genders"
    bad.write_text("node1 gpu\nnode2 gpu rack1\n")
    res = dtrain([*cmd, "--genders", str(bad), "-g", "gpu", "-H", "node1", *args],
                 env={**os.environ, "NO_COLOR": "1"}, timeout=60)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert f"{bad}:2: blank inside the attribute list" in res.stderr


@pytest.mark.ssh
def test_exec_reaches_exactly_the_group_on_the_cluster(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gfile = tmp_path / "genders"
    gfile.write_text("node[1-4] all\nnode[1-2] gpu\nnode3 login\n")
    env = cluster.client_env()
    res = dtrain(["exec", "--genders", str(gfile), "-g", "gpu", "hostname"], env=env)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["node1: node1", "node2: node2"]
    res = dtrain(["exec", "--genders", str(gfile), "-H", "node[1-4]", "-X", "gpu,login",
                  "hostname"], env=env)
    assert res.returncode == 0 and res.stdout.splitlines() == ["node4: node4"], res.stderr
    yml = tmp_path / "h.yaml"
    yml.write_text("hosts:\n  - {host: 'node[1-2]', groups: [a]}\n  - {host: node3, "
                   "groups: [b]}\n")
    res = dtrain(["exec", "-f", str(yml), "-g", "b", "hostname"], env=env)
    assert res.returncode == 0 and res.stdout.splitlines() == ["node3: node3"], res.stderr
