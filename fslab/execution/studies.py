"""Queueing a study: its runs through the sweep machinery, reusing what is done.

``fslab study run NAME`` plans every run of the study (:func:`fslab.core.study_plan.plan_runs`),
resolves each configuration as ``fslab run`` would (a bad one anywhere queues
nothing), then looks for each in the run store by its resolved configuration
(:func:`fslab.core.study_plan.settings_key`: everything but the device, the data
root and logging intervals). A run found completed is reused; one queued or
running is left to finish; one that failed, was killed or was lost is queued
again (it resumes from its checkpoint); only the rest are created. All of them
are recorded as one sweep (``runs/sweeps/<id>.json``) that also names the study,
the scale, the settings changed on the command line and each run's place in the
study, which is what the report reads;
so running the same command again after an interruption picks up where it was.

Two ``fslab study run`` at once in one project (two terminals) would each find
the other's runs missing and create them twice, so the looking up and creating
happens holding ``runs/.study-queue.lock`` (:func:`queueing`): the second waits
for the first to finish queueing, then reuses its runs as queued or running.
The lock is an ``flock``, which the kernel releases however its holder ends, so
a killed ``fslab study run`` never leaves it held (only its file, which the next
one takes and removes).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fslab.core.config import naming_the_file
from fslab.core.errors import ConfigError, FslabError, UsageError
from fslab.core.files import REFUSED
from fslab.core.flocks import holder_line, not_recorded, open_lock_or_read, read_holder, take_lock, unrecorded
from fslab.core.runstore import Run, create_run, list_runs
from fslab.core.states import LIVE, RESUMABLE, process_named
from fslab.core.studies import Study
from fslab.core.study_plan import (
    PlannedRun,
    command_line_changes,
    distinct_runs,
    placed,
    project_changes,
    resolve_study,
    run_dataset,
    settings_key,
    with_roots_hint,
)
from fslab.core.sweeps import new_sweep_id, release_sweep_id, save_sweep
from fslab.execution.checks import check_run
from fslab.execution.slots import check_local_queue
from fslab.execution.sweep import let_go, requeue, withdraw


@dataclass
class StudyRuns:
    """What ``fslab study run`` did with each of the study's runs (by run id)."""

    sweep_id: str
    reused: list[str] = field(default_factory=list)  # completed with the same settings
    in_progress: list[str] = field(default_factory=list)  # queued or running already
    requeued: list[str] = field(default_factory=list)  # failed, killed or lost: queued again
    created: list[str] = field(default_factory=list)  # new
    to_start: list[Run] = field(default_factory=list)  # requeued and created, for the scheduler
    project: dict = field(default_factory=dict)  # what [run] of fslab.toml changed (core.study_plan.project_changes)


def existing_runs(runs_dir, key=settings_key) -> dict[str, list[Run]]:
    """The store's runs by ``key`` of their configuration (:func:`settings_key`)."""
    found: dict[str, list[Run]] = {}
    for run in list_runs(runs_dir):
        try:
            config = run.config()
        except ConfigError:
            continue  # from a newer fslab, or damaged: never reused
        if config:
            found.setdefault(key(config), []).append(run)
    return found


def _best(runs: list[Run]) -> tuple[Run, str] | None:
    """The run to use among equal ones: a completed one, else a live one, else the
    newest that can be resumed (runs in any other state are not used)."""
    states = [(run, run.state()) for run in runs]
    for wanted in (("completed",), LIVE, RESUMABLE):
        for run, state in reversed(states):
            if state in wanted:
                return run, state
    return None


QUEUE_LOCK = ".study-queue.lock"
QUEUE_WAIT_S = 300.0  # the longest a study waits for another's queueing (seconds: resolving, never training)


@contextmanager
def queueing(runs_dir: Path, study: str, wait: float | None = None) -> Iterator[None]:
    """Hold ``runs/.study-queue.lock`` (its line names this process and ``study``),
    waiting up to ``wait`` seconds (:data:`QUEUE_WAIT_S`) while another study is
    being queued; past that, a UsageError naming that study and its process. The
    file is removed when queueing ends, and the runs folder too where it was made
    for the lock and nothing was queued, so a refused study leaves nothing."""
    runs_dir = Path(runs_dir)
    made = not runs_dir.exists()
    fd = _take_queue_lock(runs_dir / QUEUE_LOCK, study, QUEUE_WAIT_S if wait is None else wait)
    try:
        yield
    finally:
        try:  # under the lock: a process waiting on this file finds it gone and opens the next one
            os.unlink(runs_dir / QUEUE_LOCK)
        except OSError:
            pass
        os.close(fd)  # releases the lock
        if made:
            try:
                runs_dir.rmdir()  # only if empty
            except OSError:
                pass


def _take_queue_lock(path: Path, study: str, limit: float) -> int:
    """A descriptor holding ``path`` locked, the file still the one at ``path``."""
    fd = take_lock(path, limit, 0.05, holder=holder_line(None, study), reopen=True,
                   opener=lambda: _open_queue_lock(path))
    if fd is None:
        raise UsageError(f"{_queueing_holder(path)} for over {limit:g} s; run this study "
                         f"again once it is queued (its runs are then reused, not created twice)")
    return fd


def _open_queue_lock(path: Path) -> int | None:
    """A descriptor of the lock file, made with its folder if missing, read-only where this user cannot
    write it (another user's, in a store a group shares: :func:`open_lock_or_read`, which ``flock`` locks
    the same); None where the folder or the file vanished meanwhile (try again); one line if it cannot be
    opened: an FslabError (exit 1) where the system refuses it (a read-only store), a UsageError where
    something else is there."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open_lock_or_read(path)
    except FileNotFoundError:
        return None  # the folder removed by the holder that made it, just now: make it again
    except OSError as exc:  # the system refused (a read-only store: exit 1, as fslab run's slot lock), or a mistake
        refused = FslabError if exc.errno in REFUSED else UsageError
        raise refused(f"cannot open {path}, the lock that keeps two studies from queueing the same runs "
                      f"({exc.strerror or exc})") from None


def _queueing_holder(path: Path) -> str:
    """``study NAME is being queued by pid P on host H``, from the lock file's line (where it may not name
    its holder, :func:`unrecorded`, that it is not recorded)."""
    words = read_holder(path, maxsplit=2)
    if unrecorded(path, words):
        return f"another study is being queued in this project ({not_recorded(path, words)})"
    if len(words) < 3:
        return "another study is being queued in this project"
    return f"study {words[2].strip()} is being queued by {process_named(words[0], words[1])}"


def queue_study(study: Study, scale: str, *, settings, registry, dataset: str | None = None,
                data_root: str | None = None, extra: tuple[dict, ...] = (), slurm=None,
                again: str | None = None) -> StudyRuns:
    """Resolve the study's runs, reuse what the store has, create the rest
    ``queued`` and record them all as one sweep naming the study (not started here:
    :func:`fslab.execution.executor.start_study` starts them). ``again``: the command
    that runs the study this way again (what ``fslab stop SWEEP`` says to go on with).
    Done holding :func:`queueing`'s lock, so a study queued at the same time waits and
    then reuses these runs."""
    with queueing(settings.runs_dir, study.name):
        return _queue_study(study, scale, settings=settings, registry=registry, dataset=dataset,
                            data_root=data_root, extra=extra, slurm=slurm, again=again)


def _queue_study(study: Study, scale: str, *, settings, registry, dataset: str | None,
                 data_root: str | None, extra: tuple[dict, ...], slurm, again: str | None) -> StudyRuns:
    resolved = resolve_study(study, scale, settings=settings, registry=registry, dataset=dataset,
                             data_root=data_root, extra=extra)
    store = existing_runs(settings.runs_dir)
    done: dict[str, tuple[Run, str]] = {}  # settings key -> the run used, within this study too
    new = []
    for key, places in distinct_runs(resolved).items():  # places alike in every setting share one run
        if (best := _best(store.get(key, []))) is not None:
            done[key] = best
        else:
            new.append((*places[0], key))
            done[key] = (None, "new")
    sizes_seen: dict = {}
    for planned, config, _ in new:  # as fslab run checks one: any bad run queues nothing
        try:
            with naming_the_file(settings, planned.layers):
                check_run(config, registry, slurm, sizes_seen=sizes_seen)
        except UsageError as exc:
            exc.args = (with_roots_hint(placed(study, scale, planned, exc, extra), study, scale, dataset),)
            raise
    # the runs this command queues: the new ones, and reused ones queued again to resume, which keep
    # their own number of processes (a run trained on N GPUs is reused as it is: train.processes is IGNORED)
    queued = [config for _, config, _ in new] + [
        run.config() for run, state in done.values() if run is not None and state in RESUMABLE]
    if queued and slurm is None:
        check_local_queue(settings, max(config.get("train", {}).get("processes", 1) for config in queued))
    sweep_id = new_sweep_id(settings.runs_dir, study.name)
    created: list[Run] = []
    try:  # an interruption (Ctrl-C) before the record is saved withdraws the runs created so far
        for planned, config, key in new:
            # held (claimed) until the record names it: no scheduler starts a run of no sweep
            run = create_run(settings.runs_dir, planned.method, config, claimed=True, sweep=sweep_id)
            created.append(run)
            done[key] = (run, "new")
        changed = command_line_changes(study, scale, resolved, settings=settings, registry=registry,
                                       dataset=dataset, data_root=data_root, extra=extra)
        project = project_changes(study, scale, resolved, settings=settings, registry=registry, dataset=dataset,
                                  data_root=data_root, extra=extra)
        outcome = _record(study, scale, dataset, changed, project, sweep_id, settings.runs_dir, resolved, done, again)
    except BaseException:
        withdraw(created, held=True)
        release_sweep_id(settings.runs_dir, sweep_id)
        raise
    let_go(created, sweep_id)
    return outcome


def _record(study: Study, scale: str, dataset: str | None, changed: dict, project: dict, sweep_id: str, runs_dir,
            resolved, done, again: str | None) -> StudyRuns:
    outcome = StudyRuns(sweep_id, project=project)
    places, seen = {}, set()
    for planned, config in resolved:
        run, state = done[settings_key(config)]
        places.setdefault(run.id, []).append(planned.place())
        if run.id in seen:
            continue  # two places of the study with one configuration share a run
        seen.add(run.id)
        bucket = {"new": outcome.created, "completed": outcome.reused}.get(state)
        if bucket is None:
            bucket = outcome.in_progress if state in LIVE else outcome.requeued
        bucket.append(run.id)
    if outcome.requeued:
        outcome.to_start += requeue(runs_dir, {"runs": outcome.requeued})
    outcome.to_start += [Run(runs_dir / run_id) for run_id in outcome.created]
    datasets = {name: run_dataset(study, scale, name, dataset) for s in study.sweeps for name in s.datasets}
    save_sweep(runs_dir, sweep_id, method=f"study {study.name}", grid={}, seeds=max(study.seeds(scale).values()),
               fail_fast=False, runs=list(places), study=study.name, scale=scale, datasets=datasets,
               changed=changed, project=project, places=places, settings=study.settings_digest(),
               **({"again": again} if again else {}),
               **({"file": study.file_key()} if study.from_file else {}),
               **({"project_file": inside} if (inside := study.project_file(runs_dir)) else {}))
    return outcome


def gpu_hours(resolved: list[tuple[PlannedRun, dict]], runs_dir) -> dict:
    """An estimate of the GPU-hours of the study's runs, only from what was
    measured here: completed runs in the store that trained on a GPU with the
    same settings but for the seed and the number of epochs, never resumed. Each run the
    study trains (:func:`distinct_runs`: places alike in every setting are one run, trained once, as
    ``fslab study show`` counts them; each place was priced, at quick scale twice the runs of a study
    on two datasets) with such a match costs the matches' mean wall time per epoch × its epochs
    × its GPUs; runs without one are counted, not guessed, as are runs that ended before they
    started by their host's clock (set back as they trained): no measure either."""
    per_epoch: dict[str, list[float]] = {}
    sources = set()
    for key, runs in existing_runs(runs_dir, timing_key).items():
        for run in runs:
            if (seconds := _gpu_seconds_per_epoch(run)) is not None:
                per_epoch.setdefault(key, []).append(seconds)
                sources.add(run.id)
    hours, estimated = 0.0, 0
    runs = [places[0][1] for places in distinct_runs(resolved).values()]
    for config in runs:
        measured = per_epoch.get(timing_key(config))
        if measured:
            estimated += 1
            hours += sum(measured) / len(measured) * config["train"]["epochs"] * config["train"]["processes"] / 3600
    return {"hours": hours if estimated else None, "estimated_runs": estimated, "runs": len(runs),
            "measured_runs": sorted(sources)}


def timing_key(config: dict) -> str:
    """The settings that fix how long an epoch takes: all but the seed and the number of epochs."""
    return settings_key({**config, "seed": None, "train": {**config["train"], "epochs": None}})


def _gpu_seconds_per_epoch(run: Run) -> float | None:
    status = run.status()
    if status.get("state") != "completed" or not status.get("started") or not status.get("ended") \
            or status.get("resumed"):  # a resumed run's span includes the time it lay stopped
        return None
    starts = run.events_of("start")
    if not starts or not str(starts[-1].get("device", "")).startswith("cuda"):
        return None
    span = status["ended"] - status["started"]  # each on the clock of the run's host, which may have been set back
    return span / run.config()["train"]["epochs"] if span > 0 else None
