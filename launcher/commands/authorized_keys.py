"""authorized_keys edits: the rules in Python, and the POSIX sh script that applies them on a node.

Both sides follow one rule, so the unit tests of the Python functions describe what the
remote script does (tests/test_authorized_keys.py runs the script locally on the same inputs):

* A line *authorizes* a key when it is not a comment (``^[ \\t]*#``) and one of its
  blank-separated words is the key's base64 blob (a trailing CR is ignored). Matching the blob
  rather than the whole line means a key that is already there with another comment, CRLF
  line ends or an options prefix (``from="10.0.0.0/8" ssh-ed25519 AAAA...``) counts as
  present: we never add an unrestricted twin next to a line an administrator restricted.
* ``add_key`` appends ``key_line`` only when no line authorizes the key, first adding the
  newline a hand-edited file may lack (else the two keys would merge into one broken line).
* ``remove_key`` drops every line that authorizes the key, keeps everything else as it was,
  and ends the text with a newline (what awk's ``print`` writes).

The scripts run under ``sh -s`` (read from stdin: nothing but ``sh -s`` is on the command
line, and no password ever reaches the node) with ``umask 077``, so a file they create is
0600 from the start. They need only sh, awk, tail, ls, cut, chmod, mkdir, rmdir, mv, sleep
(and mktemp, find where they exist): no Python.

Both refuse a symlinked ``authorized_keys`` (naming it) before reading or writing anything:
editing through a link writes wherever it points. Both hold a lock while they edit, the
directory ``~/.ssh/.dtrain-keys.lock`` (``mkdir`` is atomic on NFS too, where ``flock`` may
not be), so nodes sharing one home add the key once, not once each at the same moment; a
lock older than two minutes is left over from a killed script and is taken over. revoke
writes the new file to a temp file made by ``mktemp`` inside ``~/.ssh`` (or with noclobber
where there is no mktemp) and renames it over the old one: never a predictable name, never
another node's temp file.
Their result is one line on stdout: ``dtrain-keys: installed|present|removed|absent`` or
``dtrain-keys: error: ...``, plus ``dtrain-keys: warning: ...`` lines.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

MARK = "dtrain-keys:"
_BLANKS = re.compile(r"[ \t]+")
_COMMENT = re.compile(r"[ \t]*#")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,3}")
_KEY_TYPE = re.compile(r"(ssh|ecdsa|sk|rsa)-[A-Za-z0-9@.+-]+")


@dataclass(frozen=True)
class PublicKey:
    """One OpenSSH public key line: ``type blob [comment]``."""

    algorithm: str
    blob: str
    comment: str = ""

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """Parse a .pub file's text; ValueError names what is wrong (never echoes a secret)."""
        line = text.strip()
        if "\n" in line or "\r" in line:
            raise ValueError("a public key is one line")
        words = line.split(None, 2)
        if len(words) < 2 or not _KEY_TYPE.fullmatch(words[0]) \
                or not _BASE64.fullmatch(words[1]):
            raise ValueError("not an OpenSSH public key line ('ssh-ed25519 AAAA... comment')")
        return cls(words[0], words[1], words[2].strip() if len(words) > 2 else "")

    @property
    def line(self) -> str:
        """The line added to authorized_keys."""
        return f"{self.algorithm} {self.blob} {self.comment}".rstrip()


def _records(text: str) -> list[str]:
    """Lines as awk reads them: split at LF; a final LF does not start another record."""
    records = text.split("\n")
    if records[-1] == "":
        records.pop()
    return records


def authorizes(line: str, blob: str) -> bool:
    """True when this authorized_keys line grants the key with that blob (see module doc)."""
    if _COMMENT.match(line):
        return False
    return any(word in (blob, blob + "\r") for word in _BLANKS.split(line) if word)


def has_key(text: str, blob: str) -> bool:
    """True when some line of the file authorizes the key."""
    return any(authorizes(line, blob) for line in _records(text))


def add_key(text: str, key_line: str) -> tuple[str, bool]:
    """The file with the key added if absent, and whether it changed."""
    key = PublicKey.parse(key_line)
    if has_key(text, key.blob):
        return text, False
    if text and not text.endswith("\n"):
        text += "\n"
    return text + key.line + "\n", True


def remove_key(text: str, key_line: str) -> tuple[str, bool]:
    """The file without any line authorizing the key, and whether it changed."""
    key = PublicKey.parse(key_line)
    records = _records(text)
    kept = [line for line in records if not authorizes(line, key.blob)]
    if len(kept) == len(records):
        return text, False
    return "".join(line + "\n" for line in kept), True


# --------------------------------------------------------------------------- remote scripts

# The same matching rule as authorizes(); `exit` in a rule still runs END.
_AWK_HAS = r"""/^[ \t]*#/ { next }
{ for (i = 1; i <= NF; i++) if ($i == b || $i == b "\r") { found = 1; exit } }
END { exit !found }"""

_AWK_REMOVE = r"""{ keep = 1
  if ($0 !~ /^[ \t]*#/) for (i = 1; i <= NF; i++) if ($i == b || $i == b "\r") keep = 0
  if (keep) print }"""

_PRELUDE = """\
umask 077
say() { printf '%s %s\\n' "$mark" "$*"; }
die() { say "error: $*"; exit 1; }
[ -n "${HOME:-}" ] && [ -d "$HOME" ] || die "no home directory (HOME=${HOME:-unset})"
dir=$HOME/.ssh
file=$dir/authorized_keys
lock=$dir/.dtrain-keys.lock
locked=
has_key() { awk -v b="$blob" "$awk_has" "$file"; }
owned() { [ -O "$1" ] || die "$1 is not owned by $(id -un); fix it as root"; }
no_link() {
  [ -L "$file" ] && die "$file is a symbolic link; dtrain does not edit through links:" \
    "edit it by hand"
  return 0
}
unlock() { [ -n "$locked" ] && rmdir "$lock" 2>/dev/null; locked=; }
trap unlock EXIT
trap 'unlock; exit 1' HUP INT TERM
take_lock() {
  tries=0
  gone=0
  until mkdir "$lock" 2>/dev/null; do
    if [ ! -d "$lock" ]; then  # released between our mkdir and this test: try again
      gone=$((gone + 1))
      [ "$gone" -le 20 ] || die "cannot create $lock"
      continue
    fi
    if [ -n "$(find "$lock" -prune -mmin +2 2>/dev/null)" ]; then
      rmdir "$lock" 2>/dev/null  # left by a killed run two minutes ago or more
      continue
    fi
    tries=$((tries + 1))
    [ "$tries" -le 600 ] || die "$lock is held by another dtrain keys run (a home shared" \
      "by several nodes?); remove it if none is running"
    sleep 0.1 2>/dev/null || sleep 1
  done
  locked=1
}
make_temp() {
  if command -v mktemp >/dev/null 2>&1; then
    mktemp "$dir/.authorized_keys.dtrain.XXXXXXXX" 2>/dev/null && return 0
  fi
  n=0
  while [ "$n" -lt 100 ]; do
    t=$dir/.authorized_keys.dtrain.$$.$n
    if (set -C; : >"$t") 2>/dev/null; then printf '%s\n' "$t"; return 0; fi
    n=$((n + 1))
  done
  return 1
}
"""

_INSTALL = """\
if [ ! -d "$dir" ]; then
  [ -e "$dir" ] && die "$dir exists and is not a directory"
  mkdir "$dir" 2>/dev/null || [ -d "$dir" ] || die "cannot create $dir"
fi
owned "$dir"
chmod 700 "$dir" || die "cannot chmod 700 $dir"
no_link
take_lock
if [ -e "$file" ]; then
  [ -f "$file" ] || die "$file is not a regular file"
  owned "$file"
  [ -r "$file" ] || die "cannot read $file"
fi
if [ -f "$file" ] && has_key; then
  state=present
else
  if [ -s "$file" ] && [ -n "$(tail -c 1 "$file")" ]; then
    printf '\\n' >>"$file" || die "cannot write $file"
  fi
  printf '%s\\n' "$key" >>"$file" || die "cannot write $file"
  state=installed
fi
chmod 600 "$file" || die "cannot chmod 600 $file"
if command -v restorecon >/dev/null 2>&1; then
  restorecon -R "$dir" >/dev/null 2>&1 || say "warning: restorecon -R $dir failed"
fi
case $(ls -ld "$HOME" | cut -c6,9) in
  *w*) say "warning: $HOME is group- or world-writable: sshd (StrictModes) ignores keys";;
esac
say "$state"
"""

_REMOVE = """\
no_link
[ -e "$file" ] || { say absent; exit 0; }
[ -f "$file" ] || die "$file is not a regular file"
[ -r "$file" ] || die "cannot read $file"
take_lock
has_key || { say absent; exit 0; }
owned "$file"
tmp=$(make_temp) || die "cannot create a temp file in $dir"
awk -v b="$blob" "$awk_remove" "$file" >"$tmp" || { rm -f "$tmp"; die "cannot write $tmp"; }
chmod 600 "$tmp" && mv -f "$tmp" "$file" || { rm -f "$tmp"; die "cannot replace $file"; }
if command -v restorecon >/dev/null 2>&1; then restorecon "$file" >/dev/null 2>&1; fi
say removed
"""


def _header(key: PublicKey, purpose: str) -> str:
    values = {"mark": MARK, "key": key.line, "blob": key.blob, "awk_has": _AWK_HAS,
              "awk_remove": _AWK_REMOVE}
    assigns = "".join(f"{name}={shlex.quote(value)}\n" for name, value in values.items())
    return f"# dtrain keys {purpose}: runs on the node under `sh -s` (POSIX sh)\n{assigns}"


def install_script(key: PublicKey) -> str:
    """The sh script that adds ``key`` to ~/.ssh/authorized_keys unless present."""
    return _header(key, "setup") + _PRELUDE + _INSTALL


def remove_script(key: PublicKey) -> str:
    """The sh script that removes every line authorizing ``key``."""
    return _header(key, "revoke") + _PRELUDE + _REMOVE


@dataclass(frozen=True)
class ScriptReport:
    """What a script printed: its state (installed/present/removed/absent/error)."""

    state: str
    error: str = ""
    warnings: tuple[str, ...] = ()


def parse_report(stdout: str) -> ScriptReport:
    """Read the script's ``dtrain-keys:`` lines; other output (shell rc files) is ignored."""
    state, error, warnings = "", "", []
    for raw in stdout.splitlines():
        if not raw.startswith(MARK):
            continue
        text = raw[len(MARK):].strip()
        if text.startswith("warning: "):
            warnings.append(text.removeprefix("warning: "))
        elif text.startswith("error: "):
            state, error = "error", text.removeprefix("error: ")
        else:
            state = text
    return ScriptReport(state or "error", error if state else "no result from the script",
                        tuple(warnings))
