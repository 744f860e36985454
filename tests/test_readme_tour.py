"""README.md's "A 5-minute tour", run as written (issue 55): the README cannot drift from
the code again.

The commands are read from the README itself (``tour_commands``: every fenced bash block of
the section, one command per logical line, comments and blank lines skipped, the text kept
exactly as written). Two checks:

- **every option exists** (no cluster): each ``dtrain ...`` in a command (after a pipe,
  inside ``$(...)`` too) is parsed by dtrain's own click command tree; an option that
  dtrain does not have fails the test (``unknown_options``; shown failing on a copy of the
  README with one option changed).
- **every command runs** (the real-sshd cluster): each command goes to ``bash -c`` exactly
  as written, one after the other in one prepared working directory, each command's
  exports carried to the next (``export DTRAIN_PERSIST=10m`` then applies to what follows,
  as in the reader's shell), and its exit code is checked against ``EXPECTED`` (0, or the
  documented code the test cluster gives). What the test changes, and nothing else:

  * ``dtrain`` on PATH is ``python -m launcher`` from this repo;
  * HOME is a copy of the cluster's client home (its key, known_hosts and ssh config, the
    key also as ``id_ed25519_dtrain`` where ``keys`` looks), holding a
    ``~/.config/dtrain/config.toml`` with ``python =`` the cluster's Python (docs/config.md):
    the commands' ``--python`` given by the config file, not by editing them;
  * hosts.txt: the tour's ``printf`` writes ``node[1-4] slots=8``, checked, then replaced by
    ``node[1-4] slots=1``: 32 CPU ranks do not fit the test machine (the names are the
    cluster's own, through its ssh config);
  * the working directory holds what the commands name: ``examples/`` and ``hostfiles/``
    (links to the repo's), ``secrets.env``, ``./code``; every node has ``~/proj/logs/a.log``
    for the ``--pull``;
  * the README's example run ids (``RUN_IDS``) stand for runs of the tour: each is replaced
    by the id of the run the tour made before it (``run_id_for``), data, not an option;
  * ``SUBSTITUTE`` lists the commands that cannot run here, each with why; such a command
    runs with options added right after its name (``--dry-run --offline`` for the run
    whose ``--setup`` sources a venv the nodes lack; ``--once`` for ``top``'s full screen),
    which proves its options parse and are read, and must exit 0; the ``--setup`` run is
    then made for real without its ``--setup`` words (the run ``logs`` and ``report`` read).

  ``EXPECTED`` names the commands whose code on the test cluster is not 0, with why
  (``exec ... nvidia-smi``: 127 on the nodes without one; ``smoke --min-busbw 20``: 1;
  ``stacks`` after ``attach`` followed the run to its end: 1), and ``CHECKS`` what a few
  comments promise (``./logs/<host>/``, the report's file, ``doctor.json``'s schema).
  ``keys setup`` runs as written: the key it would install already works, so it asks for
  no password.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.util import REPO, TRACEBACK

README = REPO / "README.md"
TOUR = "A 5-minute tour"


@dataclass(frozen=True)
class Command:
    """One command of the tour: ``text`` as written (continuation lines and a trailing
    comment included: bash reads them), ``line`` its first line in the README."""

    text: str
    line: int


def tour_commands(markdown: str, section: str = TOUR) -> list[Command]:
    """Every command of the fenced bash blocks under the ``## section`` heading."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("## ") and line[3:].strip() == section), None)
    assert start is not None, f"no '## {section}' section"
    out: list[Command] = []
    fence: str | None = None
    pending: list[str] = []
    first = 0
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if fence is None:
            if line.startswith("## "):
                break
            m = re.match(r"^(```+|~~~+)\s*(\w*)", line)
            if m:
                fence = m.group(1) if m.group(2) in ("bash", "sh", "shell", "console") \
                    else m.group(1) + "skip"
            continue
        if line.startswith(fence.removesuffix("skip")) and line.strip("`~ ") == "":
            assert not pending, f"README.md:{first + 1}: a continuation runs past its block"
            fence = None
            continue
        if fence.endswith("skip"):
            continue
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            first = i
        pending.append(line)
        if not line.endswith("\\"):
            out.append(Command("\n".join(pending), first + 1))
            pending = []
    assert fence is None, f"README.md: the block in '## {section}' is not closed"
    return out


SEPARATORS = {"|", "||", "&&", ";", "&", "|&"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}


def dtrain_argvs(text: str) -> list[list[str]]:
    """The argv of every ``dtrain`` the command runs (each simple command of a pipeline or
    list, and each ``$(dtrain ...)``), words as bash would give them (quotes removed; no
    expansion: the options are literal in the README)."""
    lex = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    words = list(lex)
    found: list[list[str]] = []
    for word in words:  # $(dtrain ...) inside a word: eval "$(dtrain completion bash)"
        for inner in re.findall(r"\$\(([^()]*)\)", word):
            found += dtrain_argvs(inner)
    simple: list[str] = []
    skip = False
    for word in [*words, ";"]:
        if skip:
            skip = False
            continue
        if word in REDIRECTS:
            skip = True
            continue
        if word in SEPARATORS:
            if simple and simple[0] == "dtrain":
                found.append(simple)
            simple = []
            continue
        simple.append(word)
    return found


def _click() -> tuple[type, type]:
    """(Context, UsageError) of the click that dtrain's typer builds on (typer >= 0.17
    carries its own copy, typer._click)."""
    try:
        from typer._click.core import Context
        from typer._click.exceptions import UsageError
    except ImportError:  # an older typer on the pip click
        from click import Context, UsageError
    return Context, UsageError


def unknown_options(argv: list[str]) -> list[str]:
    """What dtrain's own command tree refuses in ``argv`` (``["dtrain", ...]``): an unknown
    command or option, an option missing its value. [] when it parses. Only click's parser
    runs (no value checks, no callbacks: nothing read, nothing connected)."""
    import typer

    from launcher.cli import app

    context, usage_error = _click()
    cmd = typer.main.get_command(app)
    args = argv[1:]
    path = ["dtrain"]
    while hasattr(cmd, "commands") and args and not args[0].startswith("-"):
        sub = cmd.commands.get(args[0])
        if sub is None:
            return [f"no command '{' '.join([*path[1:], args[0]])}'"]
        path.append(args[0])
        cmd, args = sub, args[1:]
    try:
        ctx = context(cmd, info_name=" ".join(path), **(cmd.context_settings or {}))
        cmd.make_parser(ctx).parse_args(list(args))
    except usage_error as e:
        return [e.format_message()]
    return []


def test_the_tour_is_read_as_written() -> None:
    """The extraction: commands in order, continuations joined with their backslashes,
    comments and blank lines skipped, nothing outside the section or outside bash blocks."""
    md = ("# x\n\n```bash\ndtrain outside\n```\n\n## A 5-minute tour\n\ntext\n\n"
          "```bash\n# a comment\nprintf 'a\\n' > hosts.txt   # trailing\n\n"
          "dtrain run -f hosts.txt \\\n    --dry-run x.py\n```\n\n```text\ndtrain not-bash\n```\n"
          "```bash\ndtrain ps\n```\n\n## Next\n\n```bash\ndtrain after\n```\n")
    got = tour_commands(md)
    assert [c.text for c in got] == [
        "printf 'a\\n' > hosts.txt   # trailing",
        "dtrain run -f hosts.txt \\\n    --dry-run x.py",
        "dtrain ps"]
    assert [c.line for c in got] == [13, 15, 23]
    assert dtrain_argvs(got[1].text) == [["dtrain", "run", "-f", "hosts.txt", "--dry-run",
                                          "x.py"]]
    assert dtrain_argvs("dtrain logs x --json | jq .") == [["dtrain", "logs", "x", "--json"]]
    assert dtrain_argvs('eval "$(dtrain completion bash)"  # zsh') == [
        ["dtrain", "completion", "bash"]]
    assert dtrain_argvs("dtrain doctor -f h --json > doctor.json") == [
        ["dtrain", "doctor", "-f", "h", "--json"]]


def test_every_tour_option_exists() -> None:
    """Each dtrain command of the README's tour parses with dtrain's own options."""
    commands = tour_commands(README.read_text())
    assert len(commands) >= 30, [c.text for c in commands]
    argvs = [(c, argv) for c in commands for argv in dtrain_argvs(c.text)]
    assert len(argvs) >= 25
    bad = [f"README.md:{c.line}: {' '.join(argv)}: {why}"
           for c, argv in argvs for why in unknown_options(argv)]
    assert bad == []


@pytest.mark.parametrize("old, new, why", [
    ("--accept-new", "--accept-any", "--accept-any"),
    ("--gather", "--gathr", "--gathr"),
    ("--grace 30", "--grace", "--grace"),
    ("dtrain ps", "dtrain pss", "pss"),
], ids=["keys-option", "exec-option", "missing-value", "command"])
def test_a_changed_option_in_the_readme_fails(old: str, new: str, why: str) -> None:
    """The check fails on a copy of the README with one option changed (README.md itself
    is never edited): the option named, at its README line."""
    text = README.read_text()
    assert old in text
    commands = tour_commands(text.replace(old, new, 1))
    bad = [(c.line, problem) for c in commands for argv in dtrain_argvs(c.text)
           for problem in unknown_options(argv)]
    assert len(bad) == 1, bad
    line = next(i for i, t in enumerate(text.splitlines(), 1) if old in t)
    assert bad[0][0] == line and why in bad[0][1], bad


# -- the tour, run on the real-sshd cluster ----------------------------------------------------

# the README's example run ids: each stands for the run the tour made before it (the latest
# in the archive then): `dtrain logs ID`, `dtrain report ID`, `dtrain stop ID`, `dtrain top ID`
RUN_ID = re.compile(r"\b20\d{6}-\d{6}-[0-9a-f]{4}\b")

# Commands that cannot run as written here: (a piece of the command, naming exactly one,
# the options added right after the command's name, why). They prove the command's options
# parse and are read; the command must then exit 0.
SUBSTITUTE: list[tuple[str, str, str]] = [
    ("--setup 'source /opt/venv/bin/activate'", "--dry-run --offline",
     "/opt/venv is not on the test cluster's nodes (the tour's venv on a real cluster), and a "
     "dry run that connects runs --setup too: the plan from the hostfile alone, the env "
     "file read; the run itself the next commands read is made without --setup (below)"),
    ("dtrain top -f hosts.txt", "--once", "the full-screen view waits for q"),
    ("dtrain top 2026", "--once", "the full-screen view waits for q"),
]
# the --setup run, made for real without its --setup (the venv's activation, not on the
# nodes): `dtrain logs --rank 0-3 --host node2 --grep loss` and `dtrain report ID` read it
WITHOUT_SETUP = " --setup 'source /opt/venv/bin/activate'"

# Exit codes other than 0 on the test cluster: (a piece of the command, code, why; the
# code documented in README.md's exit codes table)
EXPECTED: list[tuple[str, int, str]] = [
    ("-- nvidia-smi -L", 127,
     "exec: the largest remote code; node1-3 have no nvidia-smi (command not found, 127), "
     "node4's is the fake one (tests/cluster/gpus.py)"),
    ("dtrain stacks ", 1,
     "in the tour's order `dtrain attach` followed the detached run to its end: stacks "
     "finds it not running, with no dump in its archive, and says so (exit 1)"),
    ("--min-busbw 20", 1,
     "gloo over the test cluster's veths gives ~0.4 GB/s busbw, under 20: smoke's FAIL "
     "(exit 1), the slowest pair named"),
]



def _doctor_json(work: Path, out: str) -> None:
    import json

    assert json.loads((work / "doctor.json").read_text())["schema"] == "dtrain.doctor/1"


# what a command's comment promises, checked after it: (a piece of the command, check)
CHECKS: list[tuple[str, Callable[[Path, str], None]]] = [
    ("printf '%s|' 'a b' '$HOME'", lambda work, out: _assert(out.count("a b|$HOME|") == 4, out)),
    ("--pull -r '~/proj/logs/*.log' ./logs/", lambda work, out: _assert(
        all((work / "logs" / f"node{k}" / "a.log").read_text() == f"node{k}\n"
            for k in range(1, 5)), out)),
    ("dtrain report 2026", lambda work, out: _assert(
        len(list(work.glob("dtrain-report-*.html"))) == 1, out)),
    ("--junit smoke.xml", lambda work, out: _assert((work / "smoke.xml").stat().st_size > 0, out)),
    ("--json > doctor.json", _doctor_json),
]


def _assert(ok: bool, out: str) -> None:
    assert ok, out[-3000:]


# the harness, not the commands: what runs each one in bash (pipefail: a failing dtrain is
# not hidden by the `| jq .` after it), then keeps its exports for the next
RUNNER = ("set -o pipefail\n{text}\n__tour_rc=$?\nenv -0 > \"$__TOUR_ENV\"\n"
          "exit $__tour_rc\n")
SHELL_OWN = {"_", "SHLVL", "PWD", "OLDPWD", "__TOUR_ENV"}


def _one(commands: list[Command], piece: str) -> Command:
    hits = [c for c in commands if piece in c.text]
    assert len(hits) == 1, f"{piece!r} names {len(hits)} tour commands, not one"
    return hits[0]


def test_the_substitutions_name_tour_commands() -> None:
    """Each entry of SUBSTITUTE, EXPECTED and CHECKS names exactly one command of the tour (an entry
    whose command left the README must go), and WITHOUT_SETUP is in its command."""
    commands = tour_commands(README.read_text())
    for piece, *_ in (*SUBSTITUTE, *EXPECTED, *CHECKS):
        _one(commands, piece)
    assert WITHOUT_SETUP in _one(commands, SUBSTITUTE[0][0]).text


def _latest_run(state: Path) -> str:
    runs = sorted(p.name for p in (state / "dtrain" / "runs").iterdir()
                  if RUN_ID.fullmatch(p.name))
    assert runs, "the tour has made no run yet"
    return runs[-1]


def _bash(text: str, env: dict[str, str], cwd: Path, envfile: Path,
          timeout: float = 300) -> tuple[int, str, dict[str, str]]:
    """(exit code, stdout+stderr, the environment after it) of ``text`` run by bash."""
    envfile.unlink(missing_ok=True)
    proc = subprocess.run(["bash", "-c", RUNNER.format(text=text)], cwd=cwd,
                          env={**env, "__TOUR_ENV": str(envfile)}, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    after = dict(env)
    if envfile.exists():
        pairs = (e.split("=", 1) for e in envfile.read_text().split("\0") if "=" in e)
        after = {k: v for k, v in pairs if k not in SHELL_OWN}
    return proc.returncode, proc.stdout, after


@pytest.fixture
def tour_dir(cluster, tmp_path: Path):
    """The working directory and environment the tour runs in (the module docstring's
    list), removed after; the keeper DTRAIN_PERSIST starts is closed."""
    import uuid

    from tests.util import end_pid

    work = Path(cluster.shared_dir) / f"tour-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    work.chmod(0o755)  # the nodes read the scripts here as dtuser (a shared filesystem)
    for name in ("examples", "hostfiles"):
        (work / name).symlink_to(REPO / name)
    (work / "secrets.env").write_text("TOUR_SECRET=s3cret\n")
    (work / "code").mkdir()
    (work / "code" / "main.py").write_text("print('tour')\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dtrain").write_text(
        f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}} "
        f"exec {shlex.quote(sys.executable)} -m launcher \"$@\"\n")
    (bin_dir / "dtrain").chmod(0o755)
    home = tmp_path / "home"
    shutil.copytree(Path(cluster.client_env()["HOME"]), home, symlinks=True,
                    ignore=shutil.ignore_patterns("*.sock"))  # a killed run's socket
    ssh = home / ".ssh"
    shutil.copy(ssh / "id_ed25519", ssh / "id_ed25519_dtrain")
    shutil.copy(ssh / "id_ed25519.pub", ssh / "id_ed25519_dtrain.pub")
    config = home / ".config" / "dtrain" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f"python = {str(cluster.python)!r}\n")
    runtime = tmp_path / "runtime"  # a keeper of its own (DTRAIN_PERSIST=10m starts one)
    runtime.mkdir(mode=0o700)
    env = cluster.client_env(HOME=str(home), XDG_RUNTIME_DIR=str(runtime),
                             PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env.pop("XDG_CONFIG_HOME", None)
    made: list[Path] = []
    for node in cluster.nodes:  # what `dtrain cp --pull '~/proj/logs/*.log'` fetches
        for name in ("proj", "ckpt"):
            if not (node.home / name).exists():
                made.append(node.home / name)
        logs = node.home / "proj" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "a.log").write_text(f"{node.name}\n")
        st = node.home.stat()
        for path in (node.home / "proj", logs, logs / "a.log"):
            os.chown(path, st.st_uid, st.st_gid)
    try:
        yield work, env
    finally:
        listing = subprocess.run(["dtrain", "connections", "--json"], env=env,
                                 capture_output=True, text=True, check=False)
        subprocess.run(["dtrain", "connections", "close"], env=env, capture_output=True,
                       check=False)
        try:
            import json

            pid = (json.loads(listing.stdout).get("keeper") or {}).get("pid")
        except ValueError:
            pid = None
        if pid:
            end_pid(pid)
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.ssh
@pytest.mark.torch
@pytest.mark.timeout(1200)
def test_the_tour_runs_as_written(cluster, tour_dir) -> None:
    """Every command of the tour, in order, through bash in one working directory, on the
    4-node cluster: each exits 0, or its EXPECTED code; a SUBSTITUTE one with its option
    appended exits 0."""
    work, env = tour_dir
    state = Path(env["XDG_STATE_HOME"])
    envfile = work.parent / f".{work.name}.env"
    subs = {piece: (extra, why) for piece, extra, why in SUBSTITUTE}
    codes = {piece: code for piece, code, _ in EXPECTED}
    ran: list[str] = []
    try:
        for cmd in tour_commands(README.read_text()):
            text = cmd.text
            if RUN_ID.search(text):
                text = RUN_ID.sub(_latest_run(state), text)
            want = next((c for piece, c in codes.items() if piece in cmd.text), 0)
            piece = next((p for p in subs if p in cmd.text), None)
            if piece is not None:
                # the option goes before the trailing comment and the script's arguments
                # would take it: after dtrain's own words, right after the command's name
                argv = dtrain_argvs(text)[0]
                sub = " ".join(argv[:3] if argv[1] in ("keys", "nodes") else argv[:2])
                assert sub in text
                text = text.replace(sub, f"{sub} {subs[piece][0]}", 1)
                want = 0
            rc, out, env = _bash(text, env, work, envfile)
            ran.append(f"README.md:{cmd.line}: rc {rc}: {text}")
            assert rc == want, (f"README.md:{cmd.line}: exit {rc}, expected {want}:\n"
                                f"{text}\n{out[-3000:]}")
            assert not TRACEBACK.search(out), out[-3000:]  # dtrain's own (a rank's is tagged)
            for piece, check in CHECKS:
                if piece in cmd.text:
                    check(work, out)
            if text.startswith("printf 'node[1-4] slots=8"):
                # the hostfile the tour wrote, then the test cluster's: 1 slot per node
                assert (work / "hosts.txt").read_text() == "node[1-4] slots=8\n"
                (work / "hosts.txt").write_text("node[1-4] slots=1\n")
            if piece is not None and WITHOUT_SETUP in cmd.text:
                real = cmd.text.replace(WITHOUT_SETUP, "")
                rc, out, env = _bash(real, env, work, envfile)
                ran.append(f"README.md:{cmd.line}: rc {rc}: {real}")
                assert rc == 0, f"README.md:{cmd.line}: exit {rc}:\n{real}\n{out[-3000:]}"
    finally:
        envfile.unlink(missing_ok=True)
        print("\n".join(ran))
