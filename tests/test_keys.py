"""dtrain keys: the local key file, the login rules, and setup/check/revoke on the real cluster."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import pytest

from launcher.commands.authorized_keys import PublicKey, remove_key
from launcher.commands.keypair import Secret, default_key_path, ensure_keypair
from launcher.commands.keys import (
    KeyResult,
    _Client,
    _Nodes,
    keys_report,
)
from launcher.errors import AuthError, UsageError
from launcher.models import Host
from launcher.output.junit import to_junit
from launcher.output.report import to_json
from launcher.transports.ssh import HostKeyPolicy, SSHSettings
from tests.cluster import Cluster, Node
from tests.reports import one_json_document, validate_json, validate_junit
from tests.util import assert_exit, dtrain, on_pty

# --------------------------------------------------------------------------- the local key


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ensure_keypair_creates_owner_only_files(tmp_path: Path) -> None:
    old = os.umask(0)  # a careless umask must not leak the private key, even briefly
    try:
        pair = ensure_keypair(default_key_path(tmp_path))
    finally:
        os.umask(old)
    assert pair.created
    assert pair.private == tmp_path / ".ssh" / "id_ed25519_dtrain"
    assert mode(tmp_path / ".ssh") == 0o700
    assert mode(pair.private) == 0o600
    assert mode(pair.public) == 0o644
    assert pair.key.algorithm == "ssh-ed25519"
    assert PublicKey.parse(pair.public.read_text()) == pair.key
    assert pair.fingerprint.startswith("SHA256:")
    again = ensure_keypair(pair.private)
    assert not again.created and again.key == pair.key


def test_ensure_keypair_keeps_an_existing_pub_comment(tmp_path: Path) -> None:
    pair = ensure_keypair(tmp_path / "k")
    pair.public.write_text(f"{pair.key.algorithm} {pair.key.blob} my laptop\n")
    assert ensure_keypair(tmp_path / "k").key.comment == "my laptop"


def test_ensure_keypair_rewrites_a_missing_pub(tmp_path: Path) -> None:
    pair = ensure_keypair(tmp_path / "k")
    pair.public.unlink()
    assert ensure_keypair(tmp_path / "k").key.blob == pair.key.blob
    assert pair.public.exists()


def test_ensure_keypair_refuses_a_readable_private_key(tmp_path: Path) -> None:
    pair = ensure_keypair(tmp_path / "k")
    os.chmod(pair.private, 0o644)
    with pytest.raises(UsageError, match="readable by others") as info:
        ensure_keypair(pair.private)
    assert info.value.hint == f"chmod 600 {pair.private}"


def test_ensure_keypair_refuses_a_mismatched_pub(tmp_path: Path) -> None:
    pair = ensure_keypair(tmp_path / "k")
    other = ensure_keypair(tmp_path / "other")
    pair.public.write_text(other.key.line + "\n")
    with pytest.raises(UsageError, match="does not belong"):
        ensure_keypair(pair.private)


def test_ensure_keypair_refuses_an_encrypted_key(tmp_path: Path) -> None:
    path = tmp_path / "enc"
    key = asyncssh.generate_private_key("ssh-ed25519")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:  # PKCS#8: the openssh format would need bcrypt
        f.write(key.export_private_key("pkcs8-pem", passphrase="pw"))
    with pytest.raises(UsageError, match="passphrase") as info:
        ensure_keypair(path)
    assert "pw" not in str(info.value).replace("passphrase", "")


def test_secret_never_shows() -> None:
    secret = Secret("hunter2")
    assert "hunter2" not in repr(secret) and "hunter2" not in str(secret)
    assert "hunter2" not in repr([secret]) and secret.reveal() == "hunter2"


def test_key_result_json() -> None:
    assert KeyResult("n1", "installed").to_json() == {"host": "n1", "status": "installed",
                                                      "detail": ""}
    assert not KeyResult("n1", "failed", "x").ok and KeyResult("n1", "present").ok


def test_keys_report_document_and_junit(tmp_path: Path) -> None:
    pair = ensure_keypair(default_key_path(tmp_path))
    results = [KeyResult("n1", "installed", "", True), KeyResult("n2", "present", "", True),
               KeyResult("n3", "failed", "the key is not accepted", True),
               KeyResult("n4", "failed", "timed out connecting after 2 s", False)]
    rep = keys_report("setup", results, pair, "4 nodes: ...", 1.0, 2.5)
    doc = to_json(rep)
    validate_json(doc, "keys")
    assert doc["schema"] == "dtrain.keys/1" and doc["exit_code"] == 1
    assert doc["keys"]["action"] == "setup" and doc["keys"]["key"] == str(pair.private)
    assert doc["keys"]["results"][2] == {"host": "n3", "status": "failed",
                                         "detail": "the key is not accepted"}
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert {h: n["status"] for h, n in nodes.items()} == {
        "n1": "passed", "n2": "passed", "n3": "failed", "n4": "error"}
    assert nodes["n1"]["details"] == {"state": "installed", "reachable": True,
                                      "key": "installed", "error": None}
    assert nodes["n2"]["details"]["key"] == "present"
    assert nodes["n4"]["details"] == {"state": "failed", "reachable": False, "key": None,
                                      "error": "timed out connecting after 2 s"}
    assert doc["root_cause"]["host"] == "n3" and doc["root_cause"]["kind"] == "node"
    cases = {c.get("name"): c for c in validate_junit(to_junit(rep)).iter("testcase")}
    assert set(cases) == {"n1", "n2", "n3", "n4"}
    assert cases["n3"].find("failure").get("message") == "the key is not accepted"
    assert cases["n4"].find("error") is not None and cases["n1"].find("failure") is None
    assert "exit code" not in cases["n3"].find("failure").text  # keys has no node exit codes
    ok = to_json(keys_report("check", results[:2], pair, "2 nodes", 1.0, 2.0))
    validate_json(ok, "keys")
    assert ok["outcome"] == "ok" and ok["root_cause"] is None


def test_keys_table_colour_follows_the_shared_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """FORCE_COLOR colours a pipe (the rich table); NO_COLOR wins over it."""
    import io

    from launcher.cli.keys import _table

    rows = [KeyResult("node1", "ok", "key login works")]
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    forced = io.StringIO()
    _table(rows, forced)
    assert "\x1b[" in forced.getvalue() and "node1" in forced.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = io.StringIO()
    _table(rows, plain)
    assert plain.getvalue() == "node1  ok  key login works\n"


def test_cli_keys_does_not_import_asyncssh() -> None:
    code = "import sys, launcher.cli, launcher.cli.keys; print('asyncssh' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


# --------------------------------------------------------------------------- one password try


def client(password: str | None = "pw") -> _Client:
    policy = HostKeyPolicy(Path("/nonexistent/known_hosts"), accept_new=False)
    return _Client(policy, Secret(password) if password is not None else None)


def test_kbdint_answers_a_hidden_prompt_once() -> None:
    c = client()
    assert c.kbdint_auth_requested() == ""
    assert c.kbdint_challenge_received("", "", "", []) == []  # PAM message rounds
    assert c.kbdint_challenge_received("", "", "", [("Passwort: ", False)]) == ["pw"]
    assert c.kbdint_challenge_received("", "", "", [("Password: ", False)]) is None
    assert c.password_auth_requested() is None  # no second try by the other method
    assert c.kbdint_auth_requested() is None


def test_password_method_then_no_kbdint() -> None:
    c = client()
    assert c.password_auth_requested() == "pw"
    assert c.kbdint_auth_requested() is None


@pytest.mark.parametrize("prompts", [
    pytest.param([("Verification code: ", True)], id="echoed-question"),
    pytest.param([("Password: ", False), ("OTP: ", False)], id="two-prompts"),
    pytest.param([("Verification code: ", False)], id="hidden-otp"),
    pytest.param([("One-time password (OATH) for `dtuser': ", False)], id="oath"),
    pytest.param([("New password: ", False)], id="password-change"),
    pytest.param([("Passcode or option (1-3): ", False)], id="duo"),
])
def test_kbdint_declines_what_is_not_a_password(prompts: list[tuple[str, bool]]) -> None:
    c = client()
    assert c.kbdint_challenge_received("", "", "", prompts) is None
    assert not c.password_sent


def test_no_password_means_no_password_methods() -> None:
    c = client(None)
    assert c.kbdint_auth_requested() is None and c.password_auth_requested() is None


# --------------------------------------------------------------------------- in-process sshd
# Only for what real sshd in the cluster cannot be told to do per test: offer exactly one
# method (the cluster's PAM setup always picks keyboard-interactive first).


@dataclass
class _Tries:
    password: list[str] = field(default_factory=list)
    kbdint: list[str] = field(default_factory=list)


class _Server(asyncssh.SSHServer):
    def __init__(self, method: str, tries: _Tries, prompt: str = "Mot de passe : ") -> None:
        self.method, self.tries, self.prompt = method, tries, prompt

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return self.method == "password"

    def validate_password(self, username: str, password: str) -> bool:
        self.tries.password.append(password)
        return password == "right"

    def kbdint_auth_supported(self) -> bool:
        return self.method == "kbdint"

    def get_kbdint_challenge(self, username: str, lang: str, submethods: str
                             ) -> tuple[str, str, str, list[tuple[str, bool]]]:
        return "", "", "", [(self.prompt, False)]

    def validate_kbdint_response(self, username: str, responses: Sequence[str]) -> bool:
        self.tries.kbdint.extend(responses)
        return list(responses) == ["right"]


async def _login(tmp_path: Path, method: str, password: str, prompt: str = "Mot de passe : "
                 ) -> tuple[_Tries, Exception | None]:
    tries = _Tries()
    server = await asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[asyncssh.generate_private_key("ssh-ed25519")],
        server_factory=lambda: _Server(method, tries, prompt))
    port = server.sockets[0].getsockname()[1]
    settings = SSHSettings(connect_timeout=5, accept_new=True, home=tmp_path)
    nodes = _Nodes(settings, ensure_keypair(tmp_path / "k"), fanout=1)
    policy = nodes.policy(Host("127.0.0.1", user="u", port=port))
    c = _Client(policy, Secret(password))
    error: Exception | None = None
    try:
        conn = await nodes.connect(Host("127.0.0.1", user="u", port=port), c, policy,
                                   key_only=False)
        conn.close()
    except AuthError as exc:
        error = exc
    finally:
        server.close()
    return tries, error


@pytest.mark.parametrize("method", ["password", "kbdint"])
async def test_password_login_by_either_method(tmp_path: Path, method: str) -> None:
    tries, error = await _login(tmp_path, method, "right")
    assert error is None
    assert (tries.password, tries.kbdint) == ((["right"], []) if method == "password"
                                              else ([], ["right"]))


@pytest.mark.parametrize("method", ["password", "kbdint"])
async def test_wrong_password_is_tried_once(tmp_path: Path, method: str) -> None:
    tries, error = await _login(tmp_path, method, "s3cr3t-guess")
    assert isinstance(error, AuthError) and "wrong password" in error.message
    assert len(tries.password) + len(tries.kbdint) == 1
    assert "s3cr3t" not in str(error) and "s3cr3t" not in repr(error.__cause__)


async def test_an_otp_prompt_never_gets_the_password(tmp_path: Path) -> None:
    tries, error = await _login(tmp_path, "kbdint", "s3cr3t", prompt="Verification code: ")
    assert tries.kbdint == [] and tries.password == []
    assert isinstance(error, AuthError)
    assert "'Verification code:'" in error.message and "not a password prompt" in error.message
    assert "s3cr3t" not in str(error)


# --------------------------------------------------------------------------- real sshd


@dataclass
class KeysEnv:
    """A fresh client HOME (empty ~/.ssh) against the 4-node cluster."""

    cluster: Cluster
    home: Path
    hosts: str
    outputs: list[str] = field(default_factory=list)

    @property
    def ssh(self) -> Path:
        return self.home / ".ssh"

    @property
    def key_path(self) -> Path:
        return self.ssh / "id_ed25519_dtrain"

    @property
    def known_hosts(self) -> Path:
        return self.ssh / "known_hosts"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("NCCL_", "GLOO_", "DTRAIN_", "SSH_AUTH_SOCK"))}
        env.update(HOME=str(self.home), NO_COLOR="1")
        return env

    def dtrain(self, *args: str, stdin: str | None = None, hosts: str | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cut = args.index("--") if "--" in args else len(args)
        argv = [sys.executable, "-m", "launcher", *args[:cut], "-H", hosts or self.hosts,
                *args[cut:]]
        proc = subprocess.run(argv, input=stdin, stdin=None if stdin is not None
                              else subprocess.DEVNULL, capture_output=True, text=True,
                              env=self.env(), timeout=timeout, check=False)
        self.outputs += [proc.stdout, proc.stderr]
        return proc


def _node_keys(node: Node) -> Path:
    return node.home / ".ssh" / "authorized_keys"


def _write_in_place(path: Path, text: str) -> None:
    """Keep inode, owner and mode: the file is bind-mounted into the node."""
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()


@pytest.fixture
def keys_env(cluster: Cluster, tmp_path: Path) -> Iterator[KeysEnv]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    hosts = ",".join(f"{cluster.user}@{n.ip}" for n in cluster.nodes)
    before = {n.index: _node_keys(n).read_text() for n in cluster.nodes}
    env = KeysEnv(cluster, home, hosts)
    yield env
    # Remove only this test's key, so a concurrent test's edits survive; the result must be
    # the file as it was, with the cluster's own key still in it.
    for node in cluster.nodes:
        path = _node_keys(node)
        if env.key_path.with_suffix(".pub").exists():
            line = env.key_path.with_suffix(".pub").read_text()
            text, changed = remove_key(path.read_text(), line)
            if changed:
                _write_in_place(path, text)
        assert path.read_text() == before[node.index]
    for text in env.outputs:
        assert cluster.password not in text


def _results(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    """The dtrain.keys/1 document's results (validated against its schema)."""
    doc = one_json_document(proc.stdout)
    validate_json(doc, "keys")
    return {r["host"]: r for r in doc["keys"]["results"]}


def _statuses(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {host: r["status"] for host, r in _results(proc).items()}


def _assert_node_files(cluster: Cluster, blob: str) -> None:
    uid = pwd.getpwnam(cluster.user).pw_uid
    for node in cluster.nodes:
        path = _node_keys(node)
        assert path.read_text().count(blob) == 1, node.name
        assert mode(path.parent) == 0o700 and mode(path) == 0o600
        assert path.parent.stat().st_uid == uid and path.stat().st_uid == uid


@pytest.mark.ssh
def test_setup_from_nothing_then_again_then_revoke(keys_env: KeysEnv) -> None:
    cluster = keys_env.cluster
    ips = [n.ip for n in cluster.nodes]
    before = keys_env.dtrain("keys", "check")
    assert_exit(before, 2)
    assert "no key at" in before.stderr

    t0 = time.monotonic()
    junit = keys_env.home / "keys.xml"
    first = keys_env.dtrain("keys", "setup", "--password-stdin", "--accept-new", "--json",
                            "--junit", str(junit), stdin=cluster.password + "\n")
    took = time.monotonic() - t0
    assert first.returncode == 0, first.stderr
    assert _statuses(first) == dict.fromkeys(ips, "installed")
    doc = one_json_document(first.stdout)
    assert doc["keys"]["action"] == "setup" and doc["outcome"] == "ok"
    assert all(n["details"]["key"] == "installed" and n["details"]["reachable"]
               for n in doc["nodes"])
    cases = {c.get("name"): c for c in validate_junit(junit.read_text()).iter("testcase")}
    assert set(cases) == set(ips) and all(len(c) == 0 for c in cases.values())
    assert cluster.password not in first.stdout + junit.read_text()
    assert "created" in first.stderr and took < 20
    assert "--accept-new: recorded 4 new host key(s)" in first.stderr
    assert all(f"{ip}  ssh-ed25519  SHA256:" in first.stderr for ip in ips)
    assert mode(keys_env.ssh) == 0o700 and mode(keys_env.key_path) == 0o600
    blob = PublicKey.parse(keys_env.key_path.with_suffix(".pub").read_text()).blob
    _assert_node_files(cluster, blob)

    again = keys_env.dtrain("keys", "setup", "--json")  # no password, no --accept-new
    assert again.returncode == 0, again.stderr
    assert _statuses(again) == dict.fromkeys(ips, "present")
    assert {n["details"]["key"] for n in one_json_document(again.stdout)["nodes"]} == {
        "present"}
    _assert_node_files(cluster, blob)

    check = keys_env.dtrain("keys", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(" ok ") == 4
    # keys takes the connection group's -o too (issue 23 item 5): nothing listens on port 1
    moved = keys_env.dtrain("keys", "check", "-o", "Port=1", "-t", "3")
    assert moved.returncode == 1 and moved.stdout.count(" ok ") == 0, moved.stdout

    exec_ = keys_env.dtrain("exec", "--", "hostname")
    assert exec_.returncode == 0, exec_.stderr
    assert sorted(exec_.stdout.split()[1::2]) == ["node1", "node2", "node3", "node4"]

    ssh = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(keys_env.key_path), "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={keys_env.known_hosts}", "-o", "IdentitiesOnly=yes",
         f"{cluster.user}@{ips[0]}", "true"],
        capture_output=True, text=True, timeout=30, env=keys_env.env(), check=False)
    assert ssh.returncode == 0, ssh.stderr

    revoke = keys_env.dtrain("keys", "revoke", "--json")
    assert _statuses(revoke) == dict.fromkeys(ips, "removed"), revoke.stderr
    for node in cluster.nodes:
        assert blob not in _node_keys(node).read_text()
    after = keys_env.dtrain("keys", "check", "--json")
    assert_exit(after, 1)
    assert _statuses(after) == dict.fromkeys(ips, "failed")


@pytest.mark.ssh
def test_wrong_password_fails_fast_and_clearly(keys_env: KeysEnv) -> None:
    t0 = time.monotonic()
    junit = keys_env.home / "keys.xml"
    proc = keys_env.dtrain("keys", "setup", "--password-stdin", "--accept-new", "--json",
                           "--junit", str(junit), stdin="not-the-password\n")
    took = time.monotonic() - t0
    assert_exit(proc, 1)
    for result in _results(proc).values():
        assert result["status"] == "failed"
        assert "authentication failed: wrong password" in result["detail"]
    assert took < 15  # PAM's own delay (~2-3 s), once: no retries
    xml = junit.read_text()
    assert xml.count("<failure") == 4 and "wrong password" in xml
    assert "not-the-password" not in proc.stdout + proc.stderr + xml


@pytest.mark.ssh
def test_a_keyed_node_needs_no_password(keys_env: KeysEnv) -> None:
    cluster = keys_env.cluster
    pair = ensure_keypair(keys_env.key_path)
    node2 = cluster.node(2)
    path = _node_keys(node2)
    _write_in_place(path, path.read_text() + pair.key.line + "\n")
    hosts = f"{cluster.user}@{node2.ip}"
    proc = keys_env.dtrain("keys", "setup", "--accept-new", "--json", hosts=hosts)
    assert proc.returncode == 0, proc.stderr
    assert _statuses(proc) == {node2.ip: "present"}
    assert "Password" not in proc.stderr
    assert path.read_text().count(pair.key.blob) == 1

    node3 = cluster.node(3)
    mixed = keys_env.dtrain("keys", "setup", "--accept-new", "--json", "--password-stdin",
                            stdin=cluster.password + "\n",
                            hosts=f"{hosts},{cluster.user}@{node3.ip}")
    assert mixed.returncode == 0, mixed.stderr
    assert _statuses(mixed) == {node2.ip: "present", node3.ip: "installed"}


BOGUS = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFf0R2y4bq5pCx3AZjWJtZ1WwJkq6h0I0N6wQ8hY9Xk1"


@pytest.mark.ssh
def test_changed_host_key_is_refused_and_kept(keys_env: KeysEnv) -> None:
    cluster = keys_env.cluster
    node1 = cluster.node(1)
    keys_env.ssh.mkdir(mode=0o700)
    keys_env.known_hosts.write_text(f"{node1.ip} {BOGUS}\n")
    proc = keys_env.dtrain("keys", "setup", "--password-stdin", "--accept-new", "--json",
                           stdin=cluster.password + "\n")
    assert_exit(proc, 1)
    results = _results(proc)
    assert results[node1.ip]["status"] == "failed"
    assert "HOST KEY CHANGED" in results[node1.ip]["detail"]
    assert "WARNING" in proc.stderr and node1.ip in proc.stderr
    assert [r["status"] for h, r in results.items() if h != node1.ip] == ["installed"] * 3
    lines = keys_env.known_hosts.read_text().splitlines()
    assert [ln for ln in lines if ln.split()[0] == node1.ip] == [f"{node1.ip} {BOGUS}"]
    assert len(lines) == 4  # the other three were accepted as new
    assert PublicKey.parse(keys_env.key_path.with_suffix(".pub").read_text()).blob \
        not in _node_keys(node1).read_text()


@pytest.mark.ssh
def test_unknown_host_keys_need_a_terminal_or_accept_new(keys_env: KeysEnv) -> None:
    cluster = keys_env.cluster
    proc = keys_env.dtrain("keys", "setup", "--password-stdin", "--json",
                           stdin=cluster.password + "\n")
    assert_exit(proc, 1)
    for result in _results(proc).values():
        assert result["status"] == "failed"
        assert "unknown host key ssh-ed25519 SHA256:" in result["detail"]
    assert "--accept-new" in proc.stderr
    assert not keys_env.known_hosts.exists()


@pytest.mark.ssh
def test_interactive_confirm_and_hidden_password(keys_env: KeysEnv) -> None:
    cluster = keys_env.cluster
    argv = [sys.executable, "-m", "launcher", "keys", "setup", "-H", keys_env.hosts]
    code, raw = on_pty(argv, keys_env.env(), stdin=True, answers=[
        (b"[y/N]", b"y\n"),
        (b"(asked once): ", cluster.password.encode() + b"\n"),
        (b".ssh/config? [y/N]", b"\n"),  # issue 40.7: asked first; the default is no
    ])
    out = raw.decode(errors="replace")
    keys_env.outputs.append(out)
    assert code == 0, out
    assert "4 host key(s) not in" in out and out.count("SHA256:") >= 4
    assert "Password for dtuser@198.18.0.[11-14]" in out
    assert "4 installed" in out
    assert "Add a Host block for 198.18.0.[11-14] with IdentityFile" in out
    assert not (keys_env.ssh / "config").exists()  # no consent, no file
    known = keys_env.known_hosts.read_text()
    for node in cluster.nodes:
        host_key = (node.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        assert f"{node.ip} {' '.join(host_key)}" in known


@pytest.mark.ssh
def test_check_json_and_junit_name_the_unreachable_node(cluster: Cluster, tmp_path: Path
                                                        ) -> None:
    junit = tmp_path / "keys.xml"
    far = "198.18.0.9"  # never a node
    res = dtrain(["keys", "check", "-H", f"node[1-2],{cluster.user}@{far}", "--identity",
                  str(cluster.identity), "--connect-timeout", "2", "--json", "--junit",
                  str(junit)], env=cluster.client_env(GITHUB_ACTIONS="true"), timeout=60)
    assert_exit(res, 1)
    doc = one_json_document(res.stdout)
    validate_json(doc, "keys")
    assert doc["keys"]["action"] == "check"
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert {h: n["status"] for h, n in nodes.items()} == {
        "node1": "passed", "node2": "passed", far: "error"}
    assert nodes["node1"]["details"] == {"state": "ok", "reachable": True, "key": "accepted",
                                         "error": None}
    assert nodes[far]["details"]["reachable"] is False
    assert "timed out" in nodes[far]["details"]["error"]
    assert doc["root_cause"]["host"] == far and doc["root_cause"]["kind"] == "unreachable"
    assert f"::error title=dtrain%3A host {far}::dtrain keys: " in res.stderr
    assert "host node1" not in res.stderr
    assert f"{far}  failed" in res.stderr  # the table went to stderr
    cases = {c.get("name"): c for c in validate_junit(junit.read_text()).iter("testcase")}
    assert set(cases) == {"node1", "node2", far}
    error = cases[far].find("error")
    assert error is not None and "timed out" in error.get("message")
    assert cases["node1"].find("error") is None and cases["node1"].find("failure") is None


@pytest.mark.ssh
def test_setup_says_how_plain_ssh_uses_the_key_and_adds_it_only_when_asked(
        keys_env: KeysEnv) -> None:
    """Issue 40.7: keys setup names its key for plain ssh/pdsh/rsync; --ssh-config adds a
    Host block with IdentityFile to ~/.ssh/config (never without consent), once."""
    cluster = keys_env.cluster
    config = keys_env.ssh / "config"
    first = keys_env.dtrain("keys", "setup", "--password-stdin", "--accept-new",
                            stdin=cluster.password + "\n")
    assert first.returncode == 0, first.stderr
    assert f"ssh -i {keys_env.key_path}" in first.stderr and "--ssh-config" in first.stderr
    assert not config.exists()  # not asked (no terminal), so not added
    added = keys_env.dtrain("keys", "setup", "--ssh-config")
    assert added.returncode == 0, added.stderr
    assert f"added to {config}" in added.stderr
    assert mode(config) == 0o600 and mode(keys_env.ssh) == 0o700
    text = config.read_text()
    assert "Host 198.18.0.11 198.18.0.12 198.18.0.13 198.18.0.14\n" in text
    assert f"    IdentityFile {keys_env.key_path}\n" in text
    # plain OpenSSH with that config (and nothing else) now logs in with the key
    ssh = subprocess.run(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o",
         f"UserKnownHostsFile={keys_env.known_hosts}", f"{cluster.user}@198.18.0.12", "true"],
        capture_output=True, text=True, timeout=30, env=keys_env.env(), check=False)
    assert ssh.returncode == 0, ssh.stderr
    again = keys_env.dtrain("keys", "setup", "--ssh-config")
    assert "already gives plain ssh this key" in again.stderr
    assert config.read_text() == text  # not twice


@pytest.mark.parametrize("action", [["setup", "--password-stdin"], ["check"], ["revoke"]])
def test_keys_skip_localhost_with_one_line(action: list[str], tmp_path: Path) -> None:
    """Issue 55 item 4: keys tried SSH to localhost, which exec, run and doctor run locally
    ("connection refused" with no sshd)."""
    from tests.util import assert_exit, dtrain

    env = {**os.environ, "HOME": str(tmp_path)}
    ensure_keypair(default_key_path_in(tmp_path))
    res = dtrain(["keys", *action, "-H", "localhost", "-t", "3"], env=env, input="")
    assert_exit(res, 0)
    assert res.stderr.count("localhost runs locally; no key needed") == 1, res.stderr
    assert "refused" not in res.stdout + res.stderr


def default_key_path_in(home: Path) -> Path:
    return home / ".ssh" / default_key_path().name
