"""CLI for the test cluster.

python -m tests.cluster up [--nodes N] [--shrink] | down [--purge] | status
python -m tests.cluster exec [-u USER] K [-- CMD...]
python -m tests.cluster slurm up|down|status   (tests/cluster/slurm.py)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tests import cluster as tc


def _status(state_dir: Path) -> int:
    c = tc.load(state_dir)
    if c is None:
        print(f"no cluster recorded in {state_dir}")
        return 3
    ok_all = True
    print(f"{'node':<8} {'ip':<14} {'ifname':<8} {'ns':<6} {'sshd pid':>8}  state")
    for n in c.nodes:
        pid = tc.sshd_pid(n.index, state_dir)
        ok = pid is not None and tc._banner(n.ip)
        ok_all &= ok
        print(f"{n.name:<8} {n.ip:<14} {n.ifname:<8} {n.ns:<6} {pid or '-':>8}  "
              f"{'up' if ok else 'DOWN'}")
    print(f"\nuser {c.user} (password in {state_dir}/password), python {c.python}")
    print(f"by hand:  ssh -F {c.ssh_config} node1        (alt1 = same node, port {tc.ALT_PORT})")
    print(f"dtrain:   HOME={c.client_home} dtrain ...     (asyncssh reads $HOME/.ssh)")
    print("inside:   python -m tests.cluster exec 1 -- hostname")
    return 0 if ok_all else 1


def _slurm(action: str, state_dir: Path) -> int:
    from tests.cluster import slurm

    if action == "status":
        return slurm.status(state_dir)
    if action == "down":
        slurm.down(state_dir)
        return 0
    t0 = time.monotonic()
    s = slurm.up(state_dir)
    print(f"slurm up in {time.monotonic() - t0:.2f}s: {len(s.nodes)} nodes; "
          f"export SLURM_CONF={s.conf}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=tc.DEFAULT_STATE_DIR)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build or repair the cluster (idempotent)")
    p_up.add_argument("--nodes", "-n", type=int, default=4)
    p_up.add_argument("--shrink", action="store_true",
                      help="remove nodes above N left by an earlier, larger up")
    p_down = sub.add_parser("down", help="stop nodes, remove namespaces and bridge")
    p_down.add_argument("--purge", action="store_true", help="also delete the state dir")
    sub.add_parser("status", help="show nodes and whether their sshd answers")
    p_exec = sub.add_parser("exec", help="run a command inside node K (as dtuser)")
    p_exec.add_argument("node", type=int)
    p_exec.add_argument("--user", "-u", default=tc.USER)
    p_slurm = sub.add_parser("slurm", help="munged + slurmctld + one slurmd per node")
    p_slurm.add_argument("action", choices=("up", "down", "status"))
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    try:
        if args.cmd == "up":
            t0 = time.monotonic()
            c = tc.up(args.nodes, args.state_dir, shrink=args.shrink)
            print(f"{len(c.nodes)} nodes up in {time.monotonic() - t0:.2f}s "
                  f"({c.nodes[0].ip}..{c.nodes[-1].ip}); state in {c.state_dir}")
            return 0
        if args.cmd == "down":
            tc.down(args.state_dir, purge=args.purge)
            return 0
        if args.cmd == "status":
            return _status(args.state_dir)
        if args.cmd == "slurm":
            return _slurm(args.action, args.state_dir)
        host_argv = tc.node_command(args.node, command or ["bash", "-l"], args.user,
                                    state_dir=args.state_dir)
        os.execvp(host_argv[0], host_argv)
    except tc.ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
