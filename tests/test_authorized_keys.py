"""authorized_keys rules, and the remote sh scripts held to the same rules (run locally)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from launcher.commands.authorized_keys import (
    PublicKey,
    add_key,
    authorizes,
    has_key,
    install_script,
    parse_report,
    remove_key,
    remove_script,
)

BLOB = "AAAAC3NzaC1lZDI1NTE5AAAAIEoswfkiVrq59SUX4DQX7nellJ7qaG3KwQ5zKIxHodew"
KEY = f"ssh-ed25519 {BLOB} dtrain-me@laptop"
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFf0R2y4bq5pCx3AZjWJtZ1WwJkq6h0I0N6wQ8hY9Xk1 admin"

ADD_CASES = [
    pytest.param("", f"{KEY}\n", True, id="empty-file"),
    pytest.param(f"{OTHER}\n", f"{OTHER}\n{KEY}\n", True, id="append"),
    pytest.param(OTHER, f"{OTHER}\n{KEY}\n", True, id="missing-trailing-newline"),
    pytest.param(f"{OTHER}\r\n", f"{OTHER}\r\n{KEY}\n", True, id="crlf-other-key"),
    pytest.param(f"{KEY}\n", f"{KEY}\n", False, id="present"),
    pytest.param(f"{KEY}", f"{KEY}", False, id="present-no-newline"),
    pytest.param(f"{KEY}\r\n", f"{KEY}\r\n", False, id="present-crlf"),
    pytest.param(f"ssh-ed25519 {BLOB}\r\n", f"ssh-ed25519 {BLOB}\r\n", False,
                 id="present-crlf-no-comment"),
    pytest.param(f"ssh-ed25519 {BLOB} other comment\n", f"ssh-ed25519 {BLOB} other comment\n",
                 False, id="present-other-comment"),
    pytest.param(f'from="10.0.0.0/8",no-pty ssh-ed25519 {BLOB} x\n',
                 f'from="10.0.0.0/8",no-pty ssh-ed25519 {BLOB} x\n', False,
                 id="present-with-options"),
    pytest.param(f"\tssh-ed25519\t{BLOB}\n", f"\tssh-ed25519\t{BLOB}\n", False,
                 id="present-tabs"),
    pytest.param(f"# {KEY}\n", f"# {KEY}\n{KEY}\n", True, id="commented-out-is-absent"),
    pytest.param(f"  #{KEY}\n", f"  #{KEY}\n{KEY}\n", True, id="indented-comment"),
    pytest.param(f"ssh-ed25519 {BLOB}X y\n", f"ssh-ed25519 {BLOB}X y\n{KEY}\n", True,
                 id="longer-blob-is-another-key"),
    pytest.param(f"{OTHER}\n\n# note\n", f"{OTHER}\n\n# note\n{KEY}\n", True,
                 id="blank-and-comment-kept"),
]

REMOVE_CASES = [
    pytest.param("", "", False, id="empty"),
    pytest.param(f"{OTHER}\n", f"{OTHER}\n", False, id="absent"),
    pytest.param(f"{OTHER}\n{KEY}\n", f"{OTHER}\n", True, id="last-line"),
    pytest.param(f"{KEY}\n{OTHER}", f"{OTHER}\n", True, id="first-line-no-final-newline"),
    pytest.param(f"{KEY}\n{OTHER}\n{KEY}\n", f"{OTHER}\n", True, id="duplicates"),
    pytest.param(f"{OTHER}\r\n{KEY}\r\n", f"{OTHER}\r\n", True, id="crlf"),
    pytest.param(f'command="true" ssh-ed25519 {BLOB}\n# {KEY}\n', f"# {KEY}\n", True,
                 id="options-removed-comment-kept"),
    pytest.param(f"# keep me\n\n{KEY}\n", "# keep me\n\n", True, id="blank-line-kept"),
]


@pytest.mark.parametrize(("text", "expected", "changed"), ADD_CASES)
def test_add_key(text: str, expected: str, changed: bool) -> None:
    assert add_key(text, KEY) == (expected, changed)


@pytest.mark.parametrize(("text", "expected", "changed"), REMOVE_CASES)
def test_remove_key(text: str, expected: str, changed: bool) -> None:
    assert remove_key(text, KEY) == (expected, changed)


def test_add_twice_is_one_line() -> None:
    once, _ = add_key(OTHER, KEY)
    twice, changed = add_key(once, KEY)
    assert not changed and twice.count(BLOB) == 1


def test_add_then_remove_restores_a_clean_file() -> None:
    text = f"{OTHER}\n# note\n"
    assert remove_key(add_key(text, KEY)[0], KEY) == (text, True)


def test_authorizes_ignores_comments_and_substrings() -> None:
    assert authorizes(KEY, BLOB)
    assert not authorizes(f"#{KEY}", BLOB)
    assert not authorizes(f"ssh-ed25519 x{BLOB}", BLOB)
    assert has_key(f"{OTHER}\n{KEY}", BLOB)


@pytest.mark.parametrize("text", [
    pytest.param("", id="empty"),
    pytest.param("ssh-ed25519", id="no-blob"),
    pytest.param("hello world", id="not-a-key"),
    pytest.param(f"ssh-ed25519 {BLOB}\nssh-rsa AAAA", id="two-lines"),
    pytest.param("ssh-ed25519 AAAA'$(reboot)'", id="bad-base64"),
])
def test_public_key_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        PublicKey.parse(text)


def test_public_key_parse() -> None:
    key = PublicKey.parse(f"  ssh-ed25519 {BLOB}  a comment with spaces \n")
    assert (key.algorithm, key.blob, key.comment) == ("ssh-ed25519", BLOB, "a comment with spaces")
    assert key.line == f"ssh-ed25519 {BLOB} a comment with spaces"
    assert PublicKey.parse(f"ssh-ed25519 {BLOB}").line == f"ssh-ed25519 {BLOB}"


@pytest.mark.parametrize(("stdout", "state", "error", "warnings"), [
    pytest.param("dtrain-keys: installed\n", "installed", "", (), id="installed"),
    pytest.param("motd junk\ndtrain-keys: warning: w1\ndtrain-keys: present\n", "present", "",
                 ("w1",), id="junk-and-warning"),
    pytest.param("dtrain-keys: error: cannot write x\n", "error", "cannot write x", (),
                 id="error"),
    pytest.param("", "error", "no result from the script", (), id="nothing"),
])
def test_parse_report(stdout: str, state: str, error: str, warnings: tuple[str, ...]) -> None:
    report = parse_report(stdout)
    assert (report.state, report.error, report.warnings) == (state, error, warnings)


# --------------------------------------------------------------------------- the sh scripts

SHELLS = [sh for sh in ("sh", "dash", "bash", "busybox") if shutil.which(sh)]


def run_script(script: str, home: Path, shell: str = "sh") -> str:
    argv = [shell, "sh", "-s"] if shell == "busybox" else [shell, "-s"]
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    proc = subprocess.run(argv, input=script, capture_output=True, text=True, env=env,
                          timeout=10, check=False)
    assert proc.stderr == ""
    return proc.stdout


def write_keys(home: Path, text: str | None) -> Path:
    path = home / ".ssh" / "authorized_keys"
    if text is not None:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_bytes(text.encode())
    return path


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("text", "expected", "changed"), ADD_CASES)
def test_install_script_matches_add_key(tmp_path: Path, shell: str, text: str, expected: str,
                                        changed: bool) -> None:
    path = write_keys(tmp_path, text)
    report = parse_report(run_script(install_script(PublicKey.parse(KEY)), tmp_path, shell))
    assert report.state == ("installed" if changed else "present")
    assert path.read_bytes().decode() == expected
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("text", "expected", "changed"), REMOVE_CASES)
def test_remove_script_matches_remove_key(tmp_path: Path, shell: str, text: str,
                                          expected: str, changed: bool) -> None:
    path = write_keys(tmp_path, text)
    report = parse_report(run_script(remove_script(PublicKey.parse(KEY)), tmp_path, shell))
    assert report.state == ("removed" if changed else "absent")
    assert path.read_bytes().decode() == expected
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind


def test_install_script_from_nothing(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    report = parse_report(run_script(install_script(PublicKey.parse(KEY)), tmp_path))
    assert (report.state, report.warnings) == ("installed", ())
    ssh = tmp_path / ".ssh"
    assert stat.S_IMODE(ssh.stat().st_mode) == 0o700
    path = ssh / "authorized_keys"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == KEY + "\n"
    again = parse_report(run_script(install_script(PublicKey.parse(KEY)), tmp_path))
    assert again.state == "present" and path.read_text() == KEY + "\n"


def test_install_script_fixes_modes(tmp_path: Path) -> None:
    path = write_keys(tmp_path, f"{KEY}\n")
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o644)
    assert parse_report(run_script(install_script(PublicKey.parse(KEY)), tmp_path)).state \
        == "present"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_install_script_warns_about_writable_home(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o775)
    report = parse_report(run_script(install_script(PublicKey.parse(KEY)), tmp_path))
    assert report.state == "installed"
    assert report.warnings and "StrictModes" in report.warnings[0]


def test_install_script_reports_errors(tmp_path: Path) -> None:
    (tmp_path / ".ssh").write_text("not a directory")
    report = parse_report(run_script(install_script(PublicKey.parse(KEY)), tmp_path))
    assert report.state == "error" and "not a directory" in report.error


def test_script_quotes_a_hostile_comment(tmp_path: Path) -> None:
    key = PublicKey.parse(f"ssh-ed25519 {BLOB} it's $(touch {tmp_path}/pwned) `x`")
    report = parse_report(run_script(install_script(key), tmp_path))
    assert report.state == "installed"
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / ".ssh" / "authorized_keys").read_text() == key.line + "\n"


def test_scripts_need_no_python() -> None:
    for script in (install_script(PublicKey.parse(KEY)), remove_script(PublicKey.parse(KEY))):
        assert "python" not in script


# ------------------------------------------------------------- links, temp files, shared homes


def _bin(tmp_path: Path, **tools: str) -> str:
    """A PATH whose first directory holds these wrapper scripts (name -> sh body)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in tools.items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def _run(home: Path, path: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={"HOME": str(home), "PATH": path})


@pytest.mark.parametrize("script", [install_script, remove_script], ids=["setup", "revoke"])
@pytest.mark.parametrize("has_key", [True, False], ids=["with-key", "without-key"])
def test_a_symlinked_authorized_keys_is_refused_by_both(tmp_path: Path, script, has_key: bool
                                                        ) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    target = tmp_path / "elsewhere"
    before = f"{KEY}\n" if has_key else "ssh-ed25519 AAAAother x\n"
    target.write_text(before)
    (home / ".ssh" / "authorized_keys").symlink_to(target)
    report = parse_report(run_script(script(PublicKey.parse(KEY)), home))
    assert report.state == "error"
    assert report.error.startswith(f"{home}/.ssh/authorized_keys is a symbolic link")
    assert target.read_text() == before
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["authorized_keys"]


def test_nodes_sharing_a_home_add_the_key_once(tmp_path: Path) -> None:
    # NFS: every node runs the script at the same moment on the same file. A slow awk widens
    # the window between "is the key there?" and the append, as a busy NFS server does.
    path = _bin(tmp_path, awk=f'sleep 0.2; exec {shutil.which("awk")} "$@"')
    home = tmp_path / "home"
    home.mkdir()
    write_keys(home, "ssh-ed25519 AAAAother x\n")
    procs = [_run(home, path) for _ in range(6)]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(install_script(PublicKey.parse(KEY)))
        proc.stdin.close()
    states = []
    for proc in procs:
        assert proc.wait(30) == 0
        assert proc.stdout is not None
        states.append(parse_report(proc.stdout.read()).state)
    assert sorted(states) == ["installed"] + ["present"] * 5
    text = (home / ".ssh" / "authorized_keys").read_text()
    assert text == f"ssh-ed25519 AAAAother x\n{KEY}\n"
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["authorized_keys"]


def test_revoke_and_setup_at_once_keep_one_consistent_file(tmp_path: Path) -> None:
    path = _bin(tmp_path, awk=f'sleep 0.2; exec {shutil.which("awk")} "$@"')
    home = tmp_path / "home"
    home.mkdir()
    other = "ssh-ed25519 AAAAother x"
    write_keys(home, f"{other}\n{KEY}\n")
    second = PublicKey.parse(f"ssh-ed25519 {BLOB[:-8]}AAAAAAAA second")
    procs = [_run(home, path) for _ in range(2)]
    for proc, script in zip(procs, [remove_script(PublicKey.parse(KEY)), install_script(second)],
                            strict=True):
        assert proc.stdin is not None
        proc.stdin.write(script)
        proc.stdin.close()
    assert [proc.wait(30) for proc in procs] == [0, 0]
    lines = (home / ".ssh" / "authorized_keys").read_text().splitlines()
    assert sorted(lines) == sorted([other, second.line])


@pytest.mark.parametrize("mktemp", [True, False], ids=["mktemp", "noclobber"])
def test_revoke_temp_file_is_unpredictable_and_in_ssh_dir(tmp_path: Path, mktemp: bool) -> None:
    log = tmp_path / "mv.log"
    tools = {"mv": f'printf "%s\\n" "$@" >>{log}; exec {shutil.which("mv")} "$@"'}
    if not mktemp:
        tools["mktemp"] = "exit 1"  # as if there were none: the noclobber fallback
    path = _bin(tmp_path, **tools)
    home = tmp_path / "home"
    home.mkdir()
    keys = write_keys(home, f"a b\n{KEY}\n")
    for _ in range(2):
        keys.write_text(f"a b\n{KEY}\n")
        proc = _run(home, path)
        out, _ = proc.communicate(remove_script(PublicKey.parse(KEY)), timeout=30)
        assert parse_report(out).state == "removed"
    moved = log.read_text().splitlines()
    sources = [moved[i] for i in range(len(moved)) if moved[i] != "-f" and i + 1 < len(moved)
               and moved[i + 1] == str(keys)]
    assert len(sources) == 2 and sources[0] != sources[1]
    for src in sources:
        assert Path(src).parent == keys.parent
        assert Path(src).name.startswith(".authorized_keys.dtrain.")
    assert keys.read_text() == "a b\n"
    assert sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys"]
