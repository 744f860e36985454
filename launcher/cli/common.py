"""What every command shares besides its options (those are in ``groups``): the click
classes that give dtrain's wording for usage errors and its own help layout
(``helptext``), and ``run_body``, the one place that turns a DtrainError into a message and
an exit code (anything else is a bug and shows a traceback). Command modules import this;
nothing here imports a command module, so the CLI has no import circle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from launcher.cli import coerce
from launcher.errors import DtrainError
from launcher.exitcodes import EXIT_INTERRUPTED, EXIT_USAGE

# Everything after the first positional (the script, the remote command) belongs to it; an
# unknown option *before* it is a typo and an error (never the script's name).
PASSTHROUGH = {"allow_interspersed_args": False}


def _click_exceptions() -> Any:
    """click's exception module as typer uses it (typer >= 0.20 vendors click as _click)."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # older typer: plain click
        return importlib.import_module("click.exceptions")


def no_such_option(name: str, possibilities: Sequence[str] | None) -> str:
    """`no such option --nproc-per-nod (did you mean --nproc-per-node?)`."""
    if possibilities:  # best match first (difflib)
        return f"no such option {name} (did you mean {possibilities[0]}?)"
    return (f"no such option {name} (options for the script or command go after it, "
            "options for dtrain before it)")


def _no_flag_metavars(params: list[Any]) -> list[Any]:
    """A flag takes no value: no `<bool>` in its help row (typer >= 0.2x prints one)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


# -h works as --help everywhere (after a command's script or remote command it is theirs)
HELP = {"help_option_names": ["-h", "--help"]}


class DtrainGroup(TyperGroup):
    """typer's group without `<bool>` on its flags (--help, --version), dtrain's help layout,
    and a bare `dtrain` (or `dtrain keys`) saying a command is needed (exit 2)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_metavars(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from launcher.cli import helptext

        helptext.render(self, ctx)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        coerce.install(self.get_params(ctx))
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            from launcher.cli import helptext

            helptext.render(self, ctx)
            typer.echo(f"{ctx.command_path}: a command is needed: {ctx.command_path} "
                       f"COMMAND [ARGS]... (`{ctx.command_path} COMMAND -h` shows one "
                       "command's options)", err=True)
            ctx.exit(EXIT_USAGE)
        return super().parse_args(ctx, args)


class DtrainCommand(TyperCommand):
    """typer's command with dtrain's wording for an unknown option and no `<bool>` on flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_metavars(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from launcher.cli import helptext

        helptext.render(self, ctx)

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        """Completion offers dtrain's spellings, not the hidden torchrun/old aliases."""
        from launcher.cli.groups import HIDDEN_NAMES

        return [item for item in super().shell_complete(ctx, incomplete)
                if item.value not in HIDDEN_NAMES]

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """`[OPTIONS] SCRIPT [ARGS]...` (typer writes `{script} [args]...`)."""
        from launcher.cli import helptext

        return ["[OPTIONS]", *(helptext.argument_usage(p) for p in self.get_params(ctx)
                               if p.param_type_name == "argument")]

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        coerce.install(self.get_params(ctx))  # no pydantic for plain values (cli/coerce.py)
        exceptions = _click_exceptions()
        try:
            return super().parse_args(ctx, args)
        except exceptions.NoSuchOption as exc:
            raise exceptions.UsageError(no_such_option(exc.option_name, exc.possibilities),
                                        ctx=ctx) from None


def run_body(fn: Callable[[], int]) -> None:
    """Run a command body: DtrainError -> message on stderr + its exit code. With
    DTRAIN_HOPS=1, where its time went, after it (text/hops.py)."""
    from launcher.text import hops

    hops.mark("command")
    try:
        code = fn()
    except DtrainError as exc:
        from launcher.output import render

        render.error(exc)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        hops.report()
    raise typer.Exit(code)
