"""Console folding of repeated stderr lines and of torchrun's shutdown chatter (issue 12):
pure decision objects, fed OutputLines and a clock."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from launcher.hosts.hostfile import fold
from launcher.models import OutputLine
from launcher.output.console import Console
from launcher.output.fold import (
    FOLDED,
    ExitBarrierNoise,
    ShutdownChatter,
    StderrFolder,
    fold_key,
    is_shutdown_chatter,
    rank_ranges,
)
from launcher.output.pipeline import OutputPipeline

W = "/x/site-packages/torch/nn/modules/module.py:1: UserWarning: something is deprecated"


class MemoryArchive:
    """The archive's writing side, keeping every line in memory (what the pipeline wrote)."""

    def __init__(self) -> None:
        self.lines: list[OutputLine] = []

    def write_lines(self, lines: list[OutputLine]) -> None:
        self.lines.extend(lines)

    def flush_if_due(self, _s: float) -> None: ...

    def close(self) -> None: ...



def err(rank: int, text: str = W, host: str | None = None, t: float = 0.0) -> OutputLine:
    return OutputLine(host or f"node{rank // 4 + 1}", "err", text, rank, rank // 4, t)


def out(rank: int, text: str) -> OutputLine:
    return OutputLine(f"node{rank // 4 + 1}", "out", text, rank, rank // 4)


def shown(lines: list[OutputLine]) -> list[str]:
    con = Console(io.StringIO(), color=False)
    return [con.format_line(line) for line in lines]


def folder(ranks: int = 8, nodes: int = 2, window: float = 0.75) -> StderrFolder:
    return StderrFolder(ranks, nodes, window=window, fold_hosts=fold)


def test_the_same_line_on_every_rank_is_shown_once_with_a_folded_tag() -> None:
    f = folder()
    got: list[OutputLine] = []
    for r in range(7):
        got += f.feed([err(r)], now=0.1 * r)
    assert got == []  # held: 7 of 8 ranks so far, within the window
    got += f.feed([err(7)], now=0.7)  # the group is complete: out at once
    assert shown(got) == [f"node[1-2] r0-7 [err]: {W}"]
    assert got[0].node_rank == FOLDED and f.held == 0


def test_stdout_is_never_held_or_folded() -> None:
    f = folder()
    assert f.feed([err(0)], now=0.0) == []
    lines = [out(0, "loss 1.0"), out(1, "loss 1.0")]
    assert f.feed(lines, now=0.01) == lines


def test_a_line_is_held_at_most_the_window() -> None:
    f = folder(window=0.75)
    f.feed([err(0)], now=0.0)
    f.feed([err(5)], now=0.2)
    assert f.next_deadline == 0.75
    assert f.release(0.74) == []
    assert shown(f.release(0.75)) == [f"node1,node2 r0,5 [err]: {W}".replace(
        "node1,node2", "node[1-2]")]
    f.feed([err(3)], now=0.8)  # too late for that group: a new one
    assert shown(f.release(1.55)) == [f"node1 r3 [err]: {W}"]


def test_one_rank_alone_is_shown_with_its_own_tag() -> None:
    f = folder()
    f.feed([err(2, "only me")], now=0.0)
    assert f.release(1.0) == [err(2, "only me")]


def test_a_world_of_one_rank_holds_nothing() -> None:
    f = StderrFolder(1, 1)
    assert f.feed([err(0, "x")], now=0.0) == [err(0, "x")]


def test_order_per_rank_is_kept() -> None:
    """rank 1 prints A then B; B's group was opened earlier by rank 0: rank 1's B must not
    come out before its A, so it starts a group of its own."""
    f = folder(ranks=2, nodes=1)
    f.feed([err(0, "B")], now=0.0)
    f.feed([err(1, "A")], now=0.1)
    f.feed([err(1, "B")], now=0.2)
    got = f.release(5.0)
    assert [(line.rank, line.text) for line in got] == [(0, "B"), (1, "A"), (1, "B")]


def test_a_complete_group_waits_for_a_rank_s_earlier_line() -> None:
    f = folder(ranks=2, nodes=1)
    assert f.feed([err(0, "only 0")], now=0.0) == []
    assert f.feed([err(0, "both"), err(1, "both")], now=0.1) == []  # complete, but behind
    got = f.release(0.75)
    assert shown(got) == ["node1 r0 [err]: only 0", "node1 r0-1 [err]: both"]


def test_a_traceback_on_every_rank_folds_line_by_line() -> None:
    tb = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
          "RuntimeError: boom"]
    f = folder(ranks=4, nodes=1)
    got: list[OutputLine] = []
    for r in range(4):
        got += f.feed([err(r, t, host="node1") for t in tb], now=0.01 * r)
    assert shown(got) == [f"node1 r0-3 [err]: {t}" for t in tb]


def test_log_timestamps_do_not_prevent_folding() -> None:
    a = "[W1130 12:01:37.099694116 socket.cpp:207] [c10d] The hostname cannot be retrieved."
    b = "[W1130 12:01:37.169527346 socket.cpp:207] [c10d] The hostname cannot be retrieved."
    assert fold_key(a) == fold_key(b) == "[W socket.cpp:207] [c10d] The hostname cannot be " \
        "retrieved."
    c = "W1130 12:01:37.645000 18103 site-packages/torch/x.py:753] Received 15 death signal"
    assert fold_key(c) == "W site-packages/torch/x.py:753] Received 15 death signal"
    assert fold_key("Warning: plain") == "Warning: plain"
    f = folder(ranks=2, nodes=1)
    assert shown(f.feed([err(0, a), err(1, b)], now=0.0)) == [f"node1 r0-1 [err]: {a}"]


def test_agent_lines_fold_across_nodes() -> None:
    f = folder(ranks=8, nodes=2)
    line = "torchrun: some agent warning"
    got = f.feed([OutputLine("node1", "err", line), OutputLine("node2", "err", line)], 0.0)
    assert shown(got) == [f"node[1-2] [err]: {line}"]


def test_a_flood_of_distinct_lines_is_let_go_beyond_the_bound() -> None:
    f = StderrFolder(8, 2, max_held=10)
    got = f.feed([err(0, f"line {i}") for i in range(15)], now=0.0)
    assert [line.text for line in got] == [f"line {i}" for i in range(5)]
    assert [line.text for line in f.flush()] == [f"line {i}" for i in range(5, 15)]


def test_rank_ranges() -> None:
    assert rank_ranges([9, 0, 1, 2, 3, 6, 8]) == "0-3,6,8-9"
    assert rank_ranges([4]) == "4"


def test_folded_tag_on_a_colour_console_does_not_widen_the_columns() -> None:
    con = Console(io.StringIO(), color=True, labels=["node1", "node2"], world_size=8)
    folded = OutputLine("node[1-2] r0-7", "err", "x", None, FOLDED)
    assert "node[1-2] r0-7" in con.format_line(folded)
    assert con.format_line(out(0, "y")).startswith("\x1b[36mnode1 r0")  # unchanged width
    assert con._host_w == 5


async def test_the_pipeline_folds_on_the_console_and_archives_every_line() -> None:
    stream = io.StringIO()
    con = Console(stream, color=False)
    archive = MemoryArchive()
    archived = archive.lines

    f = StderrFolder(3, 1, window=0.2)
    async with OutputPipeline(con, archive, folder=f) as pipe:  # type: ignore[arg-type]
        for r in range(3):
            pipe.feed("node1", r, "err", b"warn\n")
        pipe.feed("node1", 0, "err", b"alone\n")
        pipe.feed("node1", 0, "out", b"loss 1\n")
        # "alone" goes out by the timer once its window passes, while the pipeline is still
        # open (closing it would flush it too, so that would prove nothing): wait for it
        deadline = asyncio.get_running_loop().time() + 30
        while "alone" not in stream.getvalue():
            assert asyncio.get_running_loop().time() < deadline, stream.getvalue()
            await asyncio.sleep(0.02)
        assert f.held == 0
        shown_while_open = stream.getvalue().splitlines()
    assert shown_while_open == [
        "node1 r0-2 [err]: warn", "node1 r0: loss 1", "node1 r0 [err]: alone"]
    assert stream.getvalue().splitlines() == shown_while_open
    assert len(archived) == 5


def test_a_filtered_console_does_not_fold() -> None:
    con = Console(io.StringIO(), color=False, ranks=[1])
    assert OutputPipeline(con, folder=StderrFolder(2, 1)).folder is None


# -- torchrun's shutdown chatter -----------------------------------------------------------

AGENT = [  # what a torchrun agent printed on node3 when dtrain stopped the job (torch 2.13)
    "W1130 12:01:37.673000 18102 site-packages/torch/distributed/elastic/agent/server/api.py:"
    "753] Received 15 death signal, shutting down workers",
    "W1130 12:01:37.674000 18102 site-packages/torch/distributed/elastic/multiprocessing/api.py"
    ":1028] Sending process 18179 closing signal SIGTERM",
    "Traceback (most recent call last):",
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    "    time.sleep(monitor_interval)",
    "             ^^^^^^^^^^^^^^^^^^^^^^",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 18102 got signal: 15",
]


@pytest.mark.parametrize("text", AGENT[:2])
def test_agent_log_lines_are_chatter(text: str) -> None:
    assert is_shutdown_chatter(text, False) == (True, False)


# torchrun's ChildFailedError block after a rank's shim died (issue 40): every line
CHILD_FAILED = [
    "============================================================",
    "/tmp/dtrain-nlg2j0kn/dtrain_shim.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2026-12-03_07:01:28",
    "  exitcode  : -9 (pid: 478)",
]


@pytest.mark.parametrize("text", CHILD_FAILED)
def test_torchruns_child_failed_block_is_chatter(text: str) -> None:
    assert is_shutdown_chatter(text, False) == (True, False)


def test_a_traceback_is_chatter_to_its_exception_line() -> None:
    state = False
    for text in AGENT[2:]:
        chatter, state = is_shutdown_chatter(text, state)
        assert chatter
    assert state is False
    assert is_shutdown_chatter("some other agent line", False) == (False, False)


def test_chatter_leaves_the_console_only_while_stopping_and_only_the_agent_s() -> None:
    c = ShutdownChatter()
    agent = [OutputLine("node3", "err", t) for t in AGENT]
    assert all(c.keep(line) for line in agent)  # not stopping yet: everything shows
    c.stopping = True
    assert not any(c.keep(line) for line in agent)
    rank_tb = OutputLine("node1", "err", "Traceback (most recent call last):", 1)
    assert c.keep(rank_tb)  # a rank's own traceback is the genuine failure: shown
    assert c.keep(OutputLine("node2", "err", "unrelated agent line"))
    assert c.keep(OutputLine("node2", "out", AGENT[0]))
    assert c.summary(["node1", "node2", "node3"]) == [
        ("node3", "torchrun shutting down (7 lines in the archive)")]
    assert c.summary() == []  # said once


# what a torchrun agent (torch 2.13) printed after its ranks finished, when the agent that
# hosts the rendezvous store passed the exit barrier and exited first
_P = "E1202 03:45:50.486000 13392 /x/torch/distributed/elastic/agent/server/api.py:1009]"
BARRIER = [
    "[W1202 03:45:50.761425662 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on "
    "SocketImpl(fd=5, addr=[::ffff:198.18.0.13]:46262, remote=[::ffff:198.18.0.11]:29500): "
    "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
    "shutdown or crash?",
    "Exception raised from recvBytes at /__w/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787"
    " (most recent call first):",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f47 in libc10.so)",
    "frame #1: <unknown function> + 0x674888d (0x7f47df94888d in libtorch_cpu.so)",
    "<omitting python frames>",
    "frame #20: _start + 0x21 (0x56123f636081 in python3)",
    "",
    f"{_P} Error waiting on exit barrier. Elapsed: 0.00732111930847168 seconds",
    f"{_P} Traceback (most recent call last):",
    f'{_P}   File "/x/torch/distributed/elastic/agent/server/api.py", line 1001, in _exit_barrier',
    f"{_P}     store_util.barrier(",
    f"{_P} torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was "
    "likely closed. Did the remote server shutdown or crash?",
]


def test_the_exit_barrier_trace_of_a_finished_node_is_one_line_on_the_console() -> None:
    b = ExitBarrierNoise({"node2": 2, "node3": 2})
    agent = [OutputLine("node2", "err", t) for t in BARRIER]
    assert all(b.keep(line) for line in agent)  # its ranks still run: everything shows
    b.rank_exit("node2", 0)
    assert all(b.keep(line) for line in agent)  # one of two
    b.rank_exit("node2", 0)
    assert not any(b.keep(line) for line in agent)
    # what is not the trace still shows: the agent's next line, a rank's line, stdout
    assert b.keep(OutputLine("node2", "err", "some later agent line"))
    assert b.keep(OutputLine("node2", "err", BARRIER[-1], 1))
    assert b.keep(OutputLine("node2", "out", BARRIER[0]))
    # node3 had a rank fail: its agent's trace is the real story, shown whole
    b.rank_exit("node3", 0)
    b.rank_exit("node3", 1)
    assert all(b.keep(OutputLine("node3", "err", t)) for t in BARRIER)
    assert b.summary(["node1", "node2", "node3"]) == [
        ("node2", "torchrun's exit barrier failed after every rank here finished (the "
                  "rendezvous store's host left first: torch.distributed.DistNetworkError: "
                  "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
                  "server shutdown or crash?); harmless, 12 lines in the archive")]
    assert b.summary() == []  # said once


async def test_a_run_s_console_shows_the_exit_barrier_trace_as_one_line_the_archive_all() -> None:
    """Through dtrain run's pipeline (commands/launch/pipeline.py RunPipeline): node2's ranks exited
    0 (rank_exit), its agent prints the trace: the console has one line, the archive all."""
    from launcher.commands.launch import RunPipeline
    from launcher.decide.outcome.verdict import TailKeeper

    stream = io.StringIO()
    archive = MemoryArchive()
    archived = archive.lines

    async with RunPipeline(Console(stream, color=False), archive,
                           tails=TailKeeper(), folder=StderrFolder(2, 2)) as pipe:
        pipe.barrier.ranks = {"node1": 1, "node2": 1}
        pipe.feed("node2", 1, "out", b"done 1\n")
        pipe.barrier.rank_exit("node2", 0)
        pipe.feed("node2", None, "err", ("\n".join(BARRIER) + "\n").encode())
        pipe.feed("node1", None, "err", b"an agent line of a node still running\n")
        pipe.job_over(["node1", "node2"])
    console = stream.getvalue().splitlines()
    assert console[:2] == ["node2 r1: done 1",
                           "node1 [err]: an agent line of a node still running"], console
    assert len(console) == 3 and console[2].startswith(
        "dtrain: node2: torchrun's exit barrier failed after every rank here finished"), console
    assert "12 lines in the archive" in console[2]
    assert [ln.text for ln in archived if ln.host == "node2" and ln.stream == "err"] == BARRIER


async def test_torchrun_s_block_printed_just_before_the_stop_is_folded_too() -> None:
    """The shim SIGKILLed: torchrun prints its ChildFailedError block while the supervisor
    reports the death, and the block may reach the launcher first. The folder holds an
    agent's stderr a moment; the chatter is told as the lines leave it, so a stop that
    began meanwhile folds the block (it was shown whole when told on arrival)."""
    from launcher.commands.launch import RunPipeline
    from launcher.decide.outcome.verdict import TailKeeper

    block = ["E1203 23:20:57.163000 20278 site-packages/torch/distributed/elastic/"
             "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 20350) "
             "of binary: python3",
             "Traceback (most recent call last):", '  File "run.py", line 5, in <module>',
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "=" * 54, "/tmp/d/dtrain_shim.py FAILED", "-" * 54, "Failures:",
             "  <NO_OTHER_FAILURES>", "Root Cause (first observed failure):", "[0]:",
             "  exitcode  : -9 (pid: 20350)  (SIGKILL)", "=" * 54]
    stream = io.StringIO()
    async with RunPipeline(Console(stream, color=False), MemoryArchive(),
                           tails=TailKeeper(), folder=StderrFolder(2, 2)) as pipe:
        pipe.feed("node2", None, "err", ("\n".join(block) + "\n").encode())
        pipe.stopping()  # the rank's death reached the launcher a moment later
        pipe.feed("node1", 0, "out", b"after\n")
        pipe.job_over(["node1", "node2"])
    console = stream.getvalue().splitlines()
    assert console == ["node1 r0: after",
                       "dtrain: node2: torchrun shutting down (13 lines in the archive)"], console


async def test_chatter_after_the_stop_is_counted_per_node_never_folded_across_nodes() -> None:
    """Every stopped agent says the same ("Received 15 death signal"): judged on arrival,
    each node's line is its own node's chatter, not one line folded across the nodes that
    the console would count under "node[2-3]" (and `dtrain logs` could not replay)."""
    from launcher.commands.launch import RunPipeline
    from launcher.decide.outcome.verdict import TailKeeper

    said = ("W1204 00:02:29.6{} 93{} site-packages/torch/distributed/elastic/agent/server/"
            "api.py:753] Received 15 death signal, shutting down workers\n")
    stream = io.StringIO()
    async with RunPipeline(Console(stream, color=False), MemoryArchive(),
                           tails=TailKeeper(), folder=StderrFolder(6, 3)) as pipe:
        pipe.stopping()
        for k in (2, 3):
            pipe.feed(f"node{k}", None, "err", said.format(k, k).encode())
        pipe.job_over(["node1", "node2", "node3"])
    assert stream.getvalue().splitlines() == [
        "dtrain: node2: torchrun shutting down (1 line in the archive)",
        "dtrain: node3: torchrun shutting down (1 line in the archive)"]


def test_an_exit_barrier_trace_without_torch_s_log_prefix_ends_at_its_exception() -> None:
    b = ExitBarrierNoise({"node2": 1})
    b.rank_exit("node2", 0)
    lines = ["Error waiting on exit barrier. Elapsed: 0.01 seconds",
             "Traceback (most recent call last):", '  File "api.py", line 1, in x', "    y()",
             "torch.distributed.DistStoreError: Connection reset by peer", "next line"]
    assert [b.keep(OutputLine("node2", "err", t)) for t in lines] == [False] * 5 + [True]
    assert "DistStoreError: Connection reset by peer); harmless, 5 lines" in b.summary()[0][1]
    # a timeout (a node never reached the barrier) is folded too, but no cause is claimed
    for t in ["Error waiting on exit barrier. Elapsed: 300.1 seconds",
              "Traceback (most recent call last):", "torch.distributed.DistStoreError: "
              "Socket Timeout"]:
        assert not b.keep(OutputLine("node2", "err", t))
    assert b.summary() == [("node2", "torchrun's exit barrier failed after every rank here "
                                     "finished: torch.distributed.DistStoreError: Socket "
                                     "Timeout (3 lines in the archive)")]


def test_a_traceback_ends_at_its_first_unindented_line_even_a_short_one() -> None:
    assert is_shutdown_chatter("E", True) == (True, False)
    assert is_shutdown_chatter(" x", True) == (True, True)
    assert is_shutdown_chatter("", True) == (True, True)


# --------------------------------------- the rest of fold.py's mutants (issue #25, round 4)


@pytest.mark.parametrize(("text", "key"), [
    pytest.param("I1130 12:01:37.645000 18103 x.py:1] hi", "I x.py:1] hi", id="info"),
    pytest.param("W1130 12:01:37.645000 18103 x.py:1] hm", "W x.py:1] hm", id="warning"),
    pytest.param("E1130 12:01:37.6 7 x.py:1] boom", "E x.py:1] boom", id="error"),
    pytest.param("F1130 12:01:37.6 x.py:1] fatal", "F x.py:1] fatal", id="fatal"),
    pytest.param("[E1130 12:01:37.099694116 socket.cpp:207] e", "[E socket.cpp:207] e",
                 id="glog-error"),
    pytest.param("i1130 12:01:37.645000 x", "i1130 12:01:37.645000 x", id="lower-case-kept"),
])
def test_every_severity_s_stamp_is_dropped_from_the_key(text: str, key: str) -> None:
    assert fold_key(text) == key


def test_an_error_stamped_microseconds_apart_on_two_ranks_folds() -> None:
    f = folder(ranks=2, nodes=1)
    got = f.feed([err(0, "E1130 12:01:37.000001 11 x.py:9] NCCL error"),
                  err(1, "E1130 12:01:37.000004 12 x.py:9] NCCL error")], now=0.0)
    assert shown(got) == ["node1 r0-1 [err]: E1130 12:01:37.000001 11 x.py:9] NCCL error"]


def test_a_folded_tag_without_a_host_folder_joins_hosts_with_commas() -> None:
    from launcher.output.fold import folded_tag

    assert folded_tag([("node2", 4), ("node1", 0), ("node2", 5)]) == "node2,node1 r0,4-5"
    assert folded_tag([("node2", None), ("node1", None)]) == "node2,node1"


def test_a_folded_line_keeps_the_first_rank_s_time() -> None:
    f = folder(ranks=2, nodes=1)
    got = f.feed([err(0, t=5.25), err(1, t=5.5)], now=0.0)
    assert [(line.node_rank, line.t) for line in got] == [(FOLDED, 5.25)]


def test_a_line_at_exactly_the_window_s_end_starts_a_new_group() -> None:
    f = folder(ranks=2, nodes=1, window=0.5)
    assert f.feed([err(0)], now=0.0) == []
    assert f.feed([err(1)], now=0.5) == []  # the first group's window is over: not joined
    assert shown(f.release(0.5)) == [f"node1 r0 [err]: {W}"]
    assert shown(f.flush()) == [f"node1 r1 [err]: {W}"]


def test_lines_two_ranks_printed_alike_go_out_once_each_when_the_window_ends() -> None:
    # both ranks' next line is the same held group: it is let go once, not twice
    f = folder(ranks=3, nodes=1, window=1.0)
    assert f.feed([err(0, "a"), err(1, "a"), err(0, "b"), err(1, "b")], now=0.0) == []
    assert shown(f.release(1.0)) == ["node1 r0-1 [err]: a", "node1 r0-1 [err]: b"]
    assert f.held == 0 and f.next_deadline is None


def test_past_the_bound_a_complete_group_waiting_on_the_let_go_one_follows_it() -> None:
    f = StderrFolder(2, 1, window=10.0, max_held=1)
    assert f.feed([err(0, "a")], now=0.0) == []  # held: rank 1 has not printed it
    # rank 0 then rank 1 print b: complete, but it waits for rank 0's a; over the bound, a is
    # let go, and b with it
    got = f.feed([err(0, "b"), err(1, "b")], now=0.0)
    assert [(line.host, line.text) for line in got] == [("node1", "a"), ("node1 r0-1", "b")]
    assert f.held == 0


def test_nothing_is_kept_for_lines_already_shown() -> None:
    # a long job prints many distinct lines: the folder must not keep one entry per text
    f = folder(ranks=2, nodes=1)
    for i in range(50):
        f.feed([err(0, f"step {i}"), err(1, f"step {i}")], now=float(i))
        f.feed([err(0, f"only rank 0 {i}")], now=float(i))
        f.feed([OutputLine("node1", "err", f"agent {i}")], now=float(i))
    f.flush()
    assert (f.held, f._open, f._pending) == (0, {}, {})


@pytest.mark.parametrize("follow", [False, True])
@pytest.mark.parametrize("folded", [False, True])
def test_logs_and_attach_fold_the_exit_barrier_trace_as_the_console_did(
        tmp_path: Path, follow: bool, folded: bool) -> None:
    """`dtrain logs`/`attach` (following the run or not): the trace of node2, whose line
    (BARRIER_MARK) the console printed at the end, is that one line again; node1's trace,
    which the console showed (no such line for it), is shown whole."""
    from launcher.output.archive import RunArchive
    from launcher.output.fold import BARRIER_MARK
    from launcher.output.logview import replay

    archive = RunArchive.create(tmp_path, "r")
    archive.update_meta(hosts=["node1", "node2"], world_size=2)
    lines = [OutputLine("node1", "out", "done 0", 0, 0, 1.0),
             OutputLine("node2", "out", "done 1", 1, 1, 1.0)]
    lines += [OutputLine("node2", "err", text, None, 1, 1.1) for text in BARRIER]
    lines += [OutputLine("node1", "err", text, None, 0, 1.2) for text in BARRIER]
    lines.append(OutputLine("node1", "err", "an agent line after it", None, 0, 1.3))
    lines.append(OutputLine("node2", "dtrain", f"{BARRIER_MARK} (the rendezvous store's "
                            "host left first: x); harmless, 12 lines in the archive", t=1.4))
    archive.write_lines(lines)
    archive.update_meta(end=2.0, outcome="succeeded")
    archive.close()
    out = io.StringIO()
    assert replay(archive.path, out=out, color=False, follow=follow, fold=folded,
                  poll_s=0.01) == 0
    shown = out.getvalue().splitlines()
    assert [ln for ln in shown if "node2" in ln and BARRIER_MARK not in ln] == \
        ["node2 r1: done 1"], shown
    assert sum(ln.startswith(f"dtrain: node2: {BARRIER_MARK}") for ln in shown) == 1, shown
    node1_err = [ln for ln in shown if ln.startswith("node1 [err]")]
    assert len(node1_err) == len(BARRIER) + 1, shown  # shown whole, then the next line
    raw = io.StringIO()
    replay(archive.path, out=raw, as_json=True)
    assert len(raw.getvalue().splitlines()) == len(lines)  # --json: every record
