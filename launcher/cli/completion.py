"""Shell completion through typer's own mechanism (docs/cli.md, "Shell completion").

`dtrain completion bash|zsh|fish` prints typer's script for that shell; the script calls
dtrain back with ``_DTRAIN_COMPLETE=complete_<shell>``, and typer/click answer with the
commands, options and the values the callbacks below offer: files for ``-f/--hostfile``,
run ids (from ``--archive-dir``) for the run argument of logs, attach and stop.

Everything here is cheap to import (os only); typer's completion classes are loaded only
when the shell asks for completions (``init``), so `dtrain --help` pays nothing for them.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from launcher.exitcodes import EXIT_USAGE

COMPLETE_VAR = "_DTRAIN_COMPLETE"
PROG = "dtrain"
SHELLS = ("bash", "zsh", "fish")
MAX_ITEMS = 200


def init() -> None:
    """Register typer's bash/zsh/fish completion classes (they replace click's)."""
    from typer._completion_classes import completion_init

    completion_init()


def complete_paths(incomplete: str) -> list[str]:
    """Files and directories (with a trailing /) whose path starts with ``incomplete``;
    dot files only when asked for (``.h``)."""
    head, base = os.path.split(incomplete)
    folder = os.path.expanduser(head) if head else "."
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        if not name.startswith(base) or (name.startswith(".") and not base.startswith(".")):
            continue
        path = os.path.join(head, name)
        out.append(path + "/" if os.path.isdir(os.path.join(folder, name)) else path)
        if len(out) >= MAX_ITEMS:
            break
    return out


def complete_hostfile(incomplete: str) -> list[str]:
    """-f/--hostfile: a path."""
    return complete_paths(incomplete)


def complete_run_id(ctx: typer.Context, incomplete: str) -> list[str]:
    """This user's run ids in the archive directory given so far (--archive-dir,
    $DTRAIN_ARCHIVE_DIR, the user config's archive_dir or the per-user default), newest
    first."""
    from pathlib import Path

    from typer import _click as click

    from launcher.errors import DtrainError
    from launcher.hosts.userconfig import default_archive_dir, load
    from launcher.output.archive import is_run_id, list_runs

    typed = ctx.get_parameter_source("archive_dir") is click.core.ParameterSource.COMMANDLINE
    archive_dir = (ctx.params.get("archive_dir") if typed else None) \
        or os.environ.get("DTRAIN_ARCHIVE_DIR")
    if not archive_dir:
        try:
            archive_dir = load().values.get("archive_dir")
        except DtrainError:
            archive_dir = None  # a bad config: its error comes when the command runs
        archive_dir = os.path.expanduser(archive_dir) if archive_dir else \
            str(default_archive_dir())
    try:
        runs = list_runs(Path(archive_dir))
    except OSError:
        return []
    # only this user's runs (list_runs), and only names a run id can have: a directory name
    # is text someone chose, and the shell prints it
    return [p.name for p in reversed(runs)
            if p.name.startswith(incomplete) and is_run_id(p.name)][:MAX_ITEMS]


def completion_cmd(
    shell: Annotated[str, typer.Argument(help="bash, zsh or fish.", metavar="SHELL")],
) -> None:
    """Print the shell completion script: `eval "$(dtrain completion bash)"` in ~/.bashrc
    (zsh: the same in ~/.zshrc; fish: `dtrain completion fish | source`).

    Example:

      dtrain completion bash >> ~/.bashrc
    """
    if shell not in SHELLS:
        typer.echo(f"dtrain: error: no completion for {shell!r}; one of: {', '.join(SHELLS)}",
                   err=True)
        raise typer.Exit(EXIT_USAGE)
    from typer._completion_shared import get_completion_script

    init()
    typer.echo(get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell))
