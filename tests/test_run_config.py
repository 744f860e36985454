"""cli/runconfig.py: `dtrain run`'s command line into its request, without I/O (issue 35
item 4): the checks (exit 2 naming the option), the environment's layers in their order
with their sources, the command line redacted, and nothing read by the pure half."""

from __future__ import annotations

import pytest

from launcher.cli.runconfig import RunArgs, RunInputs, check_run_args, run_config
from launcher.errors import UsageError
from launcher.models import Host

HOSTS = (Host("n1"), Host("n2", env=(("HOST_SECRET", "hs-123"),)))


def _inputs(**kw: object) -> RunInputs:
    base: dict[str, object] = {"hosts": HOSTS, "default_workdir": "/work/proj",
                               "environ": {"FROM_SHELL": "shell-value"}}
    return RunInputs(**{**base, **kw})  # type: ignore[arg-type]


def test_nothing_is_read_the_inputs_are_given() -> None:
    """Every path option names a file that does not exist: only read_run_inputs opens
    them, so run_config decides from what it is given."""
    a = RunArgs(script="train.py", hostfile="/nonexistent/hosts", env_file="/nonexistent/e",
                topology="/nonexistent/topo", profile="/nonexistent/site.toml")
    req, opts, settings = run_config(a, _inputs(topology="SwitchName=s0 Nodes=n[1-2]\n",
                                                profile_env=None))
    assert (req.script, req.workdir, req.python) == ("train.py", "/work/proj", "python3")
    assert opts.checks.topology == "SwitchName=s0 Nodes=n[1-2]\n"
    assert opts.checks.profile_name == "site"
    assert settings.connect_timeout == 10.0


def test_the_environments_layers_stack_in_order_with_their_sources() -> None:
    """config [env] < .deepspeed_env < --env-file < --env (decide/runplan/netenv.user_env's order);
    --env NAME takes its value from the launcher's environment as given (not this
    process's)."""
    from launcher.decide.runplan.netenv import EnvLayer

    a = RunArgs(script="t.py", env=["A=from-cli", "FROM_SHELL"])
    req, _, _ = run_config(a, _inputs(
        config_env=EnvLayer((("A", "from-config"),), sources=(("A", "config c.toml:3"),)),
        deepspeed_env=EnvLayer((("B", "from-deepspeed"),), source="./.deepspeed_env"),
        env_file=EnvLayer((("A", "from-file"),), source="--env-file e.env")))
    assert list(req.env) == [("A", "from-cli"), ("B", "from-deepspeed"),
                             ("FROM_SHELL", "shell-value")]
    assert dict(req.env_sources) == {"A": "--env", "B": "./.deepspeed_env",
                                     "FROM_SHELL": "--env"}
    assert req.hidden_env == frozenset({"FROM_SHELL"})
    with pytest.raises(UsageError, match="NOT_SET is not set"):
        run_config(RunArgs(script="t.py", env=["NOT_SET"]), _inputs())


def test_the_command_is_kept_redacted() -> None:
    argv = ("run", "-H", "n[1-2]", "-e", "TOKEN=tok-456", "t.py", "--key", "tok-456")
    a = RunArgs(script="t.py", env=["TOKEN=tok-456"], args=["--key", "tok-456"])
    _, opts, _ = run_config(a, _inputs(argv=argv))
    assert opts.command[:3] == ("dtrain", "run", "-H")
    assert "tok-456" not in " ".join(opts.command), opts.command
    assert "hs-123" not in " ".join(opts.command)


@pytest.mark.parametrize(("args", "message"), [
    ({"offline": True}, "--offline plans without connecting"),
    ({"on_hang": "explode"}, "--on-hang"),
    ({"rdzv": "etcd"}, "--rdzv"),
    ({"require_fabric": "ib"}, "--require-fabric"),
    ({"progress": "step (\\d+"}, "--progress"),
    ({"nnodes": "3:1"}, "--nnodes"),
    ({"python": "python3\nrm -rf ~"}, "--python"),
])
def test_a_bad_option_is_named_before_anything_is_read(args: dict[str, object],
                                                       message: str) -> None:
    a = RunArgs(script="t.py", **args)  # type: ignore[arg-type]
    with pytest.raises(UsageError) as found:
        check_run_args(a)
    assert message in str(found.value) + (found.value.hint or "")
    with pytest.raises(UsageError):
        run_config(a, _inputs())


def test_the_hang_and_restart_policies_follow_the_options() -> None:
    _, opts, _ = run_config(RunArgs(script="t.py", restarts=2, nnodes="2:3",
                                    restart_backoff=0.5, hang_timeout=60), _inputs())
    assert opts.watch.hang.on_hang == "stop" and opts.watch.hang.timeout == 60  # --restarts: stop
    assert opts.watch.restart.restarts == 2 and opts.watch.restart.backoff == 0.5
    _, opts, _ = run_config(RunArgs(script="t.py"), _inputs())
    assert opts.watch.hang.on_hang == "dump" and opts.watch.restart.restarts == 0


def test_exec_config_checks_and_builds_without_reading() -> None:
    """`dtrain exec`'s pure half: the hostfile is not opened, the request and SSH settings
    come from the values alone, and a bad combination is exit 2 naming its options."""
    from launcher.cli.args import ExecArgs, exec_config

    a = ExecArgs(command=["hostname"], hostfile="/nonexistent/hosts", gather=True,
                 timeout=5.0, ssh_option=["ServerAliveInterval=5"])
    req, settings = exec_config(a)
    assert (req.command, req.gather, req.timeout, req.prefix) == (("hostname",), True, 5.0,
                                                                  True)
    assert req.container is None and settings.connect_timeout == 10.0
    for bad, words in ((ExecArgs(command=["x"], gather=True, no_prefix=True), "-N"),
                       (ExecArgs(command=["x"], gather=True, timestamps=True), "--timestamps"),
                       (ExecArgs(command=["x"], container_runtime="docker"), "--image"),
                       (ExecArgs(command=["x"], ssh_option=["bogus"]), "-o")):
        with pytest.raises(UsageError, match=words):
            exec_config(bad)
