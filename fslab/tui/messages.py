"""Messages the dashboard's worker threads post to the UI thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from fslab.tui.tailing import RunDelta, StoreChanges


@dataclass
class StoreUpdated(Message):
    """A tick of the run-store watcher: new, changed and removed runs."""

    changes: StoreChanges


@dataclass
class RunsFollowed(Message):
    """One read of the runs the compare screen follows: copies of their loss series
    that changed (folded in its follow thread) and ``fslab compare``'s report of them."""

    report: dict | None = None
    series: dict[str, Any] = field(default_factory=dict)  # copies of the series that changed, by run
    gone: list[str] = field(default_factory=list)  # the runs whose folders are gone (deleted while open)


@dataclass
class RunRead(Message):
    """One read of the run screen's run, folded in its follow thread: what was appended, copies of
    the charts' series (None when unchanged), a row per new evaluation, where the time went and the
    sinks that failed as it trained (fslab.core.sinks.failures: {name: record}) and what its validations
    scored (``accuracy``, ``map``: the val chart's title), and why a queued run will not start unless a person
    acts (its claim: fslab.core.runstore.Run.claim_problem, the line fslab queue says), and, with a configuration
    read, its data root where that is no folder on this machine (fslab.core.config.root_not_here)."""

    delta: RunDelta
    series: dict[str, Any] | None
    rows: list[list[Any]]
    time_line: str
    sink_failures: dict[str, dict] = field(default_factory=dict)
    val_metrics: tuple[str, ...] = ()
    claim_problem: str | None = None
    root_not_here: str | None = None


@dataclass
class RunStopped(Message):
    """The executor's ``stop`` returned (or failed) for a run."""

    run_id: str
    state: str | None
    error: str | None = None


@dataclass
class RunDeleted(Message):
    """fslab delete's deletion returned (or failed) for a run."""

    run_id: str
    error: str | None = None


@dataclass
class RunLaunched(Message):
    """The launch form started a run (or could not)."""

    run_id: str | None
    error: str | None = None
    process: Any = None  # the worker's Popen, reaped by the app when it ends


@dataclass
class ResumeChecked(Message):
    """fslab resume's checks of a run returned, in a worker thread: why it cannot resume (a line), else
    whether it is a queued run nobody holds (started, not resumed)."""

    run_id: str
    refusal: str | None = None
    waiting: bool = False


@dataclass
class RunResumed(Message):
    """A stopped run's worker was started again from its checkpoint, or a queued run nobody
    held was started (or not)."""

    run_id: str
    error: str | None = None
    process: Any = None
    held_by: str | None = None  # the gone holder of a stale claim on the queued run started
    queued: str | None = None  # a sweep's run queued again for the scheduler running: the line that says so
