"""`dtrain keys setup|check|revoke` (registered on the main app by launcher.cli).

This module parses options, asks the questions (host keys, password) and draws the per-node
table; the work is in launcher.commands.keys, imported lazily so `dtrain --help` stays fast. The
password is read without echo (getpass) or as one line of stdin (--password-stdin), and is
held in a ``keys.Secret`` from the moment it is read.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from launcher import defaults
from launcher.cli import groups
from launcher.cli.common import DtrainCommand, DtrainGroup, run_body
from launcher.cli.groups import (
    AcceptNewOpt,
    ConnectTimeoutOpt,
    ExcludeOpt,
    FanoutOpt,
    HostfileOpt,
    HostsOpt,
    IncludeOpt,
)
from launcher.errors import UsageError
from launcher.text.words import count

if TYPE_CHECKING:
    from launcher.commands.keypair import KeyPair, Secret
    from launcher.commands.keys import KeyResult, UnknownHostKey
    from launcher.models import Host

keys_app = typer.Typer(cls=DtrainGroup, no_args_is_help=True,
                       help="Passwordless SSH bootstrap for every node.")

def _identity_opt(what: str) -> Any:
    return typer.Option("--identity", "-i", metavar="KEY", rich_help_panel=groups.CONNECTION,
                        help=what)


IdentityOpt = Annotated[Path | None, _identity_opt(
    "Key to install (created there if missing) instead of ~/.ssh/id_ed25519_dtrain.")]
CheckIdentityOpt = Annotated[Path | None, _identity_opt(
    "Key to log in with (alone: no agent, no password) instead of ~/.ssh/id_ed25519_dtrain.")]
RevokeIdentityOpt = Annotated[Path | None, _identity_opt(
    "Key whose lines to remove (its .pub file) instead of ~/.ssh/id_ed25519_dtrain.")]
JsonOpt = Annotated[bool, groups.json_opt(
    "One JSON document (dtrain.keys/1) on stdout; the table goes to stderr.")]
JunitOpt = Annotated[str | None, groups.junit_opt(
    "Write JUnit XML to this file (a testcase per node).")]
PasswordStdinOpt = Annotated[bool, typer.Option(
    "--password-stdin", rich_help_panel=groups.CONNECTION,
    help="Read the password from the first line of stdin (scripts, CI) "
         "instead of asking on the terminal.")]

LABELS = {"present": "already present"}
STYLES = {"installed": "green", "present": "green", "ok": "green", "removed": "green",
          "absent": "dim", "failed": "bold red"}


# --------------------------------------------------------------------------- prompts


def _has_tty() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDWR))
    except OSError:
        return False
    return True


def _who(hosts: Sequence[Host]) -> str:
    from launcher.hosts.hostfile import fold

    users = {h.user for h in hosts}
    user = f"{users.pop()}@" if len(users) == 1 and None not in users else ""
    return user + fold(h.label for h in hosts)


def _fingerprints(keys: Sequence[UnknownHostKey]) -> str:
    width = max(len(k.host) for k in keys)
    return "\n".join(f"  {k.host:<{width}}  {k.algorithm}  {k.fingerprint}" for k in keys)


class TerminalPrompts:
    """Questions on the terminal; none at all when stdin carries the password."""

    def __init__(self, password_stdin: bool, known_hosts: Path) -> None:
        self.password_stdin = password_stdin
        self.known_hosts = known_hosts

    def host_keys_added(self, added: Sequence[UnknownHostKey]) -> None:
        from launcher.output import render

        render.note(f"--accept-new: recorded {len(added)} new host key(s) in "
                    f"{self.known_hosts}:\n{_fingerprints(added)}")

    def confirm_host_keys(self, unknown: Sequence[UnknownHostKey]) -> bool:
        from launcher.output import render

        render.note(f"{len(unknown)} host key(s) not in {self.known_hosts} yet:\n"
                    + _fingerprints(unknown))
        if self.password_stdin or not sys.stdin.isatty():
            render.note("not recorded: no terminal to confirm them on (check them, then "
                        "use --accept-new)")
            return False
        return typer.confirm(f"Trust these keys and record them in {self.known_hosts}?",
                             default=False, err=True)

    def password(self, hosts: Sequence[Host]) -> Secret:
        from launcher.commands.keypair import Secret

        who = _who(hosts)
        if self.password_stdin:
            line = sys.stdin.readline()
            if not line:
                raise UsageError("--password-stdin: no password on stdin",
                                 hint="echo \"$PASSWORD\" | dtrain keys setup --password-stdin")
            return Secret(line.removesuffix("\n").removesuffix("\r"))
        if not _has_tty():
            need = "node needs" if len(hosts) == 1 else "nodes need"
            raise UsageError(f"{len(hosts)} {need} a password and there is no terminal "
                             "to ask on", hint="pass it with --password-stdin")
        import getpass

        return Secret(getpass.getpass(f"Password for {who} (asked once): "))


# --------------------------------------------------------------------------- output


def _table(results: Sequence[KeyResult], stream: TextIO) -> None:
    """A rich table when colour is on (``render.should_color``: a terminal or FORCE_COLOR,
    never NO_COLOR), plain aligned columns otherwise (pipes, CI logs)."""
    from launcher.output.render import should_color

    if should_color(stream):
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table()
        for column in ("host", "status", "detail"):
            table.add_column(column, overflow="fold")
        for r in results:
            style = STYLES.get(r.status, "")
            table.add_row(escape(r.host), f"[{style}]{LABELS.get(r.status, r.status)}[/]",
                          escape(r.detail))
        Console(file=stream, force_terminal=True).print(table)
        return
    width = max(len(r.host) for r in results)
    swidth = max(len(LABELS.get(r.status, r.status)) for r in results)
    for r in results:
        line = f"{r.host:<{width}}  {LABELS.get(r.status, r.status):<{swidth}}  {r.detail}"
        stream.write(line.rstrip() + "\n")
    stream.flush()


def _report(action: str, results: Sequence[KeyResult], keypair: KeyPair, started: float,
            as_json: bool, junit: str | None) -> int:
    """Print the table (to stderr under --json) and the tally, then the dtrain.keys/1
    document and the JUnit file when asked; 0 only when every node succeeded."""
    from launcher.commands.entry import finish
    from launcher.commands.keys import keys_report
    from launcher.output import render

    _table(results, sys.stderr if as_json else sys.stdout)
    counts: dict[str, int] = {}
    for r in results:
        counts[LABELS.get(r.status, r.status)] = counts.get(LABELS.get(r.status, r.status), 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in counts.items())
    summary = f"{count(len(results), 'node')}: {tally} (key {keypair.private})"
    render.note(summary)
    for r in results:
        if r.status == "failed" and "HOST KEY CHANGED" in r.detail:
            render.note(f"WARNING: {r.host}: HOST KEY CHANGED; known_hosts left as it was. "
                        "Do not connect until you know why.")
    report = keys_report(action, results, keypair, summary, started, time.time())
    return finish(report, as_json=as_json, junit=junit)


def _remote(hosts: Sequence[Host]) -> list[Host]:
    """The hosts reached over SSH: a localhost entry (no user, no port) runs as a local
    process in exec, run and doctor, so keys leaves it out, with one line saying so."""
    from launcher.hosts.hostfile import fold
    from launcher.output import render

    local = [h.label for h in hosts if h.is_local]
    if local:
        render.note(f"{fold(local)} runs locally; no key needed")
    return [h for h in hosts if not h.is_local]


def _keypair(identity: Path | None, *, create: bool) -> KeyPair:
    from launcher.commands.keypair import default_key_path, ensure_keypair
    from launcher.output import render

    path = (identity or default_key_path()).expanduser()
    if not create and not path.exists():
        raise UsageError(f"no key at {path}", hint="create and install it with `dtrain keys "
                                                   "setup`")
    keypair = ensure_keypair(path)
    if keypair.created:
        render.note(f"created {keypair.private} ({keypair.key.algorithm} {keypair.fingerprint})")
    return keypair


def _plain_ssh(hosts: Sequence[Host], results: Sequence[KeyResult], keypair: KeyPair,
               consent: bool | None, *, ask: bool) -> None:
    """Say how plain ssh/pdsh/rsync use the key; add the ~/.ssh/config block only with
    consent (--ssh-config, or yes on a terminal)."""
    from launcher.commands.sshconfig import add_block, has_block, usage_lines
    from launcher.hosts.hostfile import fold
    from launcher.output import render

    ok = {r.host for r in results if r.ok}
    reached = list({(h.name, h.user, h.port): h for h in hosts
                    if h.label in ok or h.name in ok}.values())
    names = list(dict.fromkeys(h.name for h in reached))
    if not names:
        return
    config = Path.home() / ".ssh" / "config"
    key = keypair.private.expanduser().absolute()
    try:
        text = config.read_text(encoding="utf-8")
    except OSError:
        text = ""
    if has_block(text, names, key):
        render.note(f"{config} already gives plain ssh this key for {fold(names)}")
        return
    for line in usage_lines(key, reached):
        render.note(line)
    if consent is None and ask:
        consent = typer.confirm(f"Add a Host block for {fold(names)} with IdentityFile {key} "
                                f"to {config}?", default=False, err=True)
    if consent:
        add_block(config, reached, key)
        render.note(f"added to {config}: Host {fold(names)} / IdentityFile {key}")


def _identities(identity: Path | None) -> tuple[str, ...]:
    """--identity for the transport (the default dtrain key it offers by itself)."""
    return (str(identity.expanduser()),) if identity is not None else ()


# --------------------------------------------------------------------------- commands


@keys_app.command("setup", cls=DtrainCommand)
def setup_cmd(
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    fanout: FanoutOpt = defaults.KEYS_FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    identity: IdentityOpt = None,
    password_stdin: PasswordStdinOpt = False,
    accept_new: AcceptNewOpt = False,
    as_json: JsonOpt = False,
    junit: JunitOpt = None,
    ssh_config: Annotated[bool | None, typer.Option(
        "--ssh-config/--no-ssh-config",
        help="Add a Host block with IdentityFile to ~/.ssh/config so plain ssh, pdsh and "
             "rsync use the key too (default: ask on a terminal, else only say how).")] = None,
) -> None:
    """Install the dtrain key on every node (password asked once, only where needed).

    Exit codes: 0 every node accepts the key; 1 some node failed (see the table);
    2 bad input (no hosts, unusable key, no password on stdin).

    Example:

      dtrain keys setup -f hosts
    """
    def body() -> int:
        from launcher.commands.keys import setup_keys

        started = time.time()
        host_list = _remote(groups.hosts(hostfile, hosts, include, exclude, user=user,
                                         group=group, exclude_group=exclude_group,
                                         genders=genders))
        if not host_list:
            return 0  # localhost alone: nothing to set up, check or revoke
        keypair = _keypair(identity, create=True)
        settings = groups.connection(connect_timeout, accept_new, ssh_option)
        prompts = TerminalPrompts(password_stdin, settings.known_hosts)
        results = setup_keys(host_list, settings, keypair, prompts, fanout=fanout)
        code = _report("setup", results, keypair, started, as_json, junit)
        _plain_ssh(host_list, results, keypair, ssh_config,
                   ask=not password_stdin and sys.stdin.isatty())
        return code

    run_body(body)


@keys_app.command("check", cls=DtrainCommand)
def check_cmd(
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    fanout: FanoutOpt = defaults.KEYS_FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    identity: CheckIdentityOpt = None,
    as_json: JsonOpt = False,
    junit: JunitOpt = None,
) -> None:
    """Log in to every node with the dtrain key alone (no agent, no password).

    Exit codes: 0 every node accepts the key; 1 some node does not; 2 bad input.

    Example:

      dtrain keys check -f hosts
    """
    def body() -> int:
        from launcher.commands.keys import check_keys

        started = time.time()
        host_list = _remote(groups.hosts(hostfile, hosts, include, exclude, user=user,
                                         group=group, exclude_group=exclude_group,
                                         genders=genders))
        if not host_list:
            return 0  # localhost alone: nothing to set up, check or revoke
        keypair = _keypair(identity, create=False)
        settings = groups.connection(connect_timeout, False, ssh_option)
        results = check_keys(host_list, settings, keypair, fanout=fanout)
        return _report("check", results, keypair, started, as_json, junit)

    run_body(body)


@keys_app.command("revoke", cls=DtrainCommand)
def revoke_cmd(
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    fanout: FanoutOpt = defaults.KEYS_FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    identity: RevokeIdentityOpt = None,
    as_json: JsonOpt = False,
    junit: JunitOpt = None,
) -> None:
    """Remove the dtrain key's lines from every node's authorized_keys.

    Logs in as every dtrain command does (your keys, agent, ~/.ssh/config). The local key
    files are kept. Exit codes: 0 removed or absent everywhere; 1 some node failed.

    Example:

      dtrain keys revoke -H node[1-4]
    """
    def body() -> int:
        from launcher.commands.keys import revoke_keys

        started = time.time()
        host_list = _remote(groups.hosts(hostfile, hosts, include, exclude, user=user,
                                         group=group, exclude_group=exclude_group,
                                         genders=genders))
        if not host_list:
            return 0  # localhost alone: nothing to set up, check or revoke
        keypair = _keypair(identity, create=False)
        settings = groups.connection(connect_timeout, False, ssh_option,
                                     identities=_identities(identity))
        results = revoke_keys(host_list, settings, keypair, fanout=fanout)
        return _report("revoke", results, keypair, started, as_json, junit)

    run_body(body)
