"""`dtrain keys ...` commands (registered on the main app by launcher.cli)."""

from __future__ import annotations

import typer

keys_app = typer.Typer(no_args_is_help=True, help="Passwordless SSH bootstrap for every node.")
