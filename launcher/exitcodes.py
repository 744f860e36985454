"""Every exit code dtrain gives, named once (docs/exit-codes.md is the same table in words).

pipx's ``constants`` is the model: a code is written as its name everywhere in launcher/,
never as a number (tests/test_exitcodes.py scans for the numbers). A code a rank or a remote
command chose itself (1-125, 128+N) passes through unchanged; these are the codes dtrain
itself decides.
"""

from __future__ import annotations

EXIT_OK = 0  # every node and every rank ended with 0; the command succeeded everywhere
EXIT_FAILED = 1  # a preflight or doctor check failed, a file was not copied, a check failed
EXIT_USAGE = 2  # bad input (options, hostfile, env file, profile): nothing connected
EXIT_FABRIC = 123  # --require-fabric: NCCL's own account shows a rank below the requirement
EXIT_TIMEOUT = 124  # --timeout reached, or a node did not start within --start-timeout
EXIT_HANG = 125  # --on-hang stop: no rank made progress for --hang-timeout seconds
EXIT_CANNOT_EXECUTE = 126  # exec's command exists but cannot run (as a shell says it)
EXIT_NOT_FOUND = 127  # exec's command (or a node's job) was not found (as a shell says it)
SIGNAL_BASE = 128  # 128+N: killed, or stopped, by signal N (as a shell reports it)
EXIT_HANGUP = 129  # SIGHUP (the terminal closed) stopped a run that was not detached
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT) or `dtrain stop` stopped it
EXIT_KILLED = 137  # SIGKILL (e.g. the OOM killer) killed the root cause rank
EXIT_TERMINATED = 143  # SIGTERM to dtrain stopped the job
EXIT_UNREACHABLE = 255  # a node unreachable, lost mid-run, or unable to start (as ssh, pdsh)


def exit_for_signal(signum: int) -> int:
    """The code of a death by (or a stop on) signal ``signum``: 128+N, as a shell says it."""
    return SIGNAL_BASE + int(signum)
