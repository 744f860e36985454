"""The package tree is the architecture: imports go one way, top layer to bottom.

Layers, top to bottom (docs/architecture.md "Where does my change go"):

    cli → commands → job → transports → decide → output → nodeside → hosts → text → base

A module may import its own layer or any layer below it, never one above. Lazy imports inside
functions count too: they are still a dependency. The node programs (``nodeside/supervisor``
and ``nodeside/probe``) run on nodes with nothing but a Python >= 3.8 standard library, so they
import nothing else at all. No modules import each other in a loop, lazy imports included.
asyncssh is imported under ``transports/ssh/`` only. decide/ and transports/ never import
output/ (their text helpers are in text/).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from launcher.nodeside.wire import PROGRAMS, program_modules

PKG = Path(__file__).resolve().parent.parent / "launcher"

LAYERS = ("cli", "commands", "job", "transports", "decide", "output", "nodeside", "hosts",
          "text", "base")
# every module shipped to the nodes: each program's modules (wire.PROGRAMS bundles the
# supervisor's), plus the one-file programs
NODE_PROGRAMS = tuple(dict.fromkeys(
    f"launcher.nodeside.{m}"
    for name in ("supervisor", "probe", "cpnode", "sampler", "health", "pushdir")
    for m in program_modules(name)))


def bundle_siblings(module: str) -> set[str]:
    """The modules ``module`` may import besides the standard library: the ones shipped
    before it in a bundle it belongs to (they are one namespace on the node)."""
    short = module.rsplit(".", 1)[-1]
    out: set[str] = set()
    for mods in PROGRAMS.values():
        if short in mods:
            out |= {f"launcher.nodeside.{m}" for m in mods[:mods.index(short)]}
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    """``launcher.job.node`` → ``job``; top-level modules (errors, models) are ``base``;
    ``launcher.__main__`` and ``launcher.start`` are the CLI's entry points."""
    parts = module.split(".")
    if module in ("launcher.__main__", "launcher.start"):
        return "cli"
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1]
    return "base"


def imports(path: Path, *, top_level_only: bool = False) -> list[tuple[str, int]]:
    """Every module this file imports (absolute names), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: list[tuple[str, int]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative imports: resolve against this module's package
                base = module_name(path).split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, node.lineno))
            # `from launcher.cli import exec` imports the submodule launcher.cli.exec
            out += [(f"{mod}.{a.name}", node.lineno) for a in node.names
                    if (PKG.parent / f"{mod}.{a.name}".replace(".", "/")).exists()
                    or (PKG.parent / (f"{mod}.{a.name}".replace(".", "/") + ".py")).exists()]
    return out


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layering_violations(mods: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in mods.items():
        mine = LAYERS.index(layer_of(name))
        for target, line in imports(path):
            if not target.startswith("launcher.") or target not in mods:
                continue
            theirs = LAYERS.index(layer_of(target))
            if theirs < mine:
                bad.append(f"{name}:{line}: {layer_of(name)} imports "
                           f"{target} ({layer_of(target)}, a higher layer)")
    return bad


def test_imports_go_down_the_layers() -> None:
    assert layering_violations(modules()) == []


# Below the order, pairs of layers that may not meet (issue 35 item 5): the pure decisions and
# the transports take their text helpers (count, rank_ranges, redact, termsafe) from text/,
# never from output/, which is the edges (console, archive, reports).
APART = {("decide", "output"), ("transports", "output")}


def apart_violations(mods: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in mods.items():
        for target, line in imports(path):
            if target in mods and (layer_of(name), layer_of(target)) in APART:
                bad.append(f"{name}:{line}: {layer_of(name)} imports {target} "
                           f"({layer_of(target)}: its text helpers are in launcher.text)")
    return bad


def test_decide_and_transports_do_not_import_output() -> None:
    assert apart_violations(modules()) == []


def test_the_apart_check_catches_a_lazy_import(tmp_path: Path) -> None:
    mods = modules()
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def f():\n    from launcher.output.render import note\n    return note\n")
    mods["launcher.transports.rogue"] = rogue
    assert [v for v in apart_violations(mods) if v.startswith("launcher.transports.rogue:")] == [
        "launcher.transports.rogue:2: transports imports launcher.output.render "
        "(output: its text helpers are in launcher.text)"]


def test_the_layering_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The check itself works: a decide module that imports the CLI is reported."""
    mods = modules()
    rogue = tmp_path / "rogue.py"
    rogue.write_text("from launcher.cli import common\n")
    mods["launcher.decide.rogue"] = rogue
    found = [v for v in layering_violations(mods) if v.startswith("launcher.decide.rogue:")]
    assert "launcher.decide.rogue:1: decide imports launcher.cli.common (cli, a higher layer)" \
        in found


@pytest.mark.parametrize("program", NODE_PROGRAMS)
def test_node_programs_import_only_the_standard_library(program: str) -> None:
    path = modules()[program]
    allowed = bundle_siblings(program)
    foreign = sorted({mod for mod, _ in imports(path)
                      if mod.split(".")[0] not in sys.stdlib_module_names
                      and mod != "__future__" and mod not in allowed})
    assert foreign == [], (f"{program} imports {foreign}: node programs are stdlib only "
                           "(and a bundle's module may import the modules shipped before it)")


FENCED = {"asyncssh": "launcher.transports.ssh"}  # a foreign library: the package it is fenced in


def fence_violations(mods: dict[str, Path]) -> list[str]:
    """Every import (lazy ones too) of a fenced library from outside its package."""
    bad = []
    for name, path in mods.items():
        for target, line in imports(path):
            lib = target.split(".")[0]
            home = FENCED.get(lib)
            if home is not None and name != home and not name.startswith(home + "."):
                bad.append(f"{name}:{line}: imports {target} (only {home} may)")
    return bad


def test_asyncssh_is_imported_only_under_transports_ssh() -> None:
    """httpx's habit: the foreign library behind one package and one error map, so a
    change of SSH library, or of its exceptions, is a change in one place."""
    assert fence_violations(modules()) == []


def test_the_fence_check_catches_a_lazy_import(tmp_path: Path) -> None:
    mods = modules()
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def f():\n    from asyncssh import SSHKey\n    return SSHKey\n")
    mods["launcher.commands.rogue"] = rogue
    assert fence_violations(mods) == [
        "launcher.commands.rogue:2: imports asyncssh (only launcher.transports.ssh may)"]


def import_circles(mods: dict[str, Path]) -> list[list[str]]:
    """Every set of modules that import each other in a loop (strongly connected
    components of the import graph), reading every import: lazy ones inside functions and
    ``if TYPE_CHECKING:`` ones too, so a circle closed through a deferred import counts."""
    graph = {name: sorted({t for t, _ in imports(path) if t in mods and t != name
                           # a package's __init__ importing its own submodules is how
                           # packages work, not a circle
                           and not t.startswith(name + ".")})
             for name, path in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(circles)


def test_no_import_cycles() -> None:
    assert import_circles(modules()) == []


def test_the_cycle_check_reads_lazy_imports(tmp_path: Path) -> None:
    """The circle output/console → fold → render → console was closed by an import inside
    a function; the check must see such a circle."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import launcher.output.rogue_b\n")
    b.write_text("def f():\n    from launcher.output.rogue_a import x\n    return x\n")
    mods = {**modules(), "launcher.output.rogue_a": a, "launcher.output.rogue_b": b}
    assert ["launcher.output.rogue_a", "launcher.output.rogue_b"] in import_circles(mods)


def test_node_programs_run_on_python_3_8() -> None:
    """No 3.8 interpreter is installed here, so vermin checks the syntax and library use.

    vermin is in the `test` extra: a missing vermin fails this test rather than skipping it.
    """
    import subprocess

    paths = [str(modules()[p]) for p in NODE_PROGRAMS]
    res = subprocess.run([sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())",
                          "--target=3.8-", "--violations",
                          "--no-tips", *paths],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


# decide/'s groups (issue 54 item 6): each module's imports of another group, with the reason;
# a new one fails here until it is listed, so that the folders keep showing the architecture
DECIDE_GROUPS = ("runplan", "outcome", "fabric", "copies")
DECIDE_CROSSING = {
    ("runplan.netenv", "fabric.rdma"): "the plan's NCCL variables take rdma's HCA and GID choice",
    ("runplan.plan", "fabric.nccl_account"): "whether the plan asks NCCL for its own account",
    ("runplan.plan", "outcome.flight"): "the plan names the flight recorder's dump files",
    ("runplan.runoptions", "outcome.hang"): "the run options hold the hang policy",
    ("runplan.runoptions", "outcome.restarts"): "the run options hold the restart policy",
    ("runplan.runoptions", "outcome.stragglers"): "the run options hold the straggler settings",
    ("outcome.restarts", "runplan.placement"): "a fenced node's spare is picked by placement",
    ("outcome.verdict", "runplan.plan"): "the verdict reads the run's LaunchPlan",
    ("fabric.checks", "runplan.facts"): "the doctor's checks read the nodes' facts",
    ("fabric.checks", "outcome.startup"): "a node's clock offset, as the start-up split reads it",
    ("fabric.fabric_checks", "runplan.facts"): "the fabric checks read the nodes' facts",
    ("fabric.checks", "runplan.container"): "the doctor says which nodes lack the image",
    ("fabric.checks", "runplan.netenv"): "the doctor checks the interface the plan would pick",
    ("fabric.fabric_checks", "runplan.netenv"): "the fabric checks use the plan's interface",
    ("fabric.linerate", "runplan.facts"): "the line rate from the probe's NIC facts",
    ("fabric.rdma", "runplan.facts"): "the HCA choice reads the nodes' facts",
    ("fabric.smoke", "runplan.facts"): "the smoke verdict reads the nodes' facts",
}


def decide_crossings() -> dict[tuple[str, str], int]:
    """(group.module, group.module) -> line, for each import of another decide/ group."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted((PKG / "decide").glob("*/*.py")):
        group, mod = path.parent.name, path.stem
        for name, line in imports(path):
            parts = name.split(".")
            if parts[:2] != ["launcher", "decide"] or len(parts) < 4 or parts[2] == group:
                continue
            found.setdefault((f"{group}.{mod}", f"{parts[2]}.{parts[3]}"), line)
    return found


def test_decide_is_grouped_and_its_groups_cross_only_where_listed() -> None:
    loose = sorted(p.name for p in (PKG / "decide").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"decide/ modules outside its groups {DECIDE_GROUPS}: {loose}"
    groups = sorted(p.name for p in (PKG / "decide").iterdir()
                    if p.is_dir() and p.name != "__pycache__")
    assert groups == sorted(DECIDE_GROUPS)
    found = decide_crossings()
    unlisted = sorted(f"{a} imports {b} (line {n})" for (a, b), n in found.items()
                      if (a, b) not in DECIDE_CROSSING)
    assert unlisted == [], "a decide/ group imports another: list it in DECIDE_CROSSING " \
        "with its reason, or move the code: " + "; ".join(unlisted)
    stale = sorted(f"{a} -> {b}" for a, b in DECIDE_CROSSING if (a, b) not in found)
    assert stale == [], "DECIDE_CROSSING entries no import needs any more: " + "; ".join(stale)
    assert not any(b.startswith("copies.") or a.startswith("copies.")
                   for a, b in DECIDE_CROSSING), "copies/ stands alone"
