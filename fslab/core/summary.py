"""A run's summary: what every listing shows of it, in one place.

:class:`RunSummary` is folded from the run's files, event by event: identity
from ``config.json``, times and error from ``status.json``, progress, loss,
pairs and accuracies from ``metrics.jsonl``. ``fslab runs``, ``fslab show``,
the dashboard and the worker all fold through :class:`SummaryFile`, so they
agree on every number:

- the **test** accuracy is the one the training's own evaluator logged; test
  evaluations made later with ``fslab eval`` (another evaluator, or more
  episodes) are listed apart under ``test_by_evaluator``, by their label
  (``knn[k=3]``), each score with the ``epoch`` of the checkpoint it scored;
  one of a checkpoint older than the run's latest (the run resumed and trained
  on since) no longer counts: the network it scored is gone; nor does one of
  the network run in another precision than the run's (``fslab eval --precision``);
- the **best validation** accuracy is the best of the training's per-epoch
  validations.

The summary is kept in ``summary.json`` beside the files it summarises, with
what it has read of each (inode, size, modification time; the byte offset
reached in ``metrics.jsonl`` and the bytes just before it). The worker rewrites
it as it logs; a reader checks it against the files (a ``stat`` each) and folds
only what is new, or starts over when a file was replaced, cut back or
overwritten in place (:class:`fslab.core.files.Tail`). The files are the truth:
a ``summary.json`` that is missing, damaged, from another fslab version or
stale is rebuilt from them, and one that cannot be written (a read-only
store) just costs the next reader the same fold again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

from fslab.core import schemas
from fslab.core.clocks import clock_ahead
from fslab.core.config import PRECISIONS
from fslab.core.events import canonical_evaluator, is_validation, logged_evaluator, other_precision, own_evaluator
from fslab.core.files import Tail, atomic_write_text, json_object, loads, read_json
from fslab.core.runstore import Run, newest_first, run_names
from fslab.core.slurm_queue import JOB_KEYS
from fslab.core.states import UNREADABLE, heartbeat_interval, unknown_state
from fslab.core.sweeps import sweep_records
from fslab.core.values import is_number
from fslab.core.worklock import observed_state

SUMMARY_FILE = "summary.json"
# Bumped whenever the fold changes: summary files of another format are rebuilt.
SUMMARY_FORMAT = 8
# The worker writes events with json.dumps' default separators, so a train
# line is recognised without parsing it; only the first and last of a batch
# of lines matter, and parsing the rest would cost ~10 µs a line.
TRAIN_MARK = b'"event": "train"'
START_MARK = b'"event": "start"'
UNUSED_MARKS = (b'"event": "end"', b'"event": "resume"')
STATUS_KEYS = ("state", "pid", "host", "heartbeat", "created", "started", "resumed", "ended", "error", "sweep",
               "usage", *JOB_KEYS)  # what the summary and the run's state are told from
MISSING = "missing"


def recorded_precision(run: Run) -> str | None:
    """The precision the run's latest start embedded its evaluation features in (``eval.precision``
    resolved for the device it trained on: ``auto`` is bf16 on a CUDA GPU, fp32 on the CPU), or None
    for a run started before it was recorded, whose configuration is then resolved as before. ``fslab
    eval`` embeds in it wherever it runs, so that its scores of the training's own episodes are the
    training's, never those of another precision saved in their place; ``fslab compare --precision``
    reads the precision of the run's own scores from it."""
    try:  # the start lines found by their mark, unparsed otherwise: a long run logs 100,000s of steps
        lines = run.metrics_path.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if START_MARK in line:
            with contextlib.suppress(ValueError):
                start = json.loads(line)
                if isinstance(start, dict) and start.get("eval_precision") in PRECISIONS[1:]:
                    return start["eval_precision"]
    return None


@dataclass(slots=True)
class RunSummary:
    """One run as a listing shows it."""

    id: str
    state: str = "lost"
    # config.json
    method: str | None = None
    loss_fn: str | None = None
    backbone: str | None = None
    dataset: str | None = None
    seed: int | None = None
    epochs: int | None = None
    evaluator: str = "centroid"  # the label of the run's own evaluator
    ways: int | None = None  # eval.ways: the evaluations summed up are of this many classes
    queries: int | None = None  # eval.queries: a later evaluation of another count gives way to one of this
    beat_every: float = 5.0  # train.heartbeat: three missed, the worker is paused or stuck and the ETA waits
    # status.json
    created: float | None = None
    started: float | None = None
    resumed: float | None = None  # when the latest resumed worker started
    ended: float | None = None
    heartbeat: float | None = None  # the worker's last sign of life
    # how far the clock of a live run's host is ahead of this host's (clocks.clock_ahead; 0 for this host's
    # runs): the present its times are compared with is this host's plus that
    clock_ahead: float = 0.0
    error: str | None = None
    sweep: str | None = None
    usage: dict | None = None  # the worker's last sample: cpu_percent, rss_bytes, gpu_* (schemas.USAGE)
    # metrics.jsonl
    epoch: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    positives: int | None = None
    negatives: int | None = None
    best_val: dict | None = None  # {accuracy, ci95, episodes, epoch}
    test: dict = field(default_factory=dict)  # "5-shot" -> {accuracy, ci95, episodes}, the run's own evaluator
    # label -> "5-shot" -> {accuracy, ci95, episodes, epoch}: later evaluations of the latest checkpoint
    test_by_evaluator: dict = field(default_factory=dict)
    checkpoint: int | None = None  # the epoch of the latest checkpoint the training logged
    first_train: tuple | None = None  # (time, step) of the latest life's first logged training step: the ETA's
    last_train_time: float | None = None
    last_time: float | None = None  # of the latest event the training logged
    downtime: float = 0.0  # seconds between a life's last event and the next resumed life's start
    corrupt: int = 0  # metrics lines skipped because they are not events of the expected shape
    note: str | None = None  # why some of the run's files could not be read

    def to_dict(self) -> dict:
        """The JSON form ``fslab runs --json`` prints (shallow: read, don't modify)."""
        return {name: getattr(self, name) for name in SHOWN_FIELDS}

    def test_of(self, label: str | None = None) -> dict:
        """Test results by ``label`` (any spelling of it: ``knn[k=0]`` is
        ``knn``): the run's own evaluator's by default."""
        label = None if label is None else canonical_evaluator(label)
        if label is None or label == self.evaluator:
            return self.test
        return self.test_by_evaluator.get(label, {})

    def copy(self) -> RunSummary:
        """A snapshot another thread may keep while this one goes on folding."""
        twin = RunSummary.__new__(RunSummary)
        for name in FIELD_NAMES:
            setattr(twin, name, getattr(self, name))
        twin.test, twin.test_by_evaluator = dict(self.test), dict(self.test_by_evaluator)
        return twin


FIELD_NAMES = tuple(f.name for f in fields(RunSummary))
DEFAULTS = {name: getattr(RunSummary(id=""), name) for name in FIELD_NAMES}
# Not saved in summary.json's summary: the id is the folder's name, the state
# is told anew at each read, and the status fields are saved with the status.
NOT_KEPT = ("id", "state", "created", "started", "resumed", "ended", "heartbeat", "error", "sweep", "usage",
            "clock_ahead")
SHOWN_FIELDS = tuple(name for name in FIELD_NAMES if name not in (
    "first_train", "last_train_time", "last_time", "downtime", "resumed", "heartbeat", "usage", "ways",
    "queries", "checkpoint", "beat_every", "clock_ahead"))
METRIC_FIELDS = ("epoch", "step", "total_steps", "loss", "positives", "negatives", "best_val", "test",
                 "test_by_evaluator", "checkpoint", "first_train", "last_train_time", "last_time", "downtime",
                 "corrupt")


# The Python types of the fields summary.json keeps (no field is a bool; a float loss may be NaN:
# a run that diverged). Checked with isinstance, not the schemas' kinds: a listing of 10,000
# runs checks each run's.
_NONE = type(None)
SAVED_TYPES = {
    **dict.fromkeys(("method", "loss_fn", "backbone", "dataset", "note"), (str, _NONE)),
    **dict.fromkeys(("seed", "epochs", "ways", "queries", "epoch", "step", "total_steps", "positives", "negatives",
                     "checkpoint"),
                    (int, _NONE)),
    "evaluator": (str,), "loss": (int, float, _NONE), "best_val": (dict, _NONE), "test": (dict,),
    "test_by_evaluator": (dict,), "first_train": (list, _NONE), "last_train_time": (int, float, _NONE),
    "last_time": (int, float, _NONE), "downtime": (int, float), "corrupt": (int,), "beat_every": (int, float),
}


def trusted_fields(fields) -> bool:
    """Whether the fields read from summary.json have the types the fold gives
    them (scores with their numbers), so a listing can use them as they are."""
    if type(fields) is not dict:
        return False
    for name, value in fields.items():
        types = SAVED_TYPES.get(name)
        if types is None or not isinstance(value, types) or value is True or value is False:
            return False
    best, first = fields.get("best_val"), fields.get("first_train")
    if best is not None and not _score(best):
        return False
    if first is not None and (len(first) != 2 or not all(x is None or type(x) in (int, float) for x in first)):
        return False
    tables = [fields.get("test", {}), *fields.get("test_by_evaluator", {}).values()]
    return all(type(table) is dict and all(_score(score) for score in table.values()) for table in tables)


def _score(score) -> bool:  # schemas.SCORE: two fractions, and the metric when it is not accuracy
    return (type(score) is dict and type(accuracy := score.get("accuracy")) in (int, float)
            and type(ci95 := score.get("ci95")) in (int, float) and 0 <= accuracy <= 1 and 0 <= ci95 <= 1
            and type(score.get("metric", "")) is str and type(score.get("queries", 0)) is int)


def _name(section) -> str | None:
    return section.get("name") if isinstance(section, dict) and isinstance(section.get("name"), str) else None


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _real(value) -> float | None:
    return float(value) if is_number(value) else None


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def apply_config(summary: RunSummary, config: dict) -> None:
    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    summary.method, summary.seed = _text(config.get("method")), _whole(config.get("seed"))
    summary.loss_fn, summary.backbone = _name(config.get("loss")), _name(config.get("backbone"))
    summary.dataset, summary.epochs = _name(config.get("dataset")), _whole(train.get("epochs"))
    summary.evaluator = own_evaluator(config)
    evaluation = config.get("eval") if isinstance(config.get("eval"), dict) else {}
    summary.ways, summary.queries = _whole(evaluation.get("ways")), _whole(evaluation.get("queries"))
    summary.beat_every = heartbeat_interval(config)


def apply_status(summary: RunSummary, status: dict) -> None:
    summary.created, summary.started = _real(status.get("created")), _real(status.get("started"))
    summary.resumed, summary.heartbeat = _real(status.get("resumed")), _real(status.get("heartbeat"))
    summary.ended, summary.error = _real(status.get("ended")), _text(status.get("error"))
    summary.sweep = _text(status.get("sweep"))
    summary.usage = schemas.usage(status.get("usage")) or None


def add_event(summary: RunSummary, record: dict) -> None:
    """Fold one event into the summary; an event without the fields of its
    kind (:data:`fslab.core.schemas.EVENTS`) raises ValueError, which the
    caller counts as corrupt."""
    event = schemas.event(record)
    if event is None:
        raise ValueError("an event without the fields of its kind")
    _fold(summary, event)


def _fold(summary: RunSummary, event: dict) -> None:
    """Fold an event that :func:`fslab.core.schemas.event` accepted."""
    kind = event["event"]
    if kind == "train":
        at, last = _real(event.get("time")), summary.last_train_time
        if summary.first_train is None or (at is not None and last is not None and at < last):
            summary.first_train = (at, event["step"])  # a clock set back: the ETA's rate is measured again from here
        summary.step, summary.epoch, summary.loss = event["step"], event["epoch"], float(event["loss"])
        summary.positives, summary.negatives = _whole(event.get("positives")), _whole(event.get("negatives"))
        summary.last_train_time = _real(event.get("time"))
    elif kind == "start":
        at = _real(event.get("time"))
        if at is not None and summary.last_time is not None:  # a resumed life: the time the run lay stopped
            began = summary.resumed if summary.resumed is not None and summary.last_time <= summary.resumed <= at \
                else at  # when its worker started: known for the latest life only
            summary.downtime += max(0.0, began - summary.last_time)
        summary.first_train = None  # the ETA's rate is this life's: a resumed run's would count its stop
        summary.total_steps = _whole(event.get("total_steps"))
        summary.epochs = event["epochs"]
    elif kind == "checkpoint":
        _checkpoint(summary, event["epoch"])
    elif kind == "eval":
        if summary.ways is not None and event["ways"] != summary.ways:
            return  # episodes of another number of classes (eval.extra_ways, fslab eval --ways)
        if other_precision(event):
            return  # the network run in another precision than the run's (fslab eval --precision): not its score
        value = {"accuracy": float(event["accuracy"]), "ci95": float(event["ci95"]), "episodes": event["episodes"]}
        if event.get("metric", "accuracy") != "accuracy":  # a retrieval evaluation's mAP: tables say so
            value["metric"] = str(event["metric"])
        split, shots, label = event["split"], f"{event['shots']}-shot", logged_evaluator(event)
        if "source" not in event and label == summary.evaluator:  # logged by the training itself
            if is_validation(event) and (summary.best_val is None
                                         or value["accuracy"] > summary.best_val["accuracy"]):
                summary.best_val = {**value, "epoch": _whole(event.get("epoch"))}
            elif split == "test":
                summary.test = {**summary.test, shots: value}
        elif (split == "test" and isinstance(label, str)
              and not older_checkpoint(epoch := _whole(event.get("epoch")), summary)):
            _later_test(summary, label, shots, value, epoch, _whole(event.get("queries")))


def _later_test(summary: RunSummary, label: str, shots: str, value: dict, epoch: int | None,
                queries: int | None) -> None:
    """A later evaluation's score, unless it is of another query count than the run's ``eval.queries``
    and the same checkpoint already has a score at that count (``fslab eval --queries 5`` after the
    run's own shape: a table's column is of one shape)."""
    if epoch is not None:  # the checkpoint it scored
        value["epoch"] = epoch
    if queries is not None and summary.queries is not None and queries != summary.queries:
        value["queries"] = queries  # said, since it is not the run's shape
        held = summary.test_by_evaluator.get(label, {}).get(shots)
        if held is not None and "queries" not in held and held.get("epoch") == epoch:
            return
    summary.test_by_evaluator = {**summary.test_by_evaluator,
                                 label: {**summary.test_by_evaluator.get(label, {}), shots: value}}


def older_checkpoint(epoch: int | None, summary: RunSummary) -> bool:
    """Whether a score of the checkpoint of ``epoch`` is of one older than the run's latest (one of an
    unknown epoch, logged before fslab recorded it, is taken as it stands): the one rule of the summary's
    ``test_by_evaluator`` and of which saved scores compare, plot and study report read."""
    return epoch is not None and summary.checkpoint is not None and epoch < summary.checkpoint


def _checkpoint(summary: RunSummary, epoch: int) -> None:
    """A new latest checkpoint: the later evaluations of older ones no longer score the run's network
    (it was resumed and trained on), and leave ``test_by_evaluator``."""
    summary.checkpoint = epoch if summary.checkpoint is None else max(summary.checkpoint, epoch)
    kept = {label: {shots: score for shots, score in scores.items()
                    if not older_checkpoint(score.get("epoch"), summary)}
            for label, scores in summary.test_by_evaluator.items()}
    summary.test_by_evaluator = {label: scores for label, scores in kept.items() if scores}


def eta(summary: RunSummary, now: float) -> float | None:
    """Seconds left for a running run, at the rate of the steps its latest life has logged (a
    resumed run's stop does not slow it); None until two steps of that life are known. It counts
    down between logged steps, and stops where the worker missed three heartbeats (paused by
    SIGSTOP, or stuck), as ``fslab show`` calls its heartbeat stale: it does not reach 0:00 while
    nothing trains. ``now`` is this host's present, taken to the run's host's clock (:attr:`RunSummary.clock_ahead`)."""
    now += summary.clock_ahead
    if summary.state != "running" or not summary.first_train or not summary.total_steps or summary.step is None:
        return None
    t0, step0 = summary.first_train
    if summary.last_train_time is None or summary.step <= step0 or summary.last_train_time <= t0:
        return None
    rate = (summary.step - step0) / (summary.last_train_time - t0)
    if summary.heartbeat is not None:  # the clock stops with the worker (states.heartbeat_stale)
        now = min(now, max(summary.heartbeat, summary.last_train_time) + max(3 * summary.beat_every, 1.0))
    return max(0.0, (summary.total_steps - summary.step) / rate - (now - summary.last_train_time))


def _looks_whole(line: bytes) -> bool:
    line = line.strip()
    return line[:1] == b"{" and line[-1:] == b"}"


def _event_of(line: bytes) -> dict | None:
    """The line's event if it is a whole one with its kind's fields, else None."""
    try:
        return schemas.event(loads(line))
    except ValueError:
        return None


def add_lines(summary: RunSummary, chunk: bytes) -> None:
    """Fold complete JSONL lines. Of a batch of train lines only the first
    (for the ETA: the first of the run's latest life, if none was seen yet) and
    the last whole ones are folded: the others would be overwritten at once.
    Lines that are not JSON objects count as corrupt."""
    lines = [line for line in chunk.split(b"\n") if line.strip()]
    summary.corrupt += sum(1 for line in lines if not _looks_whole(line))
    trains = [i for i, line in enumerate(lines) if TRAIN_MARK in line]
    # the ETA's first step is the first of the latest life: after the chunk's last start, if it has one
    life = max((i for i, line in enumerate(lines) if START_MARK in line), default=-1)
    first = last = None  # the first and last train lines that are whole events (a damaged one is passed over)
    if trains and (summary.first_train is None or life >= 0):
        first = next((event for i in trains if i > life and (event := _event_of(lines[i])) is not None), None)
    for last_at in reversed(trains):
        if (last := _event_of(lines[last_at])) is not None:
            break
        summary.corrupt += _looks_whole(lines[last_at])  # one that does not even look whole is counted above
    for i, line in enumerate(lines):
        if START_MARK in line:  # a life's start: the one before ended with the training's line above, read or not
            _note_last_time(summary, lines, i)
        if TRAIN_MARK in line or any(mark in line for mark in UNUSED_MARKS):
            continue
        try:
            event = loads(line)
        except ValueError:
            summary.corrupt += _looks_whole(line)  # a line that does not even look whole is counted above
            continue
        if not isinstance(event, dict):
            continue  # a list or a number: counted above, it does not look like an object
        try:
            add_event(summary, event)
        except ValueError:
            summary.corrupt += 1
    if first is not None:  # after the chunk's start events, which begin a life without one
        _fold(summary, first)
    if last is not None:
        kept = summary.first_train
        _fold(summary, last)
        if last_at < life:  # a step of the life before: not the first of the latest one
            summary.first_train = kept
    _note_last_time(summary, lines, len(lines))


def _note_last_time(summary: RunSummary, lines: list[bytes], end: int) -> None:
    """Count the time of the training's last line before ``end``, whatever its kind (lines of kinds the
    summary does not read are not otherwise parsed; fslab eval's lines are not the training's)."""
    at = next((i for i in range(end - 1, -1, -1) if b'"source"' not in lines[i]), None)
    if at is None:
        return
    try:
        event = loads(lines[at])
    except ValueError:
        return
    if isinstance(event, dict) and "source" not in event and (time := _real(event.get("time"))) is not None:
        summary.last_time = time if summary.last_time is None else max(summary.last_time, time)


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_mtime_ns]


class SummaryFile:
    """One run's summary, kept in step with its files and saved beside them.

    :meth:`load` takes what ``summary.json`` holds, :meth:`refresh` folds
    whatever changed since (a ``stat`` per file when nothing did), and
    :meth:`save` writes it back when it changed."""

    def __init__(self, run_dir: str | Path) -> None:
        # Plain strings, not Paths: a listing of 10,000 runs would make 60,000 of them.
        self.dir = os.fspath(run_dir)
        self.paths = {name: f"{self.dir}/{name}" for name in ("config.json", "status.json", SUMMARY_FILE)}
        self.id = os.path.basename(self.dir)
        self._summary: RunSummary | None = None  # built on first use: load() usually brings one
        self.status: dict = {}
        self.config_seen: list | None = None
        self.status_seen: list | None = None
        self.metrics = Tail(f"{self.dir}/metrics.jsonl")
        self.dirty = False
        self.found = False  # summary.json was there when loaded
        self.problems: dict[str, str] = {}  # file -> why it cannot be read; told anew at each refresh

    @property
    def summary(self) -> RunSummary:
        if self._summary is None:
            self._summary = RunSummary(id=self.id)
        return self._summary

    # -- summary.json ----------------------------------------------------------
    def load(self) -> bool:
        """Start from ``summary.json`` if it is of this format; False if not."""
        saved = read_json(self.paths[SUMMARY_FILE])
        self.found = saved is not None  # there to be replaced: one gone at save time was deleted
        if not saved or saved.get("format") != SUMMARY_FORMAT:
            return False
        if not (trusted_fields(saved.get("summary")) and isinstance(saved.get("status"), dict)
                and schemas.conform(saved["status"], schemas.STATUS) == saved["status"]):
            return False  # edited or damaged: folded again from the run's own files
        try:  # the fields as saved (those left out were at their defaults)
            summary = RunSummary(**saved["summary"], id=self.id)
            apply_status(summary, saved["status"])
            if summary.first_train is not None:
                summary.first_train = tuple(summary.first_train)
            seen = saved["seen"]
            # [inode, offset], and from fslabs that check them [modification time, the last bytes read (hex)]
            inode, offset, mtime, mark = [*(seen["metrics"] or (None, 0)), None, None][:4]
            mark = bytes.fromhex(mark) if mark is not None else None
            self.config_seen, self.status_seen = seen["config"], seen["status"]
            self.status = dict(saved["status"])
        except (KeyError, TypeError, ValueError):
            return False
        self._summary, self.metrics = summary, Tail(self.metrics.path, int(offset), inode, mark,
                                                    mtime if isinstance(mtime, int) else None)
        return True

    def save(self) -> None:
        """Write ``summary.json`` if the summary changed; a store this process
        cannot write to is left as it is (the next reader folds again), and so is a folder
        being deleted (:meth:`_being_deleted`)."""
        if not self.dirty or self._being_deleted():
            return
        kept = {name: value for name in FIELD_NAMES if name not in NOT_KEPT
                and (value := getattr(self.summary, name)) != DEFAULTS[name]}
        record = {"format": SUMMARY_FORMAT, "summary": kept,
                  "status": {k: self.status[k] for k in STATUS_KEYS if k in self.status},
                  "seen": {"config": self.config_seen, "status": self.status_seen,
                           "metrics": self._metrics_seen()}}
        try:  # compact: it is read far more often than looked at
            atomic_write_text(Path(self.paths[SUMMARY_FILE]), json.dumps(record, separators=(",", ":")),
                              durable=False)
        except OSError:
            return
        self.dirty, self.found = False, True

    def _being_deleted(self) -> bool:
        """Whether the folder is being removed (``rm -rf`` while a listing reads it): the
        summary.json this reader loaded is gone, or so are its config.json and status.json.
        A summary.json written there again would make the removal fail (Directory not empty)
        and leave the folder behind."""
        if self.found and not os.path.exists(self.paths[SUMMARY_FILE]):
            return True
        return not any(os.path.exists(self.paths[name]) for name in ("config.json", "status.json"))

    def _metrics_seen(self) -> list | None:
        tail = self.metrics
        if not tail.inode:
            return None
        return [tail.inode, tail.offset, *([tail.mtime, tail.mark.hex()] if tail.mark is not None else [])]

    # -- folding what changed ------------------------------------------------------
    def refresh(self, now: float | None = None, *, config: bool = True) -> bool:
        """Fold whatever changed in the run's files; True if the summary changed.
        ``config=False`` leaves ``config.json`` unchecked (it is written once,
        when the run is created). A run whose configuration or status cannot be
        read is ``unreadable``, with the reason as its error."""
        changed = config and self._refresh_json("config.json")
        changed = self._refresh_json("status.json") | self._refresh_metrics() | changed
        self.dirty |= changed
        summary = self.summary
        note = "; ".join(f"{name} {why}" for name, why in sorted(self.problems.items())) or None
        unreadable = "config.json" in self.problems or "status.json" in self.problems
        # a lock is probed only for live runs (fslab.core.worklock); another host's times are read on its clock
        written = self.status_seen[2] / 1e9 if self.status_seen else None
        summary.clock_ahead = 0.0 if unreadable else clock_ahead(self.dir, self.status, written)
        state = UNREADABLE if unreadable else observed_state(self.dir, self.status, now, ahead=summary.clock_ahead)
        if state == UNREADABLE and note is None:  # a JSON object, but no state a run can be in
            note = unknown_state(self.status) or "status.json records no state (a text such as \"completed\")"
        if (state, note) != (summary.state, summary.note):
            summary.state, summary.note = state, note
            summary.error = note if note else schemas.conform(self.status, schemas.STATUS).get("error")
            changed = True
        return changed

    @property
    def is_run(self) -> bool:
        """False for a folder that holds neither a config.json nor a status.json
        (not a run, or one being created): listings leave it out."""
        return not (self.problems.get("config.json") == MISSING and self.problems.get("status.json") == MISSING)

    def _refresh_json(self, name: str) -> bool:
        attr = "config_seen" if name == "config.json" else "status_seen"
        path = self.paths[name]
        try:
            seen = _identity(os.stat(path))
        except FileNotFoundError:
            return self._problem(name, MISSING, attr)
        except OSError as exc:
            return self._problem(name, f"cannot be read: {exc.strerror or exc}", attr)
        if seen == getattr(self, attr) and name not in self.problems:
            return False
        value, why = json_object(path)
        if value is None:  # why, said as the note: a file cut short as it was written, or one edited by hand
            return self._problem(name, why, attr)
        setattr(self, attr, seen)
        self.problems.pop(name, None)
        if name == "config.json":
            summary, reads = self.summary, ("evaluator", "ways", "queries")  # what the fold of the events reads
            before = [getattr(summary, key) for key in reads]
            apply_config(summary, value)
            if [getattr(summary, key) for key in reads] != before:  # edited by hand: which tests count changed
                self._fold_metrics_again()
        else:
            self.status = {k: v for k, v in schemas.conform(value, schemas.STATUS).items() if k in STATUS_KEYS}
            apply_status(self.summary, self.status)
        return True

    def _problem(self, name: str, why: str, seen_attr: str | None = None) -> bool:
        if seen_attr is not None:
            setattr(self, seen_attr, None)
        if self.problems.get(name) == why:
            return False
        self.problems[name] = why
        # what the file said while it could be read is not what it says now: a summary folded afresh
        # (no summary.json, or a read-only store) knows none of it, and neither may this one; the events
        # are folded again without it (the run's evaluator decides which test is its own, the status's
        # resume time the downtime)
        if name == "config.json":
            apply_config(self.summary, {})
            self._fold_metrics_again()
        elif name == "status.json":
            self.status = {}
            apply_status(self.summary, {})
            self._fold_metrics_again()
        return True

    def _fold_metrics_again(self) -> None:
        """Read ``metrics.jsonl`` from its top at the next fold, into fresh metric fields."""
        fresh = RunSummary(id=self.id)
        for name in METRIC_FIELDS:
            setattr(self.summary, name, getattr(fresh, name))
        self.metrics.offset, self.metrics.inode, self.metrics.mark, self.metrics.mtime = 0, None, b"", None

    def _refresh_metrics(self) -> bool:
        tail = self.metrics
        try:
            st = os.stat(tail.path)
        except FileNotFoundError:
            return False  # not written yet (or gone: what was read stays until the file is back)
        except OSError as exc:
            return self._problem("metrics.jsonl", f"cannot be read: {exc.strerror or exc}")
        self.problems.pop("metrics.jsonl", None)
        if st.st_ino == tail.inode and st.st_size == tail.offset:
            if tail.mtime in (None, st.st_mtime_ns):
                return False
            self._fold_metrics_again()  # written to without growing: rewritten in place, to the same size
        chunk, rewritten = tail.read()
        if rewritten:  # cut back (a resume) or replaced: fold it again from the top
            fresh = RunSummary(id=self.id)
            for name in METRIC_FIELDS:
                setattr(self.summary, name, getattr(fresh, name))
        if chunk:
            add_lines(self.summary, chunk)
        return bool(chunk) or rewritten


def read_summary(run_dir: Path, now: float | None = None, *, save: bool = True) -> RunSummary:
    """The run's summary, from ``summary.json`` brought up to date with the
    run's files (and saved again if it had to be)."""
    keeper = SummaryFile(run_dir)
    keeper.load()
    keeper.refresh(now)
    if save:
        keeper.save()
    return keeper.summary


def unmet_filters(summary: RunSummary, states: tuple[str, ...] = (), method: str | None = None,
                  sweep: str | None = None, members: frozenset = frozenset()) -> list[str]:
    """The filters of :func:`list_summaries` that ``summary`` fails, by name (``state``,
    ``method``, ``sweep``); an empty list when it is listed. ``members`` are the ids the
    records of the sweeps ``sweep`` names list (:func:`sweep_members`): a run of one whose
    status.json cannot be read still belongs to it."""
    return [name for name, given, met in (
        ("state", states, lambda: summary.state in states),
        ("method", method is not None, lambda: summary.method == method),
        ("sweep", sweep is not None, lambda: sweep in (summary.sweep or "") or summary.id in members))
        if given and not met()]


def sweep_members(runs_dir: Path, sweep: str | None) -> frozenset:
    """The run ids listed by the records of the sweeps whose id contains ``sweep``."""
    if sweep is None:
        return frozenset()
    return frozenset(run_id for record in sweep_records(runs_dir) if sweep in str(record.get("id", ""))
                     for run_id in record["runs"])


def _kept(runs_dir: Path, name: str, now: float | None) -> SummaryFile:
    """The run's summary file, brought up to date and saved."""
    keeper = SummaryFile(f"{runs_dir}/{name}")
    keeper.load()
    keeper.refresh(now)
    keeper.save()
    return keeper


def kept_newest_first(runs_dir: Path, names: list[str], now: float | None = None, *,
                      every: bool = True) -> Iterator[SummaryFile]:
    """The summary files of the folders ``names`` (sorted, as :func:`run_names` gives them), each brought up
    to date and saved, newest created first, in the one creation order (:func:`fslab.core.runstore.newest_first`):
    a run is given once no other can be newer. ``every``: each run's summary, read once, gives its creation
    time (a walk that reads them all); else its status alone does, for the runs stamped within about a day
    of those given (a walk that stops after the newest few). A folder that is no run comes too
    (:attr:`SummaryFile.is_run` says)."""
    kept: dict[str, SummaryFile] = {}

    def created(name: str) -> float | None:
        kept[name] = _kept(runs_dir, name, now)
        return kept[name].summary.created

    for name in newest_first(runs_dir, names, created if every else None):
        yield kept.pop(name, None) or _kept(runs_dir, name, now)


def list_summaries(runs_dir: Path, *, limit: int | None = 50, states: tuple[str, ...] = (),
                   method: str | None = None, sweep: str | None = None, now: float | None = None) -> list[RunSummary]:
    """Summaries of the newest runs first: at most ``limit`` of them (None:
    all) among those in one of ``states``, of ``method`` and of a sweep whose id
    contains ``sweep``. Runs are visited newest first and the visit stops once
    ``limit`` match, so the newest 50 of 10,000 runs cost 50 summaries, and the creation times of the runs
    stamped within about a day of them (:func:`kept_newest_first`; with no limit, each run's summary, read
    once, gives its time)."""
    found, members = [], sweep_members(runs_dir, sweep)
    for keeper in kept_newest_first(runs_dir, run_names(runs_dir), now, every=limit is None):
        summary = keeper.summary
        if not keeper.is_run or unmet_filters(summary, states, method, sweep, members):
            continue
        found.append(summary)
        if limit is not None and len(found) >= limit:
            break
    return found
