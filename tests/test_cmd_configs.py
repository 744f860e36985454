"""cli/configs.py and cli/runconfig.py: each command's parsed command line into its request
without I/O (issue 35 item 4). Every check is exit 2 naming the option before any host is
read (the hostfiles named here do not exist), and every parameter a command declares
reaches its Args (``.of`` would drop one silently)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from launcher.cli.args import ExecArgs
from launcher.cli.configs import (
    CpArgs,
    DoctorArgs,
    PushArgs,
    SmokeArgs,
    TopArgs,
    cp_config,
    doctor_config,
    push_config,
    smoke_config,
    top_config,
)
from launcher.cli.runconfig import RunArgs
from launcher.errors import UsageError

MISSING = "/nonexistent/hosts"  # a config that read it would fail with a HostfileError


def _commands() -> list[tuple[type, object]]:
    from launcher.cli.cp import cp_cmd
    from launcher.cli.doctor import doctor_cmd
    from launcher.cli.exec import exec_cmd
    from launcher.cli.image import push_cmd
    from launcher.cli.run import run_cmd
    from launcher.cli.smoke import smoke_cmd
    from launcher.cli.top import top_cmd

    return [(RunArgs, run_cmd), (ExecArgs, exec_cmd), (SmokeArgs, smoke_cmd),
            (CpArgs, cp_cmd), (DoctorArgs, doctor_cmd), (TopArgs, top_cmd),
            (PushArgs, push_cmd)]


@pytest.mark.parametrize("args,cmd", _commands(), ids=lambda v: getattr(v, "__name__", ""))
def test_every_parameter_of_a_command_is_a_field_of_its_args(args: type, cmd: object) -> None:
    """A parameter missing from the Args would be dropped by ``.of(locals())`` and the
    option would silently do nothing; a field the command lacks would never be set."""
    params = set(inspect.signature(cmd).parameters)  # type: ignore[arg-type]
    fields = {f.name for f in dataclasses.fields(args)}
    # run's Args has no --persist/-v: the connection group's defaults (not warm)
    shared_defaults = {"persist", "verbose"} - params
    assert params == fields - shared_defaults, (params ^ fields)


@pytest.mark.parametrize("args,cmd", _commands(), ids=lambda v: getattr(v, "__name__", ""))
def test_the_args_defaults_are_the_commands_defaults(args: type, cmd: object) -> None:
    """Args(...) in a test or a caller means what the command line means."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)
                if f.default is not dataclasses.MISSING}
    for name, p in inspect.signature(cmd).parameters.items():  # type: ignore[arg-type]
        if p.default is not inspect.Parameter.empty:
            assert defaults[name] == p.default, name


def test_smoke_takes_env_names_from_the_environment_it_is_given() -> None:
    a = SmokeArgs(hostfile=MISSING, env=["TOKEN", "A=1"], backend="gloo", max_size="4M",
                  timeout=60.0, archive_dir="/tmp/runs")
    req, opts, settings = smoke_config(a, {"TOKEN": "from-given"})
    assert req.env == (("TOKEN", "from-given"), ("A", "1"))
    assert (req.backend, req.max_size) == ("gloo", 4 << 20)
    assert (opts.limits.grace, opts.limits.timeout) == (5.0, 60.0)
    assert str(opts.reports.archive_dir) == "/tmp/runs" and settings.connect_timeout == 10.0
    with pytest.raises(UsageError, match="--env TOKEN"):
        smoke_config(a, {})


@pytest.mark.parametrize("bad,option", [
    ({"backend": "mpi"}, "--backend"), ({"transport": "rsh"}, "--transport"),
    ({"ssh_option": ["NoEquals"]}, "-o"), ({"python": ""}, "--python")])
def test_smoke_checks_each_option(bad: dict[str, object], option: str) -> None:
    with pytest.raises(UsageError, match=option):
        smoke_config(SmokeArgs(hostfile=MISSING, **bad), {})  # type: ignore[arg-type]


def test_cp_needs_a_source_and_a_destination_and_a_size() -> None:
    req, _ = cp_config(CpArgs(hostfile=MISSING, paths=["a", "b", "/dst"], sftp=True))
    assert (req.sources, req.dest, req.stream) == (("a", "b"), "/dst", False)
    with pytest.raises(UsageError, match="source and a destination"):
        cp_config(CpArgs(hostfile=MISSING, paths=["/dst"]))
    with pytest.raises(UsageError, match="--broadcast-min"):
        cp_config(CpArgs(hostfile=MISSING, paths=["a", "/dst"], broadcast_min="lots"))


def test_doctor_health_or_checks() -> None:
    health, _ = doctor_config(DoctorArgs(hostfile=MISSING, health=True, probe_timeout=20,
                                         health_interval=2.0))
    assert type(health).__name__ == "HealthOptions" and health.timeout == 22.0
    dcgm, _ = doctor_config(DoctorArgs(hostfile=MISSING, dcgm=2))
    assert type(dcgm).__name__ == "HealthOptions" and dcgm.dcgm == 2
    plain, _ = doctor_config(DoctorArgs(hostfile=MISSING, master_port=1234,
                                        image="img:1"))
    assert type(plain).__name__ == "DoctorOptions" and plain.master_port == 1234
    assert plain.image is not None and plain.image.image == "img:1"


@pytest.mark.parametrize("bad,option", [
    ({"iface": ["eth0", "no such"]}, "--iface"), ({"sort": "colour"}, "--sort"),
    ({"progress": "("}, "--progress"), ({"transport": "rsh"}, "--transport")])
def test_top_checks_each_option(bad: dict[str, object], option: str) -> None:
    with pytest.raises(UsageError, match=option):
        top_config(TopArgs(hostfile=MISSING, **bad))  # type: ignore[arg-type]


def test_top_request() -> None:
    req, _ = top_config(TopArgs(hostfile=MISSING, sort="cpu", reverse=True, iface=["ib0"],
                                no_gpu=True, straggler_ratio=3.0))
    assert (req.view.sort, req.view.reverse, req.ifaces, req.gpu) == ("cpu", True,
                                                                     ("ib0",), False)
    assert req.stragglers.ratio == 3.0


def test_push_checks_the_runtime() -> None:
    req, _ = push_config(PushArgs(hostfile=MISSING, image="img:1",
                                  container_runtime="podman"))
    assert (req.image, req.runtime) == ("img:1", "podman")
    with pytest.raises(UsageError):
        push_config(PushArgs(hostfile=MISSING, image="img:1", container_runtime="lxc"))



@pytest.mark.parametrize(("via", "remote"), [(None, ".cache/dtrain/images"), ("~", "."),
                                             ("~/imgs", "imgs"), ("/scratch/i", "/scratch/i"),
                                             ("rel/x", "rel/x")])
def test_push_via_names_the_nodes_directory(via: str | None, remote: str) -> None:
    req, _ = push_config(PushArgs(hostfile=MISSING, image="img:1", via=via))
    assert (req.via, req.remote_dir) == (via, remote)


@pytest.mark.parametrize("via", ["", "  ", "a\nb", "a\x00b"])
def test_push_via_refuses_what_is_no_directory(via: str) -> None:
    with pytest.raises(UsageError) as err:
        push_config(PushArgs(hostfile=MISSING, image="img:1", via=via))
    assert err.value.message == f"--via {via!r} is not a directory"


def test_tops_help_names_the_views_sort_columns() -> None:
    """cli/top.py spells the columns for --help (without importing the view)."""
    from launcher.cli.top import SORTS
    from launcher.commands.top.view import SORT_KEYS

    assert SORTS == ", ".join(SORT_KEYS)


def test_runs_help_default_hang_timeout_is_the_hang_watchs() -> None:
    from launcher.cli.run import DEFAULT_HANG_TIMEOUT
    from launcher.decide.outcome import hang

    assert DEFAULT_HANG_TIMEOUT == hang.DEFAULT_HANG_TIMEOUT
