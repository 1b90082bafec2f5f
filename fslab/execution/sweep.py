"""Sweeps: one queued run per combination of a grid and a number of seeds.

``fslab sweep nca --seeds 5 --grid train.batch_size=128,256,512`` resolves every
combination first (a bad value anywhere writes nothing), then creates the runs
``queued`` and tagged with the sweep id; a scheduler starts them as slots free
up. The sweep itself is recorded in ``runs/sweeps/<id>.json``.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fslab.core.assignments import assignment, parse_assignment, shown
from fslab.core.config import RunConfig, naming_the_file, point_layer, resolve, type_error
from fslab.core.errors import ConfigError, UsageError, did_you_mean, interrupted_code
from fslab.core.keys import TWICE, dated, dotted, grid_leaves, names_key, repeated_key, repeated_value
from fslab.core.limits import check_fields
from fslab.core.runstore import Run, create_run
from fslab.core.settings import SlurmSettings, read_toml
from fslab.core.states import RESUMABLE
from fslab.core.sweeps import load_sweep, new_sweep_id, release_sweep_id, save_sweep, sweep_records, sweep_runs
from fslab.core.text import split_outside
from fslab.core.values import check_value
from fslab.execution.checks import check_run
from fslab.execution.handover import LiveWorker, launch_lock
from fslab.execution.slots import check_local_queue
from fslab.execution.slurm import cancel_job

# A sweep bigger than this is refused before anything is resolved (a typo in --seeds
# should not fill the memory); split a larger one.
MAX_RUNS = 10_000
# The `fslab run` options, usable as grid keys by their short names.
ALIASES = {"backbone": "backbone.name", "dataset": "dataset.name", "epochs": "train.epochs",
           "batch_size": "train.batch_size", "lr": "train.lr"}


def parse_grid(texts: list[str]) -> dict[str, list]:
    """``["train.lr=0.1,0.05", "backbone=conv4,resnet12"]`` -> {key: [values]}."""
    grid: dict[str, list] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        key = ALIASES.get(key.strip(), key.strip())
        if not sep or not key or not raw.strip():
            raise ConfigError(f"--grid expects key=v1,v2,... (e.g. train.lr=0.1,0.05), got '{text}'")
        check_grid_key(f"--grid {key}", key)
        if key in grid:
            raise ConfigError(f"--grid names '{key}' twice; give all its values in one: --grid {key}=v1,v2,...")
        values = split_values(raw)
        if any(not value.strip() for value in values):  # 0.1,,0.2 or a trailing comma: a typo, not a value
            raise ConfigError(f"--grid {key} has an empty value in '{raw.strip()}' (a comma with no value on one "
                              f"side); remove the stray comma, or write an empty string as \"\"")
        grid[key] = [parse_assignment(f"{key}={value}", "--grid")[1] for value in values]
        check_distinct(f"--grid {key}", grid[key])
    return grid


def split_values(raw: str) -> list[str]:
    """A grid's values at its commas, but not at those inside brackets, braces or
    quotes: ``[0.5,0.7],[0.3]`` is two lists."""
    return split_outside(raw, lambda char: char == ",")


def check_grid_key(where: str, key: str) -> None:
    """A ConfigError for a grid over what a sweep sets itself: its seeds and its method."""
    if key == "seed":
        raise ConfigError(f"{where}: a sweep's seeds come from --seeds N (seeds = N in a sweep file), "
                          f"the first from --seed; leave seed out of the grid")
    if key == "method":
        raise ConfigError(f"{where}: a sweep runs one method; start one sweep per method")


def check_distinct(where: str, values: list) -> None:
    """A ConfigError for a grid that lists a value twice (it would train the same runs twice)."""
    if (twice := repeated_value(values)) is not None:
        raise ConfigError(f"{where} lists {json.dumps(twice[0], default=str)} twice; "
                          f"each value makes its own runs: list it once")


def read_sweep_file(path: Path) -> dict:
    """A sweep file: ``method``, ``seeds``, ``fail_fast``, ``[grid]`` of lists, ``[set]`` of fixed keys.
    Keys of the two tables are dotted (``"train.lr"``) or nested (``[grid.train]``)."""
    data = read_toml(path)
    allowed = {"method", "seeds", "fail_fast", "grid", "set"}
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{path}: unknown key '{key}'.{did_you_mean(key, allowed)} "
                              f"Allowed: {', '.join(sorted(allowed))}.")
    if not isinstance(data.get("method"), str):
        raise ConfigError(f"{path}: 'method' must name a method recipe, e.g. method = \"nca\"")
    seeds = data.get("seeds", 1)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"{path}: 'seeds' must be a whole number of at least 1 (seeds per combination), "
                          f"got {shown(seeds)}")
    if not isinstance(data.get("fail_fast", False), bool):
        raise ConfigError(f"{path}: 'fail_fast' must be true or false, got {shown(data['fail_fast'])}")
    for table in ("grid", "set"):
        if not isinstance(data.get(table, {}), dict):
            raise ConfigError(f"{path}: '{table}' must be a table ([{table}] followed by key = value lines), "
                              f"got {shown(data[table])}")
        if (twice := repeated_key(data.get(table, {}))) is not None:
            raise ConfigError(f"{path}: {table}.{twice} {TWICE}")
        data[table] = dotted(data.get(table, {}))
        if (why := dated(data[table])) is not None:
            raise ConfigError(f"{path}: {table}.{why}")
    for key, values in data["grid"].items():
        check_grid_key(f"{path}: grid.{key}", key)
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key} must be a non-empty list of values")
        check_distinct(f"{path}: grid.{key}", values)
    _check_types(path, data)
    return data


def _check_types(path: Path, data: dict) -> None:
    """The values the file gives fslab's own keys, each against its type, naming the file (the
    resolved configurations are checked later, where a key's origin is no longer known)."""
    for table in ("set", "grid"):
        if (wrong := type_error(data[table], grid=table == "grid")) is not None:
            raise ConfigError(f"{path}: {table}.{wrong[0]}{wrong[1]}")  # s.toml: set.train.lr must be a number, ...


def expand(grid: dict[str, list], seeds: int, first_seed: int = 0, below: list[dict] = ()) -> list[list[dict]]:
    """Every combination × seed (grid order, seeds innermost), as config layers over ``below`` (the
    sweep's options and settings): the combination's values as one layer (:func:`point_layer`), the seed."""
    if seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {seeds}")
    count = seeds * math.prod(len(values) for values in grid.values())
    if count > MAX_RUNS:
        raise UsageError(f"this sweep makes {count:,} runs, more than one sweep may queue ({MAX_RUNS:,}); "
                         f"split it into smaller sweeps")
    keys = list(grid)
    combos = []
    for values in itertools.product(*(grid[k] for k in keys)):
        point = point_layer(below, dict(zip(keys, values)))
        for seed in range(first_seed, first_seed + seeds):
            combos.append([copy.deepcopy(point), {"seed": seed}])
    return combos


def create_sweep(method: str, grid: dict, seeds: int, *, base: list[dict], settings, registry,
                 fail_fast: bool = False, slurm_options: SlurmSettings | None = None) -> tuple[str, list[Run]]:
    """Resolve all combinations, then create their queued runs and the sweep
    record. ``slurm_options``: the runs become SLURM jobs with these settings."""
    fixed = {key for layer in base for key in dotted(layer)}
    for key in grid_leaves(grid):
        if key in fixed:
            raise ConfigError(f"'{key}' is both a grid key and set by an option or the sweep file's [set]; "
                              f"the grid's values would replace it: leave out one of the two")
    layers = [[*base, *combo] for combo in expand(grid, seeds, first_seed=_first_seed(base), below=base)]
    configs = []
    for overrides in layers:
        with naming_the_grid_point(grid, overrides):
            configs.append(resolve(method, registry=registry, settings=settings, overrides=overrides))
    _check_no_twins(configs, layers)
    sizes_seen: dict = {}  # each dataset is looked at once
    for config, overrides in zip(configs, layers):  # as fslab run checks one: any bad combination queues nothing
        with naming_the_grid_point(grid, overrides), naming_the_file(settings, overrides):
            check_run(config, registry, slurm_options, sizes_seen=sizes_seen)
    if slurm_options is None:  # the slots must hold its largest run: a refusal names that run's grid point
        most = max(range(len(configs)), key=lambda i: configs[i]["train"]["processes"])
        with naming_the_grid_point(grid, layers[most]):
            check_local_queue(settings, configs[most]["train"]["processes"])
    sweep_id = new_sweep_id(settings.runs_dir)
    runs = []
    try:  # an interruption (Ctrl-C) before the record is saved withdraws the runs created so far
        for config in configs:  # held (claimed) until the record names them: no scheduler starts a run of no sweep
            runs.append(create_run(settings.runs_dir, method, config, claimed=True, sweep=sweep_id))
        save_sweep(settings.runs_dir, sweep_id, method=method, grid=grid, seeds=seeds, fail_fast=fail_fast,
                   runs=[r.id for r in runs])
    except BaseException:
        withdraw(runs, held=True)
        release_sweep_id(settings.runs_dir, sweep_id)
        raise
    let_go(runs, sweep_id)
    return sweep_id, runs


@contextlib.contextmanager
def naming_the_grid_point(grid: dict, overrides: list[dict]) -> Iterator[None]:
    """A UsageError about a key of the grid point of ``overrides`` (a run's layers, :func:`expand`) that
    resolving or checking the run raised begins with that key and its value, ``grid point
    train.processes=5: ...``, as a study file's grid key is named in its refusals (the checks see only the
    merged configuration: a grid's value read as if an option of the sweep had given it)."""
    try:
        yield
    except UsageError as exc:
        leaves = grid_leaves(grid)
        named = [assignment(key, value) for key, value in dotted(overrides[-2]).items()  # [-2]: the point
                 if key in leaves and names_key(str(exc), key)]
        if named:
            exc.args = (f"grid point {', '.join(named)}: {exc}",)
        raise


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (``terminated``: a SIGTERM) after the sweep ``sweep`` was recorded, while its runs were
    being let go or started (submitting SLURM jobs): ``fslab sweep resume`` starts those not yet started."""

    def __init__(self, sweep: str, terminated: bool = False):
        super().__init__(sweep)
        self.sweep = sweep
        self.terminated = terminated


def let_go(runs: list[Run], sweep_id: str) -> None:
    """Unclaim the runs a sweep or study held while it recorded them, so schedulers take them now. A Ctrl-C
    meanwhile still lets every one go, and is then raised as :class:`SweepInterrupted`: the record names
    them all, and ``fslab sweep resume`` starts the queued runs nobody claimed."""
    pending, codes = list(runs), set()
    while pending:
        try:
            while pending:
                pending[-1].unclaim()
                pending.pop()
        except KeyboardInterrupt as interrupt:
            codes.add(interrupted_code(interrupt))
    if codes:
        raise SweepInterrupted(sweep_id, terminated=143 in codes)


def withdraw(runs: list[Run], held: bool = False) -> None:
    """Remove runs a sweep or study created and did not record, which no scheduler has taken: left queued,
    they would wait unrecorded for the next scheduler of the project (another sweep's) to train them.
    One a scheduler took meanwhile is left to train; the same command again reuses it. ``held``: this
    process claimed them as it created them, so none was taken."""
    import shutil

    for run in runs:
        if held or run.claim():  # no scheduler can start it now
            shutil.rmtree(run.path, ignore_errors=True)


def _check_no_twins(configs: list[dict], layers: list[list[dict]]) -> None:
    """A ConfigError for two grid points that resolve to one configuration (``eval.shots=5,[5]``, two
    spellings of one folder): they would train the same runs twice, as a value listed twice would."""
    seen: dict[str, list[dict]] = {}
    for config, overrides in zip(configs, layers):
        text = json.dumps(config, sort_keys=True, default=str)
        if text in seen:  # overrides[-2]: the grid point (expand), under the seed
            first, again = (", ".join(assignment(k, v) for k, v in dotted(point[-2]).items())
                            for point in (seen[text], overrides))
            raise ConfigError(f"the grid points {first} and {again} are one configuration, so each would train "
                              f"the same runs: list one of them")
        seen[text] = overrides


def _first_seed(base: list[dict]) -> int:
    """The sweep's first seed (``--seed``, or ``seed`` in --set or [set]), checked as a run's seed is
    before the seeds are counted from it (``--set seed=abc`` was a traceback, ``seed=true`` seed 1)."""
    seed = 0
    for layer in base:
        seed = layer.get("seed", seed)
    seed = check_value("seed", seed, 0)
    check_fields(RunConfig, {"seed": seed})
    return seed


def requeue(runs_dir: Path, sweep: dict, before: Callable[[Run], None] = lambda run: None) -> list[Run]:
    """Queue again the runs of a sweep that failed, were killed or were lost;
    completed, queued and running runs are left alone, and so are those whose
    configuration cannot be read. A run with a
    checkpoint will resume from it. ``before`` is called with each run queued again, under its launch lock,
    its state checked (fslab sweep resume --data-root saves its new root there: none of a run started meanwhile)."""
    again = []
    for run in sweep_runs(runs_dir, sweep):
        if run.status().get("state") == "completed" or not run.config():
            continue  # most of a finished sweep: no lock to take; an unreadable run is never requeued
        try:
            with launch_lock(run):  # so a resume of the same run at the same moment cannot start it too
                if run.state(locked=False) not in RESUMABLE:
                    continue
                before(run)
                queue_again(run)
        except LiveWorker:
            continue  # its worker lives (paused, or its heartbeat is late): it is not lost
        again.append(run)
    return again


def queue_again(run: Run, **fields) -> None:
    """Queue a run that failed, was killed or was lost again, free for a scheduler to take (or a SLURM
    submission): its claim let go, its status ``queued`` with ``fields`` (``executor="local"``). Under its
    launch lock, its state checked by the caller (:func:`requeue`, :func:`fslab.execution.executor.resume`)."""
    (run.path / ".claimed").unlink(missing_ok=True)
    run.write_status(state="queued", pid=None, heartbeat=None, requeued=time.time(), ended=None,
                     exit_code=None, error=None, slot=None, gpus=None,  # no slot yet,
                     slurm_job_id=None, **fields)  # nor a job: the ended one must not make it look lost


SWEEP_STOPPED = "sweep stopped: run {run} failed (fail-fast)"


def stop_sweep(runs_dir: Path, sweep: dict, failed: str) -> list[Run]:
    """Fail-fast, for runs of either executor: the sweep's runs that have not
    started end ``killed``, naming the run that ``failed``; runs already
    running go on. A local queued run is claimed first, so no scheduler can
    start it afterwards; a SLURM run is marked first and its job cancelled
    after, so a job that starts in between finds its run ended and exits."""
    stopped = []
    for run in sweep_runs(runs_dir, sweep):
        status = run.status()
        if run.id == failed or status.get("state") != "queued":
            continue
        on_slurm = status.get("executor") == "slurm"
        if not on_slurm and not run.claim():
            continue  # a scheduler took it a moment ago
        run.write_status(state="killed", ended=time.time(), error=SWEEP_STOPPED.format(run=failed))
        if on_slurm:
            cancel_job(run, status)
        stopped.append(run)
    return stopped


def stop_failed_sweeps(runs_dir: Path) -> list[Run]:
    """Fail-fast as the local scheduler applies it before starting runs: every
    ``fail_fast`` sweep with a failed run is stopped."""
    stopped = []
    for sweep in sweep_records(runs_dir):
        if not sweep.get("fail_fast"):
            continue
        failed = next((r for r in sweep_runs(runs_dir, sweep) if r.status().get("state") == "failed"), None)
        if failed is not None:
            stopped += stop_sweep(runs_dir, sweep, failed.id)
    return stopped


def stop_sweep_of(run: Run) -> list[Run]:
    """Fail-fast as a SLURM job applies it when its own run failed."""
    sweep_id = run.status().get("sweep")
    if not sweep_id:
        return []
    sweep = load_sweep(run.path.parent, sweep_id)
    return stop_sweep(run.path.parent, sweep, run.id) if sweep.get("fail_fast") else []
