"""The typer app: parse options, call one function, render, exit.

One module per command (``exec``, ``run``, ``logs``, ``keys``, ``doctor``, ``ps``,
``attach``, ``stop``, ``completion``); the option types
and the error-to-exit-code wrapper they share are in ``common``. Heavy modules (asyncssh, rich
tables, the orchestrator) are imported inside the commands so `dtrain --help` stays fast.
"""

from __future__ import annotations

try:  # Ctrl-C while the CLI still imports (seconds on a loaded box): 130, no traceback
    import copy
    import gc
    import os
    import sys
    from typing import Annotated

    import typer

    from launcher import __version__
    from launcher.cli import (
        attach,
        common,
        completion,
        connections,
        cp,
        doctor,
        exec,
        image,
        incidents,
        keys,
        logs,
        nodes,
        ps,
        report,
        run,
        smoke,
        stacks,
        stop,
        top,
    )
    from launcher.errors import interrupt_handled
    from launcher.exitcodes import EXIT_INTERRUPTED, EXIT_OK
except KeyboardInterrupt:
    from launcher.errors import interrupt_handled  # imported already, by launcher itself
    from launcher.exitcodes import EXIT_INTERRUPTED  # imported already, by launcher.errors

    interrupt_handled()
    raise SystemExit(EXIT_INTERRUPTED) from None

app = typer.Typer(
    name="dtrain", cls=common.DtrainGroup, no_args_is_help=True,
    pretty_exceptions_enable=False, add_completion=False, context_settings=common.HELP,
    help="Multi-node PyTorch launcher over SSH: exec (the pdsh replacement), run (torchrun on "
         "every node), cp (pdcp/rpdcp), keys, doctor, logs, report, top (the cluster live); "
         "ps, attach, stop for runs that outlive the login session (run --detach).",
)

def _version(value: bool) -> None:
    if value:
        typer.echo(f"dtrain {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def main_callback(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """dtrain: launch and supervise multi-node jobs over SSH."""


Cmd = common.DtrainCommand
app.command("exec", cls=Cmd, context_settings=common.PASSTHROUGH)(exec.exec_cmd)
app.command("run", cls=Cmd, context_settings=common.PASSTHROUGH)(run.run_cmd)
app.command("cp", cls=Cmd)(cp.cp_cmd)
app.command("logs", cls=Cmd)(logs.logs_cmd)
app.add_typer(keys.keys_app, name="keys", help="Passwordless SSH bootstrap for every node.")
app.command("doctor", cls=Cmd)(doctor.doctor_cmd)
app.command("ps", cls=Cmd)(ps.ps_cmd)
app.command("attach", cls=Cmd)(attach.attach_cmd)
app.command("stop", cls=Cmd)(stop.stop_cmd)
app.command("stacks", cls=Cmd)(stacks.stacks_cmd)
app.command("smoke", cls=Cmd)(smoke.smoke_cmd)
app.command("report", cls=Cmd)(report.report_cmd)
app.command("top", cls=Cmd)(top.top_cmd)
app.command("completion", cls=Cmd)(completion.completion_cmd)
app.command("incidents", cls=Cmd)(incidents.incidents_cmd)
app.add_typer(nodes.nodes_app, name="nodes", help="Nodes fenced by `dtrain run --restarts` "
              "(the lemon list): list, unfence, expire.\n\nExample:\n\n  dtrain nodes "
              "unfence node3")


app.add_typer(image.image_app, name="image",
              help="Container images on the nodes: push (docs/containers.md).\n\nExample:"
              "\n\n  dtrain image push -f hosts nvcr.io/nvidia/pytorch:24.05-py3")
app.add_typer(connections.connections_app, name="connections",
              help="Connections kept warm by --persist (the connection keeper): list, close."
              "\n\nExample:\n\n  dtrain connections close node[1-2]")


def only(name: str) -> typer.Typer:
    """The app with one command (or group) registered: typer builds the click command of
    every registered command on each call (~70 ms of CPU for all of them, against ~10 ms
    for one: issue 26), and `dtrain exec ...` needs exec's alone. Same callback, settings,
    help and errors for that command (tests/test_cli_lean.py compares them)."""
    lean = copy.copy(app)
    lean.registered_commands = [c for c in app.registered_commands if c.name == name]
    lean.registered_groups = [g for g in app.registered_groups if g.name == name]
    return lean


_BUILT: dict[str, typer.core.TyperGroup] = {}  # prebuild(): the resident's, made once


def prebuild(names: tuple[str, ...]) -> None:
    """Build these commands' click commands now, in the resident (launcher/cli/resident.py):
    each warm start it forks then parses with one built before it (typer's build of exec's
    command is ~10 ms of CPU)."""
    for name in names:
        _BUILT[name] = typer.main.get_command(only(name))  # type: ignore[assignment]


def main() -> None:
    """Console-script entry point (``_DTRAIN_COMPLETE`` set: the shell asks for completions,
    also under `python -m launcher`)."""
    try:
        completing = bool(os.environ.get(completion.COMPLETE_VAR))
        if completing:
            completion.init()
        name = sys.argv[1] if len(sys.argv) > 1 else ""
        names = {c.name for c in app.registered_commands} | {
            g.name for g in app.registered_groups}
        # a command's name first: only that one is built; anything else (--help, --version,
        # a typo that wants "did you mean", completion) gets the whole app
        built = _BUILT.get(name) if not completing else None
        if built is not None:  # what typer's app() does, with the build done already
            built(complete_var=completion.COMPLETE_VAR)
        else:
            target = only(name) if name in names and not completing else app
            target(complete_var=completion.COMPLETE_VAR)
    except KeyboardInterrupt:
        # Ctrl-C while typer builds the command (it evaluates every option's annotation),
        # before its own Ctrl-C handling (typer's Exit(130)) is in place: 130, no traceback
        raise SystemExit(EXIT_INTERRUPTED) from None
    finally:
        # a Ctrl-C caught anywhere (here, by typer, by a command's body) may have left the
        # interpreter's "unhandled" mark: it would turn the exit code into death by SIGINT
        interrupt_handled()
        # the process ends here: the interpreter's last garbage collections would walk
        # every object the command made (0.08-0.14 s of each command's wall on the test box,
        # more than pdsh's whole run: issue 26). Frozen objects are skipped by them; atexit
        # handlers, the std streams' flush and refcounted cleanup still run.
        gc.freeze()


if __name__ == "__main__":
    main()
