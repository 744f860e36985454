"""The option groups every command shares, declared once: each group is its options (typer
``Annotated`` aliases carrying their help panel and metavar) and its checks (the function a
command calls with those options' values). A command lists the aliases it needs as
parameters and calls the group's function; the panels are what `--help` shows
(launcher/cli/helptext.py renders them in PANEL_ORDER).

- hosts: ``-f/--hostfile``, ``-H/--hosts`` (pdsh's ``-w``), ``--include``, ``--exclude``
  (pdsh's ``-x``) → :func:`hosts`
- connection: ``--fanout``, ``--connect-timeout``, ``--accept-new``, ``--transport`` →
  :func:`connection`
- node: ``--python`` (with its value check), ``--setup``, ``--workdir`` → :func:`node`
- environment: ``-e/--env``, ``--env-file``
- display: ``--color``, ``--raw``, ``--timestamps``, the ``--host``/``--rank``/``--grep``
  filters → :func:`rank_filter`, :func:`host_filter`
- reports: ``--json``, ``--junit``
- archive: ``--archive-dir``, ``--run-id``
- failure: ``--grace``, ``--timeout``, ``--heartbeat-timeout``, ``--start-timeout``

Nothing heavy is imported at module level (the CLI's startup is measured:
tests/test_cli_lean.py); the checks import what they need when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import typer

from launcher.cli.completion import complete_hostfile
from launcher.cli.defaults import from_config

HOSTS = "Hosts"
CONNECTION = "Connection"
NODE = "Node"
ENVIRONMENT = "Environment"
LAUNCH = "Launch"
FAILURE = "Failure and time limits"
WATCH = "Watching"
DISPLAY = "Display"
REPORTS = "Reports"
ARCHIVE = "Archive"
CONTAINER = "Container"
# the everyday groups first; --image and its kin (a few runs use them) after them
PANEL_ORDER = (HOSTS, CONNECTION, NODE, ENVIRONMENT, LAUNCH, FAILURE, WATCH, DISPLAY,
               REPORTS, ARCHIVE, CONTAINER)

# old or foreign spellings that still work but are not shown in --help
HIDDEN_NAMES = frozenset({"--hosts-filter", "--ranks",
                          # torchrun's and DeepSpeed's spellings (docs/cli.md)
                          "--nproc_per_node", "--num_gpus", "--num-gpus", "--num_nodes",
                          "--num-nodes", "--master_addr", "--master_port", "--max_restarts"})

# ---------------------------------------------------------------------------------- hosts

HostfileOpt = Annotated[str | None, typer.Option(
    "-f", "--hostfile", envvar="DTRAIN_HOSTFILE", show_envvar=True, metavar="FILE",
    autocompletion=complete_hostfile, rich_help_panel=HOSTS,
    help="Hostfile: text (`[user@]host[:port] slots=N`, ranges like gpu[01-16]) or YAML. "
         "pdsh's WCOLL is read when neither -f nor -H is given.")]
HostsOpt = Annotated[str | None, typer.Option(
    "-H", "--hosts", "-w", metavar="HOSTS", rich_help_panel=HOSTS,
    help="Hosts, pdsh style (-w works too): dtuser@node[1-4],login2:2222; ^FILE: a file "
         "of hosts, one a line; -: the same from stdin.")]
IncludeOpt = Annotated[str | None, typer.Option(
    "--include", metavar="HOSTS", rich_help_panel=HOSTS,
    help="Keep only these hosts (a hostlist expression); run also takes DeepSpeed's "
         "HOST:GPU,GPU@HOST form, which sets CUDA_VISIBLE_DEVICES on those hosts.")]
ExcludeOpt = Annotated[str | None, typer.Option(
    "--exclude", "-x", metavar="HOSTS", rich_help_panel=HOSTS,
    help="Drop these hosts (pdsh's -x); run also takes DeepSpeed's HOST:GPU form, which "
         "leaves those GPUs out.")]
GroupOpt = Annotated[str | None, typer.Option(
    "-g", "--group", metavar="GROUP", rich_help_panel=HOSTS,
    help="Only the hosts in this group (pdsh's -g): a YAML hostfile's groups: or a genders "
         "attribute (attr or attr=value; several: any of them). Without -f/-H: the genders "
         "file's nodes in the group.")]
ExcludeGroupOpt = Annotated[str | None, typer.Option(
    "-X", "--exclude-group", metavar="GROUP", rich_help_panel=HOSTS,
    help="Drop the hosts in this group (pdsh's -X).")]
GendersOpt = Annotated[str | None, typer.Option(
    "--genders", envvar="DTRAIN_GENDERS", show_envvar=True, metavar="FILE",
    rich_help_panel=HOSTS,
    help="The genders file -g/-X read (pdsh's -F; default /etc/genders when it exists).")]


def _from_environment(name: str) -> bool:
    """Whether the current command's option ``name`` took its value from its envvar."""
    from typer._click import core
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    while ctx is not None:
        if name in ctx.params:
            return ctx.get_parameter_source(name) is core.ParameterSource.ENVIRONMENT
        ctx = ctx.parent
    return False


def hosts(hostfile: str | None, hosts: str | None, include: str | None,
          exclude: str | None, *, user: str | None = None, group: str | None = None,
          exclude_group: str | None = None, genders: str | None = None) -> list[Any]:
    """The hosts the options name (exit 2 with the hostfile's line for bad input), from the
    one source ``hosts/sources.host_source`` picks (-H, -f, DTRAIN_HOSTFILE, WCOLL, Slurm,
    -g's genders file, the config's hostfile); ``-l USER`` the user of every host that names
    none. -f's value from $DTRAIN_HOSTFILE (typer's envvar) is left to that order, so -H
    wins over it as docs/hostfiles.md says."""
    import os

    from launcher.cli.defaults import config_hostfile
    from launcher.hosts.hostfile import resolve_hosts, with_user

    if hostfile is not None and _from_environment("hostfile"):
        hostfile = None  # $DTRAIN_HOSTFILE: host_source reads it, below -f and -H
    if hostfile is not None and hostfile.isdigit() and not os.path.exists(hostfile):
        from launcher.errors import UsageError

        raise UsageError(f"-f {hostfile}: dtrain's -f is the hostfile (-f FILE); pdsh's "
                         "-f is the fan-out, which dtrain spells --fanout",
                         hint=f"--fanout {hostfile}")

    def warn(message: str) -> None:
        from launcher.output import render

        render.note(f"warning: {message}")

    found = resolve_hosts(hostfile=hostfile, hosts=hosts, include=include, exclude=exclude,
                          group=group, exclude_group=exclude_group, genders=genders,
                          user=login_user(user), warn=warn, config_hostfile=config_hostfile)
    return with_user(found, login_user(user))


def warn_secret_env(items: Sequence[str] | None, option: str = "--env") -> list[str]:
    """Warn (never failing, never echoing the value) for each secret-looking name given as
    ``--env NAME=VALUE``: the value is on dtrain's command line, which every user of the
    machine sees in ``ps`` and the shell keeps in its history. The names warned about."""
    from launcher.output import render
    from launcher.text.redact import is_secret_name

    names = list(dict.fromkeys(name for name, sep, _ in (i.partition("=") for i in items or [])
                               if sep and is_secret_name(name)))
    for name in names:
        render.note(f"warning: {option} {name}=... puts a secret on the command line, where "
                    f"every user of this machine sees it (ps) and your shell keeps it: "
                    f"export {name}=... and give {option} {name} (the value is then read "
                    "from the environment), or use --env-file")
    return names


def login_user(user: str | None) -> str | None:
    """``-l USER`` checked (a value a node's shell would mangle is exit 2)."""
    if user:
        from launcher.nodeside.wire import check_value

        check_value(user, "-l/--user")
    return user


# ----------------------------------------------------------------------------- connection

FanoutOpt = Annotated[int, typer.Option(
    "--fanout", min=1, metavar="N", rich_help_panel=CONNECTION,
    help="Connections opened at once (pdsh's -f; dtrain's -f is the hostfile).")]
ConnectTimeoutOpt = Annotated[float, typer.Option(
    "--connect-timeout", "-t", min=0.1, metavar="SECONDS", rich_help_panel=CONNECTION,
    help="Seconds to connect to one node (pdsh's -t).")]
UserOpt = Annotated[str | None, typer.Option(
    "-l", "--user", metavar="USER", rich_help_panel=CONNECTION,
    help="Log in as USER where the host names no user (pdsh's and ssh's -l).")]
SshOptionOpt = Annotated[list[str] | None, typer.Option(
    "-o", "--ssh-option", metavar="OPTION", rich_help_panel=CONNECTION,
    help="An ssh_config option for every connection, as ssh -o takes it (-o Port=2222, "
         "-o ProxyJump=login); wins over ~/.ssh/config. Repeatable.")]
TransportOpt = Annotated[str, typer.Option(
    "--transport", envvar="DTRAIN_TRANSPORT", show_envvar=True, metavar="KIND",
    rich_help_panel=CONNECTION,
    help="ssh, srun, or auto: srun inside a Slurm allocation (srun on PATH, every host one "
         "of its nodes), SSH otherwise.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new", rich_help_panel=CONNECTION,
    help="Record unknown host keys in ~/.ssh/known_hosts (never changed ones).")]
PersistOpt = Annotated[str | None, typer.Option(
    "--persist", envvar="DTRAIN_PERSIST", show_envvar=True, metavar="DURATION",
    rich_help_panel=CONNECTION, callback=from_config("persist"),
    help="Keep connections warm in a per-user keeper for this long when idle (10m, 1h; "
         "off), as ssh's ControlPersist: later commands skip the handshake "
         "(docs/connections.md).")]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", rich_help_panel=CONNECTION,
    help="Say how nodes were reached (e.g. when the connection keeper was not used).")]


def connection(connect_timeout: float, accept_new: bool, ssh_option: list[str] | None = None,
               persist: str | None = None, verbose: bool = False, **extra: Any) -> Any:
    """The SSH settings the connection options make (a bad -o or --persist is exit 2)."""
    from launcher.transports.keeper.frames import parse_persist
    from launcher.transports.ssh.settings import SSHSettings
    from launcher.transports.ssh.settings import ssh_option as parse

    try:
        extra["persist"] = parse_persist(persist)
    except ValueError as exc:
        from launcher.errors import UsageError

        raise UsageError(f"--persist {persist!r}: {exc}") from None
    extra["verbose"] = verbose

    options = []
    for text in ssh_option or ():
        try:
            options.append(parse(text))
        except ValueError as exc:
            from launcher.errors import UsageError

            raise UsageError(f"-o {text!r}: {exc}") from None
    return SSHSettings(connect_timeout=connect_timeout, accept_new=accept_new,
                       options=tuple(options), **extra)


def check_transport(transport: str) -> str:
    from launcher.errors import UsageError

    if transport not in ("auto", "ssh", "srun"):
        raise UsageError(f"--transport {transport!r}: use ssh, srun or auto")
    return transport


# ----------------------------------------------------------------------------------- node

def python_opt(what: str, callback: Any = None) -> Any:
    """``--python`` with this command's wording (the check is :func:`node`)."""
    return typer.Option("--python", metavar="PYTHON", rich_help_panel=NODE, help=what,
                        callback=callback)


PythonOpt = Annotated[str, python_opt("Python on the nodes (a host's python= key wins; "
                                      "default: the user config's, else python3).",
                                      from_config("python"))]
SupervisorPythonOpt = Annotated[str, python_opt("Interpreter for dtrain's node program (any "
                                                "Python >= 3.8).")]
SetupOpt = Annotated[str | None, typer.Option(
    "--setup", metavar="SHELL", rich_help_panel=NODE, callback=from_config("setup"),
    help="Shell snippet run first on each node (source venv/bin/activate).")]
WorkdirOpt = Annotated[str | None, typer.Option(
    "--workdir", metavar="DIR", rich_help_panel=NODE, callback=from_config("workdir"),
    help="Remote working directory (default: the current one).")]


def node(python: str, workdir: str | None = None, *, default_workdir: str | None = None
         ) -> str | None:
    """Check --python (and --workdir, or the current directory it defaults to): a value a
    node's shell would mangle is exit 2 here. Returns the working directory to use."""
    from launcher.nodeside.wire import check_value

    check_value(python, "--python", python=True)
    if workdir:
        return check_value(workdir, "--workdir")
    if default_workdir is not None:
        return check_value(default_workdir, "the current directory (the default --workdir)")
    return None


# ------------------------------------------------------------------------------ container

ImageOpt = Annotated[str | None, typer.Option(
    "--image", metavar="IMAGE", rich_help_panel=CONTAINER, callback=from_config("image"),
    help="Run inside this image on every node (docs/containers.md); each node must have it "
         "with the same digest (dtrain image push).")]
ContainerRuntimeOpt = Annotated[str | None, typer.Option(
    "--container-runtime", metavar="podman|docker|enroot|apptainer",
    rich_help_panel=CONTAINER, callback=from_config("container_runtime"),
    help="Which runtime (default: the node's first of podman, docker, enroot, apptainer).")]
MountOpt = Annotated[list[str] | None, typer.Option(
    "--mount", metavar="SRC:DST[:ro]", rich_help_panel=CONTAINER,
    help="Also mount SRC at DST inside (repeatable).")]
ContainerArgOpt = Annotated[list[str] | None, typer.Option(
    "--container-arg", metavar="ARG", rich_help_panel=CONTAINER,
    help="One more word for the runtime's command, before the image (repeatable).")]


def container(image: str | None, runtime: str | None, mounts: list[str] | None,
              args: list[str] | None) -> Any:
    """The ContainerRequest (None without --image); bad values: exit 2 here."""
    from launcher.errors import UsageError

    if not image:
        if runtime or mounts or args:
            raise UsageError("--container-runtime, --mount and --container-arg go with "
                             "--image", hint="add --image IMAGE")
        return None
    from launcher.decide.runplan.container import ContainerRequest, parse_mount

    return ContainerRequest(image=image, runtime=runtime,
                            mounts=tuple(parse_mount(m) for m in mounts or ()),
                            args=tuple(args or ()))


# ---------------------------------------------------------------------------- environment

EnvOpt = Annotated[list[str] | None, typer.Option(
    "--env", "-e", metavar="K=V|NAME", rich_help_panel=ENVIRONMENT,
    help="K=V for every rank, or NAME alone: its value from this environment (use that or "
         "--env-file for secrets: a command line shows in ps). Repeatable; wins over site "
         "config.")]
EnvFileOpt = Annotated[str | None, typer.Option(
    "--env-file", metavar="FILE", rich_help_panel=ENVIRONMENT,
    help="dotenv file (NAME=VALUE lines); the way to pass many secrets.")]

DEEPSPEED_ENV = ".deepspeed_env"


def deepspeed_env(cwd: str = ".", home: str = "~") -> tuple[list[tuple[str, str]],
                                                             dict[str, str]]:
    """DeepSpeed's ``.deepspeed_env`` (KEY=VAL lines) for every rank, as DeepSpeed reads it:
    the current directory's, else the home directory's (``DS_ENV_FILE`` names another).
    (pairs, {name: source}); --env-file and --env win over it."""
    import os
    from pathlib import Path

    from launcher.hosts.envfile import load_env_file

    named = os.environ.get("DS_ENV_FILE")
    candidates = [Path(named)] if named else [Path(cwd) / DEEPSPEED_ENV,
                                              Path(home).expanduser() / DEEPSPEED_ENV]
    for path in candidates:
        if path.is_file():
            pairs = load_env_file(str(path))
            shown = str(path) if named else (f"./{DEEPSPEED_ENV}" if path.parent == Path(cwd)
                                             else f"~/{DEEPSPEED_ENV}")
            return pairs, {name: shown for name, _ in pairs}
    return [], {}


# -------------------------------------------------------------------------------- failure

GraceOpt = Annotated[float, typer.Option(
    "--grace", min=0, metavar="SECONDS", rich_help_panel=FAILURE,
    help="TERM -> KILL delay when stopping.")]
TimeoutOpt = Annotated[float | None, typer.Option(
    "--timeout", min=0.1, metavar="SECONDS", rich_help_panel=FAILURE,
    help="Whole job limit in seconds (exit 124).")]
StartTimeoutOpt = Annotated[float, typer.Option(
    "--start-timeout", min=1, metavar="SECONDS", rich_help_panel=FAILURE,
    help="Seconds for every node to start its job (exit 124, node named).")]
HeartbeatTimeoutOpt = Annotated[float, typer.Option(
    "--heartbeat-timeout", min=1, metavar="SECONDS", rich_help_panel=FAILURE,
    help="Declare a silent node lost after this many seconds (exit 255).")]

# -------------------------------------------------------------------------------- display

ColorOpt = Annotated[bool | None, typer.Option(
    "--color/--no-color", rich_help_panel=DISPLAY,
    help="Force colours on or off (default: on a terminal).")]
RawOpt = Annotated[bool, typer.Option(
    "--raw", rich_help_panel=DISPLAY,
    help="Pass the nodes' bytes to the terminal as they are (default: only colours pass, "
         "other control sequences are shown as ^[ ...).")]
TimestampsOpt = Annotated[bool, typer.Option(
    "--timestamps", rich_help_panel=DISPLAY,
    help="Start each output line with the time dtrain received it (2026-11-30T12:34:56.789, "
         "local time).")]
HostFilterOpt = Annotated[list[str] | None, typer.Option(
    "--host", "--hosts-filter", metavar="HOSTS", rich_help_panel=DISPLAY,
    help="Show only these hosts (a hostlist expression: node[1-2],node4; repeatable).")]
RankFilterOpt = Annotated[list[str] | None, typer.Option(
    "--rank", "--ranks", metavar="RANKS", rich_help_panel=DISPLAY,
    help="Show only these ranks (0-3,7; repeatable).")]
GrepOpt = Annotated[str | None, typer.Option(
    "--grep", metavar="REGEX", rich_help_panel=DISPLAY, help="Only lines matching.")]


def rank_filter(rank: list[str] | None, option: str = "--rank") -> frozenset[int] | None:
    """--rank 0-3,7 (repeatable) as a set (None: no filter); bad input is exit 2."""
    if not rank:
        return None
    from launcher.decide.copies.filters import parse_ranks

    return parse_ranks(",".join(rank), option)


def host_filter(host: list[str] | None, labels: Any) -> frozenset[str] | None:
    """--host node[1-2] (repeatable) as the labels of those of ``labels`` (the run's hosts);
    a name that is not one of them is exit 2, naming the known ones."""
    if not host:
        return None
    from launcher.decide.copies.filters import select_hosts

    return select_hosts(",".join(host), list(labels))


# -------------------------------------------------------------------------------- reports

def json_opt(what: str) -> Any:
    """``--json`` with this command's schema named: ``Annotated[bool, json_opt(...)]``."""
    return typer.Option("--json", rich_help_panel=REPORTS, help=what)


def junit_opt(what: str = "Write the result as JUnit XML to this file.") -> Any:
    """``--junit FILE``: ``Annotated[str | None, junit_opt(...)]``."""
    return typer.Option("--junit", metavar="FILE", rich_help_panel=REPORTS, help=what)


JunitOpt = Annotated[str | None, junit_opt()]

# -------------------------------------------------------------------------------- archive

# shown in --help; the callback replaces it by the config's archive_dir or the per-user
# state directory's runs/ (hosts/userconfig.py)
DEFAULT_ARCHIVE_DIR = "~/.local/state/dtrain/runs"
ArchiveDirOpt = Annotated[str, typer.Option(
    "--archive-dir", envvar="DTRAIN_ARCHIVE_DIR", show_envvar=True, metavar="DIR",
    rich_help_panel=ARCHIVE, callback=from_config("archive_dir"),
    help="Where run archives are (default: the user config's archive_dir, else "
         "$XDG_STATE_HOME/dtrain/runs).")]
RunIdOpt = Annotated[str | None, typer.Option(
    "--run-id", metavar="ID", rich_help_panel=ARCHIVE, help="Name the run.")]


def archive_hint(archive_dir: str) -> str:
    """The ``--archive-dir`` to repeat in a suggested command ('' for the default)."""
    import os
    import shlex

    from launcher.cli.defaults import sources

    if sources().get("archive_dir") != "--archive-dir" or \
            os.environ.get("DTRAIN_ARCHIVE_DIR") == archive_dir:
        return ""  # found again without it (the env var, the config, the default)
    return f" --archive-dir {shlex.quote(os.path.abspath(archive_dir))}"
