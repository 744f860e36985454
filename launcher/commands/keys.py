"""`dtrain keys`: make every node accept one dtrain key (setup), test it (check), remove it.

setup, each step on all nodes in parallel (at most ``fanout`` at once):

1. a key-only login (this key alone: no agent, no default keys, no password). Nodes that
   accept it are "present" and never see the password;
2. unknown host keys met in step 1 are shown with their fingerprints and recorded in
   known_hosts once the user confirms them, or at once with --accept-new. We record the very
   key that was shown, so nothing can swap it between the question and the answer. A changed
   key is refused and never overwritten;
3. the password is asked once, and only if some node refused the key. Each such node gets
   exactly one password or keyboard-interactive attempt: a wrong password fails fast and
   cannot lock the account through retries. The install script (authorized_keys.py) goes over
   stdin, so the command line holds nothing but ``sh -s``;
4. each node that got the key is checked with a fresh key-only login.

The logins themselves (this key alone; a password offered once) are not SSHTransport's:
they live in ``transports.ssh.login``, so asyncssh stays behind the transport package.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from launcher import defaults
from launcher.commands.authorized_keys import (
    ScriptReport,
    install_script,
    parse_report,
    remove_script,
)
from launcher.commands.keypair import (
    KeyPair,
    Secret,
)
from launcher.errors import AuthError, ConnectError, DtrainError, HostKeyError
from launcher.exitcodes import EXIT_FAILED, EXIT_OK
from launcher.models import Host
from launcher.output.report import ERROR, PASSED, CommandReport, NodeResult
from launcher.output.report import FAILED as FAILED_STATUS
from launcher.transports.ssh import (
    HostKeyPolicy,
    SSHSettings,
    SSHTransport,
    UnknownHostKey,
    load_host_config,
)
from launcher.transports.ssh.login import (
    Completed,
    LoginClient,
    LoginSession,
    is_password_prompt,
    login,
)

_Client = LoginClient  # the name the tests know it by
__all__ = ["KeyResult", "Prompts", "UnknownHostKey", "check_keys", "is_password_prompt",
           "keys_report", "revoke_keys", "setup_keys"]

INSTALLED, PRESENT, FAILED = "installed", "present", "failed"
OK, REMOVED, ABSENT = "ok", "removed", "absent"
SCRIPT_TIMEOUT = 30.0
_T = TypeVar("_T")
_KEY_HINT = ("check sshd's AuthorizedKeysFile and StrictModes (home, ~/.ssh and "
             "authorized_keys must not be group- or world-writable)")


@dataclass(frozen=True)
class KeyResult:
    """How one node ended: installed/present/ok/removed/absent, or failed with a reason."""

    host: str
    status: str
    detail: str = ""
    reachable: bool | None = None  # sshd answered (None: not known, e.g. a timeout)

    @property
    def ok(self) -> bool:
        return self.status != FAILED

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "status": self.status, "detail": self.detail}


class Prompts(Protocol):
    """The questions setup may need answered (the CLI asks them on the terminal)."""

    def confirm_host_keys(self, unknown: Sequence[UnknownHostKey]) -> bool:
        """True when the user trusts every one of these host keys."""

    def password(self, hosts: Sequence[Host]) -> Secret:
        """The login password for these hosts (asked once)."""

    def host_keys_added(self, added: Sequence[UnknownHostKey]) -> None:
        """Show the host keys --accept-new just recorded."""


def _failed(host: Host, exc: DtrainError | str, reachable: bool | None = None) -> KeyResult:
    """A failed node; a refused login or host key means sshd answered (reachable), any
    other connect error that it did not."""
    if isinstance(exc, str):
        return KeyResult(host.label, FAILED, exc, reachable)
    if reachable is None:
        reachable = isinstance(exc, (AuthError, HostKeyError))
    text = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    return KeyResult(host.label, FAILED, text, reachable)


# --------------------------------------------------------------------------- the local key


@dataclass(frozen=True)
class _Probe:
    """A key-only login's outcome: a final result, or what setup has to do next."""

    host: Host
    result: KeyResult | None = None
    needs_password: bool = False
    unknown: UnknownHostKey | None = None  # to confirm before anything else happens
    added: UnknownHostKey | None = None  # recorded under --accept-new: to show the user


class _Nodes:
    """Logins to many nodes with one key and one settings object, ``fanout`` at a time."""

    def __init__(self, settings: SSHSettings, keypair: KeyPair, fanout: int) -> None:
        self.settings = settings
        self.keypair = keypair
        self.fanout = fanout

    def policy(self, host: Host, accept_new: bool | None = None) -> HostKeyPolicy:
        """The host's known_hosts files (ssh config's UserKnownHostsFile/GlobalKnownHostsFile)."""
        return self.settings.host_key_policy(load_host_config(self.settings, host), accept_new)

    async def connect(self, host: Host, client: LoginClient, policy: HostKeyPolicy, *,
                      key_only: bool) -> LoginSession:
        """Log in with this key alone, or with the client's password (offered once)."""
        return await login(self.settings, host, client, policy,
                           self.keypair.ssh_key if key_only else None)

    async def run(self, conn: LoginSession, command: str,
                  stdin: str | None = None) -> Completed:
        """Run one command to completion (bounded), errors mapped."""
        return await conn.run(command, stdin, timeout=SCRIPT_TIMEOUT)

    async def probe(self, host: Host, accept_new: bool | None = None) -> _Probe:
        """Key-only login, then `true`: does this key alone get us in?"""
        policy = self.policy(host, accept_new)
        client = LoginClient(policy)
        probe = await self._probe(host, client, policy)
        if client.added is not None:
            return replace(probe, added=replace(client.added, host=host.label))
        return probe

    async def _probe(self, host: Host, client: LoginClient, policy: HostKeyPolicy) -> _Probe:
        try:
            conn = await self.connect(host, client, policy, key_only=True)
        except AuthError as exc:
            return _Probe(host, _failed(host, exc), needs_password=True)
        except HostKeyError as exc:
            unknown = client.refused and replace(client.refused, host=host.label)
            return _Probe(host, _failed(host, exc), unknown=unknown)
        except ConnectError as exc:
            return _Probe(host, _failed(host, exc))
        async with conn:
            try:
                done = await self.run(conn, "true")
            except ConnectError as exc:
                return _Probe(host, _failed(host, exc, reachable=True))
        if done.exit_status != 0:
            return _Probe(host, _failed(host, f"key login works, but `true` exited "
                                              f"{done.exit_status}: {_last_line(done.stderr)}",
                                        reachable=True))
        return _Probe(host, KeyResult(host.label, OK, "key login works", True))

    async def install(self, host: Host, password: Secret) -> KeyResult:
        """Password login, the install script, then a key-only login to prove it."""
        policy = self.policy(host)
        client = LoginClient(policy, password)
        try:
            conn = await self.connect(host, client, policy, key_only=False)
            async with conn:
                done = await self.run(conn, "sh -s", install_script(self.keypair.key))
        except ConnectError as exc:
            return _failed(host, exc)
        report = parse_report(_text(done.stdout))
        if report.state not in (INSTALLED, PRESENT):
            why = report.error or f"unexpected answer {report.state!r}"
            stderr = _last_line(done.stderr)
            return _failed(host, f"on the node: {why}" + (f" ({stderr})" if stderr else ""),
                           reachable=True)
        return await self._verify(host, report)

    async def _verify(self, host: Host, report: ScriptReport) -> KeyResult:
        check = await self.probe(host)
        notes = "; ".join(report.warnings)
        if check.result is None or not check.result.ok:
            why = check.result.detail if check.result else "no answer"
            extra = f"; {notes}" if notes else f"; {_KEY_HINT}"
            return _failed(host, f"key {report.state}, but a key-only login still fails: "
                                 f"{why}{extra}", reachable=True)
        if report.state == PRESENT:
            notes = "; ".join(filter(None, ["key was already in authorized_keys, but refused: "
                                            "permissions fixed", notes]))
        return KeyResult(host.label, report.state, notes, True)

    async def revoke(self, transport: SSHTransport, host: Host) -> KeyResult:
        """Log in as dtrain always does (any key) and remove this key's lines."""
        try:
            conn = await transport.connect(host)
            async with conn:
                proc = await conn.start("sh -s")
                await proc.write(remove_script(self.keypair.key).encode())
                proc.write_eof()
                async with asyncio.timeout(SCRIPT_TIMEOUT):
                    out, err = await asyncio.gather(_drain(proc.read_stdout),
                                                    _drain(proc.read_stderr))
                    await proc.wait()
        except ConnectError as exc:
            return _failed(host, exc)
        except (TimeoutError, ConnectionError) as exc:
            return _failed(host, f"the remove script did not finish: {exc or 'timed out'}")
        report = parse_report(_text(out))
        if report.state in (REMOVED, ABSENT):
            return KeyResult(host.label, report.state, "; ".join(report.warnings), True)
        return _failed(host, f"on the node: {report.error} {_last_line(err)}".strip(),
                       reachable=True)

    async def each(self, hosts: Iterable[Host],
                   step: Callable[[Host], Awaitable[_T]]) -> dict[str, _T | KeyResult]:
        """``step`` on every host, at most ``fanout`` at once, each bounded in time."""
        sem = asyncio.Semaphore(self.fanout)
        out: dict[str, _T | KeyResult] = {}

        async def one(host: Host) -> None:
            async with sem:
                try:
                    async with asyncio.timeout(self.settings.connect_timeout * 3 + SCRIPT_TIMEOUT):
                        out[host.label] = await step(host)
                except TimeoutError:
                    out[host.label] = _failed(host, "timed out")

        async with asyncio.TaskGroup() as tg:
            for host in hosts:
                tg.create_task(one(host), name=f"keys:{host.label}")
        return out


def _text(data: object) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data if isinstance(data, str) else ""


def _last_line(data: object) -> str:
    lines = _text(data).strip().splitlines()
    return lines[-1].strip() if lines else ""


async def _drain(read: Callable[[int], Awaitable[bytes]]) -> bytes:
    chunks = []
    while chunk := await read(65536):
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- commands


def check_keys(hosts: Sequence[Host], settings: SSHSettings, keypair: KeyPair,
               fanout: int = defaults.FANOUT) -> list[KeyResult]:
    """Key-only login on every node (strict host keys): ok or failed, in host order."""
    nodes = _Nodes(settings, keypair, fanout)
    probes = asyncio.run(nodes.each(hosts, lambda h: nodes.probe(h, accept_new=False)))
    return [_probe_result(h, probes[h.label]) for h in hosts]


def _probe_result(host: Host, probe: _Probe | KeyResult) -> KeyResult:
    if isinstance(probe, KeyResult):
        return probe
    return probe.result or _failed(host, "no answer")


def setup_keys(hosts: Sequence[Host], settings: SSHSettings, keypair: KeyPair,
               prompts: Prompts, fanout: int = defaults.FANOUT) -> list[KeyResult]:
    """Every node accepts ``keypair`` afterwards, or says why not (see the module doc)."""
    nodes = _Nodes(settings, keypair, fanout)
    done = asyncio.run(nodes.each(hosts, nodes.probe))
    probes: dict[str, _Probe | KeyResult] = {h.label: done[h.label] for h in hosts}  # host order
    added = [p.added for p in probes.values() if isinstance(p, _Probe) and p.added]
    if added:
        prompts.host_keys_added(added)
    probes.update(_confirm_host_keys(nodes, prompts, probes))
    results: dict[str, KeyResult] = {}
    need: list[Host] = []
    for host in hosts:
        probe = probes[host.label]
        if isinstance(probe, _Probe) and probe.needs_password:
            need.append(host)
        elif isinstance(probe, _Probe) and probe.result and probe.result.ok:
            results[host.label] = KeyResult(host.label, PRESENT, "key already accepted", True)
        else:
            results[host.label] = _probe_result(host, probe)
    if need:
        password = prompts.password(need)
        results.update(asyncio.run(nodes.each(need, lambda h: nodes.install(h, password))))
    return [results[h.label] for h in hosts]


def _confirm_host_keys(nodes: _Nodes, prompts: Prompts,
                       probes: dict[str, _Probe | KeyResult]) -> dict[str, _Probe | KeyResult]:
    """Ask once about every unknown host key; record the confirmed ones and log in again."""
    pending = [p for p in probes.values() if isinstance(p, _Probe) and p.unknown]
    if not pending:
        return {}
    unknown = [p.unknown for p in pending if p.unknown]
    if not prompts.confirm_host_keys(unknown):
        return {p.host.label: _failed(p.host, _not_confirmed(p.unknown), reachable=True)
                for p in pending if p.unknown}
    for key in unknown:
        key.record()
    return asyncio.run(nodes.each([p.host for p in pending], nodes.probe))


def _not_confirmed(key: UnknownHostKey) -> str:
    return (f"unknown host key {key.algorithm} {key.fingerprint}, not recorded (check it, "
            "then rerun on a terminal and confirm, or with --accept-new)")


def revoke_keys(hosts: Sequence[Host], settings: SSHSettings, keypair: KeyPair,
                fanout: int = defaults.FANOUT) -> list[KeyResult]:
    """Remove the key's lines from every node's authorized_keys (removed/absent/failed)."""
    nodes = _Nodes(settings, keypair, fanout)

    async def run() -> dict[str, KeyResult]:
        transport = SSHTransport(settings)
        async with transport:
            return await nodes.each(hosts, lambda h: nodes.revoke(transport, h))

    results = asyncio.run(run())
    return [results[h.label] for h in hosts]



# --------------------------------------------------------------------------- the report

_KEY_STATE = {INSTALLED: "installed", PRESENT: "present", OK: "accepted", REMOVED: "removed",
              ABSENT: "absent"}


def _node(r: KeyResult) -> NodeResult:
    status = PASSED if r.ok else (ERROR if r.reachable is False else FAILED_STATUS)
    details = {"state": r.status, "reachable": r.reachable, "key": _KEY_STATE.get(r.status),
               "error": None if r.ok else r.detail}
    return NodeResult(r.host, status, None, r.detail or None, None, details=details)


def keys_report(action: str, results: Sequence[KeyResult], keypair: KeyPair, summary: str,
                started: float, ended: float) -> CommandReport:
    """``dtrain.keys/1`` (docs/schemas.md): one node per host. Only hosts, states and
    messages go in: the password never reaches a KeyResult."""
    code = EXIT_OK if all(r.ok for r in results) else EXIT_FAILED
    bad = next((r for r in results if not r.ok), None)
    root = None if bad is None else {
        "kind": "unreachable" if bad.reachable is False else "node", "host": bad.host,
        "rank": None, "exit_code": code, "summary": f"{bad.host}: {bad.detail}"}
    extra = {"action": action, "key": str(keypair.private), "fingerprint": keypair.fingerprint,
             "results": [r.to_json() for r in results]}
    return CommandReport("keys", code, summary, started, ended,
                         tuple(_node(r) for r in results), root, None, extra)
