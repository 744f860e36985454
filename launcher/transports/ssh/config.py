"""~/.ssh/config as it applies to one host, parsed once per host, and ProxyJump's hops."""

from __future__ import annotations

import functools
import getpass
import shlex
from typing import Any, cast

import asyncssh
import asyncssh.config
from asyncssh.config import SSHClientConfig

from launcher.errors import ConnectError
from launcher.models import Host
from launcher.transports.ssh.configreplay import config_class
from launcher.transports.ssh.settings import SSHSettings

MAX_JUMP_DEPTH = 8


def parse_proxy_jump(spec: str, where: str) -> list[Host]:
    """ProxyJump's hops, in order: ``[ssh://][user@]host[:port]``, comma-separated.

    ``host`` may be a bracketed IPv6 address (``[fd00::1]:2222``); a bare IPv6 address is
    taken whole (no port). Anything else is a ConnectError naming the host it was set for.
    """
    hops = []
    for raw in spec.split(","):
        text = raw.strip()
        if text.startswith("ssh://"):
            text = text[len("ssh://"):].rstrip("/")
        user, at, rest = text.rpartition("@")
        port = ""
        if rest.startswith("["):
            name, close, tail = rest[1:].partition("]")
            if not close or (tail and not tail.startswith(":")):
                name = ""
            port = tail[1:]
        elif rest.count(":") > 1:
            name = rest  # a bare IPv6 address
        else:
            name, _, port = rest.partition(":")
        if not name or any(c in name for c in " \t/@[]") or (port and not (
                port.isdigit() and 0 < int(port) < 65536)) or (at and not user):
            raise ConnectError(f"cannot read ProxyJump hop {raw.strip()!r} in {spec!r}",
                               host=where, hint="use [ssh://][user@]host[:port] hops separated "
                               "by commas; IPv6 addresses in brackets: [fd00::1]:22")
        hops.append(Host(name=name, user=user or None, port=int(port) if port else None))
    return hops


class _CachedShlex:
    """``shlex`` as asyncssh's config parser sees it, with ``split`` memoised.

    asyncssh evaluates ~/.ssh/config separately for every host (Host/Match blocks apply
    while it reads), re-splitting every line each time: with a generated config of a few
    hundred node blocks that was most of the launcher's CPU per host (docs/scaling.md).
    The split of a line does not depend on the host, so it is cached; everything else
    (matching, handlers, %-expansion) is still asyncssh's own code, run per host.
    """

    split = staticmethod(functools.lru_cache(maxsize=16384)(
        lambda line: tuple(shlex.split(line))))

    def __getattr__(self, name: str) -> Any:
        return getattr(shlex, name)


asyncssh.config.shlex = _CachedShlex()  # type: ignore[attr-defined,assignment]


class ParsedConfigOptions(asyncssh.SSHClientConnectionOptions):
    """Hands a host's already-parsed ~/.ssh/config to ``create_connection``.

    asyncssh builds a connection's options on top of ``options.config`` (its "last
    config"); passing this carrier with ``config=[]`` makes it reuse the config dtrain
    parsed for the host (ProxyJump, IdentityFile...) instead of parsing the file again.
    """

    def __init__(self, config: SSHClientConfig) -> None:  # no prepare(): nothing to build
        self.kwargs = {}
        self.config = config


def load_host_config(settings: SSHSettings, host: Host) -> SSHClientConfig:
    """~/.ssh/config as it applies to one host (HostName, ProxyJump, known_hosts files...),
    through the replay of the file's split lines where it mirrors this asyncssh
    (configreplay.py)."""
    path = settings.config_path
    paths = [str(path)] if path.is_file() else []
    if settings.options_path is not None:  # -o: read first, so its values win
        paths.insert(0, str(settings.options_path))
    return cast(SSHClientConfig, config_class().load(
        None, paths, False, False, False, getpass.getuser(), host.user or (), host.name,
        host.port or ()))

