"""The user's environment layers have one home (issue 54 item 5): config ``[env]`` <
``.deepspeed_env`` < ``--env-file`` < ``--env`` is ordered by ``decide/runplan/netenv.user_env``
alone, every layer against every other, each value with its source; the CLI only reads the
files and passes them (a scan fails on a module that stacks what a layer's reader returns);
and the same order holds through ``dtrain run --dry-run`` with every layer on disk."""

from __future__ import annotations

import ast
import itertools
import json
import os
from pathlib import Path

import pytest

from launcher.decide.runplan.netenv import USER_LAYERS, EnvLayer, user_env
from tests.util import assert_exit, dtrain

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"config": "config c.toml:2", "deepspeed_env": "./.deepspeed_env",
           "env_file": "--env-file e.env", "env": "--env"}


def test_the_layers_are_the_four_the_docs_name_lowest_first() -> None:
    assert USER_LAYERS == ("config", "deepspeed_env", "env_file", "env")
    text = (ROOT / "docs/config.md").read_text()
    assert "`--env` > `--env-file` > `.deepspeed_env` > the config's `[env]`" in text


@pytest.mark.parametrize("present", [
    combo for n in range(1, len(USER_LAYERS) + 1)
    for combo in itertools.combinations(USER_LAYERS, n)])
def test_the_highest_layer_given_wins_with_its_source(present: tuple[str, ...]) -> None:
    """Every subset of the layers sets the same name: the highest present wins, and says
    where it came from; a name only one layer sets comes through from any layer."""
    layers = {name: EnvLayer((("SHARED", f"from-{name}"), (f"ONLY_{name.upper()}", name)),
                             source=SOURCES[name]) for name in present}
    merged = user_env(**layers)
    env, sources = dict(merged.env), dict(merged.sources)
    top = present[-1]  # combinations keep USER_LAYERS' order
    assert env["SHARED"] == f"from-{top}" and sources["SHARED"] == SOURCES[top]
    for name in present:
        assert env[f"ONLY_{name.upper()}"] == name
        assert sources[f"ONLY_{name.upper()}"] == SOURCES[name]
    assert len(merged.env) == len(env)  # one value per name


def test_within_a_layer_the_later_value_wins_and_per_name_sources_are_kept() -> None:
    merged = user_env(
        config=EnvLayer((("A", "1"), ("B", "2")),
                        sources=(("A", "config c:2"), ("B", "config c:3"))),
        env=EnvLayer((("C", "x"), ("C", "y")), source="--env"))
    assert merged.env == (("A", "1"), ("B", "2"), ("C", "y"))
    assert dict(merged.sources) == {"A": "config c:2", "B": "config c:3", "C": "--env"}


# ---------------------------------------------------------------- through the command line

def _dry_run(tmp_path: Path, *args: str, config: bool = True) -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "DS_"))}
    env["HOME"] = str(tmp_path)
    env["DTRAIN_CONFIG"] = str(tmp_path / "config.toml") if config else ""
    res = dtrain(["run", "-H", "localhost", "--dry-run", "--json", "--no-preflight",
                  "--nproc-per-node", "1", *args, "examples/ddp_smoke.py"], env=env)
    assert_exit(res, 0)
    return {v["name"]: v for v in json.loads(res.stdout)["nodes"][0]["env"]}


def test_every_layer_on_disk_in_its_place(tmp_path: Path) -> None:
    """The config's [env], ~/.deepspeed_env, --env-file and --env each set the variables
    from their own up: the dry run shows the highest one's value and source for each."""
    (tmp_path / "config.toml").write_text(
        '[env]\nL_CONFIG = "config"\nL_DEEPSPEED = "config"\nL_FILE = "config"\n'
        'L_ENV = "config"\n')
    (tmp_path / ".deepspeed_env").write_text(
        "L_DEEPSPEED=deepspeed\nL_FILE=deepspeed\nL_ENV=deepspeed\n")
    (tmp_path / "e.env").write_text("L_FILE=file\nL_ENV=file\n")
    env = _dry_run(tmp_path, "--env-file", str(tmp_path / "e.env"), "-e", "L_ENV=cli")
    shown = {k: (v["value"], json.dumps(v)) for k, v in env.items() if k.startswith("L_")}
    assert {k: v for k, (v, _) in shown.items()} == {
        "L_CONFIG": "config", "L_DEEPSPEED": "deepspeed", "L_FILE": "file", "L_ENV": "cli"}
    assert "config.toml:2" in shown["L_CONFIG"][1]
    assert "~/.deepspeed_env" in shown["L_DEEPSPEED"][1]
    assert "--env-file" in shown["L_FILE"][1] and "e.env" in shown["L_FILE"][1]
    assert "--env" in shown["L_ENV"][1] and "--env-file" not in shown["L_ENV"][1]


def test_a_secret_a_higher_layer_replaced_is_still_hidden(tmp_path: Path) -> None:
    """HF_TOKEN in the config's [env], replaced by --env: the replaced value is sent nowhere,
    and a script argument carrying it is *** like the value that won (the dry run, text and
    JSON; meta.json's args are redacted by the same values,
    commands/launch/recorder._meta_start)."""
    (tmp_path / "config.toml").write_text('[env]\nHF_TOKEN = "lower-secret-1"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "DS_"))}
    env.update(HOME=str(tmp_path), DTRAIN_CONFIG=str(tmp_path / "config.toml"))
    for form in (["--json"], ["-v"]):
        res = dtrain(["run", "-H", "localhost", "--dry-run", "--offline", *form,
                      "--nproc-per-node", "1", "-e", "HF_TOKEN=upper-secret-2",
                      "examples/ddp_smoke.py", "--a", "lower-secret-1",
                      "--b=upper-secret-2"], env=env)
        assert_exit(res, 0)
        assert "lower-secret-1" not in res.stdout + res.stderr, res.stdout
        assert "upper-secret-2" not in res.stdout + res.stderr, res.stdout
        assert "--a" in res.stdout and "***" in res.stdout


# ---------------------------------------------------------------- the scan

# what reads one of the user's layers: its result may be passed on, never stacked
READERS = {"config_env", "deepspeed_env", "load_env_file", "parse_env_args", "parse_env_text"}
HOME = "launcher/decide/runplan/netenv.py"


def _reads_a_layer(node: ast.AST | None, tainted: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in tainted
    if isinstance(node, ast.Subscript):
        return _reads_a_layer(node.value, tainted)
    if isinstance(node, ast.IfExp):
        return _reads_a_layer(node.body, tainted) or _reads_a_layer(node.orelse, tainted)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
            else ""
        if name in READERS:
            return True
        if name in ("list", "tuple", "dict") and node.args:
            return _reads_a_layer(node.args[0], tainted)
    return False


def stacked_layers(source: str) -> list[int]:
    """The lines where a layer's reader's result (or a name bound to it) is stacked onto
    another value: ``+``, ``|``, ``+=``, ``.update``/``.extend``, ``{**a, **b}``, ``[*a, *b]``."""
    lines: list[int] = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            continue
        tainted: set[str] = set()
        body = list(ast.walk(func))
        for node in body:  # names bound to a reader's result, unpacked or not
            if isinstance(node, ast.Assign) and _reads_a_layer(node.value, tainted):
                for target in node.targets:
                    tainted |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        for node in body:
            hit = False
            if isinstance(node, ast.AugAssign):
                hit = _reads_a_layer(node.target, tainted) or _reads_a_layer(node.value, tainted)
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.BitOr):
                hit = _reads_a_layer(node.left, tainted) or _reads_a_layer(node.right, tainted)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("update", "extend"):
                hit = _reads_a_layer(node.func.value, tainted) or any(
                    _reads_a_layer(a, tainted) for a in node.args)
            elif isinstance(node, ast.Dict):
                spread = [v for k, v in zip(node.keys, node.values, strict=True) if k is None]
                hit = len(node.keys) > 1 and any(_reads_a_layer(v, tainted) for v in spread)
            elif isinstance(node, ast.List | ast.Tuple | ast.Set):
                starred = [e.value for e in node.elts if isinstance(e, ast.Starred)]
                hit = len(node.elts) > 1 and any(_reads_a_layer(v, tainted) for v in starred)
            if hit:
                lines.append(getattr(node, "lineno", 0))
    return sorted(set(lines))


def test_no_module_but_netenv_stacks_the_user_s_layers() -> None:
    """"A new precedence rule goes in netenv and nowhere else" (docs/architecture.md), made
    true: outside decide/runplan/netenv.py, what a layer's reader returns is passed on whole."""
    found = []
    for path in sorted((ROOT / "launcher").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == HOME:
            continue
        found += [f"{rel}:{line}" for line in stacked_layers(path.read_text())]
    assert not found, f"the user's env layers stacked outside {HOME}: {found}"


@pytest.mark.parametrize("code", [
    "def f():\n    pairs, where = config_env()\n    pairs += deepspeed\n",
    "def f(a):\n    given = parse_env_args(a)\n    return old + given\n",
    "def f(p):\n    d = dict(load_env_file(p))\n    d.update(x)\n",
    "def f(p):\n    return {**base, **dict(load_env_file(p))}\n",
    "def f(p):\n    return [*deepspeed_env()[0], *other]\n",
])
def test_the_scan_sees_a_stacking(code: str) -> None:
    assert stacked_layers(code)


def test_the_scan_lets_a_layer_be_passed_on() -> None:
    code = ("def f(p):\n    pairs = load_env_file(p) if p else []\n"
            "    return EnvLayer(tuple(pairs), source='--env-file')\n")
    assert stacked_layers(code) == []
