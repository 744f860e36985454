"""`dtrain image push IMAGE`: the image from this machine's runtime onto every node that lacks
it (or has another digest), saved once and sent over cp's broadcast chain (docs/containers.md).

1. every node's runtime and image id (the probe, job/containers.py); a node whose id already
   matches this machine's is skipped;
2. ``RUNTIME save`` once here into a private temporary directory;
3. which of those nodes share the directory the archive lands in (``~/.cache/dtrain/images``
   or ``--via``: an NFS home, a parallel filesystem): one exclusive marker file per directory
   (``decide/runplan/container.share_groups``), so that one copy serves every node that shares it;
4. ``dtrain cp`` of that archive to one node of each such group: one read, forwarded node to
   node along a chain (``decide/copies/broadcast.py``) from 3 nodes on;
5. ``RUNTIME load`` on every node that needs it, the id checked against this machine's, then
   the archive and the marker removed (after every node loaded it).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from launcher import defaults
from launcher.decide.runplan.container import ContainerRequest, share_groups, share_marker, short_id
from launcher.errors import DtrainError, PreflightFailed, UsageError
from launcher.hosts.hostfile import fold
from launcher.models import Host
from launcher.output import render
from launcher.text.words import count
from launcher.transports import AutoTransport
from launcher.transports.base import Process, Transport
from launcher.transports.ssh import SSHSettings

REMOTE_DIR = ".cache/dtrain/images"  # under the node's home (per node; shared homes work)
LOCAL_RUNTIMES = ("podman", "docker")  # those with save/load of a named image
NOT_THERE = 3  # the load's exit when the archive is not on the node (podman's own are 125+)
SHARE_TIMEOUT = 30.0  # each step of finding who shares the directory (a hung NFS mount)
REFUSED_HINT = ("--via a directory of your own, on a path that only root and you can change "
                "(or ask its owner to make it so)")


@dataclass(frozen=True)
class PushRequest:
    image: str
    runtime: str | None = None
    fanout: int = defaults.FANOUT
    python: str = "python3"
    transport: str = "auto"
    progress: bool | None = None
    via: str | None = None  # where the archive lands on the nodes (None: REMOTE_DIR)

    @property
    def remote_dir(self) -> str:
        """The archive's directory on a node, as a shell word's text: relative to the home
        (``~/x`` and the default) or absolute."""
        via = self.via or REMOTE_DIR
        if via == "~":
            return "."
        via = via[2:] if via.startswith("~/") else via
        return "./" + via if via.startswith("-") else via  # never an option of find or cp


@dataclass
class PushResult:
    skipped: list[str]
    loaded: list[str]
    failed: dict[str, str]
    load_s: float | None = None  # the loads, all nodes (None: nothing was loaded)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def local_runtime(req: PushRequest) -> tuple[str, str]:
    """(runtime, image id) here; exit 1 naming what is missing."""
    names = [req.runtime] if req.runtime else list(LOCAL_RUNTIMES)
    for name in names:
        if name not in LOCAL_RUNTIMES:
            raise UsageError(f"dtrain image push works with {' or '.join(LOCAL_RUNTIMES)} "
                             f"images, not {name}",
                             hint="copy an enroot/apptainer image file with dtrain cp")
        path = shutil.which(name)
        if path is None:
            continue
        done = subprocess.run([path, "image", "inspect", "--format", "{{.Id}}", req.image],
                              capture_output=True, text=True, timeout=120, check=False)
        ident = done.stdout.strip().splitlines()[0] if done.returncode == 0 and \
            done.stdout.strip() else ""
        if not ident:
            raise PreflightFailed(f"image {req.image} is not in this machine's {name}",
                                  hint=f"{name} pull {req.image} (or build it) first")
        return name, ident if ":" in ident else "sha256:" + ident
    raise PreflightFailed(f"no {' or '.join(names)} on this machine to save {req.image} from")


async def _shell(host: Host, transport: Transport, command: str
                 ) -> tuple[int | None, bytes, bytes]:
    """One command on one node: (exit code, None without one; stdout; stderr)."""
    async with await transport.connect(host) as conn:
        proc = await conn.start(command)
        return await _drain(proc)


async def _drain(proc: Process) -> tuple[int | None, bytes, bytes]:
    """Read a started command's stdout, then its stderr, to the end: (exit code, out, err)."""
    out = b""
    while chunk := await proc.read_stdout(65536):
        out += chunk
    err = b""
    while chunk := await proc.read_stderr(65536):
        err += chunk
    return await proc.wait(), out, err


async def _load(conn_host: Host, transport: Transport, runtime: str, path: str,
                image: str) -> str | None:
    """Load the archive on one node; its image id afterwards, or None with the error raised."""
    command = (f"test -f {shlex.quote(path)} || exit {NOT_THERE}; "
               f"{shlex.quote(runtime)} load -q -i {shlex.quote(path)} >/dev/null && "
               f"{shlex.quote(runtime)} image inspect --format '{{{{.Id}}}}' "
               f"{shlex.quote(image)}")
    code, out, err = await _shell(conn_host, transport, command)
    if code == NOT_THERE:
        raise DtrainError(f"the archive did not arrive in {path} (the copy's error is above); "
                          "--via DIR puts it elsewhere, e.g. node-local scratch")
    if code != 0:
        raise DtrainError(f"{runtime} load failed (exit {code}): "
                          f"{err.decode(errors='replace').strip()[-300:]}")
    ident = out.decode(errors="replace").strip().splitlines()
    return ident[-1] if ident else None


async def _remove(host: Host, transport: Transport, *paths: str) -> None:
    try:
        await _shell(host, transport, "rm -f -- " + " ".join(map(shlex.quote, paths)))
    except (DtrainError, OSError):
        pass


async def _prepare(host: Host, transport: Transport, python: str, spec: dict[str, object]
                   ) -> tuple[int | None, bytes, bytes]:
    """The marker step on one node: nodeside/pushdir.py with ``spec``; (exit code, its JSON
    line, stderr)."""
    from launcher.nodeside import wire

    async with await transport.connect(host) as conn:
        proc = await conn.start(wire.remote_command(host.python or python, stdlib_only=True))
        await proc.write(wire.payload(wire.program_source("pushdir"), spec))
        proc.write_eof()
        return await _drain(proc)


def _unsafe_why(out: str) -> str | None:
    """The node program's refusal in its JSON line, or None."""
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    why = answer.get("unsafe") if isinstance(answer, dict) else None
    return str(why) if why else None


async def _sharing(need: Sequence[Host], transport: Transport, directory: str, marker: str,
                   fanout: int, python: str = "python3"
                   ) -> tuple[list[list[Host]], dict[str, str]]:
    """(the nodes of ``need`` grouped by the archive directory they share, one group per
    node where none is shared; why the directory is refused, by node label).

    Every node makes the directory if needed (0700) and checks it and every directory above
    it (nodeside/pushdir.py): a node loads whatever archive lies there under the image's
    name, so another user must neither be able to put one there nor to swap that directory
    or one above it for one of theirs. Then it creates ``marker`` there exclusively with its
    index in it (O_EXCL) and, once all have tried, reads it back."""
    path = f"{shlex.quote(directory)}/{shlex.quote(marker)}"
    sem = asyncio.Semaphore(fanout)

    async def on_all(hosts: Sequence[Host],
                     run: Callable[[int, Host], Awaitable[tuple[int | None, bytes, bytes]]]
                     ) -> dict[str, str | None]:
        answers: dict[str, str | None] = {}

        async def one(i: int, h: Host) -> None:
            async with sem:
                try:
                    code, out, _ = await asyncio.wait_for(run(i, h), SHARE_TIMEOUT)
                except (DtrainError, OSError, TimeoutError):
                    code, out = 1, b""  # a node that cannot say: a copy of its own
            answers[h.label] = out.decode(errors="replace") if code == 0 else None

        async with asyncio.TaskGroup() as tg:
            for i, h in enumerate(hosts):
                tg.create_task(one(i, h))
        return answers

    made = await on_all(need, lambda i, h: _prepare(
        h, transport, python, {"dir": directory, "marker": marker, "index": i}))
    unsafe = {h.label: why for h in need if (why := _unsafe_why(made.get(h.label) or ""))}
    safe = [h for h in need if h.label not in unsafe]
    if len(safe) < 2:
        return [[h] for h in safe], unsafe
    # through sh: the login shell may be csh
    answers = await on_all(safe, lambda i, h: _shell(
        h, transport, "sh -c " + shlex.quote(f"cat -- {path}")))
    by_label = {h.label: h for h in safe}
    return [[by_label[label] for label in group]
            for group in share_groups([h.label for h in safe], answers)], unsafe


async def push_async(hosts: Sequence[Host], req: PushRequest, settings: SSHSettings
                     ) -> PushResult:
    from launcher.commands.cp import CopyRequest
    from launcher.commands.cp.command import cp_async
    from launcher.job.containers import probe_containers

    runtime, want = local_runtime(req)
    ctr = ContainerRequest(req.image, runtime=req.runtime)
    async with AutoTransport(settings, req.transport, say=render.note) as transport:
        facts, _, errors = await probe_containers(
            transport, hosts, {h.label: ctr for h in hosts}, fanout=req.fanout,
            connect_timeout=settings.connect_timeout, python=req.python)
        result = PushResult([], [], {label: f"not reached: {why}"
                                     for label, why in errors.items()})
        need: list[Host] = []
        for h in hosts:
            f = facts.get(h.label)
            if h.label in errors:
                continue
            if f is None or f.runtime is None:
                result.failed[h.label] = (f.error if f and f.error else "no container runtime")
            elif f.runtime not in LOCAL_RUNTIMES:
                result.failed[h.label] = f"its runtime is {f.runtime}: copy the image file " \
                                         "with cp"
            elif f.image_present and f.image_id == want:
                result.skipped.append(h.label)
            else:
                need.append(h)
        if result.skipped:
            render.note(f"{count(len(result.skipped), 'node')} already "
                        f"{'has' if len(result.skipped) == 1 else 'have'} {req.image} "
                        f"({short_id(want)}): skipped")
        if not need:
            return result
        marker = share_marker(secrets.token_hex(8))
        groups, unsafe = await _sharing(need, transport, req.remote_dir, marker, req.fanout,
                                        req.python)
    where = req.via or "~/" + REMOTE_DIR
    for label, why in unsafe.items():
        result.failed[label] = (f"{why}: the node would load whatever archive lies there; "
                                f"{REFUSED_HINT}")
    need = [h for group in groups for h in group]
    if not need:
        return result
    for group in groups:
        if len(group) > 1:
            render.note(f"{fold([h.label for h in group[1:]])} share {where} with "
                        f"{group[0].label}: one copy for them")
    receivers = [group[0] for group in groups]
    name = f"dtrain-image-{short_id(want)}.tar"
    with tempfile.TemporaryDirectory(prefix="dtrain-image-") as tmp:
        archive = os.path.join(tmp, name)
        render.note(f"saving {req.image} ({short_id(want)}) from this machine's {runtime}")
        done = await asyncio.to_thread(
            subprocess.run, [runtime, "save", "-o", archive, req.image], capture_output=True,
            text=True, timeout=3600, check=False)
        if done.returncode != 0:
            raise DtrainError(f"{runtime} save {req.image} failed: {done.stderr.strip()[-300:]}")
        copy = CopyRequest(sources=(archive,), dest=req.remote_dir.rstrip("/") + "/",
                           fanout=req.fanout, python=req.python, progress=req.progress,
                           transport=req.transport)
        copy_started = time.monotonic()
        code = await cp_async(receivers, copy, settings)
        # the two phases apart: on nodes sharing CPUs (a test box) the loads dominate; on a
        # real cluster the copy is the part that grows with the node count
        took = time.monotonic() - copy_started
        if code == 0:
            render.note(f"copied to {count(len(receivers), 'node')} in {took:.1f} s; "
                        f"loading it ({runtime} load)")
        else:
            render.note(f"the copy failed on some node (exit {code}, after {took:.1f} s): "
                        f"loading it ({runtime} load) where it landed")
    load_started = time.monotonic()
    remote = f"{req.remote_dir.rstrip('/')}/{name}"

    async with AutoTransport(settings, req.transport, say=render.note) as transport:
        async def one(h: Host) -> None:
            rt = facts[h.label].runtime or runtime
            try:
                got = await _load(h, transport, rt, remote, req.image)
            except DtrainError as exc:
                result.failed[h.label] = exc.message
                return
            if got is not None and (got if ":" in got else "sha256:" + got) != want:
                result.failed[h.label] = f"loaded, but its id is {short_id(got)}, not " \
                                         f"{short_id(want)}"
            else:
                result.loaded.append(h.label)

        sem = asyncio.Semaphore(req.fanout)

        async def bounded(h: Host) -> None:
            async with sem:
                await one(h)

        async with asyncio.TaskGroup() as tg:
            for h in need:
                tg.create_task(bounded(h))
        result.load_s = time.monotonic() - load_started
        async with asyncio.TaskGroup() as tg:  # after every load: a shared home has one copy
            for h in need:
                tg.create_task(_remove(h, transport, remote,
                                       f"{req.remote_dir.rstrip('/')}/{marker}"))
    return result


def run_push(hosts: Sequence[Host], req: PushRequest, settings: SSHSettings) -> int:
    from launcher.commands.entry import INTERRUPTED, Ended, run_command

    def conclude(ended: Ended[PushResult]) -> int:
        res = ended.result
        if res is None:
            return INTERRUPTED
        order = [h.label for h in hosts]
        if res.loaded:
            took = f" in {res.load_s:.1f} s" if res.load_s is not None else ""
            render.note(f"{count(len(res.loaded), 'node')} loaded {req.image}{took}")
        for label in sorted(res.failed, key=lambda k: order.index(k) if k in order else 0):
            render.note(f"{label}: {res.failed[label]}")
        return res.exit_code

    return run_command("image push", hosts, lambda: push_async(hosts, req, settings),
                       conclude)
