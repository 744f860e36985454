"""Slurm nodelists expanded as Slurm expands them: ``scontrol show hostnames`` is the oracle.

Expressions are generated (seeded, so a failure reproduces) from Slurm's grammar, with
brackets out of order, repeats, mixed padding, numeric-only names, several brackets per
entry and some expressions Slurm refuses. For each one, dtrain's expansion must equal
Slurm's, or dtrain must refuse it for a reason docs/slurm.md lists (Slurm refused it too, a
node repeated, a character dtrain does not allow in a node name). scontrol only parses here
(a two-line slurm.conf in tmp_path): no daemon is needed, only the Slurm client installed
(scripts/test installs it).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from launcher.errors import HostfileError
from launcher.hosts import slurm_hostlist
from launcher.hosts.entries import MAX_HOSTS, _name_problem
from launcher.hosts.slurm import allocation, expand_counts, expand_nodelist
from tests.util import cannot_run

SEED = 20261201
N_EXPRESSIONS = 400


def _scontrol_env(tmp_path: Path) -> dict[str, str]:
    if shutil.which("scontrol") is None:
        cannot_run("scontrol is not installed (Slurm's client; scripts/test installs it)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=oracle\nSlurmctldHost=localhost\n")
    return {**os.environ, "SLURM_CONF": str(conf)}


def slurm_expand(expr: str, env: dict[str, str]) -> list[str] | None:
    """What Slurm makes of ``expr``; None where it refuses it. A bad range in a bracket that
    is not an entry's last is reported on stderr, and the entry dropped from the output (its
    error code is lost in the recursion): that counts as refused."""
    res = subprocess.run(["scontrol", "show", "hostnames", expr], env=env, text=True,
                         capture_output=True, timeout=30, check=False)
    if res.stderr or res.returncode != 0:
        return None
    return res.stdout.split()


# ---------------------------------------------------------------------------- generator

PREFIXES = ["node", "n", "gpu-", "rack", "a.b", "x_", "c1n", "", "n@"]
BETWEEN = ["", "-", "-n", "x", "."]


def _number(rng: random.Random, value: int) -> str:
    return str(value).zfill(len(str(value)) + rng.choice([0, 0, 0, 1, 2]))


def _range(rng: random.Random) -> str:
    low = rng.randint(0, 99)
    shape = rng.random()
    if shape < 0.4:
        return _number(rng, low)
    high = low - rng.randint(1, 3) if shape > 0.98 else low + rng.randint(0, 6)
    return f"{_number(rng, low)}-{_number(rng, max(high, 0))}"


def _group(rng: random.Random) -> str:
    return "[" + ",".join(_range(rng) for _ in range(rng.randint(1, 3))) + "]"


def _entry(rng: random.Random) -> str:
    prefix = rng.choice(PREFIXES)
    if rng.random() < 0.2:
        return (prefix or "h") + str(rng.randint(0, 20))
    entry = prefix + _group(rng)
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
        entry += rng.choice(BETWEEN) + _group(rng)
    if rng.random() < 0.04:
        entry += rng.choice(["-y", ".dom", "0"])  # Slurm refuses text after the last ']'
    return entry


def expressions() -> list[str]:
    rng = random.Random(SEED)
    return [rng.choice([",", ",", " "]).join(_entry(rng) for _ in range(rng.randint(1, 3)))
            for _ in range(N_EXPRESSIONS)]


def _documented_refusal(slurm: list[str] | None) -> str | None:
    """Why dtrain may refuse what Slurm made (docs/slurm.md), or None: it may not."""
    if slurm is None:
        return "Slurm refuses it too"
    if len(set(slurm)) != len(slurm):
        return "a node listed twice"
    if any(_name_problem(name) or "@" in name for name in slurm):
        return "a character dtrain does not allow in a node name"
    return None


def test_nodelists_expand_as_scontrol_show_hostnames(tmp_path: Path) -> None:
    env = _scontrol_env(tmp_path)
    kinds: Counter[str] = Counter()
    wrong = []
    for expr in expressions():
        slurm = slurm_expand(expr, env)
        try:
            ours: list[str] | None = expand_nodelist(expr)
        except HostfileError:
            ours = None
        if ours is None:
            why = _documented_refusal(slurm)
            kinds[f"refused: {why}"] += 1
            if why is None:
                wrong.append(f"{expr!r}: dtrain refuses, Slurm makes {slurm}"[:400])
            continue
        kinds["same"] += 1
        if ours != slurm:
            wrong.append(f"{expr!r}: dtrain {ours}, Slurm {slurm}"[:400])
            continue
        if ours != sorted(ours):
            kinds["order that sorting would change"] += 1
        if any(name.isdigit() for name in ours):
            kinds["numeric-only names"] += 1
        if any(mark in expr for mark in ("][", "]-", "]x[", "].[")):
            kinds["several brackets in an entry"] += 1
    assert not wrong, "\n".join(wrong[:20])
    # the generator reached every kind of case (a generator that makes only easy lists
    # would pass any expander)
    for kind, least in [("same", 200), ("order that sorting would change", 100),
                        ("numeric-only names", 10), ("several brackets in an entry", 50),
                        ("refused: Slurm refuses it too", 20),
                        ("refused: a node listed twice", 8),
                        ("refused: a character dtrain does not allow in a node name", 20)]:
        assert kinds[kind] >= least, (kind, dict(kinds))


@pytest.mark.parametrize(("text", "names"), [
    pytest.param("node[3,1,2]", ["node3", "node1", "node2"], id="order-inside-brackets"),
    pytest.param("n[1-010]", [f"n{i}" for i in range(1, 11)], id="width-of-low"),
    pytest.param("n[01-2,5]", ["n01", "n02", "n5"], id="padding-per-range"),
    pytest.param("n[09-11]", ["n09", "n10", "n11"], id="padded-past-width"),
    pytest.param("[1-3]", ["1", "2", "3"], id="numeric-only"),
    pytest.param("n[1-2][3-4]", ["n13", "n14", "n23", "n24"], id="two-brackets"),
    pytest.param("n[1-2]x[3-4]", ["n1x3", "n1x4", "n2x3", "n2x4"], id="text-between"),
    pytest.param("a[1-2]b[1-2]c[1-2]", ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2",
                                        "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"],
                 id="three-brackets-slurms-order"),
    pytest.param("n1 n2\tn3", ["n1", "n2", "n3"], id="spaces-separate"),
    pytest.param("198.18.0.[11-12]", ["198.18.0.11", "198.18.0.12"], id="addresses"),
])
def test_slurm_cases_named_in_the_issue(text: str, names: list[str], tmp_path: Path) -> None:
    assert expand_nodelist(text) == names
    assert slurm_expand(text, _scontrol_env(tmp_path)) == names


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("node[1,1]", "node listed twice in 'node[1,1]': node1", id="repeat-in-bracket"),
    pytest.param("n1,n[0-1]", "node listed twice", id="repeat-across-entries"),
    pytest.param("n[1-]", "bad range '1-'", id="slurm-reads-n1"),
    pytest.param("n[ 1]", "bad range ' 1'", id="slurm-reads-n01"),
    pytest.param("n[+1]", "bad range '+1'", id="slurm-reads-n01-too"),
    pytest.param("n[1-2", "unclosed '['", id="slurm-reads-n]"),
    pytest.param("n@1", "'@' in 'n@1' is not allowed", id="at-sign"),
    pytest.param("n[1-2]-x", "'-x' after the last ']'", id="suffix"),
    pytest.param("-n[1-2]", "invalid node name '-n1'", id="leading-dash"),
])
def test_what_dtrain_refuses_says_why(text: str, message: str) -> None:
    with pytest.raises(HostfileError) as exc:
        expand_nodelist(text)
    assert message in str(exc.value)
    assert "SLURM_JOB_NODELIST" in str(exc.value)
    assert exc.value.exit_code == 2


def test_the_cap_is_counted_before_any_name_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    real = slurm_hostlist.expand_entry
    monkeypatch.setattr(slurm_hostlist, "expand_entry",
                        lambda *a: built.append(a) or real(*a))  # type: ignore[func-returns-value]
    with pytest.raises(HostfileError, match=f"makes 10000000000000 nodes, more than {MAX_HOSTS}"):
        expand_nodelist("n[1-10000000000000]")
    with pytest.raises(HostfileError, match=f"makes {MAX_HOSTS + 1} nodes"):
        expand_nodelist(f"a[1-{MAX_HOSTS // 2}],b[1-{MAX_HOSTS // 2}],c9")
    assert built == []
    assert len(expand_nodelist(f"a[1-{MAX_HOSTS // 2}],b[1-{MAX_HOSTS // 2}]")) == MAX_HOSTS


@pytest.mark.parametrize("text", ["0", "0(x2)", "2(x0)", "1,0"])
def test_zero_counts_are_refused(text: str) -> None:
    with pytest.raises(HostfileError, match="zero count"):
        expand_counts(text, 2, "SLURM_JOB_CPUS_PER_NODE")


def test_a_huge_repeat_is_refused_before_it_is_built() -> None:
    # built first, 10**11 ints would exhaust memory (a MemoryError, not this message)
    with pytest.raises(HostfileError, match="gives 100000000000 counts for 3 nodes"):
        expand_counts("1(x100000000000)", 3, "SLURM_JOB_CPUS_PER_NODE")


JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[2,1]"}


@pytest.mark.parametrize(("extra", "slots", "source"), [
    # salloc -N2 -n8 -c4 on two 16-CPU nodes: 4 tasks on each, not 16 processes
    pytest.param({"SLURM_NTASKS": "8", "SLURM_CPUS_PER_TASK": "4",
                  "SLURM_JOB_CPUS_PER_NODE": "16(x2)", "SLURM_TASKS_PER_NODE": "4(x2)"},
                 (4, 4), "SLURM_TASKS_PER_NODE", id="n8-c4"),
    pytest.param({"SLURM_NPROCS": "3", "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
                  "SLURM_TASKS_PER_NODE": "2,1"}, (2, 1), "SLURM_TASKS_PER_NODE",
                 id="n3-uneven"),
    pytest.param({"SLURM_CPUS_PER_TASK": "2", "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
                  "SLURM_TASKS_PER_NODE": "1(x2)"}, (1, 1), "SLURM_TASKS_PER_NODE", id="c2"),
    # salloc -N2 alone (no -n, no -c): one process per allocated CPU, as before
    pytest.param({"SLURM_JOB_CPUS_PER_NODE": "64(x2)", "SLURM_TASKS_PER_NODE": "1(x2)"},
                 (64, 64), "SLURM_JOB_CPUS_PER_NODE", id="N2-whole-nodes"),
    pytest.param({"SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)",
                  "SLURM_GPUS_ON_NODE": "2"}, (2, 2), "SLURM_GPUS_ON_NODE", id="gpu-job"),
    pytest.param({"SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)",
                  "SLURM_JOB_GPUS": "0,1"}, (None, None), None, id="gpu-job-no-count"),
])
def test_slots_are_the_tasks_slurm_placed(extra: dict[str, str],
                                          slots: tuple[int | None, ...],
                                          source: str | None) -> None:
    alloc = allocation({**JOB, **extra})
    assert alloc is not None
    assert alloc.nodes == ("node2", "node1")
    assert (alloc.slots, alloc.slots_from) == (slots, source)


# ---------------------------------------------------------------------------- what each error says


@pytest.mark.parametrize(("text", "message", "hint"), [
    pytest.param("n[3-1]", "range '3-1' runs backwards",
                 "e.g. node[1-4],login2 (as scontrol show hostnames reads it)", id="backwards"),
    pytest.param("n[[1-2]]", "unclosed '[' in 'n[[1-2]]'",
                 "e.g. node[1-4],login2 (as scontrol show hostnames reads it)", id="nested"),
    pytest.param("n@x[1-2]", "'@' in 'n@x[1-2]' is not allowed in a node name",
                 "e.g. node[1-4],login2 (as scontrol show hostnames reads it)", id="bad-prefix"),
    pytest.param("a[1-2],a1", "node listed twice in 'a[1-2],a1': a1",
                 "each node once: Slurm never allocates a node twice", id="twice"),
    pytest.param(" , ", "empty node list", "are you inside salloc/sbatch?", id="empty"),
])
def test_each_refusal_says_what_and_what_to_do(text: str, message: str, hint: str) -> None:
    with pytest.raises(HostfileError) as exc:
        expand_nodelist(text)
    assert message in str(exc.value)
    assert exc.value.hint == hint
    assert exc.value.source == "SLURM_JOB_NODELIST"


def test_the_cap_counts_every_bracket_of_an_entry() -> None:
    """a[1-300][1-300] is 90,000 names: the product of the brackets, not the last one."""
    with pytest.raises(HostfileError, match="makes 90000 nodes"):
        expand_nodelist("a[1-300][1-300]")
    assert slurm_hostlist.count(slurm_hostlist.parse_entry("a[1-3]b[1-2,5]")[1]) == 9


@pytest.mark.parametrize(("text", "message", "hint"), [
    pytest.param("x", "cannot read 'x': expected counts like 2(x3),1", None, id="garbage"),
    pytest.param("0(x2)", "cannot read '0(x2)': '0(x2)' is a zero count",
                 "every node has at least one", id="zero"),
    pytest.param("2(x3)", "'2(x3)' gives 3 counts for 2 nodes",
                 "does it match SLURM_JOB_NODELIST?", id="mismatch"),
])
def test_each_count_error_says_what_and_what_to_do(text: str, message: str,
                                                   hint: str | None) -> None:
    with pytest.raises(HostfileError) as exc:
        expand_counts(text, 2, "SLURM_TASKS_PER_NODE")
    assert message in str(exc.value)
    assert exc.value.hint == hint
    assert exc.value.source == "SLURM_TASKS_PER_NODE"


@pytest.mark.parametrize(("text", "whole"), [
    (" , ", "SLURM_JOB_NODELIST: empty node list (are you inside salloc/sbatch?)"),
    ("n[1-]", "SLURM_JOB_NODELIST: cannot read 'n[1-]': bad range '1-' in [1-]: expected N "
              "or N-M (decimal digits) (e.g. node[1-4],login2 (as scontrol show hostnames "
              "reads it))"),
    ("n[1-70000]", "SLURM_JOB_NODELIST: cannot read 'n[1-70000]': 'n[1-70000]' makes 70000 "
                   "nodes, more than 65536 (the cap on one job) (e.g. node[1-4],login2 (as "
                   "scontrol show hostnames reads it))"),
])
def test_whole_messages(text: str, whole: str) -> None:
    with pytest.raises(HostfileError) as exc:
        expand_nodelist(text)
    assert str(exc.value) == whole
