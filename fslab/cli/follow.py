"""Following a run in the terminal: a rich progress bar fed by ``metrics.jsonl``."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fslab.core.events import eval_line
from fslab.core.files import Tail
from fslab.core.runstore import Run
from fslab.core.summary import RunSummary, add_event, eta
from fslab.core.text import duration


def follow(run: Run, console: Console, process, poll: float = 0.25) -> str:
    """Show progress until the worker ``process`` (a Popen) exits; returns the
    run's final state. The exit, not ``status.json``, decides: a resumed run's
    status still holds its old end state until the worker rewrites it."""
    progress = Progress(
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
    )
    tail = Tail(run.metrics_path)
    printed: set[str] = set()  # a resumed run's worker cuts the file back and rewrites it: print a line once
    summary = RunSummary(id=run.id, state="running")  # the epochs and the ETA, as the dashboard has them
    with progress:
        task = progress.add_task("train", total=None, epoch="starting", steps="", loss="-", pairs="-", speed="",
                                 eta="-")
        while True:
            exited = process.poll() is not None  # before the read: what it wrote last is read below
            events, _, _ = tail.events()
            for event in events:
                kind = event.get("event")
                try:
                    add_event(summary, event)
                except ValueError:
                    pass  # not an event of its kind's shape: the lines below read what they need of it
                if kind == "start":  # a resumed run's start keeps the step it reached shown
                    total = event["total_steps"]
                    begun = {"epoch": f"epoch 1/{event['epochs']}", "steps": f"step 0/{total}"} \
                        if summary.step is None else {}
                    progress.update(task, total=total, **begun)
                elif kind == "train":
                    progress.update(
                        task,
                        completed=event["step"],
                        steps=f"step {event['step']}/{progress.tasks[0].total or '?'}",
                        epoch=f"epoch {event['epoch']}/{summary.epochs or '?'}",
                        loss=f"{event['loss']:.4f}",
                        pairs=f"+{event['positives']}/-{event['negatives']}",
                        speed=f"{event['images_per_s']:.0f} img/s",
                    )
                elif kind == "eval" and event.get("split") != "test":  # the test results are printed at the end
                    if (line := eval_line(event)) not in printed:
                        printed.add(line)
                        progress.console.print(line)
            progress.update(task, eta=duration(eta(summary, time.time())))
            if exited and not events:
                break
            time.sleep(poll)
    return run.state()
