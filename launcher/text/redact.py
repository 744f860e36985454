"""Secret-looking environment values, hidden before anything is shown or stored.

Used by the run archive (meta.json) and by dry runs, which both print or keep the job's
environment. The rule works on the words of a variable name (split on anything that is not
a letter or digit, case-insensitive):

- a word equal to PASS or AUTH, or
- a word ending in TOKEN, SECRET, PASSWORD, PASSWD, KEY, CREDENTIAL(S), AUTH

marks the value as secret. So HF_TOKEN, WANDB_API_KEY, APIKEY, SSH_KEY, KEY, DB_PASS,
AWS_SECRET_ACCESS_KEY, OAUTH and GIT_CREDENTIALS are hidden, while KEYBOARD, AUTHOR,
PASSTHROUGH and NCCL_* are not. A few harmless names (MONKEY, SSH_AUTH_SOCK) are hidden too:
we prefer a false alarm to a leaked token. A value taken from the launcher's own environment
(``--env NAME``) is hidden whatever its name: the caller passes those names as ``hidden``.

The recorded command line is redacted from what the parser found, not by guessing at argv:
the CLI hands over the raw ``--env`` items it parsed (``NAME=VALUE``), and every argv word
ending in one of them (``-e NAME=V``, ``-eNAME=V``, ``--env=NAME=V``, ``-meNAME=V``) has its
value hidden; so has any word equal to a hidden value (a script argument carrying it).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence

REDACTED = "***"

_WORD = re.compile(r"[A-Z0-9]+")
_EXACT = frozenset({"PASS", "AUTH"})
_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "CREDENTIALS", "AUTH")


def is_secret_name(name: str) -> bool:
    """True when a variable with this name probably holds a secret."""
    return any(word in _EXACT or word.endswith(_SUFFIXES) for word in _WORD.findall(name.upper()))


def is_hidden(name: str, hidden: Collection[str] = ()) -> bool:
    """True when the value of ``name`` must not be shown: a secret-looking name, or one whose
    value came from the launcher's environment."""
    return name in hidden or is_secret_name(name)


def redact_value(name: str, value: str, hidden: Collection[str] = ()) -> str:
    """``value``, or "***" when ``name`` is secret."""
    return REDACTED if is_hidden(name, hidden) else value


def redact_env(mapping: Mapping[str, str] | Iterable[tuple[str, str]],
               hidden: Collection[str] = ()) -> dict[str, str]:
    """Copy an environment with secret-looking values replaced by "***" (order kept)."""
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return {name: redact_value(name, value, hidden) for name, value in items}


def redact_words(words: Iterable[str], values: Collection[str]) -> list[str]:
    """Words equal to a secret value become ***, and so does the value of a word ending in
    ``=value`` (``--token=VALUE``), a value that holds "=" itself included (base64 padding:
    every "=" of the word is tried, the first one first)."""
    out = []
    for word in words:
        if word in values:
            word = REDACTED
        else:
            eq = word.find("=")
            while eq >= 0:
                if word[eq + 1:] in values:
                    word = word[:eq + 1] + REDACTED
                    break
                eq = word.find("=", eq + 1)
        out.append(word)
    return out


def secret_values(env: Iterable[tuple[str, str]], hidden: Collection[str] = ()) -> set[str]:
    """The non-empty values of the secret (or hidden) variables among ``env``."""
    return {value for name, value in env if value and is_hidden(name, hidden)}


def redact_command(argv: Sequence[str], env_items: Iterable[str],
                   env: Iterable[tuple[str, str]], hidden: Collection[str] = ()) -> list[str]:
    """The command line as recorded: parsed ``--env`` items with a secret name lose their
    value wherever the parser found them, and a word equal to a secret value becomes ***.

    ``env_items`` are the raw option values the parser returned for ``--env``; ``env`` is
    every (name, value) the job got (``--env``, ``--env-file``, the hostfile)."""
    items = []
    for item in env_items:
        name, sep, _ = item.partition("=")
        if sep and is_hidden(name, hidden):
            items.append((item, f"{name}={REDACTED}"))
    out = []
    for word in argv:
        for item, shown in items:
            if word.endswith(item):
                word = word[:-len(item)] + shown
                break
        out.append(word)
    return redact_words(out, secret_values(env, hidden))
