"""SSH on asyncssh: the only package that imports asyncssh (tests/test_layers.py pins it).

- ``transport``: ``SSHTransport → SSHConnection → SSHProcess`` (retries, ProxyJump routes);
- ``settings``: ``SSHSettings``, the algorithms and key names dtrain offers;
- ``hostkeys``: strict known_hosts checking, accept-new, fingerprints;
- ``config``: ~/.ssh/config per host (parsed once), ProxyJump's hops;
- ``sftp``: a node's files over SFTP (`cp`);
- ``errormap``: every asyncssh/socket failure → a DtrainError naming the host;
- ``login``, ``keyfiles``: the key-only and password-once logins and the key files that
  `dtrain keys` needs.

Lazy (PEP 562): a name is imported from its module when first used, so
``launcher.transports.ssh.SSHSettings`` (what every command builds from its options)
costs no asyncssh import, ~0.1 s of CPU that a localhost-only command never needs
(tests/test_cli_lean.py pins it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.transports.ssh.config import (
        MAX_JUMP_DEPTH,
        load_host_config,
        parse_proxy_jump,
    )
    from launcher.transports.ssh.errormap import (
        host_key_error,
        map_sftp_errors,
        map_ssh_errors,
    )
    from launcher.transports.ssh.hostkeys import (
        HostKeyPolicy,
        HostKeyVerdict,
        SSHKey,
        UnknownHostKey,
        fingerprint,
    )
    from launcher.transports.ssh.settings import (
        CIPHERS,
        DEFAULT_KEY_NAMES,
        DTRAIN_KEY_NAME,
        KEX_ALGS,
        SSHSettings,
    )
    from launcher.transports.ssh.sftp import SFTPFileSystem
    from launcher.transports.ssh.transport import SSHConnection, SSHProcess, SSHTransport

_WHERE = {
    **dict.fromkeys(("MAX_JUMP_DEPTH", "load_host_config", "parse_proxy_jump"), "config"),
    **dict.fromkeys(("host_key_error", "map_sftp_errors", "map_ssh_errors"), "errormap"),
    **dict.fromkeys(("HostKeyPolicy", "HostKeyVerdict", "SSHKey", "UnknownHostKey",
                     "fingerprint"), "hostkeys"),
    **dict.fromkeys(("CIPHERS", "DEFAULT_KEY_NAMES", "DTRAIN_KEY_NAME", "KEX_ALGS",
                     "SSHSettings"), "settings"),
    "SFTPFileSystem": "sftp",
    **dict.fromkeys(("SSHConnection", "SSHProcess", "SSHTransport"), "transport"),
}

__all__ = [
    "CIPHERS", "DEFAULT_KEY_NAMES", "DTRAIN_KEY_NAME", "KEX_ALGS", "MAX_JUMP_DEPTH",
    "HostKeyPolicy", "HostKeyVerdict", "SFTPFileSystem", "SSHConnection", "SSHKey",
    "SSHProcess", "SSHSettings", "SSHTransport", "UnknownHostKey", "fingerprint",
    "host_key_error", "load_host_config", "map_sftp_errors", "map_ssh_errors",
    "parse_proxy_jump",
]  # every name of _WHERE (tests/test_cli_lean.py)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups are plain module attributes
    return value
