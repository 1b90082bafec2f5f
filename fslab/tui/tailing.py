"""Keeping the dashboard in step with the run store (no Textual here).

:class:`StoreWatcher` keeps every run's :class:`~fslab.core.summary.RunSummary`,
the same summary ``fslab runs`` prints, through the run store's own
:class:`~fslab.core.summary.SummaryFile`. A tick costs what changed, not the
size of the store: the runs folder is listed again only when it changed, live
runs are brought up to date (a ``stat`` per file, then only the new bytes),
and finished runs are checked a slice per tick, so a store of 10,000 runs
ticks as fast as one of 100. :class:`RunFollower` keeps one run's full history
(charts, evaluations, logs) for the detail and compare screens. Both run in a
worker thread and hand out plain data that the UI thread owns from then on.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fslab.core.files import Tail, json_object, last_lines_start, parse_lines, read_json
from fslab.core.runstore import Run, run_names
from fslab.core.schemas import status as status_of
from fslab.core.states import LIVE
from fslab.core.summary import RunSummary, SummaryFile, kept_newest_first
from fslab.core.text import printable

LOG_TAIL_LINES = 400
# Finished runs whose status and metrics are checked per tick (two ``stat``s
# each): all of them every five ticks in a store of 10,000, so a run resumed
# or re-evaluated from another terminal shows up within seconds.
ENDED_CHECKS_PER_TICK = 2000
# Every this many ticks the runs folder is listed again even if its
# modification time did not change (a coarse clock on a network filesystem).
RESCAN_EVERY = 30


@dataclass
class StoreChanges:
    """One tick's news about the run store."""

    rows: list[RunSummary]  # new or changed runs
    removed: list[str]  # run ids whose folder went away
    skipped: list[str]  # folders that are not (yet) runs: no config.json
    seconds: float = 0.0
    partial: bool = False  # more of this tick follows
    # queued runs whose claim problem (Run.claim_problem: the line fslab queue says) came, changed or went: None
    problems: dict[str, str | None] = field(default_factory=dict)


class StoreWatcher:
    """Every run in ``runs_dir``, read incrementally. Only one thread may call
    :meth:`poll` (the dashboard's exclusive worker).

    Runs are kept in two groups: live ones (queued, running, or with a file
    that could not be read), checked every tick, and finished ones, checked a
    slice at a time (their status and metrics only: a configuration is
    written once)."""

    def __init__(self, runs_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.runs_dir = Path(runs_dir)
        self.clock = clock
        self.keepers: dict[str, SummaryFile] = {}
        self.live: set[str] = set()
        self.ended: dict[str, None] = {}  # an ordered set: checked in this order, a slice per tick
        self.cursor = 0  # where the next slice of finished runs begins
        self.skipped: set[str] = set()
        self.folder_stamp: int | None = None
        self.ticks = 0
        self.urgent: set[str] = set()  # runs to check at the next poll whatever their state
        self.problems: dict[str, str] = {}  # the queued runs that will not start unless a person acts: why

    def poll(self, on_batch: Callable[[StoreChanges], None] | None = None, batch: int = 60) -> StoreChanges:
        """Read what changed since the last poll. New runs are read newest
        created first (:func:`~fslab.core.summary.kept_newest_first`, the table's
        order) and, with ``on_batch``, handed over in batches (the first of
        ``batch`` runs, each next one twice as large), so the first screenful
        of a big store shows at once; the returned changes hold the rest."""
        started = time.perf_counter()
        now = self.clock()
        candidates, removed = self._scan()
        for run_id in removed:
            self._forget(run_id)
        rows: list[RunSummary] = []
        added, skipped = [], set()
        handed = 0
        # the first batch is the newest screenful whatever time zones stamped the ids: a run is handed
        # over once no other can be newer
        for keeper in kept_newest_first(self.runs_dir, candidates, now):
            run_id = keeper.id
            if not keeper.is_run:  # not a run, or one being created: fslab runs leaves it out too
                skipped.add(run_id)
                continue
            added.append(run_id)
            count = len(added)
            self.keepers[run_id] = keeper  # a summary the worker did not leave (fslab 0.1's store) was saved
            self._file(run_id)
            rows.append(keeper.summary.copy())
            if on_batch is not None and count - handed >= batch:
                on_batch(StoreChanges(rows, [], [], time.perf_counter() - started, partial=True))
                # Let the UI thread take the GIL and draw what it has: the first
                # screenful gets long enough to be drawn before the rest loads.
                time.sleep(0.05 if handed == 0 else 0.005)
                rows, handed, batch = [], count, 2 * batch
        urgent, self.urgent = self.urgent, set()
        for run_id in sorted((self.live | urgent) & set(self.keepers) - set(added)):
            self._check(run_id, now, rows, everything=True)
        for run_id in self._slice():
            self._check(run_id, now, rows, everything=False)
        new_skips = sorted(skipped - self.skipped)
        self.skipped = skipped
        self.ticks += 1
        problems = self._claim_problems()
        return StoreChanges(rows, removed, new_skips, time.perf_counter() - started, problems=problems)

    def _claim_problems(self) -> dict[str, str | None]:
        """The claim problems that came, changed or went since the last tick (None: went). Only queued runs'
        claim files are read, each once a tick, with the status this tick read (:meth:`Run.claim_problem`)."""
        now = {}
        for run_id in self.live:
            keeper = self.keepers[run_id]
            if keeper.summary.state == "queued" and (problem := Run(Path(keeper.dir)).claim_problem(keeper.status)):
                now[run_id] = problem
        changed = {i: now.get(i) for i in now.keys() | self.problems.keys() if now.get(i) != self.problems.get(i)}
        self.problems = now
        return changed

    def refresh_now(self, run_id: str) -> None:
        """Check one run at the next poll whatever its state (the dashboard
        just stopped, resumed or started it)."""
        self.urgent = self.urgent | {run_id}

    def _check(self, run_id: str, now: float, rows: list, everything: bool) -> None:
        keeper = self.keepers[run_id]
        if keeper.refresh(now, config=everything):
            rows.append(keeper.summary.copy())
            self._file(run_id)

    def _file(self, run_id: str) -> None:
        """Put the run in the live or the finished group, by its state now."""
        summary = self.keepers[run_id].summary
        live = summary.state in LIVE or summary.note is not None
        if live:
            self.live.add(run_id)
            self.ended.pop(run_id, None)
        else:
            self.live.discard(run_id)
            self.ended[run_id] = None

    def _forget(self, run_id: str) -> None:
        del self.keepers[run_id]
        self.problems.pop(run_id, None)
        self.live.discard(run_id)
        self.ended.pop(run_id, None)

    def _slice(self) -> list[str]:
        ended = list(self.ended)
        if len(ended) <= ENDED_CHECKS_PER_TICK:
            return ended
        start = self.cursor % len(ended)
        self.cursor = start + ENDED_CHECKS_PER_TICK
        return (ended[start:] + ended[:start])[:ENDED_CHECKS_PER_TICK]

    def _scan(self) -> tuple[list[str], list[str]]:
        """(folders that may be new runs, sorted by name; run ids whose folder is gone).
        The folder is listed again only when it changed (or every
        ``RESCAN_EVERY`` ticks); folders seen without a config.json are looked
        at every tick, since the config is written just after the folder."""
        try:
            stamp = os.stat(self.runs_dir).st_mtime_ns
        except OSError:
            stamp = None
        if stamp == self.folder_stamp and self.ticks % RESCAN_EVERY:
            return sorted(self.skipped), []
        self.folder_stamp = stamp
        names = set(run_names(self.runs_dir))
        removed = [run_id for run_id in self.keepers if run_id not in names]
        return sorted(n for n in names if n not in self.keepers), removed


@dataclass
class RunDelta:
    """Everything appended to one run's files since the previous read."""

    run_id: str
    events: list[dict]
    stdout: list[str]
    stderr: list[str]
    corrupt: int
    status: dict | None  # the status, when it changed
    config: dict | None  # the configuration, the first time it is read
    missing: bool = False  # the run folder is gone
    reset: bool = False  # metrics.jsonl was rewritten: forget earlier events, these replace them
    config_problem: str | None = None  # why config.json holds no configuration yet, as the run's note says it


class TextTail:
    """New complete lines of a text log, decoded leniently, the last ``max_lines`` of them. The
    first read starts at the log's last :data:`LOG_TAIL_LINES` lines: a log of gigabytes (a
    warning printed at every step) is not read whole to keep its end."""

    def __init__(self, path: Path) -> None:
        self.tail = Tail(path, last_lines_start(path, LOG_TAIL_LINES))

    def read(self, max_lines: int = LOG_TAIL_LINES, *, partial: bool = False) -> list[str]:
        """``partial``: the last line too when no newline ends it (the run has ended: no more of it comes)."""
        chunk, _ = self.tail.read(partial=partial)
        if not chunk:
            return []
        lines = chunk.decode("utf-8", errors="replace").split("\n")
        if not lines[-1]:  # what follows the last newline
            lines.pop()
        return [printable(line, lines=True) for line in deque(lines, maxlen=max_lines)]


class RunFollower:
    """One run's full event history and logs, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.metrics = Tail(self.path / "metrics.jsonl")
        self.stdout = TextTail(self.path / "stdout.log")
        self.stderr = TextTail(self.path / "stderr.log")
        self.status_stamp: tuple[int, int] | None = None
        self.config_read = False

    def read(self, logs: bool = True, ended: bool = False) -> RunDelta:
        """What is new; ``ended``: the run has ended (lost included), so a log's last line is read though
        no newline ends it (a worker killed mid-line, a message printed without one), as fslab logs shows it."""
        run_id = self.path.name
        if not self.path.is_dir():
            return RunDelta(run_id, [], [], [], 0, None, None, missing=True)
        chunk, reset = self.metrics.read()
        events, corrupt = parse_lines(chunk)
        config = problem = None
        if not self.config_read:
            config, why = json_object(self.path / "config.json")
            self.config_read = config is not None
            problem = None if self.config_read else f"config.json {why}"  # 'config.json missing', as fslab show
        return RunDelta(run_id, events, self.stdout.read(partial=ended) if logs else [],
                        self.stderr.read(partial=ended) if logs else [], corrupt, self._status(), config, reset=reset,
                        config_problem=problem)

    def _status(self) -> dict | None:
        try:
            st = os.stat(self.path / "status.json")
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.status_stamp:
            return None
        self.status_stamp = stamp
        status = read_json(self.path / "status.json")
        # values of the wrong type left out, as Run.status() gives them to fslab show
        return None if status is None else status_of(status)
