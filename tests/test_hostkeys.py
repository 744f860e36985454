"""Host keys: every known_hosts file OpenSSH reads, hashed names, markers, case, the lock.

The policy is tested directly (no network) and through real asyncssh connections to an
in-process server on 127.0.0.1 (a server per host key; real sshd cases are in
tests/test_trust_cluster.py).
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import hmac
import os
import threading
import time
from pathlib import Path

import asyncssh
import pytest

from launcher.errors import HostKeyError
from launcher.models import Host
from launcher.transports.ssh import HostKeyPolicy, SSHSettings, SSHTransport, fingerprint

KEY_A = asyncssh.generate_private_key("ssh-ed25519")
KEY_B = asyncssh.generate_private_key("ssh-ed25519")
CA = asyncssh.generate_private_key("ssh-ed25519")


def pub(key: asyncssh.SSHKey) -> str:
    return key.export_public_key("openssh").decode().strip()


def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    etc = tmp_path / "etc"
    etc.mkdir()
    return {"known_hosts": ssh / "known_hosts", "known_hosts2": ssh / "known_hosts2",
            "global": etc / "ssh_known_hosts", "global2": etc / "ssh_known_hosts2"}


def policy(files: dict[str, Path], accept_new: bool = True) -> HostKeyPolicy:
    return HostKeyPolicy([files["known_hosts"], files["known_hosts2"]], accept_new,
                         [files["global"], files["global2"]])


@pytest.mark.parametrize("where", ["known_hosts", "known_hosts2", "global", "global2"])
def test_a_key_recorded_in_any_file_makes_another_key_changed(files, where: str) -> None:
    files[where].write_text(f"gpu01 {pub(KEY_A)}\n")
    p = policy(files, accept_new=True)
    assert p.known_keys("gpu01", None, None) == [KEY_A.convert_to_public()]
    verdict = p.validate("gpu01", None, None, KEY_B.convert_to_public())
    assert verdict.kind == "changed" and verdict.files == (str(files[where]),)
    assert verdict.fingerprint == fingerprint(KEY_B)
    assert not files["known_hosts"].exists() or where == "known_hosts"  # nothing recorded
    if where == "known_hosts":
        assert files[where].read_text() == f"gpu01 {pub(KEY_A)}\n"


@pytest.mark.parametrize(("recorded", "asked"), [("GPU01", "gpu01"), ("gpu01", "GPU01"),
                                                  ("Gpu01", "gPU01")])
def test_host_names_compare_case_insensitively(files, recorded: str, asked: str) -> None:
    files["known_hosts"].write_text(f"{recorded} {pub(KEY_A)}\n")
    p = policy(files)
    assert p.known_keys(asked, None, None) == [KEY_A.convert_to_public()]
    assert p.validate(asked, None, None, KEY_B.convert_to_public()).kind == "changed"


def test_hashed_entries_and_patterns(files) -> None:
    files["known_hosts"].write_text(f"{hashed('gpu01')} {pub(KEY_A)}\n"
                                    f"gpu1*,!gpu13 {pub(KEY_B)}\n")
    p = policy(files)
    assert p.known_keys("GPU01", None, None) == [KEY_A.convert_to_public()]
    assert p.known_keys("gpu12", None, None) == [KEY_B.convert_to_public()]
    assert p.known_keys("gpu13", None, None) == []


def test_non_default_port_is_looked_up_as_bracketed_name_only(files) -> None:
    files["known_hosts"].write_text(f"gpu01 {pub(KEY_A)}\n[gpu01]:2222 {pub(KEY_B)}\n")
    p = policy(files)
    assert p.known_keys("gpu01", None, 2222) == [KEY_B.convert_to_public()]
    assert p.known_keys("gpu01", None, 22) == [KEY_A.convert_to_public()]
    assert p.known_keys("gpu01", None, 2200) == []  # OpenSSH: unknown, not "changed"


def test_markers_cert_authority_and_revoked(files) -> None:
    files["global"].write_text(f"@cert-authority *.cluster {pub(CA)}\n"
                               f"@revoked * {pub(KEY_B)}\n")
    trusted, cas, revoked = policy(files).match("GPU01.cluster", "", None)
    assert trusted == [] and cas == [CA.convert_to_public()]
    assert revoked == [KEY_B.convert_to_public()]


def test_a_broken_line_does_not_hide_the_others(files) -> None:
    files["known_hosts"].write_text(f"garbage\n@bogus x y\n|1|bad|hash {pub(KEY_B)}\n"
                                    f"gpu01 {pub(KEY_A)}")
    assert policy(files).known_keys("gpu01", None, None) == [KEY_A.convert_to_public()]


def test_record_keeps_a_last_line_without_newline(files) -> None:
    files["known_hosts"].write_text(f"gpu01 {pub(KEY_A)}")  # hand-edited: no final newline
    p = policy(files)
    assert p.validate("gpu02", "10.0.0.2", None, KEY_B.convert_to_public()).kind == "added"
    assert files["known_hosts"].read_text() == (f"gpu01 {pub(KEY_A)}\n"
                                                f"gpu02,10.0.0.2 {pub(KEY_B)}\n")
    assert p.known_keys("gpu02", None, None) == [KEY_B.convert_to_public()]  # reloaded


def test_record_lower_cases_and_brackets(files) -> None:
    p = policy(files)
    p.record("GPU03", None, 2222, KEY_A.convert_to_public())
    assert files["known_hosts"].read_text() == f"[gpu03]:2222 {pub(KEY_A)}\n"
    assert files["known_hosts"].stat().st_mode & 0o777 == 0o600


def test_record_waits_for_the_lock(files) -> None:
    # another dtrain process holds known_hosts: our line goes in after it, never inside it
    files["known_hosts"].write_text("")
    fd = os.open(files["known_hosts"], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    done = threading.Event()
    p = policy(files)
    thread = threading.Thread(target=lambda: (p.record("gpu04", None, None,
                                                       KEY_A.convert_to_public()), done.set()))
    thread.start()
    time.sleep(0.3)
    assert not done.is_set()
    os.write(fd, b"gpu05 " + pub(KEY_B).encode())  # a writer without a final newline
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    thread.join(5)
    assert files["known_hosts"].read_text() == f"gpu05 {pub(KEY_B)}\ngpu04 {pub(KEY_A)}\n"


def test_settings_choose_files_and_ssh_config_overrides(tmp_path: Path) -> None:
    settings = SSHSettings(home=tmp_path)
    p = settings.host_key_policy()
    assert p.files == (tmp_path / ".ssh/known_hosts", tmp_path / ".ssh/known_hosts2",
                       Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2"))
    cfg = {"UserKnownHostsFile": ["~/kh", "/x/kh2"], "GlobalKnownHostsFile": ["/g"]}
    p = settings.host_key_policy(cfg)
    assert p.files == (tmp_path / "kh", Path("/x/kh2"), Path("/g")) and p.path == tmp_path / "kh"
    assert settings.host_key_policy({"UserKnownHostsFile": []}).path is None  # `none`


# --------------------------------------------------------------------------- real connections


class _Server(asyncssh.SSHServer):
    passwords: list[str]

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        self.passwords.append(password)
        return False


async def _serve(key: asyncssh.SSHKey, passwords: list[str]) -> tuple[asyncssh.SSHAcceptor, int]:
    def factory() -> _Server:
        server = _Server()
        server.passwords = passwords
        return server

    acceptor = await asyncssh.listen("127.0.0.1", 0, server_host_keys=[key],
                                     server_factory=factory)
    return acceptor, acceptor.sockets[0].getsockname()[1]


async def test_each_connection_has_its_own_verdict_and_no_password_reaches_a_changed_host(
        files) -> None:
    passwords: list[str] = []
    changed, port_c = await _serve(KEY_A, passwords)
    unknown, port_u = await _serve(KEY_B, passwords)
    try:
        # the changed host's recorded key is in known_hosts2 only; the other is not known
        files["known_hosts2"].write_text(f"[127.0.0.1]:{port_c} {pub(KEY_B)}\n")
        settings = SSHSettings(connect_timeout=5, accept_new=False, home=files["known_hosts"]
                               .parent.parent, password="s3cr3t", retries=0,
                               global_known_hosts=(files["global"],))
        transport = SSHTransport(settings)
        hosts = [Host("127.0.0.1", port=port_c), Host("127.0.0.1", port=port_u)]
        results = await asyncio.gather(*(transport.connect(h) for h in hosts),
                                       return_exceptions=True)
        await transport.aclose()
        err_c, err_u = results
        assert isinstance(err_c, HostKeyError) and isinstance(err_u, HostKeyError)
        assert err_c.host == f"127.0.0.1:{port_c}" and err_u.host == f"127.0.0.1:{port_u}"
        assert "HOST KEY CHANGED" in err_c.message and fingerprint(KEY_A) in err_c.message
        assert str(files["known_hosts2"]) in err_c.message
        assert err_u.message == f"unknown host key {fingerprint(KEY_B)}"
        # --accept-new records the unknown one, never the changed one, and sends the
        # password only to the host it now trusts
        settings = SSHSettings(connect_timeout=5, accept_new=True, home=settings.home,
                               password="s3cr3t", retries=0,
                               global_known_hosts=(files["global"],))
        transport = SSHTransport(settings)
        with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
            await transport.connect(hosts[0])
        assert passwords == []
        with pytest.raises(Exception, match="permission denied"):
            await transport.connect(hosts[1])
        await transport.aclose()
        assert passwords == ["s3cr3t"]
        assert files["known_hosts"].read_text() == f"[127.0.0.1]:{port_u} {pub(KEY_B)}\n"
    finally:
        changed.close()
        unknown.close()


async def test_a_revoked_key_is_refused_even_with_accept_new(files) -> None:
    passwords: list[str] = []
    server, port = await _serve(KEY_A, passwords)
    try:
        files["global"].write_text(f"@revoked * {pub(KEY_A)}\n")
        settings = SSHSettings(connect_timeout=5, accept_new=True,
                               home=files["known_hosts"].parent.parent, password="pw",
                               retries=0, global_known_hosts=(files["global"],))
        transport = SSHTransport(settings)
        with pytest.raises(HostKeyError, match="REVOKED"):
            await transport.connect(Host("127.0.0.1", port=port))
        await transport.aclose()
        assert passwords == [] and not files["known_hosts"].exists()
    finally:
        server.close()
