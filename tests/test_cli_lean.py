"""The CLI's fixed cost stays small: pydantic-free coercion that agrees with typer's, and
the import set of the hot commands pinned (issue 26; docs/benchmarks.md "Fixed costs").

As tests/test_supervisor_lean.py pins what the node program imports, these pin what the
launcher imports for the commands a pdsh user runs all day: a module that sneaks into them
(asyncssh for localhost, pydantic, the JSON/JUnit report code, yaml for -H) costs every
user tens of milliseconds on every call. Time itself is never asserted (bench/
bench_startup.py measures it); the import set is what the time is made of.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer._coercion import build_runtime_param

from launcher.cli import app, coerce

REPO = Path(__file__).resolve().parents[1]

VALUES: dict[type, list[Any]] = {
    str: ["", "x", "node[1-4]", "-", "é", "a b", 5, None],
    int: ["0", "1", "64", "007", "-3", "-0", "+5", " 5", "5_0", "x", "1.5", "1.0", "1e3", "",
          "١", "9" * 30, 7, 0, -1, True, 2.0, None],
    float: ["0", "0.1", "0.05", "2", "-1", "-0.5", "1e3", "inf", "nan", ".5", "5.", "x", "",
            " 2", "1_0", 2, 2.5, 0, True, None],
    bool: [True, False, None, "yes", ""],
}
LISTS: list[Any] = [("a", "b"), [], ("x",), ("--", "-v"), "abc", None, (1, 2)]


def _commands(cmd: Any, path: str = "dtrain") -> list[tuple[str, Any]]:
    out = [(path, cmd)]
    for name, sub in getattr(cmd, "commands", {}).items():
        out += _commands(sub, f"{path} {name}")
    return out


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        value = fn()
    except Exception as exc:  # the error typer shows is the message of a click exception
        return ("error", (type(exc).__name__, exc.format_message()
                          if hasattr(exc, "format_message") else str(exc)))
    return ("ok", (type(value).__name__, value if value == value else "nan"))


def _plain_params() -> list[tuple[str, Any, Any]]:
    root = typer.main.get_command(app)
    found = []
    for path, cmd in _commands(root):
        ctx = typer._click.Context(cmd, info_name=path)
        for param in cmd.get_params(ctx):
            if coerce._plain(param) is not None:
                found.append((f"{path} {param.name}", param, ctx))
    return found


PLAIN = _plain_params()


def test_the_commands_options_are_plain_ones() -> None:
    """Most of dtrain's options take the cheap path; a new Path/Enum option would just be
    coerced by typer, but a CLI where none is plain means coerce.py stopped matching."""
    names = {name for name, _, _ in PLAIN}
    assert {"dtrain exec fanout", "dtrain exec command", "dtrain exec hosts",
            "dtrain run nproc_per_node", "dtrain cp fanout"} <= names, sorted(names)


@pytest.mark.parametrize("name,param,ctx", PLAIN, ids=[n for n, _, _ in PLAIN])
def test_cheap_coercion_agrees_with_typers(name: str, param: Any, ctx: Any) -> None:
    leaf, is_list = coerce._plain(param)  # type: ignore[misc]
    values = LISTS if is_list else VALUES[leaf]
    for value in values:
        if leaf is bool and isinstance(value, bool):
            continue  # typer never coerces a flag's own bool
        theirs = _outcome(lambda v=value: build_runtime_param(param.type_descriptor).coerce(
            v, param=param, ctx=ctx))
        mine = _outcome(lambda v=value: coerce.CheapParam(param, leaf, is_list).coerce(
            v, param=param, ctx=ctx))
        assert mine == theirs, (name, value)


def test_install_covers_every_plain_parameter_and_only_those() -> None:
    root = typer.main.get_command(app)
    cmd = root.commands["exec"]  # type: ignore[attr-defined]
    ctx = typer._click.Context(cmd, info_name="exec")
    params = cmd.get_params(ctx)
    for p in params:
        if hasattr(p, "_runtime_param"):
            p._runtime_param = None
    coerce.install(params)
    for p in params:
        if not hasattr(p, "_runtime_param"):
            continue
        cheap = isinstance(p._runtime_param, coerce.CheapParam)
        assert cheap == (coerce._plain(p) is not None), p.name


# ---------------------------------------------------------------- one command built, not all

NAMES = sorted({c.name for c in app.registered_commands} | {g.name for g in app.registered_groups})


@pytest.mark.parametrize("name", NAMES)
def test_the_one_command_app_says_what_the_whole_app_says(name: str) -> None:
    """main() builds only the command named first (cli.only): its help, its usage errors
    and a run of it are what the whole app gives."""
    from typer.testing import CliRunner

    from launcher.cli import only

    runner = CliRunner()
    cases = [[name, "--help"], [name, "--no-such-option"], [name]]
    if name == "keys":
        cases += [["keys", "check", "--help"], ["keys", "nope"]]
    if name == "completion":
        cases += [["completion", "bash"]]
    for args in cases:
        whole = runner.invoke(app, args, prog_name="dtrain", env={"COLUMNS": "100"})
        lean = runner.invoke(only(name), args, prog_name="dtrain", env={"COLUMNS": "100"})
        assert (lean.exit_code, lean.output) == (whole.exit_code, whole.output), args
    assert len(typer.main.get_command(only(name)).commands) == 1  # type: ignore[attr-defined]


# ---------------------------------------------------------------- what the hot commands import

REPORTS = {"launcher.output.report", "launcher.output.junit", "launcher.output.schemas", "xml"}
ALWAYS_OUT = {"pydantic", "pydantic_core", "yaml", "jsonschema", *REPORTS}
RUN_ONLY = {"launcher.decide.runplan.netenv", "launcher.decide.runplan.plan",  # run's
            "launcher.decide.fabric.checks", "launcher.decide.runplan.facts",  # decisions
            "launcher.decide.fabric.rdma"}
HOT: dict[str, tuple[list[str], set[str]]] = {
    # the help renders with rich (typer's help), and reaches nothing
    "help": (["--help"], ALWAYS_OUT | {"asyncssh", "launcher.commands", "launcher.job",
                                       "launcher.transports", "ClusterShell",
                                       "rich.markdown", "markdown_it", "rich.traceback"}),
    # localhost: subprocesses, no SSH library at all, no help renderer
    "exec-localhost": (["exec", "-H", "localhost", "--", "true"],
                       ALWAYS_OUT | RUN_ONLY | {"asyncssh", "rich"}),
    # one SSH host (refused at once: nothing listens on 127.0.0.1:1)
    "exec-ssh": (["exec", "-H", "127.0.0.1:1", "--connect-timeout", "2", "--", "true"],
                 ALWAYS_OUT | RUN_ONLY | {"rich"}),
    "cp-localhost": (["cp", "-H", "localhost", "README.md", "{tmp}/copied"],
                     ALWAYS_OUT | RUN_ONLY | {"asyncssh", "rich"}),
    # run's own decisions are its business; a report, YAML (no --profile), SSH are not
    "run-dry-run-localhost": (["run", "-H", "localhost", "--nproc-per-node", "2", "--dry-run",
                               "examples/ddp_smoke.py"],
                              ALWAYS_OUT | {"asyncssh", "rich"}),
}


def _imports(args: list[str], tmp: Path, **env: str) -> tuple[int, set[str]]:
    """What `python -m launcher ARGS` imports (python -X importtime), and its exit code."""
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "GITHUB_"))}
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", *args],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**base, "HOME": str(tmp), **env})
    names = {line.split("|")[-1].strip() for line in res.stderr.splitlines()
             if line.startswith("import time:") and "imported package" not in line}
    return res.returncode, names


def _forbidden(names: set[str], out: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == o or n.startswith(o + ".") for o in out))


@pytest.mark.parametrize("case", sorted(HOT))
def test_a_hot_command_imports_only_what_it_needs(case: str, tmp_path: Path) -> None:
    args, out = HOT[case]
    code, names = _imports([a.replace("{tmp}", str(tmp_path)) for a in args], tmp_path)
    assert code in (0, 255), (case, code)  # exec-ssh: the host refuses (255)
    assert "launcher.cli" in names and "typer" in names  # the measurement itself works
    assert not _forbidden(names, out), f"`dtrain {' '.join(args)}` imports " \
        f"{_forbidden(names, out)}: see docs/benchmarks.md (fixed costs)"


def test_the_report_code_loads_when_a_report_is_asked_for(tmp_path: Path) -> None:
    """The lean path is a choice, not an accident: --json/--junit and GitHub Actions'
    annotations still get the report (its code imported then)."""
    base = ["exec", "-H", "localhost"]
    _, plain = _imports([*base, "--", "true"], tmp_path)
    _, as_json = _imports([*base, "--json", "--", "true"], tmp_path)
    _, junit = _imports([*base, "--junit", str(tmp_path / "j.xml"), "--", "true"], tmp_path)
    _, github = _imports([*base, "--", "true"], tmp_path, GITHUB_ACTIONS="true")
    assert "launcher.output.report" not in plain
    assert {"launcher.output.report"} <= as_json & github
    assert {"launcher.output.junit", "launcher.output.report"} <= junit
    assert (tmp_path / "j.xml").is_file()


def test_the_ssh_package_names_every_module_it_serves() -> None:
    """transports/ssh/__init__ is lazy: each exported name maps to the module defining it."""
    import importlib

    from launcher.transports import ssh

    assert sorted(ssh.__all__) == sorted(ssh._WHERE)
    for name, module in ssh._WHERE.items():
        mod = importlib.import_module(f"launcher.transports.ssh.{module}")
        assert getattr(ssh, name) is getattr(mod, name), name


@pytest.mark.parametrize("args", [["--help"], ["exec", "--help"], ["run", "--help"],
                                  ["keys", "check", "--help"], ["exec", "--fanout", "x"]])
def test_help_without_markdown_says_what_typer_says(args: list[str]) -> None:
    """_quiet_import defers rich.markdown/rich.traceback while typer.rich_utils loads; the
    help (and a usage error's panel) is byte for byte what typer prints with them loaded."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "100"}

    def show(pre: str) -> subprocess.CompletedProcess[str]:
        code = f"{pre}import runpy; runpy.run_module('launcher', run_name='__main__', " \
               "alter_sys=True)"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, cwd=REPO, env=env, timeout=60)

    lean, real = show(""), show("import typer.rich_utils; ")
    assert (lean.returncode, lean.stdout, lean.stderr) == \
        (real.returncode, real.stdout, real.stderr)
    assert "Usage" in lean.stdout + lean.stderr


def test_the_deferred_modules_are_real_once_asked_for() -> None:
    """After typer.rich_utils, `import rich.markdown` is the real module, and typer's own
    names work (a Markdown renders, Traceback.from_exception exists)."""
    import subprocess
    import sys

    code = ("import launcher, typer.rich_utils as ru, sys\n"
            "assert 'rich.markdown' not in sys.modules, 'still deferred'\n"
            "import rich.markdown\n"
            "assert rich.markdown.Markdown.__module__ == 'rich.markdown'\n"
            "m = ru.Markdown('**x**')\n"
            "assert isinstance(m, rich.markdown.Markdown) and isinstance(m, ru.Markdown)\n"
            "assert callable(ru.Traceback.from_exception)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
