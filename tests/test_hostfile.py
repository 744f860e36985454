"""Hostfile, -H and --include/--exclude parsing: good input, and exact messages for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import HostfileError, UsageError
from launcher.hosts.hostfile import (
    filter_hosts,
    fold,
    load_hostfile,
    parse_host_expr,
    parse_hostfile_text,
    parse_hostfile_yaml,
    resolve_hosts,
)
from launcher.models import Host

EXAMPLES = Path(__file__).resolve().parent.parent / "hostfiles"


def names(hosts: list[Host]) -> list[str]:
    return [host.name for host in hosts]


def labels(hosts: list[Host]) -> list[str]:
    return [host.label for host in hosts]


def text_error(text: str, source: str = "h.txt") -> HostfileError:
    with pytest.raises(HostfileError) as info:
        parse_hostfile_text(text, source)
    return info.value


def yaml_error(text: str, source: str = "c.yaml") -> HostfileError:
    with pytest.raises(HostfileError) as info:
        parse_hostfile_yaml(text, source)
    return info.value


# --------------------------------------------------------------------------- text format


def test_text_format_entries_and_settings() -> None:
    text = (
        "# cluster\n"
        "\n"
        "gpu[01-03] slots=8   # trailing comment\n"
        "dtuser@login1:2222 python=/opt/venv/bin/python\n"
        "login2 user=ops port=2200 slots=1\n"
    )
    hosts = parse_hostfile_text(text, "cluster.txt")
    assert hosts == [
        Host("gpu01", slots=8, source="cluster.txt:3"),
        Host("gpu02", slots=8, source="cluster.txt:3"),
        Host("gpu03", slots=8, source="cluster.txt:3"),
        Host("login1", user="dtuser", port=2222, python="/opt/venv/bin/python",
             source="cluster.txt:4"),
        Host("login2", user="ops", port=2200, slots=1, source="cluster.txt:5"),
    ]


def test_port_and_user_are_none_when_not_given() -> None:
    (host,) = parse_hostfile_text("node1\n", "h.txt")
    assert (host.user, host.port, host.slots, host.python, host.env) == (None, None, None, None, ())


def test_crlf_tabs_and_blank_lines() -> None:
    hosts = parse_hostfile_text("# x\r\n\r\nnode1\tslots=2\r\n  node2  \r\n", "h.txt")
    assert labels(hosts) == ["node1", "node2"]
    assert [h.source for h in hosts] == ["h.txt:3", "h.txt:4"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"], id="padded"),
        pytest.param("node[1,3-4]", ["node1", "node3", "node4"], id="list-in-range"),
        pytest.param("rack[1-2]-node[1-2]",
                     ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"], id="2d"),
        pytest.param("198.18.0.[11-13]", ["198.18.0.11", "198.18.0.12", "198.18.0.13"],
                     id="ipv4-range"),
        pytest.param("10.0.0.1", ["10.0.0.1"], id="ipv4"),
        pytest.param("node-1.example.com", ["node-1.example.com"], id="fqdn"),
        pytest.param("my_host", ["my_host"], id="underscore"),
        pytest.param("[fe80::1]:22", ["fe80::1"], id="ipv6-bracketed"),
        pytest.param("::1", ["::1"], id="ipv6-bare"),
    ],
)
def test_host_patterns(line: str, expected: list[str]) -> None:
    assert names(parse_hostfile_text(line, "h.txt")) == expected


def test_ipv6_with_user_and_port() -> None:
    (host,) = parse_hostfile_text("ops@[FE80::0001]:2222 slots=2", "h.txt")
    assert (host.name, host.user, host.port, host.slots) == ("fe80::1", "ops", 2222, 2)
    assert not host.is_local


def test_same_user_both_ways_is_fine() -> None:
    (host,) = parse_hostfile_text("dtuser@node1:22 user=dtuser port=22", "h.txt")
    assert (host.user, host.port) == ("dtuser", 22)


def test_hash_starts_a_comment_anywhere() -> None:
    assert labels(parse_hostfile_text("node1#comment\nnode2 slots=2#x", "h.txt")) == [
        "node1", "node2"]


BAD_TEXT = [
    pytest.param("node1 slot=2",
                 "h.txt:1: unknown key 'slot' (did you mean slots?); known keys: port, python, "
                 "segment, slots, switch, user",
                 id="unknown-key"),
    pytest.param("node1 slots=two",
                 "h.txt:1: slots must be a positive integer, got 'two'", id="slots-word"),
    pytest.param("node1 slots=0",
                 "h.txt:1: slots must be a positive integer, got '0'", id="slots-zero"),
    pytest.param("node1 slots=-1",
                 "h.txt:1: slots must be a positive integer, got '-1'", id="slots-negative"),
    pytest.param("node1 slots=",
                 "h.txt:1: slots must be a positive integer, got ''", id="slots-empty"),
    pytest.param("node1 slots=2 slots=4", "h.txt:1: slots given twice", id="slots-twice"),
    pytest.param("node1:99999",
                 "h.txt:1: bad port '99999': must be a number from 1 to 65535", id="port-big"),
    pytest.param("node1:0",
                 "h.txt:1: bad port '0': must be a number from 1 to 65535", id="port-zero"),
    pytest.param("node1:ssh",
                 "h.txt:1: bad port 'ssh': must be a number from 1 to 65535", id="port-word"),
    pytest.param("node1 port=x",
                 "h.txt:1: bad port 'x': must be a number from 1 to 65535", id="port-key"),
    pytest.param("node1:",
                 "h.txt:1: bad port '': must be a number from 1 to 65535", id="port-empty"),
    pytest.param("a@node1 user=b", "h.txt:1: user given twice: 'a' and 'b'", id="user-conflict"),
    pytest.param("node1:22 port=2222", "h.txt:1: port given twice: 22 and 2222",
                 id="port-conflict"),
    pytest.param("@node1", "h.txt:1: invalid user name ''", id="user-empty"),
    pytest.param("-oProxyCommand@node1", "h.txt:1: invalid user name '-oProxyCommand'",
                 id="user-dash"),
    pytest.param("node1 extra", "h.txt:1: unexpected 'extra': settings are key=value",
                 id="bare-word"),
    pytest.param("slots=4 node1", "h.txt:1: expected a host first, got 'slots=4'",
                 id="key-first"),
    pytest.param("node1,node2",
                 "h.txt:1: one host entry at a time, got 'node1,node2'", id="comma"),
    pytest.param("node[3-1]",
                 "h.txt:1: bad host range 'node[3-1]': invalid values in range: \"3-1\"",
                 id="range-reversed"),
    pytest.param("node[a-c]",
                 "h.txt:1: bad host range 'node[a-c]': cannot convert string to integer: "
                 "\"a-c\"", id="range-letters"),
    pytest.param("node[1-", "h.txt:1: bad host range 'node[1-': missing bracket: \"node[1-\"",
                 id="range-unclosed"),
    pytest.param("node[]", "h.txt:1: bad host range 'node[]': empty range", id="range-empty"),
    pytest.param("node[1-9999999]",
                 "h.txt:1: host range 'node[1-9999999]' expands to 9999999 hosts "
                 "(more than 65536)", id="range-huge"),
    pytest.param("[fe80::1", "h.txt:1: missing ']' in '[fe80::1'", id="ipv6-unclosed"),
    pytest.param("[fe80::zz]:22", "h.txt:1: invalid IPv6 address 'fe80::zz'", id="ipv6-bad"),
    pytest.param("node1:22:33", "h.txt:1: invalid IPv6 address 'node1:22:33'",
                 id="two-colons"),
]


@pytest.mark.parametrize(("text", "message"), BAD_TEXT)
def test_bad_text_lines(text: str, message: str) -> None:
    error = text_error(text)
    assert error.message == message
    assert error.source == "h.txt" and error.line == 1
    assert error.exit_code == 2


def test_unknown_key_did_you_mean_and_no_irrelevant_hint() -> None:
    assert text_error("node1 slot=2").hint is None
    assert "(did you mean max_slots?)" in text_error("node1 max_slot=2").message
    assert "did you mean" not in text_error("node1 colour=2").message


def test_missing_hostfile_did_you_mean_a_file_beside_it(tmp_path) -> None:
    (tmp_path / "hosts.txt").write_text("node1\n")
    (tmp_path / "other").mkdir()
    with pytest.raises(HostfileError) as info:
        resolve_hosts(hostfile=str(tmp_path / "hosts.tx"), hosts=None)
    assert info.value.message == (f"hostfile not found: {tmp_path}/hosts.tx "
                                  f"(did you mean {tmp_path}/hosts.txt?)")
    with pytest.raises(HostfileError) as info:
        resolve_hosts(hostfile=str(tmp_path / "cluster.yaml"), hosts=None)
    assert "did you mean" not in info.value.message and info.value.hint


def test_error_line_numbers_count_comments_and_blanks() -> None:
    error = text_error("# a\n\nnode1\r\n\r\nnode2 slots=x\n")
    assert error.message == "h.txt:5: slots must be a positive integer, got 'x'"


BAD_NAMES = [
    pytest.param("node1;rm", "';' is not allowed in a host name", id="semicolon"),
    pytest.param("a$b", "'$' is not allowed in a host name", id="dollar"),
    pytest.param("a`id`", "'`' is not allowed in a host name", id="backtick"),
    pytest.param("'node1'", "\"'\" is not allowed in a host name", id="quote"),
    pytest.param('"node1"', "'\"' is not allowed in a host name", id="dquote"),
    pytest.param("a/b", "'/' is not allowed in a host name", id="slash"),
    pytest.param("a!b", "'!' is not allowed in a host name", id="nodeset-operator"),
    pytest.param("a&b", "'&' is not allowed in a host name", id="ampersand"),
    pytest.param("nöde", "'ö' is not allowed in a host name", id="non-ascii"),
    pytest.param("-oProxyCommand=x", None, id="option-like"),
    pytest.param("-node1", "a part may not start or end with '-'", id="leading-dash"),
    pytest.param("node1-", "a part may not start or end with '-'", id="trailing-dash"),
    pytest.param("a..b", "empty part between dots", id="empty-label"),
    pytest.param("node1.", "empty part between dots", id="trailing-dot"),
    pytest.param("x" * 64, "a part is longer than 63 characters", id="long-label"),
    pytest.param("999.1.1.1", "not a valid IPv4 address", id="ipv4-octet"),
    pytest.param("198.18.0.[01-02]", "not a valid IPv4 address", id="ipv4-padded-range"),
    pytest.param("12", "not a valid IPv4 address", id="all-digits"),
]


@pytest.mark.parametrize(("name", "reason"), BAD_NAMES)
def test_invalid_host_names(name: str, reason: str | None) -> None:
    error = text_error(f"{name} slots=1")
    assert error.message.startswith("h.txt:1: ")
    if reason is None:  # "key first": the '=' makes it not a host at all
        assert "expected a host first" in error.message
    else:
        assert error.message.endswith(reason)
        assert "invalid host name" in error.message
    assert error.hint


def test_invalid_name_from_a_range_is_named() -> None:
    error = text_error("gpu[1-2]-")
    assert error.message == ("h.txt:1: invalid host name 'gpu1-': "
                             "a part may not start or end with '-'")


def test_duplicates_name_both_lines() -> None:
    error = text_error("node[1-4] slots=2\n# more\nnode3\n", "cluster.txt")
    assert error.message == "cluster.txt:3: duplicate host 'node3' (first at cluster.txt:1)"
    assert error.line == 3


def test_same_name_other_port_is_not_a_duplicate() -> None:
    hosts = parse_hostfile_text("localhost:2222\nlocalhost:2223\nlocalhost\n", "h.txt")
    assert labels(hosts) == ["localhost:2222", "localhost:2223", "localhost"]


def test_same_name_same_port_is_a_duplicate() -> None:
    assert text_error("node1:22\nnode1 port=22").message == (
        "h.txt:2: duplicate host 'node1:22' (first at h.txt:1)")


@pytest.mark.parametrize("text", [
    pytest.param("", id="empty"),
    pytest.param("# only comments\n\n   \n", id="comments"),
])
def test_empty_hostfile(text: str) -> None:
    assert text_error(text).message == "h.txt: no hosts listed"


# --------------------------------------------------------------------------- compatibility


def test_deepspeed_hostfile_loads_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("worker-1 slots=4\nworker-2 slots=4\n")
    hosts = load_hostfile(path)
    assert [(h.name, h.slots) for h in hosts] == [("worker-1", 4), ("worker-2", 4)]


def test_openmpi_hostfile_loads_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# mpi\nnode1 slots=4 max_slots=8\nnode2 max-slots=8\nnode3\n")
    hosts = load_hostfile(path)
    assert [(h.name, h.slots) for h in hosts] == [("node1", 4), ("node2", None), ("node3", None)]


@pytest.mark.parametrize(("name", "count", "folded"), [
    pytest.param("cluster.txt", 23, "gpu[01-16],login1,rack[1-2]-node[1-3]", id="cluster"),
    pytest.param("cluster.yaml", 13, "bigmem[1-2],gpu[01-10],login1", id="yaml"),
    pytest.param("deepspeed.txt", 2, "worker-[1-2]", id="deepspeed"),
    pytest.param("openmpi.txt", 3, "node[1-3]", id="openmpi"),
    pytest.param("testcluster.txt", 4, "198.18.0.[11-14]", id="testcluster"),
])
def test_example_hostfiles_load(name: str, count: int, folded: str) -> None:
    hosts = load_hostfile(EXAMPLES / name)
    assert len(hosts) == count
    assert fold(h.name for h in hosts) == folded


def test_testcluster_example() -> None:
    hosts = load_hostfile(EXAMPLES / "testcluster.txt")
    assert {(h.user, h.port, h.slots) for h in hosts} == {("dtuser", None, 2)}


# --------------------------------------------------------------------------- YAML


CLUSTER_YAML = """\
defaults:
  user: dtuser
  port: 2222
  slots: 8
  python: /opt/venv/bin/python
  env: {NCCL_DEBUG: WARN, OMP_NUM_THREADS: 4}
hosts:
  - "gpu[01-02] slots=4"
  - host: "big[1-2]"
    user: root
    env: {NCCL_DEBUG: INFO, A: "1"}
  - {host: "ops@login1:22"}
"""


def test_yaml_defaults_and_overrides() -> None:
    hosts = parse_hostfile_yaml(CLUSTER_YAML, "c.yaml")
    default_env = (("NCCL_DEBUG", "WARN"), ("OMP_NUM_THREADS", "4"))
    py = "/opt/venv/bin/python"
    assert hosts == [
        Host("gpu01", "dtuser", 2222, 4, py, default_env, "c.yaml:8"),
        Host("gpu02", "dtuser", 2222, 4, py, default_env, "c.yaml:8"),
        Host("big1", "root", 2222, 8, py,
             (("A", "1"), ("NCCL_DEBUG", "INFO"), ("OMP_NUM_THREADS", "4")), "c.yaml:9"),
        Host("big2", "root", 2222, 8, py,
             (("A", "1"), ("NCCL_DEBUG", "INFO"), ("OMP_NUM_THREADS", "4")), "c.yaml:9"),
        Host("login1", "ops", 22, 8, py, default_env, "c.yaml:12"),
    ]


def test_yaml_without_defaults_and_with_merge_keys() -> None:
    text = "defaults: &d\n  slots: 2\nhosts:\n  - node1\n  - {<<: *d, host: node2, port: 22}\n"
    hosts = parse_hostfile_yaml(text, "m.yaml")
    assert [(h.name, h.slots, h.port) for h in hosts] == [("node1", 2, None), ("node2", 2, 22)]


BAD_YAML = [
    pytest.param("hosts:\n  - node1\n  - host: node2\n    slots: two\n",
                 "c.yaml:4: hosts[1].slots: slots must be a positive integer, got 'two'",
                 id="slots"),
    pytest.param("hosts:\n  - {host: node1, slots: true}\n",
                 "c.yaml:2: hosts[0].slots: slots must be a positive integer, got True",
                 id="slots-bool"),
    pytest.param("hosts:\n  - host: node2\n    slot: 2\n",
                 "c.yaml:3: hosts[0].slot: unknown key 'slot' (did you mean slots?); "
                 "known keys: env, groups, host, image, port, python, segment, slots, switch, "
                 "user",
                 id="unknown-host-key"),
    pytest.param("defaults:\n  slots: 1\n  host: a\nhosts: [a]\n",
                 "c.yaml:3: defaults.host: unknown key 'host'; "
                 "known keys: env, groups, image, port, python, segment, slots, switch, "
                 "user",
                 id="unknown-default-key"),
    pytest.param("hostz: [a]\n",
                 "c.yaml:1: hostz: unknown key 'hostz' (did you mean hosts?); known keys: "
                 "defaults, hosts",
                 id="unknown-top-key"),
    pytest.param("defaults: {slots: 2}\n", "c.yaml:1: missing 'hosts:'", id="no-hosts-key"),
    pytest.param("hosts: node1\n", "c.yaml:1: hosts: expected a list of hosts", id="not-list"),
    pytest.param("hosts: []\n", "c.yaml: no hosts listed", id="empty-list"),
    pytest.param("", "c.yaml: no hosts listed", id="empty-file"),
    pytest.param("- node1\n", "c.yaml:1: expected a mapping of key: value", id="top-list"),
    pytest.param("hosts:\n  - slots: 2\n", "c.yaml:2: hosts[0]: missing 'host:'", id="no-host"),
    pytest.param("hosts:\n  - 12\n", "c.yaml:2: hosts[0]: expected a host entry, got 12",
                 id="number-entry"),
    pytest.param("hosts:\n  - {host: 'a b'}\n",
                 "c.yaml:2: hosts[0].host: expected one host name or range, got 'a b'",
                 id="host-with-space"),
    pytest.param("hosts:\n  - {host: n1, host: n2}\n",
                 "c.yaml:2: hosts[0].host: key given twice", id="repeated-key"),
    pytest.param("hosts:\n  - {host: a@n1, user: b}\n",
                 "c.yaml:2: hosts[0].user: user given twice: 'a' and 'b'", id="user-conflict"),
    pytest.param("hosts:\n  - {host: n1, port: 70000}\n",
                 "c.yaml:2: hosts[0].port: bad port 70000: must be a number from 1 to 65535",
                 id="port"),
    pytest.param("defaults:\n  env: {A: yes}\nhosts: [a]\n",
                 "c.yaml:2: defaults.env.A: value must be a string, got a boolean",
                 id="env-bool"),
    pytest.param("hosts:\n  - {host: a, env: {1A: x}}\n",
                 "c.yaml:2: hosts[0].env.1A: invalid environment variable: '1A' is not a valid "
                 "environment variable name",
                 id="env-name"),
    pytest.param("hosts:\n  - {host: a, env: [A]}\n",
                 "c.yaml:2: hosts[0].env: expected a mapping of NAME: value", id="env-list"),
    pytest.param("hosts:\n  - node1 slots=x\n",
                 "c.yaml:2: hosts[0]: slots must be a positive integer, got 'x'",
                 id="string-entry"),
    pytest.param("hosts:\n  - node1\n  - host: node[0-2]\n",
                 "c.yaml:3: duplicate host 'node1' (first at c.yaml:2)", id="duplicate"),
    pytest.param("hosts:\n  - a\n - b\n",
                 "c.yaml:3: not valid YAML: expected <block end>, but found "
                 "'<block sequence start>'", id="syntax"),
    pytest.param("hosts:\n  - {host: 'n;1'}\n",
                 "c.yaml:2: hosts[0].host: invalid host name 'n;1': "
                 "';' is not allowed in a host name", id="bad-name"),
]


@pytest.mark.parametrize(("text", "message"), BAD_YAML)
def test_bad_yaml(text: str, message: str) -> None:
    assert yaml_error(text).message == message


# --------------------------------------------------------------------------- load_hostfile


@pytest.mark.parametrize(("filename", "content"), [
    pytest.param("h.yaml", "hosts: [node1, node2]\n", id="yaml-ext"),
    pytest.param("h.yml", "hosts:\n  - node1\n  - node2\n", id="yml-ext"),
    pytest.param("hosts", "# comment\nhosts:\n  - node1\n  - node2\n", id="sniffed-hosts"),
    pytest.param("hosts", "defaults: {slots: 1}\nhosts: [node1, node2]\n", id="sniffed-defaults"),
    pytest.param("hosts.txt", "node1\nnode2\n", id="text"),
    pytest.param("hosts.txt", "\ufeffnode1\nnode2\n", id="bom"),
])
def test_load_dispatch(tmp_path: Path, filename: str, content: str) -> None:
    path = tmp_path / filename
    path.write_text(content, encoding="utf-8")
    hosts = load_hostfile(path)
    assert names(hosts) == ["node1", "node2"]
    assert hosts[0].source.startswith(f"{path}:")


def test_missing_hostfile_is_an_error_not_localhost(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(HostfileError) as info:
        load_hostfile(missing)
    assert info.value.message == f"hostfile not found: {missing}"
    assert info.value.exit_code == 2


def test_directory_as_hostfile(tmp_path: Path) -> None:
    with pytest.raises(HostfileError, match="hostfile is a directory"):
        load_hostfile(tmp_path)


def test_binary_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "h"
    path.write_bytes(b"\xff\xfe\x00node")
    with pytest.raises(HostfileError, match="hostfile is not UTF-8 text"):
        load_hostfile(path)


def test_file_errors_carry_the_path(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("node1\nnode2 slots=two\n")
    with pytest.raises(HostfileError) as info:
        load_hostfile(str(path))
    assert info.value.message == f"{path}:2: slots must be a positive integer, got 'two'"
    assert (info.value.source, info.value.line) == (str(path), 2)


# --------------------------------------------------------------------------- -H


def test_host_expr_with_bracket_commas() -> None:
    hosts = parse_host_expr("dtuser@node[1,3-4],login2:2222")
    assert [(h.name, h.user, h.port) for h in hosts] == [
        ("node1", "dtuser", None), ("node3", "dtuser", None), ("node4", "dtuser", None),
        ("login2", None, 2222),
    ]
    assert {h.source for h in hosts} == {"-H"}


@pytest.mark.parametrize(("expr", "expected"), [
    pytest.param("node1", ["node1"], id="single"),
    pytest.param(" node1 , node2 ,", ["node1", "node2"], id="spaces-trailing-comma"),
    pytest.param("rack[1-2]-n[1,2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"], id="2d"),
    pytest.param("198.18.0.[11-12],[fe80::1]:22", ["198.18.0.11", "198.18.0.12", "fe80::1:22"],
                 id="ip"),
    pytest.param("localhost:2222,localhost:2223", ["localhost:2222", "localhost:2223"],
                 id="ports"),
])
def test_host_exprs(expr: str, expected: list[str]) -> None:
    assert labels(parse_host_expr(expr)) == expected


@pytest.mark.parametrize(("expr", "message"), [
    pytest.param("", "-H: empty host expression", id="empty"),
    pytest.param(" , ", "-H: empty host expression", id="only-commas"),
    pytest.param("node1 node2", "-H: unexpected space in 'node1 node2'", id="space"),
    pytest.param("node1 slots=2", "-H: unexpected space in 'node1 slots=2'", id="settings"),
    pytest.param("node[1-2],node2", "-H: duplicate host 'node2'", id="duplicate"),
    pytest.param("node$(id)", "-H: invalid host name 'node$(id)': '$' is not allowed in a "
                 "host name", id="injection"),
    pytest.param("node[1-3", "-H: bad host range 'node[1-3': missing bracket: \"node[1-3\"",
                 id="unclosed"),
    pytest.param("@group", "-H: invalid user name ''", id="group"),
])
def test_bad_host_exprs(expr: str, message: str) -> None:
    with pytest.raises(HostfileError) as info:
        parse_host_expr(expr)
    assert info.value.message == message


# --------------------------------------------------------------------------- filters


HOSTS = parse_host_expr("node[1-4],login2:2222")


@pytest.mark.parametrize(("include", "exclude", "expected"), [
    pytest.param(None, None, ["node1", "node2", "node3", "node4", "login2:2222"], id="none"),
    pytest.param("node[2-9]", None, ["node2", "node3", "node4"], id="include"),
    pytest.param(None, "node[1-2],login2", ["node3", "node4"], id="exclude"),
    pytest.param("node[1-3]", "node2", ["node1", "node3"], id="both"),
    pytest.param("node[1-4]!node2", None, ["node1", "node3", "node4"], id="nodeset-operator"),
    pytest.param("node1 login2", None, ["node1", "login2:2222"], id="space-separated"),
])
def test_filter_hosts(include: str | None, exclude: str | None, expected: list[str]) -> None:
    assert labels(filter_hosts(HOSTS, include, exclude)) == expected


@pytest.mark.parametrize(("include", "exclude", "message", "hint"), [
    pytest.param(None, "node[1-4],login2", "no hosts left after --exclude 'node[1-4],login2'",
                 "the hosts are login2,node[1-4]", id="exclude-all"),
    pytest.param("gpu1", None, "no hosts left after --include 'gpu1'",
                 "the hosts are login2,node[1-4]", id="include-none"),
    pytest.param("node1", "node1", "no hosts left after --exclude 'node1'",
                 "the hosts are node1", id="include-then-exclude"),
    pytest.param("@gpus", None, "--include: node groups are not supported: '@gpus'",
                 "list hosts or ranges, e.g. node[1-4],login2", id="group"),
    pytest.param(None, "node[1-", "--exclude: bad host expression 'node[1-': missing "
                 "bracket: \"node[1-\"", "e.g. node[1-4] or node[1-8]!node3", id="bad-range"),
    pytest.param(None, "node[2-1]", "--exclude: bad host expression 'node[2-1]': invalid "
                 "values in range: \"2-1\"", "e.g. node[1-4] or node[1-8]!node3",
                 id="reversed-range"),
])
def test_filter_errors(include: str | None, exclude: str | None, message: str,
                       hint: str) -> None:
    with pytest.raises(HostfileError) as info:
        filter_hosts(HOSTS, include, exclude)
    assert (info.value.message, info.value.hint) == (message, hint)


SPELLED = parse_host_expr("localhost,127.0.0.1:2201,127.0.0.1:2202,dtuser@login1:2222,"
                          "[fe80::1]:22")


@pytest.mark.parametrize(("exclude", "expected"), [
    pytest.param("127.0.0.1:2202", ["localhost", "127.0.0.1:2201", "login1:2222",
                                    "fe80::1:22"], id="host-port"),
    pytest.param("127.0.0.1", ["localhost", "login1:2222", "fe80::1:22"], id="bare-address"),
    pytest.param("dtuser@login1:2222,[fe80::1]:22", ["localhost", "127.0.0.1:2201",
                                                    "127.0.0.1:2202"], id="user-and-v6"),
    pytest.param("dtuser@login1", ["localhost", "127.0.0.1:2201", "127.0.0.1:2202",
                                   "fe80::1:22"], id="user-no-port"),
    pytest.param("127.0.0.1:220[1-2]", ["localhost", "login1:2222", "fe80::1:22"],
                 id="no-port-range"),
])
def test_exclude_matches_hosts_as_the_hostfile_spells_them(exclude: str,
                                                           expected: list[str]) -> None:
    """Issue 55 item 1: --exclude HOST:PORT matched nothing (a NodeSet of names), silently."""
    if exclude == "127.0.0.1:220[1-2]":  # a port is a number, not a range
        with pytest.raises(HostfileError):
            filter_hosts(SPELLED, None, exclude)
        return
    assert labels(filter_hosts(SPELLED, None, exclude)) == expected


def test_an_exclude_that_matches_nothing_is_warned_once() -> None:
    said: list[str] = []
    kept = filter_hosts(SPELLED, None, "locahost,127.0.0.1:2203,locahost,alice@login1:2222",
                        warn=said.append)
    assert len(kept) == len(SPELLED)
    assert said == ["--exclude locahost matched no host (did you mean localhost?)",
                    "--exclude 127.0.0.1:2203 matched no host (did you mean 127.0.0.1:2202?)",
                    "--exclude alice@login1:2222 matched no host (did you mean "
                    "dtuser@login1:2222?)"]
    said.clear()
    filter_hosts(HOSTS, "node1", "node2", warn=said.append)  # matched before --include
    filter_hosts(HOSTS, None, "node[1-8]!node3", warn=said.append)
    assert said == []


def test_exclude_sees_the_user_of_l() -> None:
    hosts = resolve_hosts(hostfile=None, hosts="node[1-2]", exclude="alice@node2",
                          user="alice", environ={})
    assert [(h.user, h.name) for h in hosts] == [("alice", "node1")]


# --------------------------------------------------------------------------- resolve_hosts


def test_resolve_empty_expr_is_not_nothing_given() -> None:
    with pytest.raises(HostfileError) as info:
        resolve_hosts(hostfile=None, hosts="", environ={"DTRAIN_HOSTFILE": "/nope"})
    assert info.value.message == "-H: empty host expression"


def test_resolve_from_expr_with_filters() -> None:
    hosts = resolve_hosts(hostfile=None, hosts="node[1-4]", exclude="node3", environ={})
    assert names(hosts) == ["node1", "node2", "node4"]


def test_resolve_from_file(tmp_path: Path) -> None:
    path = tmp_path / "h.txt"
    path.write_text("node[1-2] slots=4\n")
    hosts = resolve_hosts(hostfile=str(path), hosts=None, include="node2", environ={})
    assert [(h.name, h.slots) for h in hosts] == [("node2", 4)]


def test_resolve_from_environment(tmp_path: Path) -> None:
    path = tmp_path / "h.yaml"
    path.write_text("hosts: [a, b]\n")
    hosts = resolve_hosts(hostfile=None, hosts=None, environ={"DTRAIN_HOSTFILE": str(path)})
    assert names(hosts) == ["a", "b"]


def test_explicit_source_beats_environment() -> None:
    hosts = resolve_hosts(hostfile=None, hosts="x1", environ={"DTRAIN_HOSTFILE": "/nope"})
    assert names(hosts) == ["x1"]


def test_resolve_missing_file_from_environment(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    with pytest.raises(HostfileError) as info:
        resolve_hosts(hostfile=None, hosts=None, environ={"DTRAIN_HOSTFILE": str(missing)})
    assert info.value.message == f"hostfile not found: {missing} (from DTRAIN_HOSTFILE)"


def test_resolve_both_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        resolve_hosts(hostfile="h.txt", hosts="node1", environ={})
    assert info.value.message == "both -f/--hostfile and -H/--hosts given"
    assert info.value.hint == "pick one: -f FILE or -H EXPR"
    assert info.value.exit_code == 2


@pytest.mark.parametrize("environ", [
    pytest.param({}, id="unset"),
    pytest.param({"DTRAIN_HOSTFILE": ""}, id="empty"),
])
def test_resolve_nothing_given(environ: dict[str, str]) -> None:
    with pytest.raises(HostfileError) as info:
        resolve_hosts(hostfile=None, hosts=None, environ=environ)
    assert info.value.message == "no hosts given: use -f FILE or -H EXPR"


def test_resolve_never_falls_back_to_localhost(tmp_path: Path) -> None:
    with pytest.raises(HostfileError, match="hostfile not found"):
        resolve_hosts(hostfile=str(tmp_path / "missing"), hosts=None, environ={})


def test_resolve_exclude_everything() -> None:
    with pytest.raises(HostfileError) as info:
        resolve_hosts(hostfile=None, hosts="node[1-2]", exclude="node[1-2]", environ={})
    assert info.value.message == "no hosts left after --exclude 'node[1-2]'"


# --------------------------------------------------------------------------- fold


@pytest.mark.parametrize(("items", "expected"), [
    pytest.param(["198.18.0.11", "198.18.0.12", "198.18.0.13", "198.18.0.14"],
                 "198.18.0.[11-14]", id="ipv4"),
    pytest.param(["node1", "node2", "node3"], "node[1-3]", id="simple"),
    pytest.param(["node3", "node1", "node2", "node1"], "node[1-3]", id="unsorted-dupes"),
    pytest.param(["gpu01", "gpu02", "login2"], "gpu[01-02],login2", id="padded-mixed"),
    pytest.param(["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"], "rack[1-2]-n[1-2]", id="2d"),
    pytest.param(["fe80::1", "fe80::2"], "fe80::[1-2]", id="ipv6"),
    pytest.param(["node1", "odd!name"], "node1,odd!name", id="unfoldable-kept"),
    pytest.param([], "", id="empty"),
])
def test_fold(items: list[str], expected: str) -> None:
    assert fold(items) == expected


def test_fold_accepts_a_generator() -> None:
    assert fold(h.name for h in HOSTS) == "login2,node[1-4]"


# ------------------------------------------------ hints and env: (mutation round, issue #25)

BAD_YAML_HINTS = {
    "slots": "e.g. slots=8", "slots-bool": "e.g. slots=8", "unknown-host-key": None,
    "unknown-default-key": None, "unknown-top-key": None,
    "no-hosts-key": "add hosts: [node1, node2]", "not-list": 'e.g. hosts: ["gpu[01-04] slots=8"]',
    "empty-list": "add one host a line, e.g. 'node1 slots=8'",
    "empty-file": "add one host a line, e.g. 'node1 slots=8'", "top-list": None,
    "no-host": 'e.g. {host: "gpu[1-2]", slots: 8}', "number-entry": 'e.g. "node1 slots=8"',
    "host-with-space": 'e.g. host: "gpu[01-16]"', "repeated-key": "keep one",
    "user-conflict": "keep one user", "port": "e.g. node1:2222 or port=2222",
    "env-bool": 'quote it, e.g. "1", "true" or ""',
    "env-name": "letters, digits and '_', not starting with a digit",
    "env-list": "e.g. env: {NCCL_DEBUG: INFO}", "string-entry": "e.g. slots=8",
    "duplicate": "list each host once; use slots=N for more processes",
    "syntax": "check the indentation and quoting",
    "bad-name": "write [user@]host[:port], e.g. dtuser@node[1-4]:2222",
}


@pytest.mark.parametrize(("text", "message"), BAD_YAML)
def test_bad_yaml_hints(request: pytest.FixtureRequest, text: str, message: str) -> None:
    """What to do next, as printed after the message."""
    hint = BAD_YAML_HINTS[request.node.callspec.id]
    error = yaml_error(text)
    assert error.hint == hint
    assert str(error) == (f"{message} ({hint})" if hint else message)


@pytest.mark.parametrize(("env", "shown"), [
    pytest.param("{A: null}", "env.A: value must be a string, got a null (quote it, e.g. "
                 "\"1\", \"true\" or \"\")", id="null"),
    pytest.param("{A: }", "env.A: value must be a string, got a null (quote it, e.g. \"1\", "
                 "\"true\" or \"\")", id="empty"),
    pytest.param("{A: [1]}", "env.A: value must be a string, got a list (quote it, e.g. "
                 "\"1\", \"true\" or \"\")", id="list"),
    pytest.param('{A: "x\\0y"}', "env.A: the value contains a NUL byte, which no process "
                 "environment can carry (remove the \\0)", id="nul"),
    pytest.param("{1: x}", "env.1: invalid environment variable: 1 is not a name (letters, "
                 "digits and '_', not starting with a digit)", id="number-name"),
    pytest.param("{HOSTNAME: x}", "env.HOSTNAME: invalid environment variable: HOSTNAME is set "
                 "by the node itself and cannot be forwarded (leave it out: each node sets "
                 "its own)", id="node-owned"),
])
def test_bad_yaml_env_whole(env: str, shown: str) -> None:
    assert str(yaml_error(f"hosts:\n  - n0\n  - {{host: a, env: {env}}}\n")) == (
        f"c.yaml:3: hosts[1].{shown}")


def test_yaml_env_numbers_become_strings_in_file_order() -> None:
    hosts = parse_hostfile_yaml("hosts:\n  - {host: a, env: {B: 1, A: 2.5, C: '', D: 0x10}}\n",
                                "c.yaml")
    assert [h.env for h in hosts] == [(("A", "2.5"), ("B", "1"), ("C", ""), ("D", "16"))]


def test_a_yaml_reader_error_names_the_line_of_the_bad_character() -> None:
    # a reader error has no mark, only a character position: its line is counted
    error = yaml_error("\nhosts:\n  - a\n  - b\x07\n")
    assert str(error) == "c.yaml:4: not valid YAML: special characters are not allowed"


# ------------------------------------ the hostfile survivors, worked through (issue #25, round 4)


@pytest.mark.parametrize(("text", "shown"), [
    pytest.param("slots=4 node1", "h.txt:1: expected a host first, got 'slots=4' (write "
                 "[user@]host[:port] [slots=N] [key=value ...])", id="key-first"),
    pytest.param("node1 extra", "h.txt:1: unexpected 'extra': settings are key=value (one host "
                 "per line, e.g. 'node1 slots=8')", id="bare-word"),
    pytest.param("node1 slots=2 slots=4", "h.txt:1: slots given twice (keep one slots=)",
                 id="slots-twice"),
    pytest.param("node1 python=/a python=/b", "h.txt:1: python given twice (keep one python=)",
                 id="python-twice"),
])
def test_text_line_errors_whole_with_their_hints(text: str, shown: str) -> None:
    assert str(text_error(text)) == shown


def test_a_value_may_hold_equals_and_openmpi_keys_anywhere_are_skipped() -> None:
    (host,) = parse_hostfile_text("node1 max_slots=8 python=/opt/a=b/python max-slots=2 slots=4",
                                  "h.txt")
    assert (host.python, host.slots) == ("/opt/a=b/python", 4)


@pytest.mark.parametrize(("text", "line", "shown"), [
    pytest.param("a[1-65536]\nb\n", 2, "h.txt:2: with 'b' the hosts reach 65537, more than "
                 "65536 (the cap on one job, after all expansion) (check the ranges and repeated "
                 "entries)", id="text"),
])
def test_the_cap_counts_every_line_of_a_text_hostfile(text: str, line: int, shown: str) -> None:
    error = text_error(text)
    assert (str(error), error.line) == (shown, line)


def test_the_cap_counts_every_entry_of_a_yaml_hostfile() -> None:
    assert str(yaml_error("hosts:\n  - 'a[1-65536]'\n  - b\n")) == (
        "c.yaml:3: hosts[1]: with 'b' the hosts reach 65537, more than 65536 (the cap on one "
        "job, after all expansion) (check the ranges and repeated entries)")


TAG_HINT = " (quote it, or drop the !!tag)"


@pytest.mark.parametrize(("entry", "shown"), [
    # a tag's constructor refusing its text raised ValueError/KeyError/AttributeError out of
    # dtrain (a traceback, exit 1) before round 4
    pytest.param("{host: a, slots: !!int x}", "hosts[0].slots: bad value: 'x' is not a valid "
                 "!!int", id="int"),
    pytest.param("{host: a, port: !!bool maybe}", "hosts[0].port: bad value: 'maybe' is not a "
                 "valid !!bool", id="bool"),
    pytest.param("{host: a, python: !!timestamp soon}", "hosts[0].python: bad value: 'soon' is "
                 "not a valid !!timestamp", id="timestamp"),
    pytest.param("{host: a, slots: 2001-13-45}", "hosts[0].slots: bad value: '2001-13-45' is "
                 "not a valid !!timestamp", id="implicit-timestamp"),
    pytest.param("2001-13-45", "hosts[0]: bad value: '2001-13-45' is not a valid !!timestamp",
                 id="entry"),
    pytest.param("{host: a, user: [!!float x]}", "hosts[0].user: bad value: it holds a value "
                 "its tag cannot read", id="inside-a-list"),
    # YAML's own errors: the problem only (the file:line is in front already)
    pytest.param("{host: a, slots: !!foo 1}", "hosts[0].slots: bad value: could not determine "
                 "a constructor for the tag 'tag:yaml.org,2002:foo'", id="unknown-tag"),
    pytest.param("{host: a, slots: !!set [1]}", "hosts[0].slots: bad value: expected a mapping "
                 "node, but found sequence", id="set-of-a-list"),
    pytest.param("{!!foo host: a}", "hosts[0]: bad value: could not determine a constructor "
                 "for the tag 'tag:yaml.org,2002:foo'", id="key"),
    pytest.param("!!foo a", "hosts[0]: bad value: could not determine a constructor for the "
                 "tag 'tag:yaml.org,2002:foo'", id="entry-tag"),
    pytest.param("{host: !!foo a}", "hosts[0].host: bad value: could not determine a "
                 "constructor for the tag 'tag:yaml.org,2002:foo'", id="host"),
    pytest.param("{host: a, env: {!!foo A: x}}", "hosts[0].env: bad value: could not "
                 "determine a constructor for the tag 'tag:yaml.org,2002:foo'", id="env-name"),
    pytest.param("{host: a, env: {A: !!foo x}}", "hosts[0].env.A: bad value: could not "
                 "determine a constructor for the tag 'tag:yaml.org,2002:foo'", id="env-value"),
])
def test_a_value_yaml_cannot_build_is_one_line_naming_its_key(entry: str, shown: str) -> None:
    error = yaml_error(f"hosts:\n  - {entry}\n")
    assert str(error) == f"c.yaml:2: {shown}{TAG_HINT}"
    assert (error.source, error.line, error.exit_code) == ("c.yaml", 2, 2)


@pytest.mark.parametrize(("text", "shown"), [
    pytest.param("hosts:\n  - {host: a, slots: [1, 2]}\n", "c.yaml:2: hosts[0].slots: slots "
                 "must be a positive integer, got [1, 2] (e.g. slots=8)", id="list-built-whole"),
    pytest.param("hosts:\n  - [a]\n", "c.yaml:2: hosts[0]: expected a mapping of key: value",
                 id="entry-list"),
    pytest.param("defaults: [a]\nhosts: [a]\n", "c.yaml:1: defaults: expected a mapping of "
                 "key: value", id="defaults-list"),
    pytest.param("hosts:\n  - {host: 12}\n", "c.yaml:2: hosts[0].host: expected one host name "
                 "or range, got 12 (e.g. host: \"gpu[01-16]\")", id="host-number"),
    pytest.param("hosts:\n  - {host: ''}\n", "c.yaml:2: hosts[0].host: expected one host name "
                 "or range, got '' (e.g. host: \"gpu[01-16]\")", id="host-empty"),
])
def test_more_yaml_errors_whole(text: str, shown: str) -> None:
    assert str(yaml_error(text)) == shown


def test_a_file_sniffed_as_yaml_by_its_document_start(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("---\nhosts: [node1, node2]\n")
    assert names(load_hostfile(path)) == ["node1", "node2"]


@pytest.mark.parametrize("filename", ["h.yaml", "h.yml", "H.YAML", "h.Yml"])
def test_yaml_by_extension_whatever_the_first_line(tmp_path: Path, filename: str) -> None:
    path = tmp_path / filename
    path.write_text("{hosts: [node1, node2]}\n")  # a flow mapping: not sniffed as YAML
    hosts = load_hostfile(path)
    assert names(hosts) == ["node1", "node2"]
    assert hosts[0].source == f"{path}:1"


def test_a_text_hostfile_of_blank_lines_is_empty_not_bad_yaml(tmp_path: Path) -> None:
    # a form feed is blank to the text format; YAML's reader would refuse it
    path = tmp_path / "hosts"
    path.write_text("\x0c\n\n")
    with pytest.raises(HostfileError) as info:
        load_hostfile(path)
    assert str(info.value) == f"{path}: no hosts listed (add one host a line, e.g. 'node1 slots=8')"


def test_a_missing_hostfile_s_hint_names_where_the_path_came_from(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    for kwargs, hint in [
        ({"hostfile": str(missing)}, "check the path given to -f, or use -H HOSTS"),
        ({"hostfile": None, "environ": {"DTRAIN_HOSTFILE": str(missing)}},
         "check DTRAIN_HOSTFILE, or use -H HOSTS"),
    ]:
        with pytest.raises(HostfileError) as info:
            resolve_hosts(hosts=None, **{"environ": {}, **kwargs})
        assert info.value.hint == hint


def test_a_near_file_is_suggested_instead_of_the_hint(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hosts.txt").write_text("node1\n")
    with pytest.raises(HostfileError) as info:
        load_hostfile(tmp_path / "hosts.tx")
    assert (info.value.message, info.value.hint) == (
        f"hostfile not found: {tmp_path}/hosts.tx (did you mean {tmp_path}/hosts.txt?)", None)
    # a bare name: looked for in the working directory
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HostfileError) as info:
        load_hostfile("hosts.tx")
    assert info.value.message == "hostfile not found: hosts.tx (did you mean hosts.txt?)"
    # only a close name (difflib ratio >= 0.8): 'hosts' is 0.71 from 'hosts.txt'
    with pytest.raises(HostfileError) as info:
        load_hostfile("hosts")
    assert (info.value.message, info.value.hint) == (
        "hostfile not found: hosts", "check the path given to -f, or use -H HOSTS")


def test_a_hostfile_that_cannot_be_opened_says_why(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    (tmp_path / "f").write_text("node1\n")
    for path, why in [(loop, "Too many levels of symbolic links"),
                      (tmp_path / "f" / "hosts", "Not a directory")]:
        with pytest.raises(HostfileError) as info:
            load_hostfile(path)
        assert str(info.value) == f"cannot read hostfile {path}: {why}"
        assert info.value.exit_code == 2


def test_a_path_with_a_colon_is_split_at_its_line_number(tmp_path: Path) -> None:
    from launcher.hosts.hostfile import host_sources

    folder = tmp_path / "a:b"
    folder.mkdir()
    path = folder / "h.txt"
    path.write_text("node1\nnode2\n")
    assert host_sources(load_hostfile(path)) == str(path)
    path.write_text("node1\nnode1\n")
    with pytest.raises(HostfileError) as info:
        load_hostfile(path)
    assert (info.value.source, info.value.line) == (str(path), 2)
    assert info.value.message == f"{path}:2: duplicate host 'node1' (first at {path}:1)"


def test_host_sources_names_each_source_once_in_order(tmp_path: Path) -> None:
    from launcher.hosts.hostfile import host_sources

    path = tmp_path / "h.txt"
    path.write_text("node1\nnode2\n")
    hosts = load_hostfile(path) + parse_host_expr("x1,x2")
    assert host_sources(hosts) == f"{path}, -H"
    assert host_sources([]) == "unknown"
    alloc = resolve_hosts(hostfile=None, hosts=None,
                          environ={"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "7"})
    assert names(alloc) == ["node1", "node2"]
    assert host_sources(alloc) == "SLURM_JOB_NODELIST (job 7, no slot count)"


@pytest.mark.parametrize(("expr", "shown"), [
    pytest.param("node1 node2", "-H: unexpected space in 'node1 node2' (separate hosts with "
                 "commas: -H 'dtuser@node[1-4],login2:2222')", id="space"),
    pytest.param(" , ", "-H: empty host expression (e.g. -H 'node[1-4]')", id="empty"),
])
def test_host_expr_errors_whole_with_their_hints(expr: str, shown: str) -> None:
    with pytest.raises(HostfileError) as info:
        parse_host_expr(expr)
    assert str(info.value) == shown


def test_host_expr_splits_at_commas_only() -> None:
    assert labels(parse_host_expr("rackX1,rackX2")) == ["rackX1", "rackX2"]


def test_an_include_over_the_cap_names_the_option() -> None:
    with pytest.raises(HostfileError) as info:
        filter_hosts(HOSTS, "node[1-100000]", None)
    assert str(info.value) == ("--include: 'node[1-100000]' makes 100000 hosts, over the cap "
                               "of 65536 hosts per job (check the range bounds)")


def test_nothing_given_says_every_way_to_give_hosts() -> None:
    with pytest.raises(HostfileError) as info:
        resolve_hosts(hostfile=None, hosts=None, environ={})
    assert str(info.value) == ("no hosts given: use -f FILE or -H EXPR (or set "
                               "DTRAIN_HOSTFILE=FILE, or run inside salloc/sbatch)")


def test_fold_upper_case_and_names_nodeset_cannot_read() -> None:
    assert fold(["GPU1", "GPU2", "Login"]) == "GPU[1-2],Login"
    long = "n" + "9" * 300  # too long a number for NodeSet's ranges: listed as it is
    assert fold([long, "n1"]) == f"{long},n1"


# ------------------------------------------ entries.py, the shared grammar (issue #25, round 4)

ADDRESS_ERRORS = [
    pytest.param("node[1-9999999]", "host range 'node[1-9999999]' expands to 9999999 hosts "
                 "(more than 65536) (check the range bounds; 65536 hosts is the cap on one job)",
                 id="huge-range"),
    pytest.param("n[1-2,1-70000]", "host range 'n[1-2,1-70000]' expands to 70002 hosts (more "
                 "than 65536) (check the range bounds; 65536 hosts is the cap on one job)",
                 id="every-part-counted"),
    pytest.param("n[1-70000,5]", "host range 'n[1-70000,5]' expands to 70001 hosts (more than "
                 "65536) (check the range bounds; 65536 hosts is the cap on one job)",
                 id="parts-added"),
    pytest.param("n[1-300][1-300]", "host range 'n[1-300][1-300]' expands to 90000 hosts (more "
                 "than 65536) (check the range bounds; 65536 hosts is the cap on one job)",
                 id="brackets-multiplied"),
    # a reversed or malformed part counts 0 (1 for a whole bracket): NodeSet names the fault
    pytest.param("n[3-1,1-65536]", "bad host range 'n[3-1,1-65536]': invalid values in range: "
                 "\"3-1\" (write ranges as node[1-4], gpu[01-16] or node[1,3-5])", id="reversed"),
    pytest.param("n[a][1-40000]", "bad host range 'n[a][1-40000]': illegal reopening bracket: "
                 "\"[1-40000]\" (write ranges as node[1-4], gpu[01-16] or node[1,3-5])",
                 id="malformed-bracket"),
    pytest.param("node]1", "bad host range 'node]1': illegal closing bracket: \"node]1\" (write "
                 "ranges as node[1-4], gpu[01-16] or node[1,3-5])", id="closing-bracket-only"),
    pytest.param("a[1],b", "one host entry at a time, got 'a[1],b' (put each host on its own "
                 "line, or use a range: node[1,3-4])", id="comma-after-a-bracket"),
    pytest.param("-x@node1", "invalid user name '-x' (use letters, digits, '.', '-', '_', e.g. "
                 "dtuser@node1)", id="user"),
    pytest.param("999.1.1.1", "invalid host name '999.1.1.1': not a valid IPv4 address (e.g. "
                 "198.18.0.11 or 198.18.0.[11-14])", id="ipv4"),
    pytest.param("[fe80::zz]", "invalid IPv6 address 'fe80::zz' (e.g. [fe80::1]:22)", id="ipv6"),
    pytest.param("[fe80::1", "missing ']' in '[fe80::1' (e.g. [fe80::1]:22)", id="ipv6-open"),
    pytest.param("[fe80::1]x", "unexpected 'x' after '[fe80::1]' (e.g. [fe80::1]:22)",
                 id="after-ipv6"),
    pytest.param("[fe80::1]]:22", "unexpected ']:22' after '[fe80::1]' (e.g. [fe80::1]:22)",
                 id="second-bracket"),
    pytest.param("[node1]:22", "bad host range '[node1]': cannot convert string to integer: "
                 "\"node1\" (write ranges as node[1-4], gpu[01-16] or node[1,3-5])",
                 id="bracketed-name"),
    pytest.param("node[1-2]:22:33", "bad port '22:33': must be a number from 1 to 65535 (e.g. "
                 "node1:2222 or port=2222)", id="range-two-colons"),
    pytest.param("node1:65536", "bad port '65536': must be a number from 1 to 65535 (e.g. "
                 "node1:2222 or port=2222)", id="port-over"),
    pytest.param(":22", "missing host name (write [user@]host[:port], e.g. "
                 "dtuser@node[1-4]:2222)", id="no-name"),
    pytest.param("u@:22", "missing host name (write [user@]host[:port], e.g. "
                 "dtuser@node[1-4]:2222)", id="user-no-name"),
    pytest.param("node1 python=", "invalid python '': is empty (give the interpreter's path on "
                 "the node, e.g. python=/opt/venv/bin/python)", id="python-empty"),
    pytest.param("node1 python=-c", "invalid python '-c': starts with '-' (it would be read as "
                 "an option) (give the interpreter's path on the node, e.g. "
                 "python=/opt/venv/bin/python)", id="python-dash"),
    pytest.param("node1 python=~root/py", "invalid python '~root/py': uses ~name: only ~ and ~/ "
                 "(the remote user's own home) are understood (give the interpreter's path on "
                 "the node, e.g. python=/opt/venv/bin/python)", id="python-tilde-user"),
    pytest.param("x" * 254, "invalid host name '" + "x" * 254 + "': longer than 253 "
                 "characters (write [user@]host[:port], e.g. dtuser@node[1-4]:2222)",
                 id="name-254"),
]


@pytest.mark.parametrize(("line", "shown"), ADDRESS_ERRORS)
def test_entry_errors_whole_with_their_hints(line: str, shown: str) -> None:
    error = text_error(line)
    assert str(error) == f"h.txt:1: {shown}"
    assert (error.source, error.line, error.exit_code) == ("h.txt", 1, 2)


@pytest.mark.parametrize(("line", "expected"), [
    pytest.param("node1:1", ("node1", None, 1, None), id="port-1"),
    pytest.param("node1:65535", ("node1", None, 65535, None), id="port-65535"),
    pytest.param("[fe80::1]", ("fe80::1", None, None, None), id="ipv6-no-port"),
    pytest.param("alice@corp@node1", ("node1", "alice@corp", None, None), id="user-with-at"),
    pytest.param("node1 python=~", ("node1", None, None, "~"), id="python-home"),
    pytest.param(".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]),
                 (".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]), None, None, None),
                 id="name-253-labels-63"),
])
def test_entries_at_the_limits_are_accepted(line: str, expected: tuple) -> None:
    (host,) = parse_hostfile_text(line, "h.txt")
    assert (host.name, host.user, host.port, host.python) == expected


@pytest.mark.parametrize(("value", "shown"), [
    pytest.param("[a]", "invalid python ['a']: is not a string", id="list"),
    pytest.param("5", "invalid python 5: is not a string", id="number"),
])
def test_a_yaml_python_that_is_not_a_string(value: str, shown: str) -> None:
    assert str(yaml_error(f"hosts:\n  - {{host: a, python: {value}}}\n")) == (
        f"c.yaml:2: hosts[0].python: {shown} (give the interpreter's path on the node, e.g. "
        "python=/opt/venv/bin/python)")


def test_an_entry_s_python_wins_over_the_default() -> None:
    hosts = parse_hostfile_yaml("defaults: {python: /a/py, slots: 2}\nhosts:\n  - a\n"
                                "  - {host: b, python: /b/py}\n", "c.yaml")
    assert [(h.name, h.python, h.slots) for h in hosts] == [("a", "/a/py", 2), ("b", "/b/py", 2)]


def test_a_path_for_a_node_may_be_what_an_interpreter_may_not() -> None:
    from launcher.hosts.entries import node_value_problem

    assert node_value_problem("") is None and node_value_problem("-rf") is None  # a workdir
    assert node_value_problem("", python=True) == "is empty"
    assert node_value_problem("-rf", python=True) == (
        "starts with '-' (it would be read as an option)")
    assert node_value_problem("~") is None and node_value_problem("~/x") is None


def test_the_size_of_an_option_s_expression_is_counted_before_it_is_built() -> None:
    from launcher.hosts.entries import check_expr_size, expr_size

    assert expr_size("nodeX[1-70000]") == 70000
    assert expr_size("a[1-4],b[1-2]!a3 c[1-3]") == 4 + 2 + 1 + 3
    check_expr_size("n[1-65536]", "--include")  # exactly the cap: fine
    with pytest.raises(HostfileError) as info:
        check_expr_size("n[1-65537]", "--include")
    assert str(info.value) == ("--include: 'n[1-65537]' makes 65537 hosts, over the cap of "
                               "65536 hosts per job (check the range bounds)")


def test_slots_have_a_cap_named_with_file_line_and_a_hint() -> None:
    """``slots=`` is processes per host: at most MAX_SLOTS (4096); a number past it, or
    thousands of digits (int() refuses more than 4,300: it was a traceback), is exit 2 with
    the line, in text and YAML (issue #25, round 5)."""
    from launcher.hosts.entries import MAX_SLOTS
    assert MAX_SLOTS == 4096
    (host,) = parse_hostfile_text("node1 slots=4096", "h.txt")
    assert host.slots == 4096
    (host,) = parse_hostfile_text("node1 slots=0008", "h.txt")
    assert host.slots == 8
    hint = "slots is the processes on that host, e.g. its GPU count: slots=8"
    cases = [
        ("node0\nnode1 slots=4097", "h.txt:2: slots=4097 is more than 4096 (the cap on "
         "one host's processes)"),
        ("node1 slots=99999999999999999999", "h.txt:1: slots=99999999999999999999 is more "
         "than 4096 (the cap on one host's processes)"),
        ("node1 slots=" + "9" * 5000, "h.txt:1: slots=9999999999...9999999999 (5000 digits) "
         "is more than 4096 (the cap on one host's processes)"),
        ("node1 slots=" + "0" * 30 + "8", None),
        ("node1 slots=" + "1" * 24, "h.txt:1: slots=" + "1" * 24 + " is more than 4096 (the "
         "cap on one host's processes)"),  # up to 24 characters: shown whole
        ("node1 slots=" + "1" * 25, "h.txt:1: slots=1111111111...1111111111 (25 digits) is "
         "more than 4096 (the cap on one host's processes)"),
    ]
    for text, message in cases:
        if message is None:
            assert parse_hostfile_text(text, "h.txt")[0].slots == 8
            continue
        with pytest.raises(HostfileError) as info:
            parse_hostfile_text(text, "h.txt")
        assert (info.value.message, info.value.hint) == (message, hint), text
    with pytest.raises(HostfileError) as info:
        parse_hostfile_text("node1:" + "9" * 5000, "h.txt")
    assert info.value.message.startswith("h.txt:1: bad port '999")
    assert info.value.message.endswith("': must be a number from 1 to 65535")
    for text, message in [
        ("hosts:\n  - {host: a, slots: 4097}\n",
         "c.yaml:2: hosts[0].slots: slots=4097 is more than 4096 (the cap on one host's "
         "processes)"),
        ("defaults:\n  slots: '100000'\nhosts: [a]\n",
         "c.yaml:2: defaults.slots: slots=100000 is more than 4096 (the cap on one host's "
         "processes)"),
    ]:
        with pytest.raises(HostfileError) as info:
            parse_hostfile_yaml(text, "c.yaml")
        assert (info.value.message, info.value.hint) == (message, hint), text
    assert parse_hostfile_yaml("hosts:\n  - {host: a, slots: 4096}\n", "c.yaml")[0].slots == 4096
