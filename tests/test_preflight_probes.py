"""`dtrain run`'s preflight runs one probe per node from the facts to the master-port check
(job/probes.py, probe.py's ``facts`` + ``stay``), here on local connections (no cluster;
tests/test_run.py covers the same preflight on real nodes)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.decide.runplan.plan import RunRequest
from launcher.decide.runplan.runoptions import Connection, NodeChecks, RunOptions
from launcher.job.preflight import preflight
from launcher.models import Host
from launcher.nodeside import wire
from launcher.transports.base import Process
from launcher.transports.local import LocalConnection

REPO = Path(__file__).resolve().parents[1]


class Counted(LocalConnection):
    """A local 'node' that counts the programs started on it."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.started: list[str] = []

    async def start(self, command: str) -> Process:
        self.started.append(command)
        return await super().start(command)


def _nodes(master_addr: str | None, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[list[Host], dict[str, Counted], RunRequest]:
    # every "node" here is this machine, where any address is local to the workers too,
    # which choose_master rightly refuses: take its first candidate instead
    from launcher.job import preflight as pf

    def first(candidates: Any, routes: Any, **_: Any) -> Any:
        return SimpleNamespace(addr=candidates[0], reason="test", warning=None)

    monkeypatch.setattr(pf, "choose_master", first)
    hosts = [Host(f"n{i}") for i in range(3)]
    conns = {h.label: Counted(h) for h in hosts}
    req = RunRequest(script="examples/ddp_smoke.py", python=sys.executable,
                     workdir=str(REPO), master_addr=master_addr)
    return hosts, conns, req


def _preflight(master_addr: str | None, monkeypatch: pytest.MonkeyPatch
               ) -> tuple[Any, dict[str, Counted]]:
    hosts, conns, req = _nodes(master_addr, monkeypatch)

    async def go() -> Any:
        pre = await preflight(dict(conns), hosts, req, RunOptions(
            checks=NodeChecks(preflight=False), connection=Connection(probe_timeout=60)))
        # preflight returns with node 0's port closed (torchrun binds it next) and every
        # probe still running (each becomes its node's supervisor; prepare ends the rest)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((pre.master_addr, pre.master_port))
            s.listen()
        assert pre.probes is not None
        await pre.probes.aclose()
        return pre

    return asyncio.run(go()), conns


def test_one_probe_per_node_for_facts_routes_and_the_master_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for addr in ("127.0.0.1", None):  # None: the master is picked from node 0's addresses
        pre, conns = _preflight(addr, monkeypatch)
        assert pre.master_port > 0 and pre.master_addr, pre
        assert [len(c.started) for c in conns.values()] == [1, 1, 1], addr
        assert all(pre.master_addr in pre.facts[f"n{i}"].routes for i in (1, 2))


def _staying_probe() -> subprocess.Popen[bytes]:
    cmd = wire.remote_command(sys.executable)
    proc = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            env={**os.environ, "DTRAIN_TEST_MARK": "from-the-shell"})
    assert proc.stdin is not None
    params = {"mode": "facts", "targets": ["127.0.0.1"], "stay": True}
    proc.stdin.write(wire.payload(wire.program_source("probe")) + json.dumps(params).encode()
                     + b"\n")
    proc.stdin.flush()
    return proc


def _answer(proc: subprocess.Popen[bytes], op: dict[str, Any] | None = None) -> Any:
    assert proc.stdin is not None and proc.stdout is not None
    if op is not None:
        proc.stdin.write(json.dumps(op).encode() + b"\n")
        proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def test_a_staying_probe_answers_each_op_and_holds_the_port_until_eof() -> None:
    master, worker = _staying_probe(), _staying_probe()
    try:
        assert _answer(master)["mode"] == "facts" and _answer(worker)["mode"] == "facts"
        bound = _answer(master, {"op": "listen", "addr": "127.0.0.1", "port": 0})
        assert bound["ok"] and bound["port"] > 0
        again = _answer(master, {"op": "listen", "addr": "127.0.0.1", "port": 0})
        assert again["ok"] is False  # one listen per probe
        ok = _answer(worker, {"op": "connect", "addr": "127.0.0.1", "port": bound["port"],
                              "timeout": 5})
        assert ok["ok"], ok
        routes = _answer(worker, {"op": "routes", "targets": ["127.0.0.1", "nope"]})
        assert routes["ok"] and routes["routes"]["127.0.0.1"]["dev"] == "lo"
        assert routes["routes"]["nope"]["type"] == "invalid"
        assert _answer(worker, {"op": "mystery"})["ok"] is False
    finally:
        for p in (master, worker):
            assert p.stdin is not None
            p.stdin.close()
            assert p.wait(timeout=30) == 0
    closed = _staying_probe()
    try:
        _answer(closed)
        refused = _answer(closed, {"op": "connect", "addr": "127.0.0.1",
                                   "port": bound["port"], "timeout": 5})
        assert refused["ok"] is False  # the master's probe ended: its port is released
    finally:
        assert closed.stdin is not None
        closed.stdin.close()
        closed.wait(timeout=30)


def test_unlisten_closes_the_master_port_and_the_probe_stays() -> None:
    master = _staying_probe()
    try:
        _answer(master)
        bound = _answer(master, {"op": "listen", "addr": "127.0.0.1", "port": 0})
        assert _answer(master, {"op": "unlisten"}) == {"ok": True}
        with socket.socket() as s:  # free now, the probe still running
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", bound["port"]))
        assert master.poll() is None
        assert _answer(master, {"op": "unlisten"}) == {"ok": True}  # nothing bound: fine
    finally:
        assert master.stdin is not None
        master.stdin.close()
        assert master.wait(timeout=30) == 0


REPORT = (b"import json, os, sys\n"
          b"print(json.dumps({'pid': os.getpid(), 'cwd': os.getcwd(), 'env': dict(os.environ),"
          b" 'isolated': sys.flags.isolated, 'no_site': sys.flags.no_site}))\n")


def test_become_execs_the_supervisor_interpreter_in_the_workdir(tmp_path: Path) -> None:
    """The probe's process turns into `python -u -I -S -c BOOTSTRAP` (what NodeSession starts
    otherwise): same pid (no new shell, --setup or channel), in the working directory with
    the shell's PWD/OLDPWD, the environment the probe started with, ready for a payload."""
    work = tmp_path / "work"
    work.mkdir()
    probe = _staying_probe()
    try:
        _answer(probe)
        bound = _answer(probe, {"op": "listen", "addr": "127.0.0.1", "port": 0})
        bad = _answer(probe, {"op": "become", "workdir": str(tmp_path / "nope"),
                              "bootstrap": wire.BOOTSTRAP})
        assert bad["ok"] is False and "nope" in bad["error"]  # refused: the probe stays
        assert _answer(probe, {"op": "become", "workdir": str(work),
                               "bootstrap": wire.BOOTSTRAP}) == {"ok": True}
        assert probe.stdin is not None
        probe.stdin.write(wire.payload(REPORT))
        probe.stdin.close()
        got = json.loads(probe.stdout.readline())  # type: ignore[union-attr]
        assert probe.wait(timeout=30) == 0
    finally:
        probe.kill()
    assert got["pid"] == probe.pid
    assert got["cwd"] == str(work) and got["env"]["PWD"] == str(work)
    assert got["env"]["OLDPWD"] == os.environ.get("PWD", os.getcwd())
    assert got["env"]["DTRAIN_TEST_MARK"] == "from-the-shell"
    assert (got["isolated"], got["no_site"]) == (1, 1)
    with socket.socket() as s:  # the master port went with the probe
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", bound["port"]))


def test_a_run_starts_one_program_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """preflight + the job: each node's probe becomes its supervisor (NodeSession.adopt),
    so every node runs one program for the whole run, and the job runs."""
    from launcher.job.node import JobSpec, NodeSession

    hosts, conns, req = _nodes("127.0.0.1", monkeypatch)
    events: dict[str, list[str]] = {}

    async def go() -> dict[str, Any]:
        pre = await preflight(dict(conns), hosts, req, RunOptions(
            checks=NodeChecks(preflight=False), connection=Connection(probe_timeout=60)))
        probes = pre.probes
        assert probes is not None
        out = {}
        for label, conn in conns.items():
            session = NodeSession(conn, JobSpec(argv=[sys.executable, "-c", "print(42)"]),
                                  python=sys.executable, workdir=str(REPO),
                                  on_chunk=lambda *a: None,
                                  on_event=lambda h, m: events.setdefault(
                                      h.label, []).append(type(m).__name__),
                                  adopt=functools.partial(probes.become, label, str(REPO)))
            out[label] = await session.run()
        await probes.aclose()
        return out

    outcomes = asyncio.run(go())
    assert all(o.exit_code == 0 for o in outcomes.values()), outcomes
    assert all("Hello" in events[label] for label in conns), events
    assert [len(c.started) for c in conns.values()] == [1, 1, 1]


@pytest.mark.parametrize("which, message, hint", [
    pytest.param("workdir_denied",
                 "working directory /srv/job on n[0,2]: permission denied (it exists, but bob "
                 "may not enter or read it); nothing was started",
                 "give bob access to it (chmod/chown, e.g. chmod o+rx), or pass a --workdir "
                 "it may use", id="workdir"),
    pytest.param("entry_denied",
                 "train.py in /srv/job on n[0,2]: permission denied (bob may not read it, or "
                 "a directory on its path); nothing was started",
                 "give bob read access to the script and search access to its directories",
                 id="script"),
])
def test_a_permission_denied_names_the_nodes_and_their_user(
        monkeypatch: pytest.MonkeyPatch, which: str, message: str, hint: str) -> None:
    """The facts say the user may not enter the working directory (or read the script) on
    two nodes: refused with those nodes and that user, before anything starts."""
    from launcher.decide.fabric import checks
    from launcher.decide.runplan.facts import NodeFacts
    from launcher.errors import PreflightFailed
    from launcher.job.probes import NodeProbes

    async def facts(self: Any, conns: Any, targets: Any) -> dict[str, NodeFacts]:
        return {label: NodeFacts(workdir_ok=True, entry_ok=True, user="bob",
                                 **({which: True} if label != "n1" else {}))
                for label in conns}

    monkeypatch.setattr(NodeProbes, "facts", facts)
    monkeypatch.setattr(checks, "failure_message", lambda rows: None)  # no torch etc. here
    hosts = [Host(f"n{i}") for i in range(3)]
    req = RunRequest(script="train.py", python=sys.executable, workdir="/srv/job")
    with pytest.raises(PreflightFailed) as err:
        asyncio.run(preflight({h.label: Counted(h) for h in hosts}, hosts, req,
                              RunOptions(checks=NodeChecks(preflight=True),
                                         connection=Connection(probe_timeout=60))))
    assert (err.value.message, err.value.hint, err.value.host) == (message, hint, None)
