"""A node that lies, as one test fixture with a menu of lies (issue 50).

A node's supervisor, sampler and health collector are programs on a machine someone else
may control (docs/threat-model.md, section 2): what they send is a claim. ``Liar`` builds
what such a node sends, as the node would send it (the JSON message bytes of each type
job/events.py decodes, a sampler's line, the health collector's line, the supervisor's
framed stream), so a test runs the real decode (``Cluster.decode``: job/nodemsg.py's checks
against the plan) and the real decision on it, without I/O where it can.

The menu (each a method of ``Liar``; ``Cluster.liar`` gives the lying node, ``Cluster.honest``
the node that tells the truth with the same builders):

* ``stacks``: a hang's stacks answer, forged stacks and flight-recorder positions per rank
  (``rank_entry``, ``fr``), for ranks it owns or not;
* ``rank_start``, ``rank_exit`` (with ``evidence``: the kernel's Xid lines, an OOM), ``exit``;
* ``nccl``: NCCL's account of a rank (``nccl_socket``/``nccl_gdr``: lines that name any
  host or peer rank);
* ``health``: the health collector's answer (a GPU, an Xid, a port; any ``host`` field);
* ``sample``: a sampler line with per-rank CPU seconds (the straggler evidence);
* ``smoke``: a smoke job's report line (versions, pair speeds, failed pairs);
* ``escapes``: text with terminal controls (``OSC52``, ``MOVE``); ``flood``: many lines or
  one huge one; ``silent``: nothing at all;
* ``stream``: messages and output framed as the supervisor's stream (job/node.py reads it);
* ``python_wrapper``: the same lies told by a real node of the test cluster (a hostfile's
  ``python=``), for the tests that need sshd (tests/test_hostile_cluster.py).

``Cluster`` is the plan: two nodes, two ranks each (``nodeA`` ranks 0-1, ``nodeB`` 2-3 by
default). Tests take it as the ``hostile`` fixture (``from tests.hostile import hostile``)
or build one.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launcher.job import events, nodemsg
from launcher.models import Host
from launcher.nodeside import wire
from launcher.transports.base import Process

# -- terminal escapes ---------------------------------------------------------------------------

OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # a clipboard write
MOVE = "\x1b[2J\x1b[1;1Hnode1 OK\r"  # clear the screen, home, draw a fake line
OSC52_SHOWN = "^[]52;c;cHduZWQ=^G"  # how dtrain shows it: visible, inert


def inert(text: str) -> None:
    """No control sequence of the liar's survives; what it sent is visible as ^[ text."""
    assert "\x1b]" not in text and "\x1b[2J" not in text and "\x07" not in text
    assert "\x1b[1;1H" not in text and "\r" not in text
    assert OSC52_SHOWN in text


# -- stacks and flight-recorder positions --------------------------------------------------------

LIB = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
Frames = Sequence[tuple[str, int, str]]
ALL_REDUCE: Frames = [(LIB, 3252, "all_reduce"), ("/job/train.py", 47, "step"),
                      ("/job/train.py", 60, "<module>")]
LOAD_BATCH: Frames = [("/job/data.py", 41, "load_batch"), ("/job/train.py", 44, "step"),
                      ("/job/train.py", 60, "<module>")]
BARRIER: Frames = [(LIB, 4100, "barrier"), ("/job/train.py", 50, "sync"),
                   ("/job/train.py", 60, "<module>")]


def stack_text(frames: Frames) -> str:
    """faulthandler's dump of a rank's main thread, innermost frame first."""
    lines = ["Current thread 0x1 (most recent call first):"]
    lines += [f'  File "{p}", line {n} in {f}' for p, n, f in frames]
    return "\n".join(lines) + "\n"


def fr(enq: int, done: int, op: str = "gloo:all_reduce") -> dict[str, object]:
    """The supervisor's ``fr`` of one rank: the flight recorder's pickle, as torch writes it
    (``enq``: last enqueued collective, ``done``: last completed)."""
    data = pickle.dumps({"version": "2.10", "pg_status": {"0": {
        "last_enqueued_collective": enq, "last_started_collective": -1,
        "last_completed_collective": done}}, "entries": [
        {"pg_id": 0, "collective_seq_id": enq, "profiling_name": op,
         "process_group": ("0", "default_pg")}]})
    return {"ok": True, "data": base64.b64encode(data).decode()}


def rank_entry(frames: Frames | None, position: dict[str, object] | None = None,
               error: str = "no dump within 2 s") -> dict[str, Any]:
    """One rank's entry of a stacks answer: its stack (None: it did not answer the dump) and
    its flight-recorder position."""
    entry: dict[str, Any] = ({"text": stack_text(frames)} if frames is not None
                             else {"error": error})
    if position is not None:
        entry["fr"] = position
    return entry


# -- NCCL's account ------------------------------------------------------------------------------

def nccl_socket(host: str, rank: int, peer: int) -> list[str]:
    """NCCL's lines of a rank on TCP (NET/Socket), its channel to ``peer``; ``host``: the
    name in each line's prefix (a liar may write any)."""
    p = f"{host}:4242:4242 [0] "
    return [f"{p}NCCL INFO NCCL version 2.21.5+cuda12.4",
            f"{p}NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
            f"{p}NCCL INFO Using network Socket",
            f"{p}NCCL INFO Channel 00/0 : {peer}[0] -> {rank}[0] [receive] via NET/Socket/0",
            f"{p}NCCL INFO Channel 00/0 : {rank}[0] -> {peer}[0] [send] via NET/Socket/0",
            f"{p}NCCL INFO comm 0x1 rank {rank} nranks 4 cudaDev 0 - Init COMPLETE"]


def nccl_gdr(host: str, rank: int, peer: int) -> list[str]:
    """NCCL's lines of a rank on RDMA with GPUDirect."""
    p = f"{host}:4242:4242 [0] "
    return [f"{p}NCCL INFO NCCL version 2.21.5+cuda12.4",
            f"{p}NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>",
            f"{p}NCCL INFO Using network IB",
            f"{p}NCCL INFO Channel 00/0 : {peer}[0] -> {rank}[0] [receive] via NET/IB/0/GDRDMA",
            f"{p}NCCL INFO Channel 00/0 : {rank}[0] -> {peer}[0] [send] via NET/IB/0/GDRDMA",
            f"{p}NCCL INFO comm 0x1 rank {rank} nranks 4 cudaDev 0 - Init COMPLETE"]


# -- the health collector ------------------------------------------------------------------------

CLEAN_GPU = "0, 0, No, No, No, Not Active, 40\n"  # decide/fabric/health.GPU_FIELDS' order
ROW_REMAP_FAILED = "0, 0, No, Yes, No, Not Active, 40\n"


def xid_line(pci: str, xid: int, about: str = "") -> str:
    return f"[ 12.5] NVRM: Xid (PCI:{pci}): {xid}, pid=123, name=python{about}"


# -- the liar ------------------------------------------------------------------------------------

def _json(msg: Mapping[str, Any]) -> bytes:
    return json.dumps(msg).encode()


@dataclass
class Liar:
    """What one node sends (``label``; ``ranks``: those the plan gave it). Every method
    returns the bytes the node's program would send; nothing checks its word here."""

    label: str
    ranks: tuple[int, ...]

    # the supervisor's control messages (job/events.py decodes them)
    def stacks(self, ranks: Mapping[int | str, Mapping[str, Any]], id: str = "h1") -> bytes:
        """A stacks answer: ``ranks`` rank -> entry (``rank_entry``), owned or not."""
        return _json({"type": "stacks", "id": id, "ranks": {str(r): dict(e)
                                                           for r, e in ranks.items()}})

    def rank_start(self, rank: int, t: float | None = None) -> bytes:
        return _json({"type": "rank_start", "rank": rank, **({"t": t} if t else {})})

    def rank_exit(self, rank: int, code: int = 1, *, signal: int | None = None,
                  evidence: Mapping[str, Any] | None = None, t: float | None = None,
                  stop_signal: int | None = None) -> bytes:
        msg: dict[str, Any] = {"type": "rank_exit", "rank": rank, "code": code}
        for key, value in (("signal", signal), ("evidence", evidence), ("t", t),
                           ("stop_signal", stop_signal)):
            if value is not None:
                msg[key] = dict(value) if isinstance(value, Mapping) else value
        return _json(msg)

    def exit(self, code: int = 0, ranks: Mapping[int | str, Mapping[str, Any]] | None = None
             ) -> bytes:
        return _json({"type": "exit", "code": code,
                      "ranks": {str(r): dict(v) for r, v in (ranks or {}).items()}})

    def nccl(self, rank: int, lines: Iterable[str]) -> bytes:
        return _json({"type": "nccl", "rank": rank, "lines": list(lines)})

    def flight(self, files: Mapping[int | str, str]) -> bytes:
        return _json({"type": "flight", "files": {str(r): v for r, v in files.items()}})

    # the sampler (job/sampling.py reads its lines)
    def sample(self, t: float, cpu: Mapping[int | str, object], **more: Any) -> bytes:
        """A sample: per rank its CPU seconds so far (the straggler evidence)."""
        return _json({"type": "sample", "t": t,
                      "ranks": {str(r): {"cpu": c} for r, c in cpu.items()}, **more})

    # the smoke job's report lines (decide/fabric/smoke.py takes them from the rank's output)
    @staticmethod
    def smoke(kind: str, **fields: Any) -> str:
        """One ``DTRAIN-SMOKE`` line of a rank (``rank``, ``pairs``, ``pair_failed``, ...)."""
        return "DTRAIN-SMOKE " + json.dumps({"kind": kind, **fields})

    # the health collector (commands/health.py reads its one line)
    def health(self, *, gpu_csv: str = CLEAN_GPU, xid_lines: Sequence[str] = (),
               ports: Mapping[str, Any] | None = None, **more: Any) -> bytes:
        return _json({"gpu_csv": gpu_csv, "xid_lines": list(xid_lines), "kernel_log": True,
                      "ports": dict(ports or {}), "shm_bytes": 8 << 30, **more}) + b"\n"

    # text and volume
    @staticmethod
    def escapes(text: str = "") -> str:
        return f"{text}{OSC52}{MOVE}"

    @staticmethod
    def flood(n: int = 10_000, line: bytes = b"x" * 100) -> list[bytes]:
        """``n`` lines (a node that floods)."""
        return [line] * n

    @staticmethod
    def silent() -> list[bytes]:
        """A node that says nothing at all."""
        return []

    @staticmethod
    def stream(frames: Iterable[tuple[int, int, bytes]]) -> bytes:
        """The supervisor's framed stream (job/node.py): (kind, rank, data) frames after
        the marker; ``control``/``output`` make them."""
        return wire.MAGIC + b"".join(wire.FRAME.pack(k, r, len(d)) + d for k, r, d in frames)

    @staticmethod
    def control(data: bytes) -> tuple[int, int, bytes]:
        return (wire.KIND_CTL, -1, data)

    @staticmethod
    def output(rank: int, data: bytes, err: bool = False) -> tuple[int, int, bytes]:
        return (wire.KIND_ERR if err else wire.KIND_OUT, rank, data)


@dataclass
class Cluster:
    """The plan (host -> its ranks) and its nodes; ``liar_label`` lies."""

    plan: dict[str, list[int]] = field(default_factory=lambda: {"nodeA": [0, 1],
                                                                "nodeB": [2, 3]})
    liar_label: str = "nodeB"

    @property
    def liar(self) -> Liar:
        return Liar(self.liar_label, tuple(self.plan[self.liar_label]))

    @property
    def honest(self) -> Liar:
        """The first other node (the same builders: it says what is true)."""
        label = next(h for h in self.plan if h != self.liar_label)
        return Liar(label, tuple(self.plan[label]))

    def node(self, label: str) -> Liar:
        return Liar(label, tuple(self.plan[label]))

    @property
    def hosts(self) -> list[str]:
        return list(self.plan)

    def owners(self, planned: bool = True) -> dict[str, Any]:
        return nodemsg.rank_owners(self.plan, planned=planned)

    def decode(self, host: str, data: bytes, owners: Mapping[str, Any] | None = None
               ) -> events.Event | None:
        """What the launcher believes of ``host``'s message (job/events.py ``decode``)."""
        return events.decode(data, (owners or self.owners())[host])

    def sample(self, host: str, line: bytes) -> events.SamplerHello | events.Sample | None:
        return events.decode_sample(line, self.owners()[host])


class Answer(Process):
    """A node's program that answers with given bytes whatever it was sent (the fake
    transport's ``handler`` returns it: ``Cluster.transport``)."""

    def __init__(self, data: bytes, code: int = 0) -> None:
        self.data, self.code = data, code

    async def write(self, data: bytes) -> None:
        return None

    def write_eof(self) -> None:
        return None

    async def read_stdout(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out

    async def read_stderr(self, n: int) -> bytes:
        return b""

    async def wait(self) -> int | None:
        return self.code

    def abort(self) -> None:
        self.data = b""


def transport(answers: Mapping[str, bytes]) -> Any:
    """transports/fake.py's FakeTransport whose nodes answer every command with
    ``answers[label]`` (a node not named runs the command, as the fake does)."""
    from launcher.transports.fake import FakeTransport

    async def answer(host: Host, command: str) -> Process | None:
        data = answers.get(host.label)
        return None if data is None else Answer(data)

    return FakeTransport(handler=answer)


def python_wrapper(directory: Path, python: str, lies: Mapping[str, Any]) -> Path:
    """The same liar on a real node (the test cluster): an interpreter for a hostfile's
    ``python=`` that runs the node's real programs and pipes their supervisor stream through
    tests/cluster/hostile_frames.py, which rewrites the control messages as ``lies`` says
    (its doc: ``stacks``, ``rank_start``, ``flight``, ``bad_key``). ``directory``: one the
    nodes can read (the cluster's shared directory); the wrapper's path is returned."""
    import os

    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(dict(lies)))
    (directory / "filter.py").write_text(
        (Path(__file__).parent / "cluster" / "hostile_frames.py").read_text())
    wrapper = directory / "python3"
    wrapper.write_text(f'#!/bin/sh\n{python} "$@" | {python} '
                       f'{directory / "filter.py"} {directory / "config.json"}\n')
    for path in (directory / "config.json", directory / "filter.py"):
        os.chmod(path, 0o644)
    os.chmod(wrapper, 0o755)
    os.chmod(directory, 0o755)
    return wrapper


@pytest.fixture
def hostile() -> Cluster:
    """Two nodes, nodeA (ranks 0-1) honest and nodeB (ranks 2-3) lying."""
    return Cluster()
