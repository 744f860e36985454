"""pdsh habits (issue 24 item 10): -w HOSTS, -x EXCLUDE, -l USER, -N, -t SECONDS, -o OPTION,
WCOLL as the hostfile, and `-f 32` explained (dtrain's -f is the hostfile, the fan-out is
--fanout). Each failed on the old main with "options for the script or command go after
it" (or, for WCOLL, "no hosts given")."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.transports.ssh.settings import ssh_option
from tests.util import assert_exit, dtrain


def test_ssh_option_spellings() -> None:
    assert ssh_option("Port=2222") == "Port 2222"
    assert ssh_option("ProxyJump login") == "ProxyJump login"
    for bad in ("Port", "Host=x", "Port=1\nHost *", "=3"):
        with pytest.raises(ValueError):
            ssh_option(bad)


def test_f_with_a_number_says_what_f_is(tmp_path: Path) -> None:
    res = dtrain(["exec", "-f", "32", "--", "true"])
    assert_exit(res, 2)
    assert "dtrain's -f is the hostfile" in res.stderr and "--fanout 32" in res.stderr


def test_bad_o_is_exit_2() -> None:
    res = dtrain(["exec", "-w", "localhost", "-o", "Port", "--", "true"])
    assert_exit(res, 2)
    assert "-o 'Port': expected KEY=VALUE" in res.stderr


def test_w_x_and_N_on_localhost() -> None:
    res = dtrain(["exec", "-w", "localhost,127.0.0.1", "-x", "127.0.0.1", "-N", "--",
                  "echo", "hi"])
    assert_exit(res, 0)
    assert res.stdout == "hi\n"


def test_exclude_host_port_and_a_typo(tmp_path: Path) -> None:
    """Issue 55 item 1: -x HOST:PORT was ignored, and so was a typo, silently."""
    res = dtrain(["exec", "-w", "localhost,127.0.0.1:1", "-x", "127.0.0.1:1,locahost", "-N",
                  "--", "echo", "hi"])
    assert_exit(res, 0)
    assert res.stdout == "hi\n"
    assert res.stderr.count("matched no host") == 1
    assert "warning: --exclude locahost matched no host (did you mean localhost?)" \
        in res.stderr


def test_the_unreachable_hint_names_the_port(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("localhost\n127.0.0.1:1\n127.0.0.1:9\n")
    res = dtrain(["exec", "-f", str(hostfile), "-t", "5", "--", "true"])
    assert_exit(res, 255)
    assert "--exclude 127.0.0.1:1,127.0.0.1:9" in res.stderr
    res = dtrain(["exec", "-f", str(hostfile), "--exclude", "127.0.0.1:1,127.0.0.1:9", "--",
                  "true"])
    assert_exit(res, 0)


def test_w_caret_file_and_w_dash_stdin(tmp_path: Path) -> None:
    """Issue 55 item 3: pdsh's -w ^FILE was refused ("'^' is not allowed in a host name")."""
    hosts = tmp_path / "hosts"
    hosts.write_text("# the login node\nlocalhost   # this machine\n\n")
    res = dtrain(["exec", "-w", f"^{hosts}", "-N", "--", "echo", "hi"])
    assert_exit(res, 0)
    assert res.stdout == "hi\n"
    res = dtrain(["exec", "-w", "-", "-N", "--", "echo", "hi"], input="localhost\n")
    assert_exit(res, 0)
    assert res.stdout == "hi\n"
    res = dtrain(["exec", "-w", f"^{tmp_path / 'nope'}", "--", "true"])
    assert_exit(res, 2)
    assert f"hostfile not found: {tmp_path / 'nope'} (from -w ^" in res.stderr


def test_pdsh_flags_reach_the_nodes(cluster, tmp_path: Path) -> None:
    env = cluster.client_env()
    res = dtrain(["exec", "-w", "node[1-3]", "-x", "node2", "-N", "-t", "5", "--",
                  "hostname"], env=env)
    assert_exit(res, 0)
    assert sorted(res.stdout.split()) == ["node1", "node3"]  # no "node1: " prefix
    # -o wins over ~/.ssh/config: nothing listens on port 1
    res = dtrain(["exec", "-w", "node1", "-o", "Port=1", "-t", "5", "--", "true"], env=env)
    assert_exit(res, 255)
    # -l: the user to log in as (no key of ours lets us in as nobody)
    res = dtrain(["exec", "-w", "node1", "-l", "nobody", "-t", "5", "--", "whoami"], env=env)
    assert_exit(res, 255)
    assert "permission denied" in res.stderr
    res = dtrain(["exec", "-w", "node1", "-l", cluster.user, "--", "whoami"], env=env)
    assert_exit(res, 0)
    assert res.stdout.strip() == f"node1: {cluster.user}"


def test_wcoll_is_the_hostfile(cluster, tmp_path: Path) -> None:
    hosts = tmp_path / "wcoll"
    hosts.write_text("node2\nnode4\n")
    res = dtrain(["exec", "--", "hostname"], env=cluster.client_env(WCOLL=str(hosts)))
    assert_exit(res, 0)
    assert sorted(res.stdout.splitlines()) == ["node2: node2", "node4: node4"]
