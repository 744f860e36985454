"""What tests/test_fuzz_parsers.py shares: the number of examples, the guard every example
runs under (a time bound, a memory bound, the error type), and input strategies that look
like what each parser reads (its grammar's tokens mixed with any text), so hypothesis gets
past the first character.

``DTRAIN_FUZZ_EXAMPLES`` scales every parser's examples (CI: the default below; the long run
of docs/reliability.md: 100000). ``DTRAIN_FUZZ_SEED`` picks another random stream for a long
run (CI is derandomized: the same examples every time).

One parser's run, counted and kept (docs/reliability.md): ``python -m tests.fuzzing --parser
NAME --examples N --seed S`` runs that parser's test alone in pytest with those settings and
writes ``bench/results/fuzz-<commit>-<date>-<NAME>-seed<S>.json``: the examples it ran (an
exact count), the seed, the commit (and any file of launcher/ or tests/ that differed from
it), the date and the failures. ``--parser list`` names the parsers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("DTRAIN_FUZZ_EXAMPLES", "60"))
SEED = os.environ.get("DTRAIN_FUZZ_SEED")
TIME_S = 10.0  # one example may take this long on a loaded machine; more is a hang
MEMORY = 64 << 20  # one example may allocate this much at its peak; more is unbounded

FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=SEED is None, print_blob=True,
                suppress_health_check=list(HealthCheck))

F = TypeVar("F", bound=Callable[..., Any])


COUNTS = os.environ.get("DTRAIN_FUZZ_COUNTS")  # the long run: examples per test, kept here
_counted: dict[str, int] = {}


def _dump_counts() -> None:
    if COUNTS:
        import json

        with open(COUNTS, "w") as fh:
            json.dump(_counted, fh)


if COUNTS:  # the exact count at the end (a run cut short keeps its last multiple of 50)
    import atexit

    atexit.register(_dump_counts)


def _count() -> None:
    """One more example of the current test, in DTRAIN_FUZZ_COUNTS every 50 (a long run is
    cut by a timeout: what it reached is on disk)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].rpartition("::")[2]
    _counted[test] = _counted.get(test, 0) + 1
    if COUNTS and _counted[test] % 50 == 0:
        _dump_counts()


class Hang(Exception):
    """An example ran past TIME_S."""


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    """Run one example under TIME_S (SIGALRM: a hang raises Hang where it loops) and
    MEMORY (tracemalloc's peak)."""
    def alarm(signum: int, frame: object) -> None:
        raise Hang(f"an example ran for more than {TIME_S:g} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_S)
    started = tracemalloc.is_tracing()
    if not started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    _count()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1] - base
        assert peak < MEMORY, f"an example allocated {peak >> 20} MiB (bound {MEMORY >> 20})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if not started:
            tracemalloc.stop()


def fuzz_seed(test: F) -> F:
    """The long run's own random stream (DTRAIN_FUZZ_SEED), else hypothesis's derandomized
    one."""
    if SEED is None:
        return test
    from hypothesis import seed

    return seed(int(SEED))(test)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------- inputs

ODD = ["", " ", "\t", "\n", "\r\n", "\x00", "\x1b[31m", "\u00e9", "\u00b2", "\u0663", "\u200b",
       "\ufeff", "\U0001f600", "\\", "'", '"', "#", "=", ":", ",", "[", "]", "-", "@", "{", "}",
       "0", "1", "9" * 30, "9" * 5000, "-1", "1e9", "nan", "inf", "$", "${X}", "`", ";", "|",
       "~", "/", ".", "..", "%", "!", "*", "&", "<<:", "!!int", "!!binary", "*a", "&a"]


def tokens(grammar: list[str], size: int = 40) -> st.SearchStrategy[str]:
    """A string of grammar tokens, odd characters and any short text."""
    piece = st.one_of(st.sampled_from(grammar), st.sampled_from(ODD), st.text(max_size=6))
    return st.lists(piece, max_size=size).map("".join)


def lines(line: st.SearchStrategy[str], size: int = 12) -> st.SearchStrategy[str]:
    return st.lists(line, max_size=size).map("\n".join)


def json_values(keys: list[str] | None = None, leaves: int = 30) -> st.SearchStrategy[Any]:
    """Any JSON value, its object keys often from ``keys`` (the fields a reader looks up)."""
    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 300),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                       st.sampled_from(ODD))
    key = st.one_of(st.sampled_from(keys), st.text(max_size=8)) if keys else st.text(max_size=8)
    return st.recursive(scalar, lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(key, inner, max_size=6)),
        max_leaves=leaves)


def shallow_json(keys: list[str]) -> st.SearchStrategy[Any]:
    """Any JSON value two levels deep at most, built without ``st.recursive`` (whose draws
    cost about 3 ms each here): what replaces a leaf or a branch of a real answer."""
    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 300),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                       st.sampled_from(ODD))
    key = st.one_of(st.sampled_from(keys), st.text(max_size=8))
    inner = st.one_of(scalar, st.lists(scalar, max_size=4))
    return st.one_of(scalar, st.lists(inner, max_size=4), st.dictionaries(key, inner, max_size=4))


def mutated(value: Any, keys: list[str]) -> st.SearchStrategy[Any]:
    """``value`` (real JSON) with some of its leaves and branches replaced by any JSON value,
    some keys dropped: what a broken or hostile program on a node answers."""
    other = shallow_json(keys)
    replace, drop = st.integers(0, 9), st.integers(0, 19)  # built once: a strategy per node
    # of the answer (a nested st.composite) cost more than the parse itself

    @st.composite
    def answer(draw: Any) -> Any:
        def walk(v: Any, depth: int) -> Any:
            if draw(replace) == 0:
                return draw(other)
            if isinstance(v, dict) and depth < 8:
                return {k: walk(item, depth + 1) for k, item in v.items()
                        if draw(drop) != 0}  # else a field left out
            if isinstance(v, list) and depth < 8:
                return [walk(item, depth + 1) for item in v[:6]]
            return v

        return walk(value, 0)

    return answer()


# ------------------------------------------------------------------------- one counted run

def parsers() -> list[str]:
    """The fuzzed parsers: each ``@FUZZ`` test of tests/test_fuzz_parsers.py, without
    ``test_``."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).parent / "test_fuzz_parsers.py").read_text())
    return [f.name.removeprefix("test_") for f in tree.body
            if isinstance(f, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "FUZZ" for d in f.decorator_list)]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import datetime
    import json
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    import hypothesis

    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(
        prog="python -m tests.fuzzing",
        description="Fuzz one parser (a test of tests/test_fuzz_parsers.py) with N examples "
                    "of seed S, and keep the count: bench/results/fuzz-<commit>-<date>-"
                    "<parser>-seed<S>.json.")
    ap.add_argument("--parser", required=True, help="its test's name without test_; "
                    "'list' names them")
    ap.add_argument("--examples", type=int, default=EXAMPLES, help="hypothesis's max_examples")
    ap.add_argument("--seed", type=int, default=0, help="the random stream")
    ap.add_argument("--out", type=Path, default=repo / "bench" / "results",
                    help="the folder the file goes in (default: %(default)s)")
    args = ap.parse_args(argv)
    names = parsers()
    if args.parser == "list":
        print("\n".join(names))
        return 0
    if args.parser not in names:
        ap.error(f"no parser {args.parser!r}; one of: {', '.join(names)}")
    if args.examples < 1:
        ap.error("--examples must be at least 1")

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.rstrip("\n")

    commit = git("rev-parse", "--short=7", "HEAD")
    differs = sorted(line[3:] for line in git("status", "--porcelain", "--", "launcher",
                                              "tests").splitlines())
    test = f"tests/test_fuzz_parsers.py::test_{args.parser}"
    with tempfile.TemporaryDirectory(prefix="dtrain-fuzz-") as tmp:
        counts = Path(tmp) / "counts.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_FUZZ_")}
        env.update(DTRAIN_FUZZ_EXAMPLES=str(args.examples), DTRAIN_FUZZ_SEED=str(args.seed),
                   DTRAIN_FUZZ_COUNTS=str(counts))
        started = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-o", "timeout=0", test], cwd=repo, env=env,
                             capture_output=True, text=True, check=False)
        took = time.monotonic() - started
        ran = json.loads(counts.read_text()).get(f"test_{args.parser}", 0) \
            if counts.exists() else 0
    if res.returncode not in (0, 1):  # not a verdict: pytest itself failed
        sys.stderr.write(res.stdout[-4000:] + res.stderr[-4000:])
        return res.returncode
    failures = 0 if res.returncode == 0 else 1
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    doc = {
        "bench": "fuzz", "parser": args.parser, "test": test,
        "examples": ran, "max_examples": args.examples, "seed": args.seed,
        "commit": commit, "differs_from_commit": differs, "date": date,
        "failures": failures, "seconds": round(took, 1),
        "hypothesis": hypothesis.__version__, "python": sys.version.split()[0],
        "command": f"python -m tests.fuzzing --parser {args.parser} --examples "
                   f"{args.examples} --seed {args.seed}",
        "note": "examples: the test's calls, counted by tests/fuzzing.bounded() (a failure's "
                "shrinking counts too); written by the run itself, not transcribed",
        "raw_output_kept": True,
        "rows": [{"parser": args.parser, "examples": ran, "seed": args.seed,
                  "failures": failures}],
    }
    if failures:
        doc["failure"] = res.stdout[-6000:]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"fuzz-{commit}-{date}-{args.parser}-seed{args.seed}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{args.parser}: {ran} examples, seed {args.seed}, {failures} failures, "
          f"{took:.0f} s, commit {commit}{' (+ changes)' if differs else ''} -> {path}")
    return failures


if __name__ == "__main__":
    raise SystemExit(main())
