"""The hang watch of one run: progress per rank, the hang verdict, stack dumps on demand.

It runs beside the Job (its own task): once a second it asks ``decide.outcome.hang`` whether the job
is hung; when it is (or `dtrain stacks` asks), every running node's supervisor is sent a
``stacks`` control line, each answers with one ``stacks`` message (faulthandler's dump of
every rank, the flight recorder's when asked), and ``decide.outcome.stacks`` folds them into the
verdict. The evidence goes to the archive (``output.evidence``), a few lines to the console.
With ``--on-hang stop`` the hang then becomes the run's root cause (exit 125).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.decide.outcome.flight import (
    FlightSummary,
    RankFlight,
    load_dump,
    rank_flight,
    summarize,
)
from launcher.decide.outcome.hang import Hang, HangPolicy, ProgressWatch, hang_due
from launcher.decide.outcome.outcomes import Failure
from launcher.decide.outcome.stacks import Folded, RankStack, StackAnswer, fold, rank_stack
from launcher.exitcodes import EXIT_HANG
from launcher.job.events import Event, Flight, Observer, RankStart, Stacks
from launcher.models import Host, OutputLine
from launcher.output.evidence import stack_dir, write_flight, write_stack
from launcher.output.rundir import RunDir
from launcher.runrecord import RunMeta
from launcher.text.words import count

if TYPE_CHECKING:
    from launcher.job.orchestrate import Job

TICK_S = 0.5
REPLY_WAIT_S = 8.0  # the supervisors' own waits (2 s dump, 2 s flight recorder) + margin
NATIVE_WAIT_S = 10.0  # py-spy's dumps (bounded by 8 s on the node) before --on-hang stop


@dataclass
class StackDump:
    """One collection of every rank's stacks."""

    id: str
    reason: str
    t: float
    stacks: list[RankStack] = field(default_factory=list)
    folded: Folded | None = None
    took: float = 0.0
    hosts_missing: tuple[str, ...] = ()
    flight: dict[int, str] = field(default_factory=dict)  # rank -> archived file
    flight_errors: dict[int, str] = field(default_factory=dict)  # rank -> why none
    positions: dict[int, RankFlight] = field(default_factory=dict)  # from those dumps
    flight_summary: FlightSummary | None = None
    path: Path | None = None

    def json(self) -> dict[str, Any]:
        folded = self.folded
        return {"id": self.id, "t": self.t, "reason": self.reason, "took": round(self.took, 3),
                "dir": str(self.path) if self.path else None,
                "culprit": folded.culprit.json() if folded and folded.culprit else None,
                "folded": folded.json() if folded else [],
                "missing": list(folded.missing) if folded else [],
                "flight": {str(r): p for r, p in sorted(self.flight.items())},
                "flight_errors": {str(r): e for r, e in sorted(self.flight_errors.items())},
                "flight_summary": list(self.flight_summary.lines) if self.flight_summary
                else None,
                "flight_behind": list(self.flight_summary.behind) if self.flight_summary
                else []}


class _Pending:
    def __init__(self, hosts: Sequence[str]) -> None:
        self.waiting = set(hosts)
        self.answers: dict[str, Mapping[int, StackAnswer]] = {}  # host -> its ranks' dumps
        self.done = asyncio.Event()
        if not self.waiting:
            self.done.set()

    def add(self, host: str, ranks: Mapping[int, StackAnswer]) -> None:
        self.answers[host] = ranks
        self.waiting.discard(host)
        if not self.waiting:
            self.done.set()


class HangWatch(Observer):
    """Progress, hang verdicts and stack dumps for one run (see module doc); an observer of
    the job (job/events.py): the output lines, ``rank_start``, ``stacks``, ``flight``."""

    def __init__(self, job: Job, policy: HangPolicy, watch: ProgressWatch,
                 ranks: Mapping[str, Sequence[int]], run_dir: RunDir,
                 say: Callable[[str], None], *, alive: Callable[[], bool],
                 on_record: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.job = job
        self.policy = policy
        self.watch = watch
        self.ranks = {h: list(r) for h, r in ranks.items()}  # host -> its global ranks
        self.run_dir = run_dir
        self.say = say
        self.alive = alive
        self.on_record = on_record  # meta.json is to be rewritten (hangs, stacks)
        self.attempt = 1  # dtrain run --restarts: which attempt this watch follows
        self.clock = clock
        self.declared: float | None = None  # the baseline of the stall last declared
        self.hangs: list[Hang] = []
        self.dumps: list[StackDump] = []
        self._pending: dict[str, _Pending] = {}
        self._natives: dict[str, set[str]] = {}  # dump id -> hosts whose py-spy is to come
        self.started: set[int] = set()  # ranks whose shim is up (rank_start)
        self.world = sum(len(r) for r in self.ranks.values())
        self._count = {"h": 0, "s": 0}
        self._lock = asyncio.Lock()
        self.errors: dict[str, int] = {}  # the watch's own exceptions (told, then counted)

    # -- fed by the run ----------------------------------------------------------------------
    def on_lines(self, lines: Sequence[OutputLine]) -> None:
        self.watch.observe(lines)

    def on_rank_start(self, host: Host, ev: RankStart) -> None:
        self._guarded("rank_start", host, ev)

    def on_stacks(self, host: Host, ev: Stacks) -> None:
        """The answer to a dump (py-spy's dumps follow it, ``native``)."""
        self._guarded("stacks", host, ev)

    def on_flight(self, host: Host, ev: Flight) -> None:
        """The flight recorder's dumps a node had at the end."""
        self._guarded("flight", host, ev)

    def _guarded(self, kind: str, host: Host, ev: Event) -> None:
        """Never raises: an error is told, once, and the watch goes on."""
        try:
            self._event(host, ev)
        except Exception as exc:  # a bug of ours: told, and the watch goes on
            self.trouble(f"a {kind!r} message from {host.label}", exc)

    def trouble(self, where: str, exc: BaseException) -> None:
        """An exception inside the watch: said once per kind, counted, the watch goes on."""
        why = f"{type(exc).__name__}: {exc}"
        self.errors[why] = self.errors.get(why, 0) + 1
        if self.errors[why] == 1:
            self.say(f"the hang watch failed on {where} ({why}); it goes on watching")

    def _event(self, host: Host, ev: Event) -> None:
        if isinstance(ev, RankStart):
            if ev.rank not in self.started:
                self.started.add(ev.rank)
                if len(self.started) == self.world:  # the hang clock starts now
                    self.watch.start = max(self.watch.start, self.clock())
        elif isinstance(ev, Stacks) and ev.native:
            self._native(ev.id, ev.ranks)
            self._natives.get(ev.id, set()).discard(host.label)
        elif isinstance(ev, Stacks):
            pending = self._pending.get(ev.id)
            if pending is not None:
                pending.add(host.label, ev.ranks)
                if ev.pyspy:  # its py-spy dumps follow
                    self._natives.setdefault(ev.id, set()).add(host.label)
        elif isinstance(ev, Flight):
            self._flight_files("end", ev.files)

    # -- the watch ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Check once every TICK_S until cancelled (when the job is over). An exception in
        one check is told and the watch goes on: a hung run is never left unwatched."""
        while True:
            due = self.clock() + TICK_S
            await asyncio.sleep(TICK_S)
            try:
                await self._tick(due)
            except Exception as exc:
                self.trouble("its check", exc)

    async def _tick(self, due: float) -> None:
        now = self.clock()
        self.watch.look(now, due, TICK_S)  # a late tick: the launcher's stall, not theirs
        alive = len(self.started) >= self.world and self.alive()
        if hang_due(self.watch, now, self.policy, all_alive=alive, declared=self.declared):
            self.declared = self.watch.baseline()
            await self._hang(now)

    async def _hang(self, now: float) -> None:
        stalled = self.watch.stalled_for(now)
        last = ""
        latest = self.watch.latest()
        if latest is not None:
            stamp = time.strftime("%H:%M:%S", time.localtime(latest[0]))
            last = f"; the last progress: r{latest[1]} at {stamp}: {latest[2][:80]!r}"
        self.say(f"HANG: no rank made progress for {stalled:.0f} s (--hang-timeout "
                 f"{self.policy.timeout:g}){last}; taking every rank's stacks")
        dump = await self.dump("hang", f"no progress for {stalled:.0f} s")
        culprit = dump.folded.culprit if dump.folded else None
        self.hangs.append(Hang(now, self.attempt, round(stalled, 1), culprit, dump.folded,
                               dump.id, str(dump.path) if dump.path else None,
                               self.policy.on_hang))
        if self.on_record is not None:
            self.on_record()
        if self.policy.on_hang == "stop":
            deadline = time.monotonic() + NATIVE_WAIT_S  # py-spy's dumps, before the stop
            while self._natives.get(dump.id) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)

            who = culprit.describe() if culprit else "no single rank stands out"
            error = f"hang: no progress for {stalled:.0f} s; likely culprit {who}"
            host = culprit.host if culprit and culprit.host else next(iter(self.ranks), "")
            self.say("--on-hang stop: stopping every node")
            self.job.declare_failure(Failure("hang", host, rank=culprit.rank if culprit
                                             else None, code=EXIT_HANG, t=now, seen=now,
                                             error=error))
        else:
            self.say("--on-hang dump: the run goes on (`dtrain stacks` dumps again, Ctrl-C "
                     "stops it)")

    # -- dumps -------------------------------------------------------------------------------
    async def dump(self, kind: str, reason: str) -> StackDump:
        """Every running rank's stacks, folded, archived, and told on the console."""
        async with self._lock:
            self._count[kind[0]] = self._count.get(kind[0], 0) + 1
            dump_id = f"{kind[0]}{self._count[kind[0]]}"
            dump = StackDump(dump_id, reason, self.clock())
            hosts = [label for label, s in self.job.sessions.items()
                     if label not in self.job.outcome.nodes and s.hello is not None]
            pending = self._pending[dump_id] = _Pending(hosts)
            t0 = time.monotonic()
            for label in hosts:
                await self.job.sessions[label].request_stacks(dump_id, fr=True, pyspy=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPLY_WAIT_S):
                    await pending.done.wait()
            del self._pending[dump_id]
            dump.took = time.monotonic() - t0
            dump.hosts_missing = tuple(sorted(pending.waiting))
            self._collect(dump, pending.answers)
            self.dumps.append(dump)
            self._tell(dump)
            return dump

    def _collect(self, dump: StackDump,
                 answers: Mapping[str, Mapping[int, StackAnswer]]) -> None:
        """Fold the answers (host -> its ranks' dumps, job/events.py kept its own only)."""
        expected = [r for host in self.job.sessions for r in self.ranks.get(host, ())
                    if host not in self.job.outcome.nodes]
        for host, entries in answers.items():
            for rank, entry in entries.items():
                if entry.exited:
                    expected = [r for r in expected if r != rank]
                    continue
                try:
                    dump.stacks.append(rank_stack(rank, host, entry))
                    self._archive_rank(dump, rank, entry)
                except Exception as exc:  # what no supervisor sends: that rank's error
                    dump.flight_errors[rank] = f"unreadable answer ({type(exc).__name__})"
                    self.trouble(f"r{rank}'s stacks from {host}", exc)
        dump.folded = fold(dump.stacks, expected, dump.positions)
        dump.flight_summary = summarize(dump.positions)
        with contextlib.suppress(OSError):
            write_stack(self.run_dir, dump.id, "folded.txt", "\n".join(
                [f"{dump.reason} ({count(len(dump.stacks), 'rank')}, {dump.took:.2f} s)",
                 *dump.folded.lines()]) + "\n")
            dump.path = stack_dir(self.run_dir, dump.id)

    def _archive_rank(self, dump: StackDump, rank: int, entry: StackAnswer) -> None:
        with contextlib.suppress(OSError, ValueError):
            if entry.text is not None:
                write_stack(self.run_dir, dump.id, f"r{rank}.txt", entry.text)
            if entry.pyspy is not None:
                write_stack(self.run_dir, dump.id, f"r{rank}.py-spy.txt", entry.pyspy)
            if entry.fr_error:
                dump.flight_errors[rank] = entry.fr_error
            if entry.fr_data is not None:
                data = base64.b64decode(entry.fr_data)
                dump.flight[rank] = str(write_flight(self.run_dir, dump.id, rank, data))
                loaded = load_dump(data)
                position = rank_flight(rank, loaded) if loaded is not None else None
                if position is not None:
                    dump.positions[rank] = position

    def _native(self, dump_id: str, ranks: Mapping[int, StackAnswer]) -> None:
        """py-spy's dumps, which a node sends after its faulthandler stacks."""
        for rank, entry in ranks.items():
            if entry.pyspy is not None:
                with contextlib.suppress(OSError, ValueError):
                    write_stack(self.run_dir, dump_id, f"r{rank}.py-spy.txt", entry.pyspy)

    def _flight_files(self, dump_id: str, files: Mapping[int, str]) -> None:
        for rank, data in files.items():
            with contextlib.suppress(OSError, ValueError, binascii.Error):
                write_flight(self.run_dir, dump_id, rank, base64.b64decode(data))

    def _tell(self, dump: StackDump) -> None:
        folded = dump.folded
        if folded is None:
            return
        self.say(f"stacks of {count(len(dump.stacks), 'rank')} in {dump.took:.1f} s "
                 f"({dump.reason}):")
        for line in folded.lines():
            self.say(f"  {line}")
        for host in dump.hosts_missing:
            self.say(f"  {host}: no answer within {REPLY_WAIT_S:g} s")
        if dump.flight_summary is not None:
            self.say(f"flight recorder: {'; '.join(dump.flight_summary.lines)}")
        where = f"; every rank's stacks: {dump.path}" if dump.path else ""
        if folded.culprit is not None:
            self.say(f"likely culprit: {folded.culprit.describe()} "
                     f"({folded.culprit.why}){where}")
        elif folded.groups:
            self.say(f"no rank stands out: every rank waits at {folded.groups[0].place}{where}")

    def continue_from(self, earlier: HangWatch) -> None:
        """An attempt after ``earlier`` (--restarts): its hangs and dumps stay in meta.json,
        and dump ids go on counting (stacks/<id>/ of every attempt are kept apart)."""
        self.hangs = list(earlier.hangs)
        self.dumps = list(earlier.dumps)
        self._count = dict(earlier._count)

    def meta(self) -> RunMeta:
        """meta.json's ``hangs``, ``stacks`` and ``progress``."""
        return {"hangs": [h.json() for h in self.hangs], "stacks": [d.json() for d in self.dumps],
                "progress": self.watch.json(),
                "hang_policy": {"timeout": self.policy.timeout, "on_hang": self.policy.on_hang,
                                "progress": self.watch.pattern.pattern}}
