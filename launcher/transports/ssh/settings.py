"""How dtrain connects over SSH: the settings built once from the CLI options, the
algorithms it prefers, the key names it offers."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher import defaults

if TYPE_CHECKING:  # imported where a policy is made: building settings needs no asyncssh
    from launcher.transports.ssh.hostkeys import HostKeyPolicy

DTRAIN_KEY_NAME = "id_ed25519_dtrain"
DEFAULT_KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")
# group-exchange costs ~0.5 s per connection for nothing: prefer fixed groups and curves
KEX_ALGS = ("curve25519-sha256", "curve25519-sha256@libssh.org", "ecdh-sha2-nistp256",
            "ecdh-sha2-nistp384", "ecdh-sha2-nistp521", "diffie-hellman-group14-sha256",
            "diffie-hellman-group16-sha512")
# AES-GCM is about twice as fast as chacha20 on AES-NI hardware
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
           "aes128-ctr", "aes256-ctr")


@dataclass(frozen=True)
class SSHSettings:
    """How dtrain connects; built once from CLI options."""

    connect_timeout: float = defaults.CONNECT_TIMEOUT_S
    accept_new: bool = False
    identities: tuple[str, ...] = ()  # extra identity files (--identity)
    keepalive_interval: float = 5.0
    keepalive_count_max: int = 3
    retries: int = 4  # for the transient drops sshd's MaxStartups produces
    home: Path = field(default_factory=Path.home)
    password: str | None = field(default=None, repr=False)  # only for keys setup; never shown
    # -o OPTION (ssh's and pdsh's): ssh_config lines that win over ~/.ssh/config
    options: tuple[str, ...] = ()
    # OpenSSH's defaults when ssh config names none (overridable for tests):
    # UserKnownHostsFile (None: ~/.ssh/known_hosts ~/.ssh/known_hosts2), GlobalKnownHostsFile
    user_known_hosts: tuple[Path, ...] | None = None
    global_known_hosts: tuple[Path, ...] = (Path("/etc/ssh/ssh_known_hosts"),
                                            Path("/etc/ssh/ssh_known_hosts2"))
    # --persist: seconds the connection keeper holds an idle connection (None: no keeper;
    # docs/connections.md); verbose: say once when a command connects directly instead
    persist: float | None = None
    verbose: bool = False

    @property
    def options_path(self) -> Path | None:
        """The -o options as an ssh_config file, read before ~/.ssh/config (the first value
        obtained wins, as OpenSSH gives -o precedence); None without -o."""
        return options_file(self.options) if self.options else None

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"

    @property
    def known_hosts_files(self) -> tuple[Path, ...]:
        """The user known_hosts files when ssh config does not name them."""
        if self.user_known_hosts is not None:
            return self.user_known_hosts
        return (self.ssh_dir / "known_hosts", self.ssh_dir / "known_hosts2")

    @property
    def known_hosts(self) -> Path:
        """Where new host keys are recorded by default (the first user file)."""
        files = self.known_hosts_files
        return files[0] if files else self.ssh_dir / "known_hosts"

    def host_key_policy(self, config: Any = None, accept_new: bool | None = None
                        ) -> HostKeyPolicy:
        """The policy for one host: UserKnownHostsFile/GlobalKnownHostsFile from its config."""
        from launcher.transports.ssh.hostkeys import HostKeyPolicy

        users: Sequence[Path] = self.known_hosts_files
        globs: Sequence[Path] = self.global_known_hosts
        if config is not None:
            user_cfg = config.get("UserKnownHostsFile", None)
            if user_cfg is not None:  # [] means `none`
                users = [self._path(p) for p in user_cfg]
            global_cfg = config.get("GlobalKnownHostsFile", None)
            if global_cfg is not None:
                globs = [self._path(p) for p in global_cfg]
        accept = self.accept_new if accept_new is None else accept_new
        return HostKeyPolicy(users, accept, globs)

    def _path(self, text: str) -> Path:
        if text == "~" or text.startswith("~/"):
            return self.home / text[2:]
        return Path(text).expanduser()

    @property
    def config_path(self) -> Path:
        return self.ssh_dir / "config"



_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)\s*(?:=|\s)\s*(\S.*)\Z")


def ssh_option(text: str) -> str:
    """``-o Port=2222`` / ``-o "Port 2222"`` as the ssh_config line ``Port 2222``; anything
    else (no value, a line break, a Host/Match block) is ValueError with the reason."""
    m = _OPTION.match(text.strip())
    if m is None or "\n" in text or "\r" in text:
        raise ValueError("expected KEY=VALUE, as ssh -o takes it (e.g. -o Port=2222)")
    key, value = m.groups()
    if key.lower() in ("host", "match", "include"):
        raise ValueError(f"{key} blocks are ~/.ssh/config's, not an option")
    return f"{key} {value}"


@functools.lru_cache(maxsize=8)
def options_file(options: tuple[str, ...]) -> Path:
    """A private ssh_config file holding ``options`` (removed at exit)."""
    import atexit
    import os
    import tempfile

    fd, name = tempfile.mkstemp(prefix="dtrain-ssh-o-", suffix=".conf")
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(line + "\n" for line in options))
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    return Path(name)
