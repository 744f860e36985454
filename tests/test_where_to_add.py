"""docs/architecture.md's "Where to add..." table stays true (issue 54 item 5): it names the
files a newcomer touches to add a run option, a container runtime, a health check, a
run-record field, a node event, an observer of a run's job (issue 54 item 2); every path
in it exists, and every name written after a path (a class, a constant, a function, an
option) is found in that file. And every module and name the
page writes as ``commands/launch.supervise`` or ``commands.launch.launch`` exists (the page
said ``commands.run.supervise`` after the function had moved)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("a run option", "a container runtime", "a health check", "a run-record field",
        "a node event", "an observer of a run's job")


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


# --------------------------------------------------------------- the page's dotted names

PACKAGES = "cli|commands|job|transports|decide|output|nodeside|hosts|text"
# names the page writes that are not there, on purpose, each with why
GONE_ON_PURPOSE = {
    "commands/reporting.py": "the Names section: what it was before issue 23",
    "output/cpview.py": "the Names section: what it was before issue 23",
    "output/runs.py": "the Names section: what it was before issue 23",
    "decide/runplan/plan.merge_env": "the Names section: 'is gone (one merge_env)'",
    "job/transports/decide": "prose: the three rooms prepare wires, not a module",
}


def dotted_names(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """(as written, its parts) for each ``pkg/module.name`` or ``pkg.module.name``."""
    found = set(re.findall(r"`([^`\s]+)`", text)) | set(
        re.findall(rf"\b((?:{PACKAGES})[./][\w./]+)", text))
    out = set()
    for token in found:
        token = token.rstrip(".,:;)")
        m = re.fullmatch(rf"(?:launcher[./])?((?:{PACKAGES})(?:[/.]\w+)*)(?:\(\))?", token)
        if m and not token.endswith(".md"):
            parts = re.split(r"[/.]", m.group(1))
            out.add((token, tuple(parts[:-1] if parts[-1] == "py" else parts)))
    return out


def _defined(name: str, source: str) -> bool:
    n = re.escape(name)
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{n}\b|^\s*{n}\s*[:=]|"
                     rf"^\s*(?:from\s+\S+\s+)?import\b[^\n]*\b{n}\b", source, re.M) is not None


def name_problems(text: str) -> list[str]:
    bad = []
    for token, parts in sorted(dotted_names(text)):
        path, i = None, 0
        while i < len(parts):
            here = ROOT.joinpath("launcher", *parts[:i + 1])
            i += 1
            if here.with_suffix(".py").exists():
                path = here.with_suffix(".py")
                break
            if not here.is_dir():  # a name in the package's __init__, or in no module
                i -= 1
                break
            path = here / "__init__.py"
        if path is None or not path.exists():
            bad.append(f"{token}: no such module")
            continue
        source = path.read_text()
        missing = next((p for p in parts[i:] if not _defined(p, source)), None)
        if missing is not None:
            bad.append(f"{token}: {missing} is not defined in {path.relative_to(ROOT)}")
    return bad


def test_every_module_and_name_the_page_writes_exists() -> None:
    text = (ROOT / "docs/architecture.md").read_text()
    bad = [b for b in name_problems(text) if b.split(":")[0] not in GONE_ON_PURPOSE]
    assert bad == []
    written = {token for token, _ in dotted_names(text)}
    assert not set(GONE_ON_PURPOSE) - written, "an allowed name no longer in the page: drop it"


def test_a_moved_function_is_caught() -> None:
    assert name_problems("`commands.run.supervise` and `commands/launch.supervise`") == [
        "commands.run.supervise: supervise is not defined in launcher/commands/run.py"]
