"""Where a run's wall time went, read from its events: one split that
``fslab show`` prints and ``benchmarks/bench_gpu.py --recipe`` reports.

Each interval between two consecutive events is charged to what the later one
closes: a ``train`` event the steps since the previous event (those of epoch 1
apart, as the ``first epoch``, which holds any compiling: ``compile`` events
close intervals of it too), a validation ``eval`` the validation, a
``checkpoint`` the checkpoint's copy, the final network's evaluations (the
test's, and with ``eval.final_val`` the validation classes') and ``end`` the
test. The worker's ``start`` comes from ``status.json``'s ``started`` (or
``resumed``, for the ``start`` a resumed worker logs) to the ``start`` event,
and the ``finish`` from the last event to ``ended``. Time between a stop and
the next resume is no part of any: a resumed run's parts add up to its working
time. Events ``fslab eval`` logs are left out (they name their ``source``:
another process did that work, during the run or after it; one logged after
the end without a source is left out too), as is anything without a time; an
event whose time runs backwards (a clock set back) closes no interval, and
time counts again from the latest event once the clock has passed it.
"""

from __future__ import annotations

import math
from typing import Any

from fslab.core.events import is_validation

PARTS = ("start", "first epoch", "training", "validation", "checkpoints", "test", "finish")


def key(part: str) -> str:
    """The key of a part in :func:`time_split`'s result: ``first epoch`` -> ``first_epoch_s``."""
    return part.replace(" ", "_") + "_s"


def time_split(events: list[dict], started: float | None = None, ended: float | None = None,
               resumed: float | None = None) -> dict[str, Any]:
    """Seconds per part (:data:`PARTS`, keyed by :func:`key`), with the number of
    ``validations``, the last checkpointed epoch (``epochs``), the compile seconds
    (``compile_s``), the number of resumes and the sum of the parts (``total_s``)."""
    return TimeSplit(started, ended, resumed).add(events).result()


class TimeSplit:
    """:func:`time_split` as a fold that goes on: events are added as they come (the dashboard's run
    screen adds a live run's new events, where folding every one again took a tenth of a second a
    tick for a run of 200,000 steps), for the status's times it was made with."""

    def __init__(self, started: float | None = None, ended: float | None = None,
                 resumed: float | None = None) -> None:
        self.started, self.ended, self.resumed = started, ended, resumed
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.counts = {"validations": 0, "epochs": 0, "compile_s": 0.0, "resumes": 0}
        self.previous: float | None = None
        self.starts = 0

    def add(self, events: list[dict]) -> TimeSplit:
        seconds, counts, ended = self.seconds, self.counts, self.ended
        for event in events:
            kind, at = event.get("event"), event.get("time")
            if not isinstance(at, (int, float)) or not math.isfinite(at) or "source" in event:
                continue  # no time, or fslab eval's work, not the run's
            previous = self.previous
            gap = 0.0 if previous is None else max(0.0, at - previous)  # a clock set back charges nothing
            if kind == "start":  # a worker began: from status.json's started (resumed) to its first event
                began = self.started if self.starts == 0 else self.resumed
                if isinstance(began, (int, float)) and (previous is None or began >= previous) and began <= at:
                    seconds["start"] += at - began
                self.starts += 1
            elif previous is None:
                continue
            elif kind == "resume":  # restoring the checkpoint, just after the resumed worker's start
                seconds["start"] += gap
                counts["resumes"] += 1
            elif kind == "train":
                seconds["first epoch" if event.get("epoch") == 1 else "training"] += gap
            elif kind == "compile":
                counts["compile_s"] += _number(event.get("seconds"))
                seconds["first epoch"] += gap
            elif kind == "eval" and is_validation(event):
                seconds["validation"] += gap
                counts["validations"] += 1
            elif kind == "checkpoint":
                seconds["checkpoints"] += gap
                counts["epochs"] = max(counts["epochs"], int(_number(event.get("epoch"))))
            elif kind in ("eval", "end") and (ended is None or at <= ended):  # not an old fslab eval after the end
                seconds["test"] += gap
            else:
                continue
            self.previous = at if previous is None else max(previous, at)
        return self

    def result(self) -> dict[str, Any]:
        """The split of the events added so far (the fold goes on unchanged)."""
        seconds = dict(self.seconds)
        if self.ended is not None and self.previous is not None and self.ended >= self.previous:
            seconds["finish"] += self.ended - self.previous
        parts = {key(part): value for part, value in seconds.items()}
        return {**parts, **self.counts, "total_s": sum(parts.values())}


def _number(value: Any) -> float:
    """A finite number from an event's field, 0 for anything else (a damaged line)."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def time_line(split: dict[str, Any]) -> str:
    """One line for ``fslab show``: each part that took time, and validation's
    share of the training time (its cost against ``eval.val_every``), compiling left out:
    a one-time cost that made the share of a compiled run read low (3% for 10% after a 22 s compile)."""
    shown = [f"{part} {split[key(part)]:.1f} s" for part in PARTS if split[key(part)] >= 0.05]
    trained = split["first_epoch_s"] + split["training_s"] - min(split["compile_s"], split["first_epoch_s"])
    compiled = " (compiling left out)" if split["compile_s"] > 0 else ""
    share = (f"; validation {100 * split['validation_s'] / trained:.0f}% of the training time{compiled}"
             if split["validations"] and trained > 0 else "")
    resumed = f" (resumed {split['resumes']}×; stopped time not counted)" if split["resumes"] else ""
    return f"time: {', '.join(shown) or '-'}; {split['total_s']:.1f} s in all{resumed}{share}"
