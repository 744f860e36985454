"""The one error map: every asyncssh and socket failure becomes a DtrainError here, with a
message naming the host and what to try (httpx's habit: the foreign library's exceptions
never cross the package's edge)."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable, Iterator

import asyncssh

from launcher.errors import AuthError, ConnectError, HostKeyError, SessionRefused, TransferError
from launcher.transports.ssh.hostkeys import HostKeyVerdict
from launcher.transports.ssh.settings import SSHSettings


@contextlib.contextmanager
def map_ssh_errors(label: str, settings: SSHSettings,
                   verdict: Callable[[], HostKeyVerdict | None] | None = None) -> Iterator[None]:
    """Translate asyncssh/OSError failures into ConnectError with an actionable message.

    ``verdict`` gives this connection's own host key verdict (never another node's).
    """
    try:
        yield
    except asyncssh.HostKeyNotVerifiable as exc:
        raise host_key_error(label, verdict() if verdict else None, exc) from exc
    except asyncssh.PermissionDenied as exc:
        raise AuthError("permission denied (publickey/password)", host=label,
                        hint="run `dtrain keys setup` to install a key, or check the user "
                             "name and ~/.ssh/config") from exc
    except asyncssh.DisconnectError as exc:
        if "authentication" in str(exc).lower():
            raise AuthError(f"server disconnected: {exc.reason}", host=label,
                            hint="too many keys offered? set IdentitiesOnly/IdentityFile "
                                 "in ~/.ssh/config") from exc
        raise ConnectError(f"SSH session failed: {exc.reason}", host=label) from exc
    except TimeoutError as exc:
        raise ConnectError(f"timed out connecting after {settings.connect_timeout:g} s",
                           host=label, hint="is the node up and reachable? raise "
                                            "--connect-timeout for slow links") from exc
    except socket.gaierror as exc:
        raise ConnectError(f"cannot resolve host name ({exc.strerror})", host=label,
                           hint="check the name, /etc/hosts or ~/.ssh/config HostName") from exc
    except ConnectionRefusedError as exc:
        raise ConnectError("connection refused", host=label,
                           hint="is sshd running and listening on that port?") from exc
    except OSError as exc:
        # EINVAL: a blackhole route (e.g. the test bridge is down)
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EINVAL):
            raise ConnectError("host unreachable", host=label,
                               hint="check the address and the network path") from exc
        raise ConnectError(f"connection failed: {exc.strerror or exc}", host=label) from exc
    except asyncssh.ChannelOpenError as exc:
        raise SessionRefused(f"the node refused a new session ({exc.reason})", host=label,
                             hint="sshd's MaxSessions bounds the sessions of one "
                                  "connection (10 by default)") from exc
    except asyncssh.Error as exc:
        raise ConnectError(f"SSH error: {exc.reason}", host=label) from exc


def host_key_error(label: str, verdict: HostKeyVerdict | None,
                   exc: asyncssh.HostKeyNotVerifiable) -> HostKeyError:
    """The message for a refused host key: changed, revoked or unknown, with its fingerprint."""
    if verdict is not None and verdict.kind == "changed":
        files = ", ".join(verdict.files)
        return HostKeyError(
            f"HOST KEY CHANGED: the node now presents {verdict.fingerprint}, which differs from "
            f"the key recorded for {verdict.host} in {files}", host=label,
            hint=f"this may be an attack or a reinstalled node; verify it, then remove the old "
                 f"line with `ssh-keygen -R {verdict.host} -f FILE` and retry")
    reason = str(exc.reason or "")
    if "revoked" in reason.lower():
        return HostKeyError(f"host key REVOKED ({reason}): a known_hosts file marks the key "
                            "the node presents (or its CA) @revoked", host=label,
                            hint="the node's key must be replaced; ask its administrator")
    if verdict is None:
        return HostKeyError(f"host key not trusted: {reason}", host=label,
                            hint="check the node's host certificate and your known_hosts "
                                 "@cert-authority lines")
    return HostKeyError(
        f"unknown host key {verdict.fingerprint}", host=label,
        hint="check the fingerprint, then retry with --accept-new (or run "
             "`dtrain keys setup`)")


# drops sshd's MaxStartups produces before authentication: worth a retry
TRANSIENT = (asyncssh.ConnectionLost, ConnectionResetError, BrokenPipeError)


def dropped_at_handshake(label: str, tries: int, seconds: float) -> ConnectError:
    """sshd closed every try before the login finished: which of its limits does that, and
    what to do (docs/scaling.md, "sshd's limits")."""
    return ConnectError(
        f"sshd closed the connection before the login finished, {tries} tries in "
        f"{seconds:.1f} s", host=label,
        hint="sshd drops handshakes beyond its MaxStartups (10:30:100 by default: from 10 "
             "at once, 30 % dropped) and OpenSSH >= 9.8 refuses for a while an address "
             "whose connections keep failing (PerSourcePenalties); lower --fanout, raise "
             "MaxStartups in the node's sshd_config, or read its sshd log (fail2ban and "
             "tcp wrappers drop connections the same way)")


@contextlib.contextmanager
def map_sftp_errors(label: str, path: str) -> Iterator[None]:
    """SFTP failures: a lost link → ConnectError, anything else → TransferError(path)."""
    try:
        yield
    except (asyncssh.SFTPConnectionLost, asyncssh.SFTPNoConnection, asyncssh.ConnectionLost,
            asyncssh.DisconnectError, BrokenPipeError, ConnectionResetError) as exc:
        raise ConnectError(f"connection lost during the copy ({exc})", host=label) from exc
    except asyncssh.SFTPError as exc:
        raise TransferError(str(exc.reason).lower() or "failed", path=path,
                            host=label) from exc
    except (asyncssh.Error, OSError) as exc:
        raise ConnectError(f"connection failed during the copy ({exc})", host=label) from exc

