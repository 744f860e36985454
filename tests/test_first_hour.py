"""What a new user trips over in the first hour (issue 12), without a cluster: folded
preflight messages with the fix, the probe's script/module check."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.decide.fabric import checks
from launcher.decide.fabric.checks import FAIL, OK, CheckResult
from launcher.decide.runplan.facts import NodeFacts
from launcher.nodeside import probe
from tests.test_probe import run_probe


def test_failures_with_one_message_are_folded_in_host_order() -> None:
    rows = [CheckResult(h, "torch", FAIL, "torch is not installed for /usr/bin/python3")
            for h in ("node3", "node1", "node2")]
    rows += [CheckResult("node4", "torch", OK, "torch 2.13.0"),
             CheckResult("node4", "shm", FAIL, "64 MiB")]
    assert checks.failure_message(rows) == (
        "node[1-3]: torch: torch is not installed for /usr/bin/python3; node4: shm: 64 MiB")
    assert checks.failure_hint(rows) == checks.PYTHON_FIX
    assert "--python" in checks.PYTHON_FIX and "python=" in checks.PYTHON_FIX
    assert "--setup 'source" in checks.PYTHON_FIX
    assert "--no-preflight" in checks.failure_hint(rows[-1:])


def test_fold_by_message_keeps_the_order_of_first_appearance() -> None:
    items = [("b2", "x"), ("a1", "y"), ("b1", "x")]
    assert checks.fold_by_message(items) == "b[1-2]: x; a1: y"


@pytest.mark.parametrize("entry, found", [
    pytest.param({"name": "train.py"}, True, id="script"),
    pytest.param({"name": "sub/run.py"}, True, id="script-in-subdir"),
    pytest.param({"name": "trian.py"}, False, id="script-typo"),
    pytest.param({"name": "sub"}, False, id="directory-is-no-script"),
    pytest.param({"name": "mypkg.train", "module": True}, True, id="module-in-workdir"),
    pytest.param({"name": "mypkg.nope", "module": True}, False, id="submodule-missing"),
    pytest.param({"name": "json.tool", "module": True}, True, id="module-on-sys-path"),
    pytest.param({"name": "no_such_module_x", "module": True}, False, id="module-missing"),
    pytest.param({"name": "train.x", "module": True}, False, id="module-under-a-file"),
])
def test_probe_finds_the_script_or_module_in_the_workdir(tmp_path: Path, entry, found) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.py").write_text("")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (tmp_path / "mypkg" / "train.py").write_text("")
    assert probe.read_entry(str(tmp_path), entry)["found"] is found


def test_probe_entry_through_the_real_probe(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    for name, ok in (("train.py", True), ("missing.py", False)):
        out = run_probe({"workdir": str(tmp_path), "entry": {"name": name}})
        assert out["errors"] == {}
        assert NodeFacts.from_json(out).entry_ok is ok
    assert NodeFacts.from_json(run_probe({"workdir": str(tmp_path)})).entry_ok is None


def test_where_and_the_exact_exclude() -> None:
    from launcher.hosts.where import exclude_option, failed_hosts_lines, leave_out_hint, where
    from launcher.models import Host

    hosts = [Host("node3", source="hosts.txt:1"), Host("node1", source="hosts.txt:2"),
             Host("gpu01", source="hosts.txt:3"), Host("gpu02", source="hosts.txt:3"),
             Host("x1", source="-H")]
    assert where(hosts[2:4]) == "hosts.txt:3"
    assert where([hosts[1], hosts[0]]) == "hosts.txt:2,1"
    assert where(hosts[4:]) == ""
    assert exclude_option(hosts[2:4]) == "--exclude 'gpu[01-02]'"
    errors = {"gpu02": "refused", "node3": "timed out", "gpu01": "refused", "x1": "refused"}
    assert failed_hosts_lines(hosts, errors) == [
        "node3 (hosts.txt:1): timed out", "gpu[01-02],x1 (hosts.txt:3): refused"]
    assert leave_out_hint(hosts[:1]) == "fix it, or leave it out: --exclude node3"


def test_gather_groups_come_in_hostfile_order() -> None:
    from launcher.models import OutputLine
    from launcher.output.console import Gatherer

    g = Gatherer(["node3", "node1", "node2"])
    g.add([OutputLine("node2", "out", "b"), OutputLine("node1", "out", "a"),
           OutputLine("node3", "out", "b"), OutputLine("extra", "out", "c")])
    assert [hosts for hosts, _ in g.groups()] == ["node[2-3]", "node1", "extra"]


def test_summary_labels_say_what_happened() -> None:
    """A rank that exited on its own is a failure; every torchrun dtrain stopped is labelled
    alike (the root cause's node too)."""
    from launcher.decide.outcome.outcomes import Failure
    from tests.test_failures import _node, _outcome, _verdict

    stop = "b rank 1 exited 7"
    out = _outcome(
        nodes={"a": _node("a", 137, {"0": {"code": 143, "signal": 15, "t": 5.2}},
                          stopped=stop, signal=9),
               "b": _node("b", 137, {"1": {"code": 7, "signal": None, "t": 5.0}},
                          stopped=stop, signal=9),
               "c": _node("c", 137, {"2": {"code": 2, "signal": None, "t": 5.1}},
                          stopped=stop, signal=9)},
        failures=[Failure("rank", "b", rank=1, code=7, t=5.0, seen=5.01)],
        stop_reason=stop, stop_t=5.02)
    _, lines = _verdict(out, "a", "b", "c")
    by_host = {ln.split()[0]: ln for ln in lines[1:4]}
    assert "r2 exit 2 (failed too)" in by_host["c"]
    assert "r0 SIGTERM (143) (stopped by dtrain)" in by_host["a"]
    for host in "abc":
        assert by_host[host].endswith("torchrun SIGKILL (137) after 10.0s (stopped by dtrain)")


def test_ctrl_c_is_interrupted_not_failed() -> None:
    from tests.test_failures import _node, _outcome, _verdict

    _, lines = _verdict(_outcome(nodes={"a": _node("a", 143)}, interrupted=2,
                                 interrupted_t=1.0), "a")
    assert lines[0] == "interrupted by Ctrl-C (exit 130)"


def test_counts_and_the_dry_run_explains_itself() -> None:
    import io

    from launcher.commands.run import render_plan
    from launcher.text.words import count

    assert (count(1, "node"), count(3, "node")) == ("1 node", "3 nodes")

    class Var:
        name, value, exported, source, reason = ("NCCL_SOCKET_IFNAME", "=ens1f0", True,
                                                 "detected", "route to the master")

    class Node:
        node_rank, nproc, env, warnings, container = 0, 1, [Var()], [], None
        ranks = range(0, 1)

        class host:  # noqa: N801
            label, source = "node1", "hosts.txt:1"

        def node_added(self) -> tuple[()]:  # what the supervisor adds: nothing here
            return ()

    class Plan:
        master_addr, master_port, master_reason = "198.18.0.11", 29500, "single"
        world_size, rdzv, nodes = 1, "static", [Node()]
        offline = False

        @staticmethod
        def shown_env(node: Node) -> dict[str, str]:
            return {v.name: v.value for v in node.env}

        @staticmethod
        def shown_argv(node: Node) -> tuple[str, ...]:
            return ("python3", "-m", "torch.distributed.run", "train.py")

    out = io.StringIO()
    render_plan(Plan(), out, workdir="/home/me/proj",  # type: ignore[arg-type]
                setup="source venv/bin/activate")
    text = out.getvalue()
    assert "working directory on every node: /home/me/proj\n" in text
    assert "setup, run first on every node: source venv/bin/activate\n" in text
    assert "the leading '=' makes NCCL use exactly ens1f0" in text


def test_readme_and_docs_hold_no_machine_specific_paths_and_first_run_is_clean() -> None:
    import re
    import tomllib

    repo = Path(__file__).resolve().parent.parent
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("**/*.md"))]:
        text = doc.read_text()
        assert not re.search(r"\.pyenv|/work/|/root/\S", text), doc
    readme = (repo / "README.md").read_text()
    assert "python3 -m venv" in readme and "| 1 |" in readme and "> hosts.txt" in readme
    extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("numpy") for d in extras["optional-dependencies"]["torch"])


def test_user_docs_are_separate_from_internals() -> None:
    """docs/output-and-archive.md says what a user sees; the classes are in internals."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    user = (docs / "output-and-archive.md").read_text()
    for name in ("OutputPipeline", "ConsoleSink", "LineSplitter", "RunArchive", "write_lines",
                 "flush_if_due", "replay(", "StderrFolder", "Console("):
        assert name not in user, name
    assert "internals/output.md" in user
    internals = (docs / "internals" / "output.md").read_text()
    for name in ("OutputPipeline.feed", "ConsoleSink", "StderrFolder", "ShutdownChatter"):
        assert name in internals, name
