"""Incremental reading of the run store, by byte offsets (no Textual here).

The dashboard never re-reads what it has read: each file has an offset, and a
tick reads only the bytes appended since. ``StoreWatcher`` keeps what the runs
table needs for every run; ``RunFollower`` keeps the full history of one run
(charts, evaluations, logs) for the detail and compare screens. Both are
driven from a worker thread and hand out plain data (``RunRow``, ``RunDelta``)
that the UI thread owns from then on.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fslab.core.runstore import ENDED, Run

# The worker writes events with json.dumps' default separators; a train line
# is recognised by this without parsing it (parsing costs ~10 µs a line).
TRAIN_MARK = b'"event": "train"'
# Events the table does not need, skipped unparsed (``end`` repeats the test evals).
CHECKPOINT_MARK, END_MARK = b'"event": "checkpoint"', b'"event": "end"'
LOG_TAIL_LINES = 400


def read_appended(path: Path, offset: int) -> tuple[bytes, int]:
    """Complete lines appended to ``path`` since ``offset`` and the offset after
    them. A torn last line (no newline yet) is left for the next read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except OSError:
        return b"", offset
    end = chunk.rfind(b"\n")
    if end < 0:
        return b"", offset
    return chunk[: end + 1], offset + end + 1


def file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, size) of a file, or None if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size


def was_rewritten(identity: tuple[int, int] | None, inode: int | None, offset: int) -> bool:
    """True if a file read up to ``offset`` was replaced or cut back since
    (``fslab resume`` rewrites metrics.jsonl back to its last checkpoint)."""
    return identity is not None and ((inode is not None and identity[0] != inode) or identity[1] < offset)


def load_json(path: Path) -> dict | None:
    """A JSON object from a file, or None if missing, unreadable or not JSON."""
    try:
        with open(path, "rb") as fh:
            value = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def parse_event(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def looks_whole(line: bytes) -> bool:
    """A cheap check for a line that is skipped without being parsed."""
    line = line.strip()
    return line[:1] == b"{" and line[-1:] == b"}"


@dataclass
class RunRow:
    """What the runs table shows of one run: a snapshot, never mutated after
    it is handed to the UI."""

    id: str
    path: Path
    state: str = "lost"
    method: str | None = None
    loss_name: str | None = None
    backbone: str | None = None
    dataset: str | None = None
    seed: int | None = None
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    positives: int | None = None
    negatives: int | None = None
    best_val: dict | None = None
    test: dict = field(default_factory=dict)  # "1-shot" -> {accuracy, ci95, episodes}
    started: float | None = None
    ended: float | None = None
    first_train: tuple[float, int] | None = None  # (time, step) of the first train event
    last_train_time: float | None = None
    error: str | None = None
    corrupt: int = 0
    note: str | None = None  # why this run is shown with missing data


# RunRow fields that come from metrics.jsonl (reset when the file is rewritten).
METRIC_FIELDS = ("epoch", "step", "total_steps", "loss", "positives", "negatives", "best_val", "first_train",
                 "last_train_time", "corrupt")


class RunTail:
    """One run's summary state, updated from the bytes appended since last time."""

    def __init__(self, path: Path) -> None:
        self.run = Run(path)
        self.row = RunRow(id=path.name, path=path)
        self.offset = 0
        self.inode: int | None = None
        self.status_stamp: tuple[int, int] | None = None
        self.status: dict = {}
        self.have_config = False

    def update(self, now: float) -> bool:
        """Read what is new; True if the row changed."""
        changed = False
        if not self.have_config:
            changed |= self._read_config()
        changed |= self._read_status()
        changed |= self._read_metrics()
        state = self.run.state(self.status, now=now)
        if state != self.row.state:
            self.row.state = state
            changed = True
        return changed

    def _read_config(self) -> bool:
        config = load_json(self.run.path / "config.json")
        if not isinstance(config, dict):
            self.row.note = "config.json unreadable"
            return True
        row, section = self.row, lambda name: config.get(name) if isinstance(config.get(name), dict) else {}
        row.method, row.seed = config.get("method"), config.get("seed")
        row.loss_name, row.backbone = section("loss").get("name"), section("backbone").get("name")
        row.dataset, row.epochs = section("dataset").get("name"), section("train").get("epochs")
        row.note = None
        self.have_config = True
        return True

    def _read_status(self) -> bool:
        path = self.run.path / "status.json"
        try:
            st = os.stat(path)
        except OSError:
            if self.status_stamp is not None or self.row.note is None:
                self.status_stamp, self.status = None, {}
                self.row.note = self.row.note or "status.json missing"
                return True
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.status_stamp:
            return False
        status = load_json(path)
        if status is None:
            self.row.note = "status.json unreadable"
            return True
        self.status_stamp, self.status = stamp, status
        row = self.row
        row.started, row.ended, row.error = status.get("started"), status.get("ended"), status.get("error")
        if row.note and row.note.startswith("status.json"):
            row.note = None
        return True

    def _read_metrics(self) -> bool:
        identity = file_identity(self.run.metrics_path)
        rewritten = was_rewritten(identity, self.inode, self.offset)
        if rewritten:  # start again from the top, forgetting what came from the old file
            self.offset = 0
            for name in METRIC_FIELDS:
                setattr(self.row, name, RunRow.__dataclass_fields__[name].default)
            self.row.test = {}
        self.inode = identity[0] if identity else None
        chunk, self.offset = read_appended(self.run.metrics_path, self.offset)
        if not chunk:
            return rewritten
        row = self.row
        # Whole-list passes, not a Python loop per line: a store of 1,000 runs
        # holds ~100,000 lines and the table needs only a few of them per run.
        lines = [line for line in chunk.split(b"\n") if line.strip()]
        row.corrupt += sum(1 for line in lines if not looks_whole(line))
        trains = [line for line in lines if TRAIN_MARK in line]
        wanted = [line for line in lines if TRAIN_MARK not in line and CHECKPOINT_MARK not in line
                  and END_MARK not in line]
        if trains:
            wanted = ([trains[0]] if row.first_train is None else []) + wanted + [trains[-1]]
        for line in wanted:
            event = parse_event(line)
            if event is None:
                row.corrupt += looks_whole(line)  # a badly shaped line is counted already
                continue
            try:
                self._apply(event)
            except (KeyError, TypeError, ValueError):
                row.corrupt += 1
        return True

    def _apply(self, event: dict) -> None:
        row, kind = self.row, event.get("event")
        if kind == "train":
            if row.first_train is None:
                row.first_train = (float(event["time"]), int(event["step"]))
            row.step, row.epoch, row.loss = event["step"], event["epoch"], event["loss"]
            row.positives, row.negatives = event.get("positives"), event.get("negatives")
            row.last_train_time = event.get("time")
        elif kind == "start":
            row.total_steps = event.get("total_steps")
            row.epochs = event.get("epochs", row.epochs)
        elif kind == "eval":
            value = {"accuracy": float(event["accuracy"]), "ci95": float(event["ci95"]),
                     "episodes": int(event["episodes"])}
            if event["split"] == "val":
                if row.best_val is None or value["accuracy"] > row.best_val["accuracy"]:
                    row.best_val = value
            elif event["split"] == "test":
                row.test = {**row.test, f"{event['shots']}-shot": value}

    def snapshot(self) -> RunRow:
        row = self.row
        return RunRow(**{**row.__dict__, "test": dict(row.test)})


@dataclass
class StoreChanges:
    """One tick's news about the run store."""

    rows: list[RunRow]  # new or changed runs
    removed: list[str]  # run ids whose folder went away
    skipped: list[str]  # folders that are not (yet) runs: no config.json
    seconds: float = 0.0
    partial: bool = False  # more of this tick follows


class StoreWatcher:
    """Every run in ``runs_dir``, read incrementally. Only one thread may call
    ``poll`` (the dashboard's exclusive worker)."""

    def __init__(self, runs_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.runs_dir = Path(runs_dir)
        self.clock = clock
        self.tails: dict[str, RunTail] = {}
        self.skipped: set[str] = set()

    def poll(self, on_batch: Callable[[StoreChanges], None] | None = None, batch: int = 60) -> StoreChanges:
        """Read what changed since the last poll, newest runs first. With
        ``on_batch``, the changed rows are handed over every ``batch`` runs
        read, so the first screenful of a big store shows at once; the
        returned changes hold the rest."""
        started = time.perf_counter()
        now = self.clock()
        found, skipped = self._scan()
        removed = [run_id for run_id in self.tails if run_id not in found]
        for run_id in removed:
            del self.tails[run_id]
        rows: list[RunRow] = []
        for count, run_id in enumerate(sorted(found, reverse=True), 1):
            tail = self.tails.get(run_id)
            if tail is None:
                tail = self.tails[run_id] = RunTail(found[run_id])
            elif tail.row.state in ENDED and tail.status_stamp is not None and not tail.row.note:
                # An ended run changes only if someone rewrites it; stat it, don't re-read it.
                if not self._touched(tail):
                    continue
            try:
                if tail.update(now):
                    rows.append(tail.snapshot())
            except OSError as exc:  # unreadable folder: show it with a note, keep going
                tail.row.note = f"unreadable: {exc.strerror or exc}"
                rows.append(tail.snapshot())
            if on_batch is not None and count % batch == 0 and rows:
                on_batch(StoreChanges(rows, [], [], time.perf_counter() - started, partial=True))
                rows = []
                time.sleep(0.005)  # let the UI thread take the GIL and draw what it has
        new_skips = sorted(skipped - self.skipped)
        self.skipped = skipped
        return StoreChanges(rows, removed, new_skips, time.perf_counter() - started)

    def _scan(self) -> tuple[dict[str, Path], set[str]]:
        found: dict[str, Path] = {}
        skipped: set[str] = set()
        try:
            entries = list(os.scandir(self.runs_dir))
        except OSError:
            return found, skipped
        for entry in entries:
            try:
                if not entry.is_dir():
                    continue
            except OSError:
                continue
            if entry.name in self.tails or os.path.exists(os.path.join(entry.path, "config.json")):
                found[entry.name] = Path(entry.path)
            elif not entry.name.startswith("."):
                skipped.add(entry.name)
        return found, skipped

    @staticmethod
    def _touched(tail: RunTail) -> bool:
        try:
            st = os.stat(tail.run.path / "status.json")
            size = os.stat(tail.run.metrics_path).st_size
        except OSError:
            return True
        return (st.st_mtime_ns, st.st_size) != tail.status_stamp or size != tail.offset


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
    """New complete lines of a text log, decoded leniently."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def read(self, max_lines: int = LOG_TAIL_LINES) -> list[str]:
        chunk, self.offset = read_appended(self.path, self.offset)
        if not chunk:
            return []
        lines = chunk.decode("utf-8", errors="replace").split("\n")[:-1]
        return list(deque(lines, maxlen=max_lines))


class RunFollower:
    """One run's full event history and logs, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.run = Run(Path(path))
        self.offset = 0
        self.inode: int | None = None
        self.stdout = TextTail(self.run.path / "stdout.log")
        self.stderr = TextTail(self.run.path / "stderr.log")
        self.status_stamp: tuple[int, int] | None = None
        self.config_read = False

    def read(self, logs: bool = True) -> RunDelta:
        run = self.run
        if not run.path.is_dir():
            return RunDelta(run.id, [], [], [], 0, None, None, missing=True)
        identity = file_identity(run.metrics_path)
        reset = was_rewritten(identity, self.inode, self.offset)
        if reset:
            self.offset = 0
        self.inode = identity[0] if identity else None
        chunk, self.offset = read_appended(run.metrics_path, self.offset)
        events, corrupt = [], 0
        for line in chunk.split(b"\n"):
            if not line.strip():
                continue
            event = parse_event(line)
            if event is None:
                corrupt += 1
            else:
                events.append(event)
        config = None
        if not self.config_read:
            config = load_json(run.path / "config.json")
            self.config_read = config is not None
        return RunDelta(run.id, events, self.stdout.read() if logs else [], self.stderr.read() if logs else [],
                        corrupt, self._status(), config, reset=reset)

    def _status(self) -> dict | None:
        try:
            st = os.stat(self.run.path / "status.json")
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.status_stamp:
            return None
        self.status_stamp = stamp
        return load_json(self.run.path / "status.json")
