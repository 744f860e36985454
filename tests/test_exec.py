"""`dtrain exec` against the real-sshd cluster: tags, exit codes, gather, quoting, failures."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tests.util import REPO, assert_exit, dtrain

pytestmark = pytest.mark.ssh

ALL = "dtuser@198.18.0.[11-14]"


def test_exec_tags_every_host_and_exits_zero(cluster):
    res = dtrain(["exec", "-H", ALL, "--", "hostname"], env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.splitlines())
    assert lines == [f"198.18.0.{10 + k}: node{k}" for k in range(1, 5)]


def test_exec_exit_code_is_the_largest_remote_code(cluster):
    cmd = 'case $(hostname) in node2) exit 3;; node3) exit 5;; esac; echo fine'
    res = dtrain(["exec", "-H", ALL, "--", cmd], env=cluster.client_env())
    assert_exit(res, 5)
    assert res.stdout.count("fine") == 2
    assert "198.18.0.13: exit 5" in res.stderr and "198.18.0.12: exit 3" in res.stderr


def test_exec_gather_folds_identical_outputs(cluster):
    res = dtrain(["exec", "-H", ALL, "--gather", "--", "echo same; uname -s"],
                 env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["-" * 16, "198.18.0.[11-14]", "-" * 16, "same", "Linux"]


def test_exec_gather_keeps_distinct_outputs_apart(cluster):
    res = dtrain(["exec", "-H", "node[1-4]", "-b", "--", "hostname"], env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    for k in range(1, 5):
        assert f"\nnode{k}\n" in res.stdout


def test_exec_argv_arrives_exactly_as_typed(cluster):
    res = dtrain(["exec", "-H", "node1", "--", "printf", "%s|", "a b", "$HOME", "`x`", "é"],
                 env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    assert res.stdout == "node1: a b|$HOME|`x`|é|\n"


def test_exec_one_argument_is_a_shell_line(cluster):
    res = dtrain(["exec", "-H", "node1", "--", "seq 1 3 | tail -n 1; echo $HOME"],
                 env=cluster.client_env())
    assert res.stdout == "node1: 3\nnode1: /home/dtuser\n"


def test_exec_stderr_partial_line_and_long_line(cluster):
    cmd = "echo to-err >&2; head -c 300000 /dev/zero | tr '\\0' x; echo; printf partial"
    res = dtrain(["exec", "-H", "node2", "--", cmd], env=cluster.client_env())
    assert res.returncode == 0
    out = res.stdout.splitlines()
    assert out[0] == "node2: " + "x" * 300000
    assert out[1] == "node2: partial"
    assert "node2: to-err" in res.stderr


def test_exec_unreachable_node_fails_within_connect_timeout(cluster):
    start = time.monotonic()
    res = dtrain(["exec", "-H", "node[1-3],dtuser@198.18.0.200", "--connect-timeout", "2",
                  "--", "echo up"], env=cluster.client_env())
    elapsed = time.monotonic() - start
    assert_exit(res, 255)
    assert sorted(res.stdout.splitlines()) == ["node1: up", "node2: up", "node3: up"]
    assert "198.18.0.200" in res.stderr and "timed out" in res.stderr
    assert elapsed < 15


def test_exec_ssh_config_alias_and_port(cluster):
    res = dtrain(["exec", "-H", "alt1,dtuser@198.18.0.12:2222", "--", "hostname"],
                 env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["198.18.0.12:2222: node2", "alt1: node1"]


def test_exec_changed_host_key_is_refused(cluster, tmp_path):
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_bytes(cluster.identity.read_bytes())
    (ssh / "id_ed25519").chmod(0o600)
    # node1's address, but node2's key: the key "changed"
    node2_key = [ln for ln in cluster.known_hosts.read_text().splitlines()
                 if ln.startswith("198.18.0.12 ")][0].split(" ", 1)[1]
    (ssh / "known_hosts").write_text(f"198.18.0.11 {node2_key}\n")
    before = (ssh / "known_hosts").read_text()
    res = dtrain(["exec", "-H", "dtuser@198.18.0.11", "--accept-new", "--", "true"],
                 env=cluster.client_env(HOME=str(home)))
    assert_exit(res, 255)
    assert "HOST KEY CHANGED" in res.stderr and "198.18.0.11" in res.stderr
    assert (ssh / "known_hosts").read_text() == before


def test_exec_unknown_host_key_refused_then_accept_new_records_it(cluster, tmp_path):
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_bytes(cluster.identity.read_bytes())
    (ssh / "id_ed25519").chmod(0o600)
    env = cluster.client_env(HOME=str(home))
    res = dtrain(["exec", "-H", "dtuser@198.18.0.13", "--", "true"], env=env)
    assert_exit(res, 255)
    assert "unknown host key SHA256:" in res.stderr
    res = dtrain(["exec", "-H", "dtuser@198.18.0.13", "--accept-new", "--", "true"], env=env)
    assert res.returncode == 0, res.stderr
    assert (ssh / "known_hosts").read_text().startswith("198.18.0.13 ssh-ed25519 ")
    res = dtrain(["exec", "-H", "dtuser@198.18.0.13", "--", "true"], env=env)
    assert res.returncode == 0, res.stderr


def test_exec_timeout_kills_everywhere(cluster):
    sleep = f"sleep 60.{uuid.uuid4().int % 10**6:06d}"  # unique on the nodes
    res = dtrain(["exec", "-H", "node[1-2]", "--timeout", "1", "--", sleep],
                 env=cluster.client_env())
    assert_exit(res, 124)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(cluster.node_pids(k, user="dtuser", match=sleep) for k in (1, 2)):
            break
        time.sleep(0.1)
    assert not any(cluster.node_pids(k, user="dtuser", match=sleep) for k in (1, 2))


def test_exec_bad_hostfile_is_exit_2_before_connecting(cluster, tmp_path):
    hf = tmp_path / "hosts.txt"
    hf.write_text("node1 slots=2\nnode2 slots=two\n")
    res = dtrain(["exec", "-f", str(hf), "--", "true"], env=cluster.client_env())
    assert_exit(res, 2)
    assert f"{hf}:2" in res.stderr and "slots" in res.stderr


def test_exec_proxyjump_from_ssh_config(cluster, tmp_path):
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    for name in ("id_ed25519", "known_hosts"):
        src = cluster.identity if name == "id_ed25519" else cluster.known_hosts
        (ssh / name).write_bytes(src.read_bytes())
        (ssh / name).chmod(0o600)
    (ssh / "config").write_text(
        "Host jump\n    HostName 198.18.0.11\n    User dtuser\n"
        "Host behind*\n    User dtuser\n    ProxyJump jump\n"
        "Host behind2\n    HostName 198.18.0.12\nHost behind3\n    HostName 198.18.0.13\n")
    res = dtrain(["exec", "-H", "behind[2-3]", "--", "echo $SSH_CONNECTION"],
                 env=cluster.client_env(HOME=str(home)))
    assert res.returncode == 0, res.stderr
    # both sessions arrive from node1's address: they came through the jump host
    peers = sorted(line.split(": ", 1)[1].split()[0] for line in res.stdout.splitlines())
    assert peers == ["198.18.0.11", "198.18.0.11"]


def test_a_chatty_bashrc_does_not_break_exec(cluster, chatty_bashrc):
    res = dtrain(["exec", "-H", "node[2-3]", "--", "echo $(hostname) ok"],
                 env=cluster.client_env())
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "node3: node3 ok" in lines and "node2: node2 ok" in lines
    # the banner is shown as the node's output, as pdsh would show it
    assert "node3: Welcome to node3, be nice" in lines


# lines per node: 3 x 500k lines of ~20 bytes is ~30 MB, past the 16 MB that dtrain's exec
# output queues before it stops reading from the nodes (launcher/output/fastout.py)
VOLUME = 500_000


@pytest.mark.timeout(170)
def test_exec_volume_to_a_slow_reader_every_line_once_in_order_tagged(cluster):
    """3 nodes x 500k numbered lines into a reader that pauses first (dtrain's stdout pipe
    and its queue fill, and the nodes must wait, not drop): every line arrives exactly once,
    in order per host, under its own host's tag."""
    cmd = f"seq 1 {VOLUME} | sed \"s/^/$(hostname) /\""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "exec", "-H", "node[1-3]",
                             "--no-color", "--", cmd], cwd=REPO, env=cluster.client_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(3.0)  # the slow consumer: nothing read yet, the pipe is full
        assert proc.poll() is None, "dtrain must wait for its reader, not finish or fail"
        out, err = proc.communicate(timeout=150)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err
    expect = {f"node{k}": 1 for k in (1, 2, 3)}
    for n, raw in enumerate(out.split(b"\n")[:-1]):
        tag, sep, text = raw.decode().partition(": ")
        host, _, num = text.partition(" ")
        assert sep and tag == host, f"line {n}: {raw!r} tagged with another host"
        assert int(num) == expect[host], f"line {n}: {raw!r}, expected {host} {expect[host]}"
        expect[host] += 1
    assert expect == {f"node{k}": VOLUME + 1 for k in (1, 2, 3)}, expect
    assert out.endswith(b"\n")


def _stamped(text: str) -> list[tuple[float, str]]:
    """(epoch seconds, rest of the line) for each --timestamps line."""
    out = []
    for line in text.splitlines():
        stamp, rest = line.split(" ", 1)
        assert len(stamp) == 23 and stamp[10] == "T" and stamp[19] == ".", line
        t = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + int(stamp[20:]) / 1000
        out.append((t, rest))
    return out


def test_exec_timestamps_are_when_each_line_arrived(cluster):
    before = time.time()
    res = dtrain(["exec", "-H", "node[1-2]", "--timestamps", "--",
                  "echo one; sleep 1.5; echo two >&2; printf three"], env=cluster.client_env())
    after = time.time()
    assert res.returncode == 0, res.stderr
    out, err = _stamped(res.stdout), _stamped(res.stderr)
    assert sorted(rest for _, rest in out) == ["node1: one", "node1: three", "node2: one",
                                               "node2: three"]
    assert sorted(rest for _, rest in err) == ["node1: two", "node2: two"]
    assert all(before - 0.001 <= t <= after for t, _ in out + err)
    one = {rest.split(":")[0]: t for t, rest in out if rest.endswith("one")}
    two = {rest.split(":")[0]: t for t, rest in err}
    assert all(two[h] - one[h] >= 1.4 for h in ("node1", "node2"))  # the launcher's clock
    plain = dtrain(["exec", "-H", "node1", "--", "echo one"], env=cluster.client_env())
    assert plain.stdout == "node1: one\n"  # no --timestamps: pdsh's format, untouched
