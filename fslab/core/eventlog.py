"""Writing a run's events: ``metrics.jsonl``, one JSON object per line.

The training worker and ``fslab eval`` append through :class:`EventLog`, which
also keeps the run's ``summary.json`` in step as each event lands, so listings
never have to read the events themselves; :func:`truncate_to_checkpoint` cuts
the file back when a run resumes. Every reader goes through
:mod:`fslab.core.files` and :mod:`fslab.core.summary`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from fslab.core.commands import like_command
from fslab.core.errors import FslabError
from fslab.core.events import MOVED_ROOT, describe_event
from fslab.core.files import atomic_write_text, loads, naming
from fslab.core.runstore import Run
from fslab.core.summary import SummaryFile


def first_start_data(run: Run) -> dict:
    """The splits' outlines (:func:`fslab.training.record.split_outline`) the run's first start recorded, kept in
    ``metrics.jsonl`` before its checkpoint; empty for a run an earlier fslab started, which recorded none."""
    return next((e["data"] for e in run.events_of("start") if isinstance(e.get("data"), dict)), {})


@contextlib.contextmanager
def _locked(fh):
    """``fh``'s file locked exclusively for the block; unlocked where ``flock``
    is not to be had (a filesystem without it), as before there was a lock."""
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _same_file(fh, path) -> bool:
    """Whether the open ``fh`` is still the file at ``path`` (a missing path counts as the
    same: appending goes on in the file the folder lost, as it did)."""
    try:
        return os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
    except OSError:
        return True


def ends_mid_line(path) -> bool:
    """Whether the file at ``path`` ends without a newline (its last line is torn)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except OSError:  # missing, or empty (no byte before its end)
        return False


class EventLog:
    """Append-only ``metrics.jsonl``: one JSON object per line, flushed at once,
    and echoed as a readable line (what ``fslab logs`` shows) when ``echo``: printed (the worker's
    stdout is the run's ``stdout.log``), or, for ``echo="log"`` (an event written outside the worker:
    fslab resume --data-root's move), appended to the run's ``stdout.log`` itself.
    A log that is not ``enabled`` (ranks other than 0) writes nothing.
    Each of ``listeners`` (the run's sinks: :class:`fslab.core.sinks.SinkFeed`)
    is called with every event once it is written; it must not block or raise."""

    def __init__(self, run: Run, *, echo: bool | str = True, enabled: bool = True, listeners=()) -> None:
        self.run, self.echo, self.enabled = run, echo, enabled
        self.listeners = list(listeners) if enabled else []
        self.file = open(run.metrics_path, "a", encoding="utf-8") if enabled else None
        # a line cut short (a killed writer, a full disk) is ended first, so the next event stays whole
        self.torn = enabled and ends_mid_line(run.metrics_path)
        self.summary = SummaryFile(run.path)
        if enabled:
            self.summary.load()

    def write(self, event: str, **fields) -> dict:
        """Append one event (``time`` is added) and return it as written."""
        record = {"event": event, "time": time.time(), **fields}
        if not self.enabled:
            return record
        with self._appending():
            try:  # one write: appends from two processes never interleave
                self.file.write("\n" * self.torn + json.dumps(record) + "\n")
                self.torn = False
                self.file.flush()
            except OSError as exc:  # a full disk names no file: this one
                raise naming(exc, self.run.metrics_path) from None
        self.summary.refresh()  # folds this line (and any another process appended)
        self.summary.save()
        if self.echo == "log":
            self._echo_into_log(describe_event(record))
        elif self.echo:
            print(describe_event(record), flush=True)
        for listener in self.listeners:
            listener(record)
        return record

    def _echo_into_log(self, line: str) -> None:
        """``line`` appended to the run's ``stdout.log``, where the worker's lines go, as its own print would."""
        path = self.run.path / "stdout.log"
        try:
            with open(path, "a", encoding="utf-8") as out:
                out.write("\n" * ends_mid_line(path) + line + "\n")
        except OSError as exc:
            raise naming(exc, path) from None

    def sync(self) -> None:
        """Flush what was appended to the disk itself (``fsync``): a checkpoint's event, before its file
        (written durably) is renamed into place, so that a machine that goes down does not keep the
        checkpoint and lose its event, which a resume needs to cut the log back to it."""
        if self.file is not None:
            os.fsync(self.file.fileno())

    @contextlib.contextmanager
    def _appending(self):
        """The file at the path, locked while a line is appended: a resume's cut
        (:func:`truncate_to_checkpoint`) holds the same lock from its read to its
        rename, so a line lands either before the cut, which keeps it, or after it,
        in the file the cut left; never in between, in a file about to be replaced."""
        for tries_left in reversed(range(3)):  # a file at the path this process cannot open: the old one takes it
            self._follow_replacement()
            with _locked(self.file):
                if not tries_left or _same_file(self.file, self.run.metrics_path):
                    yield
                    return

    def _follow_replacement(self) -> None:
        """Append to the file now at the path: a resume that started while this log was open
        (``fslab eval`` beside ``fslab resume``) replaced ``metrics.jsonl`` with the file cut
        back to its checkpoint, and a line written to the old one would be lost with it."""
        try:
            if os.stat(self.run.metrics_path).st_ino == os.fstat(self.file.fileno()).st_ino:
                return
        except OSError:  # gone: appending creates it again, where its folder still is
            pass
        try:
            fresh = open(self.run.metrics_path, "a", encoding="utf-8")
        except OSError:  # the run's folder is gone too: the old file takes the line, as it did
            return
        self.file.close()
        self.file = fresh
        self.torn = ends_mid_line(self.run.metrics_path)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def start_afresh(run: Run) -> None:
    """Empty ``metrics.jsonl`` for a run that starts from its beginning again: one
    queued again (``fslab sweep resume``, a requeued SLURM job) after it ended
    before its first checkpoint. The events of that earlier start would read as
    this one's, each step up to where it stopped logged twice; those of its data root moved
    (:data:`MOVED_ROOT`) are kept, no training's. A new run has no file yet, and nothing is done."""
    try:
        if run.metrics_path.stat().st_size == 0:
            return
        lines = run.metrics_path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return
    kept = _lines_of(lines, lambda event: event.get("event") == MOVED_ROOT)
    atomic_write_text(run.metrics_path, b"".join(kept).decode("utf-8"))


def _lines_of(lines: list[bytes], keep) -> list[bytes]:
    """The lines whose event ``keep(event)`` keeps through a cut of the file (:func:`start_afresh`,
    :func:`truncate_to_checkpoint`), each ending its line; a line that is no event's is left out."""
    kept = []
    for line in lines:
        try:
            event = loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and keep(event):
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    return kept


def truncate_to_checkpoint(run: Run, epoch: int) -> None:
    """Cut ``metrics.jsonl`` back to the checkpoint event of ``epoch``, so a
    resumed run continues the file without repeating or skipping a step. The
    evaluations ``fslab eval`` logged after it (they name their ``source``) are
    kept: they scored a checkpoint that was written, not the training that is
    repeated, and their scores stay in ``evaluations/``, as are those of its data root moved
    (:data:`MOVED_ROOT`). A file that is gone (deleted, left out of a copy) lost that event too, and is said
    so in the same line."""
    try:
        fh = open(run.metrics_path, "rb")
    except FileNotFoundError:
        raise FslabError(f"{run.metrics_path} is missing, and with it the checkpoint event of epoch {epoch}, the "
                         f"epoch of the checkpoint; the run cannot go on from there: start it again with "
                         f"{like_command(run.id)}") from None
    with fh, _locked(fh):  # no fslab eval appends meanwhile (EventLog)
        _cut_back(run, epoch, fh.readlines())


def _cut_back(run: Run, epoch: int, lines: list[bytes]) -> None:
    kept, cut = [], None
    for number, line in enumerate(lines):
        try:
            event = loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "checkpoint" and event.get("epoch") == epoch:
            kept, cut = lines[: number + 1], number + 1
    if cut is None:  # cut short or edited by hand: the steps after it cannot be continued in order
        raise FslabError(f"{run.metrics_path} has no checkpoint event for epoch {epoch}, the epoch of the "
                         f"checkpoint (the file was cut short or edited); the run cannot go on from there: "
                         f"start it again with {like_command(run.id)}")
    kept += _lines_of(lines[cut:], lambda event: event.get("event") == "eval" and "source" in event
                      or event.get("event") == MOVED_ROOT)
    atomic_write_text(run.metrics_path, b"".join(kept).decode("utf-8"))
