"""commands/entry.py: every command body goes in and comes out the same way (no cluster)."""

from __future__ import annotations

import json

import pytest

from launcher.commands.entry import INTERRUPTED, Ended, Reports, run_command
from launcher.errors import ConnectError, PreflightFailed
from launcher.models import Host
from launcher.output.report import CommandReport

HOSTS = [Host("node1"), Host("node2")]


def test_the_body_s_result_goes_to_conclude() -> None:
    seen: list[Ended[int]] = []

    async def body() -> int:
        return 7

    def conclude(ended: Ended[int]) -> int:
        seen.append(ended)
        return ended.result or 0

    assert run_command("x", HOSTS, body, conclude) == 7
    assert seen[0].result == 7 and seen[0].error is None and not seen[0].interrupted


def test_ctrl_c_ends_the_body_without_a_result() -> None:
    async def body() -> int:
        raise KeyboardInterrupt

    assert run_command("x", HOSTS, body,
                       lambda e: INTERRUPTED if e.interrupted else 0) == INTERRUPTED


def test_an_error_is_its_message_and_its_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    async def body() -> int:
        raise PreflightFailed("the master is unreachable", host="node2")

    assert run_command("x", HOSTS, body, lambda e: 0) == PreflightFailed.exit_code
    err = capsys.readouterr().err
    assert "dtrain: error: node2: the master is unreachable" in err


def test_an_error_with_json_asked_is_one_report_naming_every_host(
        capsys: pytest.CaptureFixture[str]) -> None:
    async def body() -> int:
        raise ConnectError("cannot reach node2", host="node2")

    code = run_command("exec", HOSTS, body, lambda e: 0, reports=Reports(as_json=True))
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert code == ConnectError.exit_code == doc["exit_code"]
    assert [n["host"] for n in doc["nodes"]] == ["node1", "node2"]
    assert doc["root_cause"]["summary"] == "cannot reach node2"
    assert "dtrain: error: node2: cannot reach node2" in out.err


def test_a_command_that_concludes_its_errors_gets_them() -> None:
    async def body() -> int:
        raise ConnectError("gone")

    def conclude(ended: Ended[int]) -> int:
        assert ended.error is not None
        return 42

    assert run_command("smoke", HOSTS, body, conclude, concludes_errors=True) == 42


def test_a_returned_report_is_finished_here(capsys: pytest.CaptureFixture[str]) -> None:
    async def body() -> int:
        return 3

    def conclude(ended: Ended[int]) -> CommandReport:
        return CommandReport("exec", ended.result or 0, "exit 3", ended.started,
                             ended.started, ())

    assert run_command("exec", HOSTS, body, conclude, reports=Reports(as_json=True)) == 3
    assert json.loads(capsys.readouterr().out)["exit_code"] == 3
