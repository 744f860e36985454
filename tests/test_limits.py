"""The open-files limit: raised to what N hosts need, or a clear exit-2 error."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from launcher.errors import UsageError
from launcher.job.limits import ensure_nofile, fds_needed
from tests.util import cannot_run


def test_soft_limit_is_raised_up_to_what_the_hosts_need() -> None:
    calls = []
    got = ensure_nofile(1000, getrlimit=lambda _: (1024, 65536),
                        setrlimit=lambda _, lim: calls.append(lim))
    assert got == fds_needed(1000) > 1024
    assert calls == [(fds_needed(1000), 65536)]


def test_enough_already_changes_nothing() -> None:
    calls: list[tuple[int, int]] = []
    assert ensure_nofile(10, getrlimit=lambda _: (1024, 4096),
                         setrlimit=lambda _, lim: calls.append(lim)) == 1024
    assert calls == []


def test_hard_limit_too_low_is_a_usage_error_naming_the_numbers() -> None:
    with pytest.raises(UsageError) as err:
        ensure_nofile(5000, getrlimit=lambda _: (1024, 4096), setrlimit=lambda *_: None)
    assert err.value.exit_code == 2
    assert "5000 hosts" in str(err.value) and "4096" in str(err.value)


def test_a_real_process_with_a_low_soft_limit_gets_it_raised() -> None:
    """Through the real setrlimit, in a child whose soft limit is 256."""
    code = ("import resource; from launcher.job.limits import ensure_nofile, fds_needed; "
            "ensure_nofile(500); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < fds_needed(500):
        cannot_run(f"the hard limit on open files here ({hard}) is under the "
                   f"{fds_needed(500)} this test needs")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                               (256, hard)), timeout=60)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == fds_needed(500)


def test_exec_over_too_many_hosts_for_the_hard_limit_exits_2_before_connecting() -> None:
    """40 hosts with a hard limit of 128: exit 2 at once, no traceback, nothing dialled
    (the hosts are blackholed test addresses: a dial would hang for the connect timeout)."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (100, 128)); "
            "from launcher.cli import main; sys.argv = ['dtrain', 'exec', '-H', "
            "'198.18.0.[200-239]', '--connect-timeout', '20', '--', 'true']; main()")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=15)
    assert res.returncode == 2, res.stderr
    assert "hard limit is 128" in res.stderr and "Traceback" not in res.stderr
