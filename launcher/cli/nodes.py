"""`dtrain nodes`: the lemon list (nodes fenced by a restarting run): list, unfence, expire."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher.cli.common import DtrainCommand, DtrainGroup, run_body

nodes_app = typer.Typer(cls=DtrainGroup, invoke_without_command=True,
                        help="Nodes fenced by `dtrain run --restarts` (the lemon list): "
                             "list, unfence, expire.")

JsonOpt = Annotated[bool, typer.Option("--json", rich_help_panel="Reports",
                                       help="One JSON document on stdout (dtrain.nodes/1).")]


@nodes_app.callback()
def nodes_cmd(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the remembered bad nodes: which node, why, which run, when, until when.

    Later runs leave these nodes out while they have hosts to spare (--nnodes below the host
    count) and say so; the list lives in the per-user state directory
    ($XDG_STATE_HOME/dtrain/lemons.json; docs/restarts.md).

    Example:

      dtrain nodes --json
    """
    if ctx.invoked_subcommand is not None:
        return

    def body() -> int:
        from launcher.commands.nodes import list_nodes

        return list_nodes(as_json=as_json)

    run_body(body)


@nodes_app.command("list", cls=DtrainCommand)
def list_cmd(as_json: JsonOpt = False) -> None:
    """List the remembered bad nodes (the same as `dtrain nodes`).

    Example:

      dtrain nodes list
    """
    def body() -> int:
        from launcher.commands.nodes import list_nodes

        return list_nodes(as_json=as_json)

    run_body(body)


@nodes_app.command("unfence", cls=DtrainCommand)
def unfence_cmd(hosts: Annotated[list[str], typer.Argument(
        metavar="HOSTS",
        help="Hosts as the hostfile writes them: node[1-3], dtuser@login1:2222.")]) -> None:
    """Take nodes off the list: later runs use them again.

    Example:

      dtrain nodes unfence node[3-4]
    """
    def body() -> int:
        from launcher.commands.nodes import unfence

        return unfence(hosts)

    run_body(body)


@nodes_app.command("expire", cls=DtrainCommand)
def expire_cmd(older_than: Annotated[str | None, typer.Option(
        "--older-than", metavar="AGE",
        help="Also drop records fenced longer ago than this (90s, 30m, 12h, "
             "7d; 0 = every record).")] = None) -> None:
    """Drop the records whose time is over (a fence lasts 24 h), or older ones.

    Example:

      dtrain nodes expire --older-than 7d
    """
    def body() -> int:
        from launcher.commands.nodes import expire

        return expire(older_than)

    run_body(body)
