"""The runs a study needs: planned from its file as configuration layers
(:func:`plan_runs`), resolved as ``fslab run`` would (:func:`resolve_study`: the
CLI, the benchmarks and the plugin kit's contract all call it), and compared by
what they train and score (:func:`settings_key`; a grid whose points differ only in
what is no setting, ``train.processes``, is refused: :func:`varied_ignored`). The file itself is
:mod:`fslab.core.studies`; queueing and reporting the runs belong to the
execution and reports layers.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from fslab.core.assignments import layer_of, nest
from fslab.core.config import naming_the_file, outside_settings, point_layer, resolve, tested_ways
from fslab.core.errors import ConfigError, UnknownName, UsageError
from fslab.core.keys import dotted, names_key
from fslab.core.studies import Study, scale_option
from fslab.core.text import count


@dataclass(frozen=True)
class PlannedRun:
    """One run a study needs: where it sits in the study, and its configuration layers."""

    sweep: str
    dataset: str  # the study's dataset (the run may train on another: --dataset, or the quick scale's)
    at: dict
    seed: int
    method: str
    layers: tuple[dict, ...]

    def place(self) -> dict:
        return {"sweep": self.sweep, "dataset": self.dataset, "at": self.at}

    @property
    def trains_on(self) -> str:
        """The dataset the run trains on: its first layer's (:func:`plan_runs`)."""
        return self.layers[0]["dataset"]["name"]


def run_dataset(study: Study, scale: str, dataset: str, override: str | None) -> str:
    """The dataset a run of the study's ``dataset`` trains on at ``scale``."""
    return override or (study.quick.dataset if scale == "quick" else dataset)


def trained_datasets(study: Study, scale: str, dataset: str | None) -> list[str]:
    """The datasets the study's runs train on at ``scale`` (``dataset``: --dataset's), sorted."""
    return sorted({run_dataset(study, scale, d, dataset) for s in study.sweeps for d in s.datasets})


def with_roots_hint(line: str, study: Study, scale: str, dataset: str | None) -> str:
    """``line``, a dataset's refusal of its data root, and where it offers --data-root, which a study on several
    datasets refuses (one folder for them all), the way that works said after it."""
    used = trained_datasets(study, scale, dataset)
    if "--data-root" not in line or len(used) < 2:
        return line
    return (f"{line.rstrip('.')}; study {study.name} trains on {', '.join(used)}, so --data-root (one folder) is "
            f"not for it: give each dataset its folder in [data_roots] of fslab.toml")


def plan_runs(study: Study, scale: str = "paper", *, dataset: str | None = None, data_root: str | None = None,
              extra: tuple[dict, ...] = ()) -> list[PlannedRun]:
    """Every run of the study at ``scale`` (sweeps, datasets, grid points, seeds
    innermost), as configuration layers, lowest first: the run's dataset, the
    sweep's ``set`` (and ``eval.final_val`` for a study measured on the
    validation split), its grid point, the quick scale's ``set``, ``extra``
    (``--set`` of the command line), the seed. The quick scale's ``dataset.*``
    keys apply only to runs on the quick scale's own dataset."""
    scale_option(scale)
    check_extra(study, scale, extra)
    used = trained_datasets(study, scale, dataset)
    if data_root and len(used) > 1:
        raise UsageError(f"--data-root names one folder, but study {study.name} trains on {', '.join(used)}: "
                         f"give each dataset its folder in [data_roots] of fslab.toml")
    planned = []
    for sweep in study.sweeps:
        check_varied(study, sweep, scale)
        seeds = study.seeds(scale)[sweep.name]
        for name in sweep.datasets:
            trains_on = run_dataset(study, scale, name, dataset)
            # the root a layer of its own above the dataset's choice, as fslab run --data-root: one given for a
            # dataset that reads no files (--dataset synthetic) is then refused, not dropped (config.resolve)
            base = [nest(["dataset", "name"], trains_on)]
            if data_root:
                base.append(nest(["dataset", "root"], data_root))
            base.append(layer_of((k.split("."), v) for k, v in sweep.set.items()))  # one table: one layer
            if study.split == "val":
                base.append({"eval": {"final_val": True}})
            quick = [layer_of((k.split("."), v) for k, v in study.quick.set_on(trains_on).items())] \
                if scale == "quick" else []
            for point in study.points(sweep, scale):
                at = [point_layer(base, point)]  # as the sweep's set would give its values
                for seed in range(seeds):
                    layers = (*base, *at, *quick, *extra, {"seed": seed})
                    planned.append(PlannedRun(sweep.name, name, point, seed, sweep.method, layers))
    return planned


def resolve_study(study: Study, scale: str, *, settings, registry, dataset: str | None = None,
                  data_root: str | None = None, extra: tuple[dict, ...] = ()) -> list[tuple[PlannedRun, dict]]:
    """Every planned run of the study with its resolved configuration; a
    configuration that cannot be resolved is one line naming the study and sweep."""
    if dataset is not None:  # said of --dataset, not of the sweep's own dataset it replaces
        try:
            registry.get("dataset", dataset)
        except UnknownName as exc:
            raise UsageError(f"--dataset {dataset}: {exc}") from None
    resolved = []
    for planned in plan_runs(study, scale, dataset=dataset, data_root=data_root, extra=extra):
        try:
            with naming_the_file(settings, planned.layers):
                config = resolve(planned.method, registry=registry, settings=settings, overrides=planned.layers)
        except UsageError as exc:
            exc.args = (placed(study, scale, planned, exc, extra),)
            raise
        resolved.append((planned, config))
    check_cells(study, resolved, extra)
    return resolved


def distinct_runs(resolved: list[tuple[PlannedRun, dict]]) -> dict[str, list[tuple[PlannedRun, dict]]]:
    """The runs a study trains, each by its :func:`settings_key` with the places it serves, in the plan's order:
    places alike in every setting (two datasets the quick scale trains both on synthetic, sweeps that
    differ only in what :data:`IGNORED` names) are one run. The one count of a study's runs that ``fslab study
    list``, ``show`` and ``run`` give."""
    runs: dict[str, list[tuple[PlannedRun, dict]]] = {}
    for planned, config in resolved:
        runs.setdefault(settings_key(config), []).append((planned, config))
    return runs


def runs_text(runs: int, places: int) -> str:
    """``5 runs for 10 places (places alike in every setting share one)``, or ``10 runs`` where none share."""
    if runs == places:
        return count(runs, "run")
    return f"{count(runs, 'run')} for {count(places, 'place')} (places alike in every setting share one)"


def placed(study: Study, scale: str, planned: PlannedRun, exc: UsageError, extra: tuple[dict, ...] = ()) -> str:
    """An error about one of the study's runs, with where it comes from: the file and key first where the
    study file gave what is wrong (a long message is clipped), else the study, sweep and dataset."""
    where = study_key(study, scale, planned, exc, extra)
    if where and study.path:
        return f"{study.path}: {where} (on {planned.dataset}): {exc}"
    return f"study {study.name}, sweep '{planned.sweep}' on {planned.dataset}: {exc}"


def study_key(study: Study, scale: str, planned: PlannedRun, exc: UsageError, extra: tuple[dict, ...] = ()) -> str:
    """The key of the study file that gave what a resolving error is about (``sweep 'nca'.set.train.lr``,
    ``sweep 'nca'.method``), or '' where the file did not give it (``--set``, the defaults): the message
    names a configuration key, or it is an unknown name the file chose (a method, a dataset, a plugin)."""
    sweep = study.sweep(planned.sweep)
    if isinstance(exc, UnknownName):
        if exc.what == "method" and exc.word == sweep.method:
            return f"sweep '{sweep.name}'.method"
        if exc.what == "dataset" and exc.word == planned.dataset:
            return f"sweep '{sweep.name}'.datasets"
        if exc.what == "dataset" and scale == "quick" and exc.word == study.quick.dataset:
            return "quick.dataset"
    narrower = study.quick.grid if scale == "quick" else {}  # the quick scale's values of a grid key
    layers = [({k: v for layer in extra for k, v in dotted(layer).items()}, ""),  # the highest first
              (study.quick.set_on(planned.trains_on) if scale == "quick" else {}, "quick.set."),  # as it applied
              ({k: v for k, v in planned.at.items() if k in narrower}, "quick.grid."),
              ({k: v for k, v in planned.at.items() if k not in narrower}, f"sweep '{sweep.name}'.grid."),
              (sweep.set, f"sweep '{sweep.name}'.set.")]
    for values, where in layers:
        for key, value in values.items():
            chosen = isinstance(exc, UnknownName) and key == f"{exc.what}.name" and exc.word == value
            if chosen or names_key(str(exc), key):
                return f"{where}{key}" if where else ""
    return ""


def project_changes(study: Study, scale: str, resolved: list[tuple[PlannedRun, dict]], *, settings, registry,
                    dataset: str | None = None, data_root: str | None = None, extra: tuple[dict, ...] = ()) -> dict:
    """The settings that ``[run]`` of ``fslab.toml`` gives the study's runs in place
    of the study's own (the keys of :data:`IGNORED`, where runs go and what they
    run on, aside): key -> the value the runs have. Like ``--set``, they make the
    study's numbers not comparable to the paper's."""
    if not settings.run:
        return {}
    bare = dataclasses.replace(settings, run={})
    try:
        plain = resolve_study(study, scale, settings=bare, registry=registry, dataset=dataset, data_root=data_root,
                              extra=extra)
    except UsageError:  # a study that needs the project's [run] to resolve: every key it sets counts
        return {k: v for k, v in dotted(settings.run).items() if not ignored(k)}
    return _changes(resolved, plain)


def command_line_changes(study: Study, scale: str, resolved: list[tuple[PlannedRun, dict]], *, settings, registry,
                         dataset: str | None = None, data_root: str | None = None,
                         extra: tuple[dict, ...] = ()) -> dict:
    """The settings that ``--set`` (``extra``) gives the study's runs in place of those
    they would have without it (the keys of :data:`IGNORED` aside): key -> the value
    the runs have. A ``--set`` of the value a run has anyway changes nothing, so it
    leaves the runs comparable to the paper's."""
    if not extra:
        return {}
    try:
        plain = resolve_study(study, scale, settings=settings, registry=registry, dataset=dataset,
                              data_root=data_root)
    except UsageError:  # a study that needs --set to resolve: every key it sets counts
        return {k: v for layer in extra for k, v in dotted(layer).items() if not ignored(k)}
    return _changes(resolved, plain)


def _changes(resolved: list[tuple[PlannedRun, dict]], plain: list[tuple[PlannedRun, dict]]) -> dict:
    """The settings in which the ``resolved`` runs differ from the ``plain`` ones (the
    same runs, resolved without one source of settings): key -> the resolved value."""
    changes = {}
    for (_, config), (_, own) in zip(resolved, plain):
        mine, theirs = dotted(config), dotted(own)
        for key in mine.keys() | theirs.keys():
            if not ignored(key) and mine.get(key) != theirs.get(key):
                changes[key] = mine.get(key)
    return dict(sorted(changes.items()))


EPISODE_KEYS = ("eval.ways", "eval.extra_ways", "eval.shots")  # the episode shapes a run is scored on


def check_cells(study: Study, resolved: list[tuple[PlannedRun, dict]], extra: tuple[dict, ...] = ()) -> None:
    """Each published cell must be one its runs evaluate (their eval.ways and
    eval.extra_ways, and eval.shots); where ``--set`` (``extra``) changed those, it is named."""
    for cell in study.published:
        for planned, config in resolved:
            if (planned.sweep, planned.dataset, planned.at) != (cell.sweep, cell.dataset, cell.at):
                continue
            ways = tested_ways(config["eval"]["ways"], config["eval"]["extra_ways"])
            shots = config["eval"]["shots"]
            if cell.ways not in ways or cell.shots not in shots:
                if given := [f"--set {k}" for layer in extra for k in dotted(layer) if k in EPISODE_KEYS]:
                    raise UsageError(f"{', '.join(given)}: study {study.name}'s runs of sweep '{cell.sweep}' on "
                                     f"{cell.dataset} would evaluate {', '.join(map(str, ways))}-way "
                                     f"{', '.join(map(str, shots))}-shot, not its published {cell.ways}-way "
                                     f"{cell.shots}-shot cell; leave it out")
                raise ConfigError(f"{study.path or study.name}: the published {cell.ways}-way {cell.shots}-shot cell "
                                  f"of sweep '{cell.sweep}' on {cell.dataset}: its runs evaluate "
                                  f"{', '.join(map(str, ways))}-way {', '.join(map(str, shots))}-shot; "
                                  f"set eval.extra_ways or eval.shots in the sweep")
            break


def check_extra(study: Study, scale: str, extra: tuple[dict, ...]) -> None:
    """``--set`` may change what the study fixes, not what it varies (a grid
    key: every point of that grid would become the same run) nor the seed and
    dataset it gives each run itself."""
    for key in (key for layer in extra for key in dotted(layer)):
        if key == "seed":
            raise UsageError(f"--set seed: study {study.name} numbers each run's seed itself (its sweeps' seeds); "
                             f"leave it out")
        if key == "dataset.name":
            raise UsageError(f"--set dataset.name: train study {study.name} on another dataset with --dataset NAME")
        for sweep in study.sweeps:
            if key in sweep.grid:
                values = list(dict.fromkeys(json.dumps(point[key]) for point in study.points(sweep, scale)))
                raise UsageError(f"--set {key}: study {study.name} varies it (sweep '{sweep.name}' runs "
                                 f"{', '.join(values)}), so one value would make those runs the same; leave it out")


# Keys that do not change what a run learns or how it is scored: runs that
# differ only in these are the same run for a study, and fall in one group for
# fslab compare (fslab.reports.compare.NOT_SETTINGS, which adds the seed).
# train.processes is where a run trains, as the device is: N processes train as
# one on the whole batch (global batch norm, gathered embeddings), equal up to
# float rounding (fslab.training.distributed).
IGNORED = ("device", "dataset.root", "train.log_every", "train.heartbeat", "train.processes", "eval.batch_size",
           "eval.val_every")


def ignored(key: str) -> bool:
    """Whether a dotted key is one that two runs may differ in and still be one run to a study
    (:data:`IGNORED`, and where a run reports: its sinks)."""
    return key in IGNORED or outside_settings(key)


def settings_key(config: dict) -> str:
    """A resolved configuration as comparable text, without :data:`IGNORED` keys:
    two runs with the same key train and score the same way."""
    return json.dumps({k: v for k, v in dotted(config).items() if not ignored(k)}, sort_keys=True)


def varied_ignored(study: Study, sweep, scale: str) -> dict[str, list]:
    """The keys that ``sweep``'s grid varies at ``scale`` between points alike in every other key, each
    with the values it takes there: settings :func:`ignored` (``train.processes``, ``device``), so those
    points would be one run to the study, which of them trained it hanging on the order the grid lists its
    values, and its cells would share it. The one place that decides whether a grid does so."""
    alike: dict[str, list[dict]] = {}  # the rest of a point (as text) -> the ignored keys of its points
    for point in study.points(sweep, scale):
        flat = dotted(point)  # a grid of tables sets the keys inside them
        rest = json.dumps({k: v for k, v in flat.items() if not ignored(k)}, sort_keys=True, default=str)
        alike.setdefault(rest, []).append({k: v for k, v in flat.items() if ignored(k)})
    varied: dict[str, list] = {}
    for points in alike.values():
        for key in sorted({k for point in points for k in point}):
            values = [point.get(key) for point in points]
            if any(value != values[0] for value in values):
                varied.setdefault(key, [])
                varied[key] += [v for v in values if v not in varied[key]]
    return varied


def check_varied(study: Study, sweep, scale: str) -> None:
    """A grid that varies a key :func:`varied_ignored` finds is refused in one line naming the study file's
    key: its points would be one run, planned from whichever the grid lists first."""
    for key, values in varied_ignored(study, sweep, scale).items():
        grid_key = next(g for g in sweep.grid if key == g or key.startswith(g + "."))
        where = "quick.grid" if scale == "quick" and grid_key in study.quick.grid else f"sweep '{sweep.name}'.grid"
        shown = ", ".join(json.dumps(value, default=str) for value in values)
        raise ConfigError(f"{study.path or study.name}: {where}.{grid_key}: varies {key} ({shown}), which changes "
                          f"neither what a run learns nor how it is scored, so points alike in every other key "
                          f"would be one run, trained with whichever value the grid lists first; give it once, in "
                          f"the sweep's set (or fslab study run --set {key}=VALUE)")


def study_command(verb: str, ref: str, *options: str) -> str:
    """``fslab study VERB REF OPTIONS`` as a shell line, for hints that name a study:
    the study by the name or path it was given (a study file, which is not registered,
    by its absolute path, so the line works from any folder), each option quoted."""
    if ref.endswith(".toml"):
        ref = str(Path(ref).expanduser().resolve())
    return shlex.join(["fslab", "study", verb, ref, *options])


def run_options(scale: str, *, dataset: str | None = None, data_root: str | None = None,
                set_: list[str] | None = None, executor: str | None = None,
                slurm: list[str] | None = None) -> list[str]:
    """The options of ``fslab study run`` as given, which plan the same runs again
    (``--set`` as typed; a relative ``--data-root`` made absolute)."""
    options = ["--scale", scale]
    if dataset is not None:
        options += ["--dataset", dataset]
    if data_root:  # an empty one is none, as plan_runs takes it (made absolute, it named the current folder)
        options += ["--data-root", str(Path(data_root).expanduser().resolve())]
    for text in set_ or []:
        options += ["--set", text]
    if executor not in (None, "local"):
        options += ["--executor", executor]
    for text in slurm or []:
        options += ["--slurm", text]
    return options
