"""Every warm-connection ratio the docs quote is in a file of bench/results (issue 51).

Pure file reading: the warm-connection tables of docs/benchmarks.md and docs/connections.md,
their ratio columns (a header with " / " or "against"), and the ratios written with "×" in
connections.md's "Numbers" section, each against the ratio columns of bench/results/*.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _section(doc: str, heading: str) -> str:
    """From the line ``heading`` to the next heading of the same or a higher level."""
    text = (ROOT / doc).read_text()
    level = heading.split(" ")[0]
    start = text.index(heading)
    rest = text[start + len(heading):]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.M)]
    return text[start:start + len(heading) + (ends[0] if ends else len(rest))]


def _table_ratios(text: str) -> list[str]:
    """Each number in a ratio column of every markdown table in ``text``."""
    out: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not (line.startswith("|") and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1])):
            continue
        header = [c.strip() for c in line.strip("|").split("|")]
        cols = [k for k, h in enumerate(header) if " / " in h or h.startswith("against")]
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip("|").split("|")]
            for k in cols:
                if k < len(cells):
                    # a number with "s" after it is a wall time quoted beside the ratio
                    out += [m.group() for m in NUMBER.finditer(cells[k])
                            if not cells[k][m.end():].lstrip().startswith("s")]
    return out


def _values() -> set[str]:
    """The numbers in the ratio columns (" / " in the name) of every results file's rows."""
    found: set[str] = set()
    for path in RESULTS.glob("*.json"):
        for row in json.loads(path.read_text()).get("rows", []):
            for key, cell in row.items():
                if " / " in key and key != "pdsh / pdcp":
                    found.update(NUMBER.findall(str(cell)))
    return found


def _quoted() -> dict[str, list[str]]:
    bench = _section("docs/benchmarks.md", "## Warm connections")
    numbers = _section("docs/connections.md", "## Numbers")
    prose = [m.group(1) for m in re.finditer(r"(\d+(?:\.\d+)?)×", numbers)]
    return {"docs/benchmarks.md, Warm connections' tables": _table_ratios(bench),
            "docs/connections.md, Numbers' table": _table_ratios(numbers),
            "docs/connections.md, Numbers' text": prose}


def test_the_warm_connection_sections_quote_ratios() -> None:
    quoted = _quoted()
    assert all(quoted.values()), quoted  # the parsing still finds what it checks
    assert "0.105" in quoted["docs/benchmarks.md, Warm connections' tables"]


def test_every_warm_ratio_quoted_is_in_a_results_file() -> None:
    have = _values()
    missing = {where: sorted({n for n in nums if n not in have})
               for where, nums in _quoted().items()}
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, (f"ratios quoted without a file in bench/results holding them: "
                         f"{missing} (see bench/results/README.md)")


def test_results_files_say_where_they_come_from() -> None:
    files = sorted(RESULTS.glob("*.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        for key in ("command", "commit", "date", "rows"):
            assert key in doc, f"{path.name}: no {key!r}"
        assert re.fullmatch(r"[a-z_]+-[0-9a-f]{7}-\d{4}-\d\d-\d\d(-[\w-]+)?\.json", path.name), \
            path.name
