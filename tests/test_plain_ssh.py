"""Issue 40.7 without the cluster: the ~/.ssh/config block keys setup offers (pure and on
disk), and the warning for a secret given with its value on the command line. (The cluster
half: tests/test_keys.py::test_setup_says_how_plain_ssh_uses_the_key_and_adds_it_only_when_asked
and ::test_interactive_confirm_and_hidden_password.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from launcher.commands.sshconfig import add_block, has_block, host_block, usage_lines
from launcher.models import Host
from tests.util import REPO, dtrain

KEY = Path("/home/me/.ssh/id_ed25519_dtrain")


def test_the_block_and_whether_it_is_there() -> None:
    block = host_block([Host("node1"), Host("node2")], KEY)
    assert "Host node1 node2\n    IdentityFile /home/me/.ssh/id_ed25519_dtrain\n" in block
    assert has_block(block, ["node1", "node2"], KEY)
    assert not has_block(block, ["node1", "node3"], KEY)
    assert not has_block(block, ["node1"], Path("/other/key"))
    many = host_block([Host(f"n{i}") for i in range(40)], KEY)
    assert many.count("\nHost ") == 3 and has_block(many, [f"n{i}" for i in range(40)], KEY)
    theirs = "Host *\n  User me\nHost node1 node2 # mine\n  IdentityFile ~/.ssh/x\n"
    assert has_block(theirs, ["node1"], Path(os.path.expanduser("~/.ssh/x")))
    assert "ssh -i /home/me/.ssh/id_ed25519_dtrain node1" in usage_lines(KEY, [Host("node1")])[0]


def test_added_once_private_and_after_what_was_there(tmp_path: Path) -> None:
    config = tmp_path / ".ssh" / "config"
    assert add_block(config, [Host("node1")], KEY)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    assert not add_block(config, [Host("node1")], KEY)  # already there
    config.write_text("Host login\n  User me")  # no newline at the end
    assert add_block(config, [Host("node1")], KEY)
    text = config.read_text()
    assert text.startswith("Host login\n  User me\n") and text.count("IdentityFile") == 1


ENV = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}


def test_a_secret_with_its_value_on_the_command_line_is_warned_about(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node[1-2] slots=1\n")
    args = ["run", "-f", str(hosts), "--dry-run", "--offline"]
    res = dtrain([*args, "--env", "WANDB_API_KEY=abc123xyz", "--env", "FOO=1", "train.py"],
                 cwd=tmp_path, env=ENV)
    assert res.returncode == 0, res.stderr
    assert "warning: --env WANDB_API_KEY=... puts a secret on the command line" in res.stderr
    assert "export WANDB_API_KEY=... and give --env WANDB_API_KEY" in res.stderr
    assert "abc123xyz" not in res.stdout + res.stderr  # never echoed
    assert "FOO" not in res.stderr
    quiet = dtrain([*args, "--env", "WANDB_API_KEY", "train.py"], cwd=tmp_path,
                   env={**ENV, "WANDB_API_KEY": "abc123xyz"})
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    smoke = dtrain(["smoke", "-H", "198.18.0.250", "--env", "HF_TOKEN=hf_zzz", "-t", "1",
                    "--fanout", "1"], cwd=tmp_path, env=ENV, timeout=60)
    assert "warning: --env HF_TOKEN=... puts a secret" in smoke.stderr
    assert "hf_zzz" not in smoke.stdout + smoke.stderr
