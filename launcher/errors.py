"""The one error family of dtrain: every failure a user can see is a DtrainError.

    DtrainError (exit 1)
    ├── UsageError (exit 2)          bad input, caught before anything connects
    │   ├── HostfileError            carries file:line
    │   └── ConfigError
    ├── ConnectError (exit 255)      a node could not be reached
    │   ├── AuthError                permission denied, too many auth failures
    │   └── HostKeyError             unknown or changed host key
    ├── RemoteCommandError (exit 1)  a remote helper (probe, keys script) failed
    ├── TransferError (exit 1)       dtrain cp: one file on one node could not be copied
    └── PreflightFailed (exit 1)     doctor/preflight found a blocking problem

A job that ran and failed is not an exception: its exit code (the root cause's, 124, 130,
255 for a lost node) is decided by launcher/decide/outcome/verdict.py from what the supervisors
reported.

Messages say what failed, on which host, and what to try (``hint``).
"""

from __future__ import annotations

from launcher.exitcodes import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE


def interrupt_handled() -> None:
    """Say that a caught KeyboardInterrupt was handled (dtrain exits 130 for it).

    CPython (3.11 to 3.13 at least) marks a KeyboardInterrupt raised inside ``exec`` or
    ``eval`` of a string (a dataclass's generated methods at import, typer evaluating an
    option's annotation) as *unhandled* even when its caller catches it, and after its
    finalization kills itself with SIGINT (bpo-1054041's exit for an uncaught Ctrl-C): dtrain
    caught the Ctrl-C, meant to exit 130, and its parent saw death by SIGINT, silently
    (docs/reliability.md). Each exec of a string resets that mark first: this one does only
    that."""
    exec("")


class DtrainError(Exception):
    """Base of every user-facing failure."""

    exit_code: int = EXIT_FAILED
    hosts: tuple[str, ...] = ()  # the nodes it is about, when a caller can act on them
    #                              (a restarting run fences them: docs/restarts.md)

    def __init__(self, message: str, *, hint: str | None = None, host: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.host = host

    def __str__(self) -> str:
        text = f"{self.host}: {self.message}" if self.host else self.message
        return f"{text} ({self.hint})" if self.hint else text


class UsageError(DtrainError):
    """Bad input: exit 2 before anything starts."""

    exit_code = EXIT_USAGE


class HostfileError(UsageError):
    """A hostfile or host expression is wrong; the message carries file:line."""

    def __init__(self, message: str, *, source: str = "", line: int | None = None,
                 hint: str | None = None) -> None:
        where = f"{source}:{line}: " if source and line is not None else ""
        if source and line is None:
            where = f"{source}: "
        super().__init__(f"{where}{message}", hint=hint)
        self.source = source
        self.line = line


class ConfigError(UsageError):
    """A YAML config / env file / profile is wrong."""


class ConnectError(DtrainError):
    """A node could not be reached (exit 255, as ssh and pdsh)."""

    exit_code = EXIT_UNREACHABLE


class AuthError(ConnectError):
    """Authentication was refused."""


class HostKeyError(ConnectError):
    """The node's host key is unknown or has changed."""


class SessionRefused(ConnectError):
    """The node refused one more session on an open connection (sshd's MaxSessions, 10 by
    default): the connection keeper's cue to let that command connect directly."""


class RemoteCommandError(DtrainError):
    """A dtrain helper program on a node failed."""


class PreflightFailed(DtrainError):
    """A preflight check failed; nothing was started."""


class TransferError(DtrainError):
    """A file could not be copied, listed or removed (one file on one node)."""

    def __init__(self, message: str, *, path: str = "", host: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message, host=host)
        self.path = path
