"""A cold SSH command writes nothing on stderr that dtrain did not write (issue 49).

A fresh install resolves whatever versions PyPI has that day. cryptography 51 started
warning ("DSA is deprecated") each time asyncssh read one of its DSA names at import, ten
lines on every cold `exec`, `keys`, `doctor`, `run` and `cp`. These tests run those commands
cold against the real-sshd cluster with whatever versions are installed (the pinned ones in
scripts/test, today's newest in `scripts/test --latest`), and read stderr line by line: every
line is dtrain's own (`dtrain...`), a node's tagged output (`nodeN: ...`), or the indented
continuation of one of those (`  hint: ...`). The unit tests below check the filter itself
with a synthetic warning, so they mean the same whatever cryptography is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.util import REPO, dtrain

OWN_LINE = re.compile(r"^(dtrain[: ]|node\d+: )")


def foreign_lines(stderr: str) -> list[str]:
    """The stderr lines dtrain did not write (a continuation belongs to the line above)."""
    foreign: list[str] = []
    owner_ok = False
    for line in stderr.splitlines():
        if line.startswith("  ") and owner_ok:
            continue
        owner_ok = bool(OWN_LINE.match(line))
        if not owner_ok:
            foreign.append(line)
    return foreign


def test_foreign_lines_finds_a_library_warning() -> None:
    warned = ("/x/site-packages/asyncssh/crypto/misc.py:32: CryptographyDeprecationWarning: DSA"
              " is deprecated\n  PyCAPrivateKey = Union[dsa.DSAPrivateKey, rsa.RSAPrivateKey,\n")
    assert foreign_lines(warned) == warned.splitlines()
    assert foreign_lines("dtrain: error: x\n  hint: y\nnode1: out\n") == []
    assert foreign_lines("  indented first\n") == ["  indented first"]


# the filter itself, with a synthetic warning: the same whatever cryptography is installed
PROGRAM = r"""
import warnings, launcher, asyncssh
from cryptography.utils import CryptographyDeprecationWarning as C
def raise_from(module, message, category=C):
    exec("warnings.warn(message, category, stacklevel=1)",
         {"__name__": module, "warnings": warnings, "message": message, "category": category})
raise_from("asyncssh.crypto.misc", "DSA is deprecated and support will be removed")
raise_from("asyncssh", "DSA is deprecated and support will be removed")
raise_from("asyncssh.crypto.misc", "Blowfish has been deprecated")   # another message
raise_from("asyncsshx", "DSA is deprecated (not asyncssh's module)")  # another module
raise_from("train", "DSA is deprecated (the user's own code)")        # the user's
raise_from("asyncssh.crypto.misc", "DSA is deprecated", DeprecationWarning)  # another class
"""


def test_only_asyncssh_dsa_warning_is_silenced() -> None:
    res = subprocess.run([sys.executable, "-W", "default", "-c", PROGRAM], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    shown = [line for line in res.stderr.splitlines() if "Warning:" in line]
    assert len(shown) == 4, res.stderr
    assert "DSA is deprecated and support" not in res.stderr
    for kept in ("Blowfish", "not asyncssh's module", "the user's own code", "DeprecationWarning"):
        assert kept in res.stderr, (kept, res.stderr)


def test_importing_asyncssh_under_dtrain_prints_nothing() -> None:
    res = subprocess.run([sys.executable, "-W", "default", "-c", "import launcher, asyncssh"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_dtrain_offers_no_dsa() -> None:
    """docs/security.md: no ssh-dss, as a host key or a signature (so ignoring the warning
    about DSA hides nothing dtrain does)."""
    res = subprocess.run([sys.executable, "-c", (
        "import launcher, asyncssh.public_key as p\n"
        "print(b'ssh-dss' in p.get_default_public_key_algs(),"
        " b'ssh-dss' in p.get_default_certificate_algs())")],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["False", "False"], res.stderr
    sources = "\n".join(p.read_text() for p in (REPO / "launcher").rglob("*.py"))
    assert "ssh-dss" not in sources and "server_host_key_algs" not in sources


# --- the real commands, cold, on the real-sshd cluster ------------------------------------

NODES = "node[1-2]"


@pytest.fixture
def keyed_env(cluster, tmp_path):
    """The cluster's client HOME, copied, with its key where `keys check` looks for it."""
    home = tmp_path / "home"
    shutil.copytree(Path(cluster.client_env()["HOME"]), home, symlinks=True,
                    ignore=shutil.ignore_patterns("*.sock"))  # a killed run's socket
    ssh = home / ".ssh"
    shutil.copy(ssh / "id_ed25519", ssh / "id_ed25519_dtrain")
    shutil.copy(ssh / "id_ed25519.pub", ssh / "id_ed25519_dtrain.pub")
    return cluster.client_env(HOME=str(home), DTRAIN_RESIDENT="0")


def _cold(args, env):
    res = dtrain(args, env=env)
    return res, foreign_lines(res.stderr)


@pytest.mark.ssh
def test_cold_exec_keys_doctor_cp_write_only_dtrains_lines(cluster, keyed_env, tmp_path):
    src = tmp_path / "payload.txt"
    src.write_text("payload\n")
    for args, ok in ((["exec", "-H", NODES, "--", "true"], 0),
                     (["keys", "check", "-H", NODES], 0),
                     (["doctor", "-H", NODES, "--python", cluster.python], None),
                     (["cp", "-H", NODES, str(src), "/tmp/"], 0)):
        res, foreign = _cold(args, keyed_env)
        assert foreign == [], (args, res.stderr)
        assert "Traceback" not in res.stderr and "Warning" not in res.stderr, (args, res.stderr)
        if ok is not None:
            assert res.returncode == ok, (args, res.stderr)
    plain = dtrain(["exec", "-H", NODES, "--", "true"], env=keyed_env)
    assert plain.stderr == "", plain.stderr  # nothing at all when all is well


@pytest.mark.ssh
@pytest.mark.torch
def test_cold_run_writes_only_dtrains_lines(cluster, keyed_env):
    res, foreign = _cold(["run", "-H", NODES, "--python", cluster.python, "--nproc-per-node",
                          "1", "examples/ddp_smoke.py"], keyed_env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert foreign == [], res.stderr
    assert "DSA is deprecated" not in res.stdout + res.stderr
