"""Secrets (issue 11): --env NAME from the launcher's environment, redaction from the parsed
options in meta.json, dry runs and messages, and a private run archive."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from launcher.decide.runplan.netenv import EnvVar, merge_env
from launcher.errors import ConfigError, HostfileError, UsageError
from launcher.hosts.envfile import (
    from_environment,
    load_env_file,
    parse_env_args,
    parse_env_text,
)
from launcher.hosts.hostfile import parse_hostfile_yaml
from launcher.models import OutputLine
from launcher.output.archive import RunArchive
from launcher.text.redact import REDACTED, redact_command, redact_env
from tests.util import dtrain

SECRET = "hf_s3cr3t-VALUE"


# -- --env NAME ---------------------------------------------------------------------------

def test_env_name_alone_takes_the_launchers_value():
    environ = {"HF_TOKEN": SECRET, "PLAIN": "a b"}
    assert parse_env_args(["HF_TOKEN", "PLAIN", "X=1"], environ) == [
        ("HF_TOKEN", SECRET), ("PLAIN", "a b"), ("X", "1")]
    assert from_environment(["HF_TOKEN", "X=1"]) == {"HF_TOKEN"}


def test_env_name_alone_unset_is_exit_2():
    with pytest.raises(UsageError, match="--env MISSING_X: MISSING_X is not set") as info:
        parse_env_args(["MISSING_X"], {})
    assert info.value.exit_code == 2


def test_env_name_alone_unset_fails_before_connecting():
    env = {k: v for k, v in os.environ.items() if k != "MISSING_X"}
    res = dtrain(["run", "-H", "198.18.0.250", "--env", "MISSING_X", "t.py"], env=env,
                 timeout=30)
    assert res.returncode == 2 and "MISSING_X is not set" in res.stderr, res.stderr


# -- redaction from the parsed options ------------------------------------------------------

@pytest.mark.parametrize("words", [
    ["-eHF_TOKEN=" + SECRET], ["--env=HF_TOKEN=" + SECRET], ["-e", "HF_TOKEN=" + SECRET],
    ["--env", "HF_TOKEN=" + SECRET], ["-meHF_TOKEN=" + SECRET],
], ids=["attached", "equals", "short", "long", "combined-flags"])
def test_every_spelling_of_env_is_redacted(words):
    argv = ["dtrain", "run", *words, "train.py", "--lr", "3"]
    item = "HF_TOKEN=" + SECRET
    shown = redact_command(argv, [item], [("HF_TOKEN", SECRET)])
    assert SECRET not in " ".join(shown)
    assert any(w.endswith("HF_TOKEN=" + REDACTED) for w in shown), shown
    assert shown[-3:] == ["train.py", "--lr", "3"]


def test_a_secret_value_given_to_the_script_is_hidden_too():
    # the value came from an env file; the user also passed it to the script
    argv = ["dtrain", "run", "--env-file", "s.env", "train.py", "--token", SECRET]
    assert redact_command(argv, [], [("WANDB_API_KEY", SECRET)])[-1] == REDACTED
    # a value taken from the launcher's environment is hidden whatever its name
    assert redact_command(["x", "abc"], [], [("MY_VAR", "abc")], {"MY_VAR"}) == ["x", REDACTED]
    assert redact_env({"MY_VAR": "abc", "N": "1"}, {"MY_VAR"}) == {"MY_VAR": REDACTED, "N": "1"}


def test_the_plan_hides_a_secret_value_in_the_script_arguments():
    """plan.nodes[].command (meta.json, --dry-run text and JSON) redacts like the recorded
    command line: a word equal to a secret value, or ``--opt=VALUE``; torchrun's own words
    (counts, ports) are never rewritten, even when a secret happens to equal one."""
    from launcher.decide.runplan.plan import LaunchPlan, NodePlan, plan_json
    from launcher.models import Host
    from launcher.nodeside.wire import SHIM_PLACEHOLDER

    argv = ("python", "-m", "torch.distributed.run", "--nnodes", "1", SHIM_PLACEHOLDER,
            "train.py", SECRET, f"--token={SECRET}", "--lr", "1", "plain")
    env = (EnvVar("HF_TOKEN", SECRET, "--env", "user"), EnvVar("KEY", "1", "--env", "user"))
    node = NodePlan(Host("n1"), 0, 1, 0, "python", argv, env)
    plan = LaunchPlan((node,), "10.0.0.1", 29500, "probed", 1, "static")
    shown = plan.shown_argv(node)
    assert shown == (*argv[:7], REDACTED, f"--token={REDACTED}", "--lr", REDACTED, "plain")
    assert list(shown) == plan_json(plan)["nodes"][0]["command"]
    assert redact_command(["dtrain", "run", "train.py", f"--token={SECRET}"], [],
                          [("HF_TOKEN", SECRET)])[-1] == f"--token={REDACTED}"


def test_reasons_and_warnings_never_carry_a_secret_value():
    detected = [EnvVar("HF_TOKEN", "detected-secret", "detected", "x")]
    final, warnings = merge_env(detected, profile={"HF_TOKEN": "profile-secret"},
                                site={"HF_TOKEN": ("site-secret", "/etc/nccl.conf")},
                                user={"HF_TOKEN": SECRET})
    text = repr(final) + repr(warnings)
    for value in ("detected-secret", "profile-secret", "site-secret"):
        assert value not in text
    assert final["HF_TOKEN"].value == SECRET  # the rank still gets it
    assert SECRET not in final["HF_TOKEN"].reason


# -- env files and YAML env: bad input is file:line, exit 2 ---------------------------------

@pytest.mark.parametrize(("data", "message"), [
    (b"A=1\nB=x\x00y\n", "s.env:2: NUL byte"),
    (b"A=1\nB=caf\xe9\n", "s.env:2: not UTF-8 text"),
    (b'A=1\nHF_TOKEN="abc"def\n', "s.env:2: HF_TOKEN: text after the closing \" quote"),
    (b"A=1\nB='multi\nline'tail\n", "s.env:3: B: text after the closing ' quote"),
    (b"A=1\nHOSTNAME=x\n", "s.env:2: HOSTNAME is set by the node itself"),
    (b"A=1\nsk-pasted-secret\n", "s.env:2: expected NAME=VALUE"),
])
def test_bad_env_files_are_file_line_errors(tmp_path, data, message):
    path = tmp_path / "s.env"
    path.write_bytes(data)
    with pytest.raises(UsageError) as info:
        load_env_file(str(path))
    text = str(info.value)
    assert text.startswith(str(path.parent) + "/" + message), text
    assert info.value.exit_code == 2
    assert "def" not in text and "pasted" not in text and "tail" not in text


def test_a_comment_after_the_closing_quote_is_fine():
    assert parse_env_text('A="x y" # note\nB=\'z\'\n', "f") == [("A", "x y"), ("B", "z")]


@pytest.mark.parametrize(("env", "message"), [
    ("{HOSTNAME: x}", "HOSTNAME is set by the node itself"),
    ('{A: "x\\0y"}', "NUL byte"),
    ("{A: true}", "value must be a string, got a boolean"),
])
def test_bad_yaml_env_is_file_line(env, message):
    with pytest.raises(HostfileError, match=rf"^h.yaml:2: hosts\[0\].env.*{message}"):
        parse_hostfile_yaml(f"hosts:\n  - {{host: a, env: {env}}}\n", "h.yaml")


def test_env_file_nul_from_the_cli_is_exit_2_without_traceback(tmp_path):
    path = tmp_path / "s.env"
    path.write_bytes(b"A=\xff\xfe\n")
    res = dtrain(["run", "-H", "198.18.0.250", "--env-file", str(path), "t.py"], timeout=30)
    assert res.returncode == 2 and f"{path}:1: not UTF-8" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    with pytest.raises(ConfigError):
        load_env_file(str(path))


# -- the archive is private ----------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o000, 0o222, 0o077])
def test_archive_is_private_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        with RunArchive.create(tmp_path / "runs") as archive:
            archive.write_lines([OutputLine("n1", "out", "x", rank=0)])
            archive.update_meta(note="y")
        path = archive.path
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path): stat.S_IMODE(p.stat().st_mode)
             for p in [tmp_path / "runs", *(tmp_path / "runs").rglob("*")]}
    assert modes == {Path("runs"): 0o700, path.relative_to(tmp_path): 0o700,
                     path.relative_to(tmp_path) / "hosts": 0o700,
                     path.relative_to(tmp_path) / "hosts" / "n1.log": 0o600,
                     path.relative_to(tmp_path) / "output.jsonl": 0o600,
                     path.relative_to(tmp_path) / "meta.json": 0o600}


# -- on the cluster: every spelling, every place ----------------------------------------------

@pytest.mark.ssh
@pytest.mark.torch
def test_secrets_never_shown_in_meta_dry_run_or_messages(cluster, tmp_path):
    values = {name: f"{name.lower()}-{SECRET}" for name in
              ("HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "AWS_SECRET", "FROM_ENV", "F_TOKEN")}
    envfile = tmp_path / "s.env"
    envfile.write_text(f"F_TOKEN='{values['F_TOKEN']}'\n")
    names = list(values)
    args = ["run", "-H", "node1", "--python", cluster.python, "--nproc-per-node", "1",
            "--archive-dir", str(tmp_path / "runs"), "--no-color",
            f"-eHF_TOKEN={values['HF_TOKEN']}", f"--env=WANDB_API_KEY={values['WANDB_API_KEY']}",
            "-e", f"DB_PASSWORD={values['DB_PASSWORD']}", "--env",
            f"AWS_SECRET={values['AWS_SECRET']}", "--env", "FROM_ENV",
            "--env-file", str(envfile)]
    env = cluster.client_env(FROM_ENV=values["FROM_ENV"])
    outputs = []
    # the script is also given secret values as arguments: shown nowhere (plan included)
    script = ["tests/workloads/env_report.py", *names, values["HF_TOKEN"],
              f"--key={values['F_TOKEN']}"]
    for extra in (["--dry-run"], ["--dry-run", "--json"]):
        res = dtrain([*args, *extra, *script], env=env, timeout=150)
        assert res.returncode == 0, res.stderr
        outputs.append(res.stdout + res.stderr)
    plan = json.loads(res.stdout)
    assert plan["nodes"][0]["command"][-2:] == [REDACTED, f"--key={REDACTED}"]
    res = dtrain([*args, *script], env=env, timeout=150)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads(res.stdout.split("REPORT ", 1)[1].splitlines()[0])
    assert {n: report["env"][n] for n in names} == values  # the rank gets every real value
    (run,) = (tmp_path / "runs").iterdir()
    meta = (run / "meta.json").read_text()
    outputs += [meta, res.stderr, res.stdout.replace(res.stdout.split("REPORT ", 1)[1]
                                                     .splitlines()[0], "")]
    for text in outputs:
        for value in values.values():
            assert value not in text
    command = json.loads(meta)["command"]
    assert f"-eHF_TOKEN={REDACTED}" in command and f"--env=WANDB_API_KEY={REDACTED}" in command
    assert "FROM_ENV" in command


# -- each promise of text/redact.py, one by one (docs/security.md, "Secrets") --------------

from launcher.text.redact import (  # noqa: E402
    is_secret_name,
    redact_value,
    redact_words,
    secret_values,
)

PADDED = "dGhpcyBpcyBhIHRva2VuIQ=="  # a base64 secret: it ends in "="


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "WANDB_API_KEY", "APIKEY", "SSH_KEY", "KEY", "DB_PASS", "AWS_SECRET_ACCESS_KEY",
    "OAUTH", "GIT_CREDENTIALS", "GIT_CREDENTIAL", "DB_PASSWORD", "PGPASSWD", "AUTH",
    "MY_SECRET", "hf_token", "Wandb-Api-Key", "X.PASS", "MONKEY", "SSH_AUTH_SOCK",
])
def test_secret_looking_names_are_hidden(name):
    assert is_secret_name(name)
    assert redact_value(name, "v") == REDACTED
    assert redact_env([(name, "v"), ("N", "1")]) == {name: REDACTED, "N": "1"}


@pytest.mark.parametrize("name", [
    "KEYBOARD", "AUTHOR", "PASSTHROUGH", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "PATH",
    "PASSES", "TOKENIZERS_PARALLELISM", "SECRETARY", "CUDA_VISIBLE_DEVICES", "",
])
def test_ordinary_names_are_shown(name):
    assert not is_secret_name(name)
    assert redact_value(name, "v") == "v"
    assert redact_value(name, "v", hidden={name}) == REDACTED  # --env NAME: hidden anyway


def test_a_secret_value_ending_in_equals_is_hidden_everywhere():
    # base64 padding: `--token=VALUE` must lose VALUE even though VALUE itself holds "="
    assert redact_words([f"--token={PADDED}", PADDED, f"-t={PADDED}x", f"--opt=key={PADDED}"],
                        {PADDED}) == [f"--token={REDACTED}", REDACTED, f"-t={PADDED}x",
                                      f"--opt=key={REDACTED}"]
    # every "=" is a possible start, the first one and one right after another included
    assert redact_words(["=" + SECRET, "--t==" + SECRET], {SECRET}) == [
        f"={REDACTED}", f"--t=={REDACTED}"]
    argv = ["dtrain", "run", f"-eHF_TOKEN={PADDED}", "--env", f"WANDB_API_KEY={PADDED}",
            "train.py", f"--hub-token={PADDED}"]
    shown = redact_command(argv, [f"HF_TOKEN={PADDED}", f"WANDB_API_KEY={PADDED}"],
                           [("HF_TOKEN", PADDED), ("WANDB_API_KEY", PADDED)])
    assert shown == ["dtrain", "run", f"-eHF_TOKEN={REDACTED}", "--env",
                     f"WANDB_API_KEY={REDACTED}", "train.py", f"--hub-token={REDACTED}"]
    # a hidden (--env NAME) variable whose value holds "=", given again as NAME=VALUE
    assert redact_command(["-e", "MYVAR=a=b"], ["MYVAR=a=b"], [], {"MYVAR"}) == [
        "-e", f"MYVAR={REDACTED}"]


def test_only_secret_values_and_parsed_env_items_are_rewritten():
    # --env NAME (no value on the command line) stays as typed; ordinary options and values
    # (even one equal to a non-secret variable's value) stay; a value after another "=" is
    # found wherever the "=" is
    argv = ["dtrain", "run", "--env", "HF_TOKEN", "-e", "LR=0.1", "train.py", "--lr=0.1",
            "0.1", "--x=k=" + SECRET]
    shown = redact_command(argv, ["HF_TOKEN", "LR=0.1"],
                           [("HF_TOKEN", SECRET), ("LR", "0.1"), ("EMPTY_TOKEN", "")],
                           {"HF_TOKEN"})
    assert shown == ["dtrain", "run", "--env", "HF_TOKEN", "-e", "LR=0.1", "train.py",
                     "--lr=0.1", "0.1", f"--x=k={REDACTED}"]
    # an empty secret value hides nothing (every empty word would become ***)
    assert secret_values([("HF_TOKEN", ""), ("N", "x"), ("K_KEY", "v")]) == {"v"}
    assert redact_words(["", "a="], secret_values([("HF_TOKEN", "")])) == ["", "a="]


def test_what_redaction_does_not_claim_an_encoded_or_embedded_secret_is_not_recognised():
    # documented in docs/security.md: only a whole word, or the part after an "=", is
    # compared; a secret inside a URL or re-encoded (base64, %-escapes) is kept as given
    import base64
    import urllib.parse
    words = [f"https://u:{SECRET}@host/", f"--y={SECRET}=k",
             base64.b64encode(SECRET.encode()).decode(),
             urllib.parse.quote(SECRET + "/")]
    assert redact_words(words, {SECRET}) == words
