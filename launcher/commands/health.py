"""The health gate's I/O: `dtrain doctor --health` and `dtrain run --health-check`.

Every node runs the collector (nodeside/health.py, shipped as the probe is); the findings and
tiers are decide/fabric/health.py's. Isolate-tier nodes go on the lemon list (job/lemons.py) as
``isolate`` records (reason: the findings), so the next run leaves them out while it has
hosts to spare (decide/outcome/lemons.py). docs/fabric.md has the checks and thresholds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher import defaults
from launcher.aio import CLOSE_S, cleanup
from launcher.decide.fabric import health as hd
from launcher.errors import DtrainError
from launcher.exitcodes import EXIT_UNREACHABLE
from launcher.models import Host

if TYPE_CHECKING:
    from launcher.decide.runplan.runoptions import RunOptions


@dataclass(frozen=True)
class HealthOptions:
    python: str = "python3"
    setup: str | None = None
    interval: float = 1.0  # seconds between the two readings of the port counters
    dcgm: int = 0  # dcgmi diag -r N (0: not run)
    fanout: int = defaults.FANOUT
    timeout: float = 60.0  # one node's collector (more with --dcgm: the diag's own time)
    transport: str = "auto"


XIDS_FILE = "health-xids.json"  # in dtrain's state directory, beside lemons.json


def load_xids(directory: Path | None = None) -> dict[str, list[str]]:
    """The Xid lines the last check saw, per host ({} when none or unreadable)."""
    from launcher import private
    from launcher.job.lemons import state_dir

    try:  # this user's own file only (a link or another user's is as good as none)
        data = json.loads(private.read_private((directory or state_dir()) / XIDS_FILE,
                                               1 << 24))
        hosts = data["hosts"]
        return {str(h): [str(x) for x in v] for h, v in hosts.items() if isinstance(v, list)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, private.NotPrivate):
        return {}


def save_xids(xids: Mapping[str, Sequence[str]], directory: Path | None = None) -> None:
    """Keep this check's Xid lines (merged over the earlier hosts'); best effort."""
    import os

    from launcher import private
    from launcher.job.lemons import state_dir

    d = directory or state_dir()
    with contextlib.suppress(OSError):
        d.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if private.private_dir(d, create=True) is not None:
            return  # not this user's alone: nothing is written there
        merged = {**load_xids(d), **{h: list(v) for h, v in xids.items()}}
        tmp = d / f".{XIDS_FILE}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "w") as f:
            json.dump({"version": 1, "hosts": merged}, f)
        os.replace(tmp, d / XIDS_FILE)


async def _collect(conn: Any, opts: HealthOptions) -> dict[str, Any]:
    from launcher.job.remote import read_json_line
    from launcher.nodeside import wire

    python = conn.host.python or opts.python
    proc = await conn.start(wire.remote_command(python, setup=opts.setup, stdlib_only=True))
    try:
        with contextlib.suppress(ConnectionError):
            await proc.write(wire.payload(wire.program_source("health"),
                                          {"interval": opts.interval, "dcgm": opts.dcgm}))
            proc.write_eof()
        return await read_json_line(proc, conn.host.label, "health check")
    finally:
        proc.abort()


def _why(exc: BaseException) -> str:
    if isinstance(exc, DtrainError):
        return f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    return f"{type(exc).__name__}: {exc}"


async def gather_with(transport: Any, hosts: Sequence[Host], opts: HealthOptions,
                      connect_timeout: float) -> tuple[list[dict[str, object]],
                                                       dict[str, list[hd.Finding]]]:
    """(every node's dtrain.health/1 entry, in host order; each node's findings)."""
    from launcher.job.orchestrate import connect_all

    conns, errors = await connect_all(transport, hosts, fanout=opts.fanout,
                                      timeout=connect_timeout)
    raws: dict[str, dict[str, Any]] = {}
    limit = opts.timeout + {1: 120, 2: 600, 3: 3600}.get(opts.dcgm, 0)

    async def one(label: str, conn: Any) -> None:
        try:
            async with asyncio.timeout(limit):
                raw = await _collect(conn, opts)
        except TimeoutError:
            errors[label] = f"the health check did not answer within {limit:g} s"
            return
        except (DtrainError, OSError) as exc:
            errors[label] = _why(exc)
            return
        if raw.get("ok") is False:
            errors[label] = f"health check failed: {raw.get('error')}"
        else:
            raws[label] = raw

    try:
        async with asyncio.TaskGroup() as tg:
            for label, conn in conns.items():
                tg.create_task(one(label, conn), name=f"health:{label}")
    finally:
        for conn in conns.values():
            await cleanup(conn.aclose(), CLOSE_S)
    nodes: list[dict[str, object]] = []
    found: dict[str, list[hd.Finding]] = {}
    previous = load_xids()
    for h in hosts:
        raw = raws.get(h.label)
        findings = hd.node_findings(raw, previous.get(h.label)) if raw is not None else []
        found[h.label] = findings
        nodes.append(hd.node_json(h.label, findings, raw, errors.get(h.label)))
    save_xids({h: [str(x) for x in r.get("xid_lines") or []] for h, r in raws.items()
               if r.get("kernel_log")})
    return nodes, found


async def gather(hosts: Sequence[Host], opts: HealthOptions, settings: Any
                 ) -> tuple[list[dict[str, object]], dict[str, list[hd.Finding]]]:
    from launcher.output import render
    from launcher.transports import AutoTransport

    transport = AutoTransport(settings, opts.transport, say=render.note)
    transport.choose(hosts)
    async with transport:
        return await gather_with(transport, hosts, opts, settings.connect_timeout)


def remember(found: Mapping[str, Sequence[hd.Finding]], run_id: str,
             store: Any = None) -> list[str]:
    """Put every isolate-tier node on the lemon list (an isolate record); the hosts."""
    from launcher.decide.outcome.lemons import DEFAULT_TTL_S, ISOLATE, Lemon
    from launcher.job.lemons import LemonStore

    now = time.time()
    new = [Lemon(host, hd.isolate_reason(f), run_id, now, now + DEFAULT_TTL_S, ISOLATE)
           for host, f in found.items() if hd.verdict(f) == "isolate"]
    (store or LemonStore()).remember(new)
    return [x.host for x in new]


def lines(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The human view: one line per node (its verdict), then its findings indented."""
    out = []
    for n in nodes:
        what = [w for w, ok in (("GPUs", n["gpus"]), ("DCGM", n["dcgm"])) if ok]
        if n["gpus"] and not n["kernel_log"]:
            what.append("kernel log not readable: Xids unchecked")
        if n["ports"]:
            what.append(f"{len(n['ports'])} port(s)")
        checked = f" ({', '.join(what)})" if what else " (no GPU, no RDMA port)"
        if n["error"]:
            out.append(f"{n['host']}: UNREACHABLE: {n['error']}")
            continue
        out.append(f"{n['host']}: {str(n['verdict']).upper()}{checked}")
        out += [f"  {f['tier']}: {f['message']}" for f in n["findings"]]
    return out


def run_health(hosts: Sequence[Host], opts: HealthOptions, settings: Any, *,
               as_json: bool = False) -> int:
    """`dtrain doctor --health`: exit 0 no node isolated (reset/monitor are reported),
    1 some node isolated (it is on the lemon list now), 255 some node not reached."""
    from launcher.commands.entry import INTERRUPTED, Ended, run_command
    from launcher.output import render
    from launcher.output.archive import new_run_id

    Result = tuple[list[dict[str, object]], dict[str, list[hd.Finding]]]

    def conclude(ended: Ended[Result]) -> int:
        if ended.result is None:
            return INTERRUPTED
        nodes, found = ended.result
        isolated = remember(found, f"doctor-health-{new_run_id()}")
        doc = hd.document(nodes, time.time() - ended.started)
        stream = sys.stderr if as_json else sys.stdout
        for line in lines(nodes):
            stream.write(line + "\n")
        counts = doc["counts"]
        assert isinstance(counts, dict)
        stream.write(", ".join(f"{v} {k}" for k, v in counts.items() if v) + "\n")
        for host in isolated:
            render.note(f"{host}: isolated (on the lemon list: the next run leaves it out "
                        f"while it has hosts to spare; `dtrain nodes unfence {host}` after "
                        "the fix)", stream)
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        if counts.get("unreachable"):
            return EXIT_UNREACHABLE
        return 1 if isolated else 0

    return run_command("doctor", hosts, lambda: gather(hosts, opts, settings), conclude)


__all__ = ["HealthOptions", "gather", "gather_with", "lines", "remember", "run_health"]


async def gate(hosts: Sequence[Host], req: Any, opts: RunOptions, settings: Any) -> None:
    """`run --health-check`: the gate before the job. Isolate-tier nodes go on the lemon
    list (the run's id), so choose_gang leaves them out while --nnodes spares hosts; when it
    cannot, the run is refused (PreflightFailed) naming each node and why."""
    from launcher.decide.outcome.lemons import current
    from launcher.errors import PreflightFailed
    from launcher.hosts.hostfile import fold
    from launcher.job.lemons import LemonStore
    from launcher.output import render

    hopts = HealthOptions(python=req.python, setup=req.setup, dcgm=opts.checks.health_dcgm,
                          fanout=opts.connection.fanout,
                          timeout=opts.connection.probe_timeout + 1.0,
                          transport=opts.connection.transport)
    stream = sys.stderr if opts.reports.as_json else sys.stdout
    started = time.monotonic()
    nodes, found = await gather(hosts, hopts, settings)
    store = LemonStore()
    isolated = remember(found, req.run_id, store)
    counts = hd.document(nodes, 0.0)["counts"]
    assert isinstance(counts, dict)
    render.note(f"health check: {len(nodes)} node(s) in {time.monotonic() - started:.1f} s: "
                + ", ".join(f"{v} {k}" for k, v in counts.items() if v), stream)
    for n in nodes:
        if n["verdict"] in ("reset", "monitor"):
            for f in n["findings"]:  # type: ignore[attr-defined]
                render.note(f"health check: {n['host']}: {f['tier']}: {f['message']}", stream)
    down = [str(n["host"]) for n in nodes if n["verdict"] == "unreachable"]
    if down:
        raise PreflightFailed(f"health check: {fold(down)} not checked: "
                              + "; ".join(f"{n['host']}: {n['error']}" for n in nodes
                                          if n["verdict"] == "unreachable"),
                              hint="fix or leave out those nodes (--exclude), then rerun")
    if not isolated:
        return
    for host in isolated:
        render.note(f"health check: {host} isolated: {hd.isolate_reason(found[host])}", stream)
    policy = opts.watch.restart
    need = policy.count.min if policy.count else len(hosts)
    bad = set(current(store.load(), time.time()))
    if len(hosts) - len([h for h in hosts if h.label in bad]) < need:
        raise PreflightFailed(
            f"health check: {fold(isolated)} isolated "
            f"({'; '.join(hd.isolate_reason(found[h]) for h in isolated)}): the run needs "
            f"{need} node(s) and has no spare",
            hint="give spare hosts with --nnodes MIN:MAX or more hosts, or after the fix "
                 f"`dtrain nodes unfence {' '.join(isolated)}`")
