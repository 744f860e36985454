"""A node whose programs answer with what dtrain's never would (issue 22, Low 6 and Low 2),
run on localhost through the local transport: its "python" is a script of ours.

A supervisor stream with a 4 GiB frame length (then bytes forever) is that node's error at
once, with the launcher's memory bounded (it runs under RLIMIT_AS here: buffering the frame
would end in a MemoryError traceback).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from tests import hostile
from tests.util import REPO, assert_exit

HOSTILE_FRAMES = """#!/bin/sh
# the frame marker, a 4 GiB frame header, then bytes forever
exec {python} -c '
import struct, sys
out = sys.stdout.buffer
out.write(b"\\n\\x00DTRAIN-FRAMES-1\\x00\\n" + struct.pack("!BiI", 1, 0, 0xFFFFFFFF))
while True:
    out.write(b"x" * 65536)
    out.flush()
'
"""


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_4_gib_frame_is_the_node_s_error_not_the_login_node_s_memory(tmp_path: Path) -> None:
    py = tmp_path / "python3"
    py.write_text(HOSTILE_FRAMES.format(python=sys.executable))
    os.chmod(py, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    res = subprocess.run([sys.executable, "-m", "launcher", "exec", "-H", "localhost",
                          "--python", str(py), "--", "true"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, preexec_fn=_limited)
    assert_exit(res, 255)
    assert "localhost: the node's supervisor stream is not dtrain's: a frame of 4294967295 " \
        "bytes" in res.stderr


# -- every path that prints a node's or an archive's text (Low 2) ---------------------------

# the liar's escapes (tests/hostile.py): a clipboard write; clear, home, a fake line
OSC52, MOVE = hostile.OSC52, hostile.MOVE
_inert = hostile.inert  # no control sequence survives; what it sent is visible as ^[ text


def test_doctor_tables_plain_and_rich():
    import io

    from launcher.commands.doctor.report import render_plain, render_rich
    from launcher.decide.fabric.checks import FAIL, CheckResult

    rows = [CheckResult(f"node3{MOVE}", "gpu", FAIL, f"device {OSC52}{MOVE}")]
    for draw in (render_plain, lambda r, out: render_rich(r, "dtrain doctor", out)):
        out = io.StringIO()
        draw(rows, out)
        _inert(out.getvalue())


def test_dtrain_s_own_messages_quote_a_node_inertly():
    """render.note and render.error: relay refusals, cp errors, stop's and stacks' replies,
    a node's error message all go through them."""
    import io

    from launcher.errors import DtrainError
    from launcher.output import render

    out = io.StringIO()
    render.note(f"node3: cp relay refused a connection from {OSC52}{MOVE}", out)
    render.error(DtrainError(f"run x: {OSC52}{MOVE}", hint=OSC52, host=f"n{MOVE}"), out)
    _inert(out.getvalue())
    assert out.getvalue().count("\n") == 3  # a message keeps its own lines only


def test_smoke_table_and_verdict_line():
    import io

    from launcher.commands.smoke import SmokeRun, show
    from launcher.decide.fabric.smoke import SmokeResults, SmokeVerdict

    res = SmokeResults(sweep=[{"size": 1024, "count": 256, "iters": 5, "time_us": 1.0,
                               "algbw": 1.0, "busbw": 1.0}], backend=f"gloo{OSC52}")
    run = SmokeRun(0.0, ["n1"], results=res,
                   verdict=SmokeVerdict(1, (), (), None, 1.0, f"n1 has {OSC52}{MOVE}"))
    out = io.StringIO()
    show(run, out)
    _inert(out.getvalue())


def test_cp_per_node_view():
    import io

    from launcher.commands.cp.view import CopyView
    from launcher.models import CopyResult

    out, err = io.StringIO(), io.StringIO()
    view = CopyView(2, live=False, out=out, err=err)
    bad = CopyResult("node3")
    bad.errors.append(f"/x/{OSC52}{MOVE}: refused")
    view.node_done(bad)
    lost = CopyResult("node4")
    lost.unreachable = f"banner {OSC52}{MOVE}"
    view.node_done(lost)
    _inert(err.getvalue())
    _inert(out.getvalue())


def test_stacks_lines_from_nodes(capsys):
    from launcher.commands import stacks

    stacks._print(f"  File \"train.py\", line 3, in {OSC52}{MOVE}")
    _inert(capsys.readouterr().out)


def test_top_s_note_column():
    from launcher.commands.top.view import node_row

    row = node_row({"host": "node3", "state": "ok", "ranks": [0],
                    "sample": {"gpu_error": f"nvidia-smi: {OSC52}{MOVE}"}})
    _inert(row.cells["note"])


# -- a sampler line with no end (dtrain top, the run's samples) ------------------------------

HOSTILE_SAMPLER = r"""#!/bin/sh
# what dtrain's sampler would never send: one line that never ends
exec {python} -c '
import sys
out = sys.stdout.buffer
out.write(b"{{" + b"\x22type\x22: \x22sample\x22, \x22x\x22: \x22")
while True:
    out.write(b"x" * 65536)
    out.flush()
'
"""


def test_a_sampler_line_over_4_mib_is_that_node_s_error_and_the_view_goes_on(
        tmp_path: Path) -> None:
    py = tmp_path / "python3"
    py.write_text(HOSTILE_SAMPLER.format(python=sys.executable))
    os.chmod(py, 0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"localhost python={py}\n127.0.0.1 python={sys.executable}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    res = subprocess.run([sys.executable, "-m", "launcher", "top", "-f", str(hostfile),
                          "--once", "--json"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120, preexec_fn=_limited)
    assert_exit(res, 255)
    from tests.reports import validate_top

    doc = json.loads(res.stdout)
    validate_top(doc)
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert nodes["127.0.0.1"]["state"] == "ok" and nodes["127.0.0.1"]["sample"]
    bad = nodes["localhost"]
    assert bad["state"] == "lost" and bad["sample"] is None
    assert bad["error"].startswith("the sampler sent a line of more than 4 MiB"), bad


class _Chunks:
    """A sampler channel's stdout as given chunks (NodeSampler._read's only caller)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def read_stdout(self, n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    async def read_stderr(self, n: int) -> bytes:
        return b""


def _read(chunks: list[bytes], max_line: int) -> tuple[str | None, list[dict]]:
    import asyncio

    from launcher.job.sampling import NodeSampler, SamplerParams

    got: list[dict] = []
    conn = type("C", (), {"host": type("H", (), {"label": "n1"})()})()
    s = NodeSampler(conn, SamplerParams(), lambda host, msg: got.append(msg),  # type: ignore[arg-type]
                    max_line=max_line)
    s.hello = {"type": "hello"}
    s.proc = _Chunks(chunks)  # type: ignore[assignment]
    return asyncio.run(s._read()), got


def test_sample_lines_split_anywhere_and_the_cap_counts_one_line() -> None:
    line = json.dumps({"type": "sample", "t": 1, "pad": "y" * 40}).encode()
    assert len(line) < 100
    # split at every byte, several lines per chunk, a line exactly at the cap: all read
    data = (line + b"\n") * 3
    why, got = _read([data[i:i + 1] for i in range(len(data))], max_line=len(line))
    assert why == "the sampler's channel closed" and len(got) == 3
    why, got = _read([data], max_line=len(line))
    assert len(got) == 3
    # one byte over: that node's error, the lines before it were delivered
    why, got = _read([line + b"\n", line[:50], line[50:] + b"z\n"], max_line=len(line))
    assert len(got) == 1 and why is not None and "a line of more than" in why
