"""Every ratio the docs quote is in a file of bench/results, or says it is not (issue 51).

Pure file reading. Two checks:

* the warm-connection tables of docs/benchmarks.md and docs/connections.md, their ratio
  columns (a header with " / " or "against"), and the ratios written with "×" in
  connections.md's "Numbers" section, each against the ratio columns of bench/results/*.json;
* every section of README.md, docs/benchmarks.md, docs/scaling.md and docs/cp.md that
  compares dtrain with something (a ratio "0.4×" / "1.3x", or a table with a ratio column)
  either names a results file written by a run (not a transcription) that holds each of
  its ratios, or says, in it or in a section above it, "not reproduced from a kept results
  file (measured at `<commit>` ... before raw results were kept)": the rule of
  docs/benchmarks.md, "Where the numbers come from".
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


# ---------------------------------------------------------------- every comparison

COVERED = ("README.md", "docs/benchmarks.md", "docs/scaling.md", "docs/cp.md")
MARKER = re.compile(r"not reproduced from a kept results file \(measured at `[0-9a-f]{7}`"
                    r"[^()]*before raw results were kept\)", re.I)
NAMED = re.compile(r"bench/results/([\w.-]+\.json)")
# a ratio: a number with × or x right after it ("0.52×", "1.33x"; not "16 × 256", "4x2")
RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:×|x\b)")
GOAL = re.compile(r"(≤|<=|≥|>=|goal|target|~)\s*$")  # "≤ 0.5×" is a goal, not a measurement
HEADING = re.compile(r"^(#{1,6}) ", re.M)


def _ratio_column(header: str) -> bool:
    """"dtrain / tool", "dtrain/pdcp", "/ 1 node", "ratio", "against ...", "x ssh loop";
    not a unit ("lines/s")."""
    return bool(re.search(r"/(?!s\b)|\bratio\b|^against|\bvs\b|[x×] ssh loop", header))


def _ratios(text: str) -> list[str]:
    """The measured ratios of ``text``: "N×" / "Nx" outside code and goals, and every
    number in a table's ratio column (one with "/", "ratio", "against" or "vs" in its name)."""
    out: list[str] = []
    lines = text.splitlines()
    code = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            code = not code
        if code or line.startswith("```"):
            continue
        if line.startswith("|"):
            if i + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip()):
                header = [c.strip() for c in line.strip().strip("|").split("|")]
                cols = {k for k, h in enumerate(header) if _ratio_column(h)}
                for row in lines[i + 2:]:
                    if not row.startswith("|"):
                        break
                    cells = [c.strip() for c in row.strip().strip("|").split("|")]
                    for k, cell in enumerate(cells):
                        if k in cols:
                            out += [m.group() for m in NUMBER.finditer(cell)
                                    if not GOAL.search(cell[:m.start()])
                                    and not cell[m.end():].lstrip().startswith("s")]
                continue  # the header: names, not measurements ("200×80" screen)
            if re.fullmatch(r"\|[-:| ]+\|", line.strip()):
                continue
        line = re.sub(r"`[^`]*`", "", line)  # code and examples ("`0.4×`"), not measurements
        out += [m.group(1) for m in RATIO.finditer(line) if not GOAL.search(line[:m.start()])]
    return out


def _sections(doc: str) -> list[tuple[str, str, list[str]]]:
    """Each section of ``doc`` (heading to the next heading of any level) as (heading, its
    own text, the own texts of the sections above it)."""
    text = (ROOT / doc).read_text()
    starts = [0, *[m.start() for m in HEADING.finditer(text)]]
    out: list[tuple[str, str, list[str]]] = []
    above: list[tuple[int, str]] = []  # (level, own text) of the open headings
    for i, start in enumerate(starts):
        own = text[start:starts[i + 1] if i + 1 < len(starts) else len(text)]
        level = len(own) - len(own.lstrip("#")) if own.startswith("#") else 0
        above = [(lv, t) for lv, t in above if lv < level]
        out.append((own.splitlines()[0] if own else "", own, [t for _, t in above]))
        above.append((level, own))
    return out


def _file_ratios(name: str) -> set[str] | None:
    """The numbers in the ratio columns of a results file's rows; None for a file that does
    not exist or was transcribed from a doc rather than written by a run."""
    path = RESULTS / name
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if "transcribed_from" in doc or doc.get("raw_output_kept") is False:
        return None
    return {n for row in doc.get("rows", []) for key, cell in row.items() if " / " in key
            for n in NUMBER.findall(str(cell))}


def _unbacked(doc: str) -> list[str]:
    """Each comparison of ``doc`` that neither a named results file holds nor the marker
    excuses: "doc, heading: what is wrong"."""
    wrong: list[str] = []
    for heading, own, above in _sections(doc):
        ratios = _ratios(own)
        if not ratios or any(MARKER.search(t) for t in (own, *above)):
            continue
        names = NAMED.findall(own)
        have: set[str] = set()
        for name in names:
            got = _file_ratios(name)
            if got is None:
                wrong.append(f"{doc}, {heading}: bench/results/{name} is missing or a "
                             f"transcription, not a run's output")
            else:
                have |= got
        missing = sorted({r for r in ratios if r not in have})
        if missing:
            wrong.append(f"{doc}, {heading}: ratios {missing} are in no results file it names "
                         f"({names or 'none'}) and it does not say they are not reproduced")
    return wrong


def test_the_comparisons_are_found() -> None:
    """The parsing still sees the comparisons it checks (so the check below cannot pass by
    finding nothing)."""
    found = {doc: [h for h, own, _ in _sections(doc) if _ratios(own)] for doc in COVERED}
    assert any("32 and 128 nodes" in h for h in found["docs/scaling.md"]), found
    assert any(h.startswith("## Benchmark") for h in found["docs/cp.md"]), found
    assert len(found["docs/benchmarks.md"]) >= 25, found
    scale = next(own for h, own, _ in _sections("docs/scaling.md") if "32 and 128" in h)
    assert "0.70" in _ratios(scale)  # the 32-node exec ratio, from a table's "0.70×" cell
    assert MARKER.search(scale)


def test_every_comparison_is_in_a_results_file_or_marked() -> None:
    wrong = [w for doc in COVERED for w in _unbacked(doc)]
    assert not wrong, "\n".join(["comparisons without a results file or the marker "
                                  "(docs/benchmarks.md, 'Where the numbers come from'):",
                                  *wrong])
