"""`keys setup` and plain ssh, pdsh and rsync (docs/keys.md, "Plain ssh").

dtrain offers its own key (~/.config/dtrain/id_ed25519) by itself; OpenSSH does not know
it. After a setup, dtrain says how to use it (``ssh -i KEY -p PORT user@host``) and offers a
``Host`` block with ``IdentityFile`` (and the hostfile's ``User``, ``Port``) for
~/.ssh/config: asked on a terminal (default no), added without a question only with
``--ssh-config``, never without consent (``--no-ssh-config``: not even asked). The block is
appended (the file is created 0600 in a 0700 ~/.ssh when missing); one already there for
the same hosts and key is not added twice.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

from launcher.models import Host

MARK = "# added by dtrain keys setup"
NAMES_PER_LINE = 16  # Host patterns per block (one block each; ssh_config has no ranges)


def _ssh(key: Path, host: Host | None) -> tuple[str, str]:
    """(``ssh -i KEY [-p PORT]``, ``[user@]name``) for one host as the hostfile names it."""
    port = f" -p {host.port}" if host is not None and host.port else ""
    dest = "HOST" if host is None else (f"{host.user}@" if host.user else "") + host.name
    return f"ssh -i {shlex.quote(str(key))}{port}", dest


def usage_lines(key: Path, hosts: Sequence[Host]) -> list[str]:
    """How plain ssh, pdsh and rsync can use the key (printed after every setup): the
    first host's own user and port, as dtrain reaches it."""
    ssh, dest = _ssh(key, hosts[0] if hosts else None)
    k = shlex.quote(str(key))
    more = " (and User, Port)" if any(h.user or h.port for h in hosts) else ""
    return [f"plain ssh, pdsh and rsync do not know dtrain's key: {ssh} {dest}; "
            f"rsync -e '{ssh}' ...; or give ~/.ssh/config a Host block with "
            f"IdentityFile {k}{more} (dtrain keys setup --ssh-config adds it)"]


def host_block(hosts: Sequence[Host], key: Path, *, now: float | None = None) -> str:
    """The ~/.ssh/config text: ``Host a b c`` / ``IdentityFile KEY``, with ``User`` and
    ``Port`` where the hostfile gives them, 16 names a block. ssh_config matches the name
    only, so a name the hostfile gives with several ports or users gets neither (a comment
    says so; ``ssh -p``/``-l`` then)."""
    settings: dict[str, set[tuple[str | None, int | None]]] = {}
    for h in hosts:
        settings.setdefault(h.name, set()).add((h.user, h.port))
    groups: dict[tuple[str | None, int | None], list[str]] = {}
    mixed = [name for name, seen in settings.items() if len(seen) > 1]
    for name, seen in settings.items():
        groups.setdefault(next(iter(seen)) if len(seen) == 1 else (None, None), []).append(name)
    day = time.strftime("%Y-%m-%d", time.localtime(now))
    out = [f"\n{MARK} ({day}): the key it installed on these nodes\n"]
    if mixed:
        out.append(f"# {' '.join(mixed)}: several ports or users in the hostfile; ssh_config "
                   "matches names only, so give ssh -p/-l for those\n")
    for (user, port), names in groups.items():
        extra = (f"    User {user}\n" if user else "") + (f"    Port {port}\n" if port else "")
        for i in range(0, len(names), NAMES_PER_LINE):
            out.append(f"Host {' '.join(names[i:i + NAMES_PER_LINE])}\n"
                       f"    IdentityFile {_quoted(str(key))}\n{extra}")
    return "".join(out)


def _quoted(path: str) -> str:
    return f'"{path}"' if any(c.isspace() for c in path) else path


def has_block(text: str, hosts: Sequence[str], key: Path) -> bool:
    """Does ~/.ssh/config already give this key to every one of these hosts (a block of
    ours, or any ``Host`` line naming the host followed by this ``IdentityFile``)?"""
    covered: set[str] = set()
    current: list[str] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        word = words[0].lower()
        if word in ("host", "match"):
            current = words[1:] if word == "host" else []
        elif word == "identityfile" and len(words) > 1 and \
                os.path.expanduser(" ".join(words[1:]).strip('"')) == str(key):
            covered.update(current)
    return all(h in covered for h in hosts)


def add_block(config: Path, hosts: Sequence[Host], key: Path) -> bool:
    """Append the block (False: already there). ~/.ssh is made 0700, a new config 0600."""
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        text = config.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if has_block(text, [h.name for h in hosts], key):
        return False
    fd = os.open(config, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        if text and not text.endswith("\n"):
            fh.write("\n")
        fh.write(host_block(hosts, key))
    return True
