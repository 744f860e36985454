"""The defaults that several layers share, spelled once (issue 54, item 5).

typer's options, the commands' request dataclasses and the job's settings all start from
these, so a changed default changes everywhere at once (tests/test_house_rules.py fails on
the literal spelled again). Plain numbers: imported on every command's hot path.
"""

from __future__ import annotations

FANOUT = 64  # connections opened at once (pdsh's -f)
KEYS_FANOUT = 32  # keys setup/check/revoke: logins with a password prompt are heavier
CONNECT_TIMEOUT_S = 10.0  # seconds to connect to one node (pdsh's -t)
HEARTBEAT_TIMEOUT_S = 30.0  # a node silent this long is lost
HEARTBEAT_INTERVAL_S = 2.0  # how often both ends say they are alive
GRACE_S = 10.0  # a run's SIGTERM to SIGKILL on teardown (--grace)
EXEC_GRACE_S = 2.0  # exec's: a shell command has no checkpoint to save
