"""Pure: a run request + hosts + node facts -> a LaunchPlan (ranks, rendezvous, argv, env).

No I/O here: the probe supplies NodeFacts, netenv decides each node's whole environment,
and this module lays out node ranks, global ranks and the exact torchrun command per node,
so `--dry-run` shows precisely what would start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher import defaults
from launcher.decide.runplan.container import (
    ContainerCommand,
    ContainerRequest,
    NodeContainerFacts,
    command_for,
    for_host,
    image_problems,
)
from launcher.decide.runplan.devices import DeviceSelection
from launcher.decide.runplan.facts import NodeFacts
from launcher.decide.runplan.netenv import (
    UNBUFFERED,
    EnvDecision,
    EnvVar,
    decide_env,
    merge_env,
    user_layer,
)
from launcher.decide.runplan.runoptions import RunOptions
from launcher.errors import PreflightFailed, UsageError
from launcher.hosts.hostfile import fold
from launcher.models import Host
from launcher.nodeside.wire import SHIM_PLACEHOLDER
from launcher.text.redact import redact_env, redact_words, secret_values


@dataclass(frozen=True)
class RunRequest:
    """What the user asked `dtrain run` for (validated by the CLI)."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False
    nproc_per_node: str | None = None  # "N", "gpu", "auto", or None (slots, else default)
    nproc_default: str = "gpu"  # a host with no slots= when no --nproc-per-node (smoke: 1)
    python: str = "python3"
    setup: str | None = None
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # --env and --env-file, in order (later wins)
    # where each of those came from, as the dry run shows it ("--env-file secrets.env");
    # a name missing here came from --env
    env_sources: tuple[tuple[str, str], ...] = ()
    hidden_env: frozenset[str] = frozenset()  # --env NAME: from the launcher's environment
    # what a higher layer replaced (netenv.user_env): never sent, kept only so that a
    # secret value among them is hidden wherever the script's arguments show it
    shadowed_env: tuple[tuple[str, str], ...] = ()
    master_addr: str | None = None
    master_port: int | None = None
    rdzv: str = "static"
    max_restarts: int = 0
    run_id: str = "dtrain"
    restarts: int = 0  # dtrain run --restarts N: relaunches of the whole gang
    attempt: int = 1  # which attempt this plan is for (DTRAIN_ATTEMPT with --restarts)
    # DeepSpeed's --include host:0,1 / --exclude host:2 (decide/runplan/devices.py)
    devices: DeviceSelection = field(default_factory=DeviceSelection)
    container: ContainerRequest | None = None  # --image (docs/containers.md)


@dataclass(frozen=True)
class NodePlan:
    """Everything that starts on one node."""

    host: Host
    node_rank: int
    nproc: int
    first_rank: int
    python: str
    argv: tuple[str, ...]
    env: tuple[EnvVar, ...]
    warnings: tuple[str, ...] = ()
    container: ContainerCommand | None = None  # --image: the runtime around argv
    torch_version: str | None = None  # the node's torch (its probe), None when unknown

    def node_added(self) -> tuple[EnvVar, ...]:
        """What the supervisor adds to each rank's environment on this node (``node_added``
        below), as the plan knows that environment."""
        return node_added({v.name: v.value for v in self.env}, self.torch_version)

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)

    def exported_env(self) -> dict[str, str]:
        """The variables sent to the node (site values are already in effect there)."""
        return {v.name: v.value for v in self.env if v.exported}


@dataclass(frozen=True)
class LaunchPlan:
    """The whole job: one NodePlan per host, in node-rank order."""

    nodes: tuple[NodePlan, ...]
    master_addr: str
    master_port: int
    master_reason: str
    world_size: int
    rdzv: str
    hidden: frozenset[str] = frozenset()  # names whose values are never shown
    offline: bool = False  # --dry-run --offline: planned from the hostfile, nothing probed
    shadowed: tuple[tuple[str, str], ...] = ()  # RunRequest.shadowed_env

    def shown_env(self, node: NodePlan) -> dict[str, str]:
        """One node's variables as dry runs and meta.json show them (secrets as ***)."""
        return redact_env([(v.name, v.value) for v in node.env], self.hidden)

    def shown_argv(self, node: NodePlan) -> tuple[str, ...]:
        """One node's command as dry runs and meta.json show it: the script's arguments that
        carry a secret value (``VALUE`` or ``--opt=VALUE``) as ***. Only the words after the
        rank shim are the user's; torchrun's own (ports, counts) are never rewritten."""
        if SHIM_PLACEHOLDER not in node.argv:
            return node.argv
        cut = node.argv.index(SHIM_PLACEHOLDER) + 1
        values = secret_values([*((v.name, v.value) for v in node.env), *self.shadowed],
                               self.hidden)
        return (*node.argv[:cut], *redact_words(node.argv[cut:], values))


def plan_warnings(plan: LaunchPlan, hostnames: Mapping[str, str]) -> list[str]:
    """Every node's environment warnings (a site setting or profile overruling detection, a
    value known to be bad), each text once with its hosts folded, in node order: what a run
    prints before it starts (``--dry-run`` shows them under each node). A warning that
    starts with the node's own hostname (``hostnames``: label -> hostname) is shown with the
    label instead, so that the same warning on many nodes folds into one line."""
    by_text: dict[str, list[str]] = {}
    for node in plan.nodes:
        own = f"{hostnames.get(node.host.label) or node.host.label}: "
        for warning in node.warnings:
            text = warning.removeprefix(own)
            by_text.setdefault(text, []).append(node.host.label)
    return [f"{fold(hosts)}: {text}" for text, hosts in by_text.items()]


def nproc_for(host: Host, facts: NodeFacts, requested: str | None,
              default: str = "gpu") -> tuple[str, int]:
    """(torchrun's --nproc-per-node value, the number of ranks it means on this node): the
    one rule of run and smoke. ``requested`` (--nproc-per-node), else the host's slots=,
    else ``default`` (run: one per GPU; smoke on gloo: 1)."""
    value = requested
    if value is None:
        value = str(host.slots) if host.slots else default
    if value.isdigit() and int(value) > 0:
        return value, int(value)
    if value == "gpu":
        if facts.gpus <= 0:
            raise UsageError(
                f"{host.label}: --nproc-per-node gpu, but the node shows no GPU",
                hint="give slots=N in the hostfile or --nproc-per-node N (CPU jobs use gloo)")
        return value, facts.gpus
    if value == "auto":
        # torchrun's auto: one per GPU, else one per CPU; we only know GPUs: be explicit
        count = facts.gpus if facts.gpus > 0 else 1
        return str(count), count
    raise _bad_nproc(value)


# --nproc-per-node values that mean "one rank per GPU": with --include/--exclude, per
# selected GPU (the node's CUDA_VISIBLE_DEVICES)
PER_GPU = (None, "gpu", "auto")


def _bad_nproc(value: str) -> UsageError:
    return UsageError(f"--nproc-per-node {value!r} is not a positive number, 'gpu' or 'auto'")


def torchrun_argv(req: RunRequest, *, python: str, nnodes: int, node_rank: int, nproc: str,
                  master_addr: str, master_port: int) -> tuple[str, ...]:
    """One torchrun agent per node; workers start through the dtrain rank shim."""
    argv = [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", nproc, "--max-restarts", str(req.max_restarts),
            "--monitor-interval", "0.2"]
    if req.rdzv == "static":
        argv += ["--node-rank", str(node_rank), "--master-addr", master_addr,
                 "--master-port", str(master_port)]
    else:
        # torch picks the store host by hostname otherwise, which fails where hostnames
        # resolve to 127.0.1.1: node 0 is told it hosts the store
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master_addr}:{master_port}",
                 "--rdzv-id", req.run_id,
                 "--rdzv-conf", f"is_host={1 if node_rank == 0 else 0}"]
    argv.append(SHIM_PLACEHOLDER)
    argv += (["-m", req.script] if req.module else [req.script])
    argv += list(req.args)
    return tuple(argv)


def shutdown_timeout(grace: float) -> int:
    """torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT for ``--grace`` seconds: torchrun KILLs its
    workers that long (its default 30) after its own TERM, so it must outlast the grace,
    whose end is dtrain's KILL (docs/failure-semantics.md)."""
    return max(30, int(grace) + 5)


def dtrain_env(req: RunRequest, node_rank: int, nnodes: int, *,
               grace: float = defaults.GRACE_S) -> tuple[EnvVar, ...]:
    """Variables dtrain always sets besides the network ones: the floor of the node's
    environment (``netenv.merge_env``), under every other layer (PYTHONUNBUFFERED is
    ``netenv.UNBUFFERED``, with detection, where --env can override it). Sent to the node in
    the spec as they are: the supervisor adds none of these itself."""
    attempt = (EnvVar("DTRAIN_ATTEMPT", str(req.attempt), "dtrain",
                      f"attempt of --restarts {req.restarts} (the shim adds attempt-1 to "
                      "TORCHELASTIC_RESTART_COUNT)"),) if req.restarts or req.attempt > 1 else ()
    return (
        EnvVar("DTRAIN_RUN_ID", req.run_id, "dtrain", "run archive id"),
        EnvVar("DTRAIN_NODE_RANK", str(node_rank), "dtrain", "node rank"),
        EnvVar("DTRAIN_NNODES", str(nnodes), "dtrain", "number of nodes"),
        *attempt,
        # torchrun sets 1 anyway when unset, with a banner on every node; --env overrides
        EnvVar("OMP_NUM_THREADS", "1", "dtrain", "torchrun's default, made explicit"),
        EnvVar("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(shutdown_timeout(grace)), "dtrain",
               f"torchrun KILLs its workers this long after its TERM: past --grace {grace:g}"),
    )


def expand_home(value: str, home: str | None) -> str:
    """A leading ``~``/``~/`` as the node's home (the probe's $HOME): torchrun's argv[0] is
    exec'd without a shell, so it must be the same path the bootstrap's ``cd``/``exec`` and
    the probe resolved. Left as is when the probe did not report a home."""
    if not home or not (value == "~" or value.startswith("~/")):
        return value
    return home.rstrip("/") + value[1:] if value != "~" else home


def shared_gpu_warning(host: Host, facts: NodeFacts, nproc: int,
                       chosen: Sequence[int] | None) -> tuple[str, ...]:
    """More ranks than the node shows GPUs (or than --include/--exclude left it): ranks
    share a GPU, which NCCL refuses at its first collective ("Duplicate GPU detected", on
    every node at once, after the whole start). A warning, not an error: gloo and CPU
    jobs, and jobs that pin their own devices, run so on purpose. A node without GPUs says
    nothing: that is a CPU job."""
    visible = len(chosen) if chosen is not None else facts.gpus
    if visible <= 0 or nproc <= visible:
        return ()
    gpus = f"{visible} GPU" + ("s" if visible != 1 else "")
    return (f"{facts.hostname or host.label}: {nproc} ranks on {gpus}: ranks will share a "
            "GPU, which NCCL refuses (\"Duplicate GPU detected\"); fine for gloo. One rank "
            "per GPU: --nproc-per-node gpu",)


def build_plan(req: RunRequest, opts: RunOptions, hosts: Sequence[Host],
               facts: Mapping[str, NodeFacts], *, master_addr: str, master_port: int,
               master_reason: str) -> LaunchPlan:
    """Every node's environment (``netenv.decide_env``: the one place for its precedence),
    node ranks in host order and global ranks by cumulative nproc."""
    decisions: dict[str, EnvDecision] = {}
    errors: list[str] = []
    gpus = {h.label: req.devices.gpus(h.name, facts[h.label].gpus) if req.devices else None
            for h in hosts}
    for node_rank, host in enumerate(hosts):
        user, sources = user_layer(gpus[host.label], host.env, host.source, dict(req.env),
                                   dict(req.env_sources))
        decision = decide_env(facts[host.label], master_addr=master_addr,
                              is_master=node_rank == 0, user_env=user, user_sources=sources,
                              profile=opts.checks.profile, nnodes=len(hosts),
                              profile_name=opts.checks.profile_name, no_auto=opts.checks.no_auto,
                              dtrain=dtrain_env(req, node_rank, len(hosts),
                                                grace=opts.limits.grace),
                              master_given=req.master_addr is not None)
        errors += [f"{host.label}: {e}" for e in decision.errors]
        decisions[host.label] = decision
    wanted = {h.label: c for h in hosts if (c := for_host(req.container, h.image))}
    if wanted:
        errors += image_problems(wanted, {h: facts[h].container for h in wanted})
    if errors:
        raise PreflightFailed("; ".join(errors))
    nodes: list[NodePlan] = []
    first = 0
    for node_rank, host in enumerate(hosts):
        chosen = gpus[host.label]
        if chosen is not None and req.nproc_per_node in PER_GPU:
            nproc_arg, nproc = str(len(chosen)), len(chosen)  # one rank per selected GPU
        else:
            nproc_arg, nproc = nproc_for(host, facts[host.label], req.nproc_per_node,
                                         req.nproc_default)
        python = expand_home(host.python or req.python, facts[host.label].home)
        argv = torchrun_argv(req, python=python, nnodes=len(hosts), node_rank=node_rank,
                             nproc=nproc_arg, master_addr=master_addr, master_port=master_port)
        decision = decisions[host.label]
        shared = shared_gpu_warning(host, facts[host.label], nproc, chosen)
        nodes.append(NodePlan(host, node_rank, nproc, first, python, argv, decision.env,
                              tuple(decision.warnings) + shared,
                              container_for(req, opts, host, facts[host.label]),
                              facts[host.label].torch_version))
        first += nproc
    return LaunchPlan(tuple(nodes), master_addr, master_port, master_reason, first, req.rdzv,
                      req.hidden_env, shadowed=req.shadowed_env)


NODE_DIR = "<the supervisor's private dir>"  # made on the node at start: its path is unknown
ADDED_REASON = "added on the node unless its own environment sets {what}: {why}"


def node_added(env: Mapping[str, str], torch_version: str | None) -> tuple[EnvVar, ...]:
    """The variables the node's supervisor adds to each rank by itself, with why: the flight
    recorder's (hang evidence; the names the node's torch reads) and NCCL's own account
    (INFO lines into per-process files: docs/fabric.md). The node decides them with the
    same functions (``rankshim.flight_defaults``, ``nodeevidence.nccl_defaults``) against
    its real environment, which only it knows (a variable its shell exports wins there);
    this is what they give for the plan's. ``TORCHELASTIC_RESTART_COUNT`` is raised there
    by the attempt number under --restarts (docs/restarts.md)."""
    from launcher.decide.fabric.nccl_account import wants_account
    from launcher.decide.outcome.flight import flight_names
    from launcher.nodeside.nodeevidence import nccl_defaults
    from launcher.nodeside.rankshim import flight_defaults

    out = []
    # (the node programs are unannotated: stdlib Python 3.8, shipped as source)
    flight: dict[str, str] = flight_defaults(  # type: ignore[no-untyped-call]
        dict(env), f"{NODE_DIR}/flight", flight_names(torch_version))
    for name, value in flight.items():
        out.append(EnvVar(name, value, "node", ADDED_REASON.format(
            what="a flight recorder buffer", why="a hang's evidence")))
    if wants_account(env):
        nccl: dict[str, str] = nccl_defaults(  # type: ignore[no-untyped-call]
            dict(env), f"{NODE_DIR}/nccl")
        for name, value in nccl.items():
            out.append(EnvVar(name, value, "node", ADDED_REASON.format(
                what="NCCL_DEBUG or NCCL_DEBUG_FILE", why="NCCL's own account of the fabric")))
    return tuple(out)


def container_for(req: RunRequest, opts: RunOptions, host: Host, facts: NodeFacts
                  ) -> ContainerCommand | None:
    """``--image``: this node's runtime command (decide/runplan/container.py), from its facts."""
    ctr = for_host(req.container, host.image)
    if ctr is None or facts.container is None or facts.container.runtime is None:
        return None
    node = NodeContainerFacts(gpus=facts.gpus, rdma=bool(facts.rdma), shm_bytes=facts.shm_bytes)
    return command_for(ctr, facts.container.runtime, node, run_id=req.run_id,
                       host=host.name, attempt=req.attempt,
                       workdir=req.workdir or facts.home, grace=opts.limits.grace)


OFFLINE_FACTS = ("not connected (--offline): interfaces, GPUs, RDMA, the Python and torch "
                 "and the node's site config are unknown; NCCL/GLOO variables are detected "
                 "when the run connects")


def offline_plan(req: RunRequest, opts: RunOptions, hosts: Sequence[Host]) -> LaunchPlan:
    """`run --dry-run --offline`: the plan from the hostfile alone. Node ranks, ranks, each
    node's command and the variables that do not depend on a node's facts (user, profile,
    dtrain's own); the master is node 0's name (or --master-addr) and the port --master-port
    (or torchrun's 29500), neither checked. A rank count that needs the GPU count (``gpu``,
    ``auto``, no slots=) is exit 2: it cannot be known without connecting."""
    master_addr = req.master_addr or hosts[0].name
    master_port = req.master_port or 29500
    reason = ("--master-addr" if req.master_addr else "node 0's name from the hostfile") + \
        "; not checked: --offline"
    nodes: list[NodePlan] = []
    first = 0
    for node_rank, host in enumerate(hosts):
        chosen = req.devices.gpus(host.name, 0) if req.devices else None
        value = req.nproc_per_node or (str(host.slots) if host.slots else None)
        if chosen is not None and req.nproc_per_node in PER_GPU:
            value = str(len(chosen))
        if value not in PER_GPU and not (value.isdigit() and int(value) > 0):
            raise _bad_nproc(value)
        if value is None or not value.isdigit():
            raise UsageError(f"--offline: {host.label}'s rank count depends on its GPUs, "
                             f"unknown without connecting (--nproc-per-node "
                             f"{value or 'gpu'})",
                             hint="give slots=N in the hostfile or --nproc-per-node N")
        user, sources = user_layer(chosen, host.env, host.source, dict(req.env),
                                   dict(req.env_sources))
        own_env = dtrain_env(req, node_rank, len(hosts), grace=opts.limits.grace)
        final, _ = merge_env(
            [UNBUFFERED], profile=opts.checks.profile, site={}, user=user,
            user_sources=sources, profile_name=opts.checks.profile_name, dtrain=own_env)
        own = [v.name for v in own_env]
        env = tuple(final[k] for k in [*own, *sorted(set(final) - set(own))])
        python = host.python or req.python
        argv = torchrun_argv(req, python=python, nnodes=len(hosts), node_rank=node_rank,
                             nproc=value, master_addr=master_addr, master_port=master_port)
        nodes.append(NodePlan(host, node_rank, int(value), first, python, argv, env, ()))
        first += int(value)
    return LaunchPlan(tuple(nodes), master_addr, master_port, reason, first, req.rdzv,
                      req.hidden_env, offline=True, shadowed=req.shadowed_env)


def plan_json(plan: LaunchPlan) -> dict[str, object]:
    """The plan as stored in meta.json and printed by --dry-run --json (secrets redacted)."""
    return {
        **({"offline": True, "facts": OFFLINE_FACTS} if plan.offline else {}),
        "master_addr": plan.master_addr, "master_port": plan.master_port,
        "master_reason": plan.master_reason, "world_size": plan.world_size, "rdzv": plan.rdzv,
        "nodes": [{
            "host": n.host.label, "source": n.host.source, "node_rank": n.node_rank,
            "nproc": n.nproc,
            "ranks": list(n.ranks), "command": list(plan.shown_argv(n)),
            **({"container": list(n.container.shown([v.name for v in n.env if v.exported]))}
               if n.container else {}),
            "env": [{"name": v.name, "value": plan.shown_env(n)[v.name],
                     "source": v.source, "reason": v.reason, "exported": v.exported}
                    for v in n.env],
            # what the node's supervisor adds to every rank by itself (--dry-run's `+` lines)
            "node_added": [{"name": v.name, "value": v.value, "source": v.source,
                            "reason": v.reason} for v in n.node_added()],
            "warnings": list(n.warnings),
        } for n in plan.nodes],
    }
