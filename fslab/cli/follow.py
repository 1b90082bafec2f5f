"""Following a run: a rich progress bar fed by ``metrics.jsonl`` (plain lines where the output is a file)."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fslab.core.events import eval_line, speed_text
from fslab.core.files import Tail
from fslab.core.runstore import Run
from fslab.core.summary import RunSummary, add_event, eta
from fslab.core.text import duration, loss_text

PLAIN_EVERY = 60.0  # seconds: at most one progress line a minute within an epoch, where the output is a file
# Redraws of the bar a second, in a terminal: what it shows changes once a second (the elapsed time) or once
# per logged step (seconds apart on a CPU). rich's 10 a second took 2% of a core from a run's worker on a
# 2-core CPU (benchmarks/bench_first_run.py).
REDRAWS_PER_S = 2


def events_file(run: Run) -> int | None:
    """The inode of the run's ``metrics.jsonl`` where it holds events (None: missing or empty): taken
    before a resume starts its worker, which replaces that file by one cut back to the checkpoint."""
    try:
        st = os.stat(run.metrics_path)
    except OSError:
        return None
    return st.st_ino if st.st_size else None


def follow(run: Run, console: Console, process, poll: float = 0.25, until_replaced: int | None = None) -> str:
    """Show progress until the worker ``process`` (a Popen) exits; returns the
    run's final state. The exit, not ``status.json``, decides: a resumed run's
    status still holds its old end state until the worker rewrites it, read as
    soon as it comes (:func:`wait_a_poll`).
    ``until_replaced``: a resume's :func:`events_file`, read only once the worker
    has cut it back (or exited): the steps after the checkpoint, trained again,
    would print twice, first with the rate of the life that was cut.

    Where the output is not a terminal (a log file, a pipe, a SLURM job's
    output), a bar redrawn in place shows nothing until the end: the same
    fields are printed as plain lines instead, one per epoch (before its
    validation) and one a minute at most within a long epoch."""
    plain = not console.is_terminal
    progress = _bar(console, disable=plain)
    tail = Tail(run.metrics_path)
    printed: set[str] = set()  # a resumed run's worker cuts the file back and rewrites it: print a line once
    summary = RunSummary(id=run.id, state="running")  # the epochs and the ETA, as the dashboard has them
    lines = PlainLines(console, printed, enabled=plain)
    with progress:
        task = progress.add_task("train", total=None, epoch="starting", steps="", loss="-", pairs="-", speed="",
                                 eta="-")
        while True:
            exited = process.poll() is not None  # before the read: what it wrote last is read below
            if until_replaced is not None and not exited and events_file(run) == until_replaced:
                wait_a_poll(process, poll)
                continue
            until_replaced = None
            events, _, _ = tail.events()
            for event in events:
                kind = event.get("event")
                try:
                    add_event(summary, event)
                except ValueError:
                    pass  # not an event of its kind's shape: the lines below read what they need of it
                if kind == "start":
                    _started(progress, task, event, summary, printed)
                elif kind == "train":
                    fields = {
                        "epoch": f"epoch {event['epoch']}/{summary.epochs or '?'}",
                        "steps": f"step {event['step']}/{progress.tasks[0].total or '?'}",
                        "loss": loss_text(event["loss"]),
                        "pairs": f"+{event['positives']}/-{event['negatives']}",
                        "speed": speed_text(event),
                    }
                    progress.update(task, completed=event["step"], **fields)
                    # the ETA as of the step's own time: a resumed run's file, read again, prints its old
                    # lines as they were (not 0:00 for a step of days ago), and each once
                    at = _logged_at(event)
                    lines.step(event["epoch"], fields, lambda: duration(eta(summary, at)))  # noqa: B023 (called at once)
                elif kind == "eval" and event.get("split") != "test":  # the test results are printed at the end
                    lines.flush()
                    if (line := eval_line(event)) not in printed:
                        printed.add(line)
                        progress.console.print(line)
            progress.update(task, eta=duration(eta(summary, time.time())))
            lines.tick()
            if exited:  # read after the exit: nothing is left to come
                lines.flush()
                break
            wait_a_poll(process, poll)
    return run.state()


def _started(progress: Progress, task, event: dict, summary: RunSummary, printed: set[str]) -> None:
    """The bar's total steps from a start event (a resumed run's start keeps the step it reached shown), and
    the ``note`` of a resume on data that differs from the run's first start's, printed once."""
    total = event["total_steps"]
    begun = {"epoch": f"epoch 1/{event['epochs']}", "steps": f"step 0/{total}"} if summary.step is None else {}
    progress.update(task, total=total, **begun)
    if isinstance(event.get("note"), str) and event["note"] not in printed:
        printed.add(event["note"])
        progress.console.print(event["note"], highlight=False)


def wait_a_poll(process, seconds: float) -> None:
    """Up to ``seconds`` for the worker ``process`` to exit, returning once it has: a sleep of the
    whole poll left the end of every run, its test results, unread for up to that long (and a
    read that still found events after the exit slept once more before it ended)."""
    if seconds > 0:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=seconds)


def _logged_at(event: dict) -> float:
    """When an event was logged (now, for one without a usable time)."""
    at = event.get("time")
    return float(at) if isinstance(at, (int, float)) and math.isfinite(at) else time.time()


def _bar(console: Console, disable: bool) -> Progress:
    """The progress bar: epoch, steps, loss, pairs, speed, elapsed time and ETA."""
    return Progress(
        TextColumn("[bold]{task.fields[epoch]}"),
        BarColumn(),
        TextColumn("{task.fields[steps]}"),  # empty until the start event tells the total
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("pairs {task.fields[pairs]}"),
        TextColumn("{task.fields[speed]}"),
        TimeElapsedColumn(),
        # the dashboard's ETA (the rate of the run's latest life), not rich's: a resumed run's steps,
        # all read at once, would look like a burst of speed
        TextColumn("ETA {task.fields[eta]}"),
        console=console,
        transient=False,
        disable=disable,
        refresh_per_second=REDRAWS_PER_S,
    )


class PlainLines:
    """Progress where the output is a file: the latest step's line is held and
    printed once its epoch ends, before a validation, a minute after the last
    line within a long epoch, and at the end; each line once (``printed`` is
    shared with the validation lines, as a resumed run's file is read again).
    Not ``enabled`` (a terminal, where the bar shows the same), it prints nothing."""

    def __init__(self, console: Console, printed: set[str], enabled: bool = True) -> None:
        self.console, self.printed, self.enabled = console, printed, enabled
        self.pending: tuple[int, str] | None = None  # (epoch, line)
        self.last = time.monotonic()

    def step(self, epoch: int, fields: dict, eta_text) -> None:
        """The step of a train event: ``fields`` as the bar shows them, ``eta_text()`` the ETA."""
        if not self.enabled:
            return
        if self.pending and self.pending[0] != epoch:
            self.flush()  # the previous epoch's last step
        self.pending = (epoch, f"{fields['epoch']} {fields['steps']} loss {fields['loss']} pairs {fields['pairs']} "
                               f"{fields['speed']} ETA {eta_text()}")

    def tick(self) -> None:
        if time.monotonic() - self.last >= PLAIN_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.pending and self.pending[1] not in self.printed:
            self.printed.add(self.pending[1])
            self.console.print(self.pending[1], highlight=False, markup=False)
            self.last = time.monotonic()
        self.pending = None
