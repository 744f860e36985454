"""Short node programs (the probe) run over a connection: params in, one JSON object out."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

from launcher.errors import RemoteCommandError
from launcher.nodeside import wire
from launcher.transports.base import Connection, Process


async def start_program(conn: Connection, name: str, params: Mapping[str, Any], *,
                        python: str = "python3", setup: str | None = None) -> Process:
    """Ship a node program and its params line; the caller reads its output.

    Only the probe's facts mode reads site-packages (package versions): the port checks
    start isolated without site, which is faster; the facts mode starts without site too
    and runs it itself, as far as it needs it (nodeside/probe.py load_site).
    """
    facts = params.get("mode", "facts") == "facts"
    proc = await conn.start(wire.remote_command(python, setup=setup, stdlib_only=not facts,
                                                no_site=facts))
    body = json.dumps(dict(params)).encode() + b"\n"
    try:
        await proc.write(wire.payload(wire.program_source(name)) + body)
    except (ConnectionError, OSError):
        pass  # the shell exited before reading (python missing): its stderr says why
    return proc


MAX_LINE = 256 << 20  # one answer line of a node program (a hash of ~2M paths); longer: refused


async def read_json_line(proc: Process, label: str, what: str) -> dict[str, Any]:
    """The program's JSON line, or a RemoteCommandError with its stderr.

    Lines before it that are not JSON are what the login shell printed (a chatty .bashrc):
    skipped. A line longer than MAX_LINE is that node's error (its memory is not ours).
    """
    buf = b""
    while True:
        lines = buf.split(b"\n")
        found = next((ln for ln in lines[:-1] if ln.lstrip().startswith(b"{")), None)
        if found is not None:
            break
        if lines[:-1]:
            buf = lines[-1]  # the shell's lines before it: skipped, not kept
        if len(buf) > MAX_LINE:
            raise RemoteCommandError(f"{what}: an answer line longer than {MAX_LINE >> 20} "
                                     "MiB: refused", host=label)
        chunk = await proc.read_stdout(65536)
        if not chunk:
            found = buf if buf.lstrip().startswith(b"{") else None
            break
        buf += chunk
    if found is None:
        raise await start_error(proc, label, what)
    try:
        result = json.loads(found)
    except ValueError as exc:
        raise RemoteCommandError(f"{what} printed a line that is not valid JSON", host=label,
                                 hint="does the remote shell print text on start-up?") from exc
    return result  # type: ignore[no-any-return]


MAX_STDERR = 64 << 10  # what a failed start's stderr is read for (its last lines count)


class StartError(RemoteCommandError):
    """A node program that printed no answer; ``kind`` says which step of the remote shell
    line failed ("setup", "python", "workdir") or "start"."""

    def __init__(self, failure: wire.StartFailure, host: str) -> None:
        super().__init__(failure.message, hint=failure.hint, host=host)
        self.kind = failure.kind


async def start_error(proc: Process, label: str, what: str) -> StartError:
    """Why the program gave no answer: its shell's stderr and exit status, read for at most
    a second each (wire.start_failure decides what they mean)."""
    err = b""
    status = None
    # not cleanups (aio.cleanup drops what they read): reads, what came in a second is it
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1):
            while len(err) < MAX_STDERR and (chunk := await proc.read_stderr(65536)):
                err += chunk
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1):
            status = await proc.wait()
    failure = wire.start_failure(status, err[-MAX_STDERR:].decode(errors="replace"), what)
    return StartError(failure, label)


async def run_program(conn: Connection, name: str, params: Mapping[str, Any], *,
                      python: str = "python3", setup: str | None = None,
                      timeout: float = 20.0) -> dict[str, Any]:
    """Run a node program to completion and return its JSON result."""
    async with asyncio.timeout(timeout):
        proc = await start_program(conn, name, params, python=python, setup=setup)
        try:
            proc.write_eof()
            return await read_json_line(proc, conn.host.label, name)
        finally:
            proc.abort()
