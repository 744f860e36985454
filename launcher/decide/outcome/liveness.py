"""Is a node lost? Its silence, counted in the launcher's own running time (pure).

A node is lost because *it* went silent, not because the launcher was not listening. Any
bytes read from the node's channel count as hearing from it (output as much as heartbeat
frames). The launcher looks every ``interval`` seconds (its heartbeat tick); a look that
comes more than ``slack`` seconds after it was due means the launcher itself was not running
(SIGSTOP, a suspended laptop lid, a starved event loop, a stalled box): that stretch is not
the node's silence and is not counted. And what a node sent meanwhile may still be unread
when that late look runs (the channel's reader runs after it), so a late look declares a
node lost only past one more interval. docs/failure-semantics.md, "Heartbeats".
"""

from __future__ import annotations

from dataclasses import dataclass

# how late a look may be and still count as the launcher running on time (event-loop jitter
# on a loaded box is tens of milliseconds; a SIGSTOP or a starved loop is seconds)
SLACK = 0.5


@dataclass
class Silence:
    """One node's silence as the launcher measures it (times: time.monotonic())."""

    timeout: float  # --heartbeat-timeout; 0: never lost
    heard_at: float  # when the last bytes came from the node
    slack: float = SLACK
    stalled: float = 0.0  # of the time since heard_at, how long the launcher was not running

    def heard(self, now: float) -> None:
        """Bytes from the node (or the launcher chose not to read: its own silence)."""
        self.heard_at = now
        self.stalled = 0.0

    def silent(self, now: float) -> float:
        """The node's silence so far, less the time the launcher itself was not running."""
        return max(0.0, now - self.heard_at - self.stalled)

    def late(self, now: float, due: float) -> bool:
        """A look at ``now`` due at ``due`` came late: the launcher was not running."""
        return now - due > self.slack

    def look(self, now: float, due: float, interval: float) -> bool:
        """A look at ``now`` that was due at ``due`` (the tick's sleep ended then): is the
        node lost? The lateness past ``slack`` is the launcher's own stall: not counted."""
        late = self.late(now, due)
        if late:
            # the stall [due, now], as far as it lies after the last time we heard the node
            self.stalled += max(0.0, now - max(due, self.heard_at))
        if self.timeout <= 0:
            return False
        return self.silent(now) > self.timeout + (interval if late else 0.0)


# `dtrain top`'s verdicts on one node's sampler channel (launcher/job/sampling.py)
LOST, RECONNECT = "lost", "reconnect"


def sampler_verdict(silence: Silence, now: float, due: float, interval: float, *,
                    lost_after: float, reconnect_after: float) -> str | None:
    """`dtrain top`'s look at one node's samples at ``now`` (due at ``due``; the silence is
    heard at each sample, and a sampler not yet started has its grace in the thresholds):
    RECONNECT past ``reconnect_after``, LOST past ``lost_after``, else None. Counted in the
    launcher's own running time, as ``Silence.look``: a stopped or starved ``dtrain top``
    does not find every node lost when it resumes."""
    margin = interval if silence.late(now, due) else 0.0
    silence.look(now, due, interval)
    silent = silence.silent(now)
    if silent > reconnect_after + margin:
        return RECONNECT
    if silent > lost_after + margin:
        return LOST
    return None


# how many heartbeat timeouts a node waits for the launcher before it gives up on it
LAUNCHER_TIMEOUTS = 3


def launcher_timeout(heartbeat_timeout: float) -> float:
    """How long a node's programs (the supervisor, the run's sampler) wait without a line
    from the launcher before they tear their job down as orphaned (0: never).

    Longer than the launcher's own judgement of the node: the launcher is the one that
    decides a node is lost (and can tell its own stall from the node's silence); the node's
    deadline is the fallback for a partition, when no EOF ever reaches it. A node cannot
    tell a stopped or starved launcher from a cut link, so it waits three timeouts: a
    launcher stalled for up to twice the timeout finds its run still going."""
    return LAUNCHER_TIMEOUTS * heartbeat_timeout if heartbeat_timeout > 0 else 0.0
