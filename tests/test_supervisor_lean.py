"""The supervisor's exec path stays cheap: what it imports, and what replaced the imports.

Every node pays the supervisor's start-up at every `dtrain exec` (docs/scaling.md). The exec
path imports only modules built into the interpreter or tiny (os, sys, select, struct,
time, marshal, _thread, _signal, _json, _ctypes): subprocess, json, threading, selectors,
socket, signal (enum), ctypes and tempfile are for run mode, the rank shim, or a control
line. These tests pin that import set on the real node command line, and check that what
replaced the imports (fork+exec, a JSON writer, marshal specs, prctl via _ctypes) behaves
as the standard library did. No cluster needed.
"""

from __future__ import annotations

import glob
import json
import marshal
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from launcher.commands.exec import exec_spec
from launcher.nodeside import nodecommon, nodeprocs, wire
from tests.util import cannot_run, node_program

# never on the exec path: each costs milliseconds of CPU per node per command
HEAVY = {"re", "subprocess", "json", "threading", "selectors", "socket", "signal", "enum",
         "ctypes", "tempfile", "locale", "shutil", "collections", "functools", "warnings"}


def _exec_path(python: str, spec: dict[str, object], tmp_path: Path, *,
               payload: bytes | None = None, workdir: str | None = None,
               env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[bytes],
                                                           list[wire.Frame]]:
    """The remote command of `dtrain exec` (as NodeSession builds it) under /bin/sh."""
    cmd = wire.remote_command(python, workdir=workdir, stdlib_only=True)
    proc = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "HOME": str(tmp_path), **(env or {})})
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(payload if payload is not None else wire.supervisor_payload(spec))
    proc.stdin.flush()
    out = proc.stdout.read()  # stdin stays open until the supervisor is done
    err = proc.stderr.read()
    proc.stdin.close()
    proc.wait(timeout=30)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), \
        wire.FrameDecoder().feed(out)


def _messages(frames: list[wire.Frame]) -> list[dict[str, object]]:
    return [f.message() for f in frames if f.kind == wire.KIND_CTL]


def _importing_python(tmp_path: Path) -> str:
    """An interpreter that reports every module it imports (-X importtime) on stderr."""
    wrapper = tmp_path / "python-importtime"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -X importtime "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _imported(stderr: bytes) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.decode().splitlines()
            if line.startswith("import time:") and "imported package" not in line}


@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_exec_path_imports_nothing_heavy(tmp_path: Path, cache: str) -> None:
    python = _importing_python(tmp_path)
    if cache == "warm":  # the node's code cache filled by an earlier command
        _exec_path(python, exec_spec(["true"]).wire(), tmp_path)
    res, frames = _exec_path(python, exec_spec(["true"]).wire(), tmp_path)
    msgs = _messages(frames)
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    assert [m["type"] for m in msgs] == ["hello", "exit"] and msgs[-1]["code"] == 0
    imported = _imported(res.stderr)
    assert {"os", "select", "marshal"} <= imported | set(sys.builtin_module_names), imported
    heavy = {name for name in imported if name.split(".")[0] in HEAVY}
    assert not heavy, f"the exec path imports {sorted(heavy)}: see docs/scaling.md"


def test_a_json_spec_still_works_read_by_jsons_own_c_scanner(tmp_path: Path) -> None:
    """The probe's and older launchers' format: JSON spec, read by _json's scanner
    (nodecommon.from_json), so json (and re) stay out of this path too."""
    python = _importing_python(tmp_path)
    payload = wire.payload(wire.program_source("supervisor"), exec_spec(["echo hi"]).wire())
    res, frames = _exec_path(python, {}, tmp_path, payload=payload)
    assert res.returncode == 0
    assert b"".join(f.data for f in frames if f.kind == wire.KIND_OUT) == b"hi\n"
    imported = _imported(res.stderr)
    assert "_json" in imported
    assert not imported & {"json", "re"}, imported & {"json", "re"}


def test_the_working_directory_cannot_shadow_the_standard_library(tmp_path: Path) -> None:
    """-I: no '' on sys.path, no PYTHONPATH. A project with its own select.py is common."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("select", "struct", "marshal", "_json"):
        (work / f"{name}.py").write_text("raise SystemExit('shadowed stdlib module')\n")
    res, frames = _exec_path(sys.executable, exec_spec(["pwd"]).wire(), tmp_path,
                             workdir=str(work), env={"PYTHONPATH": str(work)})
    assert res.returncode == 0, res.stderr
    assert b"".join(f.data for f in frames if f.kind == wire.KIND_OUT) == f"{work}\n".encode()


# -- what replaced subprocess.Popen --------------------------------------------------------------

def test_the_job_gets_only_stdin_stdout_stderr_and_default_signals(tmp_path: Path) -> None:
    """close_fds and restore_signals as Popen did them: no fd our parent left open reaches
    the job (fd 3, the first one above stdio, and a high one), SIGPIPE/SIGXFSZ (ignored by
    Python) are default again, stdin is /dev/null, and the job leads its own session."""
    extra = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(extra, True)
    try:
        # the shell opens fd 3 (inheritable) and execs the bootstrap in place
        cmd = "exec 3</dev/null; " + wire.remote_command(sys.executable, stdlib_only=True)
        probe = ("ls /proc/self/fd; readlink /proc/self/fd/0; grep SigIgn /proc/self/status; "
                 "ps -o sid= -p $$; echo pid $$")
        proc = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, pass_fds=(extra,),
                                env={**os.environ, "HOME": str(tmp_path)})
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(wire.supervisor_payload(exec_spec([probe]).wire()))
        proc.stdin.flush()
        out = proc.stdout.read()
        proc.stdin.close()
        proc.wait(30)
    finally:
        os.close(extra)
    frames = wire.FrameDecoder().feed(out)
    lines = b"".join(f.data for f in frames if f.kind == wire.KIND_OUT).decode().split()
    fds = lines[:lines.index("/dev/null")]
    # exactly stdio, and 3: ls's own handle on /proc/self/fd (the lowest free fd; were 3
    # inherited, ls's would be 4)
    assert sorted(fds, key=int) == ["0", "1", "2", "3"], fds
    ignored = int(lines[lines.index("SigIgn:") + 1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)), hex(ignored)
    assert lines[-3] == lines[-1]  # session id == the job's pid


def test_spawn_reports_the_first_real_exec_error_like_popen(tmp_path: Path) -> None:
    """PATH from the job's env; a non-executable match is reported over later misses."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "tool").write_text("#!/bin/sh\necho never\n")  # not executable
    env = {"PATH": f"{tmp_path / 'missing'}:{first}:{second}"}
    for argv in (["tool"], [str(first / "tool")]):
        with pytest.raises(OSError) as popen:
            subprocess.Popen(argv, env=env)
        with pytest.raises(OSError) as ours:
            nodeprocs.spawn(argv, env)
        assert (ours.value.errno, ours.value.strerror) == \
            (popen.value.errno, popen.value.strerror)
    (second / "tool").write_text("#!/bin/sh\necho from b\n")
    (second / "tool").chmod(0o755)
    pid, out, err = nodeprocs.spawn(["tool"], env)
    try:
        assert os.waitpid(pid, 0)[1] == 0
        assert os.read(out, 100) == b"from b\n"
    finally:
        os.close(out)
        os.close(err)


def test_spawn_leaves_no_descriptor_behind() -> None:
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        nodeprocs.spawn(["/nonexistent/x"], dict(os.environ))
    pid, out, err = nodeprocs.spawn(["true"], dict(os.environ))
    os.waitpid(pid, 0)
    os.close(out)
    os.close(err)
    assert set(os.listdir("/proc/self/fd")) == before


def test_subreaper_through_ctypes_internals_adopts_orphans() -> None:
    """set_subreaper via _ctypes really sets it: a double-forked grandchild is ours."""
    code = (
        "import os, sys\n"
        "s = {'__name__': 'supervisor'}\n"
        f"exec(open({str(node_program())!r}).read(), s)\n"
        "assert s['_prctl']()(s['PR_SET_CHILD_SUBREAPER'], 1, 0, 0, 0) == 0\n"
        "assert 'ctypes' not in sys.modules\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        import time; time.sleep(0.3); os.write(w, b'%d' % os.getppid()); os._exit(0)\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "print(os.read(r, 20).decode() == str(os.getpid()))\n"
    )
    res = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, timeout=30)
    assert res.stdout.strip() == "True", res.stderr


# -- what replaced json ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    {"type": "hello", "v": 1, "pid": 12345, "pgid": 12345, "supervisor_pid": 1,
     "hostname": "node-1.example", "t": 1764500000.123456},
    {"type": "exit", "code": 137, "signal": 9, "t": 1.5, "stopped": None,
     "ranks": {"0": {"code": 0, "signal": None, "t": 2.0, "duration": 1e-05, "pid": 7}}},
    {"type": "stopping", "reason": "q\" \\ \n\t\x00\x1b[31m é 漢 \U0001f600 \udc80", "t": 0.0},
    {"a": [1, -2, 3.25, True, False, None, "x", [], {}], "b": (1, 2), "big": 2**80,
     "neg": -0.0, "tiny": 5e-324, "e": 1e300},
])
def test_to_json_writes_what_json_dumps_writes(value: object) -> None:
    text = nodecommon.to_json(value)
    assert text == json.dumps(value, separators=(",", ":"))
    assert json.loads(text) == json.loads(json.dumps(value))


@pytest.mark.parametrize("value", [
    {"x": float("nan")}, {"x": float("inf")}, {1: "int key"}, {"x": {"y": b"bytes"}},
])
def test_to_json_leaves_the_odd_cases_to_json(value: object) -> None:
    try:
        expected = json.dumps(value, separators=(",", ":"))
    except TypeError:
        with pytest.raises(TypeError):
            nodecommon.to_json(value)
        return
    assert nodecommon.to_json(value) == expected


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(_JSON_VALUES, st.sampled_from(["", " ", "\n", " \t\r\n "]))
def test_from_json_reads_what_json_loads_reads(value: object, space: str) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=1, ensure_ascii=False)):
        data = space + text + space
        assert nodecommon.from_json(data) == json.loads(data)
        assert nodecommon.from_json(data.encode()) == json.loads(data.encode())


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@example(b"\x00\x00\x00\x00\x00\x00\x00\x80")  # CI 47: UTF-32 by json's guess
@example(b"\x000")  # UTF-16 by json's guess, which json reads as 0
@example(b"0\x00")
@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode)
       | st.sampled_from([b"", b"{", b"[1,]", b'{"a":1} x', b"NaN", b"-Infinity", b"1e999",
                          b"[" * 5000 + b"]" * 5000, b'"\\ud800"', b"\xef\xbb\xbf{}"]))
def test_from_json_refuses_what_json_loads_refuses(data: bytes) -> None:
    if not json.detect_encoding(data).startswith("utf-8"):
        # json.loads guesses UTF-16/32 from NUL bytes; a control line is UTF-8, and
        # from_json reads it as UTF-8 only: as json reads that same text, or refused
        try:
            expected = json.loads(data.decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError):
            with pytest.raises(ValueError):
                nodecommon.from_json(data)
            return
        assert nodecommon.from_json(data) == expected
        return
    try:
        expected = json.loads(data)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(ValueError) as got_exc:
            nodecommon.from_json(data)
        if type(exc) is json.JSONDecodeError:  # the same words, where it was refused
            assert str(got_exc.value) == str(exc)
        return
    got = nodecommon.from_json(data)
    assert got == expected or (got != got and expected != expected)  # NaN is NaN


def test_the_spec_travels_as_marshal_and_json_stays_readable() -> None:
    spec = exec_spec(["true"]).wire()
    body = wire.supervisor_payload(spec).split(wire.program_source("supervisor"), 1)[1]
    assert body[:1] == wire.SPEC_MARSHAL == nodecommon.SPEC_MARSHAL
    assert nodecommon.load_spec(body) == spec == marshal.loads(body[1:])
    assert nodecommon.load_spec(json.dumps(spec).encode()) == spec


def test_python38_runs_the_exec_path(tmp_path: Path) -> None:
    """The oldest Python nodes may have, when this machine has one (pyenv's, or on PATH)."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    candidates += [p for p in [shutil.which("python3.8")] if p]
    found = next((p for p in candidates if subprocess.run(
        [p, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
        capture_output=True).returncode == 0), None)
    if not found:
        cannot_run("no python3.8 here (scripts/test installs one; tests/test_layers.py "
                   "checks the syntax with vermin)")
    start = time.monotonic()
    res, frames = _exec_path(found, exec_spec(["echo", "hi"]).wire(), tmp_path)
    assert res.returncode == 0, res.stderr.decode()
    assert b"".join(f.data for f in frames if f.kind == wire.KIND_OUT) == b"hi\n"
    assert [m["type"] for m in _messages(frames)] == ["hello", "exit"]
    assert time.monotonic() - start < 20
