"""What a new user trips over in the first hour, on the real-sshd cluster: start errors,
missing programs, unreachable hosts (issue 12)."""

from __future__ import annotations

import os

import pytest

from tests.util import dtrain

pytestmark = pytest.mark.ssh


def test_exec_argv_start_error_is_shown_per_node_folded(cluster):
    """Several args run without a shell: the supervisor's exec error is what the user sees."""
    res = dtrain(["exec", "-H", "node[1-3]", "--", "nvidia-smi", "-L"], env=cluster.client_env())
    assert res.returncode == 127
    assert "dtrain: node[1-3]: nvidia-smi: command not found (exit 127)\n" in res.stderr
    assert "exit 127\n" not in res.stderr.replace("(exit 127)\n", "")


def test_exec_argv_start_errors_differ_per_node(cluster):
    home = cluster.node(1).home
    tool = home / "dtrain-tool.sh"
    tool.write_text("#!/bin/sh\necho tool $1\n")
    tool.chmod(0o755)
    os.chown(tool, home.stat().st_uid, home.stat().st_gid)
    try:
        res = dtrain(["exec", "-H", "node[1-3]", "--", "./dtrain-tool.sh", "x"],
                     env=cluster.client_env())
    finally:
        tool.unlink()
    assert res.returncode == 127
    assert res.stdout == "node1: tool x\n"
    assert "dtrain: node[2-3]: ./dtrain-tool.sh: No such file or directory (exit 127)\n" \
        in res.stderr
