"""`--help` as people read it: options in the panels of launcher/cli/groups.py, at any width.

typer's own layout gives each option six columns (long name, short name, the negative
forms, a type, the help): at 80 columns the help is left an 18-character column, long
names are cut (`--heartbeat-time…`), and metavars read `<str>` / `<float range>`. Here an
option is one row of two columns: ``-f, --hostfile FILE`` and its help, wrapped at word
boundaries (a name too long for the first column puts its help on the next row), the
default and the environment variable at the end. Docstring paragraphs are re-flowed to
the width (a line that starts with two spaces is kept as it is: examples). Imported only
to print a help page (rich is loaded then, as typer's own help would).
"""

from __future__ import annotations

import re
from typing import Any

NAME_COLUMN = 30  # longest name shown beside its help; longer ones get a row of their own
ARGUMENTS = "Arguments"
OPTIONS = "Options"


def metavar(param: Any) -> str:
    """An option's value name: its declared metavar, else the parameter's name in capitals
    (never typer's `<str>`)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    if param.metavar:
        return str(param.metavar)
    return str(param.name or "VALUE").upper()


def argument_usage(param: Any) -> str:
    """SCRIPT, [RUN], ARGS...: how an argument shows in the usage line."""
    name = str(param.metavar or param.name or "ARG").upper()
    more = "..." if param.nargs != 1 else ""
    return f"{name}{more}" if param.required else f"[{name}]{more}"


def option_name(param: Any) -> str:
    """`-f, --hostfile FILE`, `--color / --no-color`."""
    from launcher.cli.groups import HIDDEN_NAMES

    opts = sorted((o for o in param.opts if o not in HIDDEN_NAMES),
                  key=lambda o: (o.startswith("--"), o))
    text = ", ".join(opts)
    if param.secondary_opts:
        text += " / " + ", ".join(param.secondary_opts)
    value = metavar(param)
    return f"{text} {value}" if value else text


def _default(param: Any, ctx: Any) -> str:
    if getattr(param, "is_flag", False) or param.show_default is False:
        return ""
    value = param.default
    if callable(value) or value is None or value == () or value == [] or value is False:
        return ""
    if isinstance(param.show_default, str):
        return param.show_default
    from launcher.cli.groups import DEFAULT_ARCHIVE_DIR

    if param.name == "archive_dir" and value == DEFAULT_ARCHIVE_DIR:
        # the built-in archive as it is here ($DTRAIN_STATE_DIR, $XDG_STATE_HOME), not the
        # placeholder the option declares (cli/defaults.py puts the real one in)
        from launcher.hosts.userconfig import default_archive_dir

        return str(default_archive_dir())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def param_help(param: Any, ctx: Any) -> str:
    """The help text, the default and the environment variable, in one string."""
    text = " ".join((param.help or "").split())
    extra = []
    default = _default(param, ctx)
    if default:
        extra.append(f"default: {default}")
    envvar = getattr(param, "envvar", None)
    if envvar and getattr(param, "show_envvar", False):
        extra.append(f"env: {envvar if isinstance(envvar, str) else ', '.join(envvar)}")
    if param.required and param.param_type_name == "argument":
        extra.append("required")
    if extra:
        text = f"{text} [{'; '.join(extra)}]" if text else f"[{'; '.join(extra)}]"
    return text


def reflow(doc: str) -> list[str]:
    """A docstring's paragraphs, each one line (a line starting with two spaces stays as is,
    for examples); blank strings separate paragraphs."""
    import inspect

    out: list[str] = []
    para: list[str] = []
    for line in inspect.cleandoc(doc or "").splitlines():
        if not line.strip():
            if para:
                out.append(" ".join(para))
                para = []
            if out and out[-1] != "":
                out.append("")
        elif line.startswith("  "):
            if para:
                out.append(" ".join(para))
                para = []
            out.append(line)
        else:
            para.append(line.strip())
    if para:
        out.append(" ".join(para))
    while out and out[-1] == "":
        out.pop()
    return out


def panels(params: list[Any]) -> dict[str, list[Any]]:
    """Visible parameters by panel, in declaration order (arguments first)."""
    from launcher.cli.groups import PANEL_ORDER

    found: dict[str, list[Any]] = {}
    for param in params:
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            name = ARGUMENTS
        else:
            name = getattr(param, "rich_help_panel", None) or OPTIONS
        found.setdefault(name, []).append(param)
    # the arguments, then the command's own panels (Copy, Checks...), the shared groups in
    # PANEL_ORDER, and the leftovers (--help) last
    def rank(name: str) -> int:
        if name == ARGUMENTS:
            return 0
        if name == OPTIONS:
            return 3 + len(PANEL_ORDER)
        return 2 + PANEL_ORDER.index(name) if name in PANEL_ORDER else 1

    return dict(sorted(found.items(), key=lambda kv: rank(kv[0])))


def _table(rows: list[tuple[str, str]], width: int) -> Any:
    """Name and help side by side; a name longer than NAME_COLUMN on a line of its own,
    its help under it, indented as the others' (never cut)."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    fits = [len(n) for n, _ in rows if len(n) <= NAME_COLUMN]
    name_width = max(fits, default=min(NAME_COLUMN, max((len(n) for n, _ in rows),
                                                        default=0)))
    parts: list[Any] = []
    grid: Any = None
    for name, text in rows:
        if len(name) > name_width:
            grid = None
            parts.append(Text(name, style="bold cyan"))
            parts.append(Padding(Text(text), (0, 0, 0, name_width + 2)))
            continue
        if grid is None:
            grid = Table.grid(padding=(0, 2), expand=True)
            grid.add_column(no_wrap=True, width=name_width, style="bold cyan")
            grid.add_column(ratio=1, overflow="fold")
            parts.append(grid)
        grid.add_row(name, Text(text))
    return Group(*parts)


def render(command: Any, ctx: Any) -> None:
    """Print `command`'s help page to stdout."""
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text
    from typer.rich_utils import _get_rich_console

    console = _get_rich_console()
    pieces = command.collect_usage_pieces(ctx)
    console.print(Padding(Text(f"Usage: {ctx.command_path} {' '.join(pieces)}".rstrip(),
                               style="bold"), (1, 1, 1, 1)))
    lines = reflow(command.help or "")
    if lines:
        body = Text()
        for i, line in enumerate(lines):
            if i:
                body.append("\n")
            body.append(line, style="dim" if line.startswith("  ") else "")
        console.print(Padding(body, (0, 1, 1, 1)))
    params = command.get_params(ctx)
    for title, members in panels(params).items():
        if title == ARGUMENTS:
            rows = [(argument_usage(p).strip("[]").replace("]...", "..."), param_help(p, ctx))
                    for p in members]
        else:
            rows = [(option_name(p), param_help(p, ctx)) for p in members]
        console.print(Panel(_table(rows, console.width), title=title, title_align="left",
                            border_style="dim"))
    sub = getattr(command, "list_commands", None)
    if sub is not None:
        rows = []
        for name in sub(ctx):
            cmd = command.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            rows.append((name, _first_sentence(cmd.short_help or cmd.help or "")))
        if rows:
            console.print(Panel(_table(rows, console.width), title="Commands",
                                title_align="left", border_style="dim"))


def _first_sentence(doc: str) -> str:
    lines = reflow(doc)
    return lines[0] if lines else ""


_METAVAR = re.compile(r"<(?:str|int|float|bool|path|text|integer|tuple[^>]*|list\[[a-z]+\]"
                      r"|[a-z]+ range)>")


def bad_metavars(text: str) -> list[str]:
    """typer-style `<str>`, `<list[str]>`, `<float range>` in a help page (for the tests)."""
    return _METAVAR.findall(text)
