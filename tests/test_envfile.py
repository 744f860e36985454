"""--env and --env-file parsing."""

from __future__ import annotations

import pytest

from launcher.errors import ConfigError, UsageError
from launcher.hosts.envfile import from_environment, load_env_file, parse_env_args, parse_env_text


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


# ------------------------------------------------ whole messages (mutation round, issue #25)

def _error(call, *args) -> str:
    """What the user sees: the message with its hint, as the CLI prints it."""
    with pytest.raises((UsageError, ConfigError)) as info:
        call(*args)
    return str(info.value)


def test_env_arg_errors_whole():
    hint = "(letters, digits and '_', not starting with a digit)"
    assert _error(parse_env_args, ["1A=x"]) == (
        f"--env: '1A' is not a valid environment variable name {hint}")
    assert _error(parse_env_args, ["HOSTNAME=x"]) == (
        "--env: HOSTNAME is set by the node itself and cannot be forwarded (leave it out: "
        "each node sets its own)")
    assert _error(parse_env_text, "A=1\nSHLVL=3\n", "f.env") == (
        "f.env:2: SHLVL is set by the node itself and cannot be forwarded (leave it out: "
        "each node sets its own)")
    assert _error(parse_env_args, ["A=x\x00y"]) == (
        "--env A: the value contains a NUL byte, which no process environment can carry "
        "(remove it)")
    assert _error(parse_env_args, ["NOEQ"], {}) == (
        "--env NOEQ: NOEQ is not set in this environment "
        "(export NOEQ=... first, or give --env NOEQ=VALUE)")
    assert _error(parse_env_args, ["TOK"], {"TOK": "a\x00b"}) == (
        "--env TOK: the value contains a NUL byte, which no process environment can carry "
        "(remove it)")


def test_env_name_takes_its_value_from_the_given_environment_else_the_launcher_s(monkeypatch):
    monkeypatch.setenv("DTRAIN_T_FROM_OS", "os value")
    monkeypatch.delenv("DTRAIN_T_GIVEN", raising=False)
    assert parse_env_args(["DTRAIN_T_GIVEN"], {"DTRAIN_T_GIVEN": "given"}) == [
        ("DTRAIN_T_GIVEN", "given")]
    assert parse_env_args(["DTRAIN_T_FROM_OS"]) == [("DTRAIN_T_FROM_OS", "os value")]
    with pytest.raises(UsageError):
        parse_env_args(["DTRAIN_T_FROM_OS"], {})  # a given environment is the only one


def test_from_environment_names_only_the_items_without_a_value():
    assert from_environment(["A", "B=1", "C", "D="]) == frozenset({"A", "C"})
    assert from_environment([]) == frozenset()


def test_double_quote_escapes_at_every_position():
    text = ('A="line\\n"\nB="a\\qb"\nC="a\\\\"\nD="say \\"hi\\""\nE="\\t$\\$x"\n'
            "F='a\\'\nG=\"\"\nH=''\nI=1\n")
    assert parse_env_text(text, "f.env") == [
        ("A", "line\n"), ("B", "a\\qb"), ("C", "a\\"), ("D", 'say "hi"'), ("E", "\t$$x"),
        ("F", "a\\"), ("G", ""), ("H", ""), ("I", "1")]


def test_crlf_inside_a_multi_line_value_is_one_newline():
    assert parse_env_text('D="a\r\nb\r\nc"\r\nE=c\r\n', "f.env") == [
        ("D", "a\nb\nc"), ("E", "c")]


def test_env_file_errors_whole_with_file_and_line():
    assert _error(parse_env_text, "\nA=1\n\x00\nB=\x00\nC=1\n", "f.env") == (
        "f.env:3: NUL byte in an env file (an environment value cannot carry NUL; is this a "
        "binary file?)")
    assert _error(parse_env_text, "# c\n1A=x\n", "f.env") == (
        "f.env:2: '1A' is not a valid environment variable name (letters, digits and '_', "
        "not starting with a digit)")
    assert _error(parse_env_text, "\nSECRET_X\n", "f.env") == (
        "f.env:2: expected NAME=VALUE (no '=' on this line)")
    assert _error(parse_env_text, 'A=1\nB="x"y\n', "f.env") == (
        "f.env:2: B: text after the closing \" quote (quote the whole value, or put a "
        "comment after ' #')")
    assert _error(parse_env_text, "A='x\nmore'tail\n", "f.env") == (
        "f.env:2: A: text after the closing ' quote (quote the whole value, or put a "
        "comment after ' #')")
    assert _error(parse_env_text, 'A=1\nB="open\nno close\n', "f.env") == (
        "f.env:2: unterminated \" quote")
    # a comment after the closing quote is fine, text glued to it is not
    assert parse_env_text('A="x" # note\nB="y"\t# tab\n', "f.env") == [("A", "x"), ("B", "y")]
    assert "text after" in _error(parse_env_text, 'A="x"# glued\n', "f.env")


def test_load_env_file_errors_whole(tmp_path, monkeypatch):
    missing = tmp_path / "none.env"
    assert _error(load_env_file, str(missing)) == (
        f"env file {missing} not found (check the --env-file path)")
    bad = tmp_path / "bad.env"
    bad.write_bytes(b"\nA=1\nB=\xff\n\xfe\n")
    assert _error(load_env_file, str(bad)) == (
        f"{bad}:3: not UTF-8 text (byte 0xff) (save the file as UTF-8)")
    good = tmp_path / "good.env"
    good.write_text("A=\u00e9\n", encoding="utf-8")
    assert load_env_file(str(good)) == [("A", "\u00e9")]

    def refuse(self):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(type(good), "read_bytes", refuse)
    assert _error(load_env_file, str(good)) == (
        f"cannot read env file {good}: Permission denied")
