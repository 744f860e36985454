"""The node protocol: bootstrap shipping, frames, and the supervisor run locally."""

from __future__ import annotations

import json
import subprocess

from launcher.nodeside import wire
from tests.util import assert_exit


def _run_supervisor(spec: dict, *, workdir: str | None = None, python: str = "python3"):
    cmd = wire.remote_command(python, workdir=workdir)
    proc = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(wire.payload(wire.program_source("supervisor"), spec))
        proc.stdin.flush()
    except BrokenPipeError:
        pass  # the shell exited before reading (missing workdir or python)
    # stdin stays open until the supervisor is done, as the launcher's channel does:
    # its EOF would mean "the launcher is gone, tear the job down"
    out = proc.stdout.read()
    proc.stdin.close()
    err = proc.stderr.read()
    proc.wait(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), \
        wire.FrameDecoder().feed(out)


def test_frame_decoder_handles_split_chunks_and_shell_noise():
    frames_data = b"".join(wire.FRAME.pack(k, r, len(p)) + p
                           for k, r, p in [(1, -1, b"hello\n"), (3, -1, b'{"type":"hb"}'),
                                           (2, 5, b"x" * 70000)])
    # a chatty .bashrc printed a banner before the supervisor's marker
    data = b"Welcome to node3!\n" + wire.MAGIC + frames_data
    for step in (1, 7, 977, len(data)):
        dec = wire.FrameDecoder()
        frames = []
        for i in range(0, len(data), step):
            frames += dec.feed(data[i:i + step])
        noise = b"".join(f.data for f in frames if f.kind == wire.KIND_NOISE)
        assert noise == b"Welcome to node3!\n", step
        real = [(f.kind, f.rank, len(f.data)) for f in frames if f.kind != wire.KIND_NOISE]
        assert real == [(1, -1, 6), (3, -1, 13), (2, 5, 70000)], step
        assert dec.pending == 0


def test_the_two_ends_agree_on_the_marker():
    import ast

    tree = ast.parse(wire.program_source("supervisor"))
    values = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and any(getattr(t, "id", "") == "MAGIC" for t in node.targets)]
    assert [ast.literal_eval(v) for v in values] == [wire.MAGIC]


def test_supervisor_runs_a_shell_line_and_reports_exit():
    proc, frames = _run_supervisor({"shell": "echo out; echo err >&2; exit 3",
                                    "env": {"X": "a b"}})
    kinds = [(f.kind, f.data) for f in frames if f.kind != wire.KIND_CTL]
    assert (wire.KIND_OUT, b"out\n") in kinds and (wire.KIND_ERR, b"err\n") in kinds
    ctl = [json.loads(f.data) for f in frames if f.kind == wire.KIND_CTL]
    assert ctl[0]["type"] == "hello" and ctl[-1]["type"] == "exit" and ctl[-1]["code"] == 3
    assert_exit(proc, 3)


def test_supervisor_env_and_argv_arrive_verbatim():
    value = "q\" ' $HOME `id` ;\nnl é"
    _, frames = _run_supervisor({"argv": ["printenv", "TRICKY"], "env": {"TRICKY": value}})
    out = b"".join(f.data for f in frames if f.kind == wire.KIND_OUT)
    assert out.decode() == value + "\n"


def test_missing_workdir_and_python_are_named():
    proc, frames = _run_supervisor({"shell": "true"}, workdir="/no/such/dir")
    assert proc.returncode == wire.WORKDIR_MISSING and not frames
    assert b"/no/such/dir does not exist" in proc.stderr
    proc, frames = _run_supervisor({"shell": "true"}, python="/no/python3")
    assert proc.returncode == wire.PYTHON_MISSING
    assert b"/no/python3 not found" in proc.stderr


def test_remote_command_keeps_secrets_off_the_command_line():
    cmd = wire.remote_command("python3", workdir="/w d", setup="source x")
    assert "API_TOKEN" not in cmd and "cd -- '/w d'" in cmd and "source x" in cmd
