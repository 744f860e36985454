"""The user config (~/.config/dtrain/config.toml, issue 24.12): its parsing, its errors at
file:line, where it is found, the per-user archive, and the precedence CLI > environment
variables > config > built-in, through the real command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.hosts.userconfig import config_path, default_archive_dir, parse, state_dir
from tests.util import REPO, assert_exit, dtrain

GOOD = '''# my defaults
hostfile = "~/hosts.txt"
python = "/opt/venv/bin/python"
setup = "source /opt/venv/bin/activate"
workdir = "~/proj"
archive_dir = "~/runs"

[env]
NCCL_DEBUG = "WARN"
'''


def test_a_config_gives_each_value_with_its_line() -> None:
    cfg = parse(GOOD, Path("/c/config.toml"))
    assert cfg.values == {"hostfile": "~/hosts.txt", "python": "/opt/venv/bin/python",
                          "setup": "source /opt/venv/bin/activate", "workdir": "~/proj",
                          "archive_dir": "~/runs"}
    assert cfg.env == (("NCCL_DEBUG", "WARN"),)
    assert cfg.where("python") == "config /c/config.toml:3"
    assert cfg.where("env.NCCL_DEBUG") == "config /c/config.toml:9"


@pytest.mark.parametrize(("text", "message"), [
    ('python = "/x"\nhostfile = \n', "/c/config.toml:2: not valid TOML: "),
    ('python = "/x"\n\nhostfle = "h.txt"\n', "/c/config.toml:3: unknown key 'hostfle'"),
    ('archive-dir = "/r"\n', "/c/config.toml:1: unknown key 'archive-dir' (did you mean "
                             "archive_dir?)"),
    ('python = 3\n', "/c/config.toml:1: python must be a non-empty string"),
    ('[env]\nA = "1"\n"1BAD" = "x"\n', "/c/config.toml:3: "),
    ('[env]\nA = 1\n', "/c/config.toml:2: env.A must be a string"),
])
def test_a_bad_config_names_its_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text, Path("/c/config.toml"))
    assert err.value.message.startswith(message), err.value.message
    assert err.value.exit_code == 2


def test_where_the_config_and_the_state_are() -> None:
    home = {"HOME": "/home/u"}
    assert config_path(home) == Path("/home/u/.config/dtrain/config.toml")
    assert config_path({**home, "XDG_CONFIG_HOME": "/x"}) == Path("/x/dtrain/config.toml")
    assert config_path({**home, "XDG_CONFIG_HOME": "rel"}) == Path(
        "/home/u/.config/dtrain/config.toml")  # XDG: a relative path is ignored
    assert config_path({**home, "DTRAIN_CONFIG": ""}) is None
    assert default_archive_dir(home) == Path("/home/u/.local/state/dtrain/runs")
    assert state_dir({**home, "XDG_STATE_HOME": "/s"}) == Path("/s/dtrain")


def _env(tmp_path: Path, config: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "cfg"),
               XDG_STATE_HOME=str(tmp_path / "state"))
    if config is not None:
        path = tmp_path / "cfg" / "dtrain" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
    return env


def test_the_archive_defaults_to_the_per_user_state_dir_from_any_directory(tmp_path):
    env = {**_env(tmp_path, None), "PYTHONPATH": str(REPO)}  # this checkout, from elsewhere
    res = dtrain(["ps"], env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"no runs in {tmp_path}/state/dtrain/runs" in res.stderr


def test_archive_precedence_cli_then_env_then_config(tmp_path):
    env = _env(tmp_path, f'archive_dir = "{tmp_path}/from-config"\n')
    assert f"no runs in {tmp_path}/from-config" in dtrain(["ps"], env=env).stderr
    env["DTRAIN_ARCHIVE_DIR"] = str(tmp_path / "from-env")
    assert f"no runs in {tmp_path}/from-env" in dtrain(["ps"], env=env).stderr
    res = dtrain(["ps", "--archive-dir", str(tmp_path / "from-cli")], env=env)
    assert f"no runs in {tmp_path}/from-cli" in res.stderr


def test_a_bad_config_is_exit_2_with_file_and_line(tmp_path):
    env = _env(tmp_path, 'python = "/x"\nhostfle = "h"\n')
    res = dtrain(["ps"], env=env)
    assert_exit(res, 2)
    assert (f"dtrain: error: {tmp_path}/cfg/dtrain/config.toml:2: unknown key 'hostfle'"
            in res.stderr), res.stderr


@pytest.mark.ssh
def test_the_dry_run_shows_each_default_from_the_config_with_its_line(cluster, tmp_path):
    """hostfile, python, setup, workdir, archive dir and [env] from the config, each shown
    with its file:line; a flag on the command line wins and says so."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("node[1-2] slots=1\n")
    cfg = tmp_path / "cfg" / "dtrain" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'hostfile = "{hostfile}"\npython = "{cluster.python}"\n'
                   f'setup = "export DT_CFG=1"\nworkdir = "{REPO}"\n'
                   f'archive_dir = "{tmp_path}/runs"\n[env]\nNCCL_DEBUG = "WARN"\n')
    env = cluster.client_env(XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    res = dtrain(["run", "--dry-run", "examples/ddp_smoke.py"], env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"hosts node[1-2] from {hostfile}" in out, out
    assert f"python {cluster.python}  [config {cfg}:2]\n" in out, out
    assert f"setup export DT_CFG=1  [config {cfg}:3]\n" in out
    assert f"workdir {REPO}  [config {cfg}:4]\n" in out
    assert f"archive dir {tmp_path}/runs  [config {cfg}:5]\n" in out
    assert out.count(f"  NCCL_DEBUG=WARN  [user: config {cfg}:7]\n") == 2, out
    assert f"{cluster.python} -m torch.distributed.run" in out
    res = dtrain(["run", "--dry-run", "--python", cluster.python, "-e", "NCCL_DEBUG=INFO",
                  "-H", "node1", "--nproc-per-node", "1", "examples/ddp_smoke.py"], env=env)
    assert res.returncode == 0, res.stderr
    assert f"python {cluster.python}  [--python]\n" in res.stdout
    assert "  NCCL_DEBUG=INFO  [user: --env]\n" in res.stdout
    assert "hosts node1 from -H" in res.stdout


# ---------------------------------------------------------------- the pure parts, whole
# (issue #25: scripts/mutate userconfig's survivors)

HINT = ('the keys: hostfile, python, setup, workdir, archive_dir, persist, image, '
        'container_runtime, notify, image_via, preload and an [env] table of NAME = "value"')


@pytest.mark.parametrize(("text", "message"), [
    ('python = "/x"\n\nhostfle = "h.txt"\n', "/c/config.toml:3: unknown key 'hostfle'"),
    ('archive-dir = "/r"\n', "/c/config.toml:1: unknown key 'archive-dir' (did you mean "
                             "archive_dir?)"),
    ('Archive_Dir = "/r"\n', "/c/config.toml:1: unknown key 'Archive_Dir'"),
    ('workdir = ""\n', "/c/config.toml:1: workdir must be a non-empty string"),
    ('"setup" = 3\n', "/c/config.toml:1: setup must be a non-empty string"),
    ('python = "/p"\n\n[other]\npython = 1\n', "/c/config.toml:3: unknown key 'other'"),
    ('python = "/p"\n[ "hostfiles" . a ]\nx = 1\n', "/c/config.toml:2: unknown key 'hostfiles'"),
    ('python = "/p"\n[[runs]]\nx = 1\n', "/c/config.toml:2: unknown key 'runs'"),
    ('python = "/p"\n[env]\nA = "1"\n[other.table]\n', "/c/config.toml:4: unknown key 'other'"),
    ('[Xtra]\n', "/c/config.toml:1: unknown key 'Xtra'"),
    ('work_dir = "/w"\n', "/c/config.toml:1: unknown key 'work_dir' (did you mean workdir?)"),
    ('env = {A = 1}\n', "/c/config.toml: env.A must be a string"),  # no line of its own
    ('env = "A=1"\n', "/c/config.toml:1: env must be a table: [env] then NAME = \"value\" "
                      "lines"),
    ('python = "/x"\n[ env ]\nA = "1"\nB = 2\n', "/c/config.toml:4: env.B must be a string"),
    ('[env]\n"1BAD" = "x"\n', "/c/config.toml:2: env.1BAD: '1BAD' is not a valid environment "
                             "variable name"),
    ('[env]\nA = "x\\u0000"\n', "/c/config.toml:2: env.A: "),
    ('python = 3\n[env]\npython = "x"\n', "/c/config.toml:1: python must be a non-empty "
                                          "string"),
])
def test_config_errors_whole_with_the_line_and_the_hint(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text, Path("/c/config.toml"))
    assert err.value.message.startswith(message), err.value.message
    if "env.A: " not in message:
        assert err.value.message == message
    assert err.value.hint == HINT
    assert err.value.exit_code == 2


def test_bad_toml_names_the_line_without_tomllib_s_position() -> None:
    with pytest.raises(ConfigError) as err:
        parse('python = "/x"\nhostfile = \n', Path("/c/config.toml"))
    assert err.value.message == "/c/config.toml:2: not valid TOML: Invalid value"
    with pytest.raises(ConfigError) as err:
        parse('python = ', Path("/c/config.toml"))  # no line: tomllib's own words stay
    assert err.value.message == ("/c/config.toml: not valid TOML: Invalid value (at end of "
                                 "document)")
    assert err.value.hint == ("fix the file (https://toml.io), or set DTRAIN_CONFIG= to run "
                              "without it")


def test_each_value_s_line_is_the_one_that_sets_it() -> None:
    cfg = parse('# python = "/no"\n"hostfile" = "h"\npython=\'/p\'\n[env]\nA = "1"\n',
                Path("/c/config.toml"))
    assert cfg.lines == {"hostfile": 2, "python": 3, "env.A": 5}
    assert cfg.where("hostfile") == "config /c/config.toml:2"
    assert cfg.where("setup") == "config /c/config.toml"  # not set there: the file alone
    assert cfg.env == (("A", "1"),)
    cfg = parse('python = "/p"\n[env]\npython = "not the top one"\n', Path("/c"))
    assert cfg.lines == {"python": 1, "env.python": 3}
    # an inline env table, keys after it: all read; its names have no line of their own
    cfg = parse('env = {A = "1"}\npython = "/p"\n', Path("/c/config.toml"))
    assert (cfg.values, cfg.env) == ({"python": "/p"}, (("A", "1"),))
    assert cfg.where("env.A") == "config /c/config.toml"


def test_where_the_state_is_when_variables_are_relative_or_unset(monkeypatch) -> None:
    home = {"HOME": "/home/u"}
    assert state_dir(home) == Path("/home/u/.local/state/dtrain")
    assert state_dir({**home, "DTRAIN_STATE_DIR": "/st"}) == Path("/st")
    assert state_dir({**home, "DTRAIN_STATE_DIR": "rel", "XDG_STATE_HOME": "/s"}) == Path(
        "/s/dtrain")  # a relative path is ignored
    assert state_dir({**home, "XDG_STATE_HOME": "rel"}) == Path("/home/u/.local/state/dtrain")
    assert default_archive_dir({**home, "DTRAIN_STATE_DIR": "/st"}) == Path("/st/runs")
    assert config_path({**home, "DTRAIN_CONFIG": "~/my.toml"}) == Path(
        os.path.expanduser("~/my.toml"))
    assert config_path({**home, "DTRAIN_CONFIG": "/etc/d.toml"}) == Path("/etc/d.toml")
    monkeypatch.setenv("HOME", "/home/fallback")
    assert config_path({}) == Path("/home/fallback/.config/dtrain/config.toml")
    assert state_dir({"HOME": ""}) == Path("/home/fallback/.local/state/dtrain")
    monkeypatch.setenv("DTRAIN_STATE_DIR", "/from/os/environ")
    assert state_dir() == Path("/from/os/environ")
    monkeypatch.setenv("DTRAIN_CONFIG", "")
    assert config_path() is None


def test_load_reads_the_file_and_says_what_is_wrong_with_it(tmp_path: Path) -> None:
    from launcher.hosts.userconfig import MAX_BYTES, UserConfig, load
    path = tmp_path / "config.toml"
    env = {"HOME": str(tmp_path), "DTRAIN_CONFIG": str(path)}
    assert load(env) == UserConfig()  # missing: no config
    assert load({"DTRAIN_CONFIG": ""}) == UserConfig()
    path.write_text('python = "/p"\n')
    assert load(env) == UserConfig(path, {"python": "/p"}, (), {"python": 1})
    path.write_bytes(b'python = "\xff"\n')
    with pytest.raises(ConfigError) as err:
        load(env)
    assert err.value.message == f"{path}: not UTF-8 text"
    path.write_bytes(b"#" * MAX_BYTES)
    assert load(env) == UserConfig(path, {}, (), {})  # exactly the cap: read
    path.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(ConfigError) as err:
        load(env)
    assert err.value.message == f"{path}: larger than 1 MiB: not a config file"
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError) as err:
        load(env)
    assert err.value.message == f"{path}: cannot read it: Is a directory"
    assert err.value.hint == "fix its permissions, or set DTRAIN_CONFIG= to run without it"
