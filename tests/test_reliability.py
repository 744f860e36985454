"""What the fault campaign (bench/soak.py, docs/reliability.md) found, as regressions that
run without the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.util import REPO, TRACEBACK

# Ctrl-C while `dtrain` still imports its CLI (seconds on a loaded box): the interrupt is
# raised where the import stands, here at the import of launcher.cli.run, deterministically
INTERRUPTED_IMPORT = """
import sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "launcher.cli.run":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Interrupt())
from launcher.cli import main
main()
"""


def _dtrain_interrupted(script: str, *args: str, tmp: Path | None = None
                        ) -> subprocess.CompletedProcess[str]:
    """``script`` as `python -c`, or with ``tmp`` as `python -m` (as `python -m launcher`
    runs: only there does the interpreter's exit honour its "unhandled interrupt" mark after
    a SystemExit; a script's SystemExit exits at once)."""
    if tmp is None:
        return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    (tmp / "interrupted_dtrain.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(tmp)}
    return subprocess.run([sys.executable, "-m", "interrupted_dtrain", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)


def _exit_130_quietly(res: subprocess.CompletedProcess[str]) -> None:
    assert not TRACEBACK.search(res.stderr), res.stderr[-2000:]
    # -2: the interpreter killed itself with SIGINT after dtrain caught the Ctrl-C
    assert res.returncode == 130, (res.returncode, res.stderr[-2000:])


def test_ctrl_c_while_the_cli_imports_is_exit_130_without_a_traceback() -> None:
    _exit_130_quietly(_dtrain_interrupted(INTERRUPTED_IMPORT, "--version"))


def test_ctrl_c_inside_generated_code_at_import_is_exit_130_not_death_by_sigint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The campaign's "dtrain dies by SIGINT ~2.5 s after the start, silently": the Ctrl-C
    landed while an imported module made a dataclass (whose methods are exec'd strings).
    dtrain caught it and raised SystemExit(130), but CPython had marked an interrupt raised
    inside exec of a string as unhandled and, after its finalization, killed itself with
    SIGINT: the parent saw -2 (4 of 6 tries by hand). Here the interrupt is raised the same
    way (inside exec'd code) at the import of launcher.cli.run, deterministically, under
    `python -m` as the campaign runs dtrain."""
    script = INTERRUPTED_IMPORT.replace("raise KeyboardInterrupt",
                                        'exec("raise KeyboardInterrupt")')
    _exit_130_quietly(_dtrain_interrupted(script, "--version", tmp=tmp_path))


# Ctrl-C while typer builds the command (it evaluates every option's annotation, ~0.1 s of
# `dtrain run`'s start): before typer's own Ctrl-C handling, the KeyboardInterrupt escaped
# main() with Python's traceback
INTERRUPTED_BUILD = """
import sys
import typer.main
def get_command(app):
    exec("raise KeyboardInterrupt")  # as when it lands in an annotation's evaluation
typer.main.get_command = get_command
from launcher.cli import main
main()
"""

# Ctrl-C caught by a command's body (run_body: exit 130) after it was raised inside exec'd
# code: the interpreter's mark survived the body's handling, the process died by SIGINT
INTERRUPTED_BODY = """
import launcher.commands.runs as runs
def ps(*args, **kwargs):
    exec("raise KeyboardInterrupt")
runs.ps = ps
from launcher.cli import main
main()
"""


def test_ctrl_c_while_typer_builds_the_command_is_exit_130_without_a_traceback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _exit_130_quietly(_dtrain_interrupted(INTERRUPTED_BUILD, "ps", tmp=tmp_path))


def test_ctrl_c_caught_by_a_commands_body_is_exit_130_not_death_by_sigint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _exit_130_quietly(_dtrain_interrupted(INTERRUPTED_BODY, "ps", "--archive-dir",
                                          str(tmp_path), tmp=tmp_path))


class _FullDisk:
    """A file whose every write and flush fails as on a full disk."""

    def write(self, data: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        self.flush()


def test_a_full_archive_disk_is_one_warning_not_the_runs_end(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The archive's filesystem full (the campaign's small tmpfs): every archive write
    raised ENOSPC up through the job, a traceback that ended the run; now the archive stops
    with one warning and the run goes on (the console still shows its lines)."""
    from launcher.models import OutputLine
    from launcher.output.archive import RunArchive

    archive = RunArchive.create(tmp_path, "full")
    archive._out = _FullDisk()  # type: ignore[assignment]

    def full(*a: object) -> None:
        raise OSError(28, "No space left on device")

    archive.dir.replace = full  # type: ignore[method-assign]
    archive.write_lines([OutputLine("n1", "out", "soak 0 1", 0, 0, 1.0)])
    archive.flush()
    archive.write_lines([OutputLine("n1", "out", "soak 0 2", 0, 0, 2.0)])
    archive.update_meta(end=3.0, exit_code=0)
    archive.close()
    assert archive.failed == "No space left on device"
    assert archive.meta["exit_code"] == 0  # kept in memory for the summary
    err = capsys.readouterr().err
    assert err.count("cannot write the archive") == 1, err


def test_ctrl_c_while_the_job_starts_is_recorded_as_interrupted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The campaign's ctrl-c-start: a Ctrl-C after the run's archive exists but before the
    job ran reaches the run's body as CancelledError (asyncio.run cancels it); meta.json said
    "launcher ended early: CancelledError", exit_code null, no root cause, while dtrain exited
    130. Now: exit_code 130 and a root cause that names the interrupt."""
    import asyncio
    import json
    from types import SimpleNamespace

    import pytest

    from launcher.commands.launch import held_run
    from launcher.decide.runplan.runoptions import Reports, RunOptions

    req, opts = SimpleNamespace(run_id="cc"), RunOptions(reports=Reports(archive_dir=tmp_path))
    with pytest.raises(asyncio.CancelledError), held_run(req, opts, None):  # type: ignore[arg-type]
        raise asyncio.CancelledError
    meta = json.loads((tmp_path / "cc" / "meta.json").read_text())
    assert meta["exit_code"] == 130 and meta["state"] == "finished", meta
    assert meta["root_cause"]["kind"] == "interrupted", meta


def _torchrun_case(first: str, node_code: int, node_signal: int | None,
                   tail: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """node a's torchrun ended (``node_code``/``node_signal``); its rank 0 was asked to stop
    by its node (stop_signal 15: the supervisor's teardown after torchrun's death, or
    torchrun passing its own SIGTERM on) and died of it; node b's rank was stopped by dtrain.
    ``first``: which failure the launcher learned of first (node or rank)."""
    from launcher.decide.outcome.outcomes import Failure
    from tests.test_failures import _node, _outcome, _verdict

    stopped = {"code": 143, "signal": 15, "t": 5.1, "duration": 5.0, "stop_signal": 15}
    failure = Failure("node", "a", code=node_code, signal=node_signal, t=5.2, seen=5.2) \
        if first == "node" else Failure("rank", "a", rank=0, code=143, signal=15, t=5.1,
                                        seen=5.1)
    out = _outcome(
        nodes={"a": _node("a", node_code, {"0": stopped}, signal=node_signal,
                          stderr_tail=tuple(tail)),
               "b": _node("b", 1, {"1": {**stopped, "t": 5.4}}, stopped="a failed")},
        failures=[failure], stop_reason="a failed", stop_t=5.3)
    return _verdict(out, "a", "b")


def test_a_sigkilled_torchrun_is_the_root_cause_not_its_stopped_rank() -> None:
    """The campaign's torchrun-kill (3 of 3): torchrun SIGKILLed, the supervisor stopped
    what was left (the rank's shim: a stop, stop_signal 15), the node's exit (137) came
    first; the verdict took that node's "first failed rank" and said "rank 0 on a was
    killed by SIGTERM (not by dtrain)", exit 143."""
    v, lines = _torchrun_case("node", 137, 9)
    assert (v.code, v.root_kind, v.root_host, v.root_rank) == (137, "node", "a", None), v
    assert lines[0] == "FAILED: torchrun on a was killed by SIGKILL (exit 137)", lines
    assert "r0 SIGTERM (143) after 5.0s (stopped by dtrain)" in lines[1], lines


def test_a_sigtermed_torchrun_is_the_root_cause_with_the_signals_code() -> None:
    """The campaign's torchrun-term: torchrun passes its SIGTERM on to its workers, the rank's
    exit (stop_signal 15) arrives first, torchrun then exits 1 with its SignalException; the
    verdict said "rank 3 on node12 was killed by SIGTERM"."""
    tail = ("Traceback (most recent call last):",
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 28347 "
            "got signal: 15")
    v, lines = _torchrun_case("rank", 1, None, tail)
    assert (v.code, v.root_kind, v.root_host, v.root_rank) == (143, "node", "a", None), v
    assert lines[0].startswith("FAILED: torchrun on a got SIGTERM and ended"), lines
    v, lines = _torchrun_case("node", 1, None, tail)  # the node's exit first: the same story
    assert (v.code, v.root_kind, v.root_host) == (143, "node", "a"), v


def test_a_rank_killed_from_outside_is_still_the_root_cause() -> None:
    """Not every SIGTERMed rank is a follower: one its shim got from outside (no
    stop_signal) stays the root cause, its node's torchrun failing after it."""
    from launcher.decide.outcome.outcomes import Failure
    from tests.test_failures import _node, _outcome, _verdict

    out = _outcome(nodes={"a": _node("a", 1, {"0": {"code": 143, "signal": 15, "t": 5.1,
                                                    "duration": 5.0}})},
                   failures=[Failure("rank", "a", rank=0, code=143, signal=15, t=5.1,
                                     seen=5.1)])
    v, _ = _verdict(out, "a")
    assert (v.code, v.root_kind, v.root_rank) == (143, "rank", 0), v
    out = _outcome(nodes={"a": _node("a", 1, {"0": {"code": 143, "signal": 15, "t": 5.1,
                                                    "duration": 5.0}})},
                   failures=[Failure("node", "a", code=1, t=5.2, seen=5.2)])
    v, _ = _verdict(out, "a")
    assert (v.code, v.root_kind, v.root_rank) == (143, "rank", 0), v


async def test_a_supervisor_that_stopped_its_job_by_itself_is_the_root_cause_not_its_victim(
        ) -> None:
    """The campaign's supervisor-term: node a's supervisor got SIGTERM (from outside) and
    tore its job down; over gloo, rank 1 on b saw "Connection reset by peer" and its exit 1
    came first: a victim, whose failure holds the stop (Policy.peer_hold). Node a's exit
    (stopped: "supervisor got signal 15", though dtrain asked no one to stop) then only
    followed: the verdict said "rank 1 on b exited 1". Now that node is the root cause, 143."""
    import asyncio

    from launcher.decide.outcome.outcomes import Failure
    from launcher.job.orchestrate import Job, Policy
    from launcher.models import Host
    from tests.test_failures import _node, _outcome, _verdict

    class Router:
        def flush(self, label: str) -> None:
            pass

    job = Job([Host("a"), Host("b")], {}, Policy(peer_hold=30.0), Router(),  # type: ignore[arg-type]
              victim=lambda f: f.host == "b")
    job.sessions = {"a": None, "b": None}  # type: ignore[dict-item]
    stops: list[str] = []
    job._stopping_now = lambda why, tg: stops.append(why)  # type: ignore[method-assign]
    async with asyncio.timeout(10), asyncio.TaskGroup() as tg:
        job._failed(Failure("rank", "b", rank=1, code=1, t=5.0, seen=5.0), tg)
        assert job._hold is not None and not stops  # the victim holds the stop
        node_a = _node("a", 1, {"0": {"code": 143, "signal": 15, "t": 4.9, "duration": 4.0,
                                      "stop_signal": 15}}, stopped="supervisor got signal 15")
        job._node_done("a", node_a, tg)
    assert job._hold is None and len(stops) == 1, stops
    assert [(f.kind, f.host) for f in job.outcome.failures][0] == ("node", "a")
    out = _outcome(nodes={"a": node_a, "b": _node("b", 1, {"1": {"code": 1, "t": 5.0}})},
                   failures=job.outcome.failures)
    v, lines = _verdict(out, "a", "b")
    assert (v.code, v.root_kind, v.root_host) == (143, "node", "a"), v
    assert lines[0] == ("FAILED: dtrain's supervisor on a got SIGTERM (not from dtrain) and "
                        "stopped its job (exit 143)"), lines


async def test_a_torchrun_that_ended_first_is_the_root_cause_not_a_peers_abort() -> None:
    """The campaign's torchrun-term over gloo: node a's torchrun got SIGTERM and passed it on
    to its rank (a stop: no failure), rank 2 on b aborted in its broken all_reduce (SIGABRT:
    a victim, holding the stop), then node a's exit came (torchrun exit 1, SignalException):
    it only followed and the verdict said "rank 2 on b was killed by SIGABRT", 134."""
    import asyncio

    from launcher.decide.outcome.outcomes import Failure
    from launcher.decide.outcome.verdict import TailKeeper, summary_lines, verdict
    from launcher.job.orchestrate import Job, Policy
    from launcher.models import Host, OutputLine
    from tests.test_failures import _node, _outcome, _plan

    class Router:
        def flush(self, label: str) -> None:
            pass

    job = Job([Host("a"), Host("b")], {}, Policy(peer_hold=30.0), Router(),  # type: ignore[arg-type]
              victim=lambda f: f.host == "b")
    job.sessions = {"a": None, "b": None}  # type: ignore[dict-item]
    stops: list[str] = []
    job._stopping_now = lambda why, tg: stops.append(why)  # type: ignore[method-assign]
    node_a = _node("a", 1, {"0": {"code": 143, "signal": 15, "t": 4.9, "duration": 4.0,
                                  "stop_signal": 15}})
    async with asyncio.timeout(10), asyncio.TaskGroup() as tg:
        job._failed(Failure("rank", "b", rank=2, code=134, signal=6, t=5.0, seen=5.0), tg)
        assert job._hold is not None and not stops
        job._node_done("a", node_a, tg)
    assert job._hold is None and len(stops) == 1, stops
    out = _outcome(nodes={"a": node_a, "b": _node("b", 1, {"2": {"code": 134, "signal": 6,
                                                                 "t": 5.0}})},
                   failures=job.outcome.failures)
    tails = TailKeeper()
    tails.add([OutputLine("a", "err", "torch.distributed.elastic.multiprocessing.api."
                                      "SignalException: Process 9 got signal: 15", None, 0, 5.1)])
    v = verdict(out, _plan("a", "b"), tails)  # type: ignore[arg-type]
    assert (v.code, v.root_kind, v.root_host) == (143, "node", "a"), v
    assert summary_lines(out, _plan("a", "b"), v)[0].startswith(  # type: ignore[arg-type]
        "FAILED: torchrun on a got SIGTERM"), v


def test_a_torchrun_stopped_after_its_ranks_ended_is_a_hang_on_that_node() -> None:
    """The campaign's torchrun-stop: node a's torchrun got SIGSTOP; its rank ran to its end
    (exit 0) and torchrun could not: its supervisor saw it stopped 5 s and ended the job
    (stopped: AGENT_STOPPED_REASON). The verdict is a hang on node a (125), not "node a
    stopped its job by itself" with torchrun's exit code."""
    from launcher.decide.outcome.outcomes import Failure
    from launcher.nodeside.supervisor import AGENT_STOPPED_REASON
    from tests.test_failures import _node, _outcome, _verdict

    node_a = _node("a", 143, {"0": {"code": 0, "t": 4.0, "duration": 4.0}},
                   stopped=AGENT_STOPPED_REASON % 5)
    out = _outcome(nodes={"a": node_a, "b": _node("b", 143, {"1": {"code": 0, "t": 4.0}})},
                   failures=[Failure("node", "a", code=143, t=9.5, seen=9.5,
                                     own_stop=AGENT_STOPPED_REASON % 5, led=True)])
    v, lines = _verdict(out, "a", "b")
    assert (v.code, v.root_kind, v.root_host) == (125, "hang", "a"), v
    assert lines[0].startswith("FAILED: torchrun on a was stopped (SIGSTOP or SIGTSTP, not "
                               "from dtrain) after every rank there ended"), lines


def test_a_node_that_heard_nothing_from_dtrain_is_a_lost_node_not_torchruns_exit_1() -> None:
    """The campaign's link-loss at 30 % each way: node a's supervisor heard no heartbeat for
    3 timeouts and stopped its job as orphaned; torchrun, SIGTERMed by it, exited 1. The
    verdict is a lost node (255, the class of a cut link), not "exit 1", which says a
    rank's own code to a CI pipeline."""
    from launcher.decide.outcome.outcomes import Failure
    from launcher.nodeside.supervisor import LAUNCHER_SILENT_REASON
    from tests.test_failures import _node, _outcome, _verdict

    why = LAUNCHER_SILENT_REASON % 12
    node_a = _node("a", 1, {"0": {"code": 143, "signal": 15, "t": 4.0, "stop_signal": 15}},
                   stopped=why)
    node_b = _node("b", 143, {"1": {"code": 143, "signal": 15, "t": 5.0, "stop_signal": 15}},
                   stopped="a failed (exit 1)")
    out = _outcome(nodes={"a": node_a, "b": node_b},
                   failures=[Failure("node", "a", code=1, t=4.5, seen=4.5, own_stop=why,
                                     led=True)])
    v, lines = _verdict(out, "a", "b")
    assert (v.code, v.root_kind, v.root_host) == (255, "lost", "a"), v
    assert lines[0].startswith("FAILED: node a heard nothing from dtrain for 12 s and stopped "
                               "its job"), lines
