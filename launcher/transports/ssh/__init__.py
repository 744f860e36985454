"""SSH on asyncssh: the only package that imports asyncssh (tests/test_layers.py pins it).

- ``transport``: ``SSHTransport → SSHConnection → SSHProcess`` (retries, ProxyJump routes);
- ``settings``: ``SSHSettings``, the algorithms and key names dtrain offers;
- ``hostkeys``: strict known_hosts checking, accept-new, fingerprints;
- ``config``: ~/.ssh/config per host (parsed once), ProxyJump's hops;
- ``sftp``: a node's files over SFTP (`cp`);
- ``errormap``: every asyncssh/socket failure → a DtrainError naming the host;
- ``login``, ``keyfiles``: the key-only and password-once logins and the key files that
  `dtrain keys` needs.
"""

from __future__ import annotations

from launcher.transports.ssh.config import MAX_JUMP_DEPTH, load_host_config, parse_proxy_jump
from launcher.transports.ssh.errormap import host_key_error, map_sftp_errors, map_ssh_errors
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

__all__ = [
    "CIPHERS", "DEFAULT_KEY_NAMES", "DTRAIN_KEY_NAME", "KEX_ALGS", "MAX_JUMP_DEPTH",
    "HostKeyPolicy", "HostKeyVerdict", "SFTPFileSystem", "SSHConnection", "SSHKey",
    "SSHProcess", "SSHSettings", "SSHTransport", "UnknownHostKey", "fingerprint",
    "host_key_error", "load_host_config", "map_sftp_errors", "map_ssh_errors",
    "parse_proxy_jump",
]
