"""Issue 53 item 1: a failure's fingerprint (launcher/decide/outcome/fingerprint.py) is the same for
the same bug on any rank, node, path and run, and differs for another bug. The texts are
the real formats of tests/data and of torch's per-rank traceback prefix."""

from __future__ import annotations

import signal
from pathlib import Path

from launcher.decide.outcome import failures
from launcher.decide.outcome import fingerprint as fp

DATA = Path(__file__).resolve().parent / "data"


def traceback(rank: int, home: str, step: int, line: int = 38,
              raise_line: str = 'raise ValueError(f"bad batch at step {step}")',
              exc: str = "ValueError", func: str = "load_batch") -> list[str]:
    p = f"[rank{rank}]: "
    return [p + "Traceback (most recent call last):",
            p + f'  File "{home}/train.py", line 70, in <module>',
            p + "    sys.exit(main())",
            p + '  File "/usr/lib/python3/dist-packages/torch/utils/data.py", line 5, in wrap',
            p + "    return f()",
            p + f'  File "{home}/data.py", line {line}, in {func}',
            p + f"    {raise_line}",
            p + "    ^^^^^^^^^^^^^^^^^^^^^^^^",
            p + f"{exc}: bad batch at step {step} in {home}/shard-0007.bin on 10.1.2.3:29500"]


def of(rank: int, host: str, stderr: list[str], sig: int | None = None,
       evidence: dict | None = None, code: int | None = 1) -> fp.Fingerprint:
    reason = failures.explain(rank=rank, host=host, code=code, sig=sig, evidence=evidence,
                              stderr=stderr)
    made = fp.of_failure(reason, stderr, code=code)
    assert made is not None
    return made


def test_the_same_exception_on_two_ranks_and_nodes_has_one_print() -> None:
    a = of(1, "node2", traceback(1, "/home/u/proj", 3))
    b = of(13, "gpu-b7", traceback(13, "/scratch/u/proj-copy", 1200, line=41))
    assert a == b
    assert len(a.digest) == 12 and int(a.digest, 16) >= 0
    assert a.label == "ValueError at data.py:load_batch"
    # the parts: no rank, no host, no path, no line number
    text = " ".join(a.parts)
    for absent in ("node2", "gpu-b7", "/home", "1200", "29500", "shard-0007"):
        assert absent not in text, (absent, a.parts)


def test_another_bug_has_another_print() -> None:
    base = of(1, "node2", traceback(1, "/home/u/p", 3))
    other_type = of(1, "node2", traceback(1, "/home/u/p", 3, exc="KeyError"))
    other_func = of(1, "node2", traceback(1, "/home/u/p", 3, func="collate"))
    other_raise = of(1, "node2", traceback(1, "/home/u/p", 3,
                                           raise_line="raise ValueError(f'empty {step}')"))
    prints = {base.digest, other_type.digest, other_func.digest, other_raise.digest}
    assert len(prints) == 4


def test_a_native_crash_is_printed_by_its_frames_without_line_numbers() -> None:
    crash = (DATA / "hangs" / "segv.crash").read_text()
    a = of(0, "node1", [], sig=signal.SIGSEGV, evidence={"crash": crash}, code=None)
    moved = crash.replace("line 3 in load_batch", "line 9 in load_batch")
    b = of(5, "node4", [], sig=signal.SIGSEGV, evidence={"crash": moved}, code=None)
    assert a == b and a.kind == "segfault" and "SIGSEGV" in a.label
    abort = of(0, "node1", [], sig=signal.SIGABRT, evidence={"crash": crash}, code=None)
    assert abort.digest != a.digest


def test_signals_oom_xid_and_nccl_errors() -> None:
    kill = of(2, "n1", [], sig=signal.SIGKILL, evidence={"kernel": []}, code=None)
    term = of(2, "n1", [], sig=signal.SIGTERM, code=None)
    assert (kill.label, term.label) == ("killed by SIGKILL", "killed by SIGTERM")
    oom_ev = {"kernel": ["Out of memory: Killed process 4242 (python3) anon-rss:1024kB"]}
    oom_a = of(0, "n1", [], sig=signal.SIGKILL, evidence=oom_ev, code=None)
    reason = failures.explain(rank=0, host="n1", code=None, sig=signal.SIGKILL, pid=4242,
                              evidence=oom_ev)
    oom = fp.of_failure(reason, [])
    assert oom is not None and oom.kind == "oom" and oom.digest != oom_a.digest
    xid = "[ 9310.2] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen"
    x1 = of(0, "n1", [], sig=signal.SIGKILL, evidence={"kernel": [xid]}, code=None)
    x2 = of(3, "n2", [], sig=signal.SIGKILL, evidence={"kernel": [xid.replace("3b", "5e")]},
            code=None)
    assert x1 == x2 and x1.label == "GPU Xid 79"
    watchdog = ("[rank3]:[E1201 12:00:00.112 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog "
                "caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, "
                "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600041 milliseconds")
    w = failures.explain(rank=3, host="n2", code=1, sig=None, comm=[("n2", 3, watchdog)])
    w2 = failures.explain(rank=0, host="n7", code=1, sig=None,
                          comm=[("n7", 0, watchdog.replace("3", "0"))])
    pw, pw2 = fp.of_failure(w), fp.of_failure(w2)
    assert pw == pw2 and pw is not None
    assert pw.label == "communication: Watchdog caught collective operation timeout in ALLREDUCE"
    warn = [line for line in (DATA / "nccl" / "warn_nccl_tests_188.log").read_text()
            .splitlines() if "NCCL WARN" in line][0]
    nccl = failures.explain(rank=0, host="n1", code=1, sig=None, comm=[("n1", 0, warn)])
    pn = fp.of_failure(nccl)
    assert pn is not None and pn.digest != pw.digest
    assert len({kill.digest, term.digest, oom.digest, x1.digest, pw.digest, pn.digest}) == 6


def test_a_syntax_error_and_an_exit_without_a_story() -> None:
    syn = ['  File "/home/u/train.py", line 3', "    def f(:", "          ^",
           "SyntaxError: invalid syntax"]
    a = of(0, "n1", syn)
    b = of(4, "n2", [s.replace("/home/u", "/w") .replace("line 3", "line 30") for s in syn])
    assert a == b and a.label == "SyntaxError at train.py"
    e1 = of(1, "n1", ["[rank1]: loading shard 3 from /data/a", "[rank1]: bye"], code=3)
    e2 = of(2, "n2", ["[rank2]: bye"], code=3)
    e3 = of(2, "n2", ["[rank2]: bye"], code=4)
    assert e1 == e2 and e1.digest != e3.digest and e1.label == "exit 3: bye"


def test_a_hang_by_where_its_culprit_stood() -> None:
    a = fp.of_hang("script", "time.sleep <- load_batch() hang.py:42")
    b = fp.of_hang("script", "time.sleep <- load_batch() hang.py:57")
    c = fp.of_hang("native", "no Python frame")
    assert a == b and a.digest != c.digest and a.label == "hang at time.sleep <- load_batch() " \
        "hang.py"
    assert fp.of_hang(None, None).label == "hang (unknown)"


def test_masking() -> None:
    assert fp.mask("to 10.0.0.2:29500 at 0x7f05795f7b80 id deadbeef12 rank 3 /tmp/x/y.pt "
                   "[fe80::1]:29400 on gpu-a.", ["gpu-a"]) == \
        "to <addr> at <hex> id <hex> rank # <path> <addr> on <host>."
    assert fp.mask("nothing to hide") == "nothing to hide"
    assert fp.of_failure(None) is None
