"""A node program in several modules is still one source on the wire (wire.PROGRAMS).

The bundle is the modules concatenated in order with their imports of each other left out,
so the rules that keep it the same program as the modules are checked here: each module
imports only the ones shipped before it, no top-level name is defined by two modules (the
later one would silently replace the earlier one on the node, not in the tests), and the
bundle is valid Python 3.8 with no import of the launcher left in it.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from launcher.nodeside import wire
from tests.util import node_program

BUNDLED = sorted(wire.PROGRAMS)


def top_level_names(source: str) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments)."""
    out: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                out |= {e.id for e in elts if isinstance(e, ast.Name)}
    return out


def twice_defined(sources: dict[str, str]) -> list[str]:
    """'NAME: a, b' for every top-level name more than one module of a bundle defines."""
    seen: dict[str, list[str]] = {}
    for mod, source in sources.items():
        for name in top_level_names(source):
            seen.setdefault(name, []).append(mod)
    return sorted(f"{n}: {', '.join(ms)}" for n, ms in seen.items() if len(ms) > 1)


def module_sources(program: str) -> dict[str, str]:
    from importlib import resources
    files = resources.files("launcher.nodeside")
    return {m: files.joinpath(f"{m}.py").read_text() for m in wire.program_modules(program)}


@pytest.mark.parametrize("program", BUNDLED)
def test_no_name_is_defined_by_two_modules_of_a_bundle(program: str) -> None:
    assert twice_defined(module_sources(program)) == []


def test_the_check_sees_a_name_defined_twice() -> None:
    assert twice_defined({"a": "X = 1\ndef f():\n    pass\n", "b": "def f():\n    pass\n"}) \
        == ["f: a, b"]


@pytest.mark.parametrize("program", BUNDLED)
def test_the_bundle_is_one_python_3_8_source_without_the_launcher(program: str) -> None:
    source = wire.program_source(program).decode()
    tree = ast.parse(source, feature_version=(3, 8))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [n for n in names if n.split(".")[0] == "launcher"]
    # every name a module took from a sibling is defined in the bundle before use
    defined = set().union(*(top_level_names(s) for s in module_sources(program).values()))
    assert top_level_names(source) == defined


@pytest.mark.parametrize("program", BUNDLED)
def test_modules_import_only_earlier_modules_of_their_bundle(program: str) -> None:
    mods = wire.program_modules(program)
    for i, (mod, source) in enumerate(module_sources(program).items()):
        for node in ast.parse(source).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher."):
                sibling = (node.module or "").rsplit(".", 1)[-1]
                assert sibling in mods[:i], f"{mod} imports {node.module}: not shipped before it"


def test_stripping_leaves_no_sibling_import_and_keeps_the_rest() -> None:
    text = (b"import os\nfrom launcher.nodeside.nodecommon import now\n"
            b"from launcher.nodeside.nodeprocs import (\n    spawn,\n    cmdline,\n)\n"
            b"X = (\n    1,\n)\n")
    assert wire.strip_sibling_imports(text) == b"import os\nX = (\n    1,\n)\n"


def test_the_bundle_defines_every_part_in_a_bare_interpreter() -> None:
    """The bundle alone (-I -S, no launcher on the path) defines every part: the file the
    rank shim is, and what the node executes."""
    res = subprocess.run([sys.executable, "-I", "-S", "-c",
                          "import sys; s = {'__name__': 'b'}; "
                          f"exec(open({str(node_program())!r}).read(), s); "
                          "print(sorted(k for k in ('Supervisor', 'shim_main', 'Evidence', "
                          "'Container', 'kernel_lines', 'spawn', 'to_json') if k in s))"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["['Container',", "'Evidence',", "'Supervisor',",
                                  "'kernel_lines',", "'shim_main',", "'spawn',", "'to_json']"]
