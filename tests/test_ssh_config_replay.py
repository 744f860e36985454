"""dtrain's replay of ~/.ssh/config (transports/ssh/configreplay.py) says what asyncssh's own
parse says, for every host, option and error (issue 26: the parse per host was O(nodes)).

Both parsers read the same files for the same (host, user, port); their option
dictionaries, and any error message, must be equal. No network.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from asyncssh.config import SSHClientConfig

from launcher.transports.ssh import configreplay
from launcher.transports.ssh.configreplay import ReplayConfig, config_class

MAIN = """\
# a comment, then blank lines

Host gpu[01] bracket-literal
    HostName 10.0.0.1
    Port 2201
Host gpu0? !gpu09
    User wild
    IdentityFile ~/.ssh/id_%h_%r_%p
Host=eq-host
    Port=2222
    User = spaced
Host "quoted host" tab\there
    HostName quoted.example
Host jump
    ProxyJump a@b:22,c
    ProxyCommand ssh -W %h:%p bastion -o "Opt=1"
Host *.example !bad.example
    ServerAliveInterval 15
    Compression yes
Match originalhost matched-* user dtuser
    Port 2300
Match host 10.0.0.*
    ForwardAgent yes
Match localuser {me}
    ConnectTimeout 7
Match !all
    Port 1
Match canonical
    Port 2
Match final
    Port 3
Host included-*
    Include {inc}/*.conf
Host *
    User fallback
    Port 22
    IdentityFile ~/.ssh/id_ed25519
    UnknownOptionIgnored yes
    RekeyLimit 1G 1h
"""
INCLUDED = """\
Port 2400
Host included-deep
    HostName deep.example
"""
HOSTS = ["gpu01", "gpu[01]", "bracket-literal", "gpu05", "gpu09", "gpu10", "eq-host",
         "quoted host", "tab\there", "tab", "jump", "a.example", "bad.example",
         "matched-1", "10.0.0.1", "included-x", "included-deep", "other", "GPU01", ""]


def _load(cls: type[SSHClientConfig], path: Path, host: str, user: Any = "dtuser",
          port: Any = ()) -> tuple[str, Any]:
    try:
        cfg = cls.load(None, [path], False, False, False, getpass.getuser(), user, host, port)
    except Exception as exc:  # the error, as the user would see it
        return ("error", (type(exc).__name__, str(exc)))
    return ("ok", cfg._options)


def _write(tmp_path: Path, text: str) -> Path:
    inc = tmp_path / "inc"
    inc.mkdir(exist_ok=True)
    (inc / "a.conf").write_text(INCLUDED)
    path = tmp_path / "config"
    path.write_text(text.format(me=getpass.getuser(), inc=inc))
    return path


def test_the_replay_is_used_with_this_asyncssh() -> None:
    """A new asyncssh falls back to its own parse: the test then says the replay must be
    checked against it (and the version added to CHECKED)."""
    assert asyncssh.__version__ in configreplay.CHECKED, asyncssh.__version__
    assert config_class() is ReplayConfig


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("user,port", [("dtuser", ()), ((), 2022), ("root", 22)])
def test_replay_gives_asyncssh_s_options(tmp_path: Path, host: str, user: Any,
                                         port: Any) -> None:
    path = _write(tmp_path, MAIN)
    mine = _load(ReplayConfig, path, host, user, port)
    assert mine == _load(SSHClientConfig, path, host, user, port), host
    assert mine[0] == "ok"


@pytest.mark.parametrize("text", [
    'Host a\n    HostName "unbalanced\n',  # shlex error, also in a block that does not apply
    "Host b\n    Port\n",  # missing value
    "Host *\n    Port 22 23\n",  # extra data
    "Host *\n    Port notanumber\n",  # a handler's own error
    "Host\n",  # a Host line without patterns
    "Match nonsense x\n",
    "Port 1\nHost *\n    Port 2\n",  # before any Host: applies to all, first value wins
])
def test_replay_fails_where_asyncssh_fails_and_says_the_same(tmp_path: Path,
                                                            text: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    for host in ("a", "b", "c"):
        assert _load(ReplayConfig, path, host) == _load(SSHClientConfig, path, host), text


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("Host a\n    Port 1\n")
    assert _load(ReplayConfig, path, "a")[1]["Port"] == 1
    path.write_text("Host a\n    Port 2222\n")  # another size: another cache key
    assert _load(ReplayConfig, path, "a")[1]["Port"] == 2222


def test_many_node_blocks_give_each_host_its_own(tmp_path: Path) -> None:
    """The cluster's shape (a block per node, two names each): every host's options."""
    text = "".join(f"Host node{i}\n    HostName 198.18.0.{i}\n    Port 22\n"
                   f"Host alt{i}\n    HostName 198.18.0.{i}\n    Port 2222\n"
                   for i in range(1, 130))
    path = tmp_path / "config"
    path.write_text(text + "Host *\n    User dtuser\n")
    for host in ("node1", "node77", "alt129", "node130", "alt0"):
        mine = _load(ReplayConfig, path, host, ())
        assert mine == _load(SSHClientConfig, path, host, ()), host
