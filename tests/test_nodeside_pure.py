"""The node programs' pure functions, in process: the supervisor's JSON and spec readers, a
rank's command line and environment, its evidence parsers; the sampler's readers on a fake
root directory and its parsers; the smoke job's sizes and pair schedule (imported as
launcher.nodeside.*, which is what scripts/mutate's sixth-round groups score)."""

from __future__ import annotations

import errno
import json
import marshal
import os
import signal
import sys
from pathlib import Path

import pytest

from launcher.nodeside import (
    kernlog,
    nodecommon,
    nodeevidence,
    nodeprocs,
    rankshim,
    sampler,
    smoke_job,
)
from tests.util import write_under as put


def test_sizes_double_from_the_smallest_up_to_the_largest_inclusive() -> None:
    assert smoke_job.sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert smoke_job.sizes(1024, 8191) == [1024, 2048, 4096]
    assert smoke_job.sizes(4, 4) == [4]
    assert smoke_job.sizes(8, 4) == []


@pytest.mark.parametrize("n", range(0, 13))
def test_the_pair_schedule_pairs_every_node_or_the_ring_in_disjoint_rounds(n: int) -> None:
    rounds = smoke_job.schedule(n)
    pairs = [pair for r in rounds for pair in r]
    for r in rounds:
        nodes = [node for pair in r for node in pair]
        assert len(nodes) == len(set(nodes)), r  # disjoint: each node once per round
    assert all(0 <= a < b < n for a, b in pairs)
    if n <= 8:  # every pair exactly once, in n - 1 rounds (n rounds for an odd n: a bye)
        assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
        assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)
    else:  # each node with its neighbour: two rounds, three for an odd n
        assert sorted(pairs) == sorted((min(i, (i + 1) % n), max(i, (i + 1) % n))
                                       for i in range(n))
        assert len(rounds) == (2 if n % 2 == 0 else 3)


def test_the_pair_schedule_exactly() -> None:
    assert smoke_job.schedule(2) == [[(0, 1)]]
    assert smoke_job.schedule(3) == [[(1, 2)], [(0, 2)], [(0, 1)]]
    assert smoke_job.schedule(4) == [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    assert smoke_job.schedule(9) == [[(0, 1), (2, 3), (4, 5), (6, 7)],
                                     [(1, 2), (3, 4), (5, 6), (7, 8)], [(0, 8)]]
    assert smoke_job.schedule(10) == [[(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)],
                                      [(1, 2), (3, 4), (5, 6), (7, 8), (0, 9)]]


# -- supervisor ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2**70, 1.5, -0.0, "a\"b\\\n", [], {}, (), [1, [2, [3]]],
    {"a": 1, "b": [True, None], "c": {"d": "e"}}, (1, "x", 2.5),
])
def test_json_parts_writes_json_dumps_text(value: object) -> None:
    parts: list[str] = []
    assert nodecommon._json_parts(value, parts) is True
    assert "".join(parts) == json.dumps(value, separators=(",", ":"))
    assert nodecommon.to_json(value) == json.dumps(value, separators=(",", ":"))


class _Int(int):
    pass


class _Float(float):
    pass


class _Str(str):
    pass


@pytest.mark.parametrize("value", [
    float("nan"), float("inf"), float("-inf"), [1, float("nan")], {"a": float("-inf")},
    [1, b"x"], {"a": {"b": {1, 2}}}, {"a": 1, 2: "b"}, {1: "a"}, b"bytes", {1, 2},
    _Int(3), _Float(1.0), _Str("s"), [1, [2, object()]], {"x": [float("inf")]},
])
def test_json_parts_leaves_what_json_writes_otherwise_to_json(value: object) -> None:
    assert nodecommon._json_parts(value, []) is False


def test_to_json_of_the_odd_cases_is_json_dumps_text() -> None:
    for value in ({"x": [1, float("nan")]}, {"x": float("-inf")}, _Int(3), {2: 1, "a": 2},
                  [_Str("s")]):
        assert nodecommon.to_json(value) == json.dumps(value, separators=(",", ":"))


def test_from_json_and_load_spec() -> None:
    assert nodecommon.from_json(b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert nodecommon.from_json('"x"') == "x"
    spec = {"argv": ["true"], "env": {"A": "1"}, "n": 3}
    assert nodecommon.load_spec(b"M" + marshal.dumps(spec)) == spec
    assert nodecommon.load_spec(json.dumps(spec).encode()) == spec
    assert nodecommon.load_spec(b"[1]") == [1]
    with pytest.raises(ValueError):  # not marshal after the marker: marshal's own error
        nodecommon.load_spec(b"M{}")


D = "/tmp/dtrain-x/flight"


@pytest.mark.parametrize(("env", "names", "added"), [
    ({}, "current", {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                     "TORCH_FR_DUMP_TEMP_FILE": D + "/rank_"}),
    ({}, "legacy", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": D + "/rank_"}),
    ({}, "both", {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                  "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": D + "/rank_",
                  "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": D + "/rank_"}),
    ({}, "unknown", {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                     "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": D + "/rank_",
                     "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": D + "/rank_"}),
    ({"TORCH_FR_BUFFER_SIZE": "10"}, "legacy", {}),  # any buffer variable of the user's
    ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}, "current", {}),
    # empty is unset
    ({"TORCH_FR_BUFFER_SIZE": "", "TORCH_NCCL_DUMP_ON_TIMEOUT": ""}, "current",
     {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
      "TORCH_FR_DUMP_TEMP_FILE": D + "/rank_"}),
    ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_FR_DUMP_TEMP_FILE": "/mine/"}, "legacy",
     {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
    ({"TORCH_FR_DUMP_TEMP_FILE": ""}, "current",
     {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
      "TORCH_FR_DUMP_TEMP_FILE": D + "/rank_"}),
])
def test_flight_defaults_per_name_set(env: dict[str, str], names: str,
                                      added: dict[str, str]) -> None:
    assert rankshim.flight_defaults(env, D, names) == added
    if names == "current":  # the default
        assert rankshim.flight_defaults(env, D) == added


def test_rank_argv_wraps_the_script_unless_stacks_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DTRAIN_STACKS", raising=False)
    argv = rankshim.rank_argv(["t.py", "-x"], "s")
    assert argv[:2] == [sys.executable, "-u"] and argv[3:] == ["t.py", "-x"] and len(argv) == 5
    monkeypatch.setenv("DTRAIN_STACKS", "1")
    argv = rankshim.rank_argv(["t.py"], "s")
    assert argv[:2] == [sys.executable, "-u"] and argv[3:] == ["t.py"] and len(argv) == 4
    monkeypatch.setenv("DTRAIN_STACKS", "0")
    assert rankshim.rank_argv(["t.py", "-x"], "s") == [sys.executable, "-u", "t.py", "-x"]


def test_rank_argv_s_wrapper_is_this_file(monkeypatch: pytest.MonkeyPatch) -> None:
    # (not under mutmut: its trampoline, not supervisor.py, is the function's code there)
    monkeypatch.delenv("DTRAIN_STACKS", raising=False)
    shim = os.path.abspath(rankshim.__file__)  # in the bundle: the bundle's file
    assert rankshim.rank_argv(["t.py"], "s") == [sys.executable, "-u", shim, "t.py"]


@pytest.mark.parametrize(("attempt", "own", "count"), [
    (None, None, None), (None, "2", "2"), ("1", None, None), ("1", "3", "3"),
    ("2", None, "1"), ("3", "2", "4"), ("3", "x", "2"), ("x", "2", "2"), ("", None, None),
    ("0", None, None), ("-2", "1", "1"),
])
def test_rank_env_counts_dtrain_s_relaunches_into_torchrun_s_restart_count(
        monkeypatch: pytest.MonkeyPatch, attempt: str | None, own: str | None,
        count: str | None) -> None:
    for name, value in (("DTRAIN_ATTEMPT", attempt), ("TORCHELASTIC_RESTART_COUNT", own)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("DTRAIN_STACKS", raising=False)
    monkeypatch.setenv("DTRAIN_KEEP", "k")
    env = rankshim.rank_env("/run/s.sock")
    assert env.get("TORCHELASTIC_RESTART_COUNT") == count
    assert env["DTRAIN_ARM_SOCK"] == "/run/s.sock" and env["DTRAIN_KEEP"] == "k"
    assert os.environ.get("TORCHELASTIC_RESTART_COUNT") == own  # a copy: ours is untouched
    assert "DTRAIN_ARM_SOCK" not in os.environ


def test_rank_env_arms_the_dumper_unless_stacks_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTRAIN_STACKS", "1")
    assert rankshim.rank_env("s")["DTRAIN_ARM_SOCK"] == "s"
    monkeypatch.setenv("DTRAIN_STACKS", "0")
    assert "DTRAIN_ARM_SOCK" not in rankshim.rank_env("s")


@pytest.mark.parametrize(("text", "kills"), [
    ("low 0\nhigh 0\noom 4\noom_kill 3\noom_group_kill 1\n", 3),
    ("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", 2),
    ("oom_kill 0\n", 0), ("oom_kill 12", 12),
    ("oom_kill x\noom_kill 5\n", 5),  # the first counter that is a number
    ("oom_kill 1 2\n", None), ("oom_kill\n", None), ("oom 1\n", None), ("", None), (None, None),
    ("oom_kill -1\n", None), ("  oom_kill   7  \n", 7),
])
def test_oom_kills_reads_the_counter(text: str | None, kills: int | None) -> None:
    assert kernlog.oom_kills(text) == kills


def test_which_finds_the_first_executable_file_on_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    (a / "tool").write_text("x")  # not executable
    (b / "tool").mkdir()  # a directory
    (c / "tool").write_text("#!/bin/sh\n")
    (c / "tool").chmod(0o755)
    path = os.pathsep.join([str(a), str(b), str(c)])
    assert nodecommon.which("tool", path) == str(c / "tool")
    (b / "tool").rmdir()
    (b / "tool").write_text("#!/bin/sh\n")
    (b / "tool").chmod(0o700)
    assert nodecommon.which("tool", path) == str(b / "tool")
    assert nodecommon.which("tool", str(a)) is None
    assert nodecommon.which("tool", "") is None and nodecommon.which("tool", None) is None
    monkeypatch.chdir(c)  # an empty entry is the working directory, as a shell reads it
    assert nodecommon.which("tool", os.pathsep + str(a)) == os.path.join(".", "tool")


def test_frame_sources_reads_the_two_innermost_frames_of_each_thread(tmp_path: Path) -> None:
    src = tmp_path / "train.py"
    src.write_text("".join(f"    line_{i} = {i}  \n" for i in range(1, 10))
                   + "x = '" + "y" * 300 + "'\n")
    f = str(src)
    dump = "\n".join([
        "Thread 0x00007f0000000001 (most recent call first):",
        f'  File "{f}", line 3 in inner',
        f'  File "{f}", line 5 in middle',
        f'  File "{f}", line 7 in outer',  # the third frame: not read
        "",
        "Current thread 0x00007f0000000002 (most recent call first):",
        f'  File "{f}", line 10 in <module>',
        f'  File "{f}" in odd',  # no line number: skipped, and it counts as a frame
        f'  File "{f}", line 8 in third',
        "Thread 0x00007f0000000003 (most recent call first):",
        f'  File "{f}", line x in bad',
        f'  File "{f}", line 2 in fine',
        '  File "/nonexistent/m.py", line 4 in gone',
        "Thread 0x00007f0000000004 (most recent call first):",
        '  File "/nonexistent/m.py", line 4 in gone',
        f'  File "{f}", line 3 in again',
    ])
    assert nodeevidence.frame_sources(dump) == {
        f + ":3": "line_3 = 3", f + ":5": "line_5 = 5", f + ":10": "x = '" + "y" * 195,
        f + ":2": "line_2 = 2", "/nonexistent/m.py:4": ""}
    assert nodeevidence.frame_sources(dump, limit=2) == {f + ":3": "line_3 = 3",
                                                       f + ":5": "line_5 = 5"}
    assert nodeevidence.frame_sources(dump, limit=0) == {}
    assert nodeevidence.frame_sources("") == {}


def test_start_error_is_worded_as_a_shell_says_it() -> None:
    enoent = OSError(errno.ENOENT, "No such file or directory")
    assert nodeprocs.start_error("nvidia-smi", enoent) == ("nvidia-smi: command not found", 127)
    assert nodeprocs.start_error("./run.sh", enoent) == (
        "./run.sh: No such file or directory", 127)
    eacces = OSError(errno.EACCES, "Permission denied")
    assert nodeprocs.start_error("./run.sh", eacces) == ("./run.sh: Permission denied", 126)
    assert nodeprocs.start_error("run.sh", eacces) == ("run.sh: Permission denied", 126)
    assert nodeprocs.start_error("x", OSError(errno.ENOEXEC, "Exec format error")) == (
        "x: Exec format error", 126)
    assert nodeprocs.start_error("x", OSError("odd")) == ("x: odd", 126)


@pytest.mark.parametrize(("status", "expected"), [
    (0, (0, None)), (1 << 8, (1, None)), (signal.SIGHUP, (129, 1)),
    (signal.SIGSEGV | 0x80, (139, 11)),  # with a core dump
])
def test_exit_code_of_a_wait_status(status: int, expected: tuple[int, int | None]) -> None:
    assert nodeprocs.exit_code(status) == expected


# -- sampler (readers on a fake root directory) -------------------------------------------------


def test_rooted_and_read_text(tmp_path: Path) -> None:
    assert sampler.rooted("/", "/proc/stat") == "/proc/stat"
    assert sampler.rooted("", "/proc/stat") == "/proc/stat"
    assert sampler.rooted("/fake", "/proc/stat") == "/fake/proc/stat"
    assert sampler.rooted("/fake/", "proc/stat") == "/fake/proc/stat"
    put(tmp_path, "a", b"caf\xc3\xa9 \xff\n")
    assert sampler.read_text(str(tmp_path / "a")) == "caf\u00e9 \ufffd\n"
    put(tmp_path, "empty", "")
    assert sampler.read_text(str(tmp_path / "empty")) == ""
    assert sampler.read_text(str(tmp_path / "missing")) is None
    assert sampler.read_text(str(tmp_path)) is None  # a directory
    assert sampler.read_text(str(tmp_path / "a\0b")) is None  # ValueError: a NUL in the name


@pytest.mark.parametrize(("stat", "cpu"), [
    # user nice system idle iowait irq softirq steal guest guest_nice: guest is in user
    ("cpu  10 20 30 400 50 6 7 8 900 900\ncpu0 1\ncpu1 1\ncpu2 1\n", (81, 531, 3)),
    ("cpu  10 0 30 400\ncpu0 1\n", (40, 440, 1)),  # no iowait (old kernels)
    ("cpu  10 0 30 400 50\ncpu0 1\ncpu1 1\n", (40, 490, 2)),
    ("cpu  10 0 30 400 50 n/a\ncpu0 1\n", (40, 490, 1)),  # a non-number is dropped
    ("cpufreq 1\ncpu  1 0 0 3 0\ncpuX 1\ncpu7 1\n", (1, 4, 1)),  # only cpuN lines count
])
def test_read_cpu(tmp_path: Path, stat: str, cpu: tuple[int, int, int]) -> None:
    put(tmp_path, "/proc/stat", stat)
    assert sampler.read_cpu(str(tmp_path)) == cpu


def test_read_cpu_without_a_total_or_cpu_lines(tmp_path: Path) -> None:
    put(tmp_path, "/proc/stat", "cpu  0 0 0 0 0\ncpu0 0\n")
    assert sampler.read_cpu(str(tmp_path)) is None
    put(tmp_path, "/proc/stat", "intr 1\n")
    assert sampler.read_cpu(str(tmp_path)) is None
    put(tmp_path, "/proc/stat", "")
    assert sampler.read_cpu(str(tmp_path)) is None
    put(tmp_path, "/proc/stat", "cpu  1 0 1 2\n")  # no cpuN lines: this machine's count
    assert sampler.read_cpu(str(tmp_path)) == (2, 4, os.cpu_count() or 1)


def test_read_load_and_mem(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert sampler.read_load(root) is None and sampler.read_mem(root) is None
    put(tmp_path, "/proc/loadavg", "0.5 1 2.25 1/2 3 4\n")
    assert sampler.read_load(root) == [0.5, 1.0, 2.25]
    put(tmp_path, "/proc/loadavg", "0.5 x 2\n")
    assert sampler.read_load(root) is None
    put(tmp_path, "/proc/loadavg", "")
    assert sampler.read_load(root) is None
    put(tmp_path, "/proc/meminfo", "MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable: 40 kB\n")
    assert sampler.read_mem(root) == (60 * 1024, 100 * 1024)
    put(tmp_path, "/proc/meminfo", "MemTotal: 100 kB\nMemFree: 10 kB\n")  # old kernels
    assert sampler.read_mem(root) == (90 * 1024, 100 * 1024)
    put(tmp_path, "/proc/meminfo", "MemTotal:100\nMemTotal: x kB\nMemFree: 10 kB\nBad\n")
    assert sampler.read_mem(root) is None  # no MemTotal that is a number
    put(tmp_path, "/proc/meminfo", "MemTotal: 100 kB\nMemAvailable: x kB\n")
    assert sampler.read_mem(root) is None
    put(tmp_path, "/proc/meminfo", "")
    assert sampler.read_mem(root) is None


def test_read_net(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert sampler.read_net(root) == {}
    rows = ["h1: 1 2 3 4 5 6 7 8 9", "h2: 1 2 3 4 5 6 7 8 9",  # the two header lines
            "  eth0: 10 0 0 0 0 0 0 0 20 0", "eth1:30 0 0 0 0 0 0 0 40",
            "eth2: 1 2 3 4 5 6 7 8", "eth3: x 0 0 0 0 0 0 0 1", "eth4: 1 0 0 0 0 0 0 0 y",
            "no colon 1 2 3 4 5 6 7 8 9"]
    put(tmp_path, "/proc/net/dev", "\n".join(rows) + "\n")
    assert sampler.read_net(root) == {"eth0": (10, 20), "eth1": (30, 40)}


@pytest.mark.parametrize(("text", "value"), [
    ("198.18.0.11", (198 << 24) | (18 << 16) | 11), ("0.0.0.0", 0),
    ("255.255.255.255", 0xFFFFFFFF), ("1.2.3.4", 0x01020304), ("256.0.0.1", None),
    ("1.2.3", None), ("1.2.3.4.5", None), ("a.b.c.d", None), ("1.2.3.", None), ("", None),
    ("-1.2.3.4", None),
])
def test_ip4(text: str, value: int | None) -> None:
    assert sampler._ip4(text) == value


ROUTE_HEAD = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"


def route_row(iface: str, dest: str, mask: str) -> str:
    return f"{iface}\t{dest}\t00000000\t0001\t0\t0\t0\t{mask}\t0\t0\t0\n"


def test_route_iface_takes_the_longest_prefix(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert sampler.route_iface("10.0.0.1", root) is None  # no route table
    put(tmp_path, "/proc/net/route", ROUTE_HEAD
        + route_row("dflt", "00000000", "00000000")
        + route_row("wide", "0000000A", "000000FF")  # 10.0.0.0/8
        + route_row("narrow", "0000010A", "0000FFFF")  # 10.1.0.0/16
        + route_row("same", "0000010A", "0000FFFF")  # the same /16 again: the first stays
        + route_row("host", "0201010A", "FFFFFFFF")  # 10.1.1.2/32
        + "short\t0000000B\n"
        + route_row("badhex", "zz00000B", "000000FF")
        + route_row("badmask", "0000000C", "0000FFzz"))
    assert sampler.route_iface("10.1.1.2", root) == "host"
    assert sampler.route_iface("10.1.1.3", root) == "narrow"
    assert sampler.route_iface("10.2.0.1", root) == "wide"
    assert sampler.route_iface("11.0.0.1", root) == "dflt"
    assert sampler.route_iface("12.0.0.1", root) == "dflt"
    assert sampler.route_iface("no.such.addr.x", root) is None
    assert sampler.route_iface("", root) is None and sampler.route_iface(None, root) is None
    put(tmp_path, "/proc/net/route", ROUTE_HEAD + route_row("wide", "0000000A", "000000FF"))
    assert sampler.route_iface("11.0.0.1", root) is None  # no route holds it
    put(tmp_path, "/proc/net/route", route_row("first", "00000000", "00000000"))
    assert sampler.route_iface("1.2.3.4", root) is None  # the first line is the header


def test_default_ifaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path)
    assert sampler.default_ifaces(root, {}) == []
    put(tmp_path, "/proc/net/route", ROUTE_HEAD + route_row("dflt", "00000000", "00000000")
        + route_row("lan", "000012C6", "00FFFFFF"))
    assert sampler.default_ifaces(root, {"SSH_CONNECTION": "198.18.0.1 5 198.18.0.11 22"}) == [
        "lan"]
    assert sampler.default_ifaces(root, {"SSH_CONNECTION": "::1 5 ::1 22"}) == ["dflt"]
    assert sampler.default_ifaces(root, {"SSH_CONNECTION": ""}) == ["dflt"]
    monkeypatch.setenv("SSH_CONNECTION", "198.18.0.7 5 198.18.0.11 22")
    assert sampler.default_ifaces(root) == ["lan"]  # os.environ by default
    put(tmp_path, "/proc/net/route", ROUTE_HEAD + route_row("lan", "000012C6", "00FFFFFF"))
    assert sampler.default_ifaces(root, {"SSH_CONNECTION": "10.0.0.1 5 1.1.1.1 22"}) == []


@pytest.mark.parametrize(("text", "value"), [
    (" 12 ", 12), ("1.5", 1.5), ("3.0", 3), ("0", 0), ("-2", -2), ("", None), ("  ", None),
    ("[N/A]", None), ("[Not Supported]", None), ("N/A", None), ("-", None), ("abc", None),
    (" N/A ", None),
])
def test_num(text: str, value: object) -> None:
    got = sampler._num(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("line", [
    "", "8, 3, 97, 1, 2, 3, 4, 5", "1.5, 0, 1, 2, 3, 4, 5, 6, gpu", "1, [N/A], 1, 2, 3, 4, 5, 6, g",
    "x, 0, 1, 2, 3, 4, 5, 6, g", "1, 0.5, 1, 2, 3, 4, 5, 6, g",
])
def test_parse_smi_line_refuses_what_is_not_a_gpu_line(line: str) -> None:
    assert sampler.parse_smi_line(line) is None


def test_parse_smi_line_fields() -> None:
    assert sampler.parse_smi_line("2,1,5,6,7,8,9.5,10, A, B ") == (2, {
        "index": 1, "name": "A, B", "util_pct": 5, "mem_used_mib": 6, "mem_total_mib": 7,
        "temp_c": 8, "power_w": 9.5, "power_limit_w": 10})
    assert sampler.parse_smi_line("1, 0, -, , N/A, [x], 1.0, 2.25,") == (1, {
        "index": 0, "name": "", "util_pct": None, "mem_used_mib": None, "mem_total_mib": None,
        "temp_c": None, "power_w": 1, "power_limit_w": 2.25})


@pytest.mark.parametrize(("value", "rounded"), [
    (None, None), (2.0, 2), (2.04, 2), (2.06, 2.1), (2.96, 3), (0.0, 0), (-1.26, -1.3),
    (7, 7),
])
def test_round(value: float | None, rounded: object) -> None:
    got = sampler._round(value)
    assert got == rounded and type(got) is type(rounded)


def amd(root: Path, card: str, files: dict[str, str], vendor: str = "0x1002") -> None:
    dev = f"/sys/class/drm/{card}/device"
    put(root, dev + "/vendor", vendor + "\n")
    for rel, text in files.items():
        put(root, dev + "/" + rel, text)


def test_read_amdgpus_in_card_order_with_what_each_has(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert sampler.read_amdgpus(root) == []  # no drm class
    full = {"gpu_busy_percent": "12\n", "mem_info_vram_used": str(1536 * 1048576),
            "mem_info_vram_total": str(4096 * 1048576),
            "hwmon/hwmon2/temp1_input": "45500\n", "hwmon/hwmon1/temp1_input": "40000\n",
            "hwmon/hwmon1/power1_average": "", "hwmon/hwmon1/power1_input": "99960000\n",
            "hwmon/hwmon1/power1_cap": "300000000\n"}
    amd(tmp_path, "card10", full)
    amd(tmp_path, "card2", {"gpu_busy_percent": "x\n", "mem_info_vram_used": " \n",
                            "hwmon/hwmon0/power1_average": "1500000\n"})
    amd(tmp_path, "card1", full, vendor="0x10de")  # not AMD
    amd(tmp_path, "card3", {})  # no hwmon directory at all
    put(tmp_path, "/sys/class/drm/card2-DP-1/device/vendor", "0x1002\n")  # a connector
    put(tmp_path, "/sys/class/drm/renderD128/device/vendor", "0x1002\n")
    put(tmp_path, "/sys/class/drm/card/device/vendor", "0x1002\n")
    empty_hwmon = {"hwmon/.keep": ""}
    amd(tmp_path, "card4", empty_hwmon)
    (tmp_path / "sys/class/drm/card4/device/hwmon/.keep").unlink()
    none = {"util_pct": None, "mem_used_mib": None, "mem_total_mib": None, "temp_c": None,
            "power_w": None, "power_limit_w": None}
    assert sampler.read_amdgpus(root) == [
        {**none, "index": 0, "name": "amdgpu card2", "power_w": 1.5},
        {**none, "index": 1, "name": "amdgpu card3"},
        {**none, "index": 2, "name": "amdgpu card4"},
        {"index": 3, "name": "amdgpu card10", "util_pct": 12, "mem_used_mib": 1536,
         "mem_total_mib": 4096, "temp_c": 40, "power_w": 100, "power_limit_w": 300}]


def test_proc_stat_and_environ(tmp_path: Path) -> None:
    root = str(tmp_path)
    fields = ["R"] + ["0"] * 10 + ["300", "200"] + ["0"] * 6 + ["777"] + ["0"] * 5
    put(tmp_path, "/proc/5/stat", "5 (a) b) c) " + " ".join(fields) + "\n")
    assert sampler.proc_stat(root, 5) == (500 / sampler.CLK_TCK, "R", 777)
    put(tmp_path, "/proc/6/stat", "6 (x) R 1 2\n")
    assert sampler.proc_stat(root, 6) is None  # too short
    put(tmp_path, "/proc/7/stat", "7 no parens " + " ".join(fields))
    assert sampler.proc_stat(root, 7) is None
    put(tmp_path, "/proc/8/stat", "8 (x) " + " ".join(fields[:11] + ["y"] + fields[12:]))
    assert sampler.proc_stat(root, 8) is None
    assert sampler.proc_stat(root, 9) is None
    put(tmp_path, "/proc/5/environ", b"A=1\0B=x=y\0NOEQ\0C=\0\xff=\xfe\0")
    assert sampler.read_environ(root, 5) == {"A": "1", "B": "x=y", "C": "", "\ufffd": "\ufffd"}
    assert sampler.read_environ(root, 9) is None


def test_to_json_writes_plain_values_without_json(monkeypatch: pytest.MonkeyPatch) -> None:
    value = {"type": "exit", "code": 0, "ranks": [1, 2.5, None, True], "s": "\u00e9\n"}
    expected = json.dumps(value, separators=(",", ":"))
    monkeypatch.setitem(sys.modules, "json", None)  # `import json` fails: not needed here
    assert nodecommon.to_json(value) == expected
    with pytest.raises(ImportError):  # what only json writes needs it
        nodecommon.to_json({"x": float("nan")})


def test_frame_sources_of_a_dump_that_starts_with_a_frame_and_its_cap(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("a = 1\nb = 2\nc = 3\n")
    f = str(src)
    lines = [f'  File "{f}", line {n} in f' for n in (1, 2, 3)]
    assert nodeevidence.frame_sources("\n".join(lines)) == {f + ":1": "a = 1", f + ":2": "b = 2"}
    many = []  # 201 threads of two frames each: 402 frames, 400 kept by default
    for t in range(201):
        many += [f"Thread 0x{t:016x} (most recent call first):",
                 f'  File "/x/t{t}.py", line 1 in f', f'  File "/x/t{t}.py", line 2 in g']
    got = nodeevidence.frame_sources("\n".join(many))
    assert len(got) == 400 and "/x/t199.py:2" in got and "/x/t200.py:1" not in got


def test_frame_sources_of_a_path_that_holds_the_separator(tmp_path: Path) -> None:
    odd = tmp_path / 'a", line 1 in x'
    odd.mkdir()
    src = odd / "m.py"
    src.write_text("first = 1\nsecond = 2\n")
    dump = f'Stack (most recent call first):\n  File "{src}", line 2 in <module>\n'
    assert nodeevidence.frame_sources(dump) == {f"{src}:2": "second = 2"}


def test_the_readers_read_this_machine_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    roots = []
    real = sampler.rooted

    def rooted(root: str, path: str) -> str:
        roots.append(root)
        return real(root, path)

    monkeypatch.setattr(sampler, "rooted", rooted)
    sampler.read_cpu(), sampler.read_load(), sampler.read_mem(), sampler.read_net()
    sampler.route_iface("198.18.0.1"), sampler.default_ifaces(environ={}), sampler.read_amdgpus()
    assert roots and set(roots) == {"/"}


def test_read_cpu_counts_one_cpu_when_the_machine_cannot_say(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    put(tmp_path, "/proc/stat", "cpu  1 0 1 2\n")
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert sampler.read_cpu(str(tmp_path)) == (2, 4, 1)


def test_read_net_and_route_iface_go_past_lines_they_skip(tmp_path: Path) -> None:
    root = str(tmp_path)
    put(tmp_path, "/proc/net/dev", "h1\nh2\nno colon here\neth0: 1 0 0 0 0 0 0 0 2\n")
    assert sampler.read_net(root) == {"eth0": (1, 2)}
    put(tmp_path, "/proc/net/route", ROUTE_HEAD + "short\t0000000A\n"
        + route_row("badhex", "zz00000A", "000000FF")
        + "eight\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\n")  # 8 fields: enough
    assert sampler.route_iface("10.0.0.1", root) == "eight"


def test_amdgpu_watts_and_mib_are_rounded_to_a_tenth_after_the_exact_scale(
        tmp_path: Path) -> None:
    amd(tmp_path, "card0", {"mem_info_vram_used": str(157286453477),  # 150000.051 MiB
                            "mem_info_vram_total": str(157286453477),
                            "hwmon/hwmon0/power1_average": "700050300\n",  # 700.0503 W
                            "hwmon/hwmon0/power1_cap": "750050300\n"})
    amd(tmp_path, "card1", {"hwmon/hwmon0/power1_input": "690050300\n"})
    got = sampler.read_amdgpus(str(tmp_path))
    assert [(g["mem_used_mib"], g["mem_total_mib"], g["power_w"], g["power_limit_w"])
            for g in got] == [(150000.1, 150000.1, 700.1, 750.1), (None, None, 690.1, None)]


def test_peer_pid_is_the_kernels_word_not_the_claim() -> None:
    """A rank inside a container claims its namespace's pid; SO_PEERCRED says ours."""
    import socket

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert nodecommon.peer_pid(a, 12345) == os.getpid()
    assert nodecommon.peer_pid(object(), 12345) == 12345  # no socket: the claim stands
