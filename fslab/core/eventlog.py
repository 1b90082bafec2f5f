"""Writing a run's events: ``metrics.jsonl``, one JSON object per line.

The training worker and ``fslab eval`` append through :class:`EventLog`, which
also keeps the run's ``summary.json`` in step as each event lands, so listings
never have to read the events themselves; :func:`truncate_to_checkpoint` cuts
the file back when a run resumes. Every reader goes through
:mod:`fslab.core.files` and :mod:`fslab.core.summary`.
"""

from __future__ import annotations

import json
import os
import time

from fslab.core.events import describe_event
from fslab.core.files import atomic_write_text, loads
from fslab.core.runstore import Run
from fslab.core.summary import SummaryFile


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
    and echoed as a readable line (what ``fslab logs`` shows) when ``echo``.
    A log that is not ``enabled`` (ranks other than 0) writes nothing.
    Each of ``listeners`` (the run's sinks: :class:`fslab.core.sinks.SinkFeed`)
    is called with every event once it is written; it must not block or raise."""

    def __init__(self, run: Run, *, echo: bool = True, enabled: bool = True, listeners=()) -> None:
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
        # one write: appends from two processes never interleave
        self.file.write("\n" * self.torn + json.dumps(record) + "\n")
        self.torn = False
        self.file.flush()
        self.summary.refresh()  # folds this line (and any another process appended)
        self.summary.save()
        if self.echo:
            print(describe_event(record), flush=True)
        for listener in self.listeners:
            listener(record)
        return record

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def truncate_to_checkpoint(run: Run, epoch: int) -> None:
    """Cut ``metrics.jsonl`` back to the checkpoint event of ``epoch``, so a
    resumed run continues the file without repeating or skipping a step."""
    kept = []
    with open(run.metrics_path, "rb") as fh:
        lines = fh.readlines()
    for number, line in enumerate(lines):
        try:
            event = loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "checkpoint" and event.get("epoch") == epoch:
            kept = lines[: number + 1]
    if not kept:
        raise RuntimeError(f"metrics.jsonl has no checkpoint event for epoch {epoch}; cannot resume cleanly")
    atomic_write_text(run.metrics_path, b"".join(kept).decode("utf-8"))
