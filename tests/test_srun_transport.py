"""The srun transport's pure parts: the --transport auto rule and the srun command line."""

from __future__ import annotations

import asyncio

import pytest

from launcher.errors import UsageError
from launcher.models import Host
from launcher.transports.srun import EXPORTED, SrunProcess, decide_transport, srun_argv

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


def test_srun_argv_exports_the_listed_names_in_order_or_none() -> None:
    """--export names only the EXPORTED variables that are set, in that order; with none of
    them set it is --export=NONE (srun's default, ALL, would pass the whole environment)."""
    full = dict.fromkeys(EXPORTED, "x") | {"NCCL_DEBUG": "INFO", "SLURM_JOB_ID": "5"}
    assert f"--export={','.join(EXPORTED)}" in srun_argv("srun", "n1", "true", full)
    argv = srun_argv("srun", "n1", "true", {"NCCL_DEBUG": "INFO", "SLURM_JOB_ID": "5"})
    assert [a for a in argv if a.startswith("--export")] == ["--export=NONE"]
    assert [a for a in srun_argv("srun", "n1", "true", {"USER": "u", "PATH": "/bin"})
            if a.startswith("--export")] == ["--export=PATH,USER"]


@pytest.mark.parametrize("host", [Host("node1", user="dtuser"), Host("node1", port=2222)],
                         ids=["user=", "port="])
def test_hosts_with_ssh_only_settings_go_over_ssh(host: Host) -> None:
    """A node of the allocation with user= (or :port) is an SSH destination: auto takes SSH
    and says which host made it; forced srun refuses it by name."""
    choice = decide_transport("auto", [Host("node2"), host], ALLOC, "/usr/bin/srun")
    assert choice.kind == "ssh"
    assert choice.reason.startswith(f"auto: {host.label} not in job 5")
    with pytest.raises(UsageError, match=f"{host.label} not in it"):
        decide_transport("srun", [Host("node2"), host], ALLOC, "/usr/bin/srun")


class _Chunks:
    """Stands in for an asyncio subprocess: stderr delivers the given chunks, then EOF."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.stderr = asyncio.StreamReader()
        self._chunks = chunks

    async def feed(self) -> None:
        for chunk in self._chunks:
            self.stderr.feed_data(chunk)
            await asyncio.sleep(0)
        self.stderr.feed_eof()


async def _stderr_of(chunks: list[bytes]) -> list[bytes]:
    fake = _Chunks(chunks)
    proc = SrunProcess(fake)  # type: ignore[arg-type]
    feeder = asyncio.ensure_future(fake.feed())
    reads = []
    while data := await proc.read_stderr(4096):
        reads.append(data)
    await feeder
    return reads


NOISE = b"srun: error: node2: task 0: Exited with exit code 7\n"


@pytest.mark.parametrize("cut", [1, 10, len(NOISE) - 1, len(NOISE)])
async def test_srun_noise_is_dropped_even_when_split_across_reads(cut: int) -> None:
    """srun's own report about the step is dropped whole, wherever the pipe cut it; the lines
    around it (and a last line without a newline) come through once, unchanged."""
    data = b"rank said this\n" + NOISE + b"srun: Job step aborted: waiting\nlast words"
    at = len(b"rank said this\n") + cut
    reads = await _stderr_of([data[:at], data[at:]])
    assert b"".join(reads) == b"rank said this\nlast words"
    assert all(reads)


async def test_only_srun_s_own_reports_are_dropped() -> None:
    kept = (b"srun: error: node2: task 0: Exited with exit code 7 (and more)\n"
            b"my srun: error: node2: task 0: Killed\n"
            b"srun: warning: something the user must see\n")
    assert b"".join(await _stderr_of([kept, b"srun: error: n1: task 3: Killed\n"])) == kept


def test_the_whole_srun_command_line() -> None:
    assert srun_argv("/usr/bin/srun", "node2", "cmd", {"PATH": "/bin"}) == [
        "/usr/bin/srun", "--nodes=1", "--ntasks=1", "--nodelist=node2", "--overlap",
        "--unbuffered", "--quiet", "--job-name=dtrain", "--export=PATH", "/bin/sh", "-c", "cmd"]


@pytest.mark.parametrize(("requested", "environ", "srun", "hosts", "reason"), [
    ("ssh", ALLOC, "/usr/bin/srun", NODES, "--transport ssh"),
    ("srun", ALLOC, "/usr/bin/srun", NODES, "--transport srun (job 5)"),
    ("auto", {}, "/usr/bin/srun", NODES, "auto: not inside a Slurm allocation"),
    ("auto", {"SLURM_JOB_NODELIST": "node1"}, "/usr/bin/srun", NODES,
     "auto: not inside a Slurm allocation"),
    ("auto", ALLOC, None, NODES, "auto: job 5, but srun is not on PATH"),
    ("auto", ALLOC, "/usr/bin/srun", [Host("node4"), Host("node9")],
     "auto: node4, node9 not in job 5"),
    ("auto", ALLOC, "/usr/bin/srun", NODES, "auto: inside Slurm job 5"),
])
def test_each_choice_says_why(requested: str, environ: dict[str, str], srun: str | None,
                              hosts: list[Host], reason: str) -> None:
    assert decide_transport(requested, hosts, environ, srun).reason == reason


@pytest.mark.parametrize(("environ", "srun", "hosts", "message", "hint"), [
    ({}, "/usr/bin/srun", NODES,
     "--transport srun: not inside a Slurm allocation (SLURM_JOB_ID/SLURM_JOB_NODELIST are "
     "not set)", "run dtrain inside salloc or an sbatch script, or use --transport ssh"),
    (ALLOC, None, NODES, "--transport srun: srun is not on PATH",
     "load Slurm's module / add its bin directory to PATH, or use --transport ssh"),
    (ALLOC, "/usr/bin/srun", [Host("node1"), Host("node8"), Host("node9")],
     "the allocation (job 5: 3 nodes) is smaller than asked: node8, node9 not in it",
     "ask salloc/sbatch for those nodes (-N, -w), or leave out -f/-H to use the "
     "allocation's nodes (node1,node2,node3)"),
])
def test_forced_srun_says_what_to_do(environ: dict[str, str], srun: str | None,
                                     hosts: list[Host], message: str, hint: str) -> None:
    with pytest.raises(UsageError) as exc:
        decide_transport("srun", hosts, environ, srun)
    assert (exc.value.message, exc.value.hint) == (message, hint)
