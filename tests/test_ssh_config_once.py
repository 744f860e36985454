"""~/.ssh/config is read once per host, and what it says still applies (docs/scaling.md).

asyncssh evaluates the config per connection; dtrain parses it per host for ProxyJump and
IdentityFile and hands that parsed config to asyncssh instead of letting it read the file
a second time. A real asyncssh server on 127.0.0.1 checks that HostName, Port and User from
the file are honoured.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncssh
import pytest
from asyncssh.config import SSHClientConfig

from launcher.models import Host
from launcher.transports.ssh import SSHSettings, SSHTransport
from launcher.transports.ssh.configreplay import config_class

KEY = asyncssh.generate_private_key("ssh-ed25519")


class _Open(asyncssh.SSHServer):
    users: list[str]

    def begin_auth(self, username: str) -> bool:
        self.users.append(username)
        return False  # no authentication needed


async def test_config_is_parsed_once_per_host_and_still_applies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    users: list[str] = []

    def factory() -> _Open:
        server = _Open()
        server.users = users
        return server

    acceptor = await asyncssh.listen("127.0.0.1", 0, server_host_keys=[KEY],
                                     server_factory=factory)
    port = acceptor.sockets[0].getsockname()[1]
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    filler = "".join(f"Host other{i}\n    HostName 198.18.0.{i % 200 + 10}\n\n"
                     for i in range(200))
    (ssh / "config").write_text(
        f"{filler}Host gpu-a gpu-b gpu-c\n    HostName 127.0.0.1\n    Port {port}\n"
        "    User from-config\n")
    parsed: list[Path] = []
    parser = config_class()  # asyncssh's SSHClientConfig, or dtrain's replay of it
    real_parse = parser.parse

    def counting_parse(self: SSHClientConfig, path: Path) -> None:
        parsed.append(path)
        real_parse(self, path)

    monkeypatch.setattr(parser, "parse", counting_parse)
    try:
        transport = SSHTransport(SSHSettings(home=tmp_path, accept_new=True, retries=0,
                                             connect_timeout=5))
        hosts = [Host("gpu-a"), Host("gpu-b"), Host("gpu-c")]
        conns = await asyncio.gather(*(transport.connect(h) for h in hosts))
        for conn in conns:
            await conn.aclose()
        await transport.aclose()
    finally:
        acceptor.close()
    assert users == ["from-config"] * 3  # User, HostName and Port came from the file
    assert parsed == [ssh / "config"] * 3, "the config must be parsed once per host"
