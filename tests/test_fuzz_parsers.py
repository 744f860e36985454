"""Property-based fuzzing (hypothesis) of every parser that reads outside input (issue 39
item 2; docs/reliability.md): hostfiles (text, YAML, -H, --include/--exclude), Slurm's
nodelists and counts, env files, --env, config.toml, .deepspeed_env, the supervisor's frames
and messages, the sampler's lines, the probe's answers, faulthandler dumps, flight recorder
dumps.

The property, for each: a correct parse or the project's clear error (a UsageError, exit 2,
naming the file or option; for what a node sends: that node's own error, or the message
ignored), never another exception, never more than TIME_S, never more than MEMORY
(tests/fuzzing.py). DTRAIN_FUZZ_EXAMPLES=100000 is the long run kept in the docs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.errors import DtrainError, HostfileError, RemoteCommandError, UsageError
from launcher.models import Host
from tests.fuzzing import FUZZ, bounded, fuzz_seed, json_values, lines, mutated, tokens

ROOT = Path(__file__).resolve().parent.parent


def _usage(exc: BaseException, where: str) -> None:
    """The clear error: exit 2, its message names where (the file, the option)."""
    assert isinstance(exc, UsageError), f"{type(exc).__name__}: {exc}"
    assert exc.exit_code == 2
    assert where in str(exc), f"{where!r} not in {str(exc)!r}"


def _hosts_ok(hosts: object) -> None:
    assert isinstance(hosts, list) and all(isinstance(h, Host) for h in hosts)


# ------------------------------------------------------------------------------- hostfiles

HOST_TOKENS = ["node", "gpu", "node[1-4]", "n[01-10,12]", "[1-3]", "[2-1]", "[0-99999999]",
               "user@", "dtuser@node1", ":22", ":2222", ":99999", ":0", " slots=8", " slots=",
               " slots=0", " slots=99999999", " port=22", " port=x", " python=/usr/bin/python3",
               " user=u", " max_slots=2", " max-slots=3", " image=x", " bogus=1", " # c",
               "[::1]", "::1", "10.0.0.1", "198.18.0.11", "node1.example", ".", "-x", "a_b",
               " ", "\t", "localhost", "node[1-2]x[3-4]", "n[1-3,5-7]-ib"]


@fuzz_seed
@FUZZ
@given(lines(tokens(HOST_TOKENS, 12)))
def test_text_hostfile(text: str) -> None:
    from launcher.hosts.hostfile import parse_hostfile_text

    with bounded():
        try:
            _hosts_ok(parse_hostfile_text(text, "hosts.txt"))
        except HostfileError as exc:
            _usage(exc, "hosts.txt")


YAML_TOKENS = ["hosts:", "defaults:", "\n", "\n  - ", "- ", "  ", "host: ", "slots: ", "port: ",
               "user: ", "python: ", "env:", "image: ", "{", "}", "[", "]", ", ", ": ", "'",
               '"', "node[1-4]", "n1 slots=2", "&a ", "*a", "<<: *a", "!!int ", "!!str ",
               "!!binary ", "!!python/object:os.system ", "!!set ", "!!timestamp ",
               "2001-13-45", "8", "-1", "true", "null", "~", "NCCL_DEBUG: INFO", "A=B", "---",
               "...", "%YAML 1.1", "? ", "|", ">", "\t", "#"]


@fuzz_seed
@FUZZ
@given(tokens(YAML_TOKENS, 60))
def test_yaml_hostfile(text: str) -> None:
    from launcher.hosts.hostfile import parse_hostfile_yaml

    with bounded():
        try:
            _hosts_ok(parse_hostfile_yaml(text, "hosts.yaml"))
        except HostfileError as exc:
            _usage(exc, "hosts.yaml")


PROFILE_TOKENS = [*YAML_TOKENS, "name: ", "description: ", "NCCL_IB_HCA: mlx5", "!!float ",
                  "!!bool ", "on", "1.5"]


@fuzz_seed
@FUZZ
@given(tokens(PROFILE_TOKENS, 60))
def test_profile(text: str) -> None:
    """`--profile FILE` (decide/runplan/netenv.parse_profile): a site's NCCL variables, YAML."""
    from launcher.decide.runplan.netenv import parse_profile

    with bounded():
        try:
            env = parse_profile(text, "site.yaml")
        except UsageError as exc:
            _usage(exc, "site.yaml")
        else:
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


@fuzz_seed
@FUZZ
@given(tokens(HOST_TOKENS + [","], 16))
def test_host_expression(expr: str) -> None:
    from launcher.hosts.hostfile import parse_host_expr

    with bounded():
        try:
            _hosts_ok(parse_host_expr(expr))
        except HostfileError as exc:
            _usage(exc, "-H")


@fuzz_seed
@FUZZ
@given(tokens(HOST_TOKENS + [",", "!", "&", "^", "@grp"], 10),
       tokens(HOST_TOKENS + [",", "!", "&", "^"], 10))
def test_include_exclude(include: str, exclude: str) -> None:
    from launcher.hosts.hostfile import filter_hosts

    hosts = [Host(f"node{i}") for i in range(1, 9)]
    with bounded():
        try:
            _hosts_ok(filter_hosts(hosts, include or None, exclude or None))
        except HostfileError as exc:
            assert isinstance(exc, UsageError) and exc.exit_code == 2
            assert "--include" in str(exc) or "--exclude" in str(exc), str(exc)


# ----------------------------------------------------------------------------------- Slurm

SLURM_TOKENS = ["node", "gpu-", "n", "[", "]", "1", "01", "001", "-", ",", "1-4", "3-1", "9" * 5000,
                "0-99999999", "a[1-2]b[3-4]", "node[1-3,5]", "x", "9" * 25, " ", "(x3)", "(x",
                "2(x3)", "0", "a100:4", ":"]


@fuzz_seed
@FUZZ
@given(tokens(SLURM_TOKENS, 30))
def test_slurm_nodelist(text: str) -> None:
    from launcher.hosts.slurm import NODELIST, expand_nodelist

    with bounded():
        try:
            names = expand_nodelist(text)
            assert all(isinstance(n, str) and n for n in names)
        except HostfileError as exc:
            _usage(exc, NODELIST)


@fuzz_seed
@FUZZ
@given(tokens(SLURM_TOKENS, 20), st.integers(0, 40))
def test_slurm_counts(text: str, n: int) -> None:
    from launcher.hosts.slurm import expand_counts

    with bounded():
        try:
            counts = expand_counts(text, n, "SLURM_TASKS_PER_NODE")
            assert len(counts) == n and all(c > 0 for c in counts)
        except HostfileError as exc:
            _usage(exc, "SLURM_TASKS_PER_NODE")


SLURM_VARS = ["SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NNODES",
              "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE",
              "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_GRES", "SLURM_TRES_PER_NODE",
              "SLURM_JOB_NUM_NODES", "SLURM_STEP_ID", "SLURM_CPUS_ON_NODE",
              "SLURM_JOB_CPUS_PER_NODE", "SLURM_NTASKS", "SLURM_NPROCS"]


@fuzz_seed
@FUZZ
@given(st.dictionaries(st.sampled_from(SLURM_VARS), tokens(SLURM_TOKENS, 12), max_size=8))
def test_slurm_allocation(environ: dict[str, str]) -> None:
    from launcher.hosts.slurm import allocation

    with bounded():
        try:
            allocation({"SLURM_JOB_ID": "7", **environ})
        except HostfileError as exc:
            assert isinstance(exc, UsageError) and "SLURM_" in str(exc), str(exc)


# ----------------------------------------------------------------------------- environment

ENV_TOKENS = ["export ", "A", "NCCL_DEBUG", "_X1", "1A", "A-B", "=", "==", "'", '"', "\\",
              "\\n", "\\\"", "$A", "${A}", "#", " #", "value", " ", "\t", "\r", "\x00", "\n",
              "'''", '"""']


@fuzz_seed
@FUZZ
@given(lines(tokens(ENV_TOKENS, 14)))
def test_env_file(text: str) -> None:
    from launcher.hosts.envfile import parse_env_text

    with bounded():
        try:
            pairs = parse_env_text(text, "my.env")
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in pairs)
        except UsageError as exc:
            _usage(exc, "my.env")


@fuzz_seed
@FUZZ
@given(st.lists(tokens(ENV_TOKENS, 8), max_size=6))
def test_env_args(items: list[str]) -> None:
    from launcher.hosts.envfile import parse_env_args

    with bounded():
        try:
            parse_env_args(items, {"A": "1", "NCCL_DEBUG": "INFO"})
        except UsageError as exc:
            _usage(exc, "--env")


TOML_TOKENS = ["archive_dir", "hostfile", "python", "transport", "persist", "env", "[env]",
               "[x]", "[[env]]", " = ", "=", '"', "'", '"""', "'''", "1", "true", "[1, 2]",
               "{a = 1}", "NCCL_DEBUG", "\n", "#", "\\", "\\u00e9", "\\x", "1979-05-27", "inf",
               "a.b", " ", "\t"]


@fuzz_seed
@FUZZ
@given(lines(tokens(TOML_TOKENS, 14)))
def test_config_toml(text: str) -> None:
    from launcher.hosts.userconfig import parse

    with bounded():
        try:
            parse(text, Path("/home/u/.config/dtrain/config.toml"))
        except UsageError as exc:
            _usage(exc, "config.toml")


@fuzz_seed
@FUZZ
@given(st.binary(max_size=200) | lines(tokens(ENV_TOKENS, 14)).map(str.encode))
def test_deepspeed_env(data: bytes) -> None:
    """DeepSpeed's file as run reads it (any bytes: it is a file in the user's home)."""
    import os
    import tempfile

    from launcher.cli.groups import DEEPSPEED_ENV, deepspeed_env

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / DEEPSPEED_ENV).write_bytes(data)
        saved = os.environ.pop("DS_ENV_FILE", None)
        try:
            with bounded():
                try:
                    pairs, _ = deepspeed_env(cwd=tmp, home=tmp)
                    assert all(isinstance(k, str) and isinstance(v, str) for k, v in pairs)
                except UsageError as exc:
                    _usage(exc, DEEPSPEED_ENV)
        finally:
            if saved is not None:
                os.environ["DS_ENV_FILE"] = saved


# ----------------------------------------------------------------------- what nodes send

def _framed(kind: int, rank: int, data: bytes) -> bytes:
    from launcher.nodeside import wire

    return wire.FRAME.pack(kind, rank, len(data)) + data


@st.composite
def _supervisor_stream(draw: Any) -> bytes:
    """A supervisor's stdout: shell noise, the marker, frames (some broken), any bytes."""
    from launcher.nodeside import wire

    parts = [draw(st.binary(max_size=30)), wire.MAGIC if draw(st.booleans()) else b""]
    for _ in range(draw(st.integers(0, 6))):
        choice = draw(st.integers(0, 4))
        if choice == 0:
            parts.append(draw(st.binary(max_size=40)))
        else:
            kind = draw(st.sampled_from([wire.KIND_OUT, wire.KIND_ERR, wire.KIND_CTL,
                                         wire.KIND_NOISE, 0, 99, 255]))
            rank = draw(st.integers(-(2 ** 31), 2 ** 31 - 1) | st.integers(-2, 9))
            body = json.dumps(draw(json_values(SUPERVISOR_KEYS))).encode() \
                if choice == 1 else draw(st.binary(max_size=40))
            parts.append(_framed(kind, rank, body))
    return b"".join(parts)


SUPERVISOR_KEYS = ["type", "rank", "code", "signal", "t", "duration", "stop_signal", "evidence",
                   "ranks", "supervisor_pid", "pid", "error", "stopped", "id", "native",
                   "pyspy", "files", "text", "sources", "fr", "data", "0", "1", "2", "-1", "\u00b2",
                   "9" * 5000, " 1", "01"]


@fuzz_seed
@FUZZ
@given(_supervisor_stream(), st.lists(st.integers(1, 64), min_size=1, max_size=8))
def test_supervisor_frames(stream: bytes, cuts: list[int]) -> None:
    """Any stream in any chunking: frames or FrameError (the node's error), never another."""
    from launcher.nodeside import wire

    decoder = wire.FrameDecoder(max_frame=1 << 20)
    pos, i = 0, 0
    with bounded():
        try:
            while pos < len(stream):
                step = cuts[i % len(cuts)]
                for frame in decoder.feed(stream[pos:pos + step]):
                    if frame.kind == wire.KIND_CTL:
                        assert isinstance(frame.message(), dict)
                pos, i = pos + step, i + 1
        except wire.FrameError:
            pass


def _session(ranks: tuple[int, ...] = (0, 1)) -> Any:
    from launcher.job.node import JobSpec, NodeSession

    conn = SimpleNamespace(host=Host("n1"))
    return NodeSession(conn, JobSpec(argv=("true",)), on_chunk=lambda *a: None,  # type: ignore[arg-type]
                       on_event=lambda *a: None, ranks=ranks)


def _decoded(session: Any, msg: Any) -> Any:
    """``msg`` as the session decodes a control frame (job/events.py checks it against the
    plan): the event believed, None (dropped, or FrameError: that node's error)."""
    from launcher.nodeside import wire

    frame = wire.Frame(wire.KIND_CTL, -1, json.dumps(msg).encode())
    try:
        return session._message(frame)  # type: ignore[no-any-return]
    except wire.FrameError:
        return None


RANK_ENTRY = {"code": 1, "signal": None, "t": 5.0, "duration": 4.0, "stop_signal": None}
EXIT_MSG = {"type": "exit", "code": 1, "signal": None, "stopped": "b rank 1 exited 7",
            "t": 110.0, "ranks": {"0": RANK_ENTRY, "1": {**RANK_ENTRY, "code": 0}}}
HELLO_MSG = {"type": "hello", "supervisor_pid": 10, "pid": 11, "t": 100.0}


@fuzz_seed
@FUZZ
@given(st.one_of(mutated(HELLO_MSG, SUPERVISOR_KEYS), json_values(SUPERVISOR_KEYS)),
       st.one_of(mutated(EXIT_MSG, SUPERVISOR_KEYS), json_values(SUPERVISOR_KEYS)),
       st.sampled_from([None, 0, 1, 255]))
def test_supervisor_hello_and_exit(hello: Any, exit_msg: Any, status: int | None) -> None:
    """The node's hello and exit messages, through the outcome, the verdict, the summary,
    meta.json's node results and the root cause."""
    from launcher.decide.outcome.outcomes import JobOutcome
    from launcher.decide.outcome.verdict import (
        TailKeeper,
        node_results,
        root_cause_json,
        summary_lines,
        verdict,
    )
    from tests.test_failures import _plan

    session = _session()
    with bounded():
        for msg in (hello, exit_msg):
            if isinstance(msg, dict):
                msg = {**msg, "type": msg.get("type", "hello" if msg is hello else "exit")}
            decoded = _decoded(session, msg)
            if decoded is not None:
                session._control(decoded)
        node = session._outcome(status)
        other = session._outcome(0)
        out = JobOutcome(nodes={"n1": node, "n2": other})
        plan = _plan("n1", "n2", ranks=2)
        tails = TailKeeper()
        v = verdict(out, plan, tails)
        summary_lines(out, plan, v)
        json.dumps(node_results(out, plan, v))
        json.dumps(root_cause_json(out, v, tails))


RANK_EXIT = {"type": "rank_exit", "rank": 1, "code": 7, "signal": None, "t": 5.0,
             "duration": 4.0, "stop_signal": None, "evidence": {"oom": True}}


@fuzz_seed
@FUZZ
@given(st.lists(st.one_of(mutated(RANK_EXIT, SUPERVISOR_KEYS), mutated(HELLO_MSG, SUPERVISOR_KEYS),
                          mutated(EXIT_MSG, SUPERVISOR_KEYS), json_values(SUPERVISOR_KEYS)),
                max_size=6))
def test_supervisor_events(messages: list[Any]) -> None:
    """Every observer of a supervisor's events (the job's first-failure rule, the exit
    barrier's fold, the status line, the failure evidence, the samplers' end) takes whatever
    any JSON object decodes to."""
    from launcher.commands.launch import Evidence, NodeBoard, RunPipeline
    from launcher.commands.run_sampling import RunSampling
    from launcher.decide.outcome.failures import ErrorKeeper
    from launcher.job.orchestrate import Job, Policy
    from launcher.output.fold import ExitBarrierNoise

    job = Job([Host("n1")], {}, Policy(), SimpleNamespace())  # type: ignore[arg-type]
    job._failed = lambda *a: None  # type: ignore[method-assign]
    board, keeper = NodeBoard(["n1"], 2), ErrorKeeper()
    sampling = RunSampling.__new__(RunSampling)
    sampling.ended = set()
    pipeline = RunPipeline.__new__(RunPipeline)
    pipeline.barrier = ExitBarrierNoise({"n1": 2})
    for observer in (pipeline, board, Evidence(keeper), sampling):
        job.observe(observer)
    session = _session()
    with bounded():
        for raw in messages:
            ev = _decoded(session, raw)
            if ev is None:
                continue
            job._event(Host("n1"), ev, None)  # type: ignore[arg-type]
            board.render()


STACKS_MSG = {"type": "stacks", "id": "h1", "ranks": {
    "0": {"text": "Thread 0x00007f (most recent call first):\n  File \"/t.py\", line 3 in f\n",
          "sources": {"/t.py:3": "time.sleep(1)"}, "pyspy": {"text": "x"},
          "fr": {"data": base64.b64encode(pickle.dumps({"pg_status": {"0": {
              "last_enqueued_collective": 3, "last_completed_collective": 2}}})).decode()}},
    "1": {"error": "exited"}}}


@fuzz_seed
@FUZZ
@given(messages=st.lists(st.one_of(mutated(STACKS_MSG, SUPERVISOR_KEYS),
                                   json_values(SUPERVISOR_KEYS)), max_size=3))
def test_stacks_answers(messages: list[Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The hang watch's reading of every node's ``stacks`` answer (folded, archived)."""
    from launcher.job.events import Flight, Stacks
    from launcher.job.hangwatch import HangWatch, StackDump
    from launcher.output.rundir import RunDir

    folder = tmp_path_factory.mktemp("stacks")
    watch = HangWatch.__new__(HangWatch)
    watch.job = SimpleNamespace(sessions={"n1": None, "n2": None},
                                outcome=SimpleNamespace(nodes={}))
    watch.ranks = {"n1": [0, 1], "n2": [2, 3]}
    watch.run_dir = RunDir.open(folder)
    watch._natives = {}
    try:
        with bounded():
            decoded = [(f"n{i + 1}", _decoded(_session((2 * i, 2 * i + 1)), m))
                       for i, m in enumerate(messages)]
            msgs = {host: m for host, m in decoded if m is not None}
            dump = StackDump("h1", "fuzz", 0.0)
            watch._collect(dump, {host: m.ranks for host, m in msgs.items()
                                  if isinstance(m, Stacks)})
            assert dump.folded is not None
            dump.folded.lines()
            json.dumps(dump.json())
            for m in msgs.values():
                if isinstance(m, Stacks):
                    watch._native("h1", m.ranks)
                if isinstance(m, Flight):
                    watch._flight_files("end", m.files)
    finally:
        import os

        os.close(watch.run_dir.fd)


SAMPLE_KEYS = ["type", "t", "dt", "cpu_pct", "ncpu", "load", "mem_used", "mem_total", "net",
               "gpus", "gpu_source", "gpu_error", "gpu_age", "ranks", "self_cpu_ms", "cpu",
               "0", "1", "rx", "tx", "util", "mem", "-1", "\u00b2", "9" * 5000, "01"]
SAMPLE = {"type": "sample", "t": 100.0, "dt": 1.0, "cpu_pct": 50.0, "ncpu": 16,
          "load": [1.0, 1.0, 1.0], "mem_used": 1 << 30, "mem_total": 8 << 30,
          "net": {"eth0": {"rx": 1, "tx": 2}}, "gpus": [{"util": 90, "mem": 1}],
          "ranks": {"0": {"cpu": 0.5}, "1": {"cpu": 0.4}}, "self_cpu_ms": 3}


@fuzz_seed
@FUZZ
@given(st.lists(st.one_of(mutated(SAMPLE, SAMPLE_KEYS).map(json.dumps),
                          json_values(SAMPLE_KEYS).map(json.dumps),
                          tokens(["{", "}", '"type":', '"sample"', ",", "1", "\xb2"], 10)),
                max_size=6))
def test_sampler_lines(lines_: list[str]) -> None:
    """The sampler's lines as a run (samples.jsonl, stragglers) and `dtrain top` read them."""
    from launcher.commands.run_sampling import RunSampling
    from launcher.commands.top.model import TopState
    from launcher.decide.outcome.stragglers import StragglerDetector, StragglerSettings
    from launcher.job.sampling import NodeSampler, SamplerParams

    top = TopState(["n1"], 1.0)
    sampling = RunSampling.__new__(RunSampling)
    sampling.log = None
    sampling.node_ranks = {"n1": 0}
    sampling.detector = StragglerDetector(StragglerSettings())
    sampling.say = lambda text: None
    sampling._record = lambda: None  # type: ignore[method-assign]

    def both(host: str, msg: dict[str, Any]) -> None:
        top.on_sample(host, msg)
        sampling.on_sample(host, msg)

    sampler = NodeSampler(SimpleNamespace(host=Host("n1")), SamplerParams(1.0, ranks=(0, 1)),  # type: ignore[arg-type]
                          both)
    with bounded():
        for line in lines_:
            sampler._line(line.encode("utf-8", "surrogatepass"))


PROBE_KEYS = ["hostname", "python", "version", "executable", "packages", "torch", "gpus",
              "count", "driver", "limits", "memlock", "nofile", "stack", "interfaces", "name",
              "addrs", "addr", "family", "prefixlen", "operstate", "mtu", "routes", "dev",
              "src", "via", "rdma", "ports", "gids", "index", "gid", "type", "ndev", "site_env",
              "workdir", "ok", "denied", "entry", "uid", "user", "home", "files", "netns",
              "errors", "time", "shm", "container", "runtime", "image", "default_iface"]


def _real_facts() -> dict[str, Any]:
    from tests.util import node_program

    probe = node_program("probe")  # the bundle the nodes get (wire.PROGRAMS)
    proc = subprocess.run([sys.executable, str(probe)], input='{"targets": ["127.0.0.1"]}\n',
                          capture_output=True, text=True, timeout=60, check=True)
    facts: dict[str, Any] = json.loads(proc.stdout)
    return facts


REAL_FACTS = _real_facts()


@fuzz_seed
@FUZZ
@given(st.one_of(mutated(REAL_FACTS, PROBE_KEYS), json_values(PROBE_KEYS)),
       mutated(REAL_FACTS, PROBE_KEYS))
def test_probe_facts(facts: Any, other: Any) -> None:
    """The probe's facts as preflight and the doctor read them (and its route answers)."""
    from launcher.decide.fabric import checks
    from launcher.decide.runplan.facts import NodeFacts, Route

    with bounded():
        parsed = {}
        for name, raw in (("n1", facts), ("n2", other)):
            parsed[name] = NodeFacts.from_json(raw if isinstance(raw, dict) else {})
            routes = raw.get("routes") if isinstance(raw, dict) else None
            if isinstance(routes, dict):
                for k, v in routes.items():
                    Route.from_json(str(k), v if isinstance(v, dict) else {})
        for check in (checks.check_hostnames, checks.check_torch, checks.check_nccl,
                      checks.check_memlock):
            check(parsed)


_LOOP = asyncio.new_event_loop()


class _Proc:
    """What read_json_line reads: stdout in the given chunks, then EOF."""

    def __init__(self, chunks: list[bytes], stderr: bytes) -> None:
        self.chunks, self.stderr = list(chunks), stderr

    async def read_stdout(self, n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    async def read_stderr(self, n: int) -> bytes:
        out, self.stderr = self.stderr, b""
        return out

    async def wait(self) -> int:
        return 1

    @property
    def exit_status(self) -> int | None:
        return 1


@fuzz_seed
@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=30), mutated(REAL_FACTS, PROBE_KEYS).map(
    lambda v: json.dumps(v).encode() + b"\n"), st.sampled_from([b"{", b"\n", b"{}\n", b"[]\n",
                                                                  b"{\"a\":\n"])), max_size=5),
       st.binary(max_size=60))
def test_node_program_answer(chunks: list[bytes], stderr: bytes) -> None:
    """A node program's one JSON answer line after whatever the login shell printed."""
    from launcher.job.remote import read_json_line

    with bounded():
        try:
            result = _LOOP.run_until_complete(read_json_line(_Proc(chunks, stderr), "n1",  # type: ignore[arg-type]
                                                             "probe"))
            assert isinstance(result, dict)
        except RemoteCommandError as exc:
            assert isinstance(exc, DtrainError) and exc.host == "n1"


# ------------------------------------------------------------------------- dumps on disk

FH_TOKENS = ["Thread 0x00007f0000000001 (most recent call first):\n",
             "Current thread 0x00007f0000000002 (most recent call first):\n",
             "Fatal Python error: Aborted\n", '  File "/w/train.py", line 12 in step\n',
             '  File "/w/dtrain_rank.py", line 40 in main\n', '  File "<frozen runpy>", line 88',
             " in _run_code\n", "  <no Python frame>\n", "  File \"", "\", line ", " in ",
             "<module>", "12", "9" * 5000, "\u0663", "\n", "\r\n", "  ...\n"]


@fuzz_seed
@FUZZ
@given(st.dictionaries(st.integers(-3, 40), st.one_of(
    tokens(FH_TOKENS, 30), st.none(), json_values(["text", "error", "sources"])), max_size=6))
def test_faulthandler_dumps(dumps: dict[int, Any]) -> None:
    from launcher.decide.outcome.stacks import fold, rank_stack
    from launcher.job.events import stack_answer

    with bounded():
        stacks = [rank_stack(rank, "n1", stack_answer(
                  {"text": text} if not isinstance(text, dict) else text))
                  for rank, text in dumps.items()]
        folded = fold(stacks, range(8))
        folded.lines()
        json.dumps(folded.json())


FLIGHT = {"version": "2.10", "pg_status": {"0": {"last_enqueued_collective": 4,
                                                  "last_completed_collective": 3}},
          "entries": [{"collective_seq_id": 4, "pg_id": 0,
                       "profiling_name": "gloo:all_reduce"}]}
FLIGHT_KEYS = ["pg_status", "0", "last_enqueued_collective", "last_completed_collective",
               "entries", "collective_seq_id", "pg_id", "profiling_name", "\u00b2"]


@fuzz_seed
@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=80),
                          mutated(FLIGHT, FLIGHT_KEYS).map(pickle.dumps),
                          st.binary(max_size=40).map(lambda b: pickle.dumps(FLIGHT)[:len(b)])),
                max_size=5))
def test_flight_dumps(dumps: list[bytes]) -> None:
    from launcher.decide.outcome.flight import load_dump, rank_flight, summarize

    with bounded():
        positions = {}
        for rank, data in enumerate(dumps):
            loaded = load_dump(data)
            if loaded is not None:
                position = rank_flight(rank, loaded)
                if position is not None:
                    positions[rank] = position
        summary = summarize(positions)
        assert summary is None or all(isinstance(line, str) for line in summary.lines)


# ----------------------------------------------------- what the fuzzing found (regressions)

@pytest.mark.parametrize("expr", ["node[1-4]9999999999", "9" * 5000, "n[1-2]" + "9" * 5000],
                         ids=["folded", "digits", "suffix"])
def test_found_nodeset_failures_are_usage_errors(expr: str) -> None:
    """NodeSet's own AssertionError (a folded range over 1e9) and int()'s 4,300-digit
    ValueError were tracebacks from -H, hostfiles, --include/--exclude, logs/top --host."""
    from launcher.decide.copies.filters import expand
    from launcher.hosts.hostfile import fold, parse_host_expr, parse_hostfile_text

    for parse, where in ((parse_host_expr, "-H"),
                         (lambda e: parse_hostfile_text(e, "hosts.txt"), "hosts.txt"),
                         (lambda e: filter_hosts_([Host("a")], None, e), "--exclude"),
                         (lambda e: expand(e, "--host"), "--host")):
        with pytest.raises(UsageError) as info:
            parse(expr)
        _usage(info.value, where)
    assert fold(["n1", "n" + "9" * 4400])  # folding names never raises either


def filter_hosts_(hosts: list[Host], include: str | None, exclude: str | None) -> list[Host]:
    from launcher.hosts.hostfile import filter_hosts

    return filter_hosts(hosts, include, exclude)


@pytest.mark.parametrize("environ", [
    {"SLURM_JOB_NODELIST": "n[" + "9" * 5000 + "]"},
    {"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "9" * 5000},
    {"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "1(x" + "9" * 5000 + ")"},
    {"SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "9" * 5000}],
    ids=["nodelist", "cpus", "repeat", "ntasks"])
def test_found_slurm_long_numbers_are_usage_errors(environ: dict[str, str]) -> None:
    """A 5000-digit number in Slurm's variables was int()'s ValueError, a traceback."""
    from launcher.hosts.slurm import allocation

    with pytest.raises(HostfileError) as info:
        allocation({"SLURM_JOB_ID": "7", **environ})
    assert info.value.exit_code == 2 and "SLURM_" in str(info.value)


@pytest.mark.parametrize("data", [b"B\x00\x00\x00\x04", b"\x8e" + (2 ** 40).to_bytes(8, "little"),
                                  b"X\x00\x00\x00\x7f"], ids=["bytes4", "bytes8", "unicode4"])
def test_found_flight_dump_lengths_are_checked_before_any_allocation(data: bytes) -> None:
    """A five-byte flight dump declaring a 64 MiB string made the unpickler allocate 64 MiB
    (BINBYTES8: up to 2**64) before finding it truncated (found by the long run)."""
    import tracemalloc

    from launcher.decide.outcome.flight import load_dump

    tracemalloc.start()
    try:
        assert load_dump(data) is None
        assert tracemalloc.get_traced_memory()[1] < 8 << 20
    finally:
        tracemalloc.stop()


def test_found_faulthandler_line_numbers_past_int_limit_are_no_frame() -> None:
    """A dump whose frame line number has 5,000 digits: int()'s own ValueError (its
    4,300-digit limit) came out of the stack fold as a traceback (the fourth long run,
    seed 46). Such a line is no frame; the dump's other frames still fold."""
    from launcher.decide.outcome.stacks import parse_faulthandler

    text = ('Thread 0x00007f0000000001 (most recent call first):\n'
            '  File "<frozen runpy>", line 8' + "9" * 5000 + ' in _run_code\n'
            '  File "/w/train.py", line 12 in step\n')
    (thread,) = parse_faulthandler(text)
    assert [(f.path, f.line) for f in thread.frames] == [("/w/train.py", 12)]


_HUGE = "9" * 5000


@pytest.mark.parametrize("case", ["oom", "xid", "health-xid", "nccl", "step", "rank-filter"])
def test_found_numbers_past_ints_limit_elsewhere_are_no_traceback(case: str) -> None:
    """After the faulthandler find (seed 46), every other reader that turns digits of node
    or rank output into int() was tried with 5,000 digits: the kernel log's OOM and Xid
    lines, the health gate's Xids, NCCL's INFO lines, a rank's step number, --rank. Each let
    int()'s ValueError out; each now bounds its digits (a longer number matches nothing,
    --rank says exit 2)."""
    import re

    from launcher.decide.copies import filters
    from launcher.decide.fabric import health, nccl_account
    from launcher.decide.outcome import failures, steprate
    from launcher.decide.outcome.hang import DEFAULT_PROGRESS
    from launcher.errors import UsageError

    if case == "oom":
        line = f"Killed process {_HUGE} (python) anon-rss:{_HUGE}kB"
        assert failures._oom(1, {"kernel": [line]})[0] is False
    elif case == "xid":
        assert failures._xids({"kernel": [f"NVRM: Xid (PCI:0000:01:00): {_HUGE}, x"]}) == []
    elif case == "health-xid":
        assert health.xid_findings([f"NVRM: Xid (PCI:0000:01:00): {_HUGE}"], []) == []
    elif case == "nccl":
        acc = nccl_account.parse_lines([
            f"n1:1:1 [0] NCCL INFO rank {_HUGE} nranks {_HUGE} localRanks 1 Init COMPLETE",
            f"n1:1:1 [0] NCCL INFO GID {_HUGE} (x)",
            f"n1:1:1 [0] NCCL INFO Channel 00/0 : {_HUGE}[0] -> {_HUGE}[1] via P2P"])
        assert acc.nranks is None and acc.gid is None
    elif case == "step":
        rate = steprate.StepRate(re.compile(DEFAULT_PROGRESS))
        assert rate.feed(0, 1.0, f"step {_HUGE} loss 1.0")  # a progress line, counted
    else:
        with pytest.raises(UsageError):
            filters.parse_ranks(_HUGE, "--rank")


def test_found_odd_flight_entries() -> None:
    """A flight dump whose entries is a number was a TypeError (not reversible) in the hang
    watch's reading of the dumps."""
    from launcher.decide.outcome.flight import rank_flight

    dump = {"pg_status": {"0": {"last_enqueued_collective": 2,
                                "last_completed_collective": 1}}, "entries": 5}
    assert rank_flight(0, dump) is not None


@pytest.mark.parametrize("text", ["&a <<: *a", "hosts:\n  - {host: n1, <<: 5}"])
def test_found_yaml_merge_of_a_scalar_is_a_usage_error(text: str) -> None:
    """A '<<:' merge of a scalar was PyYAML's ConstructorError, a traceback (found by the
    long run, seed 39)."""
    from launcher.hosts.hostfile import parse_hostfile_yaml

    with pytest.raises(HostfileError) as info:
        parse_hostfile_yaml(text, "hosts.yaml")
    _usage(info.value, "hosts.yaml:")


@pytest.mark.parametrize("text", ["!!int : ", "!!float : ", "hosts:\n  - {host: n1, slots: !!int }",
                                  "hosts:\n  - {host: n1, slots: !!float ''}",
                                  "%YAML 1." + "9" * 5000 + "\n---\nhosts: [n1]\n"])
def test_found_yaml_empty_int_or_float_is_a_usage_error(text: str) -> None:
    """An empty scalar tagged !!int or !!float: PyYAML's own constructor indexes its first
    character, an IndexError and a traceback (found by the third long run, seed 44); a
    %YAML directive whose number has 5,000 digits: int()'s own ValueError from PyYAML's
    parser (seed 45)."""
    from launcher.hosts.hostfile import parse_hostfile_yaml

    with pytest.raises(HostfileError) as info:
        parse_hostfile_yaml(text, "hosts.yaml")
    _usage(info.value, "hosts.yaml:")
    assert "bad value" in str(info.value) or "%YAML" in str(info.value)


@pytest.mark.parametrize("text", ["env: {A: !!int ''}", "!!int : ", "env:\n  !!float : 1",
                                  "[" * 3000 + "]" * 3000, "&ahosts:\nhosts:", "1: x\nz: y",
                                  "%YAML 1." + "9" * 5000 + "\n---\nenv: {}\n"])
def test_found_profile_values_its_tag_cannot_read_are_config_errors(text: str) -> None:
    """--profile's YAML: an empty !!int (PyYAML's IndexError), a list nested 3,000 deep
    (RecursionError), unknown keys of two types (a null key beside a text one: sorting
    them, TypeError) were tracebacks (found when the profile joined the fuzz run, seed 44)."""
    from launcher.decide.runplan.netenv import parse_profile

    with pytest.raises(UsageError) as info:
        parse_profile(text, "site.yaml")
    _usage(info.value, "site.yaml")


def test_found_config_toml_with_a_huge_integer_is_a_config_error(tmp_path: Path) -> None:
    """An integer of 5,000 digits: tomllib let int()'s own ValueError out, a traceback
    (found by the long run, seed 42)."""
    from launcher.errors import ConfigError
    from launcher.hosts.userconfig import parse

    with pytest.raises(ConfigError) as info:
        parse("archive_dir = " + "9" * 5000 + "\n", tmp_path / "config.toml")
    assert str(tmp_path / "config.toml") in str(info.value)
    assert "not valid TOML" in str(info.value)


# ------------------------------------------------------------------------ NCCL's own lines

NCCL_LINES = [line for path in sorted((ROOT / "tests" / "data" / "nccl").glob("*.log"))
              for line in path.read_text().splitlines() if not line.startswith("#")]
NCCL_TOKENS = ["NCCL INFO ", "NCCL WARN ", "NET/IB : Using ", "[0]mlx5_0:1/RoCE", "NET/Socket",
               "via NET/IB/0/GDRDMA", "via NET/Socket/1", "via P2P/IPC", "Using network IB",
               "Using network Socket", "NCCL version 2.21.5+cuda12.4", "GID index ", "ens1f0",
               "<0>", ":", "[", "]", "9" * 5000, "\u00b2", "Init COMPLETE", "NCCL_IB_HCA set by "
               "environment to ", "=", " "]


@st.composite
def _nccl_lines(draw: Any) -> list[Any]:
    picked = draw(st.lists(st.sampled_from(NCCL_LINES), max_size=8))
    out: list[Any] = []
    for line in picked:
        cut = draw(st.integers(0, 3))
        if cut == 0:  # a real line, a token spliced in
            at = draw(st.integers(0, len(line)))
            line = line[:at] + draw(tokens(NCCL_TOKENS, 4)) + line[at:]
        elif cut == 1:
            line = draw(tokens(NCCL_TOKENS, 12))
        out.append(line)
    if draw(st.booleans()):
        out.append(draw(json_values(["lines"], leaves=4)))  # not a string
    return out


@fuzz_seed
@FUZZ
@given(st.lists(st.tuples(st.integers(-1, 4), _nccl_lines()), max_size=4),
       st.sampled_from([None, "rdma", "gdr", "any"]))
def test_nccl_lines(messages: list[tuple[int, list[Any]]], require: str | None) -> None:
    """NCCL's INFO/WARN lines, as the nodes ship them in ``nccl`` messages, through the
    session's decode, the run's fabric watch (its line, warnings, --require-fabric) and
    meta.json's ``fabric``."""
    from launcher.job.fabric import FabricWatch

    env = [SimpleNamespace(name="NCCL_IB_HCA", value="mlx5_0"),
           SimpleNamespace(name="NCCL_SOCKET_IFNAME", value="ens1f0"),
           SimpleNamespace(name="NCCL_IB_GID_INDEX", value="3")]
    plan = SimpleNamespace(nodes=[SimpleNamespace(host=Host(f"n{i + 1}"), ranks=range(2 * i,
                                                                                       2 * i + 2),
                                                  env=env) for i in range(2)])
    said: list[str] = []
    watch = FabricWatch(plan, require, said.append, lambda host, why: said.append(why))  # type: ignore[arg-type]
    sessions = [_session((0, 1)), _session((2, 3))]
    with bounded():
        for rank, lines_ in messages:
            node = 0 if rank < 2 else 1
            ev = _decoded(sessions[node], {"type": "nccl", "rank": rank, "lines": lines_})
            if ev is not None:
                watch.on_nccl(Host(f"n{node + 1}"), ev)
        watch.finish()
        json.dumps(watch.meta())
        assert all(isinstance(line, str) for line in said)
