"""decide/outcome/liveness.py: a node is lost when it went silent, not when the launcher was not
running (pure; the cluster half is tests/test_failures.py's SIGSTOP tests)."""

from __future__ import annotations

from launcher.decide.outcome.liveness import (
    LOST,
    RECONNECT,
    Silence,
    launcher_timeout,
    sampler_verdict,
)


def looks(silence: Silence, start: float, until: float, interval: float,
          stop: tuple[float, float] | None = None) -> float | None:
    """Tick every ``interval`` from ``start``; a stop (from, to) delays the tick due in it to
    ``to``. The time of the look that declares the node lost, or None."""
    due = start + interval
    while due <= until:
        now = due
        if stop is not None and stop[0] <= due < stop[1]:
            now = stop[1]
        if silence.look(now, due, interval):
            return now
        due = now + interval
    return None


def test_a_silent_node_is_lost_once_its_silence_passes_the_timeout() -> None:
    s = Silence(5.0, heard_at=0.0)
    assert looks(s, 0.0, 60.0, 1.25) == 6.25  # the first look past 5 s


def test_a_node_heard_from_is_never_lost() -> None:
    s = Silence(5.0, heard_at=0.0)
    for k in range(1, 100):
        t = k * 1.25
        assert not s.look(t, t, 1.25)
        s.heard(t)


def test_a_stopped_launcher_does_not_lose_a_node_that_kept_talking() -> None:
    """SIGSTOP for 30 s (6 timeouts) right after the node's last frame; the late look runs
    before the reader has caught up on what the node sent meanwhile: not lost."""
    s = Silence(5.0, heard_at=10.0)
    assert not s.look(40.0, 11.25, 1.25)  # due at 11.25, ran at 40
    s.heard(40.01)  # the backlog is read
    assert not s.look(41.26, 41.26, 1.25)


def test_a_late_look_before_the_backlog_is_read_is_not_a_loss() -> None:
    """The worst case: heard just before the previous look, then stopped at once."""
    s = Silence(5.0, heard_at=0.0)
    assert not s.look(1.25, 1.25, 1.25)
    assert not s.look(2.5, 2.5, 1.25)
    s.heard(2.49)
    assert not s.look(100.0, 3.75, 1.25)


def test_a_node_that_really_went_silent_is_still_lost_after_a_launcher_stall() -> None:
    """The node died during the launcher's stop: lost one timeout of launcher running
    time after the stop (plus an interval at most), not at the first look."""
    s = Silence(5.0, heard_at=10.0)
    lost = looks(s, 10.0, 200.0, 1.25, stop=(11.0, 40.0))
    assert lost is not None and 40.0 + 5.0 <= lost <= 40.0 + 5.0 + 1.25 + 0.01, lost


def test_a_lagging_loop_still_detects_a_silent_node() -> None:
    """Every look 1 s late (a starved launcher): the silence that is counted grows by
    the interval per look, and the node is lost past timeout + interval of it."""
    s = Silence(5.0, heard_at=0.0)
    t, due, lost = 0.0, 1.25, None
    for _ in range(50):
        t = due + 1.0
        if s.look(t, due, 1.25):
            lost = t
            break
        due = t + 1.25
    assert lost is not None
    assert s.silent(lost) > 5.0 + 1.25


def test_jitter_within_the_slack_is_counted_as_silence() -> None:
    s = Silence(5.0, heard_at=0.0)
    t, due = 0.0, 1.25
    while True:
        t = due + 0.3  # late, but within the slack: the launcher was running
        if s.look(t, due, 1.25):
            break
        due = t + 1.25
    assert 5.0 < t <= 5.0 + 1.55 + 0.01, t


def test_timeout_zero_is_never_lost() -> None:
    s = Silence(0.0, heard_at=0.0)
    assert not s.look(1e6, 1.0, 1.0)


def test_the_nodes_wait_longer_for_the_launcher_than_it_waits_for_them() -> None:
    assert launcher_timeout(5.0) == 15.0
    assert launcher_timeout(30.0) == 90.0
    assert launcher_timeout(0.0) == 0.0


def test_hearing_from_a_node_forgets_the_launcher_s_stall() -> None:
    """The stall counted before the node was heard is not subtracted from its next
    silence: silence is exactly the time since the node was heard."""
    s = Silence(5.0, heard_at=0.0)
    assert not s.look(30.0, 1.25, 1.25)  # a 28.75 s stall
    s.heard(30.0)
    assert s.silent(30.0) == 0.0
    assert s.silent(33.0) == 3.0
    assert not s.look(35.0, 35.0, 1.25)  # 5 s: not past the timeout
    assert s.look(35.5, 35.5, 1.25)


def test_an_on_time_look_exactly_at_the_timeout_is_not_a_loss_just_past_it_is() -> None:
    s = Silence(5.0, heard_at=0.0)
    assert not s.look(5.0, 5.0, 1.25)
    assert s.look(5.5, 5.5, 1.25)  # on time: no extra interval
    late = Silence(5.0, heard_at=0.0)
    assert not late.look(1.75, 1.25, 1.25)  # exactly `slack` late: still on time
    assert late.silent(1.75) == 1.75  # nothing subtracted


def test_each_stall_is_subtracted_and_they_add_up() -> None:
    s = Silence(60.0, heard_at=0.0)
    assert not s.look(10.0, 1.0, 1.0)  # stalled 9 s
    assert not s.look(20.0, 11.0, 1.0)  # and 9 s more
    assert s.silent(20.0) == 2.0


def test_a_stall_before_the_node_was_last_heard_is_not_counted() -> None:
    """The backlog was read at 10 (heard), then a look due at 5 ran at 10: the stall lies
    before what the node said, nothing of it is the node's silence to subtract."""
    s = Silence(5.0, heard_at=0.0)
    s.heard(10.0)
    assert not s.look(10.0, 5.0, 1.0)
    assert s.silent(12.0) == 2.0


def test_timeout_zero_is_never_lost_even_when_every_look_is_on_time() -> None:
    s = Silence(0.0, heard_at=0.0)
    assert not s.look(1e6, 1e6, 1.0)
    assert not Silence(-1.0, heard_at=0.0).look(1e6, 1e6, 1.0)


def test_a_timeout_under_one_second_still_counts() -> None:
    s = Silence(0.5, heard_at=0.0)
    assert not s.look(0.5, 0.5, 0.25)
    assert s.look(0.75, 0.75, 0.25)


def test_the_nodes_wait_for_the_launcher_is_three_timeouts_whatever_the_timeout() -> None:
    assert launcher_timeout(0.5) == 1.5
    assert launcher_timeout(1.0) == 3.0
    assert launcher_timeout(-1.0) == 0.0  # no heartbeat: never


def top_looks(silence: Silence, start: float, until: float,
              stop: tuple[float, float] | None = None,
              samples: tuple[float, ...] = ()) -> list[tuple[float, str]]:
    """`dtrain top`'s looks every 1 s (lost after 5 s, reconnect after 15 s); a sample at
    each time in ``samples`` (read at the first look after it); a stop (from, to) delays
    the look due in it to ``to``. The (time, verdict) of each look that is not None."""
    due, out, pending = start + 1.0, [], sorted(samples)
    while due <= until:
        now = stop[1] if stop is not None and stop[0] <= due < stop[1] else due
        while pending and pending[0] <= due:  # read before the look (a late look: after)
            if now == due:
                silence.heard(pending[0])
            pending.pop(0)
        verdict = sampler_verdict(silence, now, due, 1.0, lost_after=5.0, reconnect_after=15.0)
        if verdict is not None:
            out.append((now, verdict))
        due = now + 1.0
    return out


def test_top_shows_a_silent_node_lost_then_reconnects() -> None:
    got = top_looks(Silence(0.0, heard_at=0.0), 0.0, 16.0)
    assert got[0] == (6.0, LOST) and got[-1] == (16.0, RECONNECT), got


def test_a_stopped_top_finds_no_node_lost_when_it_resumes() -> None:
    """`dtrain top` stopped 30 s (past lost and reconnect) while every node sampled each
    second: the late look runs before the backlog is read: no verdict, then the samples."""
    s = Silence(0.0, heard_at=10.0)
    assert top_looks(s, 10.0, 60.0, stop=(11.0, 41.0),
                     samples=tuple(float(t) for t in range(11, 61))) == []
    # the old judgement, wall time since the last sample, saw 31 s of silence: a reconnect
    assert 41.0 - 10.0 > 15.0


def test_a_node_that_died_while_top_was_stopped_is_lost_in_top_s_running_time() -> None:
    """The node's last sample at 10, top stopped 11..41: its silence at 41 is 1 s; it shows
    lost past 5 s of top's running time (46), dropped past 15 s (56), not at 41."""
    got = top_looks(Silence(0.0, heard_at=10.0), 10.0, 60.0, stop=(11.0, 41.0))
    assert got[0] == (46.0, LOST), got
    assert [t for t, v in got if v == RECONNECT][0] == 56.0, got


def test_top_s_verdicts_at_their_thresholds() -> None:
    def at(now: float, due: float | None = None) -> str | None:
        return sampler_verdict(Silence(0.0, heard_at=0.0), now, now if due is None else due,
                               1.0, lost_after=5.0, reconnect_after=15.0)
    assert at(5.0) is None
    assert at(5.5) == LOST
    assert at(15.0) == LOST
    assert at(15.5) == RECONNECT
    # a late look (0.6 s, past the slack): its stall is not counted and it waits one more
    # interval, the backlog may still be unread
    assert at(6.2, due=5.6) is None  # 5.6 s of silence counted, under 5 + 1
    assert at(7.7, due=7.1) == LOST  # 7.1 counted
    assert at(16.5, due=15.9) == LOST  # 15.9: under 15 + 1
    assert at(17.1, due=16.5) == RECONNECT
    # whatever the Silence's own timeout (top's has none), the verdict is top's thresholds'
    assert sampler_verdict(Silence(5.0, heard_at=0.0), 7.7, 7.1, 1.0, lost_after=5.0,
                           reconnect_after=15.0) == LOST


def test_late_means_past_the_slack() -> None:
    s = Silence(5.0, heard_at=0.0)
    assert not s.late(1.5, 1.0) and s.late(1.51, 1.0)
    assert not Silence(5.0, heard_at=0.0, slack=2.0).late(3.0, 1.0)
