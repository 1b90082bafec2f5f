"""Study files: a paper's table or figure as fslab sweeps, with the published numbers.

A study is a TOML file (the schema is in the README, "Reproducing the papers")::

    name = "nca-table3"                  # letters, digits, . _ - (at most 100)
    title = "ResNet-12 on miniImageNet and CIFAR-FS"
    table = "Table 3"                    # or figure = "Fig. 2"
    description = "..."
    split = "test"                       # or "val": the split the paper's numbers were measured on
    [paper]                              # authors, title, year, arxiv (and venue)
    [[sweep]]                            # name, label, method, datasets, seeds, grid, set
    [quick]                              # seeds, dataset, set, grid: the --scale quick override
    [plot]                               # figure studies: x = a grid key
    [[published]]                        # sweep, dataset, shots, ways, accuracy, ci95, at
    [[cost]]                             # device, gpu_hours, date, how: what the paper scale cost where measured

Every mistake is one line naming the file, the key and what is allowed
(:class:`ConfigError`). Plugins ship studies through ``register_studies``
(:func:`study_entry` gives what ``register`` needs from a file). The runs a
study needs are planned and resolved by :mod:`fslab.core.study_plan`.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fslab.core.assignments import shown
from fslab.core.config import type_error
from fslab.core.errors import ConfigError, PluginError, UsageError, did_you_mean
from fslab.core.keys import TWICE, dated, dotted, grid_leaves, repeated_key, repeated_value
from fslab.core.settings import read_toml
from fslab.core.text import printable

SCALES = ("paper", "quick")
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
LONGEST_NAME = 100  # a study's name names its report's files (NAME.md, NAME-DATASET.png): room left for the rest
ARXIV = re.compile(r"\d{4}\.\d{4,5}")
TOP_KEYS = ("name", "title", "table", "figure", "description", "split", "paper", "sweep", "quick", "plot",
            "published", "cost")
# The splits a study's numbers may be measured on; "val" scores each run's final network on the
# validation classes as on the test classes (eval.final_val), as the NCA paper's Fig. 2 and 4 do.
SPLITS = ("test", "val")
PAPER_KEYS = ("authors", "title", "year", "arxiv", "venue")
SWEEP_KEYS = ("name", "label", "method", "datasets", "seeds", "grid", "set")
QUICK_KEYS = ("seeds", "dataset", "set", "grid")
CELL_KEYS = ("sweep", "dataset", "shots", "ways", "accuracy", "ci95", "at")
COST_KEYS = ("device", "gpu_hours", "date", "how")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# Keys a study may not set in grid or set: the seed comes from `seeds`, the dataset from `datasets`.
RESERVED = ("seed", "dataset.name")


@dataclass(frozen=True)
class Paper:
    authors: str
    title: str
    year: int
    arxiv: str = ""
    venue: str = ""

    def cite(self) -> str:
        tail = f" ({self.venue} {self.year}" if self.venue else f" ({self.year}"
        return f"{self.authors}, {self.title}{tail}{f', arXiv:{self.arxiv}' if self.arxiv else ''})"


@dataclass(frozen=True)
class StudySweep:
    """One method's runs: each dataset × grid combination × seed."""

    name: str
    label: str
    method: str
    datasets: tuple[str, ...]
    seeds: int
    grid: dict[str, list] = field(default_factory=dict)
    set: dict[str, Any] = field(default_factory=dict)  # dotted key -> value

    def points(self, narrower: dict | None = None) -> list[dict]:
        """Every grid combination as {key: value} (one empty point without a grid);
        ``narrower`` gives other values for some grid keys (the quick scale's)."""
        grid = {k: (narrower or {}).get(k, values) for k, values in self.grid.items()}
        return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


@dataclass(frozen=True)
class Cell:
    """One published number: the runs of ``sweep`` on ``dataset`` at grid point ``at``."""

    sweep: str
    dataset: str
    shots: int
    ways: int
    accuracy: float  # percent
    ci95: float | None  # percent; None where the paper gives none
    at: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Cost:
    """What the study's paper scale cost where it was measured: ``gpu_hours`` on one ``device``,
    on ``date`` (YYYY-MM-DD), and ``how`` it was measured. A record, not a promise: another GPU,
    or the same one with another PyTorch, takes its own time."""

    device: str
    gpu_hours: float
    date: str
    how: str = ""

    def text(self) -> str:
        return f"about {self.gpu_hours:.1f} on one {self.device} ({self.date}{f'; {self.how}' if self.how else ''})"


@dataclass(frozen=True)
class QuickScale:
    """What ``--scale quick`` changes: fewer seeds, another dataset, smaller
    settings, and fewer values of a grid key (a figure's line keeps two points)."""

    seeds: int = 1
    dataset: str = "synthetic"
    set: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)

    def set_on(self, trains_on: str) -> dict[str, Any]:
        """The settings this scale gives a run that trains on ``trains_on``: its ``dataset.*`` keys only on
        the scale's own dataset (synthetic's class counts are no other dataset's business, --dataset's)."""
        return {k: v for k, v in self.set.items() if not k.startswith("dataset.") or trains_on == self.dataset}


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    what: str  # "Table 3", "Fig. 2"
    kind: str  # "table" or "figure"
    description: str
    paper: Paper
    sweeps: tuple[StudySweep, ...]
    published: tuple[Cell, ...]
    quick: QuickScale
    plot_x: str | None = None
    path: Path | None = None
    split: str = "test"
    costs: tuple[Cost, ...] = ()
    # run by the path of its file rather than registered (fslab study run path/to/x.toml): its record names
    # that file, so a copy of a registered study that keeps the name is reported apart from it
    from_file: bool = False

    def file_key(self) -> str | None:
        """What a sweep record of this study holds under ``file``: the study file's absolute path when it
        was run by its path, None when it is registered."""
        return str(Path(self.path).resolve()) if self.from_file and self.path is not None else None

    def settings_digest(self) -> str:
        """A digest of what the study trains and tests (each sweep's method, datasets, seeds, grid and
        settings, the quick scale, the split): a sweep record keeps it, so a report can tell runs made
        under an earlier edit of the file. Titles, labels, descriptions and published numbers leave it."""
        import hashlib

        sweeps = [{k: v for k, v in dataclasses.asdict(s).items() if k != "label"} for s in self.sweeps]
        text = json.dumps([sweeps, dataclasses.asdict(self.quick), self.split], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def project_file(self, runs_dir) -> str | None:
        """What a sweep record of this study also holds under ``project_file``: the study file's path from
        the folder that holds the run store, where the file lies inside that folder (None otherwise, or when
        registered), so a project copied or moved with its study file still finds the study's records. A
        runs folder that is a link (to a larger disk) is not followed: the project is the folder of the link."""
        if not self.from_file or self.path is None:
            return None
        for place in (os.path.abspath, os.path.realpath):  # as written, then with every link followed
            try:
                return Path(place(self.path)).relative_to(Path(place(runs_dir)).parent).as_posix()
            except ValueError:
                continue
        return None

    def sweep(self, name: str) -> StudySweep:
        return next(s for s in self.sweeps if s.name == name)

    def seeds(self, scale: str) -> dict[str, int]:
        return {s.name: (self.quick.seeds if _scale(scale) == "quick" else s.seeds) for s in self.sweeps}

    def points(self, sweep: StudySweep, scale: str = "paper") -> list[dict]:
        """The grid points ``sweep`` runs at ``scale``."""
        return sweep.points(self.quick.grid if _scale(scale) == "quick" else None)

    def run_count(self, scale: str = "paper") -> int:
        seeds = self.seeds(scale)
        return sum(len(s.datasets) * len(self.points(s, scale)) * seeds[s.name] for s in self.sweeps)


def scale_option(scale: str) -> str:
    """``--scale``'s value, ``paper`` or ``quick``; any other is one line naming the option and the closest
    scale (``quik``: Did you mean 'quick'?)."""
    if scale not in SCALES:
        raise UsageError(f"--scale must be one of {', '.join(SCALES)}, got '{scale}'.{did_you_mean(scale, SCALES)}")
    return scale


def _scale(scale: Any) -> str:
    """``paper`` or ``quick``: run_count('fast') or ('Quick') counted the paper's runs, without a word."""
    if scale not in SCALES:
        raise UsageError(f"a study's scale is one of {', '.join(SCALES)}, got {scale!r}."
                         + did_you_mean(str(scale), SCALES))
    return scale


# -- reading -------------------------------------------------------------------


class _Checker:
    """One-line errors naming the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, what: str) -> None:
        raise ConfigError(printable(f"{self.source}: {key}: {what}"))  # a key may hold a newline

    def keys(self, table: Any, allowed: tuple, where: str) -> dict:
        if not isinstance(table, dict):
            self.fail(where, "must be a table")
        for key in table:
            if key not in allowed:
                self.fail(f"{where}.{key}" if where else key, f"unknown key. Allowed: {', '.join(allowed)}")
        return table

    def text(self, table: dict, key: str, where: str, *, required: bool = True, pattern=None, default="",
             lines: bool = False) -> str:
        """A string; one line without control characters unless ``lines`` (a title, a label and a name
        are a table's cell or a heading, where a line break would cut a Markdown row or end a LaTeX comment)."""
        value = table.get(key, None if required else default)
        if value is None:  # TOML has no null: the key is not there
            self.fail(f"{where}{key}", "missing: a non-empty string")
        if not isinstance(value, str) or (required and not value.strip()):
            self.fail(f"{where}{key}", f"must be {'a non-empty ' if required else 'a '}string, got {shown(value, 60)}")
        if not lines and any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
            self.fail(f"{where}{key}", f"must be one line without control characters (it is printed in a table "
                                       f"or a heading), got {shown(value, 60)}; write it on one line")
        if pattern is not None and value and not pattern.fullmatch(value):
            self.fail(f"{where}{key}", f"'{value:.60}' must match {pattern.pattern}")
        return value

    def whole(self, table: dict, key: str, where: str, low: int, default: int | None = None, high=None) -> int:
        value = table.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high):
            span = f"from {low} to {high}" if high else f"at least {low}"
            self.fail(f"{where}{key}", f"missing: a whole number {span}" if value is None else
                      f"must be a whole number {span}, got {shown(value, 60)}")
        return value

    def values(self, values: Any, where: str) -> list:
        """A grid's values: a non-empty list, each value once (a repeat would plan one run twice)."""
        if not isinstance(values, list) or not values:
            self.fail(where, "must be a non-empty list of values")
        if (twice := repeated_value(values)) is not None:
            self.fail(where, f"lists {json.dumps(twice[0], default=str)} twice; each value is one point of the "
                             f"grid: list it once")
        return values

    def typed(self, table: dict, where: str, grid: bool = False) -> None:
        """Each value ``table`` gives one of fslab's own keys against its type (as a sweep file's
        are), when the file is read: a scale or layer that replaces it (--scale quick) hides none."""
        if (wrong := type_error(table, grid=grid)) is not None:
            self.fail(f"{where}.{wrong[0]}", wrong[1].removeprefix(" ").removeprefix(": "))

    def settings(self, table: Any, where: str) -> dict:
        """A table of configuration keys, dotted or nested, as {dotted key: value}."""
        if not isinstance(table, dict):
            self.fail(where, "must be a table of configuration keys, e.g. { \"train.epochs\" = 1 }")
        if (twice := repeated_key(table)) is not None:
            self.fail(f"{where}.{twice}", TWICE)
        flat = dotted(table)
        if (why := dated(flat)) is not None:
            self.fail(where, why)
        for key in flat:
            if key in RESERVED:
                self.fail(f"{where}.{key}", "is set by the study itself (seeds and datasets); leave it out")
        return flat


def read_study(path: Path) -> Study:
    """The study in a TOML file, checked (:func:`parse_study`)."""
    path = Path(path)
    return parse_study(read_toml(path), str(path), path=path)


def parse_study(data: dict, source: str, path: Path | None = None) -> Study:
    """A study from parsed TOML; ``source`` names the file in errors."""
    check = _Checker(source)
    check.keys(data, TOP_KEYS, "")
    name = check.text(data, "name", "", pattern=NAME)
    if len(name) > LONGEST_NAME:
        check.fail("name", f"'{name:.40}...' is {len(name)} characters long; a study's name may have at most "
                           f"{LONGEST_NAME} (it names the report's files): choose a shorter one")
    if ("table" in data) == ("figure" in data):
        check.fail("table", "give exactly one of table = \"Table N\" or figure = \"Fig. N\"")
    kind = "table" if "table" in data else "figure"
    what = check.text(data, kind, "")
    paper = _paper(check, data.get("paper"))
    sweeps = _sweeps(check, data.get("sweep"))
    quick = _quick(check, data.get("quick", {}), sweeps)
    plot_x = None
    if "plot" in data:
        plot = check.keys(data["plot"], ("x",), "plot")
        plot_x = check.text(plot, "x", "plot.")
        if not any(plot_x in s.grid for s in sweeps):
            check.fail("plot.x", f"'{plot_x}' is not a grid key of any sweep")
    published = _published(check, data.get("published", []), {s.name: s for s in sweeps})
    for cell in published:  # the quick scale runs every published cell too
        for key, value in cell.at.items():
            if key in quick.grid and value not in quick.grid[key]:
                check.fail(f"quick.grid.{key}", f"leaves out {value!r}, where a published cell of sweep "
                                                f"'{cell.sweep}' is placed")
    split = data.get("split", "test")
    if split not in SPLITS:
        check.fail("split", f"must be one of {', '.join(SPLITS)}, got {shown(split, 60)}")
    return Study(name=name, title=check.text(data, "title", ""), what=what, kind=kind,
                 description=check.text(data, "description", "", required=False, lines=True), paper=paper,
                 sweeps=sweeps, published=published, quick=quick, plot_x=plot_x, path=path, split=split,
                 costs=_costs(check, data.get("cost", [])))


def _paper(check: _Checker, table: Any) -> Paper:
    if table is None:
        check.fail("paper", "missing: a [paper] table with authors, title and year (arxiv and venue if it has them)")
    check.keys(table, PAPER_KEYS, "paper")
    return Paper(authors=check.text(table, "authors", "paper."), title=check.text(table, "title", "paper."),
                 year=check.whole(table, "year", "paper.", 1900, high=2100),
                 arxiv=check.text(table, "arxiv", "paper.", required=False, pattern=ARXIV),
                 venue=check.text(table, "venue", "paper.", required=False))


def _sweeps(check: _Checker, tables: Any) -> tuple[StudySweep, ...]:
    if isinstance(tables, dict):  # [sweep], one table, where each sweep is an array's entry
        check.fail("sweep", "must be an array of tables: write [[sweep]] (two brackets) above each sweep, "
                            "not [sweep]")
    if not isinstance(tables, list) or not tables:
        check.fail("sweep", "missing: at least one [[sweep]] table (name, method, datasets, seeds)")
    sweeps: dict[str, StudySweep] = {}
    for i, table in enumerate(tables):
        where = f"sweep[{i}]"
        check.keys(table, SWEEP_KEYS, where)
        name = check.text(table, "name", f"{where}.", pattern=NAME)
        where = f"sweep '{name}'"
        if name in sweeps:
            check.fail(where, "is named twice; sweep names must differ")
        datasets = table.get("datasets")
        if not isinstance(datasets, list) or not datasets or not all(isinstance(d, str) and d for d in datasets) \
                or len(set(datasets)) != len(datasets):
            check.fail(f"{where}.datasets",
                       f"must be a non-empty list of distinct dataset names, got {shown(datasets, 60)}")
        grid = check.settings(table.get("grid", {}), f"{where}.grid")
        for key, values in grid.items():
            check.values(values, f"{where}.grid.{key}")
        fixed = check.settings(table.get("set", {}), f"{where}.set")
        check.typed(grid, f"{where}.grid", grid=True)
        check.typed(fixed, f"{where}.set")
        leaves = grid_leaves(grid)  # a grid of tables sets the keys inside them
        if reserved := [key for key in leaves if key in RESERVED]:
            check.fail(f"{where}.grid.{reserved[0]}", "is set by the study itself (seeds and datasets); leave it out")
        both = set(leaves) & set(fixed)
        if both:
            check.fail(f"{where}.set.{sorted(both)[0]}", "is also a grid key; give it in one place")
        sweeps[name] = StudySweep(name=name, label=check.text(table, "label", f"{where}.", required=False) or name,
                                  method=check.text(table, "method", f"{where}."), datasets=tuple(datasets),
                                  seeds=check.whole(table, "seeds", f"{where}.", 1, default=1), grid=grid, set=fixed)
    return tuple(sweeps.values())


def _quick(check: _Checker, table: Any, sweeps: tuple[StudySweep, ...]) -> QuickScale:
    check.keys(table, QUICK_KEYS, "quick")
    grid = check.settings(table.get("grid", {}), "quick.grid")
    grid_keys = {k for s in sweeps for k in s.grid}
    for key, values in grid.items():
        if key not in grid_keys:
            check.fail(f"quick.grid.{key}", f"is no sweep's grid key ({', '.join(sorted(grid_keys)) or 'none'})")
        check.values(values, f"quick.grid.{key}")
    check.typed(grid, "quick.grid", grid=True)
    for key, values in grid.items():
        paper = []
        for value in (value for s in sweeps for value in s.grid.get(key, [])):
            paper += [value] if value not in paper else []
        if (other := next((value for value in values if value not in paper), None)) is not None:
            check.fail(f"quick.grid.{key}", f"lists {shown(other)}, which no sweep's grid gives it; the quick scale "
                                            f"takes fewer of the paper's values: some of {shown(paper, 100)}")
    quick_set = check.settings(table.get("set", {}), "quick.set")
    check.typed(quick_set, "quick.set")
    return QuickScale(seeds=check.whole(table, "seeds", "quick.", 1, default=1),
                      dataset=check.text(table, "dataset", "quick.", required=False, default="synthetic")
                      or "synthetic",
                      set=quick_set, grid=grid)


def _published(check: _Checker, tables: Any, sweeps: dict[str, StudySweep]) -> tuple[Cell, ...]:
    if not isinstance(tables, list):
        check.fail("published", "must be an array of [[published]] tables")
    cells: dict[tuple, Cell] = {}
    for i, table in enumerate(tables):
        where = f"published[{i}]"
        check.keys(table, CELL_KEYS, where)
        name = check.text(table, "sweep", f"{where}.")
        if name not in sweeps:
            check.fail(f"{where}.sweep", f"'{name}' names no sweep. Allowed: {', '.join(sweeps)}")
        sweep = sweeps[name]
        dataset = check.text(table, "dataset", f"{where}.")
        if dataset not in sweep.datasets:
            check.fail(f"{where}.dataset", f"'{dataset}' is not a dataset of sweep '{name}'. "
                                           f"Allowed: {', '.join(sweep.datasets)}")
        at = _grid_point(check, table.get("at", {}), sweep, f"{where}.at")
        cell = Cell(sweep=name, dataset=dataset, shots=check.whole(table, "shots", f"{where}.", 1),
                    ways=check.whole(table, "ways", f"{where}.", 2, default=5),
                    accuracy=_number(check, table.get("accuracy"), f"{where}.accuracy", 100.0),
                    ci95=None if "ci95" not in table else _number(check, table["ci95"], f"{where}.ci95", 100.0),
                    at=at)
        if 0 < cell.accuracy <= 1:  # no paper's few-shot accuracy or mAP is 1% or less: a fraction
            check.fail(f"{where}.accuracy", f"is in percent, as the papers print it: {cell.accuracy:g} reads as "
                                            f"{cell.accuracy:g}%; write {100 * cell.accuracy:g}")
        key = (name, dataset, cell.ways, cell.shots, json.dumps(at, sort_keys=True))
        if key in cells:
            check.fail(where, f"repeats the cell of sweep '{name}' on {dataset}, {cell.ways}-way {cell.shots}-shot")
        cells[key] = cell
    return tuple(cells.values())


def _costs(check: _Checker, tables: Any) -> tuple[Cost, ...]:
    if not isinstance(tables, list):
        check.fail("cost", "must be an array of [[cost]] tables (device, gpu_hours, date, how)")
    costs = []
    for i, table in enumerate(tables):
        where = f"cost[{i}]"
        check.keys(table, COST_KEYS, where)
        hours = table.get("gpu_hours")
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not math.isfinite(hours) or hours <= 0:
            check.fail(f"{where}.gpu_hours", f"must be a number of hours above 0, got {shown(hours, 60)}")
        day = table.get("date")
        if isinstance(day, datetime.date) and not isinstance(day, datetime.datetime):  # TOML's bare date
            day = day.isoformat()
        if not isinstance(day, str):  # a time of day with it, a number, or none at all
            check.fail(f"{where}.date", "missing: the day the cost was measured, e.g. date = 2026-11-26" if day is None
                       else f"must be a day, e.g. date = 2026-11-26 (a TOML date, or the same as a string), "
                            f"got {shown(day, 60)}")
        costs.append(Cost(device=check.text(table, "device", f"{where}."), gpu_hours=float(hours),
                          date=check.text({"date": day}, "date", f"{where}.", pattern=DATE),
                          how=check.text(table, "how", f"{where}.", required=False)))
    return tuple(costs)


def _grid_point(check: _Checker, table: Any, sweep: StudySweep, where: str) -> dict:
    point = check.settings(table, where)
    for key, value in point.items():
        if key not in sweep.grid:
            check.fail(f"{where}.{key}", f"is not a grid key of sweep '{sweep.name}'. "
                                         f"Allowed: {', '.join(sweep.grid) or '(no grid)'}")
        if value not in sweep.grid[key]:
            check.fail(f"{where}.{key}", f"{value!r} is not among the grid's values {sweep.grid[key]!r}")
    missing = [k for k in sweep.grid if k not in point]
    if missing:
        check.fail(f"{where}.{missing[0]}", f"missing: a published cell names one value of each grid key of "
                                            f"sweep '{sweep.name}'")
    return point


def _number(check: _Checker, value: Any, key: str, high: float) -> float:
    if value is None:
        check.fail(key, f"missing: a number from 0 to {high:g} (percent)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= high:
        check.fail(key, f"must be a number from 0 to {high:g} (percent), got {shown(value, 60)}")
    return float(value)


def study_entry(path: Path) -> dict:
    """What ``register`` needs for the study file at ``path``: its name,
    description and paper (the file is checked whole, so a broken one fails
    when its plugin loads, naming the file)."""
    study = read_study(path)
    return {"name": study.name, "description": f"{study.what}: {study.title}", "paper": study.paper.cite()}


def find_study(registry, ref: str) -> Study:
    """A registered study by name (``fslab plugins --kind study``), or a study file by its path (``*.toml``)."""
    if isinstance(ref, str) and ref.endswith(".toml"):
        if Path(ref).is_dir():  # 'no study file' read as if it were not there
            raise UsageError(f"'{ref}' is a folder, not a study file; give the path of a study's .toml file")
        if not Path(ref).is_file():
            raise UsageError(f"no study file '{ref}'")
        return dataclasses.replace(read_study(Path(ref)), from_file=True)
    component = registry.get("study", ref)
    try:  # the plugin's file, not the user's input: a missing or broken one is the plugin's fault (exit code 1)
        study = read_study(component.target)
    except UsageError as exc:
        raise PluginError(f"study '{ref}' of plugin '{component.plugin}' cannot be used: {exc}") from None
    if study.name != ref:
        raise PluginError(f"study '{ref}' of plugin '{component.plugin}' cannot be used: {study.path}: name: the "
                          f"file says '{study.name}', but it is registered as '{ref}'")
    return study
