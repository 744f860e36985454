"""The node protocol: bootstrap shipping, frames, and the supervisor run locally."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from launcher.errors import UsageError
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
    try:
        proc.stdin.close()  # flushes what the write left buffered: the shell may be gone
    except BrokenPipeError:
        pass
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


# -- hostile values (issue 11): a value is one word, never shell code ----------------------

def _hostile_names(tmp_path):
    """Directory names chosen by someone else on a shared filesystem, and the file each
    would create if it ever ran as shell code."""
    pwned = tmp_path / "pwned"
    return pwned, [f'x"; touch {pwned}; #', f"{tmp_path}/$(touch {pwned})",
                   f"y`touch {pwned}`", f"z'; touch {pwned}; '"]


def test_missing_hostile_workdir_is_named_literally_and_runs_nothing(tmp_path):
    pwned, names = _hostile_names(tmp_path)
    for name in names:
        workdir = name if name.startswith("/") else str(tmp_path / "missing" / name)
        proc, frames = _run_supervisor({"shell": f"touch {pwned}"}, workdir=workdir)
        assert proc.returncode == wire.WORKDIR_MISSING, (name, proc.stderr)
        assert not frames
        expected = f"dtrain: working directory {workdir} does not exist on this node\n"
        assert proc.stderr.decode() == expected
        assert not pwned.exists(), name


def test_existing_hostile_workdir_is_where_the_job_runs(tmp_path):
    pwned, names = _hostile_names(tmp_path)
    for name in names:
        workdir = name if name.startswith("/") else str(tmp_path / name)
        import os

        os.makedirs(workdir)
        proc, frames = _run_supervisor({"argv": ["pwd"]}, workdir=workdir)
        out = b"".join(f.data for f in frames if f.kind == wire.KIND_OUT).decode()
        assert proc.returncode == 0 and out == workdir + "\n", (name, proc.stderr)
        assert not pwned.exists(), name


def test_missing_hostile_python_is_named_literally_and_runs_nothing(tmp_path):
    pwned, names = _hostile_names(tmp_path)
    for name in names:
        proc, frames = _run_supervisor({"shell": "true"}, python=f"/no/{name}")
        assert proc.returncode == wire.PYTHON_MISSING, (name, proc.stderr)
        assert proc.stderr.decode() == (f"dtrain: /no/{name} not found on this node "
                                        "(set --python or the hostfile's python=)\n")
        assert not pwned.exists(), name


def test_tilde_is_the_remote_home_in_workdir_and_python(tmp_path, monkeypatch):
    import os
    import sys

    home = tmp_path / "home dir"
    (home / "w $x").mkdir(parents=True)
    (home / "bin").mkdir()
    os.symlink(sys.executable, home / "bin" / "py")
    monkeypatch.setenv("HOME", str(home))
    proc, frames = _run_supervisor({"argv": ["pwd"]}, workdir="~/w $x", python="~/bin/py")
    out = b"".join(f.data for f in frames if f.kind == wire.KIND_OUT).decode()
    assert proc.returncode == 0 and out == f"{home}/w $x\n", proc.stderr
    proc, _ = _run_supervisor({"shell": "true"}, workdir="~/nope")
    assert proc.stderr.decode() == f"dtrain: working directory {home}/nope does not exist on " \
        "this node\n"


@pytest.mark.parametrize("value", ["a\nb", "a\x00b", "a\x1b[2Jb", "a\rb", "a\x7fb"])
def test_control_characters_never_reach_a_command_line(value):
    for kwargs in ({"workdir": value}, {"python": value}):
        with pytest.raises(UsageError, match="control character"):
            wire.remote_command(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="^--workdir: .*control character"):
        wire.check_value(value, "--workdir")


@pytest.mark.parametrize("value", ["~root/py", "-c", "-", ""])
def test_odd_pythons_are_refused(value):
    with pytest.raises(UsageError, match="^--python: "):
        wire.check_value(value, "--python", python=True)


def test_one_argument_starting_with_dash_is_a_command_not_a_shell_option(monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/sh")
    proc, frames = _run_supervisor({"shell": "-x"})
    ctl = [json.loads(f.data) for f in frames if f.kind == wire.KIND_CTL]
    err = b"".join(f.data for f in frames if f.kind == wire.KIND_ERR)
    assert ctl[-1]["type"] == "exit" and ctl[-1]["code"] == 127, err
    assert b"-x" in err and b"not found" in err


# --------------------------------------------------------------------------- code cache


def _bootstrap(home, source: bytes, env_extra=None):
    """Run the real bootstrap line with HOME=home on a tiny program; return its stdout."""
    import os
    import sys

    env = {**os.environ, "HOME": str(home), **(env_extra or {})}
    return subprocess.run(["/bin/sh", "-c", wire.remote_command(sys.executable)],
                          input=wire.payload(source, {"x": 1}), capture_output=True,
                          env=env, timeout=60)


def _entry(home, source: bytes):
    import sys

    tag = sys.implementation.cache_tag
    return home / ".cache" / "dtrain" / f"{wire.source_key(source)}-{tag}.bin"


def test_bootstrap_caches_the_compiled_program_privately_and_uses_it(tmp_path):
    import marshal
    import os

    src = b"import sys\nprint('ran', DTRAIN_SPEC.decode())\n"
    first = _bootstrap(tmp_path, src)
    assert first.returncode == 0 and first.stdout == b'ran {"x":1}\n', first.stderr
    entry = _entry(tmp_path, src)
    assert entry.is_file()
    assert (entry.stat().st_mode & 0o777, entry.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert not [p for p in entry.parent.iterdir() if p.name.endswith(".tmp")]
    # the second start runs the cached code object: prove it by planting a different one
    entry.write_bytes(marshal.dumps(compile("print('from cache')", "c", "exec")))
    os.chmod(entry, 0o600)
    assert _bootstrap(tmp_path, src).stdout == b"from cache\n"


def test_bootstrap_ignores_a_cache_others_can_write_or_a_corrupt_one(tmp_path):
    import marshal
    import os

    src = b"print('compiled fresh')\n"
    _bootstrap(tmp_path, src)
    entry = _entry(tmp_path, src)
    entry.write_bytes(marshal.dumps(compile("print('planted')", "c", "exec")))
    os.chmod(entry.parent, 0o777)  # a directory anyone can write into is not trusted
    assert _bootstrap(tmp_path, src).stdout == b"compiled fresh\n"
    os.chmod(entry.parent, 0o700)
    os.chmod(entry, 0o666)  # nor is a file anyone can write
    assert _bootstrap(tmp_path, src).stdout == b"compiled fresh\n"
    os.chmod(entry, 0o600)
    entry.write_bytes(b"not marshal at all")
    assert _bootstrap(tmp_path, src).stdout == b"compiled fresh\n"


def test_bootstrap_works_with_a_read_only_home(tmp_path):
    import os

    os.chmod(tmp_path, 0o500)
    try:
        res = _bootstrap(tmp_path, b"print('still runs')\n")
    finally:
        os.chmod(tmp_path, 0o700)
    assert res.returncode == 0 and res.stdout == b"still runs\n"


# -- what a hostile node sends the launcher (issue 22, Low 6) ------------------------------

def test_a_frame_longer_than_the_cap_is_refused_at_its_header():
    """A 4 GiB frame length: refused as soon as the header is read, nothing buffered."""
    import pytest

    dec = wire.FrameDecoder()
    with pytest.raises(wire.FrameError, match="4294967295 bytes"):
        dec.feed(wire.MAGIC + wire.FRAME.pack(wire.KIND_OUT, 0, 0xFFFFFFFF) + b"x" * 1000)
    small = wire.FrameDecoder(max_frame=10)
    assert [f.data for f in small.feed(wire.MAGIC + wire.FRAME.pack(wire.KIND_OUT, 0, 10)
                                       + b"0123456789")] == [b"0123456789"]
    with pytest.raises(wire.FrameError):
        small.feed(wire.FRAME.pack(wire.KIND_OUT, 0, 11))


def test_a_control_message_that_is_not_a_json_object_is_refused():
    import pytest

    for data in (b"not json", b"[1, 2]", b'"text"', b"\xff\xfe"):
        with pytest.raises(wire.FrameError, match="not a JSON object"):
            wire.Frame(wire.KIND_CTL, -1, data).message()
    assert wire.Frame(wire.KIND_CTL, -1, b'{"type": "hb"}').message() == {"type": "hb"}


def test_an_endless_answer_line_is_the_node_s_error(monkeypatch):
    """A node program's answer without a newline, forever: refused at MAX_LINE, not kept."""
    import asyncio

    import pytest

    from launcher.errors import RemoteCommandError
    from launcher.job import remote

    class Endless:
        reads = 0

        async def read_stdout(self, n: int) -> bytes:
            self.reads += 1
            return b"{" + b"x" * (n - 1)

        async def read_stderr(self, n: int) -> bytes:
            return b""

    monkeypatch.setattr(remote, "MAX_LINE", 1 << 20)
    proc = Endless()
    with pytest.raises(RemoteCommandError, match="longer than 1 MiB: refused"):
        asyncio.run(remote.read_json_line(proc, "node3", "cp node program"))  # type: ignore[arg-type]
    assert proc.reads <= (1 << 20) // 65536 + 2


# -- why a node program never answered (issue 24.9) ------------------------------------------

def _shell(setup: str | None, tmp_path, workdir: str | None = None):
    import sys

    program = b"import os, sys\nsys.stdout.write(os.environ.get('DT_SETUP', '-') + '\\n')\n"
    return subprocess.run(["/bin/bash", "-c", wire.remote_command(sys.executable,
                                                                   workdir=workdir,
                                                                   setup=setup)],
                          input=wire.payload(program), capture_output=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


def test_a_failing_setup_stops_the_line_with_its_status_and_stderr(tmp_path):
    proc = _shell("source /nonexist/bin/activate", tmp_path)
    assert proc.returncode == wire.SETUP_FAILED and not proc.stdout
    failure = wire.start_failure(proc.returncode, proc.stderr.decode())
    assert failure.kind == "setup"
    assert failure.message.startswith("--setup failed (exit 1): ")
    assert "/nonexist/bin/activate: No such file or directory" in failure.message
    assert failure.hint == wire.SETUP_HINT


def test_a_setup_that_succeeds_still_shapes_the_programs_environment(tmp_path):
    proc = _shell("export DT_SETUP=yes; false || true", tmp_path)
    assert proc.returncode == 0 and proc.stdout == b"yes\n", proc.stderr


@pytest.mark.parametrize(("status", "stderr", "message", "kind"), [
    (wire.PYTHON_MISSING, "dtrain: /nope/python3 not found on this node (set --python or the "
                          "hostfile's python=)\n", "/nope/python3 not found", "python"),
    (wire.WORKDIR_MISSING, "dtrain: working directory /w does not exist on this node\n",
     "working directory /w does not exist", "workdir"),
    (wire.WORKDIR_DENIED, "dtrain: working directory /w: permission denied on this node\n",
     "working directory /w: permission denied", "workdir"),
    (wire.SETUP_FAILED, "module: command not found\n" + wire.SETUP_MARK + "127\n",
     "--setup failed (exit 127): module: command not found", "setup"),
    (1, "Traceback ...\nKeyError: x\n", "probe failed: KeyError: x (exit 1)", "start"),
    (None, "", "probe failed: no output", "start"),
])
def test_start_failure_reads_the_shell_lines_status(status, stderr, message, kind):
    failure = wire.start_failure(status, stderr)
    assert (failure.message, failure.kind) == (message, kind)


# ---------------------------------------------------------------- the pure parts, whole
# (issue #25: scripts/mutate wire's survivors)

def test_check_value_names_its_origin_and_says_what_to_give() -> None:
    assert wire.check_value("-dir", "workdir") == "-dir"  # a path may start with '-'
    with pytest.raises(UsageError) as err:
        wire.check_value("-c", "python", python=True)
    assert err.value.message == "python: '-c' starts with '-' (it would be read as an option)"
    assert err.value.hint == "give a plain path (absolute, or ~/ for the remote home)"
    with pytest.raises(UsageError) as err:
        wire.remote_command("py\nthon")
    assert err.value.message == "python: 'py\\nthon' contains the control character '\\n'"
    with pytest.raises(UsageError) as err:
        wire.remote_command("-c")
    assert err.value.message.startswith("python: '-c' starts with '-'")
    with pytest.raises(UsageError) as err:
        wire.remote_command(workdir="~bob/x")
    assert err.value.message == ("workdir: '~bob/x' uses ~name: only ~ and ~/ (the remote "
                                 "user's own home) are understood")


def test_shell_words_keep_the_remote_home_a_home() -> None:
    assert wire.shell_word("~") == '"$HOME"'
    assert wire.shell_word("~/") == '"$HOME"/'
    assert wire.shell_word("~/my proj") == "\"$HOME\"/'my proj'"
    assert wire.shell_word("~x") == "'~x'"
    assert wire.shell_word("/a b") == "'/a b'"


def test_the_interpreter_flags_per_program() -> None:
    def exec_line(**kw: object) -> str:
        cmd = wire.remote_command("/py", **kw)  # type: ignore[arg-type]
        return cmd[cmd.index("exec "):].split(" -c ")[0]
    assert exec_line() == "exec /py -u"
    assert exec_line(stdlib_only=True) == "exec /py -u -I -S"
    assert exec_line(no_site=True) == "exec /py -u -S"
    assert exec_line(stdlib_only=True, no_site=True) == "exec /py -u -I -S"
    assert "command -v python3 " in wire.remote_command()
    assert wire.remote_command().endswith("exec python3 -u -c " + shlex.quote(wire.BOOTSTRAP))


def test_a_workdir_the_user_may_not_enter_is_named_with_its_own_status(tmp_path) -> None:
    """cd fails on a directory that exists (a root shell enters any, so cd is made to fail):
    the denied message and status 96, nothing else runs."""
    cmd = wire.remote_command("/definitely/not/python", workdir=str(tmp_path / "a b"))
    (tmp_path / "a b").mkdir()
    res = subprocess.run(["bash", "-c", "cd() { return 1; }\n" + cmd], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == wire.WORKDIR_DENIED == 96
    assert res.stderr == (f"dtrain: working directory {tmp_path}/a b: permission denied on "
                          "this node\n")
    failure = wire.start_failure(res.returncode, res.stderr)
    assert failure == wire.StartFailure(
        f"working directory {tmp_path}/a b: permission denied",
        "create it there (readable by the remote user), or pass --workdir", "workdir")


@pytest.mark.parametrize(("status", "stderr", "failure"), [
    # the mark found wherever it is, the 3 lines before it said, joined by "; "
    (wire.SETUP_FAILED, "a\nb\nc\nd\ne\n" + wire.SETUP_MARK + "2\nafter\n",
     wire.StartFailure("--setup failed (exit 2): c; d; e", wire.SETUP_HINT, "setup")),
    (wire.SETUP_FAILED, wire.SETUP_MARK + "1\n",
     wire.StartFailure("--setup failed (exit 1)", wire.SETUP_HINT, "setup")),
    # a mark line with another status is not the setup's failure
    (1, "x\n" + wire.SETUP_MARK + "1\n",
     wire.StartFailure("probe failed: --setup failed with exit status 1 (exit 1)")),
    (wire.PYTHON_MISSING, "", wire.StartFailure("the interpreter was not found", None, "python")),
    (wire.PYTHON_MISSING, "dtrain: /p not found on this node (set --python or the "
     "hostfile's python=)   \n", wire.StartFailure("/p not found", None, "python")),
    (wire.WORKDIR_MISSING, "", wire.StartFailure(
        "the working directory is not usable",
        "create it there (readable by the remote user), or pass --workdir", "workdir")),
    (0, "  indented last line\n", wire.StartFailure("probe failed:   indented last line")),
])
def test_start_failures_whole(status, stderr, failure) -> None:
    assert wire.start_failure(status, stderr) == failure


def test_payload_header_source_and_spec() -> None:
    source = b"print(1)\n"
    key = wire.source_key(source)
    assert len(key) == 32
    assert wire.payload(source) == f"9 0 {key}\n".encode() + source
    assert wire.payload(source, {"a": [1, 2]}).endswith(b'print(1)\n{"a":[1,2]}')
    assert wire.payload(source, {"a": [1, 2]}).startswith(f"9 11 {key}\n".encode())


def test_the_supervisor_s_spec_travels_as_marshal_after_its_source() -> None:
    import marshal
    spec = {"argv": ["x"], "env": {"A": "1"}, "n": 3}
    data = wire.supervisor_payload(spec)
    header, _, rest = data.partition(b"\n")
    n, m, key = header.split()
    source = wire.program_source("supervisor")
    assert (int(n), key.decode()) == (len(source), wire.source_key(source))
    assert rest[:len(source)] == source
    body = rest[len(source):]
    assert len(body) == int(m) and body[:1] == wire.SPEC_MARSHAL
    assert marshal.loads(body[1:]) == spec


def test_control_lines_are_compact_json_with_the_op_first() -> None:
    assert wire.control("signal", sig=15, ranks=[0, 1]) == (
        b'{"op":"signal","sig":15,"ranks":[0,1]}\n')
    assert wire.control("stop") == b'{"op":"stop"}\n'


def test_noise_before_the_marker_goes_out_as_it_comes_bar_a_partial_marker() -> None:
    keep = len(wire.MAGIC) - 1
    dec = wire.FrameDecoder()
    assert dec.feed(b"n" * (keep + 5)) == [wire.Frame(wire.KIND_NOISE, -1, b"n" * 5)]
    assert dec.feed(b"") == []
    assert dec.pending == keep
    frame = wire.FRAME.pack(wire.KIND_OUT, 2, 3) + b"abc"
    assert dec.feed(wire.MAGIC + frame) == [wire.Frame(wire.KIND_NOISE, -1, b"n" * keep),
                                            wire.Frame(wire.KIND_OUT, 2, b"abc")]
    dec = wire.FrameDecoder()
    assert dec.feed(b"n" * keep) == [] and dec.pending == keep


def test_a_frame_holding_the_marker_is_data_not_a_new_start() -> None:
    inner = wire.FRAME.pack(wire.KIND_OUT, 0, len(wire.MAGIC)) + wire.MAGIC
    dec = wire.FrameDecoder()
    assert dec.feed(b"motd\n" + wire.MAGIC + inner) == [
        wire.Frame(wire.KIND_NOISE, -1, b"motd\n"), wire.Frame(wire.KIND_OUT, 0, wire.MAGIC)]


def test_a_second_frame_cut_short_waits_for_the_rest() -> None:
    one = wire.FRAME.pack(wire.KIND_OUT, 0, 2) + b"ab"
    two = wire.FRAME.pack(wire.KIND_ERR, 1, 6) + b"cdefgh"
    dec = wire.FrameDecoder()
    assert dec.feed(wire.MAGIC + one + two[:-3]) == [wire.Frame(wire.KIND_OUT, 0, b"ab")]
    assert dec.pending == len(two) - 3
    assert dec.feed(two[-3:]) == [wire.Frame(wire.KIND_ERR, 1, b"cdefgh")]
    assert dec.pending == 0


def test_a_control_message_that_is_not_an_object_says_so() -> None:
    for data in (b"not json", b"[1]", b'"x"'):
        with pytest.raises(wire.FrameError) as err:
            wire.Frame(wire.KIND_CTL, -1, data).message()
        assert str(err.value) == "a control message that is not a JSON object"
    assert wire.Frame(wire.KIND_CTL, -1, b'{"op":"x"}').message() == {"op": "x"}
