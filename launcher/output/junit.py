"""--junit PATH: a CommandReport as JUnit XML, the dialect GitLab, Jenkins and GitHub test
reporters read (the Ant/Jenkins junit schema; tests/data/junit.xsd).

One ``testsuite`` per command; one ``testcase`` per node, and per rank for run and smoke,
named ``<host>`` and ``<host> rank <N>`` with classname ``dtrain.<command>``; a failure
carries the exit code, the root cause and the last stderr lines of that rank. Checks that
belong to no node (smoke's cluster-wide ones) are testcases of their own.

Every text and attribute is XML 1.0 safe: a failing rank's stderr tail is exactly where a
colour, a NUL, a ``\\x0b`` or a U+FFFE turns up, and one such character makes the whole
document unreadable to the CI server, which then drops the report of the failing job. Escape
sequences (CSI, OSC, two-byte ESC) are stripped; any other character outside XML 1.0's
``Char`` becomes U+FFFD. Times are never negative.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher.output.report import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    CommandReport,
    NodeResult,
    RankResult,
)

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \\), and other two-character escapes
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """``text`` as XML 1.0 may hold it: escape sequences dropped, other illegal characters
    (NUL, C0 controls, lone surrogates, U+FFFE/U+FFFF) as U+FFFD."""
    if "\x1b" in text:
        text = _ESCAPES.sub("", text)
    return _NOT_XML.sub("\ufffd", text)


def _xml_safe(root: ET.Element) -> None:
    for el in root.iter():
        if el.text:
            el.text = xml_text(el.text)
        if el.tail:
            el.tail = xml_text(el.tail)
        for key, value in el.attrib.items():
            el.attrib[key] = xml_text(value)


@dataclass(frozen=True)
class ExtraCase:
    """A testcase that is not a node or a rank (a smoke check)."""

    name: str
    status: str
    message: str | None = None
    text: str = ""
    duration: float = 0.0  # the testcase's time (s)


def _failure_text(exit_code: int | None, message: str | None, root: str | None,
                  tail: Sequence[str]) -> str:
    lines = [f"exit code: {exit_code}"] if exit_code is not None else []
    if message:
        lines.append(message)
    if root and root != message:
        lines.append(f"root cause: {root}")
    if tail:
        lines.append("last stderr lines:")
        lines += [f"  {t}" for t in tail]
    return "\n".join(lines)


def _case(suite: ET.Element, classname: str, name: str, status: str, time: float | None,
          message: str | None, text: str) -> None:
    case = ET.SubElement(suite, "testcase", name=name, classname=classname,
                         time=f"{max(0.0, time or 0.0):.3f}")
    if status == FAILED:
        ET.SubElement(case, "failure", message=message or "failed", type="failure").text = text
    elif status == ERROR:
        ET.SubElement(case, "error", message=message or "error", type="error").text = text
    elif status == SKIPPED:
        ET.SubElement(case, "skipped", message=message or "skipped").text = text or None


def to_junit(report: CommandReport, extra_cases: Sequence[ExtraCase] = (), *,
             node_cases: bool = True) -> str:
    """The XML document; ``node_cases=False`` leaves out the per-node (and per-rank) cases
    when ``extra_cases`` already cover every node (doctor: one case per node and check)."""
    root_msg = report.summary if report.exit_code else None
    classname = f"dtrain.{report.command.replace('-', '_')}"
    suites = ET.Element("testsuites", name=f"dtrain {report.command}")
    suite = ET.SubElement(
        suites, "testsuite", name=f"dtrain {report.command}",
        timestamp=datetime.fromtimestamp(report.started, UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        hostname=socket.gethostname() or "localhost", time=f"{max(0.0, report.duration):.3f}")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="exit_code", value=str(report.exit_code))
    ET.SubElement(props, "property", name="summary", value=report.summary)
    if report.archive:
        ET.SubElement(props, "property", name="archive", value=report.archive)
    restarts = report.extra.get("restarts") if isinstance(report.extra, Mapping) else None
    if isinstance(restarts, int) and report.command == "run":
        ET.SubElement(props, "property", name="restarts", value=str(restarts))
    for prop, shown in goodput_properties(report):
        ET.SubElement(props, "property", name=prop, value=shown)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}

    def count(status: str) -> None:
        counts["tests"] += 1
        key = {FAILED: "failures", ERROR: "errors", SKIPPED: "skipped"}.get(status)
        if key:
            counts[key] += 1

    for node in report.nodes if node_cases else ():
        _node_cases(suite, classname, node, root_msg, count)
    for extra in [*attempt_cases(report), *extra_cases]:
        _case(suite, classname, extra.name, extra.status, extra.duration, extra.message,
              extra.text)
        count(extra.status)
    for key, value in counts.items():
        suite.set(key, str(value))
        suites.set(key, str(value))
    suites.set("time", f"{max(0.0, report.duration):.3f}")
    _xml_safe(suites)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def goodput_properties(report: CommandReport) -> list[tuple[str, str]]:
    """`run`: the goodput ledger (docs/goodput.md) as ``goodput`` (a fraction, or "not
    measured") and ``goodput.<cause>_s`` per cause."""
    g = report.extra.get("goodput") if isinstance(report.extra, Mapping) else None
    if not isinstance(g, Mapping):
        return []
    value = _number(g.get("goodput"))
    out = [("goodput", "not measured" if value is None else f"{value:.4f}")]
    seconds = g.get("seconds")
    for cause, secs in (seconds.items() if isinstance(seconds, Mapping) else ()):
        v = _number(secs)
        out.append((f"goodput.{cause}_s", "not measured" if v is None else f"{v:.3f}"))
    return out


def attempt_cases(report: CommandReport) -> list[ExtraCase]:
    """`run --restarts`: one case per attempt (``attempt N``), failed with its cause, why,
    the nodes it fenced and its timings (skipped, ``attempt N failed: ...; relaunched``,
    when the run went on: a recovered run is no failure); the node and rank cases are the
    last attempt's."""
    attempts = report.extra.get("attempts") if isinstance(report.extra, Mapping) else None
    out = []
    for a in attempts if isinstance(attempts, list) else []:
        if not isinstance(a, Mapping):
            continue
        code, cause = a.get("exit_code"), a.get("cause")
        fenced = ", ".join(str(f.get("host")) if isinstance(f, Mapping) else str(f)
                           for f in a.get("fenced") or ())
        start = _number(a.get("start"))
        took, duration = "", 0.0
        if start is not None and _number(a.get("end")) is not None:
            duration = max(0.0, a["end"] - start)
            took = f" after {duration:.1f} s"
        message = None if code == 0 else \
            f"{cause}: {a.get('why') or a.get('outcome')} (exit {code}){took}"
        text = "\n".join(filter(None, [
            f"hosts: {', '.join(str(h) for h in a.get('hosts') or ())}",
            f"fenced: {fenced}" if fenced else "", _timings(a), a.get("decision") or ""]))
        status = PASSED if code == 0 else FAILED
        if code != 0 and a.get("relaunch"):
            # retried: not the run's verdict (a run that recovered is no failure to CI);
            # skipped, with what happened: attempt 1 failed: ... ; relaunched
            status, message = SKIPPED, f"attempt {a.get('n')} failed: {message}; relaunched"
        out.append(ExtraCase(f"attempt {a.get('n')}", status, message, text, duration))
    return out


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and \
        not isinstance(value, bool) else None


def _timings(a: Mapping[str, Any]) -> str:
    """An attempt's timings, in seconds from its start: "timings: detected +12.3 s,
    stopping +12.3 s, ended +13.0 s, relaunched +14.1 s" (only those known)."""
    start = _number(a.get("start"))
    if start is None:
        return ""
    parts = [f"{name} +{t - start:.1f} s" for name, key in
             (("detected", "detected"), ("stopping", "stopping"), ("ended", "end"),
              ("relaunched", "relaunched")) if (t := _number(a.get(key))) is not None]
    return f"timings: {', '.join(parts)}" if parts else ""


def _node_cases(suite: ET.Element, classname: str, node: NodeResult, root: str | None,
                count: Callable[[str], None]) -> None:
    text = _failure_text(node.exit_code, node.message, root, node.stderr_tail)
    _case(suite, classname, node.host, node.status, node.duration, node.message, text)
    count(node.status)
    for rank in node.ranks:
        _rank_case(suite, classname, node.host, rank, root)
        count(rank.status)


def _rank_case(suite: ET.Element, classname: str, host: str, r: RankResult,
               root: str | None) -> None:
    text = _failure_text(r.exit_code, r.message, root, r.stderr_tail)
    _case(suite, classname, f"{host} rank {r.rank}", r.status, r.duration, r.message, text)


def write_junit(path: str | os.PathLike[str], report: CommandReport,
                extra_cases: Sequence[ExtraCase] = (), *, node_cases: bool = True) -> None:
    """Write atomically (a half-written report would be read as a broken test run)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".junit-", dir=target.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(to_junit(report, extra_cases, node_cases=node_cases))
    os.replace(tmp, target)
