"""Secret-looking environment values, hidden before anything is shown or stored.

Used by the run archive (meta.json) and by dry runs, which both print or keep the job's
environment. The rule works on the words of a variable name (split on anything that is not
a letter or digit, case-insensitive):

- a word equal to PASS or AUTH, or
- a word ending in TOKEN, SECRET, PASSWORD, PASSWD, KEY, CREDENTIAL(S), AUTH

marks the value as secret. So HF_TOKEN, WANDB_API_KEY, APIKEY, SSH_KEY, KEY, DB_PASS,
AWS_SECRET_ACCESS_KEY, OAUTH and GIT_CREDENTIALS are hidden, while KEYBOARD, AUTHOR,
PASSTHROUGH and NCCL_* are not. A few harmless names (MONKEY, SSH_AUTH_SOCK) are hidden too:
we prefer a false alarm to a leaked token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "***"

_WORD = re.compile(r"[A-Z0-9]+")
_EXACT = frozenset({"PASS", "AUTH"})
_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "CREDENTIALS", "AUTH")


def is_secret_name(name: str) -> bool:
    """True when a variable with this name probably holds a secret."""
    return any(word in _EXACT or word.endswith(_SUFFIXES) for word in _WORD.findall(name.upper()))


def redact_env(mapping: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Copy an environment with secret-looking values replaced by "***" (order kept)."""
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return {name: REDACTED if is_secret_name(name) else value for name, value in items}
