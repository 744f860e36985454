"""Every host source in one order, in one resolver (issue 54 item 5): -H > -f >
DTRAIN_HOSTFILE > WCOLL > a Slurm allocation > -g's genders file > the config's hostfile
(launcher/hosts/sources.py), each source taken away in turn to show the next; the same
through ``resolve_hosts`` with every source on disk; and a scan that fails on a module
outside launcher/hosts/ reading one of those variables to pick hosts. On the old code the
order lived in cli/groups.py (WCOLL, the config) and hosts/hostfile.py (the rest), Slurm's
topology in commands/run.py, and -H with DTRAIN_HOSTFILE set was exit 2 ("both
-f/--hostfile and -H/--hosts given")."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from launcher.errors import HostfileError, UsageError
from launcher.hosts.hostfile import resolve_hosts
from launcher.hosts.sources import SCONTROL_TOPOLOGY, SOURCES, host_source, topology_source
from tests.util import assert_exit, dtrain

ROOT = Path(__file__).resolve().parent.parent
SLURM = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "slurm1", "SLURM_JOB_CPUS_PER_NODE": "1"}


def test_the_sources_in_their_order() -> None:
    assert SOURCES == ("-H", "-f", "DTRAIN_HOSTFILE", "WCOLL", "Slurm", "genders", "config")


def _every_source(tmp_path: Path) -> dict[str, object]:
    """Every source present at once, each naming its own host."""
    for name in ("f", "env", "wcoll", "config"):
        (tmp_path / name).write_text(f"from-{name}\n")
    # every source's host is in the group, so -g keeps each (-g filters what they name)
    (tmp_path / "genders").write_text(
        "from-genders gpu\nfrom-h,from-f,from-env,slurm1,from-wcoll,from-config gpu\n")
    # -f and -H together are exit 2: -f comes in when -H goes (_without)
    return {"hosts": "from-h", "hostfile": None, "f": str(tmp_path / "f"),
            "environ": {"DTRAIN_HOSTFILE": str(tmp_path / "env"),
                        "WCOLL": str(tmp_path / "wcoll"), **SLURM},
            "group": "gpu", "genders": str(tmp_path / "genders"),
            "config_hostfile": lambda: str(tmp_path / "config")}


def _without(given: dict[str, object], source: str) -> None:
    environ = dict(given["environ"])  # type: ignore[call-overload]
    if source == "-H":
        given["hosts"], given["hostfile"] = None, given["f"]
    elif source == "-f":
        given["hostfile"] = None
    elif source in ("DTRAIN_HOSTFILE", "WCOLL"):
        environ.pop(source)
    elif source == "Slurm":
        environ = {k: v for k, v in environ.items() if not k.startswith("SLURM_")}
    elif source == "genders":
        given["group"] = None
    given["environ"] = environ


def _resolve(given: dict[str, object]) -> list:  # type: ignore[type-arg]
    return resolve_hosts(**{k: v for k, v in given.items() if k != "f"})  # type: ignore[arg-type]


def _walk(given: dict[str, object], taken: tuple[str, ...]) -> list[tuple[str, str]]:
    """(the source host_source picks, the first host resolve_hosts reads) with every source
    present, then with each of ``taken`` taken away in turn."""
    out = []
    for source in (*taken, None):
        chosen = host_source(hostfile=given["hostfile"], hosts=given["hosts"],  # type: ignore[arg-type]
                             environ=given["environ"],  # type: ignore[arg-type]
                             genders_group=given["group"] is not None,
                             config_hostfile=given["config_hostfile"])  # type: ignore[arg-type]
        assert chosen is not None
        out.append((chosen.kind, _resolve(given)[0].name))
        if source is not None:
            _without(given, source)
    return out


def test_each_source_taken_away_shows_the_next(tmp_path: Path) -> None:
    """Every source present: -H wins; take it away, -f; and so on down to the config."""
    given = {**_every_source(tmp_path), "group": None}
    assert _walk(given, ("-H", "-f", "DTRAIN_HOSTFILE", "WCOLL", "Slurm")) == [
        ("-H", "from-h"), ("-f", "from-f"), ("DTRAIN_HOSTFILE", "from-env"),
        ("WCOLL", "from-wcoll"), ("Slurm", "slurm1"), ("config", "from-config")]
    assert [k for k in SOURCES if k != "genders"] == [
        k for k, _ in _walk({**_every_source(tmp_path), "group": None},
                            ("-H", "-f", "DTRAIN_HOSTFILE", "WCOLL", "Slurm"))]


def test_with_minus_g_the_genders_group_comes_after_slurm(tmp_path: Path) -> None:
    """With -g and a genders file, pdsh's -g names the hosts: WCOLL and the config are not
    read, the genders file's group comes after an allocation."""
    assert _walk(_every_source(tmp_path), ("-H", "-f", "DTRAIN_HOSTFILE", "Slurm")) == [
        ("-H", "from-h"), ("-f", "from-f"), ("DTRAIN_HOSTFILE", "from-env"),
        ("Slurm", "slurm1"), ("genders", "from-genders")]


def test_with_minus_g_and_genders_wcoll_and_the_config_are_not_read(tmp_path: Path) -> None:
    given = _every_source(tmp_path)
    for source in ("-H", "-f", "DTRAIN_HOSTFILE", "Slurm"):
        _without(given, source)
    assert [h.name for h in _resolve(given)][0] == "from-genders"
    _without(given, "genders")
    assert [h.name for h in _resolve(given)] == ["from-wcoll"]
    _without(given, "WCOLL")
    assert [h.name for h in _resolve(given)] == ["from-config"]
    given["config_hostfile"] = lambda: None
    with pytest.raises(HostfileError, match="no hosts given"):
        _resolve(given)


def test_the_config_is_asked_only_when_nothing_above_names_hosts(tmp_path: Path) -> None:
    asked = []

    def config() -> str | None:
        asked.append(1)
        return None

    host_source(hostfile=None, hosts=None, environ={"WCOLL": "w"}, config_hostfile=config)
    assert asked == []
    with pytest.raises(UsageError, match="both -f/--hostfile and -H/--hosts"):
        host_source(hostfile="f", hosts="h", environ={})


def test_minus_h_wins_over_dtrain_hostfile_on_the_command_line(tmp_path: Path) -> None:
    """docs/hostfiles.md: DTRAIN_HOSTFILE is used only when neither -f nor -H is given; typer
    filled -f from it, so -H with it set was exit 2 before."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "SLURM_"))}
    env.pop("WCOLL", None)
    env.update(DTRAIN_CONFIG="", DTRAIN_HOSTFILE=str(tmp_path / "missing"))
    res = dtrain(["exec", "-H", "localhost", "--", "echo", "ok"], env=env)
    assert_exit(res, 0)
    res = dtrain(["exec", "--", "echo", "ok"], env=env)
    assert_exit(res, 2)
    assert "(from DTRAIN_HOSTFILE)" in res.stderr, res.stderr


def test_the_topology_s_sources_in_their_order() -> None:
    """--topology FILE's text, else inside an allocation `scontrol show topology` (asked only
    there, never with --offline), else none."""
    asked: list[dict[str, str]] = []

    def scontrol(environ: object) -> str:
        asked.append(dict(environ))  # type: ignore[call-overload]
        return "SwitchName=s0 Nodes=slurm1\n"

    def source(given: str | None, environ: dict[str, str], offline: bool = False
               ) -> tuple[str | None, str]:
        return topology_source(given, "topology.conf", environ, offline=offline,
                               scontrol=scontrol)

    assert source("SwitchName=t", SLURM) == ("SwitchName=t", "topology.conf")
    assert asked == []
    assert source(None, SLURM) == ("SwitchName=s0 Nodes=slurm1\n", SCONTROL_TOPOLOGY)
    assert len(asked) == 1
    assert source(None, SLURM, offline=True) == (None, "topology.conf")
    assert source(None, {}) == (None, "topology.conf")
    assert len(asked) == 1


# ---------------------------------------------------------------- the scan

VARIABLES = {"WCOLL", "DTRAIN_HOSTFILE", "SLURM_JOB_NODELIST", "ENV_HOSTFILE", "NODELIST"}
# modules outside launcher/hosts/ that may look at an allocation, each with why
ALLOWED = {
    "launcher/transports/srun.py": "the srun transport's choice (inside an allocation), not "
                                   "which hosts: it takes the hosts it is given",
}


def _reads(tree: ast.AST) -> list[int]:
    """Lines reading one of VARIABLES from an environment (``env[...]``, ``env.get(...)``)
    or asking whether this is an allocation."""
    def named(node: ast.AST) -> bool:
        return (isinstance(node, ast.Constant) and node.value in VARIABLES) or \
            (isinstance(node, ast.Name) and node.id in VARIABLES)

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and named(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
                else ""
            if (name == "get" and node.args and named(node.args[0])) or \
                    name in ("in_allocation", "allocation", "config_hostfile", "show_topology"):
                lines.append(node.lineno)
    return lines


def test_only_the_resolver_picks_hosts_from_the_environment() -> None:
    found = []
    for path in sorted((ROOT / "launcher").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("launcher/hosts/") or rel in ALLOWED:
            continue
        found += [f"{rel}:{line}" for line in _reads(ast.parse(path.read_text()))]
    # cli/groups.py hands the config's hostfile to the resolver, which asks it last
    assert [f for f in found if not f.startswith("launcher/cli/groups.py")] == [], found
    assert all("config_hostfile" in line for line in
               _lines(ROOT / "launcher/cli/groups.py",
                      [f for f in found if f.startswith("launcher/cli/groups.py")]))


def _lines(path: Path, hits: list[str]) -> list[str]:
    text = path.read_text().splitlines()
    return [text[int(h.rsplit(":", 1)[1]) - 1] for h in hits]


def test_the_scan_sees_the_old_reading() -> None:
    old = ("def hosts(hostfile, hosts):\n"
           "    if hostfile is None and os.environ.get('WCOLL'):\n"
           "        hostfile = os.environ['WCOLL']\n"
           "    if not os.environ.get('SLURM_JOB_NODELIST'):\n"
           "        hostfile = config_hostfile()\n")
    assert _reads(ast.parse(old)) == [2, 3, 4, 5]
