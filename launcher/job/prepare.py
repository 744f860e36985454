"""What every command that runs a job does first: connect → preflight → plan, as a value.

``prepare`` connects to every node (an unreachable one is named with its hostfile line and
the exact ``--exclude`` that leaves it out: nothing is started), probes them and checks the
master (``preflight``: facts only), and yields a ``Prepared``; ``Prepared.plan`` decides
(``decide.runplan.plan.build_plan``, pure). The connections are closed when the block ends.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from launcher.aio import CLOSE_S, cleanup
from launcher.decide.runplan.placement import after_probe
from launcher.decide.runplan.plan import LaunchPlan, RunRequest, build_plan, plan_warnings
from launcher.decide.runplan.runoptions import RunOptions
from launcher.decide.runplan.sharing import refuse, sharing
from launcher.errors import ConnectError
from launcher.hosts.where import failed_hosts_lines, leave_out_hint
from launcher.job.orchestrate import connect_all
from launcher.job.preflight import Preflight, preflight
from launcher.job.probes import CLOSE_S as PROBES_CLOSE_S
from launcher.models import Host
from launcher.output import render
from launcher.text.words import count
from launcher.transports import AutoTransport, Choice
from launcher.transports.base import Connection, Transport
from launcher.transports.ssh import SSHSettings


@dataclass(frozen=True)
class Prepared:
    """Every node connected and probed, the master checked."""

    hosts: Sequence[Host]
    transport: Transport
    choice: Choice  # ssh or srun, and why
    conns: dict[str, Connection]
    pre: Preflight

    def plan(self, req: RunRequest, opts: RunOptions) -> LaunchPlan:
        """Decide every node's argv and environment (pure); the preflight's warnings are
        shown once the plan stands. Another user's dtrain run on a node is one warning line
        per node first (with --exclusive: refused, nothing started; decide/runplan/sharing.py)."""
        pre = self.pre
        hosts = list(self.hosts)
        found = sharing(pre.facts, [h.label for h in hosts])  # other users' runs there
        if found.shared and opts.checks.exclusive:
            raise refuse(found)
        for line in found.lines:
            render.note(f"warning: {line}")
        placed = after_probe(hosts, {label: f.fabric for label, f in pre.facts.items()},
                             opts.checks.topology, opts.checks.topology_from)
        if placed is not None:  # NVLink domains: ranks ordered by them (decide/runplan/placement)
            by_label = {h.label: h for h in hosts}
            hosts = [by_label[label] for label in placed[0]]
            for line in placed[1]:
                render.note(f"placement: {line}",
                            sys.stderr if opts.reports.as_json else sys.stdout)
        plan = build_plan(req, opts, hosts, pre.facts, master_addr=pre.master_addr,
                          master_port=pre.master_port, master_reason=pre.master_reason)
        # a dry run lists each node's warnings under it (commands/run.py)
        hostnames = {label: f.hostname for label, f in pre.facts.items()}
        node_warnings = [] if opts.dry_run else plan_warnings(plan, hostnames)
        for warning in [*pre.warnings, *node_warnings]:
            render.note(f"warning: {warning}")
        return plan


def unreachable_error(hosts: Sequence[Host], errors: Mapping[str, str]) -> ConnectError:
    """Each unreachable host once, with its hostfile line and the exact --exclude."""
    lines = failed_hosts_lines(hosts, errors)
    failed = [h for h in hosts if h.label in errors]
    text = (f"cannot reach {lines[0]}; nothing was started" if len(lines) == 1 else
            f"cannot reach {count(len(failed), 'node')}; nothing was started:\n  "
            + "\n  ".join(lines))
    error = ConnectError(text, hint=leave_out_hint(failed))
    error.hosts = tuple(h.label for h in failed)
    return error


@contextlib.asynccontextmanager
async def prepare(hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
                  settings: SSHSettings, *, transport: str | None = None
                  ) -> AsyncIterator[Prepared]:
    """Connect to every host and run the preflight (``transport``: the --transport mode,
    default ``opts.connection.transport``)."""
    # never through the connection keeper: the probe's channel becomes the supervisor's,
    # and a keeper's restart must never cost a run (docs/connections.md)
    auto = AutoTransport(settings, opts.connection.transport if transport is None else transport,
                         keeper=False)
    choice = auto.choose(hosts)
    async with auto:
        conns, errors = await connect_all(auto, hosts, fanout=opts.connection.fanout,
                                          timeout=settings.connect_timeout)
        pre = None
        try:
            if errors:
                raise unreachable_error(hosts, errors)
            pre = await preflight(conns, hosts, req, opts)
            yield Prepared(hosts, auto, choice, conns, pre)
        finally:
            if pre is not None and pre.probes is not None:
                # the probes no supervisor was made of (bounded by their own aclose)
                await cleanup(pre.probes.aclose(), PROBES_CLOSE_S + CLOSE_S)
            for conn in conns.values():
                await cleanup(conn.aclose(), CLOSE_S)
