"""Pure: rank order by topology, and the spare for a fenced node (issue 36 item 4).

Where each node sits: its leaf switch, its segment (the switch above, or a hostfile's
``segment=``) and its NVLink domain (nvidia-smi's ClusterUUID, where present). Sources, in
this order: the hostfile's ``switch=`` / ``segment=`` keys, Slurm's topology.conf
(``SwitchName=s0 Nodes=node[1-4]``; ``SwitchName=s9 Switches=s[0-1]`` makes s9 the segment
of s0 and s1), the ClusterUUID. ``order`` keeps nodes that share a domain, then a switch,
then a segment next to each other (groups in order of first appearance, nodes in the given
order inside a group; nodes with no topology last), so that ring neighbours share the
closest link; ``spare_for`` picks a spare from the fenced node's switch, else its segment.
`run` orders by the hostfile's keys and ``--topology``'s topology.conf before connecting
(commands/run.py ``place``), and again once the probe said each node's NVLink domain
(``after_probe``, job/prepare.py ``Prepared.plan``); a restart's spare comes from
``spare_for`` (docs/fabric.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.hosts.slurm_hostlist import expand
from launcher.models import Host

MAX_NODES = 65536


@dataclass(frozen=True)
class Place:
    switch: str | None = None
    segment: str | None = None
    nvlink: str | None = None  # the NVLink domain (ClusterUUID)
    source: str = ""  # "hostfile", "topology.conf", "nvlink"

    def words(self) -> str:
        parts = [f"NVLink domain {self.nvlink}" if self.nvlink else "",
                 f"switch {self.switch}" if self.switch else "",
                 f"segment {self.segment}" if self.segment else ""]
        return ", ".join(p for p in parts if p)


def parse_topology_conf(text: str, source: str = "topology.conf") -> dict[str, Place]:
    """Slurm's topology.conf (tree plugin), or ``scontrol show topology``'s lines (the same
    keys, plus Level= and LinkSpeed=) -> each node's leaf switch and segment (the first
    switch that lists its leaf under ``Switches=``). Bad lines are skipped."""
    leaves: dict[str, list[str]] = {}
    parents: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {}
        for word in line.split():
            key, _, value = word.partition("=")
            fields[key.lower()] = value
        name = fields.get("switchname")
        if not name:
            continue
        try:
            if fields.get("nodes"):
                leaves[name] = expand(fields["nodes"], MAX_NODES)
            if fields.get("switches"):
                for child in expand(fields["switches"], MAX_NODES):
                    parents.setdefault(child, name)
        except ValueError:
            continue
    out: dict[str, Place] = {}
    for switch, nodes in leaves.items():
        for node in nodes:
            out.setdefault(node, Place(switch, parents.get(switch), None, source))
    return out


def merge(*sources: Mapping[str, Place]) -> dict[str, Place]:
    """Per node, the first source's switch/segment (hostfile before topology.conf), and
    any source's NVLink domain."""
    out: dict[str, Place] = {}
    for src in sources:
        for host, p in src.items():
            old = out.get(host)
            if old is None:
                out[host] = p
                continue
            out[host] = Place(old.switch or p.switch, old.segment or p.segment,
                              old.nvlink or p.nvlink, old.source or p.source)
    return out


def host_places(hosts: Sequence[Host], topology: str | None,
                topology_from: str = "topology.conf") -> dict[str, Place]:
    """Each host's place by its label: the hostfile's switch=/segment=, then ``topology``
    (topology.conf's text, which names hosts, not labels; ``topology_from`` says where it
    came from), the hostfile winning per host. What ``run`` orders the ranks by and what a
    restart picks a fenced node's spare by."""
    conf = parse_topology_conf(topology, topology_from) if topology else {}
    names = {h.name: h.label for h in hosts}
    return merge({h.label: Place(h.switch, h.segment, None, "hostfile")
                  for h in hosts if h.switch or h.segment},
                 {names[k]: v for k, v in conf.items() if k in names})


def nvlink_domain(fabric: Mapping[str, str]) -> str | None:
    """A node's NVLink domain from nvidia-smi's fabric fields (nodeside/probe.read_fabric):
    ``ClusterUUID/CliqueId`` (the clique alone is not unique: NVIDIA/nccl#1301), only when
    the fabric's registration is complete and succeeded and the UUID is not all zeros (a
    non-MNNVL H100 can say "Completed" with a zero UUID: every such node would seem to share
    one domain)."""
    state, status = fabric.get("state", ""), fabric.get("status", "")
    uuid, clique = fabric.get("cluster_uuid", "").strip(), fabric.get("clique_id", "").strip()
    if state.lower() != "completed" or status.lower() != "success" or not clique.isdigit():
        return None
    hexdigits = uuid.replace("-", "").lower()
    if len(hexdigits) != 32 or any(c not in "0123456789abcdef" for c in hexdigits) \
            or set(hexdigits) == {"0"}:
        return None
    return f"{uuid.lower()}/{int(clique)}"


def after_probe(hosts: Sequence[Host], fabrics: Mapping[str, Mapping[str, str]],
                topology: str | None, topology_from: str = "topology.conf"
                ) -> tuple[list[str], list[str]] | None:
    """The rank order once the probe said each node's NVLink domain (``fabrics``: label ->
    its fabric fields), with the hostfile's and topology.conf's places: (labels in order,
    why), or None when no node is in a domain (the order stands). The first host stays
    node 0: the master address was checked on it."""
    domains = {label: d for label, fab in fabrics.items() if (d := nvlink_domain(fab))}
    if not domains:
        return None
    places = merge(host_places(hosts, topology, topology_from),
                   {label: Place(nvlink=d, source="nvidia-smi") for label, d in domains.items()})
    labels = [h.label for h in hosts]
    ordered, why = order(labels, places)
    if ordered and ordered[0] != labels[0]:
        ordered.remove(labels[0])
        ordered.insert(0, labels[0])
        why.append(f"{labels[0]} stays node 0 (the master address was checked there)")
    return ordered, why


def order(hosts: Sequence[str], places: Mapping[str, Place]
          ) -> tuple[list[str], list[str]]:
    """(the hosts in rank order, one line per group saying why)."""
    def key_of(h: str) -> tuple[str, str, str] | None:
        p = places.get(h)
        if p is None or not (p.switch or p.segment or p.nvlink):
            return None
        return (p.segment or "", p.switch or "", p.nvlink or "")

    first: dict[tuple[str, ...], int] = {}
    for i, h in enumerate(hosts):
        k = key_of(h)
        if k is None:
            continue
        for depth in (1, 2, 3):  # segment, then switch, then domain: first appearance
            first.setdefault(k[:depth], i)
    placed = [h for h in hosts if key_of(h) is not None]
    rest = [h for h in hosts if key_of(h) is None]

    def rank(h: str) -> tuple[int, int, int, int]:
        k = key_of(h)
        assert k is not None
        return (first[k[:1]], first[k[:2]], first[k[:3]], hosts.index(h))

    ordered = sorted(placed, key=rank)
    why: list[str] = []
    group: list[str] = []
    for h in ordered + [""]:
        if group and (not h or key_of(h) != key_of(group[0])):
            p = places[group[0]]
            why.append(f"{', '.join(group)}: {p.words()} ({p.source})")
            group = []
        if h:
            group.append(h)
    if rest and placed:
        why.append(f"{', '.join(rest)}: no topology known (last, in the given order)")
    return ordered + rest, why


def spare_for(fenced: str, spares: Sequence[str], places: Mapping[str, Place]
              ) -> tuple[str | None, str]:
    """The spare to take the fenced node's place: one on its switch (or NVLink domain),
    else in its segment, else the first; and why."""
    if not spares:
        return None, "no spare"
    p = places.get(fenced)
    if p is not None:
        for attr, what in (("nvlink", "NVLink domain"), ("switch", "switch"),
                           ("segment", "segment")):
            mine = getattr(p, attr)
            if not mine:
                continue
            for s in spares:
                q = places.get(s)
                if q is not None and getattr(q, attr) == mine:
                    return s, f"{s} shares {fenced}'s {what} {mine}"
    return spares[0], f"{spares[0]}: the first spare (none shares {fenced}'s switch or segment)"
