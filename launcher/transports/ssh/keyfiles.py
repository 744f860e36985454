"""SSH key files through asyncssh: a new ed25519 key, reading one, its public line."""

from __future__ import annotations

from pathlib import Path

import asyncssh

from launcher.transports.ssh.hostkeys import SSHKey


class KeyFileError(ValueError):
    """asyncssh could not import the key (encrypted, malformed, unknown type)."""


def new_private_key(comment: str) -> bytes:
    """A new ed25519 private key in OpenSSH's format (the caller writes it, 0600)."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
    return bytes(key.export_private_key("openssh"))


def read_private_key(path: Path) -> SSHKey:
    """The private key at path; KeyFileError when asyncssh cannot import it, OSError when
    the file cannot be read."""
    try:
        return asyncssh.read_private_key(str(path))
    except asyncssh.KeyImportError as exc:
        raise KeyFileError(str(exc)) from None


def public_line(key: SSHKey) -> str:
    """The key's ``authorized_keys`` line (algorithm, base64 blob, comment)."""
    return bytes(key.export_public_key("openssh")).decode()
