"""`dtrain top`: the cluster and a run at a glance, live; the slow node named."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher import defaults
from launcher.cli import groups
from launcher.cli.common import run_body
from launcher.cli.completion import complete_run_id
from launcher.cli.groups import (
    DEFAULT_ARCHIVE_DIR,
    AcceptNewOpt,
    ArchiveDirOpt,
    ConnectTimeoutOpt,
    ExcludeOpt,
    FanoutOpt,
    HostfileOpt,
    HostsOpt,
    IncludeOpt,
    TransportOpt,
)
from launcher.cli.watching import StragglerHoldOpt, StragglerRatioOpt, StragglerWindowOpt

TOP = "View"
# commands/top/view.SORT_KEYS, spelled here: --help must not import the view
SORTS = "node, state, cpu, load, mem, net, util, gmem, temp, power, last, busy"


def top_cmd(
    run: Annotated[str | None, typer.Argument(
        autocompletion=complete_run_id,
        help="A run (id, unique prefix or directory) to follow: its ranks, step rate and "
             "stragglers beside each node. Its hosts, unless -f/-H names others.")] = None,
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    archive_dir: ArchiveDirOpt = DEFAULT_ARCHIVE_DIR,
    interval: Annotated[float, typer.Option(
        "--interval", min=0.2, max=60, metavar="SECONDS", rich_help_panel=TOP,
        help="Seconds between samples and redraws.")
                        ] = 1.0,
    once: Annotated[bool, typer.Option("--once", rich_help_panel=TOP,
                                       help="Print one plain snapshot and exit "
                                            "(0: every node answered, 255: some did not).")
                    ] = False,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel=groups.REPORTS,
                                          help="A stream of dtrain.top/1 documents, "
                                               "one JSON line per interval (with --once: one).")
                       ] = False,
    count: Annotated[int | None, typer.Option("--count", min=1, metavar="N", rich_help_panel=TOP,
                                              help="Stop after N snapshots "
                                                   "(--json or a pipe).")] = None,
    sort: Annotated[str, typer.Option("--sort", metavar="COLUMN", rich_help_panel=TOP,
                                      help=f"Sort column: {SORTS}.")] = "node",
    reverse: Annotated[bool, typer.Option("--reverse", rich_help_panel=TOP,
                                          help="Reverse the sort.")] = False,
    filter_: Annotated[str, typer.Option("--filter", metavar="HOSTS", rich_help_panel=TOP,
                                         help="Only hosts matching: a substring, "
                                              "a glob or a folded set (node[1-8]).")] = "",
    fold: Annotated[bool, typer.Option("--fold", rich_help_panel=TOP,
                                       help="Fold nodes that look the same into one "
                                            "row (node[01-60] (60) ... idle).")] = False,
    per_gpu: Annotated[bool, typer.Option("--per-gpu", rich_help_panel=TOP,
                                          help="A row per GPU under each node (the live "
                                               "view's key g).")] = False,
    iface: Annotated[list[str] | None, typer.Option(
        "--iface", metavar="IFACE", rich_help_panel=TOP,
        help="Network interface for NET rx/tx (repeatable; default: a run's "
             "NCCL/GLOO interface, else the one towards this machine).")] = None,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", rich_help_panel=TOP,
                                         help="Do not start nvidia-smi on the "
                                              "nodes.")] = False,
    straggler_window: StragglerWindowOpt = 30.0,
    straggler_hold: StragglerHoldOpt = 30.0,
    straggler_ratio: StragglerRatioOpt = 2.0,
    progress: Annotated[str | None, typer.Option(
        "--progress", metavar="REGEX", rich_help_panel=groups.WATCH,
        help="REGEX: a run's progress lines, for its step rate (default: the "
             "one hang detection uses: step, iteration, epoch, loss lines and "
             "progress bars).")] = None,
    fanout: FanoutOpt = defaults.FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    persist: groups.PersistOpt = None,
    verbose: groups.VerboseOpt = False,
    transport: TransportOpt = "auto",
    python: groups.SupervisorPythonOpt = "python3",
    color: groups.ColorOpt = None,
) -> None:
    """Every node's GPUs, CPU, memory and network, live; for a run also its ranks, step rate
    and stragglers. Keys: s sort, r reverse, / filter, f fold, g a row per GPU, q quit.

    On a terminal a full-screen view; piped, plain snapshots; --once one snapshot; --json
    a stream of dtrain.top/1 documents (docs/top.md).

    Example:

      dtrain top -f hosts --fold
    """
    values = dict(locals())  # every parameter, as typer parsed it (configs.TopArgs)

    def body() -> int:
        from pathlib import Path

        from launcher.cli.configs import TopArgs, top_config
        from launcher.commands.top import latest_live_run, run_top, run_top_for_run
        from launcher.errors import HostfileError

        a = TopArgs.of(values)
        req, settings = top_config(a)  # every check before the host list is read
        target = a.run
        named = a.hostfile is not None or a.hosts is not None  # else a run's own hosts
        host_list = None
        if target is None and not named and a.group is None:
            # no RUN and no hosts on the command line: the latest running run comes before
            # the default hosts (the config's hostfile, WCOLL, a Slurm allocation)
            target = latest_live_run(Path(a.archive_dir))
        try:
            if target is None or named:
                host_list = a.read_hosts()
        except HostfileError:
            if named or a.group is not None:
                raise
            raise HostfileError("no hosts given and no running run in "
                                f"{a.archive_dir}", hint="use -f FILE or -H EXPR, or name "
                                "a run: dtrain top RUN") from None
        if target is not None:
            return run_top_for_run(Path(a.archive_dir), target, req, settings, hosts=host_list,
                                   include=a.include, exclude=a.exclude,
                                   user=groups.login_user(a.user))
        assert host_list is not None
        return run_top(host_list, req, settings)

    run_body(body)
