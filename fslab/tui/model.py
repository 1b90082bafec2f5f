"""What the dashboard shows of a run, as plain functions of its
:class:`~fslab.core.summary.RunSummary` (no Textual here): cell text,
filtering, sorting, elapsed time and ETA."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rich.text import Text

from fslab.core.summary import RunSummary
from fslab.core.text import printable

STATE_STYLES = {
    "queued": "yellow", "running": "bold cyan", "completed": "green",
    "failed": "bold red", "killed": "magenta", "lost": "bold red", "unreadable": "bold yellow",
}
BAR_WIDTH = 6
BAR_CHARS = " ▏▎▍▌▋▊▉█"


def pct(value: dict | None) -> str:
    return f"{100 * value['accuracy']:.2f}±{100 * value['ci95']:.2f}" if value else "-"


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0 or not math.isfinite(seconds):
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def elapsed(row: RunSummary, now: float) -> float | None:
    if row.started is None:
        return None
    return (row.ended if row.ended is not None else now) - row.started


def eta(row: RunSummary, now: float) -> float | None:
    """Seconds left at the rate of the steps logged so far (running runs only)."""
    if row.state != "running" or not row.first_train or not row.total_steps or row.step is None:
        return None
    t0, step0 = row.first_train
    if row.last_train_time is None or row.step <= step0 or row.last_train_time <= t0:
        return None
    rate = (row.step - step0) / (row.last_train_time - t0)
    return max(0.0, (row.total_steps - row.step) / rate - (now - row.last_train_time))


def fraction_done(row: RunSummary) -> float | None:
    if row.state == "completed":
        return 1.0
    if row.step is not None and row.total_steps:
        return min(1.0, row.step / row.total_steps)
    if row.epoch is not None and row.epochs:
        return min(1.0, row.epoch / row.epochs)
    return None


def progress_text(row: RunSummary) -> Text:
    done = fraction_done(row)
    epoch = row.epochs if row.state == "completed" and row.epochs else (row.epoch or 0)
    label = f"{epoch}/{row.epochs if row.epochs is not None else '?'} "
    if done is None:
        return Text(label + " " * BAR_WIDTH)
    eighths = round(done * BAR_WIDTH * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (BAR_CHARS[part] if part else "")
    return Text(label) + Text(bar.ljust(BAR_WIDTH), style="cyan")


def state_text(row: RunSummary) -> Text:
    return Text(row.state, style=STATE_STYLES.get(row.state, ""))


# State, progress and loss come right after the (frozen) id column, so an
# 80-column terminal shows them without scrolling sideways.
COLUMNS = ("", "id", "state", "progress", "loss", "method", "loss fn", "backbone", "dataset", "seed",
           "pairs +/-", "best val", "test 1-shot", "test 5-shot", "elapsed", "ETA")


def row_cells(row: RunSummary, now: float, marked: bool) -> list[Text]:
    """The table cells of one run; every value from run files is plain Text."""
    plain = lambda value: Text("-" if value is None else printable(value))
    pairs = "-" if row.positives is None else f"{row.positives}/{row.negatives}"
    return [
        Text("*" if marked else " ", style="bold"),
        Text(printable(row.id)) + (Text(" !", style="bold red") if row.note or row.corrupt else Text("")),
        state_text(row), progress_text(row), Text("-" if row.loss is None else f"{row.loss:.4f}"),
        plain(row.method), plain(row.loss_fn), plain(row.backbone), plain(row.dataset), plain(row.seed),
        Text(pairs), Text(pct(row.best_val)), Text(pct(row.test.get("1-shot"))), Text(pct(row.test.get("5-shot"))),
        Text(duration(elapsed(row, now))), Text(duration(eta(row, now))),
    ]


FIELDS: dict[str, Callable[[RunSummary], Any]] = {
    "id": lambda r: r.id, "method": lambda r: r.method, "loss": lambda r: r.loss_fn,
    "backbone": lambda r: r.backbone, "dataset": lambda r: r.dataset, "seed": lambda r: r.seed,
    "state": lambda r: r.state,
}


def matches(row: RunSummary, query: str) -> bool:
    """Every space-separated term must match: ``field:text`` (method, loss,
    backbone, dataset, seed, state, id) looks in that field, a bare term in any
    of them and in the error; case-insensitive substrings."""
    for term in query.lower().split():
        name, sep, text = term.partition(":")
        if sep and name in FIELDS:
            if text not in str(FIELDS[name](row)).lower():
                return False
        elif (not any(term in str(get(row)).lower() for get in FIELDS.values())
              and term not in (row.error or "").lower()):
            return False
    return True


def _missing_last(value, reverse: bool):
    """Sort key that keeps runs without a value at the bottom either way."""
    missing = value is None
    return (missing != reverse, value if not missing else 0)


SORTS: dict[str, Callable[[RunSummary, float], Any]] = {
    "id": lambda r, now: r.id,
    "state": lambda r, now: r.state,
    "method": lambda r, now: (r.method or "", r.id),
    "loss": lambda r, now: r.loss,
    "best val": lambda r, now: r.best_val and r.best_val["accuracy"],
    "test 5-shot": lambda r, now: (r.test.get("5-shot") or {}).get("accuracy"),
    "elapsed": lambda r, now: elapsed(r, now),
}


def sort_rows(rows: list[RunSummary], by: str, reverse: bool, now: float) -> list[RunSummary]:
    key = SORTS[by]
    if by in ("id", "state", "method"):
        return sorted(rows, key=lambda r: key(r, now), reverse=reverse)
    return sorted(rows, key=lambda r: _missing_last(key(r, now), reverse), reverse=reverse)
