"""Why a rank died, from recorded evidence (decide/outcome/failures.py): no cluster, no kernel.

The kernel and cgroup texts are in the formats Linux writes them (dmesg / /dev/kmsg records
of the OOM killer and of NVIDIA's driver, cgroup v2 memory.events, v1 memory.oom_control);
the crash dump is real faulthandler output of the rank wrapper (a ctypes NULL read). The OOM
case is tested here on recorded text only: the test machine gives no memory cgroup a test
could limit (docs/hangs.md says so).
"""

from __future__ import annotations

import signal
from pathlib import Path

from launcher.decide.outcome import failures
from launcher.models import OutputLine
from launcher.nodeside import kernlog

DATA = Path(__file__).parent / "data" / "hangs"

OOM_KMSG = [
    "[81234.551023] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, "
    "oom_score_adj=0",
    "[81234.551187] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
    "mems_allowed=0,oom_memcg=/job,task_memcg=/job,task=python3,pid=4242,uid=1000",
    "[81234.551201] Memory cgroup out of memory: Killed process 4242 (python3) "
    "total-vm:12345678kB, anon-rss:8123456kB, file-rss:10240kB, shmem-rss:0kB, UID:1000 "
    "pgtables:16000kB oom_score_adj:0",
]
EVENTS_V2 = "low 0\nhigh 0\nmax 31\noom 1\noom_kill 1\noom_group_kill 0\n"
OOM_CONTROL_V1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
XID = "[ 9310.221004] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen " \
      "off the bus."
TRACEBACK = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/home/u/proj/train.py", line 70, in <module>',
    "[rank1]:     sys.exit(main())",
    '[rank1]:   File "/home/u/proj/data.py", line 38, in load_batch',
    '[rank1]:     raise ValueError(f"bad batch at step {step}")',
    "[rank1]: ValueError: bad batch at step 3",
]
WATCHDOG = ("[rank3]:[E1201 12:00:00.112 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.")


def test_oom_killer_from_the_kernel_log_with_the_memory_at_the_end() -> None:
    r = failures.explain(rank=4, host="node3", code=137, sig=signal.SIGKILL, pid=4242,
                         evidence={"kernel": OOM_KMSG})
    assert r.kind == "oom" and r.scope == failures.USER
    assert r.summary == "rank 4 on node3 was killed by the kernel's OOM killer (7.7 GiB)"
    assert any("Killed process 4242" in e for e in r.evidence)
    assert "batch size" in r.advice


def test_oom_killer_from_the_cgroup_counter() -> None:
    for text, before in ((EVENTS_V2, 0), (OOM_CONTROL_V1, 1)):
        r = failures.explain(rank=0, host="node1", code=137, sig=signal.SIGKILL, pid=7,
                             evidence={"memory_events": text, "oom_kill_before": before,
                                       "kernel": "/dev/kmsg: Operation not permitted",
                                       "memory": {"rss_kb": 3 * 1024 * 1024, "hwm_kb": 1}})
        assert r.kind == "oom", r
        assert "(3.0 GiB resident at its last sample)" in r.summary
    assert kernlog.oom_kills(EVENTS_V2) == 1 and kernlog.oom_kills(OOM_CONTROL_V1) == 2


def test_a_sigkill_without_an_oom_record_is_a_signal_from_outside() -> None:
    r = failures.explain(rank=2, host="node2", code=137, sig=signal.SIGKILL, pid=99,
                         evidence={"kernel": OOM_KMSG, "memory_events": EVENTS_V2,
                                   "oom_kill_before": 1})  # another pid; counter unchanged
    assert r.kind == "signal" and "not by the OOM killer" in r.summary
    unread = failures.explain(rank=2, host="node2", code=137, sig=signal.SIGKILL, pid=99,
                              evidence={"kernel": "/dev/kmsg: Operation not permitted"})
    assert "whether the OOM killer did it cannot be told on node2 (the kernel log is not " \
           "readable: /dev/kmsg: Operation not permitted; no memory cgroup counter)" \
           in unread.summary
    assert unread.scope == failures.UNKNOWN and "Killed process 99" in unread.advice


def test_gpu_xid_is_a_node_fault() -> None:
    r = failures.explain(rank=1, host="gpu07", code=1, sig=None, evidence={"kernel": [XID]},
                         stderr=TRACEBACK)
    assert r.kind == "xid" and r.scope == failures.NODE
    assert "Xid 79 (GPU has fallen off the bus)" in r.summary
    assert "--exclude gpu07" in r.advice


def test_segfault_shows_the_python_stack() -> None:
    crash = (DATA / "segv.crash").read_text()
    r = failures.explain(rank=1, host="node2", code=139, sig=signal.SIGSEGV,
                         evidence={"crash": crash, "kernel": [
                             "[ 100.1] python3[4242]: segfault at 0 ip 00007f1d sp 00007ffd "
                             "error 4 in libc.so.6[7f1d2c028000+195000]"]})
    assert r.kind == "segfault" and r.scope == failures.PROCESS
    assert r.summary == ("rank 1 on node2 crashed: SIGSEGV (segmentation fault) in string_at "
                         "<- load_batch() data.py:3 (native code: libc.so.6[7f1d2c028000+"
                         "195000])")
    assert r.evidence[0] == "Fatal Python error: Segmentation fault"
    assert "  load_batch() data.py:3" in r.evidence
    assert not any("dtrain_shim" in e for e in r.evidence)


def test_python_exception_last_frame_and_message() -> None:
    r = failures.explain(rank=1, host="node2", code=1, sig=None, stderr=TRACEBACK)
    assert r.kind == "exception" and r.scope == failures.USER
    assert r.summary == ("rank 1 on node2 raised ValueError: bad batch at step 3 in "
                         "load_batch() data.py:38")
    assert "dtrain logs --rank 1" in r.advice


def test_nccl_and_gloo_lines_are_quoted_with_their_node() -> None:
    keeper = failures.ErrorKeeper()
    keeper.observe([OutputLine("node4", "err", WATCHDOG, 3, 3, 1.0),
                    OutputLine("node4", "err", "plain warning", 3, 3, 1.0)])
    r = failures.explain(rank=3, host="node4", code=1, sig=None, stderr=TRACEBACK,
                         comm=keeper.comm_lines())
    assert r.kind == "comm" and "communication error on node4" in r.summary
    assert "Watchdog caught collective operation timeout" in r.summary
    assert "--hang-timeout" in r.advice
    peer = failures.explain(rank=0, host="node1", code=1, sig=None, comm=[(
        "node1", 0, "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection "
                    "closed by peer [10.0.0.2]:4242")])
    assert peer.kind == "comm" and "a peer rank went away first" in peer.advice


def test_two_ranks_on_one_gpu_is_named_with_what_to_do() -> None:
    """torch's ncclInvalidUsage error puts NCCL's own line after "Last error:": a script
    that never calls set_device, or more ranks than GPUs."""
    stderr = ["[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL"
              ".cpp:3690, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version "
              "2.28.9", "[rank1]: ncclInvalidUsage: This usually reflects invalid usage of "
              "NCCL library.", "[rank1]: Last error:",
              "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60000"]
    keeper = failures.ErrorKeeper()
    keeper.observe([OutputLine("gpu1", "err", t, 1, 1, 1.0) for t in stderr])
    r = failures.explain(rank=1, host="gpu1", code=1, sig=None, stderr=stderr,
                         comm=keeper.comm_lines())
    assert r.summary == ("rank 1 on gpu1: two ranks on one GPU: Duplicate GPU detected : "
                         "rank 1 and rank 0 both on CUDA device 60000")
    assert "torch.cuda.set_device(LOCAL_RANK)" in r.advice and r.scope == failures.USER


def test_other_signal_and_plain_exit() -> None:
    r = failures.explain(rank=0, host="n", code=143, sig=signal.SIGTERM)
    assert r.kind == "signal" and "SIGTERM" in r.summary
    e = failures.explain(rank=0, host="n", code=3, sig=None, stderr=["giving up: no data"])
    assert e.kind == "exit" and e.summary == "rank 0 on n exited 3: giving up: no data"
    assert e.json()["scope"] == "unknown"


# /dev/kmsg records as the kernel writes them (one per read): PRIO,SEQ,USEC,FLAGS;text,
# then the record's dictionary as " KEY=value" lines
KMSG = [
    b"6,1201,4999000,-;eth0: link up\n",
    b"4,1202,5100000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=771, name=python, "
    b"An uncorrectable double bit error (DBE) has been detected on GPU\n"
    b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
    b"6,1203,7250000,-;python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0\n",
    b"6,1204,7250500,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
    b"task=python,pid=4242,uid=1000\n",
    b"3,1205,7251000,-;Memory cgroup out of memory: Killed process 4242 (python) "
    b"total-vm:9000000kB, anon-rss:204800kB, file-rss:0kB\n",
    b"6,1206,7300000,c;python[4242]: segfault at 0 ip 00007f0 sp 00007ff error 4\n",
    b"garbage without a header\n",
    b"6,1207,notanumber,-;Out of memory: never dated\n",
    b"6,1208,8000000,-;usb 1-1: new high-speed USB device\n",
]


def test_kernel_lines_filter_by_time_and_words(tmp_path: Path) -> None:
    """Real kmsg records: the time window (since - 1 s), the words, Xid and OOM lines; a log
    that cannot be opened is said as such."""
    got = kernlog.kmsg_matches(KMSG, since=6.5)
    assert got == [
        "[7.250000] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
        "[7.250500] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
        "task=python,pid=4242,uid=1000",
        "[7.251000] Memory cgroup out of memory: Killed process 4242 (python) "
        "total-vm:9000000kB, anon-rss:204800kB, file-rss:0kB",
        "[7.300000] python[4242]: segfault at 0 ip 00007f0 sp 00007ff error 4"]
    xid = kernlog.kmsg_matches(KMSG, since=6.0)  # 5.1 s is within the 1 s before
    assert xid[0].startswith("[5.100000] NVRM: Xid (PCI:0000:3b:00): 48, pid=771") \
        and "SUBSYSTEM" not in xid[0]
    assert kernlog.kmsg_matches(KMSG, since=0.0, limit=2) == got[-2:]
    assert kernlog.kmsg_matches(KMSG, since=0.0, words=("link up",)) == \
        ["[4.999000] eth0: link up"]
    assert kernlog.kernel_lines(0.0, path=str(tmp_path / "none")) == \
        f"{tmp_path / 'none'}: No such file or directory"
    live = kernlog.kernel_lines(0.0)
    assert isinstance(live, str) and live.startswith("/dev/kmsg: ") or isinstance(live, list)


def test_failure_reason_json_and_details_only_when_there_are_some() -> None:
    plain = failures.FailureReason("exit", "rank 3 exited with code 1", "see its log",
                                   scope="rank", rank=3, host="node2", evidence=("a", "b"))
    assert plain.json() == {"kind": "exit", "rank": 3, "host": "node2", "scope": "rank",
                            "summary": "rank 3 exited with code 1", "evidence": ["a", "b"],
                            "advice": "see its log"}
    detailed = failures.FailureReason("oom", "s", "a", details={"rss_kb": 5})
    assert detailed.json()["details"] == {"rss_kb": 5}


def test_error_keeper_keeps_bounded_stderr_tails_and_comm_lines_per_rank() -> None:
    keeper = failures.ErrorKeeper(size=3, errors=2)
    lines = [OutputLine("n1", "out", "NCCL WARN on stdout", 0, 0, 0.0),
             *(OutputLine("n1", "err", f"e{i}", 0, 0, 0.0) for i in range(5)),
             *(OutputLine("n1", "err", f"NCCL WARN {i}", 1, 0, 0.0) for i in range(3)),
             OutputLine("n2", "err", "NCCL error: unhandled system error", 0, 0, 0.0)]
    keeper.observe(lines)
    assert list(keeper.tails[("n1", 0)]) == ["e2", "e3", "e4"]  # stderr only, the last 3
    assert list(keeper.tails[("n1", 1)]) == ["NCCL WARN 0", "NCCL WARN 1", "NCCL WARN 2"]
    assert keeper.comm_lines() == [("n1", 1, "NCCL WARN 1"), ("n1", 1, "NCCL WARN 2"),
                                   ("n2", 0, "NCCL error: unhandled system error")]
    keeper.rank_exit("n1", 0, {"oom": True})
    keeper.rank_exit("n1", 2, None)  # job/events.py: evidence that is not a map is none
    assert keeper.evidence == {("n1", 0): {"oom": True}}
    fresh = failures.ErrorKeeper()
    assert (fresh.size, fresh.errors, fresh.tails, fresh.comm, fresh.evidence) == (
        40, 5, {}, {}, {})


def test_memory_sizes_in_mib_then_gib() -> None:
    assert [failures._gib(kb) for kb in (2048, 1024 * 1024 - 1, 1024 * 1024,
                                         3 * 1024 * 1024 // 2)] == [
        "2 MiB", "1024 MiB", "1.0 GiB", "1.5 GiB"]


# -- every branch of explain(), whole: kind, summary, advice, scope, evidence, details ---------

K79 = "[123.4] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus"
OOM_LINE = ("Out of memory: Killed process 77 (python) total-vm:1kB, anon-rss:3145728kB, "
            "file-rss:0kB")
SEGV_LINE = "python[77]: segfault at 0 ip 00007f sp 00007e error 4 in libfoo.so[7f0000+1000]"
CRASH = ('Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call '
         'first):\n  File "/w/t.py", line 5 in inner\n  File "/w/t.py", line 9 in <module>\n')
OOM_ADVICE = ("the rank needs more memory than the node (or its cgroup) gives: lower the batch "
              "size, the data loader's workers or prefetch, or use nodes with more memory")
KILL9 = ("something outside the job killed it: a user's kill -9, a scheduler's preemption or a "
         "watchdog; look at n2's logs (journalctl) around then")
NATIVE = ("a native extension or library crashed under the Python line shown: check its build "
          "against this torch and CUDA, and reproduce with that rank alone (gdb, or `python -X "
          "faulthandler`)")


def _why(**kw: object) -> tuple[object, ...]:
    r = failures.explain(**kw)  # type: ignore[arg-type]
    assert (r.rank, r.host) == (kw["rank"], kw["host"])  # every reason says whose it is
    return (r.kind, r.summary, r.advice, r.scope, r.evidence, dict(r.details))


def test_explain_hardware_memory_and_kills_whole() -> None:
    assert _why(rank=3, host="n2", code=None, sig=None, evidence={"kernel": [
        "x", K79, "NVRM: Xid (PCI:0000:3b:00): 13, pid=1"]}) == (
        "xid", "rank 3 on n2: GPU fault on n2: Xid 79 (GPU has fallen off the bus) on "
        "PCI:0000:3b:00", "drain n2 and run its GPU diagnostics (nvidia-smi -q, dcgmi diag); "
        "rerun without it (--exclude n2)", "node", (K79,), {})
    assert _why(rank=3, host="n2", code=None, sig=9, pid=77, evidence={"kernel": [
        OOM_LINE, "Killed process 78 (x) anon-rss:1kB"]}) == (
        "oom", "rank 3 on n2 was killed by the kernel's OOM killer (3.0 GiB)", OOM_ADVICE,
        "user", (OOM_LINE,), {})
    assert _why(rank=3, host="n2", code=None, sig=9, pid=77, evidence={
        "memory_events": "low 0\noom 3\noom_kill 2\n", "oom_kill_before": 1,
        "memory": {"rss_kb": 2048}}) == (
        "oom", "rank 3 on n2 was killed by the kernel's OOM killer (2 MiB resident at its last "
        "sample)", OOM_ADVICE, "user", ("memory cgroup: oom_kill 1 -> 2",), {})
    no_oom = ("signal", "rank 3 on n2 was killed by SIGKILL, not by dtrain and not by the OOM "
              "killer (no OOM record)", KILL9, "process", (), {})
    assert _why(rank=3, host="n2", code=None, sig=9, pid=77, evidence={
        "memory_events": "oom_kill 1\n", "oom_kill_before": 1}) == no_oom
    assert _why(rank=3, host="n2", code=None, sig=9, pid=77, evidence={"kernel": []}) == no_oom
    dmesg = ("look at `dmesg` on n2 (as root) for 'Killed process 77': the OOM killer, or "
             "something outside the job (a kill -9, a scheduler's preemption)")
    assert _why(rank=3, host="n2", code=None, sig=9, pid=77,
                evidence={"kernel": "permission denied"}) == (
        "signal", "rank 3 on n2 was killed by SIGKILL, not by dtrain; whether the OOM killer "
        "did it cannot be told on n2 (the kernel log is not readable: permission denied; no "
        "memory cgroup counter)", dmesg, "unknown", (), {})
    assert _why(rank=None, host="n2", code=None, sig=9, pid=77) == (
        "signal", "n2 was killed by SIGKILL, not by dtrain; whether the OOM killer did it "
        "cannot be told on n2 (no kernel log; no memory cgroup counter)", dmesg, "unknown",
        (), {})


def test_explain_crashes_and_signals_whole() -> None:
    assert _why(rank=0, host="n1", code=None, sig=11,
                evidence={"crash": CRASH, "kernel": [SEGV_LINE]}) == (
        "segfault", "rank 0 on n1 crashed: SIGSEGV (segmentation fault) in inner() t.py:5 "
        "(native code: libfoo.so[7f0000+1000])", NATIVE, "process",
        ("Fatal Python error: Segmentation fault", "  inner() t.py:5", "  <module>() t.py:9"),
        {"frames": ["inner() t.py:5", "<module>() t.py:9"]})
    assert _why(rank=0, host="n1", code=None, sig=6,
                stderr=["x", "terminate called after throwing", "  "]) == (
        "abort", "rank 0 on n1 crashed: SIGABRT (aborted)", NATIVE, "process",
        ("terminate called after throwing",), {"frames": []})
    # a segfault's last stderr line is not evidence (only an abort's message is)
    assert _why(rank=0, host="n1", code=None, sig=11, stderr=["noise"])[4] == ()
    assert _why(rank=0, host="n1", code=None, sig=15) == (
        "signal", "rank 0 on n1 was killed by SIGTERM (not by dtrain)",
        "another process sent SIGTERM: a scheduler, a user, a watchdog on n1", "process", (),
        {})
    assert _why(rank=0, host="n1", code=None, sig=99)[1:3] == (
        "rank 0 on n1 was killed by signal 99 (not by dtrain)",
        "another process sent signal 99: a scheduler, a user, a watchdog on n1")


def test_explain_comm_exception_and_exit_whole() -> None:
    comm = [("n1", 0, "earlier NCCL WARN"), ("n2", 0, "another rank's")]
    cases = {
        "[rank0]: ... Connection closed by peer [10.0.0.2]:1234": (
            "... Connection closed by peer [10.0.0.2]:1234",
            "a peer rank went away first: its own failure is the cause; if none failed, a node "
            "or the network dropped it (dtrain doctor, dtrain smoke)", "unknown"),
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)": (
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)",
            "a collective timed out: one rank stopped taking part; set --hang-timeout below "
            "the collective timeout to see where every rank stood", "unknown"),
        "NCCL WARN NET/IB : Got completion with error 12": (
            "NCCL WARN NET/IB : Got completion with error 12",
            "check the fabric between the nodes (dtrain doctor, dtrain smoke)", "node"),
    }
    for line, (shown, advice, scope) in cases.items():
        assert _why(rank=0, host="n1", code=1, sig=None, comm=[*comm, ("n1", 0, line)],
                    stderr=["Traceback (most recent call last):", "KeyError: 'x'"]) == (
            "comm", f"rank 0 on n1: communication error on n1: {shown}", advice, scope,
            ("earlier NCCL WARN", shown), {})
    assert _why(rank=None, host="n1", code=1, sig=None,
                stderr=["Traceback (most recent call last):", "KeyError: 'x'"]) == (
        "exception", "n1 raised KeyError: 'x'",
        "an error in the script or its input: with --restarts it is run again from the last "
        "checkpoint if it came after progress, and stops when it fails the same way at the same "
        "place; the whole output is in the archive", "user", ("KeyError: 'x'",), {})
    assert _why(rank=2, host="n1", code=3, sig=None, stderr=["[rank2]: bye", " "]) == (
        "exit", "rank 2 on n1 exited 3: bye", "its last output says why (dtrain logs --rank 2)",
        "unknown", ("bye",), {})
    assert _why(rank=None, host="n1", code=3, sig=None) == (
        "exit", "n1 exited 3", "its last output says why (dtrain logs)", "unknown", (), {})


def test_explain_details_at_the_edges() -> None:
    # an OOM record without a size, and a cgroup file without the counter
    assert _why(rank=1, host="n2", code=None, sig=9, pid=77,
                evidence={"kernel": ["Killed process 77 (python)"]})[1] == (
        "rank 1 on n2 was killed by the kernel's OOM killer")
    assert _why(rank=1, host="n2", code=None, sig=9, pid=77,
                evidence={"memory_events": "low 0\n", "oom_kill_before": 1})[0] == "signal"
    # a segfault among other kernel lines; at most 8 frames shown, every frame in details
    frames = "".join(f'  File "/w/t.py", line {i} in f{i}\n' for i in range(10))
    crash = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent " \
            "call first):\n" + frames
    r = failures.explain(rank=0, host="n1", code=None, sig=11, evidence={
        "crash": crash, "kernel": ["eth0: link up", SEGV_LINE, "usb 1-1: new device"]})
    assert r.summary.endswith("(native code: libfoo.so[7f0000+1000])")
    assert len(r.evidence) == 1 + 8 and len(r.details["frames"]) == 10
    # an abort shows its last stderr line only
    assert _why(rank=0, host="n1", code=None, sig=6, stderr=["a", "b", "c", " "])[4] == ("c",)
    # a communication error line is cut at 300 characters in the summary, not the evidence
    long = "NCCL WARN " + "x" * 400
    r = failures.explain(rank=0, host="n1", code=1, sig=None, comm=[("n1", 0, long)])
    assert r.summary == f"rank 0 on n1: communication error on n1: {long[:300]}"
    assert r.evidence == (long,)
    assert failures._gib(100 * 1024 * 1024) == "100.0 GiB"


def test_python_exception_frames_without_a_directory_and_log_lines_after() -> None:
    lines = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
             "    main()", "ValueError: no", "wandb: syncing run", ""]
    assert failures.python_exception(lines) == ("ValueError", "no", "<module>() train.py:3")


def test_long_messages_are_cut_where_the_summary_says() -> None:
    msg = "m" * 600
    r = failures.explain(rank=1, host="n1", code=1, sig=None,
                         stderr=["Traceback (most recent call last):", f"ValueError: {msg}"])
    assert r.summary == f"rank 1 on n1 raised ValueError: {msg[:300]}"
    assert r.evidence == (f"ValueError: {msg}"[:500],)
    last = "z" * 300
    r = failures.explain(rank=1, host="n1", code=3, sig=None, stderr=["first", last])
    assert (r.summary, r.evidence) == (f"rank 1 on n1 exited 3: {last[:200]}", (last,))
