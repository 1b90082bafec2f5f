"""Comparing runs the way the NCA paper's tables do.

Runs whose configurations differ only by seed form a group; a group's accuracy
pools the per-episode accuracies of all its runs (5 seeds × 10,000 episodes ->
50,000) into one mean ± 1.96·std/√N. Because every run is evaluated on the
episodes of the same fixed evaluation seed, two groups can also be compared
episode by episode: runs are paired by seed, and the paired differences give a
much tighter interval than two independent ones. Runs are paired, and their
seeds pooled, only where they were scored on the same data: each saved
evaluation holds a fingerprint of its split's images and labels.

Pure Python (no torch): it reads ``runs/<id>/evaluations/*.json``.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import re
import shlex
from dataclasses import dataclass, field

from fslab.core.assignments import assignment
from fslab.core.config import outside_settings
from fslab.core.errors import ConfigError, UsageError, unknown_format
from fslab.core.events import (
    canonical_evaluator,
    logged_evaluator,
    mean_ci,
    metric_label,
    other_precision,
    own_evaluator,
)
from fslab.core.keys import PLUGIN_SECTIONS, dotted
from fslab.core.runstore import Run, creation_order
from fslab.core.study_plan import IGNORED
from fslab.core.summary import older_checkpoint, read_summary, recorded_precision
from fslab.core.text import count, percent, queries_text
from fslab.reports.eval_commands import evaluator_flags, for_scorable, read_on_command, rescore_commands, unevaluable

# Keys that make no group: the seed (a group's runs differ in it), those that
# change neither what a run learns nor how it is scored, which studies ignore too,
# and what else a run was evaluated on besides its test at eval.ways (the final
# network is tested whatever its validations were): a study still tells runs apart
# by these, since it reads their validation and extra-ways scores.
EVALUATED_ELSEWHERE = ("eval.val_episodes", "eval.val_shots", "eval.before_training", "eval.final_val",
                       "eval.extra_ways")
# The test's episode count: the first N episodes of the seeded stream are the same whatever the count
# (fslab.training.evaluation draws whole blocks), and a comparison reads each run on its first N, the most
# every run reaches, so a run tested on more (a seed added at 10,000) is one more seed of its group.
SCORED_ON_MORE = ("eval.test_episodes",)
NOT_SETTINGS = {"seed", *IGNORED, *EVALUATED_ELSEWHERE, *SCORED_ON_MORE}
FORMATS = ("table", "md", "latex", "csv", "json")


_encode = json.JSONEncoder(sort_keys=True).encode  # json.dumps(sort_keys=True) builds an encoder per call


def flatten(config: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": "0.1"}``: every setting as
    a dotted key and its value as JSON text (hashable, comparable)."""
    return {key: _encode(value) for key, value in dotted(config, prefix).items()}


class RunFiles:
    """What a comparison reads of each run, its configuration and its saved
    evaluations, each read once however often it is asked for (a comparison of
    10,000 runs asks for each run's configuration about ten times). ``precision`` (fp32, bf16 or
    fp16; None: each run's own) picks whose scores are read: those of the network run in it."""

    def __init__(self, precision: str | None = None) -> None:
        self.precision = precision
        self._configs: dict[Run, dict] = {}
        self._flat: dict[Run, dict] = {}
        self._saved: dict[Run, list[dict]] = {}
        self._damaged: dict[Run, list[str]] = {}
        self._own_precision: dict[Run, str | None] = {}

    def config(self, run: Run) -> dict:
        """The run's configuration; ``{}`` if it cannot be read (the run is left out), which
        includes one whose sections are not tables (readers look keys up in each)."""
        if run not in self._configs:
            try:
                config = run.config()
            except ConfigError:  # from a newer fslab, or damaged
                config = {}
            if any(not isinstance(config.get(section, {}), dict) for section in (*PLUGIN_SECTIONS, "train", "eval")):
                config = {}  # hand-edited or damaged: "dataset": ["x"] would pair on nothing anyone can name
            self._configs[run] = config
        return self._configs[run]

    def flat(self, run: Run) -> dict:
        """The run's configuration as :func:`flatten` gives it (grouping and finding repeats both ask)."""
        if run not in self._flat:
            self._flat[run] = flatten(self.config(run))
        return self._flat[run]

    def saved(self, run: Run) -> list[dict]:
        """The run's saved evaluations, each ``evaluator`` in its one spelling (read once), but those of a
        checkpoint older than the run's latest, which ``fslab runs`` no longer shows either: the run was
        resumed and trained on, and the network they scored is gone (:func:`older_checkpoint`); and those
        of its network run in another precision than its own (``fslab eval --precision``), which would pair
        or pool with other runs' own scores as if they measured the same (:func:`other_precision`). With a
        ``precision``, only those of the network run in it: the run's own where that is its precision, else
        those ``fslab eval --precision`` saved beside them (:meth:`in_precision`)."""
        if run not in self._saved:
            saved, self._damaged[run] = run.saved_evaluations()
            saved = [e for e in saved if self.in_precision(run, e)]
            latest = read_summary(run.path, save=False) if saved else None
            self._saved[run] = [{**e, "evaluator": logged_evaluator(e)} for e in saved
                                if not older_checkpoint(e["epoch"], latest)]
        return self._saved[run]

    def in_precision(self, run: Run, evaluation: dict) -> bool:
        """Whether a saved evaluation is of the precision read: without one, of the run's own; with one,
        of the network run in it, as its record names it or, for the training's own scores, which name
        none, as the run's start recorded its evaluation precision (a run that recorded none: unknown,
        not read)."""
        if self.precision is None:
            return not other_precision(evaluation)
        if "precision" in evaluation:
            return evaluation["precision"] == self.precision
        if run not in self._own_precision:
            self._own_precision[run] = recorded_precision(run)
        return self._own_precision[run] == self.precision

    def damaged(self, runs: list[Run]) -> dict[str, list[str]]:
        """Of ``runs``, each one's files in ``evaluations/`` that cannot be used, by run id (those with any):
        their scores are left out, and every report names them (:meth:`Run.saved_evaluations`)."""
        for run in runs:
            self.saved(run)
        return {run.id: self._damaged[run] for run in runs if self._damaged[run]}

    def label(self, run: Run, evaluator: str | None) -> str:
        """The label of ``evaluator`` in its one spelling, or of the run's own where it is None."""
        return own_evaluator(self.config(run)) if evaluator is None else canonical_evaluator(evaluator)


@dataclass
class Group:
    settings: dict
    runs: list = field(default_factory=list)
    label: str = ""


def key_hint(key: str, flat: dict, run_id: str, more: tuple[str, ...] = ()) -> str:
    """``Did you mean train.lr?`` for a key a run's configuration (``flat``) lacks: one without its section or
    in another (lr, eval.lr: train.lr; batch_size: each section's), a misspelt one (or one of ``more``, plot's
    batch-size), a section (some of its keys); else where its keys are seen, every one (fslab show alone lists
    those not default), ``fslab show ID --json`` of ``run_id``, the run whose keys these are."""
    close = (sorted(k for k in flat if k.rpartition(".")[2] == key.rpartition(".")[2])[:3]  # each batch_size
             or difflib.get_close_matches(key, [*more, *flat], n=3, cutoff=0.8)
             or sorted(k for k in flat if k.startswith(f"{key}."))[:3])
    return f"Did you mean {', '.join(close)}?" if close else f"See its keys with: fslab show {run_id} --json"


def run_settings(run: Run, flat: dict, keys: list[str] | None, option: str, leave_out: tuple = ()) -> dict:
    """The settings that tell ``run``'s group: only ``keys`` (each must be in
    its configuration, else a UsageError naming ``option``), or every flat
    setting except the seed, bookkeeping keys and ``leave_out``."""
    if keys:
        missing = [k for k in keys if k not in flat]
        if missing:
            raise UsageError(f"{option} key '{missing[0]}' is not in the configuration of run {run.id}. "
                             f"{key_hint(missing[0], flat, run.id)}")
        return {k: flat[k] for k in keys}
    return {k: v for k, v in flat.items() if k not in NOT_SETTINGS and k not in leave_out and not outside_settings(k)}


def group_runs(runs: list[Run], group_by: list[str] | None = None, files: RunFiles | None = None) -> list[Group]:
    """Groups of runs with equal settings (all but the seed, or only ``group_by``)."""
    files = files or RunFiles()
    groups: dict[tuple, Group] = {}
    for run in runs:
        settings = run_settings(run, files.flat(run), group_by, "--group-by")
        key = tuple(sorted(settings.items()))
        groups.setdefault(key, Group(settings)).runs.append(run)
    result = list(groups.values())
    varying = sorted({k for g in result for k in g.settings if len({h.settings.get(k) for h in result}) > 1})
    for g in result:
        shown = varying or group_by or ["method"]
        g.label = settings_label(g.settings, shown) or "all"
    return result


def settings_label(settings: dict[str, str], keys: list[str]) -> str:
    """Those of ``keys`` that ``settings`` (key -> JSON text) has, each as ``--set`` takes it:
    ``eval.center=false, train.lr=0.1``. A group's label here, a line's in a figure."""
    return ", ".join(assignment(k, json.loads(settings[k])) for k in keys if k in settings)


def episode_accuracies(run: Run, split: str, shots: int, ways: int, queries: int,
                       evaluator: str | None = None, files: RunFiles | None = None,
                       episodes: int | None = None) -> dict | None:
    """The run's saved evaluation for this episode shape by ``evaluator`` (a
    label as :func:`fslab.core.events.evaluator_label` makes; default: the run's own evaluator):
    latest checkpoint, then most episodes; with ``episodes``, the fewest of those that reach it, cut to its
    first ``episodes`` scores where it has more (the first N episodes of a run's seeded stream are the same
    whatever the count, and every evaluator scores each alone: an N'-episode evaluation's first N scores are
    its N-episode ones), ``cut_from`` then saying how many it has."""
    found = _evaluations(run, split, shots, ways, queries, evaluator, files)
    if episodes is None:
        return max(found, key=lambda e: (e["epoch"], e["episodes"]), default=None)
    found = [e for e in found if e["episodes"] >= episodes]
    chosen = min(found, key=lambda e: (-e["epoch"], e["episodes"]), default=None)
    if chosen is None or chosen["episodes"] == episodes:
        return chosen
    return {**chosen, "accuracies": chosen["accuracies"][:episodes], "episodes": episodes,
            "cut_from": chosen["episodes"]}


def _evaluations(run, split, shots, ways, queries, evaluator, files) -> list[dict]:
    """The run's saved evaluations of this shape by ``evaluator``, of its latest checkpoint scored so: one
    of an older checkpoint (scored before the run resumed and trained on) is of a network that is gone."""
    files = files or RunFiles()
    label = files.label(run, evaluator)
    found = [e for e in files.saved(run)
             if (e["split"], e["shots"], e["ways"], e["queries"], e["evaluator"]) == (split, shots, ways, queries,
                                                                                    label)]
    latest = max((e["epoch"] for e in found), default=None)
    return [e for e in found if e["epoch"] == latest]


def has_results(run: Run, split: str, shots: list[int], ways: int, queries: int, evaluator: str | None = None,
                files: RunFiles | None = None) -> bool:
    """Whether the run has a saved evaluation of this shape for any of ``shots``."""
    return any(_evaluations(run, split, n, ways, queries, evaluator, files) for n in shots)


def shared_episodes(runs: list[Run], split: str, shots: int, ways: int, queries: int,
                    evaluator: str | None = None, files: RunFiles | None = None) -> int | None:
    """The most episodes that every one of ``runs`` reaches (among those with this evaluation): the fewest
    of each one's most, so that a run also scored on more (a later ``fslab eval --episodes 10000``) is read
    on its first as many (:func:`episode_accuracies`), weighs as much as the others and pairs with them,
    and no pool mixes counts; None where none has this evaluation."""
    most = [max(e["episodes"] for e in found) for r in runs
            if (found := _evaluations(r, split, shots, ways, queries, evaluator, files))]
    return min(most, default=None)


def pooled(runs: list[Run], split: str, shots: int, ways: int, queries: int,
           evaluator: str | None = None, files: RunFiles | None = None, episodes: int | None = None) -> dict | None:
    """One group's accuracy: the per-episode accuracies of all its runs pooled
    into mean ± 95% CI (None if no run has this evaluation saved), each run's
    on its first ``episodes`` episodes (default: the most that all of them reach, :func:`shared_episodes`)."""
    if episodes is None:
        episodes = shared_episodes(runs, split, shots, ways, queries, evaluator, files)
    evals = [episode_accuracies(r, split, shots, ways, queries, evaluator, files, episodes) for r in runs]
    values = [a for e in evals if e for a in e["accuracies"]]
    if not values:
        return None
    mean, ci = mean_ci(values)
    read = [e for e in evals if e]
    # episodes: the pooled total; episodes_per_run: what each run gave (one count: every run is read on it)
    result = {"accuracy": mean, "ci95": ci, "episodes": len(values), "runs": len(read),
              "episodes_per_run": max(e["episodes"] for e in read)}
    if cut := [r.id for r, e in zip(runs, evals) if e and "cut_from" in e]:
        result["cut"] = cut  # runs with more episodes saved, read on their first episodes_per_run
    metrics = {e.get("metric", "accuracy") for e in evals if e}  # one evaluator's: one metric
    if metrics != {"accuracy"}:  # a retrieval evaluator's mAP, kept under "accuracy" too: tables say which
        result["metric"] = "/".join(sorted(metrics))
    return result


def one_run_per_seed(runs: list[Run], files: RunFiles, scored) -> tuple[list[Run], list[Run]]:
    """Runs with the same settings and the same seed trained the same network on
    the same data and were scored on the same episodes: counting each would
    shrink the CI as if they were independent. Of such repeats the newest with
    ``scored(run)`` stays; returns (kept, left out), in the given order."""
    same: dict[tuple, list[Run]] = {}
    for run in runs:
        settings = run_settings(run, files.flat(run), None, "")
        key = (_encode(files.config(run).get("seed")), tuple(sorted(settings.items())))
        same.setdefault(key, []).append(run)
    kept = {id(found[0] if len(found) == 1 else max(found, key=lambda r: (scored(r), creation_order(r))))
            for found in same.values()}
    return [r for r in runs if id(r) in kept], [r for r in runs if id(r) not in kept]


def compare(runs: list[Run], *, split: str = "test", shots: list[int] = (1, 5), ways: int | None = 5,
            queries: int | None = 15, group_by: list[str] | None = None, evaluator: str | None = None,
            precision: str | None = None) -> dict:
    """Pooled accuracy per group and shots, and paired differences to the first
    group; ``evaluator`` picks whose saved scores (default: each run's own), and ``precision`` those of
    the network run in which (fp32, bf16 or fp16; default: each run's own, :meth:`RunFiles.in_precision`);
    ``ways`` or ``queries`` None: the runs' own shape (:func:`scored_shape`).
    A run named twice counts once; a group whose runs were scored on different
    data is split by their data (``data_split`` lists those); of runs that repeat
    another's settings and seed, one counts (``repeated`` lists the others); every
    run is read on its first as many episodes as every one reaches (``cut`` lists those scored on more)."""
    files = RunFiles(precision)
    runs = list({run.path: run for run in runs}.values())
    ways, queries = scored_shape(runs, split, shots, ways, queries, evaluator, files)
    unreadable = [r.id for r in runs if not files.config(r)]
    groups = group_runs([r for r in runs if files.config(r)], group_by, files)
    groups, data_split = split_by_data(groups, split, evaluator, files, (list(shots), ways, queries))
    rows, paired, repeated = [], [], []

    def scored(run: Run) -> bool:
        return has_results(run, split, shots, ways, queries, evaluator, files)

    for g in groups:
        g.runs, left_out = one_run_per_seed(g.runs, files, scored)
        repeated += [r.id for r in left_out]
    counted = [r for g in groups for r in g.runs]
    episodes = {n: shared_episodes(counted, split, n, ways, queries, evaluator, files) for n in shots}
    for g in groups:
        # seeds: those with results (a failed or unfinished run adds none); seed_values: every run's
        row = {"group": g.label, "runs": [r.id for r in g.runs], "seeds": sum(1 for r in g.runs if scored(r)),
               "seed_values": sorted((files.config(r).get("seed") for r in g.runs), key=_seed_order), "results": {}}
        for n in shots:
            if result := pooled(g.runs, split, n, ways, queries, evaluator, files, episodes[n]):
                row["results"][f"{n}-shot"] = result
        rows.append(row)
    # the first group with scores: a first one still queued (or failed) would pair with none
    baseline = next((g for g, row in zip(groups, rows) if row["results"]), None)
    for g in [g for g in groups if g is not baseline and baseline is not None]:
        for n in shots:
            differences = paired_differences(baseline, g, split, n, ways, queries, evaluator, files, episodes[n])
            if differences:
                mean, ci = mean_ci(differences)
                paired.append({"group": g.label, "baseline": baseline.label, "shots": n,
                               "difference": mean, "ci95": ci, "episodes": len(differences)})
    elsewhere = {r: other_shapes(r, split, shots, ways, queries, evaluator, files) for r in counted
                 if not scored(r)}
    # runs with no scores of any shape (queued, running, or ended before their test), with their state
    unscored = [r for r, shapes in elsewhere.items() if not shapes]
    commands, lacking = _to_score(unscored, files, split=split, shots=list(shots), ways=ways, queries=queries,
                                  episodes=episodes.values(), evaluator=evaluator)
    # whose scores were read: the one asked for, or each run's own (md, latex and csv say which)
    evaluators = sorted({files.label(r, evaluator) for r in counted if scored(r)})
    return {"split": split, "ways": ways, "queries": queries, "shots": list(shots), "evaluators": evaluators,
            "precision": precision, "groups": rows, "paired": paired,
            "unreadable": unreadable, "repeated": repeated, "data_split": data_split,
            "other_shapes": {run.id: shapes for run, shapes in elsewhere.items() if shapes},
            # the episodes each run is read on, per shots; the runs with more saved, read on their first so many
            "episodes_per_run": {f"{n}-shot": episodes[n] for n in shots if episodes[n] is not None},
            "cut": sorted({i for row in rows for r in row["results"].values() for i in r.get("cut", [])}),
            "unscored": {run.id: run.state() for run in unscored}, "unscored_commands": commands,
            "unevaluable": lacking,
            "damaged": files.damaged(counted)}


def _to_score(unscored: list[Run], files: RunFiles, **read) -> tuple[dict[str, str], dict[str, str]]:
    """Of runs with no scores of any shape, where a precision is asked for (``files.precision``; none without):
    the fslab eval that scores each fslab eval can (a checkpoint to score), on the shape and episodes the others
    are read on (:func:`read_on_command` of ``read``), and why it cannot score each other (:func:`unevaluable_runs`)."""
    if not files.precision:
        return {}, {}
    lacking = unevaluable_runs(unscored)
    return {r.id: read_on_command(r, files.config(r), precision=files.precision, **read)
            for r in unscored if r.id not in lacking}, lacking


def damaged_line(damaged: dict[str, list[str]]) -> str | None:
    """One line naming the saved evaluations a report left out as damaged (:meth:`RunFiles.damaged`),
    and how to score their episodes again; None where there are none."""
    files = [f"{run_id}/evaluations/{name}" for run_id, names in damaged.items() for name in names]
    if not files:
        return None
    again = [command for run_id, names in damaged.items() for command in rescore_commands(run_id, names)]
    return (f"{count(len(files), 'saved evaluation')} left out, damaged (not JSON, a score that is not a number "
            f"from 0 to 1, such as NaN, Infinity or a percent, or not one score per episode): "
            f"{', '.join(files[:5])}{', ...' if len(files) > 5 else ''}; score those episodes again with: "
            f"{'; '.join(again[:3])}{'; ...' if len(again) > 3 else ''}")


def _seed_order(seed) -> tuple:
    """Seeds in numeric order (8, 9, 10, not 10, 8, 9 as text), any that is not a whole number (a damaged
    configuration's) after them as text."""
    whole = isinstance(seed, int) and not isinstance(seed, bool)
    return (0, seed, "") if whole else (1, 0, str(seed))


def metrics_name(metrics) -> str:
    """What pooled scores are named by their metrics: ``accuracy``, ``mAP``, or both (``accuracy or mAP``)."""
    return " or ".join(m.replace("map", "mAP") for m in sorted(metrics)) or "accuracy"


def scored_shape(runs: list[Run], split: str, shots: list[int], ways: int | None, queries: int | None,
                 evaluator: str | None, files: RunFiles) -> tuple[int, int]:
    """The (ways, queries) a report reads: as given; where one is left out (None), the runs' own
    (among those that agree with the one given): the one shape all their saved ``split`` scores of
    ``shots`` (by ``evaluator``, default each run's own) share, else the one shape their
    configurations evaluate (``eval.ways``, ``eval.queries``); where neither has one, each of the two
    on its own: the one their scores share, else their configurations (with ``--ways 20`` of runs
    scored at 5-way, 5 queries: 5 queries, those ``fslab eval RUN --ways 20`` scores); else 5-way,
    15 queries, the papers'."""
    if ways is not None and queries is not None:
        return ways, queries
    readable = [run for run in runs if files.config(run)]
    scored, configured = set(), set()
    for run in readable:
        label = files.label(run, evaluator)
        scored |= {(e["ways"], e["queries"]) for e in files.saved(run)
                   if e["split"] == split and e["shots"] in shots and e["evaluator"] == label}
        section = files.config(run).get("eval")
        section = section if isinstance(section, dict) else {}
        shape = (section.get("ways", 5), section.get("queries", 15))
        if all(isinstance(n, int) and not isinstance(n, bool) for n in shape):  # a damaged one says nothing
            configured.add(shape)
    for found in (scored, configured):
        found = {(w, q) for w, q in found if ways in (None, w) and queries in (None, q)}
        if len(found) == 1:
            return found.pop()
    return (_shared(ways, [{w for w, _ in scored}, {w for w, _ in configured}], 5),
            _shared(queries, [{q for _, q in scored}, {q for _, q in configured}], 15))


def _shared(given: int | None, found: list[set[int]], papers: int) -> int:
    """``given``; else the first of the ``found`` sets of the runs' own values that holds one, else ``papers``."""
    if given is not None:
        return given
    return next((values.pop() for values in found if len(values) == 1), papers)


def other_shapes(run: Run, split: str, shots: list[int], ways: int, queries: int, evaluator: str | None,
                 files: RunFiles) -> list[tuple[int, int]]:
    """The (ways, queries) of the run's saved ``split`` evaluations of ``shots`` by ``evaluator``
    (default: its own) other than the one asked for: what ``--ways``/``--queries`` would read."""
    label = files.label(run, evaluator)
    return sorted({(e["ways"], e["queries"]) for e in files.saved(run)
                   if e["split"] == split and e["shots"] in shots and e["evaluator"] == label}
                  - {(ways, queries)})


def shapes_text(shapes) -> str:
    """``5-way 5 queries (--queries 5)``: episode shapes, each with the options that select it."""
    return ", ".join(f"{w}-way, {queries_text(q)} (--ways {w} --queries {q})"
                     for w, q in sorted(shapes))


def paired_differences(a: Group, b: Group, split, shots, ways, queries, evaluator=None,
                       files: RunFiles | None = None, episodes: int | None = None) -> list[float]:
    """Episode-by-episode differences b − a over runs paired by seed (and, where
    ``--group-by`` pools other settings in a group, by those: :func:`_twin`), where
    both runs were scored on the same episodes: the same dataset (its root
    aside), the same data (:func:`same_data`) and the same count, seed and
    episode stream version (``episodes`` episodes, default: the most both reach),
    and by the same metric (a retrieval evaluator's mAP less an accuracy measures nothing)."""
    files = files or RunFiles()
    grouped = tuple({**a.settings, **b.settings})  # what tells the groups apart; the rest pairs twins
    by_twin = {_twin(r, files, grouped): r for r in a.runs}
    out = []
    for run in b.runs:
        other = by_twin.get(_twin(run, files, grouped))
        if other is None or _data(files.config(run)) != _data(files.config(other)):
            continue
        count = episodes or shared_episodes([run, other], split, shots, ways, queries, evaluator, files)
        mine, theirs = (episode_accuracies(r, split, shots, ways, queries, evaluator, files, count)
                        for r in (run, other))
        if (mine and theirs and all(mine[k] == theirs[k] for k in ("episodes", "seed", "stream"))
                and same_data(mine, theirs) and mine.get("metric", "accuracy") == theirs.get("metric", "accuracy")):
            out += [x - y for x, y in zip(mine["accuracies"], theirs["accuracies"])]
    return out


def _twin(run: Run, files: RunFiles, grouped: tuple) -> tuple:
    """What a run is paired on: its seed and its settings outside ``grouped``, the keys
    groups are told by. Without ``--group-by`` those are all of them, so the seed alone;
    with it, a group pools runs of other settings too, and each pairs with its twin."""
    rest = run_settings(run, files.flat(run), None, "", leave_out=grouped)
    return _encode(files.config(run).get("seed")), tuple(sorted(rest.items()))


def same_data(a: dict, b: dict) -> bool:
    """Whether two saved evaluations were scored on the same data as far as they
    tell: the fingerprints of their split's images and labels are equal, or one
    has none (saved by an fslab that recorded none). A ``folder`` dataset's root
    is its data, and any dataset's files may change on disk between two runs."""
    return a.get("data") is None or b.get("data") is None or a["data"] == b["data"]


def data_of(run: Run, split: str, evaluator: str | None, files: RunFiles, shape: tuple | None = None) -> str | None:
    """The fingerprint of the data of the run's latest saved ``split`` evaluation by
    ``evaluator`` (default: its own) that has one; None where none has. With ``shape``
    (shots, ways, queries) only evaluations of that shape count: those are the scores
    compared, and a later ``fslab eval --data-root`` of another shape says nothing of them."""
    label = files.label(run, evaluator)
    found = [e for e in files.saved(run) if e["split"] == split and e["evaluator"] == label and "data" in e
             and (shape is None or (e["shots"] in shape[0] and (e["ways"], e["queries"]) == shape[1:]))]
    latest = max(found, key=lambda e: (e["epoch"], e["episodes"]), default=None)
    return latest["data"] if latest else None


def split_by_data(groups: list[Group], split: str, evaluator: str | None,
                  files: RunFiles, shape: tuple | None = None) -> tuple[list[Group], list[str]]:
    """Each group whose runs were scored on different data (:func:`data_of` differs:
    a ``folder`` dataset on other folders, files changed on disk) split into one group
    per data, so that no seeds of different data are pooled, nor taken for repeats.
    A part is labelled by its ``dataset.root`` where that tells the parts apart, else by
    its fingerprint's start; runs with none (older fslab) join the others where those
    share one data, else make a part of their own. Returns the groups and the labels split."""
    out, split_labels = [], []
    for g in groups:
        by_data: dict[str | None, list[Run]] = {}
        for run in g.runs:
            by_data.setdefault(data_of(run, split, evaluator, files, shape), []).append(run)
        if len([d for d in by_data if d is not None]) <= 1:
            out.append(g)
            continue
        roots = {d: {_encode((files.config(r).get("dataset") or {}).get("root")) for r in runs}
                 for d, runs in by_data.items()}
        by_root = all(len(r) == 1 for r in roots.values()) and len(set().union(*roots.values())) == len(roots)
        for d, runs in by_data.items():
            tag = (assignment("dataset.root", json.loads(next(iter(roots[d])))) if by_root
                   else f"data {d[:8]}" if d else "data unrecorded")
            out.append(Group(g.settings, runs, f"{g.label}, {tag}"))
        split_labels.append(g.label)
    return out, split_labels


def _data(config: dict) -> dict:
    """What decides a run's episodes' images: its dataset's settings, where it lies aside."""
    return {k: v for k, v in (config.get("dataset") or {}).items() if k != "root"}


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "−": r"$-$",
        "->": r"$\to$", "|": r"\textbar{}", "<": r"\textless{}", ">": r"\textgreater{}"}


def other_labels(runs: list[Run], split: str, shots: list[int], ways: int, queries: int, evaluator: str,
                 precision: str | None = None) -> list[str]:
    """The evaluator labels other than ``evaluator`` that ``runs`` saved scores of this shape by
    (``knn[k=3]`` where ``knn`` was asked for; in ``precision``, :class:`RunFiles`): what ``--evaluator``
    could read instead, those of the evaluator asked for (other parameters) first."""
    files, asked = RunFiles(precision), canonical_evaluator(evaluator)
    found = {e["evaluator"] for run in runs for e in files.saved(run)
             if (e["split"], e["ways"], e["queries"]) == (split, ways, queries) and e["shots"] in shots} - {asked}
    return sorted(found, key=lambda label: (label.partition("[")[0] != asked.partition("[")[0], label))


def no_scores_at_all(runs: list[Run], split: str, files: RunFiles | None = None) -> dict[str, str]:
    """Of ``runs``, each one with no saved ``split`` evaluation at all (of no shots, shape or evaluator:
    queued, running, or ended before its test), by id, with its state: what an error that no run has the
    scores asked for names (a run scored otherwise is named by the shapes or evaluators it has)."""
    files = files or RunFiles()
    return {run.id: run.state() for run in runs if not any(e["split"] == split for e in files.saved(run))}


def left_out_lines(report: dict, runs: list[Run] = ()) -> list[str]:
    """The runs :func:`compare` left out before pooling, a line for each reason, as every surface says them
    (fslab compare on stderr, the dashboard's compare screen in its note): a configuration that cannot be
    read, a folder deleted since its sweep's record named it (told by ``runs``' folders), a repeat of
    another run's settings and seed. The runs without scores are :func:`unscored_line`'s."""
    paths = {run.id: run.path for run in runs}
    gone = [i for i in report["unreadable"] if i in paths and not paths[i].is_dir()]
    reasons = [([i for i in report["unreadable"] if i not in gone], "each one whose configuration cannot be read"),
               (gone, "each one whose folder is gone, though its sweep's record names it"),
               (report["repeated"], "each repeating the settings and seed of another (the newest with results "
                                    "counts)")]
    return [f"{count(len(ids), 'run')} left out, {why}: {', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}"
            for ids, why in reasons if ids]


def unscored_line(report: dict) -> str | None:
    """The runs of a report with no scores of any shape (queued, running, or ended before their test), each
    with its state, as every surface names them; None where there are none."""
    if (unscored := report.get("unscored")) and (precision := report.get("precision")):  # compare --precision
        return (f"{count(len(unscored), 'run')} without {report['split']} scores of the network in {precision} "
                f"(left out): {unscored_text(unscored)}; "
                f"{score_in(list(unscored), precision, report.get('unscored_commands'), report.get('unevaluable'))}")
    if unscored:
        return f"{count(len(unscored), 'run')} without {report['split']} scores (left out): {unscored_text(unscored)}"
    return None


def score_in(run_ids: list[str], precision: str, commands: dict[str, str] | None = None,
             lacking: dict[str, str] | None = None) -> str:
    """How runs without scores of the network in ``precision`` get them, as compare and plot say it:
    ``score it so with: fslab eval ID --precision fp32`` (``each`` and every id for several); with
    ``commands`` (run id -> its fslab eval, as study report names them, of its cell's episodes), those, one
    naming every run where they differ only by the run; ``lacking`` (run id -> why fslab eval refuses it,
    :func:`unevaluable_runs`): for those, why instead (its first three), then the others' (``the other``)."""
    lacking = {i: lacking[i] for i in run_ids if i in (lacking or {})}
    scorable = [i for i in run_ids if i not in lacking]
    said = lacking_lines(lacking)
    if scorable:
        said.append(_score_with(scorable, precision, commands, others=bool(lacking)))
    return "; ".join(said)


def _score_with(run_ids: list[str], precision: str, commands: dict[str, str] | None, others: bool) -> str:
    """:func:`score_in`'s fslab eval of runs it can score; ``others``: some runs named beside them it cannot."""
    one = len(run_ids) == 1
    whom = ("the other" if one else "the others") if others else ("it" if one else "each")
    if commands and all(i in commands for i in run_ids):
        said = list(dict.fromkeys(commands[i] for i in run_ids))
        alike = {commands[i].replace(f" {i}", " RUN", 1) for i in run_ids}  # several alike but for the id: one
        said = [for_scorable(alike.pop(), run_ids)] if len(run_ids) > 1 and len(alike) == 1 else said
        return f"score {whom} so with: {'; '.join(said[:3])}{'; ...' if len(said) > 3 else ''}"
    return f"score {whom} so with: fslab eval {' '.join(run_ids)} --precision {precision}"


def lacking_lines(lacking: dict[str, str]) -> list[str]:
    """Why fslab eval refuses each run of ``lacking`` (run id -> its line, :func:`unevaluable_runs`), the lines
    alike but for the run said once for them all (``runs A, B each has no checkpoint yet (...)``), but those that
    name a command (``fslab run --like ID``: typed as said, it names the run), the first three so."""
    alike: dict[str, list[str]] = {}
    for run_id, why in lacking.items():
        alike.setdefault(why if "fslab " in why else why.replace(run_id, "RUN"), []).append(run_id)
    said = []
    for why, ids in alike.items():
        runs = f"{', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}"
        said.append(lacking[ids[0]] if len(ids) == 1 else f"runs {runs} each{why.removeprefix('run RUN')}"
                    if why.startswith("run RUN ") else f"{why} (RUN: {runs})")
    return said[:3] + (["..."] if len(said) > 3 else [])


def unevaluable_runs(runs: list[Run]) -> dict[str, str]:
    """Of ``runs``, each one fslab eval refuses to score (no checkpoint yet, none ever, a damaged one), by id,
    with its line (:func:`unevaluable`): what a report says of it in place of an fslab eval it would refuse."""
    return {run.id: why for run in runs if (why := unevaluable(run))}


def unscored_text(unscored: dict[str, str]) -> str:
    """Runs with no scores of any shape (run id -> state), as every surface names them:
    ``ID (queued), ID (failed)``, the first five and ``...`` for more."""
    named = [f"{run} ({state})" for run, state in unscored.items()]
    return ", ".join(named[:5]) + (", ..." if len(named) > 5 else "")


def no_results(split: str, ways: int, shots: str, queries: int, evaluator: str | None = None,
               shapes=(), asked: tuple = (None, None), labels=(), unscored: dict[str, str] | None = None,
               also=(), precision: str | None = None, runs: list[Run] = (),
               lacking: dict[str, str] | None = None, episodes: int | None = None) -> str:
    """What compare and plot say when no run has the scores asked for (``shots`` as given: ``1,5``),
    and the fslab eval that makes them: of this split and these shots, and of the ``asked``
    (--ways, --queries) where given (without them fslab eval takes each run's own shape), on ``episodes``
    where known (:func:`fewest_test_episodes`; fslab eval's default is the protocol's 10,000); ``labels``:
    the evaluators the runs have these scores by instead (:func:`other_labels`); ``unscored``: the
    runs with no scores at all, by their state (:func:`no_scores_at_all`), which the line names,
    since it is the only line said; ``also``: what else it says, the runs left out and why
    (:func:`left_out_lines`), a damaged saved evaluation (:func:`damaged_line`); ``precision``: that of
    the network whose scores were asked for (``--precision``), which the fslab eval names too; ``runs``: the
    runs the command named, of which each one fslab eval would refuse is said with its line after the
    ``unscored`` (``lacking``, :func:`unevaluable_runs` of them where not given); the fslab eval then names the
    runs it scores (:func:`for_scorable`), none where it would refuse every one, and "finish them" comes
    before it only where a run has not completed (a completed run's test is done: only fslab eval scores it)."""
    lacking = unevaluable_runs(runs) if lacking is None else lacking
    named = [run.id for run in runs]
    said = lacking_lines(lacking)
    by = f" by evaluator '{evaluator}'" if evaluator else ""
    by += f" of the network in {precision}" if precision else ""
    run_eval = "fslab eval RUN" + (f" --split {split}" if split != "test" else "") + (
        f" --shots {shots}" if shots != "1,5" else "") + "".join(
        f" {option} {value}" for option, value in zip(("--ways", "--queries"), asked) if value is not None)
    run_eval += f" --episodes {episodes}" if episodes else ""
    run_eval += f" --precision {precision}" if precision else ""
    run_eval += "".join(f" {flag}" for flag in evaluator_flags(evaluator))
    have = f"; they have them for {shapes_text(shapes)}" if shapes else ""
    if unscored:
        at_all = f"of the network in {precision}" if precision else "at all"
        have += f"; {count(len(unscored), 'run')} with no {split} scores {at_all}: {unscored_text(unscored)}"
    have += "".join(f"; {why}" for why in said)
    have += "".join(f"; {line}" for line in also if line)
    if labels:
        have += (f"; they have them by {', '.join(labels[:3])}{', ...' if len(labels) > 3 else ''}"
                 f" (--evaluator {shlex.quote(labels[0])})")
    refused = bool(lacking) and bool(named) and set(named) <= set(lacking)  # fslab eval would score none
    run_eval = for_scorable(run_eval, named, lacking) if named else run_eval
    finish = "finish them or " if not runs or any(run.state() != "completed" for run in runs) else ""
    return (f"none of these runs has saved {split} accuracies{by} for {ways}-way {shots}-shot, {queries_text(queries)}"
            f"{have}{'' if refused else f'; {finish}run: {run_eval}'}")


# What Markdown (CommonMark, GitHub's tables and strikethrough) would read as markup in a cell: | ends it,
# \ escapes, * _ ~ ` emphasise or quote, < & start HTML and entities, ] ( and ] [ close a link's text; _ only
# where it may open or close emphasis (not inside a word: train.weight_decay stays as written).
_MARKDOWN = re.compile(r"[\\|*~`<&]|\](?=[(\[])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md(text: str) -> str:
    """``text`` for a Markdown table's cell, escaped so that it renders as written (a label holds any text a
    setting holds: a ``|`` split its cell in two, ``[a](b)`` became a link, ``\\|`` a bare bar)."""
    return _MARKDOWN.sub(lambda m: "\\" + m.group(), text)


def tex(text: str) -> str:
    """Text as LaTeX writes it in a table cell: its special characters escaped
    (a label may hold any text a setting holds), ± and − as math, and so is the
    hyphen of a negative number (``-0.52``, a difference; ``lr=-1`` in a label), which
    LaTeX's text mode would set as a hyphen, shorter than a minus; ``|``, ``<`` and ``>`` by name,
    which LaTeX's default font encoding (OT1) sets as an em dash, ¡ and ¿; and a hyphen before
    another as ``-{}``, since LaTeX joins ``--`` into an en dash (``--lr`` in a label) and ``---`` an em dash."""
    return re.sub(r"->|[\\&%$#_{}~^±−|<>]|(?<![\w.-])-(?=\.?\d)|-(?=-)",
                  lambda m: _TEX.get(m.group(), r"-{}" if m.end() < len(text) and text[m.end()] == "-" else r"$-$"),
                  text)


def _csv(report: dict, shots: list[str]) -> str:
    """The report as CSV rows, a group's then a paired difference's (:func:`render`)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    # A group's row fills the accuracy columns; a paired difference's row (its
    # baseline named) fills only the difference columns, so no column holds both.
    columns = ([f"{s} {c}" for s in shots for c in ("accuracy", "ci95", "episodes")]
               + [f"{s} {c}" for s in shots for c in ("difference", "difference ci95", "difference episodes")])
    # The last column names what the numbers measure: accuracy, or a retrieval evaluator's map.
    metrics = {row["group"]: "/".join(sorted({r.get("metric", "accuracy") for r in row["results"].values()}))
               for row in report["groups"]}
    # Then what md's and latex's first line says, and the runs each cell pools (metric stays the last column).
    runs = [f"{s} runs" for s in shots]
    shape = ([report.get(k, "") for k in ("split", "ways", "queries")] + ["/".join(report.get("evaluators", ()))]
             + [report.get("precision") or ""])  # the --precision read; empty: each run's own
    writer.writerow(["group", "baseline", "seeds", *columns, *runs, "split", "ways", "queries", "evaluator",
                     "precision", "metric"])
    for row in report["groups"]:
        cells = {}
        for s, r in row["results"].items():
            cells |= {f"{s} accuracy": r["accuracy"], f"{s} ci95": r["ci95"], f"{s} episodes": r["episodes"],
                      f"{s} runs": r.get("runs", "")}
        writer.writerow([row["group"], "", row["seeds"], *[cells.get(c, "") for c in (*columns, *runs)], *shape,
                         metrics[row["group"]]])
    for group in dict.fromkeys(p["group"] for p in report["paired"]):
        cells = {}
        for p in report["paired"]:
            if p["group"] == group:
                s, baseline = f"{p['shots']}-shot", p["baseline"]
                cells |= {f"{s} difference": p["difference"], f"{s} difference ci95": p["ci95"],
                          f"{s} difference episodes": p["episodes"]}
        writer.writerow([group, baseline, "", *[cells.get(c, "") for c in (*columns, *runs)], *shape,
                         metrics.get(group, "")])
    return buffer.getvalue()


def caption(report: dict) -> str:
    """What the numbers are, the table's title and md's and latex's first line: the split, the episode
    shape, whose scores (the evaluator asked for, else each run's own; the precision asked for, else
    each run's own) and, where every cell pools as
    many, how many episodes (a paper's table says it; else each md or latex cell says its own)."""
    by = f"by {', '.join(report['evaluators'])}, " if report.get("evaluators") else ""
    by += f"network in {report['precision']}, " if report.get("precision") else ""
    counts = episode_counts(report)
    n = counts.pop() if len(counts) == 1 else None  # 20,000, as the cells write it where each says its own
    over = (f"{n:,} pooled episode{'' if n == 1 else 's'} per cell" if n is not None
            else "pooled episodes (each cell's count)")
    over += cut_text(report)
    return f"{report['split']}, {report['ways']}-way, {queries_text(report['queries'])}, {by}mean ± 95% CI over {over}"


def cut_text(report: dict) -> str:
    """Where runs scored on more were cut to the count every run reaches (:func:`shared_episodes`), that
    count and those runs, as the caption says them: ``, each run read on its first 4 episodes, the most every
    run reaches (2 runs scored on more, so cut: ID, ID)``; empty where no run was cut."""
    if not (cut := report.get("cut")):
        return ""
    per = set(report.get("episodes_per_run", {}).values())
    first = f"its first {per.pop():,} episodes" if len(per) == 1 else "its first N episodes, N"
    return (f", each run read on {first}, the most every run reaches ({count(len(cut), 'run')} scored on more, "
            f"so cut: {', '.join(cut[:5])}{', ...' if len(cut) > 5 else ''})")


def episode_counts(report: dict) -> set[int]:
    """The episode counts of the report's cells (a group's runs' episodes, pooled)."""
    return {r["episodes"] for row in report["groups"] for r in row["results"].values()}


def render(report: dict, fmt: str) -> str:
    """The report as a Markdown, LaTeX, CSV or JSON text (``table`` is drawn by the CLI)."""
    # the columns of --shots, in its order, as the table has them (a report without: those with scores)
    shots = ([f"{n}-shot" for n in report["shots"]] if "shots" in report else
             sorted({k for row in report["groups"] for k in row["results"]}, key=lambda k: int(k.split("-")[0])))
    if fmt == "json":
        return json.dumps(report, indent=2)
    if fmt == "csv":
        return _csv(report, shots)
    if fmt not in ("md", "latex"):
        raise UsageError(unknown_format(fmt, FORMATS))
    pm = " ± "
    header = ["group", "seeds", *shots]
    lines = []
    counted = len(episode_counts(report)) > 1  # cells of different counts: each says its own, as the caption says
    for row in report["groups"]:
        cells = [f"{metric_label(r)}{percent(r['accuracy'])}{pm}{percent(r['ci95'])}"
                 + (f" ({r['episodes']:,})" if counted else "") if (r := row["results"].get(s)) else "-"
                 for s in shots]
        lines.append([row["group"], str(row["seeds"]), *cells])
    # Each paired difference to the first group as a row of its own, in points with its sign.
    for group in dict.fromkeys(p["group"] for p in report["paired"]):
        by_shots = {f"{p['shots']}-shot": p for p in report["paired"] if p["group"] == group}
        baseline = next(iter(by_shots.values()))["baseline"]
        cells = [percent(p["difference"], sign=True) + f"{pm}{percent(p['ci95'])}" if (p := by_shots.get(s)) else "-"
                 for s in shots]
        lines.append([f"{group} − {baseline}, paired over the same episodes", "-", *cells])
    if fmt == "md":  # a line of its own before the table: a paragraph's last line would be read as its header
        # the group's text left, the numbers right, as the table and latex have them
        out = [md(caption(report)), "", "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
        out += ["| " + " | ".join(md(c) for c in cells) + " |" for cells in lines]
    else:
        out = [f"% {caption(report)}", "\\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
               " & ".join(header) + " \\\\", "\\hline"]
        out += [" & ".join(tex(c) for c in cells) + " \\\\" for cells in lines]
        out.append("\\end{tabular}")
    return "\n".join(out) + "\n"
