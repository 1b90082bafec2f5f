"""Queueing a study: its runs through the sweep machinery, reusing what is done.

``fslab study run NAME`` plans every run of the study (:func:`fslab.core.studies.plan_runs`),
resolves each configuration as ``fslab run`` would (a bad one anywhere queues
nothing), then looks for each in the run store by its resolved configuration
(:func:`fslab.core.studies.settings_key`: everything but the device, the data
root and logging intervals). A run found completed is reused; one queued or
running is left to finish; one that failed, was killed or was lost is queued
again (it resumes from its checkpoint); only the rest are created. All of them
are recorded as one sweep (``runs/sweeps/<id>.json``) that also names the study,
the scale, the settings changed on the command line and each run's place in the
study, which is what the report reads;
so running the same command again after an interruption picks up where it was.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from fslab.core.config import naming_the_file
from fslab.core.errors import ConfigError, UsageError
from fslab.core.runstore import Run, create_run, list_runs
from fslab.core.states import LIVE
from fslab.core.studies import (
    PlannedRun,
    Study,
    command_line_changes,
    project_changes,
    resolve_study,
    run_dataset,
    settings_key,
)
from fslab.core.sweeps import save_sweep
from fslab.execution.checks import RESUMABLE, check_run
from fslab.execution.slots import check_local_queue
from fslab.execution.sweep import requeue


@dataclass
class StudyRuns:
    """What ``fslab study run`` did with each of the study's runs (by run id)."""

    sweep_id: str
    reused: list[str] = field(default_factory=list)  # completed with the same settings
    in_progress: list[str] = field(default_factory=list)  # queued or running already
    requeued: list[str] = field(default_factory=list)  # failed, killed or lost: queued again
    created: list[str] = field(default_factory=list)  # new
    to_start: list[Run] = field(default_factory=list)  # requeued and created, for the scheduler
    project: dict = field(default_factory=dict)  # what [run] of fslab.toml changed (core.studies.project_changes)


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


def queue_study(study: Study, scale: str, *, settings, registry, dataset: str | None = None,
                data_root: str | None = None, extra: tuple[dict, ...] = (), slurm=None,
                again: str | None = None) -> StudyRuns:
    """Resolve the study's runs, reuse what the store has, create the rest
    ``queued`` and record them all as one sweep naming the study (not started here:
    :func:`fslab.execution.executor.start_study` starts them). ``again``: the command
    that runs the study this way again (what ``fslab stop SWEEP`` says to go on with)."""
    resolved = resolve_study(study, scale, settings=settings, registry=registry, dataset=dataset,
                             data_root=data_root, extra=extra)
    store = existing_runs(settings.runs_dir)
    done: dict[str, tuple[Run, str]] = {}  # settings key -> the run used, within this study too
    new = []
    for planned, config in resolved:
        key = settings_key(config)
        if key not in done and (best := _best(store.get(key, []))) is not None:
            done[key] = best
        if key not in done:
            new.append((planned, config, key))
            done[key] = (None, "new")
    sizes_seen: dict = {}
    for planned, config, _ in new:  # as fslab run checks one: any bad run queues nothing
        try:
            with naming_the_file(settings, planned.layers):
                check_run(config, registry, slurm, sizes_seen=sizes_seen)
        except UsageError as exc:
            exc.args = (f"study {study.name}, sweep '{planned.sweep}' on {planned.dataset}: {exc}",)
            raise
    # the runs this command queues: the new ones, and reused ones queued again to resume, which keep
    # their own number of processes (a run trained on N GPUs is reused as it is: train.processes is IGNORED)
    queued = [config for _, config, _ in new] + [
        run.config() for run, state in done.values() if run is not None and state in RESUMABLE]
    if queued and slurm is None:
        check_local_queue(settings, max(config.get("train", {}).get("processes", 1) for config in queued))
    sweep_id = f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}-{study.name}"
    for planned, config, key in new:
        run = create_run(settings.runs_dir, planned.method, config)
        run.write_status(sweep=sweep_id)
        done[key] = (run, "new")
    changed = command_line_changes(study, scale, resolved, settings=settings, registry=registry, dataset=dataset,
                                   data_root=data_root, extra=extra)
    project = project_changes(study, scale, resolved, settings=settings, registry=registry, dataset=dataset,
                              data_root=data_root, extra=extra)
    return _record(study, scale, dataset, changed, project, sweep_id, settings.runs_dir, resolved, done, again)


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
               changed=changed, project=project, places=places, **({"again": again} if again else {}),
               **({"file": study.file_key()} if study.from_file else {}))
    return outcome


def gpu_hours(resolved: list[tuple[PlannedRun, dict]], runs_dir) -> dict:
    """An estimate of the GPU-hours of the study's runs, only from what was
    measured here: completed runs in the store that trained on a GPU with the
    same settings but for the seed and the number of epochs, never resumed. Each planned run
    with such a match costs the matches' mean wall time per epoch × its epochs
    × its GPUs; runs without one are counted, not guessed."""
    per_epoch: dict[str, list[float]] = {}
    sources = set()
    for key, runs in existing_runs(runs_dir, timing_key).items():
        for run in runs:
            if (seconds := _gpu_seconds_per_epoch(run)) is not None:
                per_epoch.setdefault(key, []).append(seconds)
                sources.add(run.id)
    hours, estimated = 0.0, 0
    for _, config in resolved:
        measured = per_epoch.get(timing_key(config))
        if measured:
            estimated += 1
            hours += sum(measured) / len(measured) * config["train"]["epochs"] * config["train"]["processes"] / 3600
    return {"hours": hours if estimated else None, "estimated_runs": estimated, "runs": len(resolved),
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
    epochs = run.config()["train"]["epochs"]
    return (status["ended"] - status["started"]) / epochs
