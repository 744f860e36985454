"""The JSON report and JUnit XML writers (launcher/output/report.py, junit.py), pure: the
formats a CI system parses (RFC 3339 timestamps, non-negative times) and the failure story
(exit code, the node's message, the root cause, the stderr tail)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import jsonschema
import pytest

from launcher.output.junit import ExtraCase, to_junit, write_junit
from launcher.output.report import (
    FAILED,
    PASSED,
    CommandReport,
    NodeResult,
    RankResult,
    to_json,
    write_json,
)
from tests.reports import validate_json, validate_junit

T0 = 1_764_600_000.25  # 2025-12-01T14:40:00.250Z


def _report(*, started: float = T0, ended: float = T0 + 2.5, summary: str = "node2 r1 exited 3",
            node_message: str | None = "rank 1 exited with code 3",
            duration: float | None = 1.25) -> CommandReport:
    ranks = (RankResult(0, PASSED, 0, duration=duration),
             RankResult(1, FAILED, 3, role="root cause", message=node_message,
                        duration=duration, stderr_tail=("Traceback", "ValueError: bad")))
    nodes = (NodeResult("node1", PASSED, 0, duration=duration),
             NodeResult("node2", FAILED, 3, message=node_message, duration=duration,
                        ranks=ranks, stderr_tail=("ValueError: bad",)))
    return CommandReport("run", 3, summary, started, ended, nodes,
                         {"kind": "rank", "host": "node2", "rank": 1, "exit_code": 3,
                          "summary": summary}, None,
                         {"run_id": "20251201-144000-ab12", "world_size": 2})


def test_timestamps_are_rfc3339_with_a_zone() -> None:
    doc = to_json(_report())
    assert doc["started"] == "2025-12-01T14:40:00.250+00:00"
    assert doc["ended"] == "2025-12-01T14:40:02.750+00:00"
    assert doc["duration"] == 2.5
    validate_json(doc, "run")


@pytest.mark.parametrize("stamp", ["2025-12-01T14:40:00", "2025-12-01 14:40", "1764600000",
                                   "yesterday", "2025-13-01T14:40:00Z"])
def test_a_wrong_timestamp_fails_validation(stamp: str) -> None:
    """The schema's format: date-time is enforced (jsonschema checks it only with
    rfc3339-validator installed: it is in the test extras, and validate_json insists)."""
    for key in ("started", "ended"):
        doc = copy.deepcopy(to_json(_report()))
        doc[key] = stamp
        with pytest.raises(jsonschema.ValidationError, match="date-time"):
            validate_json(doc, "run")


def test_a_clock_that_went_backwards_is_no_negative_duration() -> None:
    report = _report(started=T0 + 5, ended=T0)
    doc = to_json(report)
    assert doc["duration"] == 0
    validate_json(doc, "run")
    suite = validate_junit(to_junit(report)).find("testsuite")
    assert suite.get("time") == "0.000"


def test_a_negative_node_or_rank_duration_is_a_zero_testcase_time() -> None:
    """The XSD's time is unsigned: one negative time and CI drops the whole report."""
    root = validate_junit(to_junit(_report(duration=-1.5)))
    assert [case.get("time") for case in root.iter("testcase")] == ["0.000"] * 4


def test_junit_times_are_the_durations() -> None:
    root = validate_junit(to_junit(_report(duration=1.25)))
    assert [c.get("time") for c in root.iter("testcase")] == ["1.250"] * 4
    suite = root.find("testsuite")
    assert suite.get("time") == "2.500"
    assert suite.get("timestamp") == "2025-12-01T14:40:00"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "2", "0")


def test_the_failure_text_tells_the_whole_story() -> None:
    root = validate_junit(to_junit(_report()))
    failures = {case.get("name"): case.find("failure") for case in root.iter("testcase")}
    assert failures["node1"] is None and failures["node2 rank 0"] is None
    rank = failures["node2 rank 1"]
    assert rank.get("message") == "rank 1 exited with code 3"
    assert rank.text == ("exit code: 3\nrank 1 exited with code 3\n"
                         "root cause: node2 r1 exited 3\nlast stderr lines:\n"
                         "  Traceback\n  ValueError: bad")
    assert "root cause: node2 r1 exited 3" in failures["node2"].text


def test_the_root_cause_is_not_repeated_when_it_is_the_message() -> None:
    root = validate_junit(to_junit(_report(summary="same words", node_message="same words")))
    text = next(c.find("failure").text for c in root.iter("testcase")
                if c.get("name") == "node2")
    assert text == "exit code: 3\nsame words\nlast stderr lines:\n  ValueError: bad"


def test_a_passing_report_has_no_root_cause_in_its_cases() -> None:
    ok = CommandReport("exec", 0, "2 nodes ok", T0, T0 + 1,
                       (NodeResult("node1", PASSED, 0), NodeResult("node2", PASSED, 0)),
                       extra={"command_line": "true"})
    root = validate_junit(to_junit(ok, [ExtraCase("busbw", FAILED, "slow", "at 4M")]))
    cases = list(root.iter("testcase"))
    assert [c.get("name") for c in cases] == ["node1", "node2", "busbw"]
    assert cases[2].find("failure").text == "at 4M"
    assert root.find("testsuite").get("failures") == "1"
    validate_json(to_json(ok), "exec")
    assert to_json(ok)["outcome"] == "ok" and to_json(ok)["root_cause"] is None


def test_write_junit_makes_the_directory_and_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "reports" / "nested" / "run.xml"
    write_junit(target, _report(), [ExtraCase("busbw", PASSED)])
    first = target.read_text()
    assert first == to_junit(_report(), [ExtraCase("busbw", PASSED)])
    write_junit(target, _report(summary="other"), node_cases=False)
    root = validate_junit(target.read_text())
    assert [c.get("name") for c in root.iter("testcase")] == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["run.xml"]  # no temp left


def test_write_json_is_one_document_and_a_newline(capsys: pytest.CaptureFixture[str]) -> None:
    write_json(_report())
    assert json.loads(capsys.readouterr().out)["summary"] == "node2 r1 exited 3"
    out = io.StringIO()
    write_json(_report(), out)
    text = out.getvalue()
    assert text.endswith("}\n") and text.count("\n}\n") == 1
    assert json.loads(text) == json.loads(json.dumps(to_json(_report()), default=str))
    assert json.loads(text)["schema"] == "dtrain.run/1"
    assert text.splitlines()[1] == '  "schema": "dtrain.run/1",'  # indented by 2
    # a value JSON has no type for (a path in a command's section) is written as text
    odd = CommandReport("exec", 0, "ok", T0, T0 + 1, extra={"command_line": Path("/x/y")})
    out = io.StringIO()
    write_json(odd, out)
    assert json.loads(out.getvalue())["exec"] == {"command_line": "/x/y"}
    assert json.loads(text)["outcome"] == "failed"


def test_junit_names_statuses_and_properties() -> None:
    """Every attribute a CI reporter reads: the suite's and each case's names, classname,
    the counts on both levels, error and skipped cases, and the properties."""
    report = CommandReport(
        "keys-check", 255, "node3 unreachable", T0, T0 + 1,
        (NodeResult("node1", PASSED, 0), NodeResult("node3", "error", 255, message="refused"),
         NodeResult("node4", "skipped", message="excluded")), None, "/runs/r1")
    root = validate_junit(to_junit(report, [ExtraCase("ranks", "error"),
                                            ExtraCase("pairs", "skipped")]))
    assert root.get("name") == "dtrain keys-check"
    suite = root.find("testsuite")
    assert suite.get("name") == "dtrain keys-check" and suite.get("hostname")
    for node in (root, suite):
        assert (node.get("tests"), node.get("failures"), node.get("errors"),
                node.get("skipped")) == ("5", "0", "2", "2")
    assert root.get("time") == "1.000"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"exit_code": "255", "summary": "node3 unreachable", "archive": "/runs/r1"}
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert {c.get("classname") for c in cases.values()} == {"dtrain.keys_check"}
    error = cases["node3"].find("error")
    assert (error.get("message"), error.get("type")) == ("refused", "error")
    assert error.text == "exit code: 255\nrefused\nroot cause: node3 unreachable"
    assert cases["node4"].find("skipped").get("message") == "excluded"
    assert cases["ranks"].find("error").get("message") == "error"
    assert cases["pairs"].find("skipped").get("message") == "skipped"
    assert cases["node1"].find("failure") is None and cases["node1"].find("error") is None
    no_archive = to_junit(CommandReport("exec", 0, "ok", T0, T0 + 1))
    assert "archive" not in no_archive and 'name="exit_code" value="0"' in no_archive


def test_a_failure_without_a_message_says_failed() -> None:
    report = CommandReport("exec", 1, "1 node failed", T0, T0 + 1,
                           (NodeResult("node1", FAILED, 1),))
    failure = validate_junit(to_junit(report)).find("testsuite/testcase/failure")
    assert (failure.get("message"), failure.get("type")) == ("failed", "failure")
    assert failure.text == "exit code: 1\nroot cause: 1 node failed"


def test_write_junit_writes_its_temp_beside_the_target(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The temp is in the report's own directory, so the rename over it is atomic (a temp
    in /tmp may be on another filesystem: a copy, not a rename)."""
    import tempfile

    made: list[str] = []
    real = tempfile.mkstemp

    def mkstemp(*args: object, **kwargs: object) -> tuple[int, str]:
        fd, path = real(*args, **kwargs)  # type: ignore[call-overload]
        made.append(path)
        return fd, path

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    write_junit(tmp_path / "r" / "run.xml", _report())
    assert [Path(p).parent for p in made] == [tmp_path / "r"]


def test_junit_details_a_ci_reporter_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import time as time_mod

    report = CommandReport("keys-check", 0, "ok", T0, T0 + 1.23456,
                           (NodeResult("node1", FAILED, None, duration=None),))
    text = to_junit(report, [ExtraCase("pairs", FAILED, "slow", "n1 <-> n2")])
    assert text.startswith("<?xml version='1.0' encoding='utf-8'?>\n<testsuites")
    root = validate_junit(text)
    suite = root.find("testsuite")
    assert suite.get("hostname") == (socket.gethostname() or "localhost")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["node1"].get("time") == "0.000" and cases["pairs"].get("time") == "0.000"
    # the command passed: no root cause in a case's story; no exit code when none is known
    assert not cases["node1"].find("failure").text
    assert cases["pairs"].find("failure").get("message") == "slow"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert validate_junit(to_junit(report)).find("testsuite").get("hostname") == "localhost"
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time_mod.tzset()
    try:  # the timestamp is UTC whatever the local zone
        assert validate_junit(to_junit(report)).find("testsuite").get("timestamp") == \
            "2025-12-01T14:40:00"
    finally:
        monkeypatch.delenv("TZ")
        time_mod.tzset()


def test_json_details() -> None:
    doc = to_json(CommandReport("keys-check", 1, "x", T0, T0 + 1.23456, (),
                                {"kind": "node", "exit_code": 1, "summary": "x"}, None,
                                {"nodes": 0}))
    assert doc["duration"] == 1.235
    assert doc["root_cause"] == {"kind": "node", "exit_code": 1, "summary": "x"}
    assert doc["keys_check"] == {"nodes": 0} and doc["command"] == "keys-check"


def test_escapes_and_non_xml_characters_from_a_failing_rank_keep_the_junit_valid() -> None:
    """A coloured line, NUL, \\x0b, U+FFFE, an OSC 52 write in a failing rank's stderr tail
    (and in names and messages: attributes) make no invalid XML: CI keeps the report exactly
    when the job failed (issue 22, Low 1)."""
    hostile = ("\x1b[31mRuntimeError\x1b[0m: bad \x00 \x0b \ufffe \ud800 "
               "\x1b]52;c;cHduZWQ=\x07end")
    rank = RankResult(1, FAILED, 3, message=f"rank 1 said {hostile}",
                      stderr_tail=(hostile, "plain"))
    node = NodeResult(f"node2{hostile}", FAILED, 3, message=hostile, ranks=(rank,),
                      stderr_tail=(hostile,))
    report = CommandReport("run", 3, f"summary {hostile}", T0, T0 + 1, (node,), None, None)
    text = to_junit(report, [ExtraCase(f"check {hostile}", FAILED, hostile, hostile)])
    root = validate_junit(text)
    assert "\x1b" not in text and "\x00" not in text and "\ufffe" not in text
    failure = next(c.find("failure") for c in root.iter("testcase")
                   if c.get("name", "").endswith("rank 1"))
    assert "  RuntimeError: bad \ufffd \ufffd \ufffd \ufffd end\n  plain" in failure.text
    assert failure.get("message") == "rank 1 said RuntimeError: bad \ufffd \ufffd \ufffd \ufffd end"
