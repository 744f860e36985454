"""The suite's own plumbing: scripts/test fails on a failed install, and everything must run
under it (DTRAIN_REQUIRE_CLUSTER=1) rather than skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.util import REPO, cannot_run

FAKE_PYTHON = """#!/bin/bash
echo "$*" >> "$FAKE_LOG"
case "$2" in
  pip) echo "Running pip as the 'root' user can result in broken permissions"
       echo "pip says: $FAKE_PIP_SAYS"; exit "$FAKE_PIP_RC";;
  pytest) echo "pytest saw DTRAIN_REQUIRE_CLUSTER=${DTRAIN_REQUIRE_CLUSTER:-unset}"
          exit "${FAKE_PYTEST_RC:-0}";;
  tests.cluster) case "$3 $4" in
    "status "*) exit "${FAKE_CLUSTER_STATUS:-3}";;  # 3: no cluster recorded
    "slurm status") exit "${FAKE_SLURM_STATUS:-3}";;
  esac;;
esac
exit 0
"""


def _script_test(tmp_path: Path, pip_rc: int, **env_extra: str
                 ) -> tuple[subprocess.CompletedProcess[str], str]:
    """scripts/test with a stand-in python (pip, tests.cluster, pytest) and dpkg (all there)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"python": FAKE_PYTHON, "dpkg": "#!/bin/sh\nexit 0\n",
                       "apt-get": "#!/bin/sh\necho apt-get must not run; exit 99\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHON": str(bin_dir / "python"), "FAKE_LOG": str(log),
           "FAKE_PIP_RC": str(pip_rc), "FAKE_PIP_SAYS": "ERROR: no matching distribution",
           **env_extra}
    if "DTRAIN_KEEP_CLUSTER" not in env_extra:
        env.pop("DTRAIN_KEEP_CLUSTER", None)
    res = subprocess.run(["bash", str(REPO / "scripts" / "test"), "-q", "-k", "x"], env=env,
                         capture_output=True, text=True, timeout=60)
    return res, log.read_text() if log.exists() else ""


def test_scripts_test_stops_when_pip_install_fails(tmp_path: Path) -> None:
    res, calls = _script_test(tmp_path, pip_rc=3)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "pip install failed (exit 3)" in res.stderr
    assert "ERROR: no matching distribution" in res.stdout  # pip's own words are shown
    assert "tests.cluster" not in calls and "pytest" not in calls, calls


def test_scripts_test_filters_pip_noise_and_requires_every_test(tmp_path: Path) -> None:
    res, calls = _script_test(tmp_path, pip_rc=0)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Running pip as the 'root' user" not in res.stdout
    assert [line.split()[:2] for line in calls.splitlines()] == [
        ["-m", "pip"], *[["-m", "tests.cluster"]] * 4, ["-m", "pytest"],
        *[["-m", "tests.cluster"]] * 2]
    assert "-m pytest -q -k x" in calls.splitlines()
    assert "pytest saw DTRAIN_REQUIRE_CLUSTER=1" in res.stdout


def _cluster_calls(calls: str) -> list[str]:
    return [line.split(None, 2)[2] for line in calls.splitlines()
            if line.startswith("-m tests.cluster")]


@pytest.mark.parametrize("pytest_rc", [0, 1])
def test_scripts_test_brings_down_what_it_brought_up(tmp_path: Path, pytest_rc: int) -> None:
    """The 64-node cluster and Slurm do not outlive the run, passed or failed (issue 40),
    and the run says so; its exit code stays pytest's."""
    res, calls = _script_test(tmp_path, pip_rc=0, FAKE_PYTEST_RC=str(pytest_rc))
    assert res.returncode == pytest_rc, res.stdout + res.stderr
    assert _cluster_calls(calls) == ["status", "slurm status", "up --nodes 4", "slurm up",
                                     "slurm down", "down"]
    assert "test cluster and Slurm brought down (DTRAIN_KEEP_CLUSTER=1 keeps them)" \
        in res.stdout


def test_scripts_test_keeps_them_when_asked(tmp_path: Path) -> None:
    res, calls = _script_test(tmp_path, pip_rc=0, DTRAIN_KEEP_CLUSTER="1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "down" not in " ".join(_cluster_calls(calls)), calls
    assert "kept (DTRAIN_KEEP_CLUSTER=1)" in res.stdout
    assert "-m tests.cluster slurm down && " in res.stdout  # how to bring them down


def test_scripts_test_leaves_a_cluster_it_found_running(tmp_path: Path) -> None:
    """Another session's cluster (up before the run) is not this run's to stop."""
    res, calls = _script_test(tmp_path, pip_rc=0, FAKE_CLUSTER_STATUS="0",
                              FAKE_SLURM_STATUS="0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "down" not in " ".join(_cluster_calls(calls)), calls
    assert "left running: the test cluster and Slurm were up before this run" in res.stdout


def test_cannot_run_skips_by_default_and_fails_where_required() -> None:
    with pytest.raises(pytest.skip.Exception, match="no sshd"):
        cannot_run("no sshd", require=False)
    with pytest.raises(pytest.fail.Exception, match="no sshd .*DTRAIN_REQUIRE_CLUSTER=1"):
        cannot_run("no sshd", require=True)


def test_required_run_turns_a_missing_cluster_and_tool_into_failures(tmp_path: Path) -> None:
    """End to end: pytest in a subprocess, the cluster made unavailable and ruff not found."""
    (tmp_path / "test_probe_required.py").write_text(
        "def test_uses_cluster(cluster):\n    pass\n"
        "from tests.test_lint import test_ruff_is_clean as test_ruff\n")
    (tmp_path / "conftest.py").write_text(
        "import shutil\nfrom tests import cluster as tc\n"
        "tc.unavailable_reason = lambda: 'no sshd on this machine'\n"
        "shutil.which = lambda name, *a, **k: None\n"
        "from tests.conftest import cluster  # noqa: F401\n")
    outcomes = {}
    for require in ("0", "1"):
        env = {**os.environ, "DTRAIN_REQUIRE_CLUSTER": require, "PYTHONPATH": str(REPO)}
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-o", "addopts=", str(tmp_path)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        outcomes[require] = (res.returncode, res.stdout.splitlines()[-1])
    assert outcomes["0"][0] == 0 and "2 skipped" in outcomes["0"][1], outcomes
    # the fixture's failure is reported as an error of the test that uses it
    assert outcomes["1"][0] == 1 and "1 failed, 1 error" in outcomes["1"][1], outcomes


def _bench_common():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_common", REPO / "bench" / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_rounds_rotate_the_tool_order(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    common = _bench_common()
    monkeypatch.setattr(common, "wait_quiet", lambda *a, **k: True)
    monkeypatch.setattr(common, "log", lambda *a, **k: None)
    order: list[tuple[int, str]] = []

    def tool(name: str):  # type: ignore[no-untyped-def]
        def run(r: int):  # type: ignore[no-untyped-def]
            order.append((r, name))
            return common.Run(name, 1.0, 0.0, 0.0, 0, tmp_path / "out", "", True)
        return run

    common.rounds(common.Series("case"), [(t, tool(t)) for t in ("dtrain", "pdsh", "clush")],
                  3, warmup=False)
    assert [name for _, name in order] == ["dtrain", "pdsh", "clush", "pdsh", "clush",
                                           "dtrain", "clush", "dtrain", "pdsh"]


def test_bench_ssh_tools_use_dtrains_ciphers() -> None:
    from launcher.transports.ssh import CIPHERS

    common = _bench_common()
    cluster = SimpleNamespace(ssh_config="cfg", identity="key", known_hosts="kh")
    same = common.Env(cluster, Path("/tmp"))
    assert f"Ciphers={','.join(CIPHERS)}" in same.ssh_opts()
    assert not any(o.startswith("Ciphers=") for o in common.Env(
        cluster, Path("/tmp"), ciphers=common.SSH_CIPHERS["openssh"]).ssh_opts())


def test_testing_md_maps_every_test_file() -> None:
    """docs/testing.md's table names each test file, so a newcomer finds where a behaviour
    is tested (and a new file is placed in an area when it lands)."""
    import re

    text = (REPO / "docs" / "testing.md").read_text()
    named = set(re.findall(r"\btest_\w+\.py\b", text))
    files = {p.name for p in (REPO / "tests").glob("test_*.py")}
    assert sorted(files - named) == [], "add them to docs/testing.md's table"


def test_every_property_test_draws_the_same_examples_in_ci() -> None:
    """A property test outside tests/fuzzing.py sets derandomize=True: CI draws the same
    examples every run, so a red CI is the commit's, not the draw's (CI 47 failed on a draw
    no earlier run had made). Exploring new draws is the long fuzz run's job."""
    import re

    loose = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for m in re.finditer(r"^@settings\((.*?)\)\s*$", path.read_text(), re.M | re.S):
            if "derandomize=True" not in m.group(1):
                loose.append(f"{path.name}: @settings({m.group(1)})")
    assert loose == [], "add derandomize=True, database=None (or use tests/fuzzing.FUZZ)"


# Every way a test skips goes through tests/util.py's cannot_run (need_module, need_root):
# under DTRAIN_REQUIRE_CLUSTER=1 (scripts/test, CI) it fails instead, so a machine that lacks
# what CI installs cannot pass by skipping. The only other skips allowed name hardware this
# machine cannot have (a GPU): each listed here, by file and function, with why. None is
# needed today: no test needs a GPU (docs/testing.md; bench/gpu/check.sh is run by hand).
SKIP_ALLOWED: dict[tuple[str, str], str] = {
    ("tests/util.py", "cannot_run"): "the one way to skip: a failure under "
                                      "DTRAIN_REQUIRE_CLUSTER=1, a skip with its reason elsewhere",
}
SKIP_NAMES = {"skip", "skipif", "importorskip", "skipIf", "skipUnless", "skipTest", "SkipTest"}


def skip_sites(source: str, rel: str) -> list[tuple[str, str, int]]:
    """Each skip in a test module's source: (file, enclosing function or <module>, line).
    ``pytest.skip(...)``, ``pytest.importorskip(...)``, the ``skip``/``skipif`` markers (as
    decorators, in ``pytestmark``, added at run time), ``raise pytest.skip.Exception``,
    unittest's skips, and those names imported bare (``from pytest import skip``)."""
    import ast

    tree = ast.parse(source)
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                     ast.ClassDef)) else where
            hit = False
            if isinstance(child, ast.Attribute) and child.attr in SKIP_NAMES \
                    and _root_name(child) in ("pytest", "unittest", "mark", "self"):
                # pytest.skip.Exception is only a skip where it is raised (below)
                hit = not (isinstance(node, ast.Attribute) and node.attr == "Exception"
                           and not _raised(tree, node))
            elif isinstance(child, ast.ImportFrom) and child.module in ("pytest", "unittest"):
                hit = any(a.name in SKIP_NAMES for a in child.names)
            if hit:
                found.append((rel, where, child.lineno))
            visit(child, inner)

    visit(tree, "<module>")
    return sorted(found, key=lambda s: s[2])


def _root_name(node) -> str | None:  # type: ignore[no-untyped-def]
    """``pytest`` for ``pytest.mark.skip``: whose attribute it is (``plan.skip`` is none of
    pytest's)."""
    import ast

    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _raised(tree, attr) -> bool:  # type: ignore[no-untyped-def]
    import ast

    return any(isinstance(n, ast.Raise) and n.exc is not None
               and any(m is attr for m in ast.walk(n.exc)) for n in ast.walk(tree))


def _test_sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text()
            for p in sorted((REPO / "tests").rglob("*.py"))
            if "data" not in p.relative_to(REPO / "tests").parts[:1]}


def test_every_skip_fails_where_everything_must_run() -> None:
    """No test skips silently under DTRAIN_REQUIRE_CLUSTER=1 (issue 51: nine sites did):
    a skip site outside SKIP_ALLOWED is named with its file, function and line."""
    sites = [s for rel, text in _test_sources().items() for s in skip_sites(text, rel)]
    loose = [f"{rel}:{line} in {where}" for rel, where, line in sites
             if (rel, where) not in SKIP_ALLOWED]
    assert loose == [], ("skip through tests/util.py's cannot_run (or need_module, "
                         "need_root), or list hardware this machine cannot have in "
                         "SKIP_ALLOWED with why")
    listed = {(rel, where) for rel, where, _ in sites}
    assert sorted(set(SKIP_ALLOWED) - listed) == [], "SKIP_ALLOWED names a site that is gone"
    assert all(why.strip() for why in SKIP_ALLOWED.values())


def test_the_skip_scan_finds_every_form() -> None:
    source = '''
import pytest
from pytest import importorskip
import unittest
pytestmark = [pytest.mark.ssh, pytest.mark.skipif(True, reason="x")]

@pytest.mark.skip
def test_a():
    pytest.skip("no")

@pytest.mark.skipif(True, reason="y")
def test_b(request):
    request.applymarker(pytest.mark.skip(reason="z"))
    raise pytest.skip.Exception("w")

class TestC(unittest.TestCase):
    @unittest.skipUnless(False, "v")
    def test_c(self):
        self.skipTest("u")

def test_fine(plan):
    assert plan.skip == [] and plan.skipif
    with pytest.raises(pytest.skip.Exception):
        cannot_run("not a skip site: the route")
    pytest.importorskip("torch")
'''
    assert [(w, n) for _, w, n in skip_sites(source, "t.py")] == [
        ("<module>", 3), ("<module>", 5), ("test_a", 7), ("test_a", 9), ("test_b", 11),
        ("test_b", 13), ("test_b", 14), ("test_c", 17), ("test_c", 19), ("test_fine", 25)]


def test_one_fuzz_run_keeps_its_count_seed_and_commit(tmp_path: Path) -> None:
    """`python -m tests.fuzzing --parser NAME --examples N --seed S` (docs/reliability.md):
    the parser's test alone, N examples of seed S, its exact count and commit in one file."""
    import json

    from tests import fuzzing

    assert len(fuzzing.parsers()) == 22 and "env_args" in fuzzing.parsers()
    res = subprocess.run([sys.executable, "-m", "tests.fuzzing", "--parser", "env_args",
                          "--examples", "30", "--seed", "5", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (path,) = tmp_path.glob("fuzz-*-env_args-seed5.json")
    doc = json.loads(path.read_text())
    assert (doc["parser"], doc["examples"], doc["seed"], doc["failures"]) == \
        ("env_args", 30, 5, 0)
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert doc["commit"] == head and path.name.startswith(f"fuzz-{head}-{doc['date']}-")
    assert doc["command"] == "python -m tests.fuzzing --parser env_args --examples 30 --seed 5"
    assert all(not p.startswith((" ", "?")) and "/" in p for p in doc["differs_from_commit"])
    bad = subprocess.run([sys.executable, "-m", "tests.fuzzing", "--parser", "nope",
                          "--examples", "1"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "no parser 'nope'" in bad.stderr
