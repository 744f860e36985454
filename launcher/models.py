"""Frozen dataclasses shared by every layer (hosts, output lines, results), and the password
holder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from launcher.exitcodes import EXIT_UNREACHABLE

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Host:
    """One node as the user named it, with per-host settings from the hostfile.

    ``name`` is the host as written (the display tag and what ~/.ssh/config is matched on);
    ``port``/``user`` are None when not given, so ssh config and defaults still apply.
    """

    name: str
    user: str | None = None
    port: int | None = None
    slots: int | None = None
    python: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    source: str = ""  # "file:line" (or "-H") for error messages
    image: str | None = None  # the YAML hostfile's image: (--image for this host)
    groups: tuple[str, ...] = ()  # the YAML hostfile's groups: (-g/-X, hosts/genders.py)
    switch: str | None = None  # the hostfile's switch= (decide/runplan/placement.py)
    segment: str | None = None  # the hostfile's segment=

    @property
    def label(self) -> str:
        """The tag shown before each output line: the host, plus the port when one was given."""
        return f"{self.name}:{self.port}" if self.port else self.name

    @property
    def is_local(self) -> bool:
        """Entries naming this machine run as subprocesses, with no sshd involved."""
        return self.name in LOCAL_NAMES and self.user is None and self.port is None


class OutputLine(NamedTuple):
    """One whole line of remote output, attributed at the source.

    A NamedTuple, not a frozen dataclass: one is built per output line, and a frozen
    dataclass's __init__ costs about five times as much (the hot path of the console).

    ``rank`` is the global rank, or None for the node-level program (exec's command,
    the torchrun agent). ``stream`` is "out", "err" or "dtrain" (our own messages).
    """

    host: str
    stream: str
    text: str
    rank: int | None = None
    node_rank: int | None = None
    t: float = 0.0


@dataclass
class CopyResult:
    """What `dtrain cp` did on one node (counters filled in as it goes, hence not frozen)."""

    label: str
    sent: int = 0
    sent_bytes: int = 0
    skipped: int = 0
    deleted: int = 0
    stale: int = 0
    errors: list[str] = field(default_factory=list)
    unreachable: str | None = None  # the connect/lost error, when the node was not done

    @property
    def exit_code(self) -> int:
        """0 done, 1 some file failed, 255 unreachable or lost (as exec)."""
        if self.unreachable is not None:
            return EXIT_UNREACHABLE
        return 1 if self.errors else 0


class Secret:
    """A password: hidden from repr/str, so no traceback, log or message can show it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The password itself, for the one place that sends it to sshd."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__
