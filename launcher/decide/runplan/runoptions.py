"""How a gang runs (as opposed to what runs: that is ``plan.RunRequest``), split along the
option groups `dtrain run --help` shows (``cli/groups.py``): each part is handed to the code
that needs only it. ``cli/runconfig.run_config`` builds them from the command line; `smoke`
builds its own few.

- :class:`Connection`: ``--fanout``, ``--transport``, the probe's time limit
- :class:`Limits`: ``--grace``, ``--timeout``, ``--start-timeout``, ``--heartbeat-timeout``
- :class:`NodeChecks`: the preflight, ``--profile``, ``--no-auto``, ``--topology``,
  ``--health-check``/``--dcgm``
- :class:`Watching`: what watches the run and acts on what it sees: ``--hang-timeout`` and
  ``--on-hang`` (:class:`HangPolicy`), ``--restarts`` (:class:`RestartPolicy`), samples,
  stragglers, ``--require-fabric``, ``--checkpoint``, ``--notify``
- :class:`Display`: ``--color``, ``--raw``, ``--timestamps``, the ``--rank``/``--host`` filters
- :class:`Reports`: ``--json``, ``--junit``, ``--archive-dir``
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher import defaults
from launcher.decide.outcome.hang import HangPolicy
from launcher.decide.outcome.restarts import RestartPolicy
from launcher.decide.outcome.stragglers import StragglerSettings


@dataclass(frozen=True)
class Connection:
    """Reaching the nodes: how many at once, over what, and how long the probe may take."""

    fanout: int = defaults.FANOUT
    transport: str = "auto"  # --transport: auto, ssh or srun
    probe_timeout: float = 30.0


@dataclass(frozen=True)
class Limits:
    """The run's time limits (docs/failure-semantics.md)."""

    grace: float = defaults.GRACE_S  # SIGTERM to SIGKILL on teardown
    timeout: float | None = None  # the whole run
    start_timeout: float | None = 120.0  # every node up
    heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT_S  # a node silent this long is lost


@dataclass(frozen=True)
class NodeChecks:
    """What is checked and decided about the nodes before anything starts."""

    preflight: bool = True
    profile: Mapping[str, str] | None = None  # --profile FILE's variables
    profile_name: str = "profile"
    no_auto: frozenset[str] = frozenset()  # --no-auto: detections left out
    topology: str | None = None  # --topology FILE's text (Slurm's topology.conf)
    # where ``topology`` came from, as the placement lines say it
    topology_from: str = "topology.conf"
    health_check: bool = False  # --health-check: the health gate first (commands/health.py)
    health_dcgm: int = 0  # --dcgm N with it: dcgmi diag -r N too
    exclusive: bool = False  # --exclusive: refuse nodes another user's run holds


@dataclass(frozen=True)
class Watching:
    """What watches the running gang, and what it may do about what it sees."""

    hang: HangPolicy = HangPolicy()  # --hang-timeout, --progress, --on-hang (docs/hangs.md)
    restart: RestartPolicy = RestartPolicy()  # --restarts, --nnodes (docs/restarts.md)
    sample_interval: float = 10.0  # --sample-interval: samples.jsonl every S s (0: off)
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    # NCCL's account (decide/fabric/nccl_account.py, docs/fabric.md): --require-fabric rdma|gdr|any
    require_fabric: str | None = None
    checkpoint: str | None = None  # --checkpoint REGEX: the save lines (docs/goodput.md)
    notify: str | None = None  # --notify URL|COMMAND (job/notify.py)


@dataclass(frozen=True)
class Display:
    """The console: colours, the nodes' control sequences, timestamps, which lines."""

    color: bool | None = None
    raw: bool = False  # --raw: the nodes' control sequences reach the terminal
    timestamps: bool = False  # --timestamps: each console line starts with its arrival time
    ranks: frozenset[int] | None = None  # --rank
    hosts_filter: frozenset[str] | None = None  # --host
    verbose: bool = False  # -v: the offline dry run's full form (every node's block)


@dataclass(frozen=True)
class Reports:
    """What is written for machines and for later: JSON, JUnit, the archive."""

    as_json: bool = False
    junit: str | None = None  # --junit PATH (not with --dry-run)
    archive_dir: Path = Path("dtrain-runs")


@dataclass(frozen=True)
class RunOptions:
    """How to run (as opposed to what: that is the RunRequest), one part per option group."""

    connection: Connection = Connection()
    limits: Limits = Limits()
    checks: NodeChecks = NodeChecks()
    watch: Watching = Watching()
    display: Display = Display()
    reports: Reports = Reports()
    dry_run: bool = False
    offline: bool = False  # --dry-run --offline: plan from the hostfile, connect nowhere
    # (setting, value, where it came from: --python, DTRAIN_ARCHIVE_DIR, config FILE:LINE,
    # built-in default): what the dry run shows (docs/config.md)
    sources: tuple[tuple[str, str, str], ...] = ()
    command: tuple[str, ...] = ()  # the command line to record, secrets already hidden
    # the warm start (--preload/--no-preload, docs/warm-start.md): the modules the nodes'
    # warm interpreter imports besides torch; None: every rank starts cold
    preload: tuple[str, ...] | None = None
