"""How a job ended, as plain data: each node's outcome, each failure the launcher learned of,
and the job's outcome that holds them.

``job/`` fills them in (``job/node.NodeSession`` a node's outcome, ``job/orchestrate.Job``
the failures and the job's outcome); ``decide/outcome/verdict.py`` judges them, the hang watch
declares a hang as a ``Failure``, and ``commands/restarts.attempt_end`` reads them for the
restart decision. No I/O, no asyncio: every layer from ``decide/`` up may hold them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.models import Host
from launcher.runrecord import FailureKind


@dataclass(frozen=True)
class RankEnd:
    """A rank's end as its node reported it: its exit report (code, 128+N for signal N), the
    stop its shim passed on (``stop_signal``: it was asked to stop), and what the node knows
    of its death. One type for both messages that carry it: the ``rank_exit`` event
    (job/events.py ``RankExit.end``) and each rank of the ``exit`` message
    (``NodeOutcome.ranks``), decoded once by job/events.py."""

    rank: int
    code: int | None = None
    signal: int | None = None
    stop_signal: int | None = None
    duration: float | None = None
    t: float | None = None  # when it ended (the node's clock)
    pid: int | None = None
    script: float | None = None  # the hand-over to the user's script (node clock)
    evidence: Mapping[str, Any] | None = None  # decide/outcome/failures.py reads it

    @property
    def failed(self) -> bool:
        """Exited non-zero (a code known and not 0)."""
        return self.code not in (0, None)


@dataclass(frozen=True)
class NodeOutcome:
    """How the node's job ended, as far as the launcher knows."""

    host: Host
    exit_code: int | None  # the job's code (128+N for signal N); None if it never ran/ended
    error: str | None = None  # why the node failed outside the job (start-up, lost)
    lost: bool = False
    signal: int | None = None
    stopped: str | None = None  # the supervisor's stop reason, if it was stopped
    ranks: Mapping[int, RankEnd] = field(default_factory=dict)  # the exit message's
    started: float | None = None
    ended: float = 0.0
    stderr_tail: tuple[str, ...] = ()
    supervisor_pid: int | None = None  # on the node, from the supervisor's hello
    pid: int | None = None  # the job's pid (= its pgid and session id)
    abandoned: bool = False  # cut off by the launcher (did not start/stop in time)

    @property
    def duration(self) -> float | None:
        return self.ended - self.started if self.started is not None and self.ended else None


@dataclass(frozen=True)
class Failure:
    """One failure, as the launcher learned of it."""

    kind: FailureKind  # rank (a rank exited non-zero), node (the node's program failed or never
    #            started), lost (heartbeats stopped / connection dropped), start (did not
    #            start within --start-timeout), hang (no progress: --on-hang stop)
    host: str
    rank: int | None = None
    code: int | None = None  # the exit code (128+N for signal N)
    signal: int | None = None
    t: float = 0.0  # when it happened (a rank's own clock), else when it was seen
    seen: float = 0.0  # when the launcher learned of it (launcher clock)
    error: str | None = None
    own_stop: str | None = None  # a node that stopped its job by itself: its supervisor's why
    led: bool = False  # a node whose torchrun ended first: its ranks only followed (stopped)


@dataclass
class JobOutcome:
    """Everything the summary, the archive and the exit code need."""

    nodes: dict[str, NodeOutcome] = field(default_factory=dict)
    connect_errors: dict[str, str] = field(default_factory=dict)
    interrupted: int | None = None  # the signal that stopped us (SIGINT/SIGTERM/SIGHUP)
    stopped_by: str | None = None  # a stop asked from outside (`dtrain stop`): recorded as SIGINT
    interrupted_t: float | None = None
    killed: bool = False  # a second interrupt: KILL now
    timed_out: bool = False
    start_timed_out: tuple[str, ...] = ()
    first_failure: str | None = None  # host label of the root cause
    failures: list[Failure] = field(default_factory=list)  # before the stop, in order seen
    stop_reason: str | None = None
    stop_t: float | None = None  # when dtrain started stopping the job
    abandoned: tuple[str, ...] = ()  # nodes cut off because they did not stop in time
    started: float = field(default_factory=time.time)
    ended: float = 0.0

    @property
    def root(self) -> Failure | None:
        """The root cause: the first failure seen before dtrain started stopping."""
        return self.failures[0] if self.failures else None
