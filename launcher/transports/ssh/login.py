"""The logins `dtrain keys` needs, which the transport never makes: with one key alone (no
agent, no default keys, no password), or with a password offered exactly once.

``SSHTransport`` offers the agent and every default key, which would hide whether *this* key
works, and it has no password-only mode. Host keys still go through ``HostKeyPolicy`` and
errors through ``errormap``; a refused login says which credential was refused, never the
password itself.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import asyncssh

from launcher.errors import AuthError, ConnectError
from launcher.models import Host, Secret
from launcher.transports.ssh.errormap import TRANSIENT, map_ssh_errors
from launcher.transports.ssh.hostkeys import (
    HostKeyPolicy,
    HostKeyVerdict,
    SSHKey,
    UnknownHostKey,
    fingerprint,
)
from launcher.transports.ssh.settings import CIPHERS, KEX_ALGS, SSHSettings

RETRIES = 3  # for the drops sshd's MaxStartups produces before authentication


class LoginClient(asyncssh.SSHClient):
    """Host keys through HostKeyPolicy; the password offered once, by either method."""

    def __init__(self, policy: HostKeyPolicy, password: Secret | None = None) -> None:
        self._policy = policy
        self._password = password
        self.password_sent = False
        self.verdict: HostKeyVerdict | None = None  # this connection's own
        self.refused: UnknownHostKey | None = None  # unknown, not recorded
        self.declined: str = ""  # a keyboard-interactive prompt that was not a password's
        self.added: UnknownHostKey | None = None  # unknown, recorded (--accept-new)

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        self.verdict = self._policy.validate(host, addr, port, key)
        seen = UnknownHostKey("", key.get_algorithm(), fingerprint(key), (host, addr, port), key,
                              self._policy)
        if self.verdict.kind == "unknown":
            self.refused = seen
        elif self.verdict.kind == "added":
            self.added = seen
        return self.verdict.kind == "added"

    def _take_password(self) -> str | None:
        if self._password is None or self.password_sent:
            return None  # never a second try: a wrong password must fail at once
        self.password_sent = True
        return self._password.reveal()

    def password_auth_requested(self) -> str | None:
        return self._take_password()

    def kbdint_auth_requested(self) -> str | None:
        return "" if self._password is not None and not self.password_sent else None

    def kbdint_challenge_received(self, name: str, instructions: str, lang: str,
                                  prompts: Sequence[tuple[str, bool]]) -> list[str] | None:
        if not prompts:
            return []  # PAM sends empty rounds to show messages
        text, echo = prompts[0]
        if len(prompts) == 1 and not echo and is_password_prompt(text):
            password = self._take_password()
            return None if password is None else [password]
        # an OTP, a new password, several questions: never answered with the password
        self.declined = " / ".join(p.strip() for p, _ in prompts)[:80]
        return None


# What PAM asks for a login password, in the languages its translations use.
_PASSWORD_WORDS = re.compile(
    r"password|passwort|mot de passe|contrase\u00f1a|senha|wachtwoord|has\u0142o|heslo|"
    r"jelsz\u00f3|l\u00f6senord|adgangskode|passord|salasana|parola|\u043f\u0430\u0440\u043e\u043b\u044c|"
    r"\u30d1\u30b9\u30ef\u30fc\u30c9|\u5bc6\u7801|\u5bc6\u78bc|\uc554\ud638", re.IGNORECASE)
# ... and what marks a prompt as something else that merely mentions a password.
_NOT_PASSWORD = re.compile(
    r"one[- ]time|\botp\b|verification|code|token|pin\b|2fa|two[- ]factor|duo|yubi|"
    r"\bnew\b|neues|nouveau|retype|again|confirm", re.IGNORECASE)


def is_password_prompt(text: str) -> bool:
    """True for a login password prompt ("Password: ", "Passwort: ", "dtuser@n1's password:").

    Not for an OTP, a verification code, a token or a new password: those must never be
    answered with the login password.
    """
    return bool(_PASSWORD_WORDS.search(text)) and not _NOT_PASSWORD.search(text)


def auth_error(host: Host, client: LoginClient, key_only: bool) -> AuthError:
    """Say which credential was refused (never the password itself)."""
    if key_only:
        return AuthError("the key is not accepted", host=host.label)
    if client.declined and not client.password_sent:
        return AuthError(f"the node asks {client.declined!r} (keyboard-interactive), which is "
                         "not a password prompt: dtrain answers only a password prompt, and "
                         "never with the password for another question", host=host.label,
                         hint="install the key another way (ssh-copy-id, which lets you "
                              "answer it), then use `dtrain keys check`")
    if not client.password_sent:
        return AuthError("the node offers no password login (PasswordAuthentication and "
                         "KbdInteractiveAuthentication are off)", host=host.label,
                         hint="install the key another way, e.g. through the console")
    return AuthError("authentication failed: wrong password? (tried once, not retried)",
                     host=host.label, hint="check the user name and the password")


@dataclass(frozen=True)
class Completed:
    """A command run to its end on a login."""

    exit_status: int | None
    stdout: object
    stderr: object


class LoginSession:
    """One login made by ``login``: run commands to completion, then close."""

    def __init__(self, host: Host, conn: asyncssh.SSHClientConnection,
                 settings: SSHSettings) -> None:
        self._host = host
        self._conn = conn
        self._settings = settings

    async def run(self, command: str, stdin: str | None = None, *,
                  timeout: float) -> Completed:
        """Run one command to completion (bounded), errors mapped."""
        with map_ssh_errors(self._host.label, self._settings):
            try:
                done = await self._conn.run(command, input=stdin, check=False, timeout=timeout)
            except asyncssh.TimeoutError as exc:  # else it would read as a connect timeout
                raise ConnectError(f"`{command}` did not finish within {timeout:g} s",
                                   host=self._host.label) from exc
        return Completed(done.exit_status, done.stdout, done.stderr)

    def close(self) -> None:
        self._conn.close()

    async def __aenter__(self) -> LoginSession:
        return self

    async def __aexit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._conn.close()
        await self._conn.wait_closed()


def _options(settings: SSHSettings, host: Host, policy: HostKeyPolicy,
             key: SSHKey | None) -> dict[str, Any]:
    timeout = settings.connect_timeout
    config = settings.config_path
    configs = [str(config)] if config.is_file() else []
    if settings.options_path is not None:  # -o: read first, so its values win
        configs.insert(0, str(settings.options_path))
    options: dict[str, Any] = {
        "known_hosts": policy.trusted_arg(), "config": configs,
        "connect_timeout": timeout, "login_timeout": timeout,
        "kex_algs": KEX_ALGS, "encryption_algs": CIPHERS, "agent_path": None,
        "gss_auth": False, "gss_kex": False, "host_based_auth": False,
    }
    if key is not None:
        options.update(client_keys=[key], public_key_auth=True,
                       kbdint_auth=False, password_auth=False, preferred_auth="publickey")
    else:
        options.update(client_keys=None, public_key_auth=False, kbdint_auth=True,
                       password_auth=True, preferred_auth="keyboard-interactive,password")
    if host.user:
        options["username"] = host.user
    if host.port:
        options["port"] = host.port
    return options


async def login(settings: SSHSettings, host: Host, client: LoginClient, policy: HostKeyPolicy,
                key: SSHKey | None) -> LoginSession:
    """Log in with ``key`` alone, or (None) with the client's password, offered once;
    ConnectError/AuthError/HostKeyError name the host and what to try."""
    options = _options(settings, host, policy, key)
    delay = 0.1
    for attempt in range(RETRIES + 1):
        with map_ssh_errors(host.label, settings, lambda: client.verdict):
            try:
                async with asyncio.timeout(settings.connect_timeout + 1):
                    conn, _ = await asyncssh.create_connection(
                        lambda: client, host.name, **options)
                return LoginSession(host, conn, settings)
            except asyncssh.PermissionDenied as exc:
                raise auth_error(host, client, key is not None) from exc
            except TRANSIENT:
                if attempt == RETRIES or client.password_sent:
                    raise
        await asyncio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")
