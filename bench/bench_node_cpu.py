"""Node-side CPU of one ``dtrain exec -- true``: what every node pays per command.

    python bench/bench_node_cpu.py [--runs 50] [--ref main] [--python python3]

Runs the remote command exactly as dtrain sends it (``wire.remote_command`` under
``bash -c``, fed the real payload: the supervisor's source and the spec of ``exec -- true``)
and reads the CPU (user + system) of that whole process tree from the children's rusage:
bash, the bootstrap, the supervisor and the job (``$SHELL -c true``). stdin stays open until
the supervisor exits, as the launcher's channel does. The compiled-code cache on the node
(~/.cache/dtrain) is warmed first. Variants, interleaved run by run (a disturbance from
another session on this shared box hits them alike):

* ``new``: this working tree's wire.py and the supervisor's modules (one bundle);
* ``old``: the same files at ``--ref`` (default ``main``), run the same way;
* floors: ``bash -c true`` (pdsh's node side) and ``python -I -S -c pass`` (the interpreter).

Reports the median and the minimum of each (ms). On the test cluster, run it inside a node
as its user: ``python -m tests.cluster exec 1 -- <python> bench/bench_node_cpu.py``.
No cluster or ssh is needed otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import marshal
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from launcher.commands.exec import exec_spec  # noqa: E402
from launcher.nodeside import wire  # noqa: E402


def git_show(ref: str, path: str) -> bytes:
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(REPO), "show",
                           f"{ref}:{path}"], check=True, capture_output=True).stdout


def old_variant(ref: str, python: str, spec: dict[str, object]) -> tuple[str, bytes]:
    """The remote command and payload as the code at ``ref`` builds them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "wire_old.py")
        path.write_bytes(git_show(ref, "launcher/nodeside/wire.py"))
        loaded = importlib.util.spec_from_file_location("wire_old", path)
        assert loaded is not None and loaded.loader is not None
        module = importlib.util.module_from_spec(loaded)
        sys.modules["wire_old"] = module  # dataclasses look their module up there
        loaded.loader.exec_module(module)
    cmd = module.remote_command(python, stdlib_only=True)
    # since issue 35 the supervisor is several modules shipped as one bundle
    mods = getattr(module, "PROGRAMS", {}).get("supervisor", ("supervisor",))
    source = b"\n".join(
        (module.strip_sibling_imports(part) if len(mods) > 1 else part)
        for part in (git_show(ref, f"launcher/nodeside/{m}.py") for m in mods))
    if hasattr(module, "supervisor_payload"):  # the spec as marshal data, as new_variant sends
        body = module.SPEC_MARSHAL + marshal.dumps(dict(spec), module.MARSHAL_VERSION)
        payload = (f"{len(source)} {len(body)} {module.source_key(source)}\n".encode()
                   + source + body)
    else:
        payload = module.payload(source, spec)
    assert isinstance(cmd, str) and isinstance(payload, bytes)
    return cmd, payload


def new_variant(python: str, spec: dict[str, object]) -> tuple[str, bytes]:
    source = wire.program_source("supervisor")
    make = getattr(wire, "supervisor_payload", None)
    payload = make(spec) if make is not None else wire.payload(source, spec)
    return wire.remote_command(python, stdlib_only=True), payload


def one_run(cmd: str, payload: bytes | None) -> float:
    """CPU ms of ``bash -c cmd`` and everything it started, fed payload (stdin kept open)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(["bash", "-c", cmd], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    if payload is not None:
        proc.stdin.write(payload)
        proc.stdin.flush()
    out = proc.stdout.read()
    err = proc.stderr.read()
    rc = proc.wait()
    proc.stdin.close()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0 or (payload is not None and b'"type":"exit"' not in out):
        raise SystemExit(f"bench: {cmd[-60:]!r} failed (rc {rc}): {err.decode()[-400:]}")
    return 1000 * (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--ref", default="main", help="git revision of the 'old' variant "
                        "('' to skip it)")
    parser.add_argument("--python", default="python3", help="the node's interpreter")
    args = parser.parse_args()
    spec = exec_spec(["true"]).wire()
    variants: dict[str, tuple[str, bytes | None]] = {"new": new_variant(args.python, spec)}
    if args.ref:
        variants["old"] = old_variant(args.ref, args.python, spec)
    variants["bash -c true"] = ("true", None)
    variants["python -I -S -c pass"] = (f"exec {args.python} -I -S -c pass", None)
    for cmd, payload in variants.values():  # warm-up: page cache, the node's code cache
        one_run(cmd, payload)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(args.runs):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]  # rotated order
            times[name].append(one_run(*variants[name]))
    print(f"node CPU per `exec -- true` ({args.runs} runs each, interleaved; "
          f"load {os.getloadavg()[0]:.1f}, python {args.python})")
    print("| variant | median | min |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} ms | {min(values):.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
