"""Pure decisions about the job's network environment: master address, socket interface, env.

Everything here takes ``facts.NodeFacts`` (what the probe saw on a node) and returns frozen
results with a reason for every value, so ``--dry-run`` can show where each variable came
from. No I/O, no asyncio, no logging (``load_profile`` is the one file read, kept thin).

Precedence, highest first (docs/network-env.md):

1. the user's ``--env`` (source "user");
2. site config on the node -- $NCCL_CONF_FILE or ~/.nccl.conf, /etc/nccl.conf, NCCL_* already in
   the node's environment (source "site"): NCCL applies the files with setenv(overwrite=0), so
   any export from dtrain would silently beat the admin; such keys are shown, never exported;
3. a cluster profile YAML (source "profile");
4. detection (source "detected"), plus dtrain's own defaults (source "dtrain").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.decide.fabric.rdma import HcaChoice, check_gid_index, plan_gids, select_hcas
from launcher.decide.runplan.facts import Iface, NodeFacts, Route
from launcher.errors import ConfigError, PreflightFailed
from launcher.hosts.envfile import name_problem
from launcher.text.redact import redact_value

OVERLAY_PREFIXES = ("docker", "br-", "veth", "virbr", "cni", "flannel", "cali", "cilium", "lxc",
                    "tun", "wg", "tailscale")
DOCKER_DEFAULT_BRIDGE_IP = "172.17.0.1"
SOURCES = ("user", "site", "profile", "detected", "dtrain")
DEBUG_ONLY = ("NCCL_P2P_DISABLE", "NCCL_ALGO", "NCCL_PROTO")
AZURE_TOPO = ("/opt/microsoft/ndv4-topo.xml", "/opt/microsoft/ndv5-topo.xml")
GCP_GIB_SCRIPT = "/usr/local/gib/scripts/set_nccl_env.sh"


@dataclass(frozen=True)
class EnvVar:
    """One variable of a node's environment, where it came from and why."""

    name: str
    value: str
    source: str  # one of SOURCES
    reason: str
    exported: bool = True  # False for site keys: already in effect on the node


# every rank's Python unbuffered, written once: decide_env and the offline plan put it with
# detection (so --no-auto PYTHONUNBUFFERED leaves it out and --env wins over it)
UNBUFFERED = EnvVar("PYTHONUNBUFFERED", "1", "dtrain", "live logs: no pty on the node")


@dataclass(frozen=True)
class EnvDecision:
    """A node's network environment, ready for the dry-run display and the launch."""

    env: tuple[EnvVar, ...]
    warnings: tuple[str, ...] = ()
    # blocking problems (e.g. a RoCE port without an IP), without the node's name: the plan
    # names each node by its hostfile label
    errors: tuple[str, ...] = ()
    socket_iface: str | None = None
    hca: HcaChoice | None = None

    def exports(self) -> dict[str, str]:
        """What dtrain puts into the launched processes' environment."""
        return {v.name: v.value for v in self.env if v.exported}

    def get(self, name: str) -> EnvVar | None:
        """The decision for ``name``, exported or not."""
        return next((v for v in self.env if v.name == name), None)


@dataclass(frozen=True)
class MasterChoice:
    """The master address every worker reaches, and why it won."""

    addr: str
    reason: str
    warning: str | None = None


@dataclass(frozen=True)
class SocketChoice:
    """The interface a node uses towards the master (NCCL/Gloo bootstrap and sockets)."""

    ifname: str
    reason: str
    route: Route | None = None
    warnings: tuple[str, ...] = ()


# --------------------------------------------------------------------------- master address


def is_overlay(name: str) -> bool:
    """Container, bridge and VPN interfaces: never a cluster network by default."""
    return name.startswith(OVERLAY_PREFIXES)


def _usable_ipv4(addr: str) -> bool:
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast
                or addr == DOCKER_DEFAULT_BRIDGE_IP)


def _usable_iface(iface: Iface) -> bool:
    return iface.is_up and not iface.is_loopback and not is_overlay(iface.name)


def pick_master_addr(master: NodeFacts) -> list[str]:
    """Node 0's candidate IPv4 addresses, best first.

    Up, not loopback/overlay, not 127/8, 169.254/16 or docker0's 172.17.0.1 -- the addresses
    other launchers pick by accident (``hostname -I`` order, ``gethostname()``). The default
    route's interface comes first, then physical before virtual interfaces.
    """
    ifaces = [i for i in master.interfaces if _usable_iface(i)]
    ifaces.sort(key=lambda i: (i.name != master.default_iface, i.virtual))
    out: list[str] = []
    for iface in ifaces:
        out += [a for a in iface.ipv4 if _usable_ipv4(a) and a not in out]
    return out


def route_problem(route: Route | None) -> str | None:
    """Why a worker cannot use ``route`` to reach the master (None: it can)."""
    if route is None:
        return "not probed"
    if route.error:
        return route.error
    if route.type == "local":
        return "the address is also local there"
    if not route.dev or route.dev == "lo":
        return "no route"
    if route.type not in ("unicast", ""):
        return f"route type {route.type}"
    return None


def given_hint(given: str | None, usual: str, instead: str) -> str:
    """A hint about the master address: ``usual`` (which may offer --master-addr) when dtrain
    chose it, ``instead`` when the user gave ``--master-addr`` (``{addr}`` in it: theirs)."""
    return instead.format(addr=given) if given else usual


def choose_master(candidates: Sequence[str],
                  worker_routes: Mapping[str, Mapping[str, Route]], *,
                  given: str | None = None) -> MasterChoice:
    """The first candidate every worker reaches on-link; else one reached via a gateway.
    ``given``: the --master-addr the candidates are (the hints then speak of it).

    Raises PreflightFailed naming, per candidate, the hosts that cannot reach it.
    """
    if not candidates:
        raise PreflightFailed("the master node has no usable IPv4 address",
                              hint="pass --master-addr")
    if not worker_routes:
        return MasterChoice(candidates[0], "single node: the master's first usable address")
    failures: dict[str, dict[str, str]] = {}
    routed: MasterChoice | None = None
    for addr in candidates:
        routes = {h: r.get(addr) for h, r in worker_routes.items()}
        failures[addr] = {h: why for h, r in routes.items() if (why := route_problem(r))}
        if failures[addr]:
            continue
        gateways = {h: r.gateway for h, r in routes.items() if r is not None and r.gateway}
        if not gateways:
            return MasterChoice(addr, f"every worker ({len(routes)}) reaches it on-link")
        if routed is None:
            via = ", ".join(f"{h} via {g}" for h, g in sorted(gateways.items()))
            routed = MasterChoice(addr, "every worker reaches it, some through a gateway",
                                  warning=f"master address {addr} is routed (L3): {via}")
    if routed is not None:
        return routed
    detail = "; ".join(
        f"{addr}: " + ", ".join(f"{h} ({why})" for h, why in sorted(fails.items()))
        for addr, fails in failures.items())
    raise PreflightFailed(f"no master address is reachable from every worker -- {detail}",
                          hint=given_hint(given, "check the routes, or pass --master-addr",
                                          "check the routes to --master-addr {addr}, or give "
                                          "it an address of node 0 the others reach"))


# --------------------------------------------------------------------------- socket interface


def socket_choice(facts: NodeFacts, master_addr: str, is_master: bool, *,
                  multi_node: bool = True, given: bool = False) -> SocketChoice:
    """The interface on this node that reaches the master (on the master: the one holding it).
    ``given``: the address is the user's --master-addr (the hints then speak of it)."""
    mine = master_addr if given else None
    host = facts.hostname or None
    route: Route | None = None
    if is_master:
        owner = facts.owner_of(master_addr)
        if owner is None:
            raise PreflightFailed(f"master address {master_addr} is not an address of this node",
                                  host=host, hint=given_hint(
                                      mine, "pass --master-addr with one of its addresses",
                                      "--master-addr {addr} must be an address of node 0 "
                                      "(the first host): give one of its own"))
        ifname, reason = owner.name, f"holds master address {master_addr}"
    else:
        route = facts.routes.get(master_addr)
        why = route_problem(route)
        if why or route is None or route.dev is None:
            raise PreflightFailed(f"cannot reach master address {master_addr}: {why}", host=host,
                                  hint=given_hint(mine, "check the routes, or pass "
                                                  "--master-addr", "check the routes to "
                                                  "--master-addr {addr}"))
        ifname, reason = route.dev, f"route to {master_addr} via {route.dev}"
    iface = facts.iface(ifname)
    if multi_node and (ifname in ("lo", "docker0") or (iface is not None and iface.is_loopback)):
        raise PreflightFailed(f"traffic to master {master_addr} would use {ifname}", host=host,
                              hint=given_hint(mine, "pass --master-addr with an address on "
                                              "the cluster network", "--master-addr {addr} "
                                              "is reached over loopback: give node 0's "
                                              "address on the cluster network"))
    if multi_node and iface is not None and not iface.is_up:
        raise PreflightFailed(f"{ifname} (towards master {master_addr}) is {iface.operstate}",
                              host=host)
    warnings = []
    if route is not None and route.gateway:
        warnings.append(f"{facts.hostname}: {master_addr} is reached through gateway "
                        f"{route.gateway} (routed, not on-link)")
        reason += f" (gateway {route.gateway})"
    if is_overlay(ifname):
        warnings.append(f"{facts.hostname}: {ifname} looks like a container/overlay interface")
    return SocketChoice(ifname, reason, route, tuple(warnings))


def socket_iface(facts: NodeFacts, master_addr: str, is_master: bool, *,
                 multi_node: bool = True, given: bool = False) -> tuple[str, str]:
    """(interface name, reason); raises PreflightFailed for lo/docker0/none on a multi-node job."""
    choice = socket_choice(facts, master_addr, is_master, multi_node=multi_node, given=given)
    return choice.ifname, choice.reason


# --------------------------------------------------------------------------- detection


def _socket_vars(facts: NodeFacts, sock: SocketChoice, master_addr: str) -> list[EnvVar]:
    out = [EnvVar("NCCL_SOCKET_IFNAME", "=" + sock.ifname, "detected", sock.reason),
           EnvVar("GLOO_SOCKET_IFNAME", sock.ifname, "detected", sock.reason)]
    iface = facts.iface(sock.ifname)
    if iface is None:
        return out
    v6 = [a for a in iface.ipv6 if not ipaddress.IPv6Address(a.split("%")[0]).is_link_local]
    master_v4 = ":" not in master_addr
    if master_v4 and v6:
        out.append(EnvVar("NCCL_SOCKET_FAMILY", "AF_INET", "detected",
                          f"master {master_addr} is IPv4 and {sock.ifname} also has IPv6"))
    elif not master_v4 and iface.ipv4:
        out.append(EnvVar("NCCL_SOCKET_FAMILY", "AF_INET6", "detected",
                          f"master {master_addr} is IPv6 and {sock.ifname} also has IPv4"))
    return out


def _rdma_vars(facts: NodeFacts, sock_if: str | None
               ) -> tuple[list[EnvVar], list[str], list[str], HcaChoice | None]:
    if not facts.rdma:
        return [], [], [], None  # no RDMA at all: NCCL uses sockets without being told
    hca = select_hcas(facts.rdma, sock_if)
    skipped = "; ".join(f"{n}: {why}" for n, why in hca.excluded)
    if hca.efa:
        return [], [f"{facts.hostname}: AWS EFA found; dtrain sets no NCCL_IB_* (aws-ofi-nccl "
                     "owns the transport; see hostfiles/profiles/aws-efa.yaml)"], [], hca
    if not hca.hcas:
        return ([EnvVar("NCCL_IB_DISABLE", "1", "detected", f"no usable RDMA port ({skipped})")],
                [f"{facts.hostname}: RDMA devices present but none usable: NCCL will use TCP "
                 f"sockets ({skipped})"], [], hca)
    top = hca.ports[0].rate or "?"
    reason = f"{hca.link_layer} ports ACTIVE/LinkUp at {top}"
    out = [EnvVar("NCCL_IB_HCA", hca.env_value or "", "detected",
                  reason + (f"; excluded {skipped}" if skipped else ""))]
    plan = plan_gids(hca.ports, nccl_version=facts.nccl_tuple, ifaces=facts.interfaces)
    out += [EnvVar(n, v, "detected", why) for n, v, why in plan.env]
    return out, list(plan.warnings), list(plan.errors), hca


def _vendor_vars(facts: NodeFacts) -> tuple[list[EnvVar], list[str]]:
    topo = [f for f in AZURE_TOPO if f in facts.files]
    out: list[EnvVar] = []
    warnings: list[str] = []
    if len(topo) == 1:
        out.append(EnvVar("NCCL_TOPO_FILE", topo[0], "detected",
                          "Azure ND VM: the VM shows a virtual PCI topology"))
    elif topo:
        warnings.append(f"{facts.hostname}: several Azure topology files ({', '.join(topo)}); "
                        "set NCCL_TOPO_FILE with --env or a profile")
    if GCP_GIB_SCRIPT in facts.files:
        warnings.append(f"{facts.hostname}: GCP gIB found; its {GCP_GIB_SCRIPT} must be sourced "
                        "before launch (not done by dtrain)")
    return out, warnings


# --------------------------------------------------------------------------- the user's layers

# The user's own layers of a run's environment, lowest first: the one place their order is
# written (docs/environment.md; tests/test_env_layers.py enumerates them, and fails on a
# module elsewhere that stacks what their readers return).
USER_LAYERS = ("config", "deepspeed_env", "env_file", "env")


@dataclass(frozen=True)
class EnvLayer:
    """One of the user's layers as read: its (name, value) pairs in the order given, and where
    each came from (``config ~/.config/dtrain/config.toml:4``, ``./.deepspeed_env``,
    ``--env-file F``, ``--env``): ``sources`` per name, else ``source``."""

    pairs: tuple[tuple[str, str], ...] = ()
    source: str = ""
    sources: tuple[tuple[str, str], ...] = ()

    def where(self, name: str) -> str:
        return dict(self.sources).get(name, self.source)


@dataclass(frozen=True)
class UserEnv:
    """The user's layers merged: one value per name (the highest layer's, in the order the
    names were first given) and where each came from."""

    env: tuple[tuple[str, str], ...] = ()
    sources: tuple[tuple[str, str], ...] = ()


def user_env(*, config: EnvLayer = EnvLayer(), deepspeed_env: EnvLayer = EnvLayer(),
             env_file: EnvLayer = EnvLayer(), env: EnvLayer = EnvLayer()) -> UserEnv:
    """The run's own environment from the user's layers (``USER_LAYERS``, lowest first):
    the config's ``[env]`` < ``.deepspeed_env`` < ``--env-file`` < ``--env``; within a
    layer, the later of a name's values wins. The CLI reads the files and passes them."""
    given = {"config": config, "deepspeed_env": deepspeed_env, "env_file": env_file,
             "env": env}
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name in USER_LAYERS:
        layer = given[name]
        for key, value in layer.pairs:
            values[key] = value
            sources[key] = layer.where(key)
    return UserEnv(env=tuple(values.items()), sources=tuple(sources.items()))


# --------------------------------------------------------------------------- merge


GPU_SELECTION = "--include/--exclude (GPU selection)"


def user_layer(gpus: Sequence[int] | None, host_env: Iterable[tuple[str, str]],
               host_source: str | None, env: Mapping[str, str],
               env_sources: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The user's layer of a node's environment and where each value came from, lowest
    first: the GPU selection (``CUDA_VISIBLE_DEVICES`` from ``--include``/``--exclude``) <
    the hostfile's ``env`` < the run's own (``env``: config ``[env]`` < ``.deepspeed_env`` <
    ``--env-file`` < ``--env``, merged so by ``user_env``). What ``merge_env`` takes
    as ``user``/``user_sources``, for the online and the offline plan alike."""
    devices = {} if gpus is None else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    host_env = list(host_env)
    user = {**devices, **dict(host_env), **dict(env)}
    sources = {**dict.fromkeys(devices, GPU_SELECTION),
               **{k: f"hostfile {host_source or 'env:'}" for k, _ in host_env},
               **dict(env_sources)}
    return user, sources


def merge_env(detected: Iterable[EnvVar], *, profile: Mapping[str, str] | None,
              user_sources: Mapping[str, str] | None = None,
              site: Mapping[str, tuple[str, str]], user: Mapping[str, str],
              profile_name: str = "profile", dtrain: Iterable[EnvVar] = ()
              ) -> tuple[dict[str, EnvVar], list[str]]:
    """Every precedence rule of a node's environment, in one place:
    user (``--env``, the hostfile's env) > site > profile > detection > dtrain's own.

    Warns where site/profile overrule detection. ``site`` maps key -> (value, source path
    or "env"). ``dtrain`` (the run id, node rank, ...) is the floor: any other layer wins
    over it silently.
    """
    # reasons and warnings name values of other layers: a secret name's value is never shown
    final: dict[str, EnvVar] = {v.name: v for v in detected}
    shown = redact_value
    warnings: list[str] = []
    for key, value in (profile or {}).items():
        prev = final.get(key)
        final[key] = EnvVar(key, value, "profile", profile_name)
        if prev is not None and _differs(prev.value, value):
            warnings.append(f"{key}: {profile_name} sets {shown(key, value)}; detection "
                            f"chose {shown(key, prev.value)} ({prev.reason})")
    for key, (value, source) in site.items():
        prev = final.get(key)
        final[key] = EnvVar(key, value, "site", f"already set by {source}", exported=False)
        if prev is not None and _differs(prev.value, value):
            warnings.append(f"{key}: {source} sets {shown(key, value)}, which stays in "
                            f"effect; dtrain would use {shown(key, prev.value)} "
                            f"({prev.source}: {prev.reason})")
    for key, value in user.items():
        prev = final.get(key)
        old = shown(key, prev.value) if prev is not None else ""
        note = f"; overrides {old} from {prev.source}" if prev is not None else ""
        if prev is not None and prev.source == "site":
            note = f"; forced over {old} ({prev.reason.removeprefix('already set by ')})"
        where = (user_sources or {}).get(key, "--env")  # --env-file F, a hostfile's env:
        final[key] = EnvVar(key, value, "user", where + note)
    for var in dtrain:
        final.setdefault(var.name, var)
    return final, warnings


def _differs(a: str, b: str) -> bool:
    """Compare values, ignoring NCCL's leading "=" (exact-match marker)."""
    return a.lstrip("=") != b.lstrip("=")


def _lint(final: Mapping[str, EnvVar], facts: NodeFacts, hca: HcaChoice | None) -> list[str]:
    """Values that are legal but known to break or mislead (torch/NCCL bug reports)."""
    host = facts.hostname
    out = []
    gloo = final.get("GLOO_SOCKET_IFNAME")
    if gloo is not None and gloo.value.startswith(("^", "=")):
        out.append(f"{host}: GLOO_SOCKET_IFNAME={gloo.value} ({gloo.source}): Gloo takes exact "
                   "interface names only; '^'/'=' make it fail to find an address")
    nccl = final.get("NCCL_SOCKET_IFNAME")
    if nccl is not None and len(nccl.value) <= 1:
        out.append(f"{host}: NCCL_SOCKET_IFNAME={nccl.value!r} is ignored by NCCL (too short)")
    out += [f"{host}: {name}={final[name].value} ({final[name].source}) is a debugging knob; "
            "do not keep it set in production" for name in DEBUG_ONLY if name in final]
    gid = final.get("NCCL_IB_GID_INDEX")
    if gid is not None and gid.source != "detected" and hca is not None and hca.ports:
        try:
            problems = check_gid_index(hca.ports, int(gid.value))
        except ValueError:
            problems = [f"not an integer: {gid.value!r}"]
        out += [f"{host}: NCCL_IB_GID_INDEX={gid.value} ({gid.source}): {p}" for p in problems]
    return out


def decide_env(facts: NodeFacts, *, master_addr: str, is_master: bool,
               user_env: Mapping[str, str], profile: Mapping[str, str] | None = None,
               user_sources: Mapping[str, str] | None = None, nnodes: int,
               profile_name: str = "profile",
               no_auto: Collection[str] = (), dtrain: Sequence[EnvVar] = (),
               master_given: bool = False) -> EnvDecision:
    """One node's whole environment: dtrain's own variables, detection, then profile, site
    config and --env on top (``merge_env``). ``master_given``: ``master_addr`` is the user's
    --master-addr.

    ``no_auto`` names detected variables to leave unset (``--no-auto K``). Blocking problems
    (the node cannot reach the master on a usable interface) are in ``errors``. The order:
    dtrain's own variables first, as given, then the others by name.
    """
    sock = socket_choice(facts, master_addr, is_master, multi_node=nnodes > 1,
                         given=master_given)
    detected = _socket_vars(facts, sock, master_addr)
    rdma_vars, rdma_warn, errors, hca = _rdma_vars(facts, sock.ifname)
    vendor_vars, vendor_warn = _vendor_vars(facts)
    detected += rdma_vars + vendor_vars
    detected.append(UNBUFFERED)
    detected = [v for v in detected if v.name not in no_auto]
    site = {k: (s.value, s.source) for k, s in facts.effective_site_env().items()}
    final, merge_warn = merge_env(detected, profile=profile, site=site, user=user_env,
                                  user_sources=user_sources,
                                  profile_name=profile_name, dtrain=dtrain)
    first = [v.name for v in dtrain]
    warnings = list(sock.warnings) + rdma_warn + vendor_warn
    warnings += [f"{facts.hostname}: {w}" for w in merge_warn] + _lint(final, facts, hca)
    return EnvDecision(
        env=tuple(final[k] for k in [*first, *sorted(set(final) - set(first))]),
        warnings=tuple(warnings),
        errors=tuple(errors),
        socket_iface=sock.ifname,
        hca=hca,
    )


# --------------------------------------------------------------------------- profiles


def parse_profile(text: str, source: str = "<profile>") -> dict[str, str]:
    """A fabric profile: YAML with ``env:`` (KEY: value) plus optional name/description.

    Values must be strings or numbers: YAML turns ``on``/``yes`` into booleans, which NCCL
    would then receive as "True".
    """
    import yaml  # only with --profile: a run without one never pays for it

    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    except (ValueError, TypeError, LookupError, AttributeError, OverflowError) as exc:
        # a tag's own constructor refusing its text (`!!int ''`: IndexError), PyYAML's
        # errors that are not YAMLError (found by fuzzing the profile, seed 44)
        raise ConfigError(f"{source}: not valid YAML: {str(exc)[:120]}",
                          hint="a value its !!tag cannot read, or a %YAML directive's "
                          "number: quote the value, drop the tag or the directive") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: nested too deep") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a profile is a mapping with an 'env:' key")
    # keys of any type (a null key, a number): compared as text (found by fuzzing, seed 44)
    unknown = sorted(str(k) for k in data if k not in ("name", "description", "env"))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}",
                          hint="allowed: name, description, env")
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{source}: env: must be a mapping of NAME: value")
    out: dict[str, str] = {}
    for key, value in env.items():
        problem = name_problem(key) if isinstance(key, str) else "not a name"
        if problem:
            raise ConfigError(f"{source}: env.{key}: {problem}")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(f"{source}: env.{key}: must be a string or a number",
                              hint="quote it, e.g. \"1\"")
        if "\x00" in str(value):
            raise ConfigError(f"{source}: env.{key}: the value contains a NUL byte")
        out[key] = str(value)
    return out


def load_profile(path: str | Path) -> dict[str, str]:
    """Read and parse a profile file (e.g. hostfiles/profiles/oci-roce.yaml)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read profile: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return parse_profile(text, str(path))
