"""What the dashboard shows of a run, as plain functions of its
:class:`~fslab.core.summary.RunSummary` (no Textual here): cell text,
filtering, sorting and elapsed time (the ETA is :func:`fslab.core.summary.eta`, which
``fslab run``'s progress bar shows too)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rich.text import Text

from fslab.core.claims import marked_state
from fslab.core.creation import creation_key
from fslab.core.events import table_score
from fslab.core.summary import RunSummary, eta
from fslab.core.text import duration, loss_text, printable
from fslab.core.values import is_number

STATE_STYLES = {
    "queued": "yellow", "running": "bold cyan", "completed": "green",
    "failed": "bold red", "killed": "magenta", "lost": "bold red", "unreadable": "bold yellow",
}
BAR_WIDTH = 6
BAR_CHARS = " ▏▎▍▌▋▊▉█"


def elapsed(row: RunSummary, now: float) -> float | None:
    """Seconds the run's workers have lived: from its start to its end, now while it runs, or its last
    sign of life (lost, or queued to resume), less the time it lay stopped between lives."""
    if row.started is None:
        return None
    if row.ended is not None:
        end = row.ended
    elif row.state == "running":
        end = now + row.clock_ahead  # on the run's host's clock, as its start
    else:
        end = max((t for t in (row.heartbeat, row.last_time) if t is not None), default=row.started)
    stopped = row.downtime
    if row.resumed is not None and row.last_time is not None and row.resumed > row.last_time:
        stopped += row.resumed - row.last_time  # a resumed worker that has not logged its start yet
    return max(0.0, end - row.started - stopped)


def fraction_done(row: RunSummary) -> float | None:
    if row.state == "completed":
        return 1.0
    if row.step is not None and row.total_steps:
        return min(1.0, row.step / row.total_steps)
    if row.epoch is not None and row.epochs:
        return min(1.0, row.epoch / row.epochs)
    return None


def state_text(row: RunSummary, problem: str | None = None) -> Text:
    """The run's state, ``queued!`` where its claim holds it until a person acts (``problem``), as fslab runs
    and fslab queue mark it (:func:`fslab.core.claims.marked_state`)."""
    return Text(marked_state(row.state, problem), style=STATE_STYLES.get(row.state, ""))


# In priority order: as the terminal narrows, columns on the right go first
# (behind ←/→). At 80 columns the id, state, method, epoch and both test
# accuracies fit; the mark and the id never scroll away.
COLUMNS = ("", "id", "state", "method", "epoch", "test 1-shot", "test 5-shot", "loss", "progress", "ETA",
           "elapsed", "cpu", "mem", "gpu mem", "gpu", "best val", "loss fn", "backbone", "dataset", "seed",
           "pairs +/-")
WIDTHS = (1, 24, 9, 6, 5, 10, 10, 6, BAR_WIDTH, 4, 7, 4, 5, 7, 4, 10, 7, 8, 7, 4, 9)


def size(n: float | None) -> str:
    """Bytes in the smallest unit that keeps the number shown under 1,000, with one decimal where it
    is under 100 (``1.2G``, ``118M``), as rounded: 1,023,949 bytes are ``1000K`` no more, but ``1.0M``,
    and 102,350 ``100K``, not ``100.0K``; ``-`` for none, or for a count no memory holds (below 0, as
    a damaged status.json may say, not finite, or a whole number beyond a float's range)."""
    try:
        n = None if n is None else float(n)
    except OverflowError:
        n = None
    if n is None or not 0 <= n < math.inf:
        return "-"
    n = abs(n)  # -0.0: 0B, not -0B
    for unit in ("B", "K", "M", "G", "T"):
        text = f"{n:.1f}" if unit != "B" and round(n, 1) < 100 else f"{n:.0f}"
        if float(text) < 1000:
            break
        n /= 1024
    return text + unit  # past 1000T (no memory), T all the same


def live_usage(row: RunSummary) -> dict:
    """The worker's last usage sample, for running runs only (an ended run's is history)."""
    return (row.usage or {}) if row.state == "running" else {}


def usage_cells(row: RunSummary) -> list[Text]:
    """cpu, mem, gpu mem (allocated/reserved), gpu utilisation; ``-`` where not sampled."""
    usage = live_usage(row)
    cpu, gpu = usage.get("cpu_percent"), usage.get("gpu_utilization_percent")
    allocated, reserved = usage.get("gpu_allocated_bytes"), usage.get("gpu_reserved_bytes")
    return [Text("-" if cpu is None else f"{cpu:.0f}%"), Text(size(usage.get("rss_bytes"))),
            Text("-" if reserved is None else f"{size(allocated)}/{size(reserved)}"),
            Text("-" if gpu is None else f"{gpu:.0f}%")]


def usage_text(row: RunSummary) -> str:
    """The usage of a running run in words, for the detail's summary line ('' if none)."""
    cpu, mem, gpu_mem, gpu = (cell.plain for cell in usage_cells(row))
    if not live_usage(row):
        return ""
    parts = [f"cpu {cpu}", f"mem {mem}"]
    if gpu_mem != "-":
        parts.append(f"gpu mem {gpu_mem} (allocated/reserved)")
    if gpu != "-":
        parts.append(f"gpu {gpu}")
    return " · ".join(parts)


def epoch_text(row: RunSummary) -> Text:
    epoch = row.epochs if row.state == "completed" and row.epochs else (row.epoch or 0)
    return Text(f"{epoch}/{row.epochs if row.epochs is not None else '?'}")


def bar_text(row: RunSummary) -> Text:
    done = fraction_done(row)
    if done is None:
        return Text("")
    full, part = divmod(round(done * BAR_WIDTH * 8), 8)
    return Text(("█" * full + (BAR_CHARS[part] if part else "")).ljust(BAR_WIDTH), style="cyan")


def row_cells(row: RunSummary, now: float, marked: bool, problem: str | None = None) -> list[Text]:
    """The table cells of one run, in COLUMNS order; every value from run files is plain Text. ``problem``: its
    claim's (:meth:`fslab.core.runstore.Run.claim_problem`), which marks its state."""
    plain = lambda value: Text("-" if value is None else printable(value))
    pairs = "-" if row.positives is None else f"{row.positives}/{row.negatives}"
    return [
        Text("*" if marked else " ", style="bold"),
        Text(printable(row.id)) + (Text(" !", style="bold red") if row.note or row.corrupt else Text("")),
        state_text(row, problem), plain(row.method), epoch_text(row),
        Text(table_score(row.test.get("1-shot"))), Text(table_score(row.test.get("5-shot"))),
        Text(loss_text(row.loss)), bar_text(row),
        Text(duration(eta(row, now))), Text(duration(elapsed(row, now))), *usage_cells(row),
        Text(table_score(row.best_val)),
        plain(row.loss_fn), plain(row.backbone), plain(row.dataset), plain(row.seed), Text(pairs),
    ]


FIELDS: dict[str, Callable[[RunSummary], Any]] = {
    "id": lambda r: r.id, "method": lambda r: r.method, "loss": lambda r: r.loss_fn,
    "backbone": lambda r: r.backbone, "dataset": lambda r: r.dataset, "seed": lambda r: r.seed,
    "state": lambda r: r.state, "sweep": lambda r: r.sweep,  # sweep:4b55, the runs of one sweep (fslab runs --sweep)
}


def unknown_fields(query: str) -> list[str]:
    """The ``field:`` names of ``query`` that are not filter fields."""
    names = (term.partition(":") for term in query.lower().split())
    return sorted({name for name, sep, _ in names if sep and name and name not in FIELDS})


def newest_sweep(query: str, runs_dir) -> str:
    """``query`` with each ``sweep:last`` term naming the newest sweep's id, as ``fslab runs --sweep last``
    resolves it (:func:`fslab.core.sweeps.sweep_name`); where the store has no sweep, left as it is, and
    it matches no run."""
    newest = _last_sweep(query, runs_dir)
    if not newest:
        return query
    return " ".join(f"sweep:{newest}" if term.lower() == "sweep:last" else term for term in query.split())


def last_sweep_said(query: str, runs_dir) -> str:
    """For the status line after the filter: which sweep ``sweep:last`` stands for now, or that
    there is none yet (and so it matches no run); nothing for a query without the term."""
    newest = _last_sweep(query, runs_dir)
    if newest is None:
        return ""
    return f" (sweep:last is {newest})" if newest else " (no sweep yet: sweep:last matches no run)"


def _last_sweep(query: str, runs_dir) -> str | None:
    """The newest sweep's id where ``query`` has a ``sweep:last`` term ('' when the store has no
    sweep), else None."""
    from fslab.core.errors import UsageError
    from fslab.core.sweeps import sweep_name

    if not any(term.lower() == "sweep:last" for term in query.split()):
        return None
    try:
        return sweep_name(runs_dir, "last")
    except UsageError:  # no sweeps yet
        return ""


def matches(row: RunSummary, query: str) -> bool:
    """Every space-separated term must match: ``field:text`` (method, loss,
    backbone, dataset, seed, state, sweep, id) looks in that field, a bare term in any
    of them and in the error; case-insensitive substrings. (A term with an
    unknown field matches nothing; the screen names it.)"""
    shown = lambda get: "" if get(row) is None else str(get(row)).lower()  # a missing value is '-', not 'none'
    for term in query.lower().split():
        name, sep, text = term.partition(":")
        if sep and name in FIELDS:
            if text not in shown(FIELDS[name]):
                return False
        elif not any(term in shown(get) for get in FIELDS.values()) and term not in (row.error or "").lower():
            return False
    return True


def _missing_last(value, reverse: bool):
    """Sort key that keeps runs without a value at the bottom either way;
    numbers sort as numbers, anything else as text."""
    missing = value is None
    if missing:
        return (not reverse, 0, 0)
    number = is_number(value)
    return (reverse, 0 if number else 1, value if number else str(value))


def _accuracy(value: dict | None):
    return value.get("accuracy") if value else None


# Every column but the mark sorts; "progress" sorts as "epoch" does.
SORTS: dict[str, Callable[[RunSummary, float], Any]] = {
    "id": lambda r, now: creation_key(r.id, r.created),  # the order runs were made in (fslab.core.creation)
    "state": lambda r, now: r.state,
    "method": lambda r, now: r.method,
    "epoch": lambda r, now: fraction_done(r),
    "test 1-shot": lambda r, now: _accuracy(r.test.get("1-shot")),
    "test 5-shot": lambda r, now: _accuracy(r.test.get("5-shot")),
    "loss": lambda r, now: r.loss,
    "progress": lambda r, now: fraction_done(r),
    "ETA": lambda r, now: eta(r, now),
    "elapsed": lambda r, now: elapsed(r, now),
    "cpu": lambda r, now: live_usage(r).get("cpu_percent"),
    "mem": lambda r, now: live_usage(r).get("rss_bytes"),
    "gpu mem": lambda r, now: live_usage(r).get("gpu_allocated_bytes"),
    "gpu": lambda r, now: live_usage(r).get("gpu_utilization_percent"),
    "best val": lambda r, now: _accuracy(r.best_val),
    "loss fn": lambda r, now: r.loss_fn,
    "backbone": lambda r, now: r.backbone,
    "dataset": lambda r, now: r.dataset,
    "seed": lambda r, now: r.seed,
    "pairs +/-": lambda r, now: r.positives,
}


def sort_rows(rows: list[RunSummary], by: str, reverse: bool, now: float) -> list[RunSummary]:
    """Sorted by the column ``by`` (ties newest first, as fslab runs lists them), runs without a value last."""
    key = SORTS[by]
    rows = sorted(rows, key=lambda r: creation_key(r.id, r.created), reverse=True)
    return sorted(rows, key=lambda r: _missing_last(key(r, now), reverse), reverse=reverse)
