"""`dtrain connections`: the connection keeper's kept connections (list, close)."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher.cli.common import DtrainCommand, DtrainGroup, run_body

connections_app = typer.Typer(
    cls=DtrainGroup, invoke_without_command=True,
    help="Connections kept warm by --persist (the connection keeper): list, close.")

JsonOpt = Annotated[bool, typer.Option(
    "--json", rich_help_panel="Reports",
    help="One JSON document on stdout (dtrain.connections/1).")]


@connections_app.callback()
def connections_cmd(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the connections the keeper holds: host, user, port, age, idle time, channels.

    The keeper starts with the first command run with --persist (or DTRAIN_PERSIST, or
    `persist = "10m"` in config.toml) and exits when it has been idle that long
    (docs/connections.md).

    Example:

      dtrain connections --json
    """
    if ctx.invoked_subcommand is not None:
        return

    def body() -> int:
        from launcher.commands.connections import list_connections

        return list_connections(as_json=as_json)

    run_body(body)


@connections_app.command("list", cls=DtrainCommand)
def list_cmd(as_json: JsonOpt = False) -> None:
    """List the kept connections (the same as `dtrain connections`).

    Example:

      dtrain connections list
    """
    def body() -> int:
        from launcher.commands.connections import list_connections

        return list_connections(as_json=as_json)

    run_body(body)


@connections_app.command("close", cls=DtrainCommand)
def close_cmd(hosts: Annotated[list[str] | None, typer.Argument(
        metavar="[HOSTS]",
        help="Hosts or ranges (node[1-4]) whose connections to close; none: all of them, "
             "and the keeper exits.")] = None) -> None:
    """Close kept connections (all of them, and the keeper, when no host is named).

    A connection in use closes when its last channel ends.

    Example:

      dtrain connections close node[1-2]
    """
    def body() -> int:
        from launcher.commands.connections import close_connections

        return close_connections(list(hosts or []))

    run_body(body)
