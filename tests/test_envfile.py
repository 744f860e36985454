"""--env and --env-file parsing."""

from __future__ import annotations

import pytest

from launcher.errors import ConfigError, UsageError
from launcher.hosts.envfile import load_env_file, parse_env_args, parse_env_text


def test_env_args_keep_values_verbatim():
    assert parse_env_args(["A=x=y", "B=", 'C= a "b" $c ']) == [
        ("A", "x=y"), ("B", ""), ("C", ' a "b" $c ')]


@pytest.mark.parametrize("item, message", [
    pytest.param("NOEQ", "--env NOEQ: NOEQ is not set in this environment", id="unset-name"),
    pytest.param("1A=x", "not a valid environment variable name", id="bad-name"),
    pytest.param("HOSTNAME=x", "cannot be forwarded", id="node-owned"),
])
def test_env_args_errors(item, message):
    with pytest.raises(UsageError, match=message):
        parse_env_args([item])


def test_dotenv_rules():
    text = ("# comment\r\nexport A=\"x y\\n$z\"\r\nB='lit $x \\n'\nC=plain # trailing\n"
            "D=\"multi\nline\"\nE=a=b\n\n  F = spaced\n")
    assert parse_env_text(text, "f.env") == [
        ("A", "x y\n$z"), ("B", "lit $x \\n"), ("C", "plain"), ("D", "multi\nline"),
        ("E", "a=b"), ("F", "spaced")]


def test_dotenv_errors_carry_file_and_line(tmp_path):
    path = tmp_path / "bad.env"
    path.write_text("A=1\nB=\"open\n")
    with pytest.raises(ConfigError, match=r"bad.env:2: unterminated"):
        load_env_file(str(path))
    with pytest.raises(ConfigError, match="not found"):
        load_env_file(str(tmp_path / "missing.env"))
    with pytest.raises(ConfigError, match=r"x.env:1: expected NAME=VALUE"):
        parse_env_text("just words\n", "x.env")
