"""The srun transport's pure parts: the --transport auto rule and the srun command line."""

from __future__ import annotations

import pytest

from launcher.errors import UsageError
from launcher.models import Host
from launcher.transports.srun import decide_transport, srun_argv

ALLOC = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node[1-3]"}
NODES = [Host("node1"), Host("node2")]


@pytest.mark.parametrize(("requested", "environ", "srun", "hosts", "kind"), [
    pytest.param("auto", ALLOC, "/usr/bin/srun", NODES, "srun", id="auto-in-allocation"),
    pytest.param("auto", {}, "/usr/bin/srun", NODES, "ssh", id="auto-outside"),
    pytest.param("auto", ALLOC, None, NODES, "ssh", id="auto-no-srun"),
    pytest.param("auto", ALLOC, "/usr/bin/srun", [Host("node4")], "ssh", id="auto-foreign-host"),
    pytest.param("auto", ALLOC, "/usr/bin/srun", [Host("node1", port=2222)], "ssh",
                 id="auto-ssh-port"),
    pytest.param("ssh", ALLOC, "/usr/bin/srun", NODES, "ssh", id="forced-ssh"),
    pytest.param("srun", ALLOC, "/usr/bin/srun", NODES, "srun", id="forced-srun"),
])
def test_transport_rule(requested: str, environ: dict[str, str], srun: str | None,
                        hosts: list[Host], kind: str) -> None:
    assert decide_transport(requested, hosts, environ, srun).kind == kind


@pytest.mark.parametrize(("environ", "srun", "hosts", "text"), [
    pytest.param({}, "/usr/bin/srun", NODES, "not inside a Slurm allocation", id="no-job"),
    pytest.param(ALLOC, None, NODES, "srun is not on PATH", id="no-srun"),
    pytest.param(ALLOC, "/usr/bin/srun", [Host("node1"), Host("node9")],
                 "smaller than asked: node9 not in it", id="too-small"),
])
def test_forced_srun_that_cannot_work_is_exit_2(environ: dict[str, str], srun: str | None,
                                                hosts: list[Host], text: str) -> None:
    with pytest.raises(UsageError, match=text) as exc:
        decide_transport("srun", hosts, environ, srun)
    assert exc.value.exit_code == 2
    assert exc.value.hint


def test_unknown_transport() -> None:
    with pytest.raises(UsageError, match="auto, ssh or srun"):
        decide_transport("rsh", NODES, ALLOC, None)


def test_srun_argv_one_task_on_one_node_unbuffered_short_export() -> None:
    argv = srun_argv("/usr/bin/srun", "node2", "exec python3 -c 'x'",
                     {"PATH": "/bin", "HOME": "/h", "NCCL_DEBUG": "INFO", "SECRET_TOKEN": "x"})
    assert argv[0] == "/usr/bin/srun"
    assert {"--nodes=1", "--ntasks=1", "--nodelist=node2", "--overlap",
            "--unbuffered"} <= set(argv)
    assert "--export=PATH,HOME" in argv
    assert argv[-3:] == ["/bin/sh", "-c", "exec python3 -c 'x'"]
