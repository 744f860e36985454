"""`run --dry-run --offline`'s short form (issue 55): one screen for a few nodes.

The command once (what differs per node as ``<N>``, ``<NPROC>``, ``<PYTHON>``), one line
per node (its node rank, host, ranks, rank count and only the variables that differ per
node), the variables every node shares once, and what each node's supervisor adds by itself
once per reason. ``-v`` gives the full form (commands/run.render_plan: every node's block,
each variable with its source and reason); ``--json`` is the full plan either way.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

from launcher.decide.runplan.plan import NODE_DIR, LaunchPlan, NodePlan
from launcher.hosts.hostfile import fold
from launcher.nodeside.wire import SHIM_PLACEHOLDER
from launcher.text.words import count, rank_ranges

WIDTH = 100  # the short form's lines are wrapped here (a terminal's width, with margin)
FOLD_NODES = 16  # from this many nodes on, nodes alike but for their rank are one line
_PLACEHOLDER = {"--node-rank": "<N>", "--nproc-per-node": "<NPROC>"}


def wrap(first: str, words: Iterable[str], indent: str = "    ",
         width: int = WIDTH) -> list[str]:
    """``first`` then ``words``, wrapped at ``width`` with ``indent`` on the lines after."""
    lines, line = [], first
    for word in words:
        if len(line) + 1 + len(word) > width and line.strip():
            lines.append(line + "\n")
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line + "\n"]


def _argv(plan: LaunchPlan, node: NodePlan) -> list[str]:
    words = [shlex.quote(w) for w in plan.shown_argv(node)]
    return [("<dtrain-rank-shim>" if w == shlex.quote(SHIM_PLACEHOLDER) else w) for w in words]


def _var(name: str, value: str, exported: bool = True) -> str:
    shown = value if value in ("***", "<N>") else shlex.quote(value)
    return f"{name}={shown}" + ("" if exported else "(not exported)")


def _added_value(value: str) -> str:
    # the node's private dir is a placeholder (its path is made there): shown as is
    if "@" in value:
        return shlex.quote(value)
    return shlex.quote(value.replace(NODE_DIR, "@")).replace("@", NODE_DIR)


def short_lines(plan: LaunchPlan) -> list[str]:
    """The nodes' part of the short dry run (the header lines are render_plan's)."""
    nodes = list(plan.nodes)
    argvs = [_argv(plan, n) for n in nodes]
    same_shape = len({len(a) for a in argvs}) == 1
    command = list(argvs[0])
    per_node: dict[int, list[str]] = {n.node_rank: [] for n in nodes}
    if same_shape:
        for i in range(len(command)):
            if len({a[i] for a in argvs}) == 1:
                continue
            before = command[i - 1] if i else ""
            command[i] = _PLACEHOLDER.get(before, "<PYTHON>" if i == 0 else f"<ARG{i}>")
            if before in _PLACEHOLDER:
                continue  # the node line's own columns
            for n, a in zip(nodes, argvs, strict=True):
                per_node[n.node_rank].append(
                    f"python {a[i]}" if i == 0 else f"{command[i]}={a[i]}")
    out = wrap("command on every node:", command)
    # the variables: shared (same shown value everywhere) once, the rest on the node lines
    shown = [plan.shown_env(n) for n in nodes]
    seen: dict[str, set[tuple[str, bool]]] = {}
    for n, env in zip(nodes, shown, strict=True):
        for v in n.env:
            seen.setdefault(v.name, set()).add((env[v.name], v.exported))
    shared = [name for name, values in seen.items()
              if len(values) == 1 and all(name in env for env in shown)]
    rank_var = "DTRAIN_NODE_RANK"
    lines = []
    for n, env, a in zip(nodes, shown, argvs, strict=True):
        own = [_var(v.name, env[v.name], v.exported) for v in n.env
               if v.name not in shared and v.name != rank_var]
        if not same_shape:
            own.append("command: " + " ".join(a))
        ranks = rank_ranges(n.ranks)
        lines.append((n, f"node {n.node_rank}  {n.host.label}  ranks {ranks}  "
                         f"nproc {n.nproc}", [*per_node[n.node_rank], *own]))
    out.append("\n")
    out += _node_lines(lines)
    first = nodes[0]
    common = [_var(v.name, "<N>" if v.name == rank_var else shown[0][v.name], v.exported)
              for v in first.env if v.name in shared or v.name == rank_var]
    out += wrap("env on every node:", common)
    added = [n.node_added() for n in nodes]
    if added[0] and all(a == added[0] for a in added):
        reasons: dict[str, list[str]] = {}
        for v in added[0]:
            why = v.reason.rsplit(": ", 1)[-1]
            reasons.setdefault(why, []).append(f"{v.name}={_added_value(v.value)}")
        for why, words in reasons.items():
            out += wrap(f"added unless set on the node ({why}):", words)
    elif any(added):
        out.append("added on each node unless its own environment sets them: differs per "
                   "node (-v)\n")
    out.append("-v: every node's block, each variable with its source and reason\n")
    return out


def _node_lines(lines: Sequence[tuple[NodePlan, str, list[str]]]) -> list[str]:
    """One line per node; from FOLD_NODES nodes on, the nodes with nothing of their own
    and the same rank count are one line."""
    out: list[str] = []
    alike = [(n, head) for n, head, own in lines if not own]
    fold_them = len(lines) >= FOLD_NODES and len({n.nproc for n, _ in alike}) == 1 \
        and len(alike) > 1
    folded = False
    for n, head, own in lines:
        if fold_them and not own:
            if not folded:
                folded = True
                members = [m for m, _ in alike]
                out.append(f"nodes {rank_ranges(m.node_rank for m in members)}  "
                           f"{fold(m.host.label for m in members)}  ranks "
                           f"{rank_ranges(r for m in members for r in m.ranks)} "
                           f"({n.nproc} each; {count(len(members), 'node')} alike: only the "
                           f"node rank differs, {members[0].node_rank} to "
                           f"{members[-1].node_rank})\n")
            continue
        out += wrap(head + " ", own, indent="    ") if own else [head + "\n"]
        out += [f"  warning: {w}\n" for w in n.warnings]
    return out
