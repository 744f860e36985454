"""`--help` people can read (issue 24 item 5): every command's help at 80 columns, in the
option panels of launcher/cli/groups.py, with no cut word, no typer `<str>` metavar, one
example each; `-h` works; a bare `dtrain` says a command is needed (exit 2)."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from launcher.cli import app, helptext
from tests.util import dtrain


def _commands() -> list[tuple[list[str], Any]]:
    """(argv prefix, click command) for every command and subcommand."""
    root = typer.main.get_command(app)
    found: list[tuple[list[str], Any]] = []

    def walk(path: list[str], cmd: Any) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk([*path, name], sub)
            if getattr(cmd, "callback", None) is None or path == []:
                return
        found.append((path, cmd))

    walk([], root)
    return found


COMMANDS = _commands()
IDS = [" ".join(path) for path, _ in COMMANDS]


def _help(path: list[str], flag: str = "--help") -> str:
    res = CliRunner().invoke(app, [*path, flag], prog_name="dtrain",
                             env={"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"})
    assert res.exit_code == 0, (path, res.output)
    return res.output


def _words(text: str) -> set[str]:
    tokens = text.replace("│", " ").replace("╭", " ").replace("╰", " ").split()
    return set(tokens) | {t.rstrip(",") for t in tokens}


def test_every_command_is_listed() -> None:
    names = set(IDS)
    assert {"run", "exec", "cp", "logs", "attach", "smoke", "doctor", "top", "keys check",
            "keys revoke", "keys setup"} <= names, names


@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=IDS)
def test_help_at_80_columns_has_no_cut_word_and_no_typer_metavar(index: int) -> None:
    path, cmd = COMMANDS[index]
    text = _help(path)
    assert "…" not in text, text
    assert not helptext.bad_metavars(text), helptext.bad_metavars(text)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    seen = _words(text)
    ctx = cmd.make_context(path[-1] if path else "dtrain", [], resilient_parsing=True)
    for param in cmd.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        # every word of the help, and every name shown, is whole somewhere in the page
        shown = [o for o in param.opts if o not in _hidden_names()] \
            if param.param_type_name == "option" else []
        for word in [*helptext.param_help(param, ctx).split(), *shown]:
            assert word in seen, f"{' '.join(path)}: {word!r} cut or missing:\n{text}"
    for line in helptext.reflow(cmd.help or ""):
        for word in line.split():
            assert word in seen, f"{' '.join(path)}: docstring word {word!r} cut:\n{text}"


def _hidden_names() -> frozenset[str]:
    from launcher.cli.groups import HIDDEN_NAMES

    return HIDDEN_NAMES


@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=IDS)
def test_each_command_shows_one_example_and_takes_h(index: int) -> None:
    path, _ = COMMANDS[index]
    text = _help(path)
    if path:  # the top-level page lists the commands instead
        examples = [ln for ln in text.splitlines() if ln.strip().startswith("dtrain ")]
        assert examples, f"{' '.join(path)}: no example:\n{text}"
    assert _help(path, "-h") == text


def test_panels_group_the_shared_options() -> None:
    text = _help(["run"])
    for panel in ("Hosts", "Connection", "Node", "Environment", "Display", "Reports",
                  "Archive", "Failure"):
        assert f"─ {panel}" in text, panel
    for path in (["cp"], ["smoke"], ["exec"], ["doctor"]):
        page = _help(path)
        assert "--transport" in page and "─ Connection" in page, path


def test_identity_is_described_for_what_each_keys_command_does() -> None:
    assert "Key to install" in _help(["keys", "setup"])
    for sub in ("check", "revoke"):
        page = _help(["keys", sub])
        assert "Key to install" not in page and "--identity" in page, sub


def test_bare_dtrain_prints_help_and_says_a_command_is_needed() -> None:
    res = dtrain([])
    assert res.returncode == 2
    assert "Commands" in res.stdout and "run" in res.stdout
    assert "a command is needed" in res.stderr
    res = dtrain(["keys"])
    assert res.returncode == 2 and "a command is needed" in res.stderr


@pytest.mark.parametrize("args", [["cp", "-H", "node1", "README.md", "/tmp/x"],
                                  ["smoke", "-H", "node1"]])
def test_cp_and_smoke_take_the_connection_group(args: list[str]) -> None:
    """--transport reaches cp and smoke (old main: no such option) and is checked there."""
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DTRAIN_"))}
    res = dtrain([*args, "--transport", "srun"], env=base)
    assert res.returncode == 2 and "not inside a Slurm allocation" in res.stderr, res.stderr
    res = dtrain([*args, "--transport", "bogus"], env=base)
    assert res.returncode == 2 and "use ssh, srun or auto" in res.stderr, res.stderr
