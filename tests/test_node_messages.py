"""The event seam (issue 54 items 1 and 3): every message a node program can send is one the
launcher decodes, its type written once, and nothing above the decoder reads node data as
a dict.

* The node programs' sends are found in their source (``control(...)`` of the supervisor's
  bundle, ``emit(...)`` of the sampler's): each send's message type must be a name of
  ``launcher/nodeside/nodemessages.py`` (not a literal), and a sample of each runs through
  the launcher's decoder (``job/events.decode``, ``decode_sample``) into its typed event;
  a type the decoder does not know fails here.
* ``launcher/decide`` and ``launcher/commands`` call no ``.get("<field>")`` with a field of
  a node's control messages, save the modules named in ``GET_OK`` with their reason: the
  node's data is read once, typed, in job/events.py.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.decide.outcome.outcomes import RankEnd
from launcher.decide.outcome.stacks import StackAnswer
from launcher.job import events
from launcher.nodeside import nodemessages, wire

ROOT = Path(__file__).resolve().parent.parent
NODESIDE = ROOT / "launcher" / "nodeside"
SENDERS = {"supervisor": "control", "sampler": "emit"}  # a node program -> its send method


def _type_of(d: ast.Dict) -> ast.expr | None:
    for key, value in zip(d.keys, d.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == "type":
            return value
    return None


def _message_dicts(arg: ast.expr, func: ast.AST) -> list[ast.Dict]:
    """The dict literals a send's argument is built from: the literal itself, ``dict({...},
    **extra)``, or a name: every dict with a ``type`` key in the sending function
    (``msg = {...}``, ``msg.update({...})``)."""
    if isinstance(arg, ast.Dict):
        return [arg]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "dict" \
            and arg.args and isinstance(arg.args[0], ast.Dict):
        return [arg.args[0]]
    if isinstance(arg, ast.Name):
        return [d for d in ast.walk(func) if isinstance(d, ast.Dict) and _type_of(d) is not None]
    return []


def sends(source: str, method: str) -> Iterator[tuple[int, ast.expr | None]]:
    """(line, the type's expression) of every ``<x>.<method>(msg)`` call in ``source``; a
    send whose type cannot be found yields None."""
    tree = ast.parse(source)
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for call in ast.walk(func):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                    and call.func.attr == method and len(call.args) == 1:
                found = [_type_of(d) for d in _message_dicts(call.args[0], func)]
                for expr in found or [None]:
                    yield call.lineno, expr


def type_name(expr: ast.expr | None) -> str | None:
    """The type a send names: a ``MSG_*`` name of nodemessages.py, else None (a literal, an
    expression, nothing found)."""
    if isinstance(expr, ast.Name) and expr.id.startswith("MSG_"):
        value = getattr(nodemessages, expr.id, None)
        return value if isinstance(value, str) else None
    return None


def node_sends() -> dict[str, list[tuple[str, int, str | None]]]:
    """program -> (module, line, type) of every message it can send."""
    out: dict[str, list[tuple[str, int, str | None]]] = {}
    for program, method in SENDERS.items():
        for mod in wire.program_modules(program):
            source = (NODESIDE / f"{mod}.py").read_text()
            for line, expr in sends(source, method):
                out.setdefault(program, []).append((mod, line, type_name(expr)))
    return out


STACK_ENTRY = {"pid": 41, "text": "Current thread 0x1 (most recent call first):\n",
               "sources": {"a.py:3": "x()"}, "fr": {"ok": True, "data": "QUJD"}}
# one message of each type, as the node programs send it (their keys; tests the decoder's
# reading of each)
SAMPLES: dict[str, tuple[dict[str, object], object]] = {
    nodemessages.MSG_HELLO: ({"type": "hello", "v": 1, "pid": 11, "pgid": 11,
                              "supervisor_pid": 10, "hostname": "n1", "t": 100.0},
                             events.Hello(100.0, pid=11, supervisor_pid=10, hostname="n1")),
    nodemessages.MSG_RANK_START: ({"type": "rank_start", "rank": 1, "t": 101.0,
                                   "agent_t": 100.5},
                                  events.RankStart(101.0, rank=1, agent=100.5)),
    nodemessages.MSG_RANK_RAISED: ({"type": "rank_raised", "rank": 1, "exc": "ValueError",
                                    "t": 102.0},
                                   events.RankRaised(102.0, rank=1, exc="ValueError")),
    nodemessages.MSG_RANK_EXIT: ({"type": "rank_exit", "rank": 1, "code": 1, "signal": None,
                                  "t": 103.0, "duration": 2.0, "pid": 41, "stop_signal": 15,
                                  "script_t": 101.5, "shim": {"pid": 41, "status": "known"},
                                  "evidence": {"kernel": []}},
                                 events.RankExit(103.0, RankEnd(
                                     1, code=1, stop_signal=15, duration=2.0, t=103.0, pid=41,
                                     script=101.5, evidence={"kernel": []}))),
    nodemessages.MSG_STACKS: ({"type": "stacks", "id": "h1", "ranks": {"1": STACK_ENTRY},
                               "host": "n1", "t": 104.0, "took": 0.1, "pyspy": True},
                              events.Stacks(104.0, id="h1", pyspy=True, ranks={1: StackAnswer(
                                  text=str(STACK_ENTRY["text"]), sources={"a.py:3": "x()"},
                                  pid=41, fr_data="QUJD")})),
    nodemessages.MSG_FLIGHT: ({"type": "flight", "files": {"1": "QUJD"}, "host": "n1",
                               "t": 105.0}, events.Flight(105.0, files={1: "QUJD"})),
    nodemessages.MSG_NCCL: ({"type": "nccl", "rank": 1, "lines": ["NCCL INFO x"], "t": 106.0},
                            events.Nccl(106.0, rank=1, lines=("NCCL INFO x",))),
    nodemessages.MSG_STOPPING: ({"type": "stopping", "reason": "stop", "t": 107.0},
                                events.Stopping(107.0, reason="stop")),
    nodemessages.MSG_HB: ({"type": "hb", "t": 108.0}, events.Heartbeat(108.0)),
    nodemessages.MSG_EXIT: ({"type": "exit", "code": 1, "signal": None, "t": 109.0,
                             "stopped": None, "ranks": {"1": {"type": "rank_exit", "rank": 1,
                                                              "code": 1, "t": 103.0}},
                             "container": {"name": "c", "left": [], "remaining": []}},
                            events.Exit(109.0, code=1, ranks={1: RankEnd(1, code=1, t=103.0)},
                                        container={"name": "c", "left": [],
                                                   "remaining": []})),
}
SAMPLER_SAMPLES: dict[str, tuple[dict[str, object], type]] = {
    nodemessages.MSG_HELLO: ({"type": "hello", "v": 1, "pid": 5, "t": 1.0}, events.SamplerHello),
    nodemessages.MSG_SAMPLE: ({"type": "sample", "t": 2.0, "dt": 1.0,
                               "ranks": {"1": {"cpu": 1.5}}}, events.Sample),
}


def test_the_scan_finds_each_send_and_its_type() -> None:
    source = ('def a(self):\n    self.out.control({"type": MSG_HB, "t": 1})\n'
              'def b(self, extra):\n    self.out.control(dict({"type": MSG_EXIT}, **extra))\n'
              'def c(self, line):\n    msg = from_json(line)\n'
              '    msg.update({"type": MSG_RANK_EXIT, "rank": 1})\n    self.out.control(msg)\n'
              'def d(self):\n    self.out.control({"type": "news"})\n'
              'def e(self, m):\n    self.out.control(m)\n')
    got = [(line, type_name(expr)) for line, expr in sends(source, "control")]
    assert got == [(2, "hb"), (4, "exit"), (8, "rank_exit"), (10, None), (12, None)]


def test_every_message_a_node_program_sends_is_named_once_and_decoded() -> None:
    found = node_sends()
    unnamed = [f"{mod}.py:{line}" for sent in found.values() for mod, line, kind in sent
               if kind is None]
    assert unnamed == [], "a send whose type is not a MSG_* name of nodemessages.py"
    control = {kind for _, _, kind in found["supervisor"]}
    # every type the supervisor sends has its decoder, and every decoder a sender
    assert control == set(events.DECODERS) == set(nodemessages.CONTROL_MESSAGES)
    assert {kind for _, _, kind in found["sampler"]} == set(nodemessages.SAMPLER_MESSAGES)
    assert set(SAMPLES) == control and set(SAMPLER_SAMPLES) == set(nodemessages.SAMPLER_MESSAGES)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_a_sample_of_each_control_message_is_its_event(kind: str) -> None:
    msg, expected = SAMPLES[kind]
    got = events.decode(json.dumps(msg).encode(), {1})
    assert got == expected
    assert not isinstance(got, events.Other)


@pytest.mark.parametrize("kind", sorted(SAMPLER_SAMPLES))
def test_a_sample_of_each_sampler_line_is_its_event(kind: str) -> None:
    msg, cls = SAMPLER_SAMPLES[kind]
    assert isinstance(events.decode_sample(json.dumps(msg).encode(), {1}), cls)


def test_a_type_the_decoder_does_not_know_is_other() -> None:
    assert isinstance(events.decode(b'{"type": "news", "t": 1.0}', None), events.Other)


# -- no .get("<field>") on node data above the decoder -----------------------------------------

# the fields of a node's control messages and of what they carry (a rank's end, a stack
# answer, a hang's culprit): read as a dict only in job/events.py
NODE_FIELDS = frozenset({
    "code", "signal", "stop_signal", "duration", "script_t", "agent_t", "evidence", "rank",
    "ranks", "files", "native", "pyspy", "supervisor_pid", "stopped", "shim", "exc", "took",
    "text", "sources", "fr", "culprit", "stalled_s", "pgid"})
SCANNED = ("launcher/decide", "launcher/commands")
GET_OK = {  # module -> why its .get(...) of such a field reads something other than a node's
    #          control message (each entry must still have one: a fixed site's entry goes)
    "launcher/decide/runplan/facts.py":
        "the probe's JSON, decoded here into NodeFacts (its decoder)",
    "launcher/decide/fabric/health.py": "the health gate's readings (dcgmi's JSON), decoded here",
    "launcher/decide/fabric/smoke.py": "the smoke job's result lines, decoded here (its decoder)",
    "launcher/decide/outcome/goodput.py": "the archive's records (output.jsonl, meta.json)",
    "launcher/commands/stacks.py": "the control socket's reply of this machine's launcher",
    "launcher/commands/top/model.py": "a sampler's sample, kept whole (events.Sample.data)",
    "launcher/commands/top/view.py": "a sampler's sample, kept whole (events.Sample.data)",
    "launcher/commands/top/runwatch.py": "a run archive's samples.jsonl and output records",
}


def node_field_gets(root: Path = ROOT) -> dict[str, list[str]]:
    """module -> ``line: call`` of each ``.get("<node field>")`` under SCANNED."""
    out: dict[str, list[str]] = {}
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "get" and node.args \
                        and isinstance(node.args[0], ast.Constant) \
                        and node.args[0].value in NODE_FIELDS:
                    rel = str(path.relative_to(root))
                    out.setdefault(rel, []).append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_get_of_a_node_field_above_the_decoder() -> None:
    found = node_field_gets()
    assert {m: calls for m, calls in found.items() if m not in GET_OK} == {}
    assert sorted(set(GET_OK) - set(found)) == [], "an allowed module no longer needs it"
