"""Deleting runs: their folders, and their ids in the sweep records that list them.

A run is deleted only once it has ended (or its worker is gone): a queued or
running one is refused, so a scheduler or a worker never finds its folder
vanishing under it, and each is deleted holding its worker lock, as a launch
holds it, so no resume starts a worker in it meanwhile. Each folder is first
renamed to a hidden name in the same store (one atomic step: listings stop
showing the run at once, and no listing ever sees half of it) and then
removed; a hidden folder an interruption left
behind is removed by the next deletion, once the deleter it names (``.deleting-ID-PID@HOST``) is
gone: a runs folder may be shared between a cluster's nodes, and another node's ``fslab delete``
may be removing it still (:func:`fslab.core.files.process_gone` judges, as it judges temporary files).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from fslab.core import worklock
from fslab.core.errors import FslabError, UsageError
from fslab.core.files import atomic_write_json, parse_writer_tag, process_gone, read_json, writer_tag
from fslab.core.runstore import SWEEPS, Run
from fslab.core.states import LIVE
from fslab.core.sweeps import readable

TRASH = ".deleting-"  # the hidden name of a folder on its way out: .deleting-ID-PID@HOST, its deleter
LOCK_WAIT_S = 0.5  # what a reader's probe of the lock (microseconds) never outlasts


def check_deletable(runs: list[Run]) -> None:
    """A UsageError naming the runs that are queued or running (each must be stopped first); a FslabError
    naming the first run whose folder, or the runs folder it leaves, this user cannot write (:func:`unwritable`)."""
    for run in runs:
        if (line := unwritable(run)) is not None:
            raise FslabError(line)
    live = [(run, state) for run in runs if (state := run.state()) in LIVE]
    if len(live) == 1:
        run, state = live[0]
        raise UsageError(f"cannot delete run {run.id}: it is {state}; stop it first (fslab stop {run.id}), "
                         "then delete it; nothing was deleted")
    if live:
        named = ", ".join(f"{run.id} ({state})" for run, state in live[:3]) + (", ..." if len(live) > 3 else "")
        ids = " ".join(run.id for run, _ in live)  # every one, so that the line runs as printed
        raise UsageError(f"cannot delete {len(live)} queued or running runs ({named}); stop them first (fslab stop "
                         f"{ids}), then delete them; nothing was deleted")


def unwritable(run: Run) -> str | None:
    """Why this user cannot delete ``run`` (a read-only copy of a store, another user's): its folder leaves the
    runs folder by a rename, then its files are removed, and either folder refuses; None where both can be
    written (or the run is gone already). Said before anything is asked or deleted, where the system's
    ``Permission denied`` came once asked, naming the run's folder whichever refused."""
    if not run.path.is_dir():
        return None
    folder = next((f for f in (run.path.parent, run.path) if not os.access(f, os.W_OK)), None)
    if folder is None:
        return None
    return (f"cannot delete run {run.id}: this user cannot write {folder} (a read-only copy of a store, or another "
            f"user's); nothing was deleted")


def delete_runs(runs_dir: Path, runs: list[Run], said=None) -> dict[str, str]:
    """Delete ``runs`` (checked with :func:`check_deletable` first) and drop their
    ids from every sweep record; a record left with no runs is deleted too.
    Returns each id with ``deleted``, or ``gone`` for a run whose folder was
    gone already (deleted by hand, or by someone else meanwhile: dropped from
    the records all the same). An OSError (a folder this user may not move) is
    a FslabError naming the run, after the records have dropped those deleted. ``said(id, outcome)``, where
    given, is called as each run is done, so the runs deleted before a failure or a Ctrl-C can be told."""
    check_deletable(runs)
    runs_dir = Path(runs_dir)
    clear_trash(runs_dir)
    outcome: dict[str, str] = {}
    try:
        for run in runs:
            _delete(run, runs_dir, outcome)
            if said is not None:
                said(run.id, outcome[run.id])
            shutil.rmtree(_trash(run, runs_dir), ignore_errors=True)  # cut short (Ctrl-C): clear_trash's, later
    finally:
        forget(runs_dir, set(outcome))
    return outcome


def _trash(run: Run, runs_dir: Path) -> Path:
    """The hidden name this process moves ``run``'s folder to, before it removes it, naming this
    process and its host, which :func:`clear_trash` reads."""
    return runs_dir / f"{TRASH}{run.id}-{writer_tag()}"


def _delete(run: Run, runs_dir: Path, outcome: dict[str, str]) -> None:
    """Delete one run, holding its worker lock (so no resume starts a worker in it meanwhile): move its folder
    out of the store, and note it in ``outcome`` at once, as ``deleted`` (``gone`` where it was gone already).
    The folder's files are removed after, by the caller: a Ctrl-C while they were (the longest part) left a
    run gone from the store yet unsaid and still named by its sweep's record."""
    try:
        fd = worklock.take(run.path, wait=LOCK_WAIT_S)
    except FileNotFoundError:  # deleted by hand, or by someone else meanwhile
        outcome[run.id] = "gone"
        return
    except OSError as exc:
        raise FslabError(f"could not delete run {run.id}: its lock file: {exc.strerror or exc}") from None
    if fd is None:
        raise UsageError(f"cannot delete run {run.id}: {worklock.describe_holder(run.path)} holds its lock (a worker, "
                         "or a launch starting one: resumed meanwhile?); stop it first")
    try:
        if (state := run.state(locked=False)) in LIVE:  # queued again meanwhile
            raise UsageError(f"cannot delete run {run.id}: it is {state} now; stop it first (fslab stop {run.id})")
        try:
            os.rename(run.path, _trash(run, runs_dir))
            outcome[run.id] = "deleted"
            with contextlib.suppress(OSError):  # the deletion's start, which another host's clear_trash times
                os.utime(_trash(run, runs_dir))
        except OSError as exc:
            raise FslabError(f"could not delete run {run.id}: {exc.strerror or exc} ({run.path})") from None
    finally:
        os.close(fd)


def forget(runs_dir: Path, ids: set[str]) -> None:
    """Drop ``ids`` from the sweep records; delete a record that lists no run then."""
    folder = runs_dir / SWEEPS
    for path in sorted(folder.glob("sweep-*.json")) if ids and folder.is_dir() else []:
        record = read_json(path)
        if not readable(record) or not ids.intersection(record["runs"]):
            continue
        kept = [run_id for run_id in record["runs"] if run_id not in ids]
        try:
            if kept:
                atomic_write_json(path, {**record, "runs": kept})
            else:
                path.unlink()
        except OSError as exc:
            raise FslabError(f"the runs were deleted, but sweep record {path} could not be rewritten: "
                             f"{exc.strerror or exc}") from None


def delete_records(paths: list[Path]) -> None:
    """Remove the sweep records at ``paths``, records that cannot be read (fslab delete SWEEP, once the runs
    found for it are deleted); one already gone is left so; one the system keeps is a FslabError naming it."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise FslabError(f"could not delete sweep record {path}: {exc.strerror or exc}") from None


def clear_trash(runs_dir: Path) -> None:
    """Remove the hidden folders an interrupted deletion left in the store: those whose deleter is
    gone (:func:`deleter_gone`), and this process's own (a deletion of it cut short, in the dashboard);
    one another live ``fslab delete`` is removing, on this node or another sharing the store, is left to it."""
    try:
        entries = [e for e in os.scandir(runs_dir) if e.name.startswith(TRASH)]
    except OSError:
        return
    mine = f"-{writer_tag()}"
    for entry in entries:
        if entry.name.endswith(mine) or deleter_gone(Path(entry.path)):
            shutil.rmtree(entry.path, ignore_errors=True)


def deleter_gone(trash: Path) -> bool:
    """Whether the ``fslab delete`` that moved a run's folder to ``trash`` is gone, judged as the writer of
    a temporary file is (:func:`fslab.core.files.process_gone`: on this host by its pid, another host's
    once the folder is untouched for a day). A name of earlier versions, ``.deleting-ID-PID``, names no
    host and is taken for gone, as it was then."""
    found = parse_writer_tag(trash.name[len(TRASH):], "-") if trash.name.startswith(TRASH) else None
    if found is None:
        return True
    _, pid, host = found
    return process_gone(pid, host, trash)
