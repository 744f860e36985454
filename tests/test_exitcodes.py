"""Every exit code dtrain decides is named once, in launcher/exitcodes.py (issue 35 item 2).

An AST scan of launcher/ (the node programs in nodeside/ excepted: they ship alone, stdlib
only) finds the numbers of dtrain's own codes written as numbers, and any number handed to
an exit call (``typer.Exit(0)``, ``SystemExit(2)``, ``ctx.exit(2)``); 128 counts where it
is added to or subtracted from (signal arithmetic: ``exit_for_signal``); hex (0x7F) is a
code point, not a code. docs/exit-codes.md names the same constants. A 0 or 1 a command
body returns is not found (the scan cannot tell it from any other 0 or 1).
"""

from __future__ import annotations

import ast
import re
import signal
from pathlib import Path

from launcher import exitcodes
from launcher.exitcodes import exit_for_signal

PKG = Path(__file__).resolve().parent.parent / "launcher"
DOC = PKG.parent / "docs" / "exit-codes.md"

CODES = frozenset({123, 124, 125, 126, 127, 129, 130, 137, 143, 255})
# Where such a number is not an exit code, or cannot be a name: (file, line's text).
ALLOWED = {
    ("decide/copies/copyplan.py", "NAME_MAX = 255"),  # a file name's length limit
    # the Ctrl-C guard of launcher/__init__: launcher.exitcodes may not be imported yet
    ("__init__.py", "raise SystemExit(130) from None"),
}


def _exit_call(func: ast.expr) -> bool:
    """``typer.Exit(...)``, ``SystemExit(...)``, ``sys.exit(...)``, ``ctx.exit(...)``,
    ``os._exit(...)``."""
    name = func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else ""
    return name in ("Exit", "SystemExit", "exit", "_exit")


def literal_codes(path: Path, rel: str) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value == exitcodes.SIGNAL_BASE \
                        and type(side.value) is int:
                    found.append(f"{rel}:{side.lineno}: 128 +/- N (exit_for_signal)")
        if isinstance(node, ast.Call) and _exit_call(node.func) and node.args \
                and isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int:
            arg = node.args[0]
            text = lines[arg.lineno - 1]
            if arg.value not in CODES and not any(rel == f and s in text for f, s in ALLOWED):
                found.append(f"{rel}:{arg.lineno}: exit({arg.value})")
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in CODES:
            if not (ast.get_source_segment(source, node) or "").isdigit():
                continue  # 0x7F is a code point, not an exit code
            text = lines[node.lineno - 1]
            if not any(rel == f and snippet in text for f, snippet in ALLOWED):
                found.append(f"{rel}:{node.lineno}: {node.value}")
    return found


def scan(root: Path = PKG) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("nodeside/") or rel == "exitcodes.py":
            continue
        found += literal_codes(path, rel)
    return found


def test_no_exit_code_is_written_as_a_number_outside_the_table() -> None:
    assert scan() == []


def test_the_scan_finds_a_literal_put_back(tmp_path: Path) -> None:
    """The mutants: exec's timeout code written as 124 again, a signal's 128 + N, and
    completion's usage error as ``typer.Exit(2)``."""
    src = (PKG / "commands" / "exec.py").read_text()
    assert "return EXIT_TIMEOUT\n" in src
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "exec.py").write_text(
        src.replace("return EXIT_TIMEOUT\n", "return 124\n", 1)
        .replace("exit_for_signal(outcome.interrupted)", "128 + outcome.interrupted", 1))
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "completion.py").write_text(
        (PKG / "cli" / "completion.py").read_text().replace("typer.Exit(EXIT_USAGE)",
                                                            "typer.Exit(2)", 1))
    found = scan(tmp_path)
    assert "cli/completion.py" in found[0] and found[0].endswith(": exit(2)")
    found = found[1:]
    assert len(found) == 2
    assert any(f.endswith(": 124") for f in found)
    assert any("exit_for_signal" in f for f in found)


def test_the_constants_are_the_documented_codes() -> None:
    """docs/exit-codes.md's tables name each code's constant; the numbers agree."""
    doc = DOC.read_text()
    named = dict(re.findall(r"`(EXIT_[A-Z_]+|SIGNAL_BASE)` = (\d+)", doc))
    table = {name: getattr(exitcodes, name) for name in dir(exitcodes)
             if name.startswith("EXIT_") or name == "SIGNAL_BASE"}
    assert {k: int(v) for k, v in named.items()} == table


def test_signal_codes() -> None:
    assert exit_for_signal(signal.SIGINT) == exitcodes.EXIT_INTERRUPTED
    assert exit_for_signal(signal.SIGTERM) == exitcodes.EXIT_TERMINATED
    assert exit_for_signal(signal.SIGHUP) == exitcodes.EXIT_HANGUP
    assert exit_for_signal(signal.SIGKILL) == exitcodes.EXIT_KILLED
