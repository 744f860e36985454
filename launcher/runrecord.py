"""The run record: what a run's meta.json holds, described once (issue 35 item 2).

One writer, ``output.archive.RunArchive`` (``write_meta``: the whole record replaced
atomically; ``update_meta(**fields)``: fields merged in), whose fields are typed by
``RunMeta`` here, so mypy checks every key and value a writer hands it (a state that is not a
``RunState`` does not type-check). One reader, ``output.archive.read_meta``, returns a
``RunMeta``; report, ps, top, logs, attach, stacks and run read it through that.

TypedDicts, not dataclasses (docs/architecture.md, "Decisions"): the record on disk must stay
byte-for-byte what it was (old archives load, new ones read the same to older dtrains), and
its key order is the order the writers added the fields over a run's life (start, then the
job, then the end; restarts rewrite it). A dataclass would fix one order and need a
converter at each of the ~25 writing sites; a TypedDict types the dict those sites already
build. Every field is optional (``total=False``): runs from before a field existed, runs that
ended early, and hand-edited archives all load; a reader still checks each value it uses,
since the file is outside input.

The vocabulary (``RunState``, ``RootKind``, ``FailureKind``, ``RankRole``) is Literal
types, the strings meta.json has always held. This module imports nothing of dtrain, so
every layer may name them (base layer, tests/test_layers.py).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

ARCHIVE_VERSION = 1

RunState = Literal["starting", "running", "stopping", "restarting", "finished"]
# the root cause's kind (docs/exit-codes.md): what the exit code says
RootKind = Literal["rank", "node", "lost", "start", "hang", "fabric", "interrupted", "timeout"]
# a failure as the launcher learned of it (job/orchestrate.Failure.kind)
FailureKind = Literal["rank", "node", "lost", "start", "hang", "fabric"]
# how a rank ended, judged against the root cause (meta.json nodes[].ranks[].role)
RankRole = Literal["root cause", "failed", "stopped", "ok", "unknown"]


class RootCause(TypedDict, total=False):
    """``root_cause``: the first failure dtrain saw, and its exit code."""

    kind: RootKind | None
    host: str | None
    rank: int | None
    exit_code: int | None
    summary: str
    signal: int | None
    error: str | None
    t: float  # when it happened (a rank's own clock), else when it was seen
    stderr_tail: list[str]
    stop_reason: str | None
    failure: dict[str, Any]  # decide.outcome.failures.FailureReason.json(): why the rank died


class RankResult(TypedDict, total=False):
    """``nodes[].ranks["<rank>"]``."""

    exit_code: int | None
    signal: int | None
    duration: float | None
    stop_signal: int | None
    role: RankRole
    start: float
    end: float


class HangCulprit(TypedDict):
    """``hangs[].culprit``: the likely culprit of a hang (decide/outcome/stacks.Culprit)."""

    rank: int | None
    host: str | None
    ranks: list[int]
    place: str
    why: str
    where: str  # script, native (collective: earlier versions' records)
    rule: str  # flight, wavefront, differs


class HangRecord(TypedDict):
    """``hangs[]``: one hang the watch declared (decide/outcome/hang.Hang.json, docs/hangs.md)."""

    t: float
    attempt: int
    stalled_s: float
    culprit: HangCulprit | None
    folded: list[dict[str, object]]  # decide/outcome/stacks.Folded.json
    dump: str
    dir: str | None
    action: str


class NodeResult(TypedDict, total=False):
    """``nodes[]``: how one node ended (docs/output-and-archive.md)."""

    host: str
    node_rank: int
    exit_code: int | None
    signal: int | None
    error: str | None
    lost: bool
    abandoned: bool
    stopped: str | None
    duration: float | None
    start: float | None
    end: float | None
    supervisor_pid: int | None
    pid: int | None
    ranks: dict[str, RankResult]


class Launcher(TypedDict, total=False):
    """``launcher``: the process that runs the job (ps, attach, stop read it)."""

    pid: int
    uid: int
    host: str
    detached: bool
    heartbeat_timeout: float
    launcher_timeout: float
    grace: float


class NextAttempt(TypedDict):
    """``next_attempt`` between attempts: its number and when it is due (Unix time)."""

    n: int
    at: float


class Attempt(TypedDict, total=False):
    """``attempts[]`` (--restarts, docs/output-and-archive.md's table)."""

    n: int
    start: float
    end: float | None
    detected: float | None
    stopping: float | None
    relaunched: float | None
    exit_code: int | None
    cause: str | None  # the fault (node, process, user), or a final attempt's ok or RootKind
    hosts: list[str]
    fenced: list[dict[str, Any]]  # {host, why}
    suspect: list[dict[str, Any]]  # {host, why}
    world_size: int
    why: str | None
    outcome: str
    decision: str | None
    relaunch: bool


class StartupNode(TypedDict, total=False):
    """``startup[].nodes[]``: where one node's start-up was, on the launcher's clock (the
    node's instants less its ``clock_offset``; decide/outcome/startup.py, docs/goodput.md)."""

    host: str
    supervisor: float | None  # the supervisor started the job (its hello)
    agent: float | None  # torchrun's agent imported torch
    rank_start: float | None  # the node's first rank process up
    script: float | None  # the node's first rank handed over to the user's script
    clock_offset: float | None  # node clock - launcher clock (s), from the probe
    clock_slack: float | None  # +/- of the offset (half the probe's round trip)


class Startup(TypedDict, total=False):
    """``startup[]``: one record per attempt."""

    attempt: int
    nodes: list[StartupNode]


class RunMeta(TypedDict, total=False):
    """meta.json. Field order here is the order a run usually writes them."""

    archive_version: int
    run_id: str
    created: str  # ISO 8601, UTC
    created_ts: float
    # as the job starts (commands/launch.start_meta; each attempt's, with --restarts)
    dtrain_version: str
    command: list[str]  # redacted
    script: str | None
    args: list[str]  # redacted
    module: bool
    workdir: str | None
    torch_versions: dict[str, str | None]
    nccl_versions: dict[str, str | None]  # the probe's (the nvidia-nccl wheel); None: unknown
    start: float | None  # the run's; None only where attempt 1 recorded none
    plan: dict[str, Any]  # decide.runplan.plan.plan_json (secrets redacted)
    hosts: list[str]
    world_size: int
    layout: list[dict[str, Any]]  # {host, node_rank, ranks}
    host_entries: list[dict[str, Any]]  # {label, name, user, port, python}
    state: RunState
    transport: str
    checkpoint_pattern: str
    launcher: Launcher
    kind: str  # what `dtrain ps` shows in KIND (smoke)
    # while it runs
    samples: dict[str, Any]  # {interval, file, errors}
    straggler_settings: dict[str, float]
    stragglers: list[dict[str, Any]]
    hangs: list[HangRecord]  # docs/hangs.md
    stacks: list[dict[str, Any]]
    progress: dict[str, Any]
    hang_policy: dict[str, Any]  # {timeout, on_hang, progress}
    fabric: dict[str, Any] | None  # NCCL's own account (docs/fabric.md)
    # --restarts
    attempt: int
    attempts: list[Attempt]
    fenced: list[dict[str, Any]]  # {host, why, t, attempt}
    next_attempt: NextAttempt | None
    # the end
    end: float
    exit_code: int | None
    outcome: str
    root_cause: RootCause
    nodes: list[NodeResult]
    console_skipped: int
    goodput: dict[str, Any]  # docs/goodput.md
    startup: list[Startup]  # each attempt's start-up instants per node (docs/goodput.md)
    smoke: dict[str, Any]  # dtrain smoke's results (docs/smoke.md)
