"""The open-files limit a job over N hosts needs, raised before connecting.

Each host holds one SSH socket (local hosts: three pipes) for the whole job, plus the
archive's files and asyncio's own descriptors. The default soft limit on many login nodes is
1024, which a 300-node job exceeds in the middle of connecting; the hard limit is usually
far higher, and a process may raise its soft limit up to it without privileges. So dtrain
raises the soft limit to what N hosts need, and refuses with a clear error (exit 2) when
even the hard limit is too low, before any connection is opened.
"""

from __future__ import annotations

import resource
from collections.abc import Callable

from launcher.errors import UsageError

FDS_PER_HOST = 4
FDS_RESERVE = 64


def fds_needed(nhosts: int) -> int:
    """Descriptors a job over ``nhosts`` hosts may hold at once."""
    return FDS_RESERVE + FDS_PER_HOST * nhosts


def ensure_nofile(nhosts: int, *,
                  getrlimit: Callable[[int], tuple[int, int]] = resource.getrlimit,
                  setrlimit: Callable[[int, tuple[int, int]], None] = resource.setrlimit
                  ) -> int:
    """Raise RLIMIT_NOFILE's soft limit to what ``nhosts`` need; return the limit in force."""
    need = fds_needed(nhosts)
    soft, hard = getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard != resource.RLIM_INFINITY and hard < need:
        raise UsageError(
            f"{nhosts} hosts need about {need} open files, but this shell's hard limit is "
            f"{hard} (ulimit -Hn)",
            hint="raise the hard limit (/etc/security/limits.conf nofile, or LimitNOFILE= for "
                 "a service) or split the host list")
    setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return need
