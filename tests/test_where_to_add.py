"""docs/architecture.md's "Where to add..." table stays true (issue 54 item 5): it names the
files a newcomer touches to add a run option, a container runtime, a health check, a
run-record field; every path in it exists, and every name written after a path (a class,
a constant, a function, an option) is found in that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("a run option", "a container runtime", "a health check", "a run-record field",
        "a node event")


def table() -> dict[str, list[str]]:
    """The table's rows: what to add -> its cells' text after the first."""
    text = (ROOT / "docs/architecture.md").read_text()
    section = text.split("## Where to add...", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith(("|---", "| to add")):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def is_path(token: str) -> bool:
    return "/" in token and not token.startswith("-") and " " not in token


def problems(rows: dict[str, list[str]]) -> list[str]:
    """Each path that does not exist, each name not found in the path named before it."""
    found: list[str] = []
    for what, cells in rows.items():
        for cell in cells:
            last: Path | None = None
            for token in re.findall(r"`([^`]+)`", cell):
                if is_path(token):
                    last = ROOT / token
                    if not last.exists():
                        found.append(f"{what}: {token} does not exist")
                    continue
                if last is None or not last.is_file():
                    continue
                pattern = (re.escape(token).replace(r"\*", r"\w+") if "*" in token
                           else rf"(?<![\w-]){re.escape(token)}(?![\w-])")
                if not re.search(pattern, last.read_text()):
                    found.append(f"{what}: {token} is not in {last.relative_to(ROOT)}")
    return found


def test_the_table_has_a_row_for_each_change() -> None:
    rows = table()
    assert set(ROWS) <= set(rows), sorted(rows)
    for what in ROWS:
        assert any("`launcher/" in cell for cell in rows[what]), what
        assert "`tests/" in rows[what][-1], f"{what}: no test named"


def test_every_path_and_name_in_the_table_exists() -> None:
    assert problems(table()) == []


def test_a_stale_path_or_name_is_caught() -> None:
    stale = {"a run option": ["`launcher/commands/run/launch.py`, `launcher/cli/run.py`"
                              " (`NoSuchOption`)", "`tests/test_run_config.py`"]}
    assert problems(stale) == [
        "a run option: launcher/commands/run/launch.py does not exist",
        "a run option: NoSuchOption is not in launcher/cli/run.py"]
