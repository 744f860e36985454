"""A sweep of malformed input through every command: exit 2, a message, no traceback, and
nothing dialled (issue 11).

Each case names the unreachable 198.18.0.250 somewhere, so a command that went on past its
input would try to connect. A ``sitecustomize`` loaded into the dtrain process records every
``socket.connect`` and name lookup into a file: it must stay empty. No cluster is needed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.util import DIAL_SITECUSTOMIZE as SITECUSTOMIZE
from tests.util import REPO

UNREACHABLE = "198.18.0.250"


# hostfiles: (file name, bytes); each also lists the unreachable host
HOSTFILES = {
    "huge-range": ("h.txt", f"{UNREACHABLE}\nnode[1-100000000]\n".encode()),
    "huge-2d": ("h.txt", f"{UNREACHABLE}\nn[1-100000][1-100000]\n".encode()),
    "yaml-aliases": ("h.yaml", (f"hosts:\n  - {UNREACHABLE}\n  - &a 'n[1-60000]'\n"
                                + "  - *a\n" * 50).encode()),
    "yaml-alias-maps": ("h.yaml", (f"hosts:\n  - {UNREACHABLE}\n  - &a {{host: 'm[1-60000]'}}\n"
                                   + "  - *a\n" * 50).encode()),
    "many-entries": ("h.txt", (f"{UNREACHABLE}\n" + "".join(f"g{c}[1-60000]\n"
                                                          for c in "abc")).encode()),
    "not-utf8": ("h.txt", f"{UNREACHABLE}\nnode\xe9\n".encode("latin-1")),
    "nul": ("h.txt", f"{UNREACHABLE}\nno\x00de\n".encode()),
    "yaml-esc": ("h.yaml", f"hosts:\n  - {UNREACHABLE}\n  - \x1b[2J\n".encode()),
    "yaml-nul-escape": ("h.yaml", f'hosts:\n  - "{UNREACHABLE}\\0"\n'.encode()),
    "group": ("h.txt", f"{UNREACHABLE}\n@gpus\n".encode()),
    "python-esc": ("h.txt", f"{UNREACHABLE} python=/bin/py\x1b]0;t\x07\n".encode()),
    "python-tilde-user": ("h.txt", f"{UNREACHABLE} python=~root/py\n".encode()),
    "python-dash": ("h.txt", f"{UNREACHABLE} python=-c\n".encode()),
    "slots": ("h.txt", f"{UNREACHABLE} slots=x\n".encode()),
    # no upper bound on slots, and 5,000 digits were an int() traceback (issue #25, round 5)
    "slots-huge": ("h.txt", f"{UNREACHABLE} slots=99999999999999999999\n".encode()),
    "slots-digits": ("h.txt", f"{UNREACHABLE} slots={'9' * 5000}\n".encode()),
    "port-digits": ("h.txt", f"{UNREACHABLE}:{'9' * 5000}\n".encode()),
    "yaml-slots-huge": ("h.yaml", f"hosts:\n  - {{host: {UNREACHABLE}, slots: 100000}}\n"
                        .encode()),
    "user": ("h.txt", f"-oProxyCommand=x@{UNREACHABLE}\n".encode()),
    "port": ("h.txt", f"{UNREACHABLE}:99999\n".encode()),
    "operator": ("h.txt", f"{UNREACHABLE}\nnode[1-4]!node2\n".encode()),
    "yaml-not-list": ("h.yaml", b"hosts: 5\n"),
    "yaml-bad": ("h.yaml", f"hosts: [{UNREACHABLE}\n".encode()),
    "yaml-env-forbidden": ("h.yaml", f"hosts:\n  - {{host: {UNREACHABLE}, env: {{HOSTNAME: x}}}}\n"
                           .encode()),
    "yaml-env-nul": ("h.yaml", f'hosts:\n  - {{host: {UNREACHABLE}, env: {{A: "x\\0"}}}}\n'
                     .encode()),
    "yaml-env-binary": ("h.yaml", f"hosts:\n  - {{host: {UNREACHABLE}, "
                        "env: {A: !!binary AA==}}\n".encode()),
    "yaml-python-object": ("h.yaml", f"hosts:\n  - {{host: {UNREACHABLE}, python: [a]}}\n"
                           .encode()),
    # a tag's constructor refusing its text: was a ValueError traceback (issue #25, round 4)
    "yaml-tagged-value": ("h.yaml", f"hosts:\n  - {{host: {UNREACHABLE}, slots: !!int x}}\n"
                          .encode()),
    "duplicate": ("h.txt", f"{UNREACHABLE}\n{UNREACHABLE}\n".encode()),
    "empty": ("h.txt", b"# nothing\n"),
}

# options, for every host command (-H UNREACHABLE is added unless the case gives hosts)
OPTIONS = {
    "H-huge": ["-H", "node[1-100000000]"],
    "H-many": ["-H", ",".join(f"g{c}[1-60000]" for c in "abc")],
    "include-huge": ["-H", UNREACHABLE, "--include", "node[1-100000000]"],
    "exclude-huge": ["-H", UNREACHABLE, "--exclude", "node[1-100000000],x[1-9]"],
    "include-group": ["-H", UNREACHABLE, "--include", "@gpus"],
    "exclude-everything": ["-H", UNREACHABLE, "--exclude", UNREACHABLE],
    "H-and-f": ["-H", UNREACHABLE, "-f", "/etc/hostname"],
    "no-hosts": [],
    "missing-hostfile": ["-f", "/nonexistent/hosts.txt"],
    "hostfile-dir": ["-f", "/tmp"],
    "H-space": ["-H", f"{UNREACHABLE} other"],
    "H-shell": ["-H", f"{UNREACHABLE};id"],
}

# per command, options of its own
RUN_OPTIONS = {
    "python-newline": ["--python", "py\nthon"],
    "python-dash": ["--python", "-c"],
    "workdir-esc": ["--workdir", "/tmp/a\x1b[2Jb"],
    "workdir-tilde-user": ["--workdir", "~root/x"],
    "env-forbidden": ["--env", "HOSTNAME=x"],
    "env-bad-name": ["--env", "1A=x"],
    "env-unset": ["--env", "DTRAIN_TEST_SURELY_UNSET"],
    "rdzv": ["--rdzv", "etcd"],
    "ranks": ["--ranks", "a,b"],
    "run-id": ["--run-id", "../escape"],
    "profile-missing": ["--profile", "/nonexistent.yaml"],
}
ENV_FILES = {
    "envfile-nul": b"A=1\nB=x\x00\n",
    "envfile-utf8": b"A=\xff\n",
    "envfile-after-quote": b'A="x"y\n',
    "envfile-forbidden": b"SSH_AUTH_SOCK=/x\n",
    "envfile-unterminated": b'A="x\n',
    "envfile-no-equals": b"just-a-secret\n",
}
PROFILES = {
    "profile-utf8": b"env: {A: \xff}\n",
    "profile-forbidden": b"env: {HOSTNAME: x}\n",
    "profile-nul": b'env: {A: "x\\0"}\n',
}

COMMANDS = {
    "exec": (["exec"], ["--", "true"]),
    "run": (["run"], ["train.py"]),
    "doctor": (["doctor"], []),
    "keys-check": (["keys", "check"], []),
}


@pytest.fixture(scope="module")
def dial_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return site


def _dtrain(args: list[str], site: Path, tmp: Path) -> tuple[int, str, list[str], float]:
    import subprocess

    log = tmp / "dials.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{REPO}", DTRAIN_TEST_DIAL_LOG=str(log),
               HOME=str(tmp))
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "launcher", *args], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - start
    dials = log.read_text().splitlines() if log.exists() else []
    return res.returncode, res.stderr, dials, elapsed


def _assert_bad_input(args: list[str], site: Path, tmp: Path) -> str:
    code, err, dials, elapsed = _dtrain(args, site, tmp)
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    assert err.strip(), "no message"
    assert dials == [], dials  # the oracle: nothing connected (not how fast it refused)
    return err


def test_the_detector_sees_a_dial(dial_site: Path, tmp_path: Path) -> None:
    code, _, dials, _ = _dtrain(["exec", "-H", UNREACHABLE, "--connect-timeout", "0.3", "--",
                                 "true"], dial_site, tmp_path)
    assert code == 255 and any(UNREACHABLE in d for d in dials), dials


@pytest.mark.parametrize("case", sorted(HOSTFILES))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_malformed_hostfiles(command: str, case: str, dial_site: Path, tmp_path: Path) -> None:
    name, data = HOSTFILES[case]
    path = tmp_path / name
    path.write_bytes(data)
    head, tail = COMMANDS[command]
    err = _assert_bad_input([*head, "-f", str(path), *tail], dial_site, tmp_path)
    assert str(path) in err, err
    if case.startswith(("huge", "many", "yaml-alias")):
        assert "65536" in err, err  # the cap is named
    if case.startswith(("slots-", "yaml-slots-")):
        assert "4096" in err, err


@pytest.mark.parametrize("case", sorted(OPTIONS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_malformed_host_options(command: str, case: str, dial_site: Path,
                                tmp_path: Path) -> None:
    head, tail = COMMANDS[command]
    err = _assert_bad_input([*head, *OPTIONS[case], *tail], dial_site, tmp_path)
    if "huge" in case or "many" in case:
        assert "65536" in err, err  # the cap is named


@pytest.mark.parametrize("case", sorted(RUN_OPTIONS) + sorted(ENV_FILES) + sorted(PROFILES))
def test_malformed_run_options(case: str, dial_site: Path, tmp_path: Path) -> None:
    if case in ENV_FILES:
        (tmp_path / "s.env").write_bytes(ENV_FILES[case])
        options = ["--env-file", str(tmp_path / "s.env")]
    elif case in PROFILES:
        (tmp_path / "p.yaml").write_bytes(PROFILES[case])
        options = ["--profile", str(tmp_path / "p.yaml")]
    else:
        options = RUN_OPTIONS[case]
    err = _assert_bad_input(["run", "-H", UNREACHABLE, *options, "train.py"], dial_site,
                            tmp_path)
    if case in ENV_FILES:
        assert f"{tmp_path / 's.env'}:" in err, err
    for secretish in ("just-a-secret", "SSH_AUTH_SOCK=/x"):
        assert secretish not in err


@pytest.mark.parametrize("case", ["python-newline", "python-dash"])
@pytest.mark.parametrize("command", ["exec", "doctor"])
def test_malformed_python_for_exec_and_doctor(command: str, case: str, dial_site: Path,
                                              tmp_path: Path) -> None:
    head, tail = COMMANDS[command]
    err = _assert_bad_input([*head, "-H", UNREACHABLE, *RUN_OPTIONS[case], *tail], dial_site,
                            tmp_path)
    assert "--python: " in err


@pytest.mark.parametrize("host", ["node[1-100000000]", "a[1-70000]", "x[1-10][1-10000]"])
def test_logs_host_is_capped(host: str, dial_site: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"archive_version": 1, "run_id": "r1"}))
    (run / "output.jsonl").write_text("")
    err = _assert_bad_input(["logs", "--archive-dir", str(tmp_path / "runs"), "--host", host],
                            dial_site, tmp_path)
    assert "65536" in err


def test_the_cap_fails_fast_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is checked before NodeSet builds a range: counted in names NodeSet is asked
    to build (at most the cap in all), not in seconds, so a loaded machine cannot fail it
    and a cap checked too late cannot pass it."""
    from ClusterShell import NodeSet as nodeset_module

    from launcher.errors import HostfileError
    from launcher.hosts import entries, hostfile
    from launcher.hosts.entries import MAX_HOSTS, expr_size
    from launcher.hosts.hostfile import filter_hosts, parse_host_expr, parse_hostfile_yaml

    built: list[int] = []

    def counting(pattern: object = None, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        size = expr_size(str(pattern)) if isinstance(pattern, str) else 0
        built.append(size)
        assert sum(built) <= MAX_HOSTS, f"NodeSet asked for {sum(built)} names past the cap"
        return nodeset_module.NodeSet(pattern, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(entries, "NodeSet", counting)
    monkeypatch.setattr(hostfile, "NodeSet", counting)
    aliases = "hosts:\n  - &a 'n[1-60000]'\n" + "  - *a\n" * 1000
    for parse in (lambda: parse_host_expr("node[1-100000000]"),
                  lambda: parse_hostfile_yaml(aliases, "h.yaml"),
                  lambda: filter_hosts([], "node[1-100000000]", None)):
        built.clear()
        with pytest.raises(HostfileError, match="65536"):
            parse()
