"""`dtrain incidents`: the failures remembered across runs, by fingerprint (docs/incidents.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher.cli.common import run_body


def incidents_cmd(
    fingerprint: Annotated[str | None, typer.Argument(
        metavar="FINGERPRINT", help="One fingerprint (12 hex digits, or a prefix): its runs, "
                                    "each with its `dtrain logs RUN --attempt N`.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="AGE", help="Only the failures of the last AGE (90s, 30m, 12h, "
                                       "7d).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", rich_help_panel="Reports",
        help="One JSON document on stdout (dtrain.incidents/1).")] = False,
) -> None:
    """List the failures dtrain explained, by fingerprint: the time they cost, how often,
    on which nodes, in which runs, first and last seen, with which commits. The rows are
    ranked by the time lost (the goodput ledger's lost, detection, restart and startup
    seconds of the attempts each ended): what to fix first.

    The same bug has the same fingerprint on any node and rank; a fingerprint seen on two
    nodes with one commit stops a restarting run, two on one node fence it (docs/incidents.md).
    The store is $XDG_STATE_HOME/dtrain/incidents.json.

    Example:

      dtrain incidents --since 7d
    """
    def body() -> int:
        from launcher.commands.incidents import list_incidents
        from launcher.commands.nodes import parse_duration

        age = parse_duration(since, "--since") if since is not None else None
        return list_incidents(fingerprint, since=age, as_json=as_json)

    run_body(body)
