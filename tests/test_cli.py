"""CLI surface: help, version, bad input is exit 2 before anything connects."""

from __future__ import annotations

import time

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


@pytest.mark.parametrize("args, message", [
    pytest.param(["run", "--nproc-per-nod", "2", "train.py"],
                 "no such option --nproc-per-nod (did you mean --nproc-per-node?)", id="run"),
    pytest.param(["exec", "--gahter", "--", "true"],
                 "no such option --gahter (did you mean --gather?)", id="exec"),
    pytest.param(["run", "--frobnicate", "train.py"],
                 "no such option --frobnicate (options for the script", id="no-match"),
])
def test_unknown_option_before_the_script_is_exit_2_at_once(args, message, tmp_path):
    """A typo is never taken for the script: nothing connects (198.18.0.250 would hang)."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("198.18.0.250\n")
    start = time.monotonic()
    res = dtrain([args[0], "-f", str(hostfile), "--connect-timeout", "300", *args[1:]],
                 env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert time.monotonic() - start < 60  # refused before dialling (the dial waits 300 s)


def test_options_after_the_script_stay_the_scripts(tmp_path):
    res = dtrain(["exec", "-H", "localhost", "echo", "-n", "--gather", "x"],
                 env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert res.stdout == "localhost: --gather x\n"


def _commands():
    """(path, click command) for every leaf command of the app."""
    import typer.main

    from launcher.cli import app

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), cmd

    return list(walk(typer.main.get_command(app), ()))


def test_every_option_has_help_and_f_is_always_hostfile():
    missing, short_f = [], []
    for path, cmd in _commands():
        for param in cmd.params:
            if param.param_type_name == "option" and not (param.help or "").strip():
                missing.append(f"{path} {param.opts[0]}")
            if "-f" in param.opts and "--hostfile" not in param.opts:
                short_f.append(f"{path} {param.opts}")
    assert len(_commands()) >= 7  # every command, including those added later
    assert missing == [] and short_f == []


def test_no_bool_metavar_on_flags():
    for cmd in (["--help"], ["keys", "--help"], ["run", "--help"], ["exec", "--help"],
                ["logs", "--help"], ["doctor", "--help"], ["keys", "setup", "--help"]):
        res = dtrain(cmd, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
        assert res.returncode == 0 and "--help" in res.stdout, cmd
        assert "<bool>" not in res.stdout, cmd
    assert "--follow" in dtrain(["logs", "--help"], env={"COLUMNS": "200"}).stdout
