"""House rules that only tests keep (issue 54, item 4; docs/architecture.md "House rules").

Each rule reads the source (ast, no import) and has an allow-list whose every entry gives
its reason. A new exception is added here, with its reason, or the code is fixed: the rule
never silently widens. Each rule is shown to see a violation in a small sample (the
``*_sees_*`` tests), so an empty result means the rule looked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.util import REPO

LAUNCHER = REPO / "launcher"
MAX_LINES = 700

# module -> (its size today, why it is over the cap); it may shrink, never grow
OVERSIZE = {
    "launcher/nodeside/sampler.py": (736, "a node program sent whole to every node; its split "
                                     "(the GPU/NVML readers apart from the loop) changes the "
                                     "bundle and is issue 54's next step"),
}

# the package's top level: the entry and the cross-cutting basics only
TOP_LEVEL = {
    "__init__.py": "the package",
    "__main__.py": "python -m launcher",
    "start.py": "the console script's entry point (stdlib only, before every command)",
    "_quiet_import.py": "import-time hooks installed by __init__ (asyncssh's probes, help)",
    "aio.py": "asyncio habits every layer shares",
    "errors.py": "DtrainError and its kinds, raised by every layer",
    "exitcodes.py": "the exit codes, read by every layer and by start.py",
    "models.py": "Host and the other plain records every layer passes",
    "private.py": "the login node's trust boundary: one helper for private places",
    "defaults.py": "the defaults several layers share (fanout, timeouts), spelled once",
    "runrecord.py": "the run record's typed fields, written by commands and read by output",
}

# (module, function) -> why a cancellation-swallowing suppress is right there
SUPPRESS_OK = {
    ("launcher/cli/resident.py", "become"): "a forked child's last lines: no event loop, "
    "nothing to cancel; atexit handlers and flushes must not keep it from _exit",
}

# (module, function) -> why a task is made with asyncio.ensure_future/create_task, not in a
# TaskGroup, and who owns it
TASKS_OK = {
    ("launcher/aio.py", "cleanup"): "the shielded cleanup itself, awaited to its end",
    ("launcher/transports/keeper/client.py", "_keeper_ready"): "self._ready: shared by every "
    "connect, awaited through shield, cancelled and awaited in aclose",
    ("launcher/transports/keeper/client.py", "__init__"): "KeeperProcess._pump: awaited in "
    "wait() (its end follows the status)",
    ("launcher/transports/keeper/nodeagent.py", "__init__"): "pump and errs: cancelled and "
    "awaited in aclose",
    ("launcher/transports/keeper/nodeagent.py", "spawn_task"): "kept in self.tasks, "
    "cancelled and awaited in aclose",
    ("launcher/transports/keeper/nodeagent.py", "send"): "self.flusher: cancelled and "
    "awaited in aclose",
    ("launcher/transports/keeper/nodeagent.py", "run_job"): "inbound: cancelled and awaited "
    "in the finally",
    ("launcher/commands/cp/relay.py", "_arrive"): "kept in self._tasks (a tracked set), "
    "awaited by the relay's close",
    ("launcher/commands/cp/request.py", "small"): "a shared read in a thread: kept in "
    "self._reads and awaited (shielded) by every node that asked for it",
    ("launcher/commands/cp/stream.py", "_apply_plan"): "gathered, then cancelled and awaited "
    "in the finally (cancel_and_wait)",
    ("launcher/transports/local.py", "aclose"): "each process's wait(), waited for with a "
    "deadline, the late ones killed",
    ("launcher/transports/keeper/server.py", "close"): "kept in self.closing; gathered, "
    "bounded, at exit",
    ("launcher/transports/keeper/server.py", "relay"): "inbound: cancelled and awaited in "
    "the finally",
    ("launcher/transports/keeper/server.py", "main_async"): "housekeeping: cancelled and "
    "awaited in the finally",
}

# where every close must be bounded (issue 54 named the keeper's unbounded aclose); the rest
# of the package closes through job/stoppable.py and transports whose own aclose is bounded
BOUNDED_CLOSE_SCOPE = ("launcher/transports/keeper/", "launcher/cli/resident.py",
                       "launcher/start.py", "launcher/private.py")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(LAUNCHER.rglob("*.py")):
        yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text())


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """Every node with the name of the innermost function around it ('' at module level)."""
    def walk(node: ast.AST, fn: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else fn
            yield name, child
            yield from walk(child, name)
    yield from walk(tree, "")


# ------------------------------------------------------------------ modules and the top

def test_no_module_is_over_700_lines() -> None:
    over = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        n = len(path.read_text().splitlines())
        cap = OVERSIZE[rel][0] if rel in OVERSIZE else MAX_LINES
        if n > cap:
            over.append(f"{rel}: {n} lines (cap {cap})")
    assert over == []


def test_the_top_level_holds_only_the_entry_and_the_basics() -> None:
    loose = sorted(p.name for p in LAUNCHER.glob("*.py") if p.name not in TOP_LEVEL)
    assert loose == [], "put them in a subpackage, or name them in TOP_LEVEL with a reason"
    assert all(reason for reason in TOP_LEVEL.values())


# ------------------------------------------------------------ cancellation and tasks

_SWALLOWS = {"BaseException", "CancelledError", "asyncio.CancelledError"}


def _suppresses_cancellation(node: ast.AST) -> bool:
    if not isinstance(node, (ast.With, ast.AsyncWith)):
        return False
    for item in node.items:
        call = item.context_expr
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("suppress"):
            if any(ast.unparse(arg) in _SWALLOWS for arg in call.args):
                return True
    return False


def _suppress_sites(tree: ast.AST, rel: str) -> list[tuple[str, str, int]]:
    return [(rel, fn, node.lineno) for fn, node in _functions(tree)
            if _suppresses_cancellation(node)]


def test_no_suppression_of_cancellation() -> None:
    """`suppress(BaseException)` or `suppress(CancelledError)` hides a Ctrl-C or a task
    group's abort: aio.cancel_and_wait is the way to end a helper task."""
    bad = [f"{rel}:{line} in {fn}()" for rel, tree in _modules()
           for rel, fn, line in _suppress_sites(tree, rel) if (rel, fn) not in SUPPRESS_OK]
    assert bad == []


def test_the_suppression_rule_sees_one() -> None:
    sample = ast.parse("async def f(t):\n    with contextlib.suppress(asyncio.CancelledError):"
                       "\n        await t\n")
    assert _suppress_sites(sample, "x.py") == [("x.py", "f", 2)]


def _loose_tasks(tree: ast.AST, rel: str) -> list[tuple[str, str, int]]:
    found = []
    for fn, node in _functions(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("asyncio.ensure_future", "asyncio.create_task", "loop.create_task",
                        "ensure_future", "create_task"):
                found.append((rel, fn, node.lineno))
    return found


def test_every_task_is_owned() -> None:
    """A task outside a TaskGroup (`tg.create_task`) is named here with its owner."""
    bad = [f"{rel}:{line} in {fn}()" for rel, tree in _modules()
           for rel, fn, line in _loose_tasks(tree, rel) if (rel, fn) not in TASKS_OK]
    assert bad == []
    assert all(reason for reason in TASKS_OK.values())


def test_the_task_rule_sees_one() -> None:
    sample = ast.parse("async def f():\n    asyncio.ensure_future(g())\n    async with "
                       "asyncio.TaskGroup() as tg:\n        tg.create_task(g())\n")
    assert _loose_tasks(sample, "x.py") == [("x.py", "f", 2)]


# ------------------------------------------------------------------- bounded closes

def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _unbounded_closes(tree: ast.AST, rel: str) -> list[tuple[str, int]]:
    up = _parents(tree)
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Await) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr in ("aclose", "wait_closed")):
            continue
        at: ast.AST | None = node
        bounded = False
        while at is not None and not bounded:
            if isinstance(at, ast.AsyncWith):
                bounded = any("timeout" in ast.unparse(i.context_expr) for i in at.items)
            at = up.get(at)
        if not bounded:
            bad.append((rel, node.lineno))
    return bad


def test_every_close_in_the_keeper_and_the_resident_is_bounded() -> None:
    """`await x.aclose()` there runs under aio.cleanup(..., CLOSE_S) or a timeout: a node
    that never answers a close must not hold the keeper."""
    bad = [f"{rel}:{line}" for rel, tree in _modules() if rel.startswith(BOUNDED_CLOSE_SCOPE)
           for rel, line in _unbounded_closes(tree, rel)]
    assert bad == []


def test_the_close_rule_sees_one() -> None:
    sample = ast.parse("async def f(c):\n    await c.aclose()\n    await cleanup(c.aclose(), "
                       "5)\n    async with asyncio.timeout(1):\n        await c.aclose()\n")
    assert _unbounded_closes(sample, "x.py") == [("x.py", 2)]


def test_allow_lists_name_only_what_exists() -> None:
    """An entry whose site was fixed goes: the lists never hold stale permissions."""
    suppress = {(rel, fn) for rel, tree in _modules() for rel, fn, _ in _suppress_sites(tree, rel)}
    tasks = {(rel, fn) for rel, tree in _modules() for rel, fn, _ in _loose_tasks(tree, rel)}
    assert set(SUPPRESS_OK) <= suppress, set(SUPPRESS_OK) - suppress
    assert set(TASKS_OK) <= tasks, set(TASKS_OK) - tasks
    for rel, (size, _why) in OVERSIZE.items():
        assert len((REPO / rel).read_text().splitlines()) <= size
    assert set(TOP_LEVEL) <= {p.name for p in LAUNCHER.glob("*.py")}


# ------------------------------------------------------------------ one home for defaults

SHARED_DEFAULTS = {"fanout", "connect_timeout", "heartbeat_timeout", "heartbeat_interval",
                   "grace"}
# module -> why it still spells a shared default itself
DEFAULTS_PENDING: dict[str, str] = {}


def _literal_defaults(tree: ast.AST, rel: str) -> list[tuple[str, str, int]]:
    """Fields (`fanout: int = 64`) and parameters (`fanout: FanoutOpt = 64`) of the shared
    settings whose default is a number written in place."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id in SHARED_DEFAULTS and isinstance(node.value, ast.Constant) \
                and node.value.value is not None:
            found.append((rel, node.target.id, node.lineno))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional = node.args.posonlyargs + node.args.args
            args = positional + node.args.kwonlyargs
            defaults = [None] * (len(positional) - len(node.args.defaults)) \
                + list(node.args.defaults) + list(node.args.kw_defaults)
            for arg, default in zip(args, defaults, strict=True):
                if arg.arg in SHARED_DEFAULTS and isinstance(default, ast.Constant) \
                        and default.value is not None:
                    found.append((rel, arg.arg, default.lineno))
    return found


def test_shared_defaults_are_spelled_once() -> None:
    """--fanout, --connect-timeout, the heartbeat and the grace start from launcher/defaults.py
    in typer's options, the requests and the job's settings alike."""
    bad = [f"{rel}:{line} {name}" for rel, tree in _modules()
           if not rel.startswith("launcher/nodeside/") and rel not in DEFAULTS_PENDING
           for rel, name, line in _literal_defaults(tree, rel)]
    assert bad == []


def test_the_defaults_rule_sees_one() -> None:
    sample = ast.parse("def f(fanout: int = 64, grace: float = defaults.GRACE_S): ...\n"
                       "class R:\n    heartbeat_timeout: float = 30.0\n")
    assert _literal_defaults(sample, "x.py") == [("x.py", "fanout", 1),
                                                 ("x.py", "heartbeat_timeout", 3)]


# ------------------------------------------------------ the run's middle in small pieces

# packages split so that each piece is read at once (issue 54 item 2): no module over
# SMALL_MODULE lines, no function (a method, a nested one) over SMALL_FUNCTION lines
SMALL_PACKAGES = {
    "launcher/commands/launch": "the knot every run feature passes through (was one 592-line "
    "module with a 167-line supervise): the pipeline, the node board, the recorder, the "
    "attempt",
}
SMALL_MODULE = 300
SMALL_FUNCTION = 60


def _too_long(tree: ast.Module, rel: str, lines: int) -> list[str]:
    """The module if it is over SMALL_MODULE lines, each function over SMALL_FUNCTION (from
    its first decorator to its last line)."""
    found = [f"{rel}: {lines} lines (cap {SMALL_MODULE})"] if lines > SMALL_MODULE else []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = (node.end_lineno or node.lineno) - first + 1
            if n > SMALL_FUNCTION:
                found.append(f"{rel}: {node.name}() {n} lines (cap {SMALL_FUNCTION})")
    return found


def test_the_small_packages_have_small_modules_and_functions() -> None:
    bad = []
    for package in SMALL_PACKAGES:
        modules = sorted((REPO / package).glob("*.py"))
        assert modules, f"{package}: no such package"
        for path in modules:
            text = path.read_text()
            bad += _too_long(ast.parse(text), path.relative_to(REPO).as_posix(),
                             len(text.splitlines()))
    assert bad == []
    assert all(reason for reason in SMALL_PACKAGES.values())


def test_the_size_rule_sees_a_long_function_and_module() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(SMALL_FUNCTION))
    sample = f"@decorated\nasync def f():\n{body}\ndef g():\n    pass\n"
    assert _too_long(ast.parse(sample), "x.py", 10) == [
        f"x.py: f() {SMALL_FUNCTION + 2} lines (cap {SMALL_FUNCTION})"]  # its decorator counts
    assert _too_long(ast.parse("pass\n"), "x.py", SMALL_MODULE + 1) == [
        f"x.py: {SMALL_MODULE + 1} lines (cap {SMALL_MODULE})"]
