"""dtrain's own SSH key pair on the login node.

``ensure_keypair`` creates ~/.ssh/dtrain_ed25519 with mode 0600 from its first byte (never a
world-readable moment) or reads the existing one (the key files themselves go through
``transports.ssh.keyfiles``). ``Secret``, the password holder (``launcher.models``), is
handed on from here for the CLI.
"""

from __future__ import annotations

import getpass
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

from launcher.commands.authorized_keys import (
    PublicKey,
)
from launcher.errors import UsageError
from launcher.models import Secret
from launcher.transports.ssh import (
    DTRAIN_KEY_NAME,
    SSHKey,
    fingerprint,
)
from launcher.transports.ssh.keyfiles import (
    KeyFileError,
    new_private_key,
    public_line,
    read_private_key,
)

__all__ = ["KeyPair", "Secret", "default_key_path", "ensure_keypair"]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class KeyPair:
    """The dtrain key on this machine (the private file is always 0600)."""

    private: Path
    public: Path
    key: PublicKey
    fingerprint: str
    created: bool
    ssh_key: SSHKey = field(repr=False, compare=False)


def default_key_path(home: Path | None = None) -> Path:
    """~/.ssh/id_ed25519_dtrain, the key every dtrain command offers by itself."""
    return (home or Path.home()) / ".ssh" / DTRAIN_KEY_NAME


def _key_comment() -> str:
    return f"dtrain {getpass.getuser()}@{socket.gethostname()}"


def _create_private(path: Path) -> bool:
    """Write a new ed25519 key, 0600 from the first byte; False when the file already exists.

    asyncssh's write_private_key opens with plain open() (0644 until a chmod): not used here.
    O_EXCL means two setups started at once cannot overwrite each other's key.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = new_private_key(_key_comment())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return True


def _read_private(path: Path) -> SSHKey:
    """Load an unencrypted private key OpenSSH will also accept (owner-only permissions)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        key = read_private_key(path)
    except KeyFileError as exc:
        hint = ("dtrain needs a key without a passphrase; omit --identity to use its own"
                if "passphrase" in str(exc).lower() else "delete it to let dtrain create a new one")
        raise UsageError(f"cannot use {path}: {exc}", hint=hint) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise UsageError(f"{path} is readable by others (mode {mode:04o}); OpenSSH refuses it",
                         hint=f"chmod 600 {path}")
    return key


def _public_key(path: Path, key: SSHKey) -> PublicKey:
    """The .pub line: the file's when it matches the private key, else written from it."""
    derived = PublicKey.parse(public_line(key))
    try:
        found = PublicKey.parse(path.read_text())
    except FileNotFoundError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(derived.line + "\n")
        return derived
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the public key {path}: {exc}") from None
    if found.blob != derived.blob:
        raise UsageError(f"{path} does not belong to the private key next to it",
                         hint=f"remove {path}; dtrain writes it again from the private key")
    return found


def ensure_keypair(path: Path) -> KeyPair:
    """The key at ``path`` (``path``.pub beside it), generated first when missing."""
    path = path.expanduser()
    created = not path.exists() and _create_private(path)
    key = _read_private(path)
    public = path.with_name(path.name + ".pub")
    return KeyPair(private=path, public=public, key=_public_key(public, key),
                   fingerprint=fingerprint(key), created=created, ssh_key=key)
