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
from dataclasses import dataclass
from pathlib import Path

from fslab.core.files import Tail, parse_lines, read_json
from fslab.core.states import LIVE
from fslab.core.summary import RunSummary, SummaryFile
from fslab.core.sweeps import SWEEPS

LOG_TAIL_LINES = 400
# Finished runs whose files are checked per tick: all of them every few seconds
# in a store of 10,000 (a resumed or re-evaluated run shows up that soon).
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


class StoreWatcher:
    """Every run in ``runs_dir``, read incrementally. Only one thread may call
    :meth:`poll` (the dashboard's exclusive worker)."""

    def __init__(self, runs_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.runs_dir = Path(runs_dir)
        self.clock = clock
        self.keepers: dict[str, SummaryFile] = {}
        self.skipped: set[str] = set()
        self.folder_stamp: int | None = None
        self.ticks = 0
        self.cursor = 0  # where the next slice of finished runs begins
        self.urgent: set[str] = set()  # runs to check at the next poll whatever their state

    def poll(self, on_batch: Callable[[StoreChanges], None] | None = None, batch: int = 60) -> StoreChanges:
        """Read what changed since the last poll. New runs are read newest
        first and, with ``on_batch``, handed over every ``batch`` runs, so the
        first screenful of a big store shows at once; the returned changes
        hold the rest."""
        started = time.perf_counter()
        now = self.clock()
        added, removed, skipped = self._scan()
        rows: list[RunSummary] = []
        for count, run_id in enumerate(added, 1):
            keeper = self.keepers[run_id] = SummaryFile(self.runs_dir / run_id)
            keeper.load()
            self._refresh(keeper, now, rows, always=True)
            if on_batch is not None and count % batch == 0 and rows:
                on_batch(StoreChanges(rows, [], [], time.perf_counter() - started, partial=True))
                rows = []
                time.sleep(0.005)  # let the UI thread take the GIL and draw what it has
        fresh, urgent = set(added), self.urgent
        self.urgent = set()
        ended = []
        for run_id, keeper in self.keepers.items():
            if run_id in fresh:
                continue
            if keeper.summary.state in LIVE or keeper.summary.note or run_id in urgent:
                self._refresh(keeper, now, rows)
            else:
                ended.append(keeper)
        for keeper in self._slice(ended):
            self._refresh(keeper, now, rows)
        new_skips = sorted(skipped - self.skipped)
        self.skipped = skipped
        self.ticks += 1
        return StoreChanges(rows, removed, new_skips, time.perf_counter() - started)

    def refresh_now(self, run_id: str) -> None:
        """Check one run at the next poll whatever its state (the dashboard
        just stopped, resumed or started it)."""
        self.urgent = self.urgent | {run_id}

    def _refresh(self, keeper: SummaryFile, now: float, rows: list, always: bool = False) -> None:
        if keeper.refresh(now) or always:
            keeper.save()
            rows.append(keeper.summary.copy())

    def _slice(self, ended: list[SummaryFile]) -> list[SummaryFile]:
        if len(ended) <= ENDED_CHECKS_PER_TICK:
            return ended
        start = self.cursor % len(ended)
        self.cursor = start + ENDED_CHECKS_PER_TICK
        return (ended + ended)[start : start + ENDED_CHECKS_PER_TICK]

    def _scan(self) -> tuple[list[str], list[str], set[str]]:
        """(new run ids newest first, removed run ids, folders without config.json).
        The folder is listed again only when it changed (or every
        ``RESCAN_EVERY`` ticks); folders seen without a config.json are looked
        at every tick, since the config is written just after the folder."""
        try:
            stamp = os.stat(self.runs_dir).st_mtime_ns
        except OSError:
            stamp = None
        if stamp == self.folder_stamp and self.ticks % RESCAN_EVERY:
            candidates = set(self.skipped)
            removed = []
        else:
            self.folder_stamp = stamp
            try:
                entries = list(os.scandir(self.runs_dir))
            except OSError:
                entries = []
            names = {e.name for e in entries if not e.name.startswith(".") and e.name != SWEEPS and _is_dir(e)}
            removed = [run_id for run_id in self.keepers if run_id not in names]
            for run_id in removed:
                del self.keepers[run_id]
            candidates = {n for n in names if n not in self.keepers}
        added = sorted((n for n in candidates if os.path.exists(os.path.join(self.runs_dir, n, "config.json"))),
                       reverse=True)
        return added, removed, candidates - set(added)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


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


class TextTail:
    """New complete lines of a text log, decoded leniently, the last ``max_lines`` of them."""

    def __init__(self, path: Path) -> None:
        self.tail = Tail(path)

    def read(self, max_lines: int = LOG_TAIL_LINES) -> list[str]:
        chunk, _ = self.tail.read()
        if not chunk:
            return []
        lines = chunk.decode("utf-8", errors="replace").split("\n")[:-1]
        return list(deque(lines, maxlen=max_lines))


class RunFollower:
    """One run's full event history and logs, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.metrics = Tail(self.path / "metrics.jsonl")
        self.stdout = TextTail(self.path / "stdout.log")
        self.stderr = TextTail(self.path / "stderr.log")
        self.status_stamp: tuple[int, int] | None = None
        self.config_read = False

    def read(self, logs: bool = True) -> RunDelta:
        run_id = self.path.name
        if not self.path.is_dir():
            return RunDelta(run_id, [], [], [], 0, None, None, missing=True)
        chunk, reset = self.metrics.read()
        events, corrupt = parse_lines(chunk)
        config = None
        if not self.config_read:
            config = read_json(self.path / "config.json")
            self.config_read = config is not None
        return RunDelta(run_id, events, self.stdout.read() if logs else [], self.stderr.read() if logs else [],
                        corrupt, self._status(), config, reset=reset)

    def _status(self) -> dict | None:
        try:
            st = os.stat(self.path / "status.json")
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.status_stamp:
            return None
        self.status_stamp = stamp
        return read_json(self.path / "status.json")
