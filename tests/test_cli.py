"""CLI surface: help, version, bad input is exit 2 before anything connects."""

from __future__ import annotations

import pytest

from tests.util import assert_exit, dtrain


def test_version_and_help():
    res = dtrain(["--version"])
    assert res.returncode == 0 and res.stdout.startswith("dtrain ")
    for cmd in (["--help"], ["exec", "--help"], ["run", "--help"], ["logs", "--help"],
                ["keys", "--help"]):
        res = dtrain(cmd, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        assert res.returncode == 0, (cmd, res.stderr)
    assert "argv" in dtrain(["exec", "--help"], env={"COLUMNS": "200"}).stdout


@pytest.mark.parametrize("args, message", [
    pytest.param(["exec", "--", "true"], "no hosts given", id="no-hosts"),
    pytest.param(["exec", "-H", "node;rm", "--", "true"], "node;rm", id="bad-name"),
    pytest.param(["exec", "-f", "/nonexistent/hosts", "--", "true"], "/nonexistent/hosts",
                 id="missing-hostfile"),
    pytest.param(["exec", "-H", "a,a", "--", "true"], "duplicate", id="duplicate"),
    pytest.param(["run", "-H", "localhost", "--rdzv", "etcd", "x.py"], "--rdzv", id="rdzv"),
    pytest.param(["run", "-H", "localhost", "--env-file", "/nonexistent.env", "x.py"],
                 "not found", id="env-file"),
])
def test_bad_input_is_exit_2(args, message, tmp_path):
    res = dtrain(args, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert_exit(res, 2)
    assert message in res.stderr


def test_exec_on_localhost_needs_no_sshd(tmp_path):
    res = dtrain(["exec", "-H", "localhost", "--", "echo hi; exit 4"],
                 env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert_exit(res, 4)
    assert res.stdout == "localhost: hi\n"
