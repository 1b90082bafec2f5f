"""Study files, ``fslab study`` and the report's verdicts.

Fast tests: every built-in study parses and all its runs resolve at both
scales; the parser's one-line errors (and a property test that it never fails
otherwise); the verdict rule; a report on hand-made run folders; reuse of runs
done with the same settings. The slow tests run every built-in study at
``--scale quick`` end to end through the real CLI and worker processes, a test each.
"""

from __future__ import annotations

import copy
import csv
import datetime
import io
import json
import os
import re
import shutil
import time
import types
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fslab.core.errors import ConfigError, UsageError
from fslab.core.runstore import Run
from fslab.core.settings import Settings
from fslab.core.states import ENDED
from fslab.core.studies import find_study, parse_study
from fslab.core.study_plan import plan_runs, resolve_study, run_options
from fslab.execution.checks import check_run
from fslab.execution.studies import gpu_hours, queue_study
from fslab.reports.plot import y_label
from fslab.reports.studies import (
    NOT_COMPARABLE,
    NOT_PUBLISHED,
    NOT_REPRODUCED,
    PENDING,
    REPRODUCED,
    figure_data,
    render,
    scale_line,
    study_report,
    verdict,
    write_report,
)

from .runs_helpers import fslab, fslab_here, wait_for

BUILT_IN = ["lpn-table1", "map-table1", "map-table2", "nca-fig2", "nca-fig3", "nca-fig4", "nca-supcon",
            "nca-table3", "nca-table4", "sen-table2"]

# A small study on the synthetic dataset: two sweeps, one with a grid, and published cells.
TINY = {
    "name": "tiny",
    "title": "A tiny study",
    "table": "Table 9",
    "paper": {"authors": "A & B", "title": "A paper", "year": 2020, "arxiv": "2001.00001"},
    "sweep": [
        {"name": "nca", "label": "NCA", "method": "nca", "datasets": ["synthetic"], "seeds": 2,
         "set": {"backbone.name": "conv4", "backbone.hidden": 8, "train.epochs": 1}},
        {"name": "pn", "label": "ProtoNet", "method": "protonet", "datasets": ["synthetic"], "seeds": 2,
         "grid": {"train.lr": [0.1, 0.05]}, "set": {"backbone.name": "conv4", "train.epochs": 1}},
    ],
    "published": [
        {"sweep": "nca", "dataset": "synthetic", "shots": 1, "accuracy": 60.0, "ci95": 0.5},
        {"sweep": "nca", "dataset": "synthetic", "shots": 5, "accuracy": 80.0, "ci95": 0.5},
        {"sweep": "pn", "dataset": "synthetic", "shots": 5, "accuracy": 70.0, "at": {"train.lr": 0.1}},
    ],
}


def tiny(**changes) -> dict:
    data = copy.deepcopy(TINY)
    data.update(changes)
    return data


def store(tmp_path: Path) -> Settings:
    return Settings(runs_dir=tmp_path / "runs")


# -- built-in studies ------------------------------------------------------------


def test_every_built_in_study_is_registered(registry):
    assert registry.names("study") == BUILT_IN
    assert sorted(name for group in STUDY_GROUPS for name in group) == BUILT_IN  # each run end to end once
    described = registry.get("study", "nca-table3").describe()
    assert described["file"].endswith("nca-table3.toml") and "arXiv:2012.09831" in described["paper"]


@pytest.mark.parametrize("name", BUILT_IN)
@pytest.mark.parametrize("scale", ["paper", "quick"])
def test_every_built_in_study_parses_and_all_its_runs_resolve(registry, tmp_path, name, scale):
    study = find_study(registry, name)
    resolved = resolve_study(study, scale, settings=store(tmp_path), registry=registry)
    assert len(resolved) == study.run_count(scale) > 0
    for planned, config in resolved:
        assert config["method"] == study.sweep(planned.sweep).method and config["seed"] == planned.seed
        assert config["dataset"]["name"] == (planned.dataset if scale == "paper" else "synthetic")
    if scale == "quick":  # and the synthetic data can give every batch and episode (no files to look for)
        assert all(c["train"]["epochs"] == 1 and c["eval"]["test_episodes"] <= 50 for _, c in resolved)
        sizes: dict = {}
        for _, config in resolved:
            check_run({**config, "device": "cpu"}, registry, None, sizes_seen=sizes)
    for cell in study.published:  # every published cell has runs (check_cells ran inside resolve_study)
        assert any(p.place() == {"sweep": cell.sweep, "dataset": cell.dataset, "at": cell.at} for p, _ in resolved)


def test_published_numbers_are_the_papers(registry):
    """A few cells checked against the papers' tables (SPEC §7, the mAP paper's Table 2)."""
    table3 = {(c.sweep, c.dataset, c.shots): (c.accuracy, c.ci95) for c in find_study(registry, "nca-table3").published}
    assert table3[("nca", "miniimagenet", 1)] == (62.52, 0.24)
    assert table3[("protonet-snell", "cifar-fs", 5)] == (83.96, 0.16)
    assert table3[("simpleshot", "cifar-fs", 5)] == (84.50, 0.11)
    map2 = {(c.sweep, c.shots): (c.accuracy, c.ci95) for c in find_study(registry, "map-table2").published}
    assert map2[("map-ssvm", 1)] == (50.32, 0.80)
    table4 = {(c.sweep, c.shots): (c.accuracy, c.ci95) for c in find_study(registry, "nca-table4").published}
    assert table4[("nca", 5)] == (83.20, 0.18) and table4[("protonet-snell-1shot", 1)] == (65.45, 0.23)
    supcon = find_study(registry, "nca-supcon").published
    assert [(c.shots, c.accuracy, c.ci95) for c in supcon] == [(1, 51.05, None), (5, 63.36, None)]


# -- the parser ------------------------------------------------------------------


@pytest.mark.parametrize("change, expected", [
    ({"nme": "x"}, "nme: unknown key. Allowed: name, title"),
    ({"name": "Bad Name"}, "name: 'Bad Name' must match"),
    # it names the report's files: fslab study report said "cannot write the report into out (File name too long)"
    ({"name": "a" * 300}, f"name: '{'a' * 40}...' is 300 characters long; a study's name may have at most 100 (it "
                          "names the report's files): choose a shorter one"),
    ({"figure": "Fig. 1"}, "table: give exactly one of"),
    ({"paper": {"authors": "A", "title": "T", "year": 20}}, "paper.year: must be a whole number from 1900 to 2100"),
    ({"paper": {"authors": "A", "title": "T", "year": 2020, "arxiv": "abc"}}, "paper.arxiv: 'abc' must match"),
    ({"sweep": []}, "sweep: missing: at least one [[sweep]]"),
    # [sweep] (one table) where [[sweep]] was meant: it is there, not missing
    ({"sweep": {"name": "nca", "method": "nca", "datasets": ["synthetic"]}},
     "sweep: must be an array of tables: write [[sweep]] (two brackets) above each sweep, not [sweep]"),
    ({"published": [{"sweep": "ncaa", "dataset": "synthetic", "shots": 1, "accuracy": 1}]},
     "published[0].sweep: 'ncaa' names no sweep. Allowed: nca, pn"),
    ({"published": [{"sweep": "nca", "dataset": "omniglot", "shots": 1, "accuracy": 1}]},
     "published[0].dataset: 'omniglot' is not a dataset of sweep 'nca'. Allowed: synthetic"),
    ({"published": [{"sweep": "nca", "dataset": "synthetic", "shots": 1, "accuracy": 101}]},
     "published[0].accuracy: must be a number from 0 to 100 (percent)"),
    # a fraction where the papers print percent: every verdict would be "not reproduced"
    ({"published": [{"sweep": "nca", "dataset": "synthetic", "shots": 1, "accuracy": 0.652}]},
     "published[0].accuracy: is in percent, as the papers print it: 0.652 reads as 0.652%; write 65.2"),
    ({"published": [{"sweep": "pn", "dataset": "synthetic", "shots": 1, "accuracy": 1}]},
     "published[0].at.train.lr: missing: a published cell names one value of each grid key"),
    ({"published": [{"sweep": "pn", "dataset": "synthetic", "shots": 1, "accuracy": 1, "at": {"train.lr": 0.3}}]},
     "published[0].at.train.lr: 0.3 is not among the grid's values [0.1, 0.05]"),
    ({"quick": {"seeds": 0}}, "quick.seeds: must be a whole number at least 1, got 0"),
    ({"quick": {"grid": {"train.epochs": [1]}}}, "quick.grid.train.epochs: is no sweep's grid key (train.lr)"),
    ({"quick": {"grid": {"train.lr": []}}}, "quick.grid.train.lr: must be a non-empty list"),
    ({"quick": {"grid": {"train.lr": [0.1, 0.1]}}}, "quick.grid.train.lr: lists 0.1 twice"),
    ({"quick": {"grid": {"train.lr": [0.05]}}},
     "quick.grid.train.lr: leaves out 0.1, where a published cell of sweep 'pn' is placed"),
    ({"plot": {"x": "train.epochs"}}, "plot.x: 'train.epochs' is not a grid key of any sweep"),
    ({"split": "train"}, "split: must be one of test, val, got \"train\""),
    # a line break would cut the report's Markdown row or end its LaTeX comment line
    ({"title": "A tiny\nstudy"}, "title: must be one line without control characters"),
    ({"paper": {**TINY["paper"], "authors": "A &\tB"}}, "paper.authors: must be one line"),
    ({"quick": {"set": {"train.epochs": 1, "train": {"epochs": 2}}}},
     "quick.set.train.epochs: is given twice (once dotted, once in a nested table); keep one"),
    ({"cost": {"device": "H100"}}, "cost: must be an array of [[cost]] tables"),
    ({"cost": [{"device": "H100", "gpu_hours": 0, "date": "2026-11-26"}]},
     "cost[0].gpu_hours: must be a number of hours above 0, got 0"),
    ({"cost": [{"device": "H100", "gpu_hours": 1.5, "date": "26/11/2026"}]}, "cost[0].date: '26/11/2026' must match"),
    # a key left out said 'must be ..., got None', a word TOML does not have
    ({"title": None}, "title: missing: a non-empty string"),
    ({"paper": {"authors": "A", "title": "T"}}, "paper.year: missing: a whole number from 1900 to 2100"),
    # it said 'with authors, title, year and arxiv': a paper not on arXiv is a study too
    ({"paper": None}, "paper: missing: a [paper] table with authors, title and year (arxiv and venue if it has them)"),
    ({"published": [{"sweep": "nca", "dataset": "synthetic", "accuracy": 1}]},
     "published[0].shots: missing: a whole number at least 1"),
    ({"published": [{"sweep": "nca", "dataset": "synthetic", "shots": 1}]},
     "published[0].accuracy: missing: a number from 0 to 100 (percent)"),
    # a missing date or a date with a time of day said 'must be a non-empty string, got None'
    ({"cost": [{"device": "H100", "gpu_hours": 1.5}]},
     "cost[0].date: missing: the day the cost was measured, e.g. date = 2026-11-26"),
    ({"cost": [{"device": "H100", "gpu_hours": 1.5, "date": datetime.datetime(2026, 11, 26, 10)}]},
     "cost[0].date: must be a day, e.g. date = 2026-11-26 (a TOML date, or the same as a string), "
     "got 2026-11-26T10:00:00"),
    ({"cost": [{"device": "", "gpu_hours": 1.5, "date": "2026-11-26"}]}, "cost[0].device: must be a non-empty string"),
    ({"cost": [{"device": "H100", "gpu_hours": 1.5, "date": "2026-11-26", "hours": 2}]},
     "cost[0].hours: unknown key. Allowed: device, gpu_hours, date, how"),
])
def test_a_bad_study_file_is_one_line_naming_the_file_and_key(change, expected):
    with pytest.raises(ConfigError) as caught:
        parse_study(tiny(**change), "studies/tiny.toml")
    message = str(caught.value)
    assert message.startswith("studies/tiny.toml: ") and expected in message and "\n" not in message


@pytest.mark.parametrize("sweep_change, expected", [
    ({"seed": 3}, "sweep[0].seed: unknown key. Allowed: name, label, method"),
    ({"set": {"seed": 3}}, "sweep 'nca'.set.seed: is set by the study itself"),
    ({"grid": {"dataset.name": ["omniglot"]}}, "sweep 'nca'.grid.dataset.name: is set by the study itself"),
    ({"grid": {"train.lr": []}}, "sweep 'nca'.grid.train.lr: must be a non-empty list"),
    # a repeated value would plan one run twice and report its point twice; 1 and 1.0 are one value
    ({"grid": {"train.lr": [0.1, 0.05, 0.1]}}, "sweep 'nca'.grid.train.lr: lists 0.1 twice"),
    ({"grid": {"train.batch_size": [64, 64.0]}}, "sweep 'nca'.grid.train.batch_size: lists 64.0 twice"),
    ({"datasets": ["synthetic", "synthetic"]}, "sweep 'nca'.datasets: must be a non-empty list of distinct"),
    ({"label": "NCA\n(ours)"}, "sweep 'nca'.label: must be one line without control characters (it is printed in "
                                "a table or a heading), got \"NCA\\n(ours)\"; write it on one line"),
    ({"grid": {"train.epochs": [1, 2]}}, "sweep 'nca'.set.train.epochs: is also a grid key"),
    # a grid of tables sets the keys inside them: a set key, or the study's own dataset, given there too
    ({"grid": {"loss": [{"name": "nca"}, {"name": "supcon", "temperature": 0.5}]}, "set": {"loss.temperature": 0.2}},
     "sweep 'nca'.set.loss.temperature: is also a grid key"),
    ({"grid": {"dataset": [{"name": "omniglot"}]}}, "sweep 'nca'.grid.dataset.name: is set by the study itself"),
    # a TOML date or time: no setting takes one, and a run's config.json could not hold it
    ({"set": {"dataset.root": datetime.date(2026, 1, 1)}}, "sweep 'nca'.set: dataset.root = 2026-01-01 is a "
                                                             "TOML date or time, which no setting takes"),
    ({"grid": {"train.lr": [0.1, datetime.time(12, 30)]}}, "sweep 'nca'.grid: train.lr = 12:30:00 is a TOML "
                                                            "date or time, which no setting takes"),
])
def test_a_bad_sweep_is_one_line_naming_it(sweep_change, expected):
    data = tiny()
    data["sweep"][0].update(sweep_change)
    with pytest.raises(ConfigError, match="^studies/tiny.toml: ") as caught:
        parse_study(data, "studies/tiny.toml")
    assert expected in str(caught.value)


VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 3000) | st.floats(allow_nan=True) |
                      st.text(max_size=8), lambda inner: st.lists(inner, max_size=3) |
                      st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
PATHS = st.sampled_from([("name",), ("title",), ("table",), ("paper",), ("paper", "year"), ("paper", "arxiv"),
                         ("sweep",), ("sweep", 0, "datasets"), ("sweep", 0, "seeds"), ("sweep", 1, "grid"),
                         ("sweep", 0, "set"), ("quick",), ("published",), ("published", 0, "shots"),
                         ("published", 2, "at"), ("published", 1, "ci95"), ("plot",), ("split",), ("cost",)])


@settings(max_examples=300, deadline=None)
@given(path=PATHS, value=VALUES)
def test_the_parser_takes_any_value_anywhere_and_fails_only_in_one_line(path, value):
    data = tiny()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        study = parse_study(data, "any.toml")
    except ConfigError as error:
        assert str(error).startswith("any.toml: ") and "\n" not in str(error)
    else:
        assert study.run_count("paper") >= 1


def test_a_recorded_cost_is_shown_beside_the_estimate_from_the_store():
    import datetime

    from fslab.cli.studies import gpu_hours_note

    cost = {"device": "NVIDIA H200", "gpu_hours": 2.06, "date": datetime.date(2026, 11, 26), "how": "timed steps"}
    study = parse_study(tiny(cost=[cost]), "tiny.toml")  # a bare TOML date, as tomllib reads it
    assert [vars(c) for c in study.costs] == [{**cost, "date": "2026-11-26"}]
    recorded = "about 2.1 on one NVIDIA H200 (2026-11-26; timed steps)"
    nothing = {"hours": None, "estimated_runs": 0, "runs": 4, "measured_runs": []}
    assert gpu_hours_note(nothing, study.costs) == (
        f"GPU-hours: {recorded}, as the study records; not estimated from this store: no completed GPU run in it "
        "has the settings of these runs (seed and epochs aside).")
    assert gpu_hours_note(nothing, ()).endswith("and the study records no measured cost.")
    here = {"hours": 0.75, "estimated_runs": 3, "runs": 4, "measured_runs": ["a", "b"]}
    assert gpu_hours_note(here, study.costs).startswith("GPU-hours: about 0.8 for 3 of the 4 runs, from the wall "
                                                        "time per epoch of 2 completed GPU runs")
    assert gpu_hours_note(here, study.costs).endswith(f"The study records: {recorded}.")
    # the recorded costs are the paper scale's: fslab study show --scale quick gave them as the quick scale's
    assert gpu_hours_note(nothing, study.costs, "quick").startswith(
        f"GPU-hours: {recorded} for the paper scale, as the study records; not estimated from this store")
    assert gpu_hours_note(here, study.costs, "quick").endswith(f"The study records: {recorded} for the paper scale.")
    assert gpu_hours_note(nothing, (), "quick").endswith("and the study records no measured cost.")


# -- verdicts and reports ----------------------------------------------------------


def test_verdict_widens_fslab_ci_by_the_published_one():
    measured = {"accuracy": 0.60, "ci95": 0.004}  # 60.0 ± 0.4
    assert verdict(60.3, 0.2, measured, True) == REPRODUCED
    assert verdict(60.5, 0.2, measured, True) == REPRODUCED  # 0.5 <= 0.4 + 0.2
    assert verdict(60.7, 0.2, measured, True) == NOT_REPRODUCED
    assert verdict(60.5, None, measured, True) == NOT_REPRODUCED  # no published CI: not widened
    assert verdict(59.6, None, measured, True) == REPRODUCED
    assert verdict(60.0, 0.2, measured, False) == PENDING  # a run missing or unfinished
    assert verdict(60.0, 0.2, None, True) == PENDING
    assert verdict(None, None, measured, True) == NOT_PUBLISHED
    assert verdict(60.0, 0.2, measured, True, comparable=False) == NOT_COMPARABLE


def finish(run: Run, accuracies: dict[int, list[float]], ways: int = 5, split: str = "test",
           named: dict | None = None) -> None:
    """Make a queued run look finished: completed, with its checkpoint (a whole archive, all fslab eval checks
    before torch loads) and saved episodes of ``split`` per shots (``named``: more of the evaluation's record,
    the precision fslab eval --precision names, say)."""
    config = run.config()
    run.checkpoint_path.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(run.checkpoint_path, "w") as archive:
        archive.writestr("checkpoint/data.pkl", b"weights")
    for shots, scores in accuracies.items():
        run.save_accuracies({"split": split, "evaluator": "centroid", "ways": ways, "shots": shots,
                             "queries": config["eval"]["queries"], "episodes": len(scores), "seed": 0,
                             "stream": 2, "epoch": 1, "accuracy": sum(scores) / len(scores), "ci95": 0.0,
                             **(named or {})}, scores)
    run.write_status(state="completed", ended=time.time(), exit_code=0, pid=None)


def runs_of(outcome, runs_dir: Path, sweep_method: str) -> list[Run]:
    found = [Run(runs_dir / i) for i in outcome.created]
    return [r for r in found if r.config()["method"] == sweep_method]


def test_report_on_hand_made_runs_pools_seeds_and_gives_each_verdict(registry, tmp_path):
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    assert len(outcome.created) == study.run_count() == 6
    nca = runs_of(outcome, config.runs_dir, "nca")
    # seed 0 scores 0.6 and 0.8 on alternate episodes, seed 1 always 0.7: pooled 70.0 ± 1.96·0.0816/√8
    finish(nca[0], {1: [0.6, 0.8] * 2, 5: [0.8] * 4})
    finish(nca[1], {1: [0.7] * 4, 5: [0.9] * 4})
    report = study_report(study, config.runs_dir)
    assert report["scale"] == "paper" and report["comparable"]
    rows = {(r["sweep"], r["shots"], json.dumps(r["at"])): r for r in report["rows"]}
    one = rows[("nca", 1, "{}")]
    assert one["measured"]["accuracy"] == pytest.approx(0.70) and one["measured"]["episodes"] == 8
    assert one["measured"]["ci95"] == pytest.approx(1.96 * (0.005 ** 0.5) / 8 ** 0.5)
    assert one["difference"] == pytest.approx(10.0) and one["verdict"] == NOT_REPRODUCED
    five = rows[("nca", 5, "{}")]
    assert five["measured"]["accuracy"] == pytest.approx(0.85) and five["verdict"] == NOT_REPRODUCED
    assert rows[("pn", 5, '{"train.lr": 0.1}')]["verdict"] == PENDING  # its runs are still queued
    assert len(report["rows"]) == 3  # a table study shows its published cells only
    text = render(report, "md")
    assert "| NCA | synthetic | - | 5-way 1-shot | 60.00 ± 0.50 | 70.00 ± " in text and "(2/2 runs)" in text
    assert "Scale: paper" in text and "not reproduced" in text and "pending" in text
    # the numbers right-aligned, as in latex (they were left-aligned, where fslab compare's md aligns them right)
    assert "\n|---|---|---|---|---:|---:|---:|---|\n" in text
    assert "\\begin{tabular}{llllrrrl}" in render(report, "latex")


def test_two_sweeps_alike_but_for_an_ignored_setting_share_their_runs_and_the_report_says_so(registry, tmp_path):
    """Sweeps that differ only in what a study ignores (train.log_every) are one run per seed, queued once
    and counted once; the report shows each cell its pooled runs once (not the shared run twice), names
    the place it shares them with and says in its scale line that such cells are one measurement."""
    logged = {**TINY["sweep"][0], "name": "nca-logged", "label": "NCA logged",
              "set": {**TINY["sweep"][0]["set"], "train.log_every": 5}}
    cells = [{"sweep": s, "dataset": "synthetic", "shots": 1, "accuracy": 70.0, "ci95": 0.5}
             for s in ("nca", "nca-logged")]
    study = parse_study(tiny(sweep=[TINY["sweep"][0], logged], published=cells), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    assert len(outcome.created) == 2 and study.run_count() == 4
    for run, scores in zip((Run(config.runs_dir / i) for i in outcome.created), ([0.6, 0.8] * 2, [0.7] * 4)):
        finish(run, {1: scores})
    report = study_report(study, config.runs_dir)
    rows = {r["sweep"]: r for r in report["rows"]}
    for sweep, other in (("nca", "nca-logged"), ("nca-logged", "nca")):
        row = rows[sweep]
        assert sorted(row["run_ids"]) == sorted(outcome.created)
        assert (row["measured"]["runs"], row["measured"]["episodes"]) == (2, 8)
        assert row["measured"]["accuracy"] == pytest.approx(0.70)
        assert row["shared_with"] == [{"sweep": other, "dataset": "synthetic", "at": {}}]
    assert ("; 2 cells show runs another place of the study shares (places alike in every setting are one run), "
            "so such cells are one measurement shown in each, not independent results") in scale_line(report)
    # each such cell marked in md, latex and csv, where it read "(2/2 runs)" as an independent cell does
    note = ("[1] NCA, synthetic; NCA logged, synthetic: the same runs (places alike in every setting are one run), "
            "one measurement shown in each, not independent results")
    text = render(report, "md")
    assert text.count(" (2/2 runs) [1] |") == 2 and f"\n\n{note}\n" in text
    latex = render(report, "latex")
    assert latex.count(" (2/2 runs) [1] & ") == 2 and "\\multicolumn{8}{l}{[1] NCA, synthetic; NCA logged" in latex
    header, *lines = csv.reader(io.StringIO(render(report, "csv")))
    assert header[-2:] == ["shared_note", "shared_with"]
    assert [line[-2:] for line in lines] == [["1", "NCA logged, synthetic"], ["1", "NCA, synthetic"]]
    # json gave shared_with but neither the mark nor the note md, latex and csv carry: the same, computed once
    data = json.loads(render(report, "json"))
    assert [row["shared_note"] for row in data["rows"]] == [1, 1] and data["shared_notes"] == [note]


def test_the_notes_of_two_sweeps_of_one_label_tell_their_places_apart(registry, tmp_path):
    """At quick scale nca-table3's two ProtoNet (Snell setup) sweeps each train both datasets on synthetic: the
    notes under the table named each group's places by label and dataset alone, so its two notes were the same
    words ([1] and [2] both 'ProtoNet (Snell setup), miniimagenet; ProtoNet (Snell setup), cifar-fs'). They name
    the sweep beside a label another sweep has, as a figure's legend does."""
    sweeps = [{"name": name, "label": "ProtoNet", "method": "protonet", "datasets": ["synthetic", "synthetic-mini"],
               "seeds": 1, "set": {"backbone.name": "conv4", "train.epochs": 1, "train.lr": lr}}
              for name, lr in (("pn-1shot", 0.1), ("pn-5shot", 0.05))]
    cells = [{"sweep": f"pn-{shots}shot", "dataset": dataset, "shots": shots, "accuracy": 70.0}
             for shots in (1, 5) for dataset in ("synthetic", "synthetic-mini")]
    study = parse_study(tiny(sweep=sweeps, published=cells, quick={"seeds": 1, "dataset": "synthetic"}), "t.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "quick", settings=config, registry=registry)
    assert len(outcome.created) == 2
    for run in (Run(config.runs_dir / i) for i in outcome.created):
        finish(run, {1: [0.7] * 4, 5: [0.8] * 4})
    report = study_report(study, config.runs_dir)
    text = render(report, "md")
    notes = [line for line in text.splitlines() if line.startswith("[")]
    assert notes == [f"[{n}] ProtoNet (pn-{shots}shot), synthetic; ProtoNet (pn-{shots}shot), synthetic-mini: the "
                     f"same runs (places alike in every setting are one run), one measurement shown in each, not "
                     f"independent results" for n, shots in ((1, 1), (2, 5))]
    assert report["shared_notes"] == notes
    _, *lines = csv.reader(io.StringIO(render(report, "csv")))
    assert [line[-1] for line in lines] == ["ProtoNet (pn-1shot), synthetic-mini", "ProtoNet (pn-1shot), synthetic",
                                            "ProtoNet (pn-5shot), synthetic-mini", "ProtoNet (pn-5shot), synthetic"]


def test_report_reproduced_and_pending_for_a_partial_group(registry, tmp_path):
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    nca = runs_of(outcome, config.runs_dir, "nca")
    finish(nca[0], {1: [0.6] * 5, 5: [0.8] * 5})
    report = study_report(study, config.runs_dir)
    assert [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [PENDING, PENDING]  # 1 of 2 seeds
    finish(nca[1], {1: [0.6] * 5, 5: [0.8] * 5})
    report = study_report(study, config.runs_dir)
    assert [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [REPRODUCED, REPRODUCED]
    assert all(r["difference"] == pytest.approx(0.0) for r in report["rows"] if r["sweep"] == "nca")
    csv_text = render(report, "csv")
    assert csv_text.splitlines()[1].startswith("NCA,synthetic,,5,1,60.0,0.5,60.0,0.0,10,2,2,2,0.0,reproduced")
    latex = render(report, "latex")
    assert "\\begin{tabular}" in latex and "60.00 $\\pm$ 0.50" in latex
    # a completed seed whose scores are gone (a copy that left evaluations/ behind) adds nothing to the pool:
    # the verdict was given on the other seed's episodes, its row saying '(2/2 runs)'
    shutil.rmtree(nca[1].path / "evaluations")
    report = study_report(study, config.runs_dir)
    rows = [r for r in report["rows"] if r["sweep"] == "nca"]
    assert [(r["verdict"], r["completed"], r["scored"], r["measured"]["episodes"]) for r in rows] == [
        (PENDING, 2, 1, 5), (PENDING, 2, 1, 5)]
    assert "| 60.00 ± 0.00 (1/2 runs) | +0.00 | pending |" in render(report, "md")
    # csv said completed_runs 2 of expected_runs 2 beside the one run's mean, and pending without a why
    line = dict(zip(*[row.split(",") for row in render(report, "csv").splitlines()[:2]]))
    assert [line[k] for k in ("completed_runs", "scored_runs", "expected_runs", "episodes")] == ["2", "1", "2", "5"]


def test_seeds_scored_on_different_data_are_never_pooled_into_one_cell(registry, tmp_path):
    """A study's runs are reused whatever their data root, so one cell could hold a seed scored on a folder's
    old copy and one on its new copy: the report pooled them into one mean, where fslab compare splits them."""
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    nca = runs_of(outcome, config.runs_dir, "nca")
    for run, data in zip(nca, ["aaaa1111", "bbbb2222"]):
        finish(run, {1: [0.6] * 5, 5: [0.8] * 5})
        for saved in (run.path / "evaluations").iterdir():
            if "1shot" in saved.name:  # the 1-shot scores of the two seeds on two data, the 5-shot's on one
                saved.write_text(json.dumps({**json.loads(saved.read_text()), "data": data}))
    report = study_report(study, config.runs_dir)
    one, five = [r for r in report["rows"] if r["sweep"] == "nca"]
    assert (one["measured"], one["mixed_data"], one["verdict"]) == (None, True, NOT_COMPARABLE)
    assert five["measured"]["episodes"] == 10 and not five["mixed_data"] and five["verdict"] == REPRODUCED
    text = render(report, "md")
    assert "| 60.00 ± 0.50 | - (runs scored on different data) | - | not comparable |" in text
    assert "the runs of 1 cell were scored on different data" in scale_line(report)
    assert json.loads(render(report, "json"))["rows"][0]["mixed_data"] is True


def test_a_report_says_which_runs_ended_without_finishing_their_pending_cells(registry, tmp_path):
    """A run killed or failed left its cells 'pending' as if it were still training: nothing said that
    nothing would finish them."""
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    nca = runs_of(outcome, config.runs_dir, "nca")
    finish(nca[0], {1: [0.6] * 5, 5: [0.8] * 5})
    report = study_report(study, config.runs_dir)
    assert report["stopped"] == {} and "ended" not in scale_line(report)  # the rest queued: pending, and going
    nca[1].write_status(state="killed", ended=time.time(), exit_code=None, pid=None)
    # one run is spoken of as one ('1 run ended killed, so their cells stay pending until ... queues them')
    assert scale_line(study_report(study, config.runs_dir)).endswith(
        "; 1 run ended killed, so its cells stay pending until fslab study run queues it again.")
    pn = runs_of(outcome, config.runs_dir, "protonet")
    pn[0].write_status(state="failed", ended=time.time(), exit_code=1, pid=None, error="boom")
    report = study_report(study, config.runs_dir)
    assert report["stopped"] == {nca[1].id: "killed", pn[0].id: "failed"}
    assert [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [PENDING, PENDING]
    assert scale_line(report) == (f"Scale: paper; sweep {outcome.sweep_id}; 2 runs ended failed or killed, so their "
                                  f"cells stay pending until fslab study run queues them again.")
    assert json.loads(render(report, "json"))["stopped"] == report["stopped"]
    # a run deleted since (fslab delete; the record still places it) said nothing: its cells 'pending' for ever
    shutil.rmtree(nca[1].path)
    report = study_report(study, config.runs_dir)
    assert report["missing"] == [nca[1].id] and nca[1].id not in report["stopped"]
    assert [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [PENDING, PENDING]
    assert ("; 1 run of the study is gone from the store (deleted), so its cells stay pending until fslab study run "
            "creates it again") in scale_line(report)


def test_report_json_and_csv_give_every_accuracy_ci_and_difference_in_percent_and_say_so(registry, project):
    """JSON gave the published value, its CI and the difference in percent but fslab's mean and CI as
    fractions (60.0 beside 0.7); CSV gave all in percent without saying so. Both now name the unit."""
    import csv
    import io

    (project / "study.toml").write_text(LOCAL_STUDY)  # 3 seeds; published 5-shot 90.0 ± 0.3
    queued = queue_study(find_study(registry, "study.toml"), "paper", settings=store(project), registry=registry)
    runs = [Run(project / "runs" / i) for i in queued.created]
    finish(runs[0], {5: [0.8, 1.0] * 2})
    finish(runs[1], {5: [0.9] * 4})
    finish(runs[2], {5: [0.9] * 4})  # pooled: 90.0 ± 1.96·sd/√12, 4 of the 12 episodes 10 points off
    ci = 100 * 1.96 * (4 * 0.01 / 12) ** 0.5 / 12 ** 0.5
    out = fslab("study", "report", "study.toml", "--format", "json", cwd=project)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["rows"][0]
    assert (row["published_pct"], row["published_ci95_pct"], row["difference_pct"]) == (90.0, 0.3, 0.0)
    assert row["measured"]["accuracy_pct"] == 90.0 and row["measured"]["ci95_pct"] == pytest.approx(ci, abs=1e-4)
    assert row["measured"]["episodes"] == 12 and row["verdict"] == REPRODUCED
    assert not {"published", "published_ci95", "difference"} & set(row) and "accuracy" not in row["measured"]
    out = fslab("study", "report", "study.toml", "--format", "csv", cwd=project)
    assert out.returncode == 0, out.stderr
    [line] = csv.DictReader(io.StringIO(out.stdout))
    assert [line[k] for k in ("published_pct", "published_ci95_pct", "accuracy_pct", "difference_pct")] == [
        "90.0", "0.3", "90.0", "0.0"]
    assert float(line["ci95_pct"]) == row["measured"]["ci95_pct"]
    finish(runs[2], {5: [0.6] * 4})  # pooled 80.0: 10 points below
    row = json.loads(fslab("study", "report", "study.toml", "--format", "json", cwd=project).stdout)["rows"][0]
    assert row["difference_pct"] == pytest.approx(-10.0) and row["measured"]["accuracy_pct"] == pytest.approx(80.0)


def test_report_precision_pools_the_scores_of_the_networks_run_in_it_as_compare_reads_them(registry, project):
    """fslab study report took no --precision: it pooled each run's own scores, where fslab compare --precision
    fp32 reads those of the networks run in fp32. It reads them the same way, says so under the title and in csv
    and json, and names each completed run without them, with the fslab eval that scores it; its cells pending."""
    (project / "study.toml").write_text(LOCAL_STUDY)  # 3 seeds; published 5-shot 90.0 ± 0.3
    queued = queue_study(find_study(registry, "study.toml"), "paper", settings=store(project), registry=registry)
    runs = [Run(project / "runs" / i) for i in queued.created]
    for run, own in zip(runs, ("bf16", "fp32", "bf16")):  # the precision each run's start recorded
        run.metrics_path.write_text(json.dumps({"event": "start", "time": 1.0, "device": "cuda:0", "precision": own,
                                                "eval_precision": own}) + "\n")
    finish(runs[0], {5: [0.8, 1.0] * 2})
    finish(runs[0], {5: [0.9] * 4}, named={"precision": "fp32", "run_precision": "bf16"})  # fslab eval --precision
    finish(runs[1], {5: [0.9] * 4})
    finish(runs[2], {5: [0.6] * 4})

    def report(*args):
        done = fslab_here("study", "report", "study.toml", *args, cwd=project)
        assert done.returncode == 0, done.stderr
        return done

    own = report("--format", "json")
    data = json.loads(own.stdout)
    assert own.stderr == "" and data["precision"] is None and data["unscored"] == {}
    assert data["rows"][0]["measured"]["episodes"] == 12  # each run's own scores: the three runs'
    fp32 = report("--format", "json", "--precision", "fp32")
    data = json.loads(fp32.stdout)
    (row,) = data["rows"]
    assert (data["precision"], data["unscored"]) == ("fp32", {runs[2].id: "completed"})
    assert (row["measured"]["accuracy_pct"], row["measured"]["episodes"], row["scored"]) == (90.0, 8, 2)
    assert row["verdict"] == PENDING  # a seed without fp32 scores: no verdict on the others'
    assert fp32.stderr == (f"1 run without test scores of the network in fp32 (left out): {runs[2].id} (completed); "
                           f"score it so with: fslab eval {runs[2].id} --episodes 4 --precision fp32\n")
    md_text = report("--precision", "fp32").stdout
    assert (f"; scores of the network in fp32 (each run's own where it ran in fp32, else those fslab eval --precision "
            f"fp32 saved); 1 run without test scores of the network in fp32, so its cells stay pending (score it so "
            f"with: fslab eval {runs[2].id} --episodes 4 --precision fp32).") in md_text
    assert "| 90.00 ± 0.00 (2/3 runs) | +0.00 | pending |" in md_text
    [line] = csv.DictReader(io.StringIO(report("--format", "csv", "--precision", "fp32").stdout))
    assert (line["precision"], line["scored_runs"]) == ("fp32", "2")
    bf16 = json.loads(report("--format", "json", "--precision", "bf16").stdout)
    assert bf16["unscored"] == {runs[1].id: "completed"} and bf16["rows"][0]["measured"]["episodes"] == 8
    fp16 = report("--format", "json", "--precision", "fp16")  # no run has them: one line names all three
    assert fp16.stderr == (f"3 runs without test scores of the network in fp16 (left out): "
                           f"{', '.join(f'{i} (completed)' for i in sorted(run.id for run in runs))}; "
                           f"score each so with: fslab eval {' '.join(sorted(run.id for run in runs))} --episodes 2000 "
                           f"--precision fp16\n")
    bad = fslab_here("study", "report", "study.toml", "--precision", "fp64", cwd=project)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert bad.stderr.startswith("error: --precision must be one of auto, fp32, bf16, fp16, got \"fp64\"")
    # a run fslab eval would refuse (its checkpoint gone: copied here without it) is named with why, not a command
    runs[2].checkpoint_path.unlink()
    gone = report("--precision", "fp32")
    assert gone.stderr == (f"1 run without test scores of the network in fp32 (left out): {runs[2].id} (completed); "
                           f"run {runs[2].id} has no checkpoint (one is written after each epoch; it ended before its "
                           f"first); train it again with: fslab run --like {runs[2].id}\n")
    assert f"so its cells stay pending (run {runs[2].id} has no checkpoint" in gone.stdout


def test_a_study_run_whose_runs_are_all_done_points_at_the_report_not_the_queue(registry, project):
    """fslab study run again once every run is done said 'follow them with: fslab queue', where nothing is
    queued and no scheduler starts: the report is what is left to see."""
    (project / "study.toml").write_text(LOCAL_STUDY)
    queued = queue_study(find_study(registry, "study.toml"), "paper", settings=store(project), registry=registry)
    for run in (Run(project / "runs" / i) for i in queued.created):
        finish(run, {5: [0.9] * 4})
    done = fslab_here("study", "run", "study.toml", cwd=project)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("study my-paper (scale paper): 3 runs: 3 done already, 0 queued or running, ")
    assert second == f"every run is done; see the report: fslab study report {project / 'study.toml'}"


def test_cells_whose_completed_runs_lack_their_scores_name_the_fslab_eval_that_scores_them(registry, project):
    """A completed run without a cell's scores (a copy that left evaluations/ behind, a 10-way shape never
    scored) left the cell pending with nothing said: fslab study run reuses the run as done, so the study never
    finished. The line under the title, stderr and json name the fslab eval of each, of the cell's shape."""
    ten = '{ sweep = "nca", dataset = "synthetic", ways = 10, shots = 5, accuracy = 80.0 }, '
    (project / "study.toml").write_text(LOCAL_STUDY.replace(
        "seeds = 3", 'seeds = 3\nset = { "eval.extra_ways" = [10] }').replace("published = [", f"published = [{ten}"))
    queued = queue_study(find_study(registry, "study.toml"), "paper", settings=store(project), registry=registry)
    runs = [Run(project / "runs" / i) for i in queued.created]
    for run in runs[:2]:
        finish(run, {5: [0.9] * 4})
    finish(runs[0], {5: [0.8] * 4}, ways=10)
    finish(runs[2], {})  # evaluations/ left behind
    done = fslab_here("study", "report", "study.toml", "--format", "json", cwd=project)
    data = json.loads(done.stdout)
    lacking = sorted([runs[1].id, runs[2].id])  # in the order of the record, which keeps its runs sorted
    # of the cell's episode count: the 4 its scored runs share
    commands = [*(f"fslab eval {i} --ways 10 --episodes 4" for i in lacking), f"fslab eval {runs[2].id} --episodes 4"]
    assert data["to_score"] == commands
    assert [(row["ways"], row["unscored_runs"], row["verdict"]) for row in data["rows"]] == [
        (10, lacking, PENDING), (5, [runs[2].id], PENDING)]
    said = ("2 cells lack the scores of their completed runs (fslab study run reuses a completed run as done), so they "
            f"stay pending until fslab eval scores them: {'; '.join(commands)}")
    assert done.stderr == f"{said}\n"
    assert f"; {said}." in fslab_here("study", "report", "study.toml", cwd=project).stdout
    # a run fslab eval would refuse (its checkpoint damaged: copied here half-written) is named with why, not the
    # command it refuses, as the runs --precision finds without any scores are (it named fslab eval of it)
    whole = runs[2].checkpoint_path.read_bytes()
    runs[2].checkpoint_path.write_bytes(b"half a checkpoint")
    refused = fslab_here("study", "report", "study.toml", "--format", "json", cwd=project)
    data = json.loads(refused.stdout)
    why = data["unevaluable"][runs[2].id]
    assert why.startswith(f"the checkpoint of run {runs[2].id} is damaged"), why
    assert data["to_score"] == [f"fslab eval {runs[1].id} --ways 10 --episodes 4"]
    assert refused.stderr == (
        "2 cells lack the scores of their completed runs (fslab study run reuses a completed run as done), so they "
        f"stay pending until fslab eval scores them: fslab eval {runs[1].id} --ways 10 --episodes 4; {why}\n")
    runs[1].checkpoint_path.unlink()  # no command left: the lines of why alone
    refused = fslab_here("study", "report", "study.toml", "--format", "json", cwd=project)
    data = json.loads(refused.stdout)
    assert data["to_score"] == [] and data["unevaluable"][runs[2].id] == why
    assert data["unevaluable"][runs[1].id].startswith(f"run {runs[1].id} has no checkpoint (one is written")
    assert refused.stderr == ("2 cells lack the scores of their completed runs (fslab study run reuses a completed "
                              f"run as done), so they stay pending; {'; '.join(data['unevaluable'].values())}\n")
    finish(runs[1], {})
    runs[2].checkpoint_path.write_bytes(whole)
    # --precision fp32: a run without any fp32 scores is said once, with its own fslab eval (unscored); the cells
    # counted here are those of the other runs' commands
    finish(runs[0], {5: [0.9] * 4}, named={"precision": "fp32", "run_precision": "bf16"})
    for run in runs:
        run.metrics_path.write_text(json.dumps({"event": "start", "time": 1.0, "precision": "bf16",
                                                "eval_precision": "bf16"}) + "\n")
    fp32 = fslab_here("study", "report", "study.toml", "--precision", "fp32", "--format", "json", cwd=project)
    data = json.loads(fp32.stdout)
    assert sorted(data["unscored"]) == sorted([runs[1].id, runs[2].id])
    # no run of the cell has fp32 scores: the run's own eval.test_episodes (synthetic's 2,000)
    assert runs[0].config()["eval"]["test_episodes"] == 2000
    assert data["to_score"] == [f"fslab eval {runs[0].id} --ways 10 --episodes 2000 --precision fp32"]
    assert fp32.stderr.splitlines()[1] == (
        "1 cell lacks the scores of its completed runs (fslab study run reuses a completed run as done), so it stays "
        f"pending until fslab eval scores them: fslab eval {runs[0].id} --ways 10 --episodes 2000 --precision fp32")
    finish(runs[1], {5: [0.8] * 4}, ways=10)  # as the fslab eval named would
    finish(runs[2], {5: [0.9] * 4})
    finish(runs[2], {5: [0.8] * 4}, ways=10)
    done = fslab_here("study", "report", "study.toml", "--format", "json", cwd=project)
    assert (done.stderr, json.loads(done.stdout)["to_score"]) == ("", [])


def test_the_fslab_eval_a_cell_names_scores_the_episodes_its_other_runs_were_scored_on(registry, project):
    """The fslab eval named for a completed run lacking a cell's scores ran fslab eval's default, the protocol's
    10,000 episodes, beside seeds the quick scale tested on 50: the cell then pooled 10,050 episodes, one seed
    outweighing the other 200 to 1. It names --episodes of the count the cell's scored runs share, else the
    run's own eval.test_episodes, so the cell pools one count."""
    quick = '[quick]\nseeds = 2\ndataset = "synthetic"\n[quick.set]\n"eval.test_episodes" = 50\n'
    (project / "study.toml").write_text(LOCAL_STUDY.replace("seeds = 3", "seeds = 2") + quick)
    queued = queue_study(find_study(registry, "study.toml"), "quick", settings=store(project), registry=registry)
    runs = [Run(project / "runs" / i) for i in sorted(queued.created)]
    for run in runs:  # completed, evaluations/ left behind: no run scored yet, each its own eval.test_episodes
        finish(run, {})
    data = json.loads(fslab_here("study", "report", "study.toml", "--format", "json", cwd=project).stdout)
    assert data["to_score"] == [f"fslab eval {run.id} --episodes 50" for run in runs]
    finish(runs[0], {5: [0.9] * 12})  # scored on 12 episodes: the cell's count, whatever the configuration says
    data = json.loads(fslab_here("study", "report", "study.toml", "--format", "json", cwd=project).stdout)
    assert data["to_score"] == [f"fslab eval {runs[1].id} --episodes 12"]
    finish(runs[1], {5: [0.7] * 12})  # as the fslab eval named would
    (row,) = json.loads(fslab_here("study", "report", "study.toml", "--format", "json", cwd=project).stdout)["rows"]
    assert (row["measured"]["episodes"], row["measured"]["accuracy_pct"], row["unscored_runs"]) == (24, 80.0, [])


def test_the_fslab_eval_of_a_cell_none_scored_yet_asks_the_episodes_the_runs_own_test_drew(registry, project):
    """With no run of a cell scored yet, the fslab eval named asked for the configuration's eval.test_episodes:
    a finetune run's test in training draws at most finetune's 100 (a model-aware evaluator's default), so it
    asked for 10,000 fine-tuned episodes, a hundred times the run's own. It asks for the count the run's log
    says its test drew, and the configuration's where none was logged."""
    quick = '[quick]\nseeds = 2\ndataset = "synthetic"\n[quick.set]\n"eval.test_episodes" = 10000\n'
    (project / "study.toml").write_text(LOCAL_STUDY.replace("seeds = 3", "seeds = 2") + quick)
    queued = queue_study(find_study(registry, "study.toml"), "quick", settings=store(project), registry=registry)
    runs = [Run(project / "runs" / i) for i in sorted(queued.created)]
    for run in runs:  # completed, evaluations/ left behind
        finish(run, {})
    # the first run's log keeps its test, of 100 episodes, as a model-aware evaluator's training test draws
    run = runs[0]
    with run.metrics_path.open("a") as log:
        log.write(json.dumps({"event": "eval", "time": 1.0, "split": "test", "ways": 5, "shots": 5, "queries": 15,
                              "episodes": 100, "evaluator": "centroid", "accuracy": 0.5, "ci95": 0.01}) + "\n")
    data = json.loads(fslab_here("study", "report", "study.toml", "--format", "json", cwd=project).stdout)
    assert data["to_score"] == [f"fslab eval {runs[0].id} --episodes 100", f"fslab eval {runs[1].id} --episodes 10000"]


def test_a_cell_read_on_more_episodes_than_the_runs_own_test_says_so(registry, project):
    """fslab eval --episodes 8 of every run of a study tested on 4 made the cell read the 8-episode scores (as
    fslab compare reads the most every run shares), with nothing in the report to tell them from the runs' own
    test scores, which fslab runs shows and which stay beside them. The line under the title says it."""
    quick = '[quick]\nseeds = 2\ndataset = "synthetic"\n[quick.set]\n"eval.test_episodes" = 4\n'
    (project / "study.toml").write_text(LOCAL_STUDY.replace("seeds = 3", "seeds = 2") + quick)
    queued = queue_study(find_study(registry, "study.toml"), "quick", settings=store(project), registry=registry)
    runs = [Run(project / "runs" / i) for i in sorted(queued.created)]
    for run in runs:  # the training's own test
        finish(run, {5: [0.9] * 4})
    finish(runs[0], {5: [0.7] * 8})  # one run scored on more: the cell reads the 4 both share
    said = "1 cell reads each run on 8 episodes"
    first = fslab_here("study", "report", "study.toml", cwd=project).stdout
    assert said not in first and "| 90.00 ± 0.00 (2/2 runs) |" in first
    finish(runs[1], {5: [0.7] * 8})
    text = fslab_here("study", "report", "study.toml", cwd=project).stdout
    assert (f"; {said}, the scores fslab eval saved beside the runs' own test of 4 (every run of the cell has them; "
            f"fslab runs shows the runs' own).") in text
    assert "| 70.00 ± 0.00 (2/2 runs) |" in text
    assert [f.name for f in sorted((runs[0].path / "evaluations").iterdir())] == [
        "test-centroid-5way-5shot-15q-4ep-seed0-epoch1.json", "test-centroid-5way-5shot-15q-8ep-seed0-epoch1.json"]


def test_a_cell_whose_runs_share_no_episode_count_reads_each_on_the_count_all_reach(registry, project):
    """A seed scored only on fslab eval's default count (the 10,000 its earlier to_score command gave) beside one
    scored on its own test's: the cell pooled each on its most, one seed outweighing the other. It reads each on
    its first as many as every run reaches, one count, and the line under the title names the run cut."""
    quick = '[quick]\nseeds = 2\ndataset = "synthetic"\n[quick.set]\n"eval.test_episodes" = 4\n'
    (project / "study.toml").write_text(LOCAL_STUDY.replace("seeds = 3", "seeds = 2") + quick)
    queued = queue_study(find_study(registry, "study.toml"), "quick", settings=store(project), registry=registry)
    runs = [Run(project / "runs" / i) for i in sorted(queued.created)]
    finish(runs[0], {5: [0.9] * 4})
    finish(runs[1], {5: [0.7] * 4 + [0.1] * 8})
    said = ("the runs of 1 cell were scored on different episode counts, so its mean reads each on the 4 every run of "
            f"the cell reaches, cutting 1 run scored on more to its first: {runs[1].id}")
    text = fslab_here("study", "report", "study.toml", cwd=project).stdout
    assert f"; {said}." in " ".join(text.split()) and "| 80.00 ± 6.93 (2/2 runs) |" in text
    (row,) = json.loads(fslab_here("study", "report", "study.toml", "--format", "json", cwd=project).stdout)["rows"]
    assert (row["measured"]["episodes"], row["measured"]["episodes_per_run"]) == (8, 4)
    finish(runs[1], {5: [0.7] * 4})  # scored on the cell's count too: nothing cut
    text = fslab_here("study", "report", "study.toml", cwd=project).stdout
    assert "cutting" not in text and "| 80.00 ± 6.93 (2/2 runs) |" in text


@pytest.mark.parametrize("change", [
    {"places": "synthetic"}, {"places": {"RUN": "synthetic"}}, {"places": {"RUN": 5}}, {"places": {"RUN": None}},
    {"places": {"../../etc": []}}, {"scale": None}, {"scale": "huge"}, {"datasets": [1]}, {"datasets": "x"},
    {"datasets": {"synthetic": 5}}, {"changed": [1]}, {"created": "yesterday"}, {"created": float("inf")}])
def test_a_study_record_edited_out_of_shape_is_passed_over_for_the_last_good_one(registry, tmp_path, change):
    """Each of these was a traceback in fslab study report (a place naming ../../etc was read as a run)."""
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    nca = runs_of(outcome, config.runs_dir, "nca")
    for run in nca:
        finish(run, {1: [0.6] * 5, 5: [0.8] * 5})
    good = study_report(study, config.runs_dir)
    path = next((config.runs_dir / "sweeps").glob("sweep-*.json"))
    record = json.loads(path.read_text())
    places = change.get("places")
    if isinstance(places, dict) and "RUN" in places:  # the first run's places damaged
        places = {**record["places"], nca[0].id: places["RUN"]}
    edited = {**record, **change, **({"places": places} if "places" in change else {}),
              "id": record["id"] + "-edited", "created": change.get("created", record["created"] + 1)}
    (path.parent / f"{edited['id'] if isinstance(edited['id'], str) else 'x'}.json").write_text(json.dumps(edited))
    assert study_report(study, config.runs_dir) == good


def test_a_study_measured_on_the_validation_classes_scores_every_run_there(registry, tmp_path):
    """split = "val" (the NCA paper's Fig. 2 and 4): each run also tests its final network on the
    validation classes (eval.final_val), and the report pools those episodes, not the test's."""
    study = parse_study(tiny(split="val"), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    runs = [Run(config.runs_dir / i) for i in outcome.created]
    assert runs and all(r.config()["eval"]["final_val"] is True for r in runs)
    nca = runs_of(outcome, config.runs_dir, "nca")
    for run in nca:
        finish(run, {1: [0.9] * 4, 5: [0.95] * 4})  # the test split: not what this study reports
        finish(run, {1: [0.6] * 4, 5: [0.8] * 4}, split="val")
    report = study_report(study, config.runs_dir)
    rows = {(r["sweep"], r["shots"]): r for r in report["rows"]}
    assert rows[("nca", 1)]["measured"]["accuracy"] == pytest.approx(0.6)
    assert rows[("nca", 5)]["measured"]["accuracy"] == pytest.approx(0.8)
    assert [rows[("nca", n)]["verdict"] for n in (1, 5)] == [REPRODUCED, REPRODUCED]
    assert "accuracies on the validation classes, as the paper's" in render(report, "md")
    first = next(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert (first["verdict"], first["scale"], first["split"]) == ("reproduced", "paper", "val")
    # a study measured on the test split leaves the setting at its default
    table = queue_study(parse_study(tiny(), "tiny.toml"), "paper", settings=store(tmp_path / "b"),
                        registry=registry)
    assert all(Run(store(tmp_path / "b").runs_dir / i).config()["eval"]["final_val"] is False
               for i in table.created)


def test_a_study_never_run_is_all_pending(registry, tmp_path):
    study = parse_study(tiny(), "tiny.toml")
    report = study_report(study, tmp_path / "runs")
    assert report["scale"] is None and {r["verdict"] for r in report["rows"]} == {PENDING}
    assert "No runs yet" in render(report, "md")


def test_figure_study_reports_every_point_and_draws_a_png(registry, tmp_path):
    data = tiny(figure="Fig. 9", plot={"x": "train.lr"}, published=[])
    del data["table"]
    study = parse_study(data, "fig.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    for run in runs_of(outcome, config.runs_dir, "protonet"):
        lr = run.config()["train"]["lr"]
        finish(run, {1: [lr * 5] * 4, 5: [lr * 8] * 4})
    report = study_report(study, config.runs_dir)
    points = [(r["at"], r["shots"], r["verdict"]) for r in report["rows"] if r["sweep"] == "pn"]
    assert points == [({"train.lr": 0.1}, 1, NOT_PUBLISHED), ({"train.lr": 0.1}, 5, NOT_PUBLISHED),
                      ({"train.lr": 0.05}, 1, NOT_PUBLISHED), ({"train.lr": 0.05}, 5, NOT_PUBLISHED)]
    written = write_report(report, study, "md", tmp_path / "out", config.runs_dir)
    assert [p.name for p in written] == ["tiny.md", "tiny-synthetic.png"]
    assert written[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_figure_at_quick_scale_claims_no_verdict_its_rows_do_not_give(registry, tmp_path):
    """fslab study report nca-fig2 --scale quick said 'These numbers are not comparable to the paper's (verdict:
    not comparable)' above rows whose every verdict is 'not published' (a figure prints no numbers); a table
    at quick scale still names the verdict its rows give."""
    data = tiny(figure="Fig. 9", plot={"x": "train.lr"}, published=[], quick={"seeds": 1, "dataset": "synthetic"})
    del data["table"]
    config = store(tmp_path)
    for study in (parse_study(data, "fig.toml"), parse_study(tiny(quick={"seeds": 1}), "tiny.toml")):
        for run in (Run(config.runs_dir / i) for i in queue_study(study, "quick", settings=config,
                                                                    registry=registry).created):
            finish(run, {1: [0.5] * 4, 5: [0.7] * 4})
        report = study_report(study, config.runs_dir)
        verdicts = {row["verdict"] for row in report["rows"]}
        line = scale_line(report)
        if study.kind == "figure":
            assert verdicts == {NOT_PUBLISHED} and line.endswith(". These numbers are not comparable to the paper's.")
        else:
            assert verdicts == {NOT_COMPARABLE}
            assert line.endswith(". These numbers are not comparable to the paper's (verdict: not comparable).")


def test_a_figure_point_whose_first_seed_was_deleted_still_shows_the_others(registry, tmp_path):
    """A figure point's episode shapes were read from its first run only: with that seed deleted, the point
    was one pending row with no mean, though its other seeds were done and scored."""
    data = tiny(figure="Fig. 9", plot={"x": "train.lr"}, published=[])
    del data["table"]
    study = parse_study(data, "fig.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    first, second = runs_of(outcome, config.runs_dir, "nca")
    finish(second, {1: [0.6] * 4, 5: [0.8] * 4})
    shutil.rmtree(first.path)
    rows = [r for r in study_report(study, config.runs_dir)["rows"] if r["sweep"] == "nca"]
    assert [(r["shots"], (r["measured"] or {}).get("accuracy"), r["scored"], r["verdict"]) for r in rows] == [
        (1, pytest.approx(0.6), 1, PENDING), (5, pytest.approx(0.8), 1, PENDING)]


def test_a_report_that_fails_to_be_written_keeps_the_one_that_was_there(registry, tmp_path):
    """fslab study report --out wrote the report file in place: a write that failed midway (a full
    disk, here a limit on a file's size) left its first bytes where the whole earlier report was."""
    import resource

    study = parse_study(tiny(), "tiny.toml")
    report = study_report(study, tmp_path / "runs")
    (tmp_path / "out").mkdir()
    earlier = tmp_path / "out" / "tiny.md"
    earlier.write_text("the earlier report\n" * 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
    try:
        with pytest.raises(OSError):
            write_report(report, study, "md", tmp_path / "out", tmp_path / "runs")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert earlier.read_text() == "the earlier report\n" * 20
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tiny.md"]
    assert write_report(report, study, "md", tmp_path / "out", tmp_path / "runs") == [earlier]
    assert "No runs yet" in earlier.read_text()
    # the command says which folder it could not write (it said only "error: File too large")
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "fslab", "study", "report", "map-table1", "--out", "rep"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard)))
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "error: cannot write the report into rep (File too large); name a folder this user can write with "
        "--out DIR"], result.stderr
    assert list((tmp_path / "rep").iterdir()) == []


def test_a_figure_trained_on_other_data_says_so_in_its_title():
    from fslab.reports.studies import figure_title

    study = types.SimpleNamespace(what="Fig. 3")
    quick = {"scale": "quick", "datasets": {"miniimagenet": "synthetic"}}
    title = figure_title(quick, study, "miniimagenet")
    assert title == "Fig. 3 (miniimagenet, trained and tested on synthetic, scale quick)"
    paper = {"scale": "paper", "datasets": {"miniimagenet": "miniimagenet"}}
    assert figure_title(paper, study, "miniimagenet") == "Fig. 3 (miniimagenet, scale paper)"


def test_settings_changed_on_the_command_line_make_the_report_not_comparable(registry, tmp_path):
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry,
                          extra=({"train": {"weight_decay": 0.0}}, {"device": "cpu"}))
    for run in runs_of(outcome, config.runs_dir, "nca"):
        finish(run, {1: [0.6] * 5, 5: [0.8] * 5})
    report = study_report(study, config.runs_dir)
    assert report["changed"] == {"train.weight_decay": 0.0} and not report["comparable"]
    assert [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [NOT_COMPARABLE, NOT_COMPARABLE]
    assert "with train.weight_decay=0.0 from the command line" in render(report, "md")
    # a --set of what the runs have anyway (the study's own epochs, the default weight decay) changes nothing:
    # the same runs, reused, are comparable (they were 'not comparable' with it, 'reproduced' without it)
    again = queue_study(study, "paper", settings=config, registry=registry,
                        extra=({"train": {"weight_decay": 0.0}}, {"train": {"epochs": 1}}))
    assert again.created == [] and len(again.reused) == 2
    report = study_report(study, config.runs_dir)
    assert report["changed"] == {"train.weight_decay": 0.0}  # train.epochs=1 is the study's own
    plain = queue_study(study, "paper", settings=config, registry=registry, extra=({"train": {"epochs": 1}},))
    assert plain.created != [] and len(plain.reused) == 0
    for run in runs_of(plain, config.runs_dir, "nca"):
        finish(run, {1: [0.6] * 5, 5: [0.8] * 5})
    report = study_report(study, config.runs_dir)
    assert report["changed"] == {} and [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [
        REPRODUCED, REPRODUCED]
    assert "command line" not in render(report, "md")


def test_runs_queued_before_the_study_file_was_edited_are_not_comparable_and_said_so(registry, tmp_path):
    """The report gave verdicts on the runs of the last fslab study run even after the file's sweeps
    changed (more epochs, say): runs of settings the file no longer asks for. Each record keeps a digest
    of what the study trains; an edit of only its words or published numbers leaves it."""
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    for run in runs_of(queue_study(study, "paper", settings=config, registry=registry,
                                   extra=({"device": "cpu"},)), config.runs_dir, "nca"):
        finish(run, {1: [0.6] * 5, 5: [0.8] * 5})
    assert [r["verdict"] for r in study_report(study, config.runs_dir)["rows"] if r["sweep"] == "nca"] == [
        REPRODUCED, REPRODUCED]
    worded = tiny(title="Retitled", published=[{**c, "ci95": 0.4} for c in TINY["published"]])
    worded["sweep"] = [{**TINY["sweep"][0], "label": "NCA (ours)"}, TINY["sweep"][1]]
    report = study_report(parse_study(worded, "tiny.toml"), config.runs_dir)
    assert report["comparable"] and not report["edited"]
    edited = tiny(sweep=[{**TINY["sweep"][0], "set": {**TINY["sweep"][0]["set"], "train.epochs": 2}},
                         TINY["sweep"][1]])
    report = study_report(parse_study(edited, "tiny.toml"), config.runs_dir)
    assert report["edited"] and not report["comparable"]
    assert [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [NOT_COMPARABLE, NOT_COMPARABLE]
    assert ("its runs were queued before the study file's sweeps were last edited (fslab study run queues what "
            "the file asks now)") in render(report, "md")


def test_settings_fslab_toml_changes_make_the_report_not_comparable_and_are_named(registry, tmp_path):
    """[run] of fslab.toml reaches a study's runs as it reaches fslab run's (below
    what the study sets); what it changes of them (not where runs go: device) is
    recorded and reported as --set's changes are."""
    study = parse_study(tiny(), "tiny.toml")
    config = Settings(runs_dir=tmp_path / "runs", run={"device": "cpu", "train": {"epochs": 3, "momentum": 0.5},
                                                        "eval": {"test_episodes": 100}})
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    assert outcome.project == {"eval.test_episodes": 100, "train.momentum": 0.5}  # the study sets train.epochs
    for run in runs_of(outcome, config.runs_dir, "nca"):
        assert (run.config()["train"]["epochs"], run.config()["train"]["momentum"]) == (1, 0.5)
        finish(run, {1: [0.6] * 5, 5: [0.8] * 5})
    report = study_report(study, config.runs_dir)
    assert report["project"] == {"eval.test_episodes": 100, "train.momentum": 0.5} and not report["comparable"]
    assert [r["verdict"] for r in report["rows"] if r["sweep"] == "nca"] == [NOT_COMPARABLE, NOT_COMPARABLE]
    assert "with eval.test_episodes=100, train.momentum=0.5 from [run] of fslab.toml" in render(report, "md")
    # a [run] that sets only where runs go, or what the study sets anyway, changes nothing
    same = Settings(runs_dir=tmp_path / "runs2", run={"device": "cpu", "train": {"epochs": 3}})
    assert queue_study(study, "paper", settings=same, registry=registry).project == {}
    report = study_report(study, tmp_path / "runs2", "paper")
    assert report["comparable"] and "fslab.toml" not in render(report, "md")
    assert scale_line(study_report(study, tmp_path / "runs2", "quick")) == (
        "No runs yet (fslab study run has not been run for this study at scale quick): every cell is pending.")


def test_a_figure_never_run_lists_its_points_as_pending(registry, tmp_path):
    data = tiny(figure="Fig. 9", plot={"x": "train.lr"}, published=[])
    del data["table"]
    report = study_report(parse_study(data, "fig.toml"), tmp_path / "runs")
    assert [(r["sweep"], r["at"], r["shots"], r["verdict"]) for r in report["rows"]] == [
        ("nca", {}, None, PENDING), ("pn", {"train.lr": 0.1}, None, PENDING), ("pn", {"train.lr": 0.05}, None, PENDING)]
    assert "| ProtoNet | synthetic | train.lr=0.05 | - | - | - | - | pending |" in render(report, "md")


def test_a_pair_fraction_figure_places_protonets_by_the_pairs_they_used(registry, tmp_path):
    """Fig. 3: NCA by its configured loss.pair_fraction, ProtoNets by the measured fraction."""
    data = tiny(figure="Fig. 3", plot={"x": "loss.pair_fraction"}, published=[])
    del data["table"]
    data["sweep"][0]["grid"] = {"loss.pair_fraction": [0.5, 1.0]}
    data["sweep"][1].pop("grid")
    study = parse_study(data, "fig3.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    for run in (Run(config.runs_dir / i) for i in outcome.created):
        finish(run, {5: [0.5] * 4})
        # 20 ways × (5 + 15) images = 400 rows, 79,800 pairs: 7,980 used is a tenth
        with open(run.metrics_path, "a") as log:
            log.write(json.dumps({"event": "train", "step": 1, "epoch": 1, "loss": 1.0, "positives": 1500,
                                  "negatives": 6480}) + "\n")
    report = study_report(study, config.runs_dir)
    figure = figure_data(report, study, config.runs_dir)["synthetic"]
    lines = {line["label"]: [p["x"] for p in line["points"]] for line in figure["panels"][-1]["series"]}
    assert lines == {"NCA": [0.5, 1.0], "ProtoNet": [pytest.approx(0.1)]}
    # --precision fp32: the scores fslab eval --precision fp32 saved beside the runs' own, the y axis saying so
    for run in (Run(config.runs_dir / i) for i in outcome.created):
        finish(run, {5: [0.25] * 4}, named={"precision": "fp32", "run_precision": "bf16"})
    fp32 = figure_data(study_report(study, config.runs_dir, precision="fp32"), study, config.runs_dir)["synthetic"]
    assert {p["accuracy"] for line in fp32["panels"][-1]["series"] for p in line["points"]} == {0.25}
    assert (y_label(figure), y_label(fp32)) == ("accuracy (%), mean ± 95% CI",
                                                "accuracy (%), network in fp32, mean ± 95% CI")


def test_a_figure_of_models_tested_at_several_ways_has_a_panel_per_episode_shape(registry, tmp_path):
    """eval.extra_ways in a figure study: 5- and 20-way points are never drawn in one panel."""
    data = tiny(figure="Fig. 9", plot={"x": "train.lr"}, published=[])
    del data["table"]
    data["sweep"] = data["sweep"][1:]  # ProtoNet at two learning rates
    data["sweep"][0]["set"]["eval.extra_ways"] = [20]
    study = parse_study(data, "fig.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    for run in (Run(config.runs_dir / i) for i in outcome.created):
        lr = run.config()["train"]["lr"]
        finish(run, {1: [lr + 0.5] * 4, 5: [lr + 0.7] * 4})
        finish(run, {1: [lr + 0.2] * 4, 5: [lr + 0.3] * 4}, ways=20)
    figure = figure_data(study_report(study, config.runs_dir), study, config.runs_dir)["synthetic"]
    drawn = {(p["ways"], p["shots"]): [(q["x"], q["accuracy"]) for q in p["series"][0]["points"]]
             for p in figure["panels"]}
    assert list(drawn) == [(5, 1), (5, 5), (20, 1), (20, 5)]
    for (ways, shots), offset in {(5, 1): 0.5, (5, 5): 0.7, (20, 1): 0.2, (20, 5): 0.3}.items():
        assert drawn[(ways, shots)] == [(0.05, pytest.approx(0.05 + offset)), (0.1, pytest.approx(0.1 + offset))]


def test_a_difference_that_rounds_to_zero_is_unsigned_in_every_format(registry, tmp_path):
    """0.57 of the episodes against a published 57.0 is 56.99999999999999 - 57.0: csv and json gave -0.0."""
    data = tiny(published=[{"sweep": "nca", "dataset": "synthetic", "shots": 1, "accuracy": 57.0}])
    study = parse_study(data, "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    for run in runs_of(outcome, config.runs_dir, "nca"):
        finish(run, {1: [0.57] * 4})
    report = study_report(study, config.runs_dir)
    assert -1e-9 < report["rows"][0]["difference"] < 0  # the noise this is about
    assert ",0.0,reproduced," in render(report, "csv").splitlines()[1]
    assert '"difference_pct": 0.0,' in render(report, "json")
    assert "| +0.00 | reproduced |" in render(report, "md")


def test_a_reports_difference_is_its_measured_cell_less_the_published_one(registry, tmp_path):
    """The difference column rounded the float 100 * 0.35125 - 35.0 its own way (+0.12) while the measured cell
    beside it, rounded as every score is, said 35.13 against a published 35.00: the row did not add up."""
    data = tiny(published=[{"sweep": "nca", "dataset": "synthetic", "shots": 1, "accuracy": 35.0}])
    study = parse_study(data, "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    for run in runs_of(outcome, config.runs_dir, "nca"):
        finish(run, {1: [0.3, 0.4025, 0.3, 0.4025]})  # mean 0.35125, a tie at two decimals of percent
    line = next(row for row in render(study_report(study, config.runs_dir), "md").splitlines() if "35.13" in row)
    assert "| 35.00 | 35.13 ± " in line and "| +0.13 |" in line, line


def test_two_sweeps_of_one_label_are_two_lines_of_a_figure(registry, tmp_path):
    """Two sweeps labelled alike (as nca-table3's two 'ProtoNet (Snell setup)' sweeps are) were one line in a
    figure, their points at each x drawn one after the other along it."""
    data = tiny(figure="Fig. 9", plot={"x": "train.lr"}, published=[])
    del data["table"]
    second = copy.deepcopy(data["sweep"][1])
    second["name"], second["set"]["eval.center"] = "pn-raw", False
    data["sweep"] = [data["sweep"][1], second]  # both labelled ProtoNet, at two learning rates each
    study = parse_study(data, "fig.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    for run in (Run(config.runs_dir / i) for i in outcome.created):
        offset = 0.1 if run.config()["eval"]["center"] else 0.0
        finish(run, {5: [run.config()["train"]["lr"] + offset] * 4})
    figure = figure_data(study_report(study, config.runs_dir), study, config.runs_dir)["synthetic"]
    lines = {line["label"]: [(p["x"], p["accuracy"]) for p in line["points"]]
             for line in figure["panels"][-1]["series"]}
    assert lines == {"ProtoNet (pn)": [(0.05, pytest.approx(0.15)), (0.1, pytest.approx(0.2))],
                     "ProtoNet (pn-raw)": [(0.05, pytest.approx(0.05)), (0.1, pytest.approx(0.1))]}


def test_gpu_hours_come_only_from_completed_gpu_runs_with_the_same_settings(registry, tmp_path):
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    nca = runs_of(outcome, config.runs_dir, "nca")
    for run, device in zip(nca, ("cuda:0", "cpu")):
        finish(run, {1: [0.5], 5: [0.5]})
        run.write_status(started=1000.0, ended=1000.0 + 1800.0)  # 1 epoch in 30 minutes
        with open(run.metrics_path, "a") as log:
            log.write(json.dumps({"event": "start", "device": device, "epochs": 1}) + "\n")
    twice = parse_study(tiny(sweep=[{**TINY["sweep"][0], "set": {**TINY["sweep"][0]["set"], "train.epochs": 4}}],
                             published=[]), "tiny.toml")
    estimate = gpu_hours(resolve_study(twice, "paper", settings=config, registry=registry), config.runs_dir)
    # both seeds match the GPU run (seed and epochs aside): 2 runs × 4 epochs × 0.5 h; the CPU run is no measure
    assert estimate == {"hours": pytest.approx(4.0), "estimated_runs": 2, "runs": 2, "measured_runs": [nca[0].id]}
    estimate = gpu_hours(resolve_study(study, "paper", settings=config, registry=registry), config.runs_dir)
    assert estimate["estimated_runs"] == 2 and estimate["runs"] == 6  # the ProtoNet runs have no measure
    nca[0].write_status(resumed=2000.0)
    again = gpu_hours(resolve_study(study, "paper", settings=config, registry=registry), config.runs_dir)
    assert again["hours"] is None  # a resumed run's wall time is no measure


def test_gpu_hours_price_each_run_the_study_trains_once(project, registry):
    """nca-table3 at quick scale trains 5 runs for its 10 places (both datasets on synthetic), and fslab study
    show said so above a GPU-hours line priced per place: 'about 1.0 for 10 of the 10 runs', twice the 0.5 h its
    5 runs take, and 'the other 0 runs have no such run to measure them by' where every run had one."""
    from fslab.core.studies import find_study

    config = Settings(runs_dir=project / "runs")
    study = find_study(registry, "nca-table3")
    outcome = queue_study(study, "quick", settings=config, registry=registry)
    assert len(outcome.created) == 5
    for run in (Run(config.runs_dir / i) for i in outcome.created):
        finish(run, {1: [0.5], 5: [0.5]})
        run.write_status(started=1000.0, ended=1000.0 + 360.0)  # 1 epoch in 6 minutes
        with open(run.metrics_path, "a") as log:
            log.write(json.dumps({"event": "start", "device": "cuda:0", "epochs": 1}) + "\n")
    estimate = gpu_hours(resolve_study(study, "quick", settings=config, registry=registry), config.runs_dir)
    assert (estimate["hours"], estimate["estimated_runs"], estimate["runs"]) == (pytest.approx(0.5), 5, 5)
    shown = json.loads(fslab_here("study", "show", "nca-table3", "--scale", "quick", "--json", cwd=project).stdout)
    assert (shown["runs"], shown["places"], shown["gpu_hours"]["runs"]) == (5, 10, 5)
    assert shown["gpu_hours_note"] == ("GPU-hours: about 0.5 for 5 of the 5 runs, from the wall time per epoch of 5 "
                                       "completed GPU runs in this store with the same settings (seed and epochs "
                                       "aside).")


# -- running: reuse --------------------------------------------------------------


def test_runs_done_with_the_same_settings_are_reused_not_repeated(registry, tmp_path):
    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    first = queue_study(study, "paper", settings=config, registry=registry)
    runs = [Run(config.runs_dir / i) for i in first.created]
    finish(runs[0], {1: [0.5], 5: [0.5]})
    runs[1].write_status(state="failed", ended=time.time(), exit_code=1, pid=None, error="boom")
    again = queue_study(study, "paper", settings=config, registry=registry)
    assert again.created == [] and again.reused == [runs[0].id] and again.requeued == [runs[1].id]
    assert sorted(again.in_progress) == sorted(r.id for r in runs[2:])
    assert runs[1].status()["state"] == "queued" and {r.id for r in again.to_start} == {runs[1].id}
    # another setting is another run; the device is not a setting
    other = queue_study(study, "paper", settings=config, registry=registry,
                        extra=({"train": {"weight_decay": 0.0}}, {"device": "cpu"}))
    assert len(other.created) == 6 and other.reused == []
    device_only = queue_study(study, "paper", settings=config, registry=registry, extra=({"device": "cpu"},))
    assert device_only.created == [] and device_only.reused == [runs[0].id]
    # nor the number of processes: --gpus N trains as one process would
    gpus_only = queue_study(study, "paper", settings=config, registry=registry,
                            extra=({"device": "cpu", "train": {"processes": 2}},))
    assert gpus_only.created == [] and gpus_only.reused == [runs[0].id]
    # a failed run reused keeps its own processes when queued again: the slots must hold it
    saved = json.loads((runs[1].path / "config.json").read_text())
    saved["train"]["processes"] = 3
    (runs[1].path / "config.json").write_text(json.dumps(saved))
    runs[1].write_status(state="failed", ended=time.time(), exit_code=1, pid=None, error="boom")
    with pytest.raises(UsageError, match=r"--gpus 3 \(train.processes\) needs 3 slots .* but the scheduler has 1 "
                                         r"CPU slot"):
        queue_study(study, "paper", settings=config, registry=registry)
    assert runs[1].status()["state"] == "failed"  # refused before anything was queued again


def test_an_interrupted_queueing_leaves_no_run_queued_unrecorded(registry, tmp_path, monkeypatch):
    """Ctrl-C while fslab study run created the runs left those created so far queued with no sweep record
    (the next scheduler of the project, another sweep's, trained them unasked) and the one being written
    without its status.json. Now they are withdrawn; a run done before is kept, and the same call queues all."""
    from fslab.core import runstore
    from fslab.execution import studies

    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    first = queue_study(study, "paper", settings=config, registry=registry)
    kept = Run(config.runs_dir / first.created[0])
    finish(kept, {1: [0.5], 5: [0.5]})
    for run_id in first.created[1:]:
        shutil.rmtree(config.runs_dir / run_id)
    shutil.rmtree(config.runs_dir / "sweeps")
    calls = []
    original, original_record = Run.write_status, studies._record

    def interrupted(self, **fields):  # the third new run is interrupted between its config and its status
        if fields.get("state") == "queued":
            if len(calls) == 2:
                raise KeyboardInterrupt
            calls.append(self.id)
        return original(self, **fields)

    monkeypatch.setattr(runstore.Run, "write_status", interrupted)
    with pytest.raises(KeyboardInterrupt):
        queue_study(study, "paper", settings=config, registry=registry)
    monkeypatch.setattr(runstore.Run, "write_status", original)
    assert len(calls) == 2 and all(not (config.runs_dir / run_id).exists() for run_id in calls)
    assert sorted(p.name for p in config.runs_dir.iterdir() if not p.name.startswith(".")) == [kept.id]

    taken = []

    def scheduler_tries_one(*args):  # a scheduler of the project tries to take the first new run, then Ctrl-C
        done = args[-2]
        taken.append(next(run for run, state in done.values() if state == "new").claim())
        raise KeyboardInterrupt

    monkeypatch.setattr(studies, "_record", scheduler_tries_one)
    with pytest.raises(KeyboardInterrupt):
        queue_study(study, "paper", settings=config, registry=registry)
    monkeypatch.setattr(studies, "_record", original_record)
    left = sorted(p.name for p in config.runs_dir.iterdir() if not p.name.startswith(".") and p.name != kept.id)
    assert taken == [False] and left == []  # held until recorded: no scheduler took it, and all are withdrawn
    again = queue_study(study, "paper", settings=config, registry=registry)
    assert again.reused == [kept.id] and again.in_progress == [] and len(again.created) == 5
    assert len(list((config.runs_dir / "sweeps").glob("sweep-*.json"))) == 1


def test_identical_configurations_within_a_study_share_one_run(registry, tmp_path):
    """At quick scale the Table 3 datasets both become synthetic: one run serves both places."""
    study = find_study(registry, "nca-table3")
    outcome = queue_study(study, "quick", settings=store(tmp_path), registry=registry)
    assert len(outcome.created) == study.run_count("quick") // 2 == 5
    record = json.loads(next((tmp_path / "runs" / "sweeps").glob("sweep-*.json")).read_text())
    assert record["study"] == "nca-table3" and record["scale"] == "quick"
    assert all(len(places) == 2 for places in record["places"].values())
    assert record["datasets"] == {"miniimagenet": "synthetic", "cifar-fs": "synthetic"}


def test_a_published_cell_its_runs_do_not_evaluate_is_refused(registry, tmp_path):
    data = tiny()
    data["published"][0]["ways"] = 20
    with pytest.raises(ConfigError, match="its runs evaluate 5-way 1, 5-shot; set eval.extra_ways or eval.shots"):
        resolve_study(parse_study(data, "tiny.toml"), "paper", settings=store(tmp_path), registry=registry)


def test_a_study_sweep_trains_its_set_with_every_plugin_its_grid_chooses(registry, tmp_path):
    """Each key of a sweep's set and of a grid point was a layer of its own, in the file's order: a
    loss.name after loss.temperature in set, or a grid of loss.name, dropped the temperature the
    study sets; a sweep's set is one table, and its grid points train as its set would give them."""
    data = tiny()
    data["sweep"][0]["set"].update({"loss.temperature": 0.5, "loss.name": "supcon"})
    data["sweep"][1]["set"]["loss.distance"] = "cosine"
    data["sweep"][1]["grid"] = {"train.lr": [0.1, 0.05], "loss.name": ["protonet", "lpn"]}
    data["published"][2]["at"]["loss.name"] = "protonet"
    resolved = resolve_study(parse_study(data, "tiny.toml"), "paper", settings=store(tmp_path), registry=registry)
    losses = {(p.sweep, p.at.get("loss.name")): c["loss"] for p, c in resolved}
    assert losses[("nca", None)]["name"] == "supcon" and losses[("nca", None)]["temperature"] == 0.5
    assert losses[("pn", "lpn")]["name"] == "lpn" and losses[("pn", "lpn")]["distance"] == "cosine"
    assert losses[("pn", "protonet")] == {"name": "protonet", "distance": "cosine"}


def test_one_model_tested_at_several_ways_serves_each_ways_cell(registry, tmp_path):
    """eval.extra_ways (the mAP paper's 5- and 20-way columns): the 20-way cells are read from the same
    runs' 20-way test episodes, so no model is trained twice."""
    data = tiny()
    data["sweep"][0]["set"]["eval.extra_ways"] = [20]
    data["published"].append({"sweep": "nca", "dataset": "synthetic", "ways": 20, "shots": 1, "accuracy": 40.0})
    study = parse_study(data, "tiny.toml")
    config = store(tmp_path)
    outcome = queue_study(study, "paper", settings=config, registry=registry)
    assert len(outcome.created) == study.run_count() == 6
    for run in runs_of(outcome, config.runs_dir, "nca"):
        finish(run, {1: [0.6] * 4, 5: [0.8] * 4})
        finish(run, {1: [0.4] * 4, 5: [0.5] * 4}, ways=20)
    rows = {(r["sweep"], r["ways"], r["shots"]): r for r in study_report(study, config.runs_dir)["rows"]}
    assert rows[("nca", 5, 1)]["measured"]["accuracy"] == pytest.approx(0.6)
    assert rows[("nca", 20, 1)]["measured"]["accuracy"] == pytest.approx(0.4)
    assert rows[("nca", 20, 1)]["measured"]["episodes"] == 8 and rows[("nca", 20, 1)]["verdict"] == REPRODUCED


def test_a_bad_setting_names_the_study_and_sweep_and_queues_nothing(registry, tmp_path):
    data = tiny()
    data["sweep"][1]["set"]["train.lr"] = -1.0
    del data["sweep"][1]["grid"]
    data["published"] = data["published"][:2]
    with pytest.raises(UsageError, match="^study tiny, sweep 'pn' on synthetic: .*train.lr"):
        queue_study(parse_study(data, "tiny.toml"), "paper", settings=store(tmp_path), registry=registry)
    assert not (tmp_path / "runs").exists()


def test_one_data_root_for_a_study_on_several_datasets_is_refused(registry, tmp_path):
    study = find_study(registry, "nca-table3")
    with pytest.raises(UsageError, match="--data-root names one folder, but study nca-table3 trains on cifar-fs, "
                                         "miniimagenet: give each dataset its folder in \\[data_roots\\]"):
        plan_runs(study, "paper", data_root="/data/mini")
    layers = plan_runs(study, "paper", dataset="miniimagenet", data_root="/data/mini")[0].layers
    assert layers[:2] == ({"dataset": {"name": "miniimagenet"}}, {"dataset": {"root": "/data/mini"}})
    # --dataset synthetic --data-root DIR: synthetic reads no files, and DIR went unread without a word
    with pytest.raises(ConfigError, match=r"dataset\.root /data/mini: dataset 'synthetic' is generated and reads no "
                                          r"files, so nothing in that folder would be used"):
        resolve_study(study, "quick", settings=store(tmp_path), registry=registry, dataset="synthetic",
                      data_root="/data/mini")


def test_a_missing_data_root_of_a_study_on_several_datasets_says_the_way_that_works(registry, tmp_path,
                                                                                     monkeypatch):
    """fslab study run nca-table3 without data said "Give it with --data-root or [data_roots] miniimagenet in
    fslab.toml", and the --data-root it offered was then refused: one folder for two datasets. The line now
    ends with the way that works; a study on one dataset keeps the dataset's line as it was."""
    monkeypatch.chdir(tmp_path)  # no data/ here
    hint = ("; study nca-table3 trains on cifar-fs, miniimagenet, so --data-root (one folder) is not for it: give "
            "each dataset its folder in [data_roots] of fslab.toml")
    with pytest.raises(UsageError) as refused:
        queue_study(find_study(registry, "nca-table3"), "paper", settings=store(tmp_path), registry=registry)
    said = str(refused.value)
    assert said.startswith("study nca-table3, sweep ") and said.endswith(hint), said
    assert "--data-root" in said.removesuffix(hint) and "\n" not in said  # the dataset's line, then the hint
    with pytest.raises(UsageError) as alone:
        queue_study(find_study(registry, "nca-supcon"), "paper", settings=store(tmp_path), registry=registry)
    assert str(alone.value).endswith("Give it with --data-root or [data_roots] miniimagenet in fslab.toml.")
    assert not (tmp_path / "runs").exists()


def test_set_may_not_fix_what_the_study_varies_or_assigns(registry):
    """A grid key fixed by --set would make every point of the grid the same run
    (the study's figure collapsing to one batch size); the seed and the dataset
    are the study's to give each run."""
    study = find_study(registry, "nca-fig2")
    with pytest.raises(UsageError, match=r"--set train.batch_size: study nca-fig2 varies it \(sweep 'nca' runs "
                                         r"128, 256\), so one value would make those runs the same"):
        plan_runs(study, "quick", extra=({"train": {"batch_size": 64}},))
    with pytest.raises(UsageError, match=r"--set seed: study nca-fig2 numbers each run's seed itself"):
        plan_runs(study, "quick", extra=({"seed": 3},))
    with pytest.raises(UsageError, match=r"--set dataset.name: train study nca-fig2 on another dataset with --dataset"):
        plan_runs(study, "quick", extra=({"dataset": {"name": "synthetic"}},))
    fixed = plan_runs(study, "quick", extra=({"train": {"lr": 0.05}},))  # what the study fixes may change
    assert len(fixed) == study.run_count("quick") and all({"train": {"lr": 0.05}} in p.layers for p in fixed)


@pytest.mark.parametrize("order", [[1, 2], [2, 1]])
def test_a_grid_varying_a_setting_that_changes_no_result_is_refused_in_either_order(registry, tmp_path, order):
    """A study grid of train.processes = [1, 2] made its points one run (train.processes is no setting to a
    study), trained with the value the grid listed first, its cells sharing it; [2, 1] planned other runs. Such
    a grid is refused, whatever its order, in one line naming the file's key, and nothing is queued."""
    from fslab.core.study_plan import varied_ignored

    data = tiny()
    data["sweep"][1]["grid"] = {"train.lr": [0.1, 0.05], "train.processes": order}
    data["published"][2]["at"] = {"train.lr": 0.1, "train.processes": 1}
    study = parse_study(data, "tiny.toml", Path("tiny.toml"))
    assert varied_ignored(study, study.sweeps[1], "paper") == {"train.processes": order}
    with pytest.raises(ConfigError) as refused:
        queue_study(study, "paper", settings=store(tmp_path), registry=registry)
    assert str(refused.value) == (
        f"tiny.toml: sweep 'pn'.grid.train.processes: varies train.processes ({order[0]}, {order[1]}), which "
        f"changes neither what a run learns nor how it is scored, so points alike in every other key would be one "
        f"run, trained with whichever value the grid lists first; give it once, in the sweep's set (or fslab study "
        f"run --set train.processes=VALUE)")
    assert not (tmp_path / "runs").exists()
    # points that differ in what they learn as well are runs of their own, each with its own processes
    data["sweep"][1]["grid"] = {"train": [{"lr": 0.1, "processes": order[0]}, {"lr": 0.05, "processes": order[1]}]}
    data["published"] = data["published"][:2]
    study = parse_study(data, "tiny.toml", Path("tiny.toml"))
    assert varied_ignored(study, study.sweeps[1], "paper") == {}
    assert len(plan_runs(study)) == study.run_count() == 6


def test_quick_dataset_keys_apply_only_on_the_quick_dataset():
    data = tiny(quick={"seeds": 1, "set": {"dataset.classes": 60, "train.epochs": 1}})
    study = parse_study(data, "tiny.toml")
    layers = plan_runs(study, "quick", dataset="omniglot")[0].layers
    assert {"train": {"epochs": 1}} in layers  # the quick scale's set is one layer
    assert {"dataset": {"classes": 60}, "train": {"epochs": 1}} in plan_runs(study, "quick")[0].layers


# -- the CLI -----------------------------------------------------------------------


def test_study_commands_from_the_cli(project):
    """In this process (fslab_here): what each command prints and its exit code; fslab study list as a
    process of its own is test_study_list_does_not_import_torch's."""
    listed = fslab_here("study", "list", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == BUILT_IN
    shown = fslab_here("study", "show", "nca-table3", "--json", cwd=project)
    info = json.loads(shown.stdout)
    assert info["runs"] == 50 and info["gpu_hours"]["hours"] is None and "not estimated" in info["gpu_hours_note"]
    report = fslab_here("study", "report", "map-table2", "--format", "json", cwd=project)
    assert {r["verdict"] for r in json.loads(report.stdout)["rows"]} == {PENDING}
    for argv, expected in [(["study", "show", "nca-tabel3"], "Unknown study 'nca-tabel3'. Did you mean 'nca-table3'?"),
                           (["study", "report", "nca-table3", "--format", "xls"], "unknown format 'xls'"),
                           (["study", "run", "nca-table3", "--scale", "huge"], "--scale must be one of paper, quick"),
                           (["study", "run", "missing.toml"], "no study file 'missing.toml'")]:
        result = fslab_here(*argv, cwd=project)
        assert result.returncode == 2 and expected in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(("argv", "expected"), [
    (["study", "report", "nca-table3", "--format", "tex"],
     "error: unknown format 'tex'. Did you mean 'latex'? Allowed: md, latex, csv, json.\n"),
    (["study", "report", "nca-table3", "--format", "MD"],
     "error: unknown format 'MD'. Did you mean 'md'? Allowed: md, latex, csv, json.\n"),
    (["study", "report", "nca-table3", "--scale", "quik"],
     "error: --scale must be one of paper, quick, got 'quik'. Did you mean 'quick'?\n"),
    (["study", "run", "nca-table3", "--scale", "Quick"],
     "error: --scale must be one of paper, quick, got 'Quick'. Did you mean 'quick'?\n"),
    (["study", "show", "nca-table3", "--scale", "huge"], "error: --scale must be one of paper, quick, got 'huge'.\n"),
    (["compare", "all", "--format", "tex"],
     "error: unknown format 'tex'. Did you mean 'latex'? Allowed: table, md, latex, csv, json.\n"),
])
def test_a_mistyped_format_or_scale_names_the_closest(project, argv, expected):
    """--format tex (the report's file is .tex) and --scale quik were refused with the list alone, where a
    mistyped --precision or study name is offered the closest."""
    result = fslab_here(*argv, cwd=project)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", expected)


def test_study_list_and_show_count_the_runs_study_run_trains_places_alike_sharing_one(project, registry):
    """At quick scale Table 3's two datasets both become synthetic, so its 10 places are 5 runs: fslab study list
    and show counted 10 where fslab study run trains 5 (all three count them by study_plan.distinct_runs)."""
    listed = {row["name"]: row for row in map(json.loads, fslab_here("study", "list", "--json", cwd=project)
                                             .stdout.splitlines())}
    assert [listed["nca-table3"][k] for k in ("runs", "places", "quick_runs", "quick_places")] == [50, 50, 5, 10]
    shown = json.loads(fslab_here("study", "show", "nca-table3", "--scale", "quick", "--json", cwd=project).stdout)
    assert (shown["runs"], shown["places"]) == (5, 10)
    assert {(s["runs"], s["places"]) for s in shown["sweeps"]} == {(1, 2)}
    table = fslab_here("study", "show", "nca-table3", "--scale", "quick", "--wide", cwd=project)
    assert "scale quick: 5 runs for 10 places (places alike in every setting share one)" in table.stdout
    outcome = queue_study(find_study(registry, "nca-table3"), "quick", settings=store(project), registry=registry)
    assert len(outcome.created) == shown["runs"]


def test_study_show_plans_what_study_run_with_the_same_options_runs(project, registry):
    """fslab study show took no --dataset, --data-root or --set, so what fslab study run NAME --dataset X
    --set K=V would train and cost could not be seen first: show plans it as run does now, refusing alike."""
    options = ["--scale", "quick", "--dataset", "synthetic-mini", "--set", "train.epochs=2"]
    shown = json.loads(fslab_here("study", "show", "nca-table3", *options, "--json", cwd=project).stdout)
    assert (shown["runs"], shown["places"]) == (5, 10)
    assert all(set(s["datasets"].values()) == {"synthetic-mini"} and s["set"]["train.epochs"] == 2
               for s in shown["sweeps"])
    assert shown["command"] == "fslab study run nca-table3 " + " ".join(options)
    table = fslab_here("study", "show", "nca-table3", *options, "--wide", cwd=project)
    assert table.stdout.splitlines()[-1] == "planned as: " + shown["command"]
    outcome = queue_study(find_study(registry, "nca-table3"), "quick", settings=store(project), registry=registry,
                          dataset="synthetic-mini", extra=({"train": {"epochs": 2}},))
    assert len(outcome.created) == shown["runs"]
    assert {Run(project / "runs" / run_id).config()["train"]["epochs"] for run_id in outcome.created} == {2}
    for wrong in (["--set", "seed=3"], ["--dataset", "nope"]):
        refused = fslab_here("study", "show", "nca-table3", *wrong, cwd=project)
        assert (refused.returncode, refused.stderr) == (2, fslab_here("study", "run", "nca-table3", *wrong,
                                                                      cwd=project).stderr), wrong


def test_study_show_moves_a_sweeps_settings_under_a_table_too_wide_for_them(project):
    """At 80 columns the sweep table leaves out grid and settings and lists them a line a sweep,
    whole, its caption saying so (it said "left out: grid, settings" above the lines that give them);
    --wide keeps them in one table."""
    narrow = fslab("study", "show", "nca-fig2", cwd=project, env={**os.environ, "COLUMNS": "80"})
    assert narrow.returncode == 0, narrow.stderr
    table = [line for line in narrow.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and all(len(line) <= 80 for line in table)
    assert "┃ sweep" in table[1] and "settings" not in table[1] and "grid" not in table[1]
    assert ("  pn-5shot-a32: grid train.batch_size=[128, 256, 512]; settings backbone.name=resnet12-nca, "
            "eval.center_images=0, train.epochs=120, sampler.per_class=32") in narrow.stdout.splitlines()
    assert "fitted to 80 columns (grid, settings under the table); --wide shows all" in narrow.stdout.splitlines()
    wide = fslab("study", "show", "nca-fig2", "--wide", cwd=project, env={**os.environ, "COLUMNS": "80"})
    header = next(line for line in wide.stdout.splitlines() if line.startswith("┃ sweep"))
    assert "grid" in header and "settings" in header
    assert not [line for line in wide.stdout.splitlines() if line.startswith("  pn-")]


def test_study_list_does_not_import_torch(project):
    import subprocess
    import sys

    code = ("import sys\nfrom fslab.cli import app\ntry:\n    app(['study', 'list'])\nexcept SystemExit as e:\n"
            "    assert not e.code\nprint('HEAVY', [m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True,
                            env={**os.environ})
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


# The quick-scale studies, a test each so that two test processes share them out (all ten in one test
# took 170 s on a loaded 2-core machine, Fig. 2 alone 43 s), the longest first; Table 4's quick runs
# are Table 3's, so those two are queued in one store, where the runs they share are trained once.
SHARING = ("nca-table3", "nca-table4")
STUDY_GROUPS = [("nca-fig2",), ("nca-fig4",), ("sen-table2",), SHARING, ("nca-fig3",), ("lpn-table1",),
                ("map-table1",), ("map-table2",), ("nca-supcon",)]


@pytest.mark.slow
@pytest.mark.parametrize("names", STUDY_GROUPS, ids="+".join)
def test_every_built_in_study_at_quick_scale_end_to_end(project, names):
    """Queue built-in studies at quick scale in one store (Tables 3 and 4 together: the runs they share are
    trained once), train with real worker processes, report each; then run each again: all reused."""
    from fslab.core.registry import load_registry

    registry = load_registry()
    # two runs at a time: a quick run is mostly Python and torch starting, one core each
    (project / "fslab.toml").write_text("[scheduler]\ncpu_slots = 2\n")
    queued = {}
    for name in names:
        started = fslab_here("study", "run", name, "--scale", "quick", "--set", "device=cpu", cwd=project)
        assert started.returncode == 0, started.stderr
        queued[name] = started.stdout
    if names == SHARING:
        assert "5 new" in queued["nca-table3"] and "0 new" in queued["nca-table4"]  # Table 4's quick runs are 3's
    studies = {name: find_study(registry, name) for name in names}

    def ended():  # only the runs' states, read in this process: a CLI call or a report per poll
        # would compete with the workers for the CPU (reports of every study took 40 s of it)
        states = [Run(folder).state() for folder in (project / "runs").glob("2*")]
        return states and all(state in ENDED for state in states)

    wait_for(ended, timeout=900, what=f"the runs of {', '.join(names)}", interval=0.5)
    reports = {name: study_report(study, project / "runs") for name, study in studies.items()}
    assert all(r["verdict"] != PENDING for report in reports.values() for r in report["rows"])
    for name, report in reports.items():
        rows = report["rows"]
        assert rows and report["scale"] == "quick", name
        assert {r["verdict"] for r in rows} <= {NOT_COMPARABLE, NOT_PUBLISHED}, name  # figure points: no number
        assert all(0.0 < r["measured"]["accuracy"] <= 1.0 and r["measured"]["episodes"] == 50 for r in rows), name
        assert (report["split"] == "val") == (name in ("nca-fig2", "nca-fig4")), name  # scored as the paper
    if "nca-table3" in names:
        table3 = reports["nca-table3"]["rows"]
        assert len(table3) == 16 and all(r["measured"]["accuracy"] > 0.2 for r in table3)  # 5-way chance: 0.2
    for name in names:  # the CLI in this process: ten interpreters importing torch and matplotlib took ~25 s
        out = fslab_here("study", "report", name, "--out", "report", cwd=project)
        assert out.returncode == 0, out.stderr
        text = (project / "report" / f"{name}.md").read_text()
        assert "Scale: quick" in text and "-> synthetic" in text, name
    figures = {"nca-fig2": "nca-fig2-cifar-fs.png", "nca-fig3": "nca-fig3-miniimagenet.png"}
    for name in set(names) & set(figures):
        assert (project / "report" / figures[name]).stat().st_size > 1000
    for name in names:
        again = fslab_here("study", "run", name, "--scale", "quick", "--set", "device=cpu", cwd=project)
        assert again.returncode == 0 and "0 new" in again.stdout, (name, again.stdout, again.stderr)
        assert name != "nca-table3" or "5 done already" in again.stdout


LOCAL_STUDY_PLUGIN = """
from pathlib import Path

from fslab.plugin import hookimpl, register_study_files


@hookimpl
def register_studies(register):
    register_study_files(register, Path(__file__).parent / "studies")
"""
LOCAL_STUDY = """
name = "my-paper"
title = "My method on synthetic glyphs"
table = "Table 1"
published = [{ sweep = "nca", dataset = "synthetic", shots = 5, accuracy = 90.0, ci95 = 0.3 }]

[paper]
authors = "Someone"
title = "My paper"
year = 2024

[[sweep]]
name = "nca"
method = "nca"
datasets = ["synthetic"]
seeds = 3
"""


def test_a_plugin_ships_its_own_study_and_a_broken_one_is_reported(project):
    (project / "mine" / "studies").mkdir(parents=True)
    (project / "mine" / "paper.py").write_text(LOCAL_STUDY_PLUGIN)
    (project / "mine" / "studies" / "my-paper.toml").write_text(LOCAL_STUDY)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    listed = fslab("study", "list", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    rows = {json.loads(line)["name"]: json.loads(line) for line in listed.stdout.splitlines()}
    assert set(rows) == {*BUILT_IN, "my-paper"} and rows["my-paper"]["runs"] == 3
    assert rows["my-paper"]["plugin"] == "local:paper"
    kinds = fslab("plugins", "--kind", "study", "--json", cwd=project)
    mine = [json.loads(line) for line in kinds.stdout.splitlines() if "my-paper" in line]
    assert mine[0]["file"].endswith("my-paper.toml") and mine[0]["paper"] == "Someone, My paper (2024)"
    (project / "mine" / "studies" / "my-paper.toml").write_text(LOCAL_STUDY.replace("seeds = 3", "seeds = 0"))
    broken = fslab("study", "list", "--json", cwd=project)
    assert broken.returncode == 1  # the plugin failed to load: listed, named, and exit 1 as fslab plugins
    assert {json.loads(line)["name"] for line in broken.stdout.splitlines()} == set(BUILT_IN)
    assert "my-paper.toml: sweep 'nca'.seeds: must be a whole number at least 1, got 0" in broken.stderr


def test_a_study_whose_package_was_uninstalled_after_its_runs_says_so(project):
    """fslab study report NAME, its package uninstalled after fslab study run NAME, said only 'Unknown
    study ... Did you mean' another study, with the study's runs in the store."""
    from fslab.core.sweeps import save_sweep

    runs_dir = project / "runs"
    save_sweep(runs_dir, "sweep-20260101-000000-ab12-my-paper", study="my-paper", runs=[], scale="quick")
    save_sweep(runs_dir, "sweep-20260102-000000-cd34-my-paper", study="my-paper", runs=[], file="/x/my-paper.toml")
    out = fslab("study", "report", "my-paper", cwd=project)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("error: Unknown study 'my-paper': this store has its runs (sweep "
                                 "sweep-20260101-000000-ab12-my-paper), but no plugin installed now registers its "
                                 "file; install again the package that ships it. Allowed: lpn-table1, "), out.stderr
    other = fslab("study", "report", "map-tabel1", cwd=project)  # a typo of another study is as it was
    assert "Unknown study 'map-tabel1'. Did you mean 'map-table1'?" in other.stderr and "store" not in other.stderr
    (project / "mine").mkdir()  # installed but broken: the line says that, not to install it again
    (project / "mine" / "paper.py").write_text(LOCAL_STUDY_PLUGIN)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    broken = fslab("study", "report", "my-paper", cwd=project)
    assert "which failed to load (ConfigError: register_study_files:" in broken.stderr
    assert "install again" not in broken.stderr


def test_a_study_file_registered_by_hand_and_broken_is_left_out_of_the_list_not_every_study(project):
    """register(path, name=..., description=...) skips register_study_files' check: one such broken or
    missing file made fslab study list print nothing but its error, hiding every other study."""
    (project / "mine").mkdir()
    (project / "mine" / "broken.toml").write_text(LOCAL_STUDY.replace("seeds = 3", "seeds = 0"))
    (project / "mine" / "direct.py").write_text(
        "from pathlib import Path\nfrom fslab.plugin import hookimpl\n\n\n@hookimpl\n"
        "def register_studies(register):\n"
        "    register(Path(__file__).parent / 'broken.toml', name='my-paper', description='Table 1')\n"
        "    register(Path(__file__).parent / 'gone.toml', name='gone', description='Table 2')\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    listed = fslab("study", "list", "--json", cwd=project)
    assert listed.returncode == 1
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == BUILT_IN
    assert listed.stderr.splitlines() == [
        f"study 'gone' of plugin 'local:direct' left out: cannot read {project / 'mine' / 'gone.toml'}: "
        f"No such file or directory",
        f"study 'my-paper' of plugin 'local:direct' left out: {project / 'mine' / 'broken.toml'}: sweep 'nca'.seeds: "
        f"must be a whole number at least 1, got 0"]
    table = fslab("study", "list", cwd=project)
    assert table.returncode == 1 and "nca-table3" in table.stdout and "left out" in table.stderr


def test_a_study_file_registered_by_hand_and_missing_is_the_plugins_fault_in_every_study_command(project):
    """fslab study show NAME of a hand-registered study whose file is missing, broken or names another study
    exited 2 (bad input), where fslab study list names the same file as the plugin's fault and exits 1:
    the name given was right."""
    (project / "mine").mkdir()
    (project / "mine" / "other.toml").write_text(LOCAL_STUDY)
    (project / "mine" / "direct.py").write_text(
        "from pathlib import Path\nfrom fslab.plugin import hookimpl\n\n\n@hookimpl\n"
        "def register_studies(register):\n"
        "    register(Path(__file__).parent / 'gone.toml', name='gone', description='Table 2')\n"
        "    register(Path(__file__).parent / 'other.toml', name='renamed', description='Table 1')\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    gone = project / "mine" / "gone.toml"
    for argv in (["show", "gone"], ["report", "gone"], ["run", "gone", "--scale", "quick"]):
        failed = fslab("study", *argv, cwd=project)
        assert (failed.returncode, failed.stderr) == (
            1, f"error: study 'gone' of plugin 'local:direct' cannot be used: cannot read {gone}: "
               f"No such file or directory\n")
    renamed = fslab("study", "show", "renamed", cwd=project)
    assert renamed.returncode == 1 and renamed.stderr.startswith(
        "error: study 'renamed' of plugin 'local:direct' cannot be used: ")
    assert "but it is registered as 'renamed'" in renamed.stderr
    unknown = fslab("study", "show", "gonee", cwd=project)  # a name no plugin registers is still bad input
    assert unknown.returncode == 2 and "Did you mean 'gone'?" in unknown.stderr
    assert not (project / "runs").exists() or not any((project / "runs").iterdir())


def test_a_plugin_whose_study_files_were_not_shipped_fails_to_load_saying_so(builtin_plugins, tmp_path):
    """A package built without its package data called register_study_files on a folder the wheel left
    out: it registered no study and said nothing, and fslab study show NAME answered only 'Unknown study'."""
    from fslab.core.registry import load_registry

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "paper.py").write_text(LOCAL_STUDY_PLUGIN)
    failures = load_registry([mine]).failures
    assert [f.plugin for f in failures] == ["local:paper"]
    assert f"{mine / 'studies'} is not a folder; ship the study files with the package as package data" \
        in failures[0].error
    (mine / "studies").mkdir()
    assert f"{mine / 'studies'} holds no study file (*.toml)" in load_registry([mine]).failures[0].error
    (mine / "studies" / "my-paper.toml").write_text(LOCAL_STUDY)
    registry = load_registry([mine])
    assert not registry.failures and "my-paper" in registry.names("study")


def test_two_study_files_giving_one_name_are_named_with_what_to_do(builtin_plugins, tmp_path):
    """Two files of one package with one name said the study was 'registered twice' by the plugin and by
    itself and to uninstall one of them; a package's study named as a built-in one did not say which files."""
    from fslab.core.errors import PluginError
    from fslab.core.registry import load_registry

    mine = tmp_path / "mine"
    (mine / "studies").mkdir(parents=True)
    (mine / "paper.py").write_text(LOCAL_STUDY_PLUGIN)
    (mine / "studies" / "a.toml").write_text(LOCAL_STUDY)
    (mine / "studies" / "b.toml").write_text(LOCAL_STUDY)
    error = load_registry([mine]).failures[0].error
    assert error == (f"ConfigError: {mine / 'studies' / 'b.toml'}: name: 'my-paper' is also the name "
                     f"{mine / 'studies' / 'a.toml'} gives; each study file needs a name of its own; raised by "
                     f"register_studies() of {(mine / 'paper.py').resolve()} (a file of plugin_dirs in fslab.toml)")
    (mine / "studies" / "b.toml").write_text(LOCAL_STUDY.replace('"my-paper"', '"nca-table3"'))
    with pytest.raises(PluginError) as caught:
        load_registry([mine])
    assert re.search(r"registered twice: by plugin 'studies' .*, file \S+/nca-table3\.toml\) and by plugin "
                     r"'local:paper' .*, file " + re.escape(f"{mine / 'studies' / 'b.toml'}). Give one file another "
                                                          f"name (its name key), uninstall one of them"),
                     str(caught.value))


def fake_slurm_study(project) -> dict:
    """LOCAL_STUDY in ``project/study.toml`` and an environment whose sbatch, scancel and srun are
    fakes that count the jobs submitted (``project/next-job``)."""
    from .test_slurm import COUNTING_SBATCH, FAKE_SCANCEL

    bin_dir = project / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", COUNTING_SBATCH), ("scancel", FAKE_SCANCEL), ("srun", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text.format(folder=project))
        (bin_dir / name).chmod(0o755)
    (project / "study.toml").write_text(LOCAL_STUDY)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_study_submitted_to_slurm_is_one_job_a_run_and_not_submitted_twice(project):
    env = fake_slurm_study(project)
    argv = ["study", "run", "study.toml", "--set", "train.epochs=1", "--executor", "slurm"]
    first = fslab(*argv, cwd=project, env=env)
    assert first.returncode == 0, first.stderr
    assert "3 runs: 0 done already, 0 queued or running, 0 queued again, 3 new" in first.stdout
    jobs = sorted(json.loads((d / "status.json").read_text())["slurm_job_id"]
                  for d in (project / "runs").iterdir() if d.name != "sweeps")
    assert jobs == ["100", "101", "102"]
    again = fslab(*argv, cwd=project, env=env)
    assert "0 done already, 3 queued or running, 0 queued again, 0 new" in again.stdout
    assert (project / "next-job").read_text().strip() == "103"  # nothing submitted the second time


# `fslab study run ARGS` as the real CLI runs it, with a Ctrl-C arriving as it submits its second SLURM job.
INTERRUPTED_SUBMIT = """
import os, signal, sys
import fslab.execution.slurm as slurm

signal.signal(signal.SIGINT, signal.default_int_handler)
submit, sent = slurm.submit, []
def interrupted(run, *args, **kwargs):
    if len(sent) == 1:
        os.kill(os.getpid(), signal.SIGINT)
    sent.append(submit(run, *args, **kwargs))
    return sent[-1]
slurm.submit = interrupted
sys.argv = ["fslab", *sys.argv[1:]]
from fslab.cli import main
main()
"""


def test_a_study_interrupted_while_submitting_to_slurm_submits_the_rest_when_run_again(project):
    """The runs left queued when Ctrl-C stopped the submitting were reused as 'queued or running' by the same
    command again, which submitted none of them: they stayed queued, with no job, for good."""
    import subprocess
    import sys

    env = fake_slurm_study(project)
    argv = ["study", "run", "study.toml", "--set", "train.epochs=1", "--executor", "slurm"]
    first = subprocess.run([sys.executable, "-c", INTERRUPTED_SUBMIT, *argv], cwd=project, env=env, text=True,
                           capture_output=True, timeout=120)
    assert first.returncode == 130, first.stderr

    def jobs():
        return sorted(str(json.loads((d / "status.json").read_text()).get("slurm_job_id"))
                      for d in (project / "runs").iterdir() if d.name != "sweeps")

    # the first run submitted; the second taken for submitting as Ctrl-C came (whether its sbatch ran cannot be
    # told, so it is left: a job may be running it); the third never reached
    assert jobs() == ["100", "None", "None"]
    again = fslab(*argv, cwd=project, env=env)
    assert again.returncode == 0, again.stderr
    assert "3 runs: 0 done already, 3 queued or running, 0 queued again, 0 new" in again.stdout
    assert jobs() == ["100", "101", "None"]
    assert fslab(*argv, cwd=project, env=env).returncode == 0
    assert (project / "next-job").read_text().strip() == "102"  # nothing submitted twice


# `fslab study run ARGS` as the real CLI runs it, but holding the moment between reading the store and
# creating the runs open until a second process has read the store too (3 s at most): two terminals
# started together, with the race made certain instead of likely.
RACING_CLI = """
import sys, time
from pathlib import Path
import fslab.execution.studies as studies

read = studies.existing_runs
def existing_runs(*args, **kwargs):
    found = read(*args, **kwargs)
    Path("arrived-" + sys.argv[1]).touch()
    deadline = time.time() + 3
    while len(list(Path(".").glob("arrived-*"))) < 2 and time.time() < deadline:
        time.sleep(0.02)
    return found
studies.existing_runs = existing_runs
sys.argv = ["fslab", *sys.argv[2:]]
from fslab.cli import main
main()
"""


def test_two_study_runs_started_together_create_each_run_once(project):
    """The second waits for the first to finish queueing and reuses its runs (queued or running),
    so nothing is created or submitted twice."""
    import subprocess
    import sys

    env = fake_slurm_study(project)
    argv = ["study", "run", "study.toml", "--set", "train.epochs=1", "--executor", "slurm"]
    both = [subprocess.Popen([sys.executable, "-c", RACING_CLI, tag, *argv], cwd=project, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for tag in ("a", "b")]
    outputs = [process.communicate(timeout=120) for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    runs = [d for d in (project / "runs").iterdir() if d.name != "sweeps"]
    assert len(runs) == 3, [out for out, _ in outputs]  # and the queueing lock is gone with its holder
    said = sorted(out for out, _ in outputs)
    assert "0 queued or running, 0 queued again, 3 new" in said[0]
    assert "3 queued or running, 0 queued again, 0 new" in said[1]
    assert (project / "next-job").read_text().strip() == "103"  # each run submitted once


# `fslab study run ARGS` as the real CLI runs it, with a Ctrl-C (SIGINT) arriving as it creates its third run.
INTERRUPTED_CLI = """
import os, signal, sys
import fslab.execution.studies as studies

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever started the test
create, made = studies.create_run, []
def create_run(*args, **kwargs):
    if len(made) == 2:
        os.kill(os.getpid(), signal.SIGINT)
    made.append(create(*args, **kwargs))
    return made[-1]
studies.create_run = create_run
sys.argv = ["fslab", *sys.argv[1:]]
from fslab.cli import main
main()
"""


@pytest.mark.parametrize("sent, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_while_a_study_is_queued_says_how_to_go_on_and_leaves_nothing_queued(project, sent, code):
    """It exited 130 saying nothing, and left the runs created so far queued with no record of the study;
    a SIGTERM (timeout, a job's end) killed it outright, leaving them so."""
    import subprocess
    import sys

    (project / "study.toml").write_text(LOCAL_STUDY)
    argv = ["study", "run", "study.toml", "--set", "train.epochs=1"]
    program = INTERRUPTED_CLI.replace("os.kill(os.getpid(), signal.SIGINT)", f"os.kill(os.getpid(), signal.{sent})")
    out = subprocess.run([sys.executable, "-c", program, *argv], cwd=project, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == code, out.stderr
    assert out.stderr.strip() == (f"study my-paper: interrupted while queueing; no run was left queued unrecorded, "
                                  f"and the same command again picks up where it stopped: fslab study run "
                                  f"{project / 'study.toml'} --scale paper --set train.epochs=1")
    assert not (project / "runs").exists() or not [p for p in (project / "runs").iterdir() if p.name[0] != "."]


def test_a_study_being_queued_past_the_wait_is_named_and_a_killed_one_blocks_nothing(registry, tmp_path,
                                                                                        monkeypatch):
    import signal
    import subprocess
    import sys

    from fslab.execution import studies

    study = parse_study(tiny(), "tiny.toml")
    config = store(tmp_path)
    holding = ("import sys, time; from pathlib import Path; from fslab.execution.studies import queueing\n"
               "with queueing(Path(sys.argv[1]), 'nca-table3'):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", holding, str(config.runs_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(studies, "QUEUE_WAIT_S", 0.3)
        with pytest.raises(UsageError, match=rf"^study nca-table3 is being queued by pid {holder.pid} on host \S+ "
                                             r"for over 0.3 s; run this study again once it is queued"):
            queue_study(study, "paper", settings=config, registry=registry)
        assert [p.name for p in config.runs_dir.iterdir()] == [studies.QUEUE_LOCK]  # nothing queued
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the killed holder's lock file stays, naming it, but holds nothing: the next study takes and removes it
    assert "nca-table3" in (config.runs_dir / studies.QUEUE_LOCK).read_text()
    assert len(queue_study(study, "paper", settings=config, registry=registry).created) == 6
    assert not (config.runs_dir / studies.QUEUE_LOCK).exists()


def test_a_study_queue_lock_another_user_left_is_locked_read_only(tmp_path, another_users):
    """In a store a group shares, runs/.study-queue.lock that another user's study left (killed while it
    queued) or held stopped fslab study run at once: `cannot open ... (Permission denied)`, and nothing could
    be queued until someone removed the file. It is locked read-only (flock locks it the same): studies
    still queue one at a time, and one kept waiting says the holder is not recorded, where the file's line
    names the killed study."""
    import subprocess
    import sys
    import threading

    from fslab.core.states import HOST
    from fslab.execution.studies import QUEUE_LOCK, queueing

    runs = tmp_path / "runs"
    runs.mkdir()
    lock = runs / QUEUE_LOCK
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock.write_text(f"{gone.pid} {HOST} nca-table3\n")  # the killed study's line
    another_users(lock)
    events, first_in, let_go = [], threading.Event(), threading.Event()

    def queue(name):
        with queueing(runs, name):
            events.append(f"in {name}")
            if name == "a":
                first_in.set()
                let_go.wait(timeout=20)
            events.append(f"out {name}")

    first = threading.Thread(target=queue, args=("a",))
    first.start()
    assert first_in.wait(timeout=20)
    with pytest.raises(UsageError) as kept_waiting:
        with queueing(runs, "b", wait=0.2):
            pass
    assert str(kept_waiting.value) == (
        f"another study is being queued in this project (its holder is not recorded: {lock} cannot be written by "
        "this user) for over 0.2 s; run this study again once it is queued (its runs are then reused, not created "
        "twice)")
    second = threading.Thread(target=queue, args=("b",))
    second.start()
    time.sleep(0.2)
    let_go.set()
    first.join(timeout=20)
    second.join(timeout=20)
    assert events == ["in a", "out a", "in b", "out b"] and not lock.exists()


@pytest.mark.parametrize("name", ["sen-table2", "lpn-table1"])
def test_protonet_papers_train_as_snells_code(registry, tmp_path, name):
    """The SEN and L-PN papers build on Snell et al.'s ProtoNet code: Adam at
    lr 1e-3, no weight decay, the rate halved every 2,000 episodes. On
    miniImageNet (64 classes x 600 training images) each milestone must fall
    within half an epoch of a multiple of 2,000 episodes."""
    import math

    study = find_study(registry, name)
    resolved = [(p, c) for p, c in resolve_study(study, "paper", settings=store(tmp_path), registry=registry)
                if c["dataset"]["name"] == "miniimagenet"]
    assert resolved
    for _, config in resolved:
        train, sampler = config["train"], config["sampler"]
        assert (train["optimizer"], train["lr"], train["weight_decay"], train["gamma"]) == ("adam", 0.001, 0.0, 0.5)
        per_epoch = math.ceil(64 * 600 / (sampler["ways"] * (sampler["shots"] + sampler["queries"])))
        total = per_epoch * train["epochs"]
        halvings = [m * total / 2000 for m in train["milestones"]]
        assert [round(h) for h in halvings] == list(range(1, total // 2000 + 1))
        assert all(abs(h - round(h)) * 2000 < per_epoch / 2 for h in halvings)


def test_the_quick_grid_narrows_a_sweep_only_at_quick_scale(registry, tmp_path):
    data = tiny(quick={"grid": {"train.lr": [0.1]}})
    study = parse_study(data, "studies/tiny.toml")
    assert (study.run_count("paper"), study.run_count("quick")) == (2 + 2 * 2, 1 + 1)  # seeds x points
    lrs = sorted({next(layer["train"]["lr"] for layer in p.layers if "lr" in layer.get("train", {}))
                  for p in plan_runs(study, "quick") if p.sweep == "pn"})
    assert lrs == [0.1]
    paper = [p.at for p in plan_runs(study, "paper") if p.sweep == "pn"]
    assert paper == [{"train.lr": 0.1}] * 2 + [{"train.lr": 0.05}] * 2


STUDY_FILE = """
name = "by-hand"
title = "A study file, not registered"
table = "Table 1"
published = [{ sweep = "nca", dataset = "synthetic", shots = 1, accuracy = 40.0 }]
[paper]
authors = "A & B"
title = "A paper"
year = 2020
[[sweep]]
name = "nca"
method = "nca"
datasets = ["synthetic"]
seeds = 2
set = { "backbone.name" = "conv4", "backbone.hidden" = 8, "train.epochs" = 500 }
"""


def test_a_study_file_stopped_half_way_is_named_by_its_path_in_the_command_that_goes_on(project):
    """A study run from a file is not registered: the hints of fslab study run and fslab stop name
    its file (they named the study, and 'fslab study run by-hand' is an unknown study) and repeat
    the options it ran with, which a plain 'study run' would plan other runs without. The commands run in
    this process (fslab_here), the scheduler and workers they start and stop as processes of their own."""
    (project / "studies").mkdir()
    (project / "studies" / "mine.toml").write_text(STUDY_FILE)
    started = fslab_here("study", "run", "studies/mine.toml", "--set", "train.lr=0.05", cwd=project)
    assert started.returncode == 0, started.stderr
    path = str(project.resolve() / "studies" / "mine.toml")
    assert started.stdout.splitlines()[-1] == f"follow them with: fslab queue; then: fslab study report {path}"
    sweep_id = started.stdout.split("recorded as ")[1].split()[0]
    stopped = fslab_here("stop", sweep_id, cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    # how it repeats --data-root: test_the_command_that_goes_on_plans_the_runs_the_study_planned
    again = f"fslab study run {path} --scale paper --set train.lr=0.05"
    assert stopped.stderr.strip().endswith(f"go on with: {again}"), stopped.stderr
    # the line goes on from any folder: the same runs, resumed, and nothing new
    elsewhere = project.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fslab.toml").write_text(f"[project]\nruns_dir = '{project.resolve() / 'runs'}'\n")
    resumed = fslab_here(*again.split()[1:], cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr
    assert "0 new" in resumed.stdout and "2 queued again" in resumed.stdout, resumed.stdout
    fslab_here("stop", resumed.stdout.split("recorded as ")[1].split()[0], cwd=project)


@pytest.mark.parametrize("mistake, start", [
    ({"trian.epochs": 1}, "unknown config key 'trian'. Did you mean 'train'? Allowed: method, seed, device,"),
    ({"eval.quries": 3}, "unknown config key 'eval.quries'. Did you mean 'queries'? Allowed: eval.ways,"),
    ({"devise": "cpu"}, "unknown config key 'devise'. Did you mean 'device'?"),
])
def test_a_misspelt_key_in_a_study_is_not_blamed_on_run_for_the_keys_its_suggestions_name(registry, tmp_path,
                                                                                          mistake, start):
    """The message's suggestions list every key, and matching its text said '(set by device in [run] of
    fslab.toml)' of a mistake the study file made; a value [run] gave is still blamed on it."""
    data = tiny()
    data["sweep"][0]["set"].update(mistake)
    config = Settings(runs_dir=tmp_path / "runs", run={"device": "cpu", "eval": {"queries": 5}},
                      path=tmp_path / "fslab.toml")
    with pytest.raises(UsageError) as error:
        resolve_study(parse_study(data, "tiny.toml"), "paper", settings=config, registry=registry)
    assert str(error.value).startswith(f"study tiny, sweep 'nca' on synthetic: {start}"), str(error.value)
    assert "[run]" not in str(error.value), str(error.value)
    blamed = Settings(runs_dir=tmp_path / "runs", run={"device": "cpu", "eval": {"queries": 0}},
                      path=tmp_path / "fslab.toml")
    with pytest.raises(UsageError) as error:
        resolve_study(parse_study(tiny(), "tiny.toml"), "paper", settings=blamed, registry=registry)
    assert str(error.value).endswith(f" (set by eval.queries in [run] of {tmp_path / 'fslab.toml'})"), error.value


def test_a_copy_of_a_registered_study_run_from_its_file_is_reported_apart(registry, tmp_path):
    """A study file copied to change a setting keeps the study's name: the registered study's report read the
    copy's runs (other settings) as its own, with verdicts, and the copy's report read the registered one's."""
    import tomllib

    path = tmp_path / "mine.toml"
    path.write_text(STUDY_FILE.replace('"train.epochs" = 500', '"train.epochs" = 1'))
    registered = parse_study(tomllib.loads(path.read_text()), "by-hand")
    config = store(tmp_path)
    queue_study(registered, "paper", settings=config, registry=registry)
    path.write_text(STUDY_FILE.replace('"train.epochs" = 500', '"train.epochs" = 2'))  # the copy, changed
    copy_ = find_study(registry, str(path))
    assert copy_.from_file and copy_.name == registered.name
    outcome = queue_study(copy_, "paper", settings=config, registry=registry)
    for run in runs_of(outcome, config.runs_dir, "nca"):
        finish(run, {1: [0.4] * 5, 5: [0.6] * 5})
    mine, theirs = study_report(copy_, config.runs_dir), study_report(registered, config.runs_dir)
    assert mine["sweep"] == outcome.sweep_id and theirs["sweep"] not in (None, outcome.sweep_id)
    assert [r["verdict"] for r in mine["rows"]] == [REPRODUCED]
    assert [r["verdict"] for r in theirs["rows"]] == [PENDING] and not set(outcome.created) & {
        run_id for r in theirs["rows"] for run_id in r["run_ids"]}


def _finished_study_file(registry, project):
    """A one-epoch copy of STUDY_FILE as project/mine.toml, queued into project/runs and its runs finished."""
    (project / "mine.toml").write_text(STUDY_FILE.replace('"train.epochs" = 500', '"train.epochs" = 1'))
    config = Settings(runs_dir=project / "runs")
    outcome = queue_study(find_study(registry, str(project / "mine.toml")), "paper", settings=config,
                          registry=registry)
    for run in runs_of(outcome, config.runs_dir, "nca"):
        finish(run, {1: [0.4] * 5})
    return outcome


def test_a_project_copied_with_its_study_file_still_reports_what_the_file_ran(registry, tmp_path):
    """The record named the study file by its absolute path only: a project copied or moved (from a cluster
    to a laptop, to another folder) with its file said 'No runs yet' of runs it holds, every cell pending."""
    import shutil

    (tmp_path / "project").mkdir()
    outcome = _finished_study_file(registry, tmp_path / "project")
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "project", moved)
    report = study_report(find_study(registry, str(moved / "mine.toml")), moved / "runs")
    assert report["sweep"] == outcome.sweep_id and [r["verdict"] for r in report["rows"]] == [REPRODUCED]
    # a file of the same study elsewhere in the project, or outside it, did not run these
    (moved / "other").mkdir()
    shutil.copy(moved / "mine.toml", moved / "other" / "mine.toml")
    shutil.copy(moved / "mine.toml", tmp_path / "mine.toml")
    for elsewhere in (moved / "other" / "mine.toml", tmp_path / "mine.toml"):
        assert study_report(find_study(registry, str(elsewhere)), moved / "runs")["sweep"] is None


def test_a_project_whose_runs_folder_links_to_another_disk_still_reports_once_copied(registry, tmp_path):
    """runs/ a link to a larger disk: the file's path inside the project was taken from the disk's folder,
    where the file is not, so none was recorded, and the project copied back (from a cluster) with its runs
    reported every cell pending."""
    import shutil

    (tmp_path / "disk" / "runs").mkdir(parents=True)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "runs").symlink_to(tmp_path / "disk" / "runs")
    outcome = _finished_study_file(registry, tmp_path / "project")
    copied = tmp_path / "laptop"
    copied.mkdir()
    shutil.copy(tmp_path / "project" / "mine.toml", copied / "mine.toml")
    shutil.copytree(tmp_path / "disk" / "runs", copied / "runs")
    report = study_report(find_study(registry, str(copied / "mine.toml")), copied / "runs")
    assert report["sweep"] == outcome.sweep_id and [r["verdict"] for r in report["rows"]] == [REPRODUCED]


def test_report_out_naming_a_file_is_one_line_and_leaves_the_file_alone(project):
    """--out is a folder: a file there (or above it) was 'error: File exists: report.md', exit 1, as if the
    system had failed, and the line did not say --out wants a folder."""
    (project / "study.toml").write_text(LOCAL_STUDY)
    (project / "report.md").write_text("mine")
    for out in ("report.md", "report.md/tables"):
        done = fslab("study", "report", "study.toml", "--out", out, cwd=project)
        assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
        assert done.stderr == (f"error: --out {out}: report.md is a file, not a folder; give a folder, where the "
                               f"report is written as my-paper.md, .tex, .csv or .json (and a PNG per dataset for a "
                               f"figure)\n"), done.stderr
    assert (project / "report.md").read_text() == "mine"
    # --out '' (an unset $DIR) wrote into the current folder, over a my-paper.md there
    (project / "my-paper.md").write_text("mine")
    done = fslab("study", "report", "study.toml", "--out", "", cwd=project)
    assert (done.returncode, done.stdout) == (2, "") and done.stderr.startswith("error: --out is empty; give the ")
    assert (project / "my-paper.md").read_text() == "mine"


@pytest.mark.parametrize("scale, change, start", [
    ("paper", {"method": "ncaa"}, "sweep 'nca'.method (on synthetic): Unknown method 'ncaa'. Did you mean 'nca'?"),
    ("paper", {"datasets": ["synthetik"]}, "sweep 'nca'.datasets (on synthetik): Unknown dataset 'synthetik'."),
    ("paper", {"set": {"train.epochz": 1}}, "sweep 'nca'.set.train.epochz (on synthetic): unknown config key"),
    ("paper", {"set": {"backbone.name": "conv5"}}, "sweep 'nca'.set.backbone.name (on synthetic): Unknown backbone"),
    ("quick", {"quick": {"set": {"eval.shotz": [1]}}}, "quick.set.eval.shotz (on synthetic): unknown config key"),
    ("quick", {"quick": {"dataset": "synthetik"}}, "quick.dataset (on synthetic): Unknown dataset 'synthetik'."),
])
def test_a_study_file_that_does_not_resolve_names_the_file_and_key(registry, tmp_path, scale, change, start):
    """An unknown method, dataset or key, or a value of the wrong type, in a study file said 'study tiny, sweep
    'nca' on synthetic: Unknown method ...', naming neither the file nor the key to fix (the README promises
    both), and a long message's list of allowed keys was clipped before anything after it."""
    data, change = tiny(published=[]), dict(change)
    data.update({"quick": change.pop("quick")} if "quick" in change else {})
    data["sweep"][0].update(change)
    study = parse_study(data, "studies/tiny.toml", path=Path("studies/tiny.toml"))
    with pytest.raises(UsageError) as error:
        resolve_study(study, scale, settings=store(tmp_path), registry=registry)
    assert str(error.value).startswith(f"studies/tiny.toml: {start}"), str(error.value)


def test_a_quick_dataset_key_that_did_not_apply_is_not_blamed_for_a_refusal(project):
    """fslab study run sen-table2 --scale quick --dataset synthetic-mini (README: the stand-in's validation split
    has 16 classes) blamed 'quick.set.dataset.val_classes (on omniglot)', a key that applies only on the quick
    scale's synthetic and that the refusal names only in its suggestion; the study's 20-way validation is what
    the stand-in refuses."""
    result = fslab_here("study", "run", "sen-table2", "--scale", "quick", "--dataset", "synthetic-mini", cwd=project)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
    where, _, said = result.stderr.removeprefix("error: ").partition(": config key ")
    assert where.endswith("/sen-table2.toml: sweep 'pn-omniglot'.set.eval.ways (on omniglot)"), where
    assert said.startswith("'eval.ways' must be at most 16 for synthetic-mini's val split") and said.endswith(
        "; --set dataset.val_classes=20 gives the split that many\n")
    assert not (project / "runs").exists() or not [p for p in (project / "runs").iterdir() if p.name != "sweeps"]


@pytest.mark.parametrize("change, said", [
    ({"set": {"train.epochs": "one"}}, "sweep 'nca'.set.train.epochs: must be an integer, got \"one\""),
    ({"grid": {"train.lr": [0.1, "fast"]}}, "sweep 'nca'.grid.train.lr: must be a number, got \"fast\""),
    ({"grid": {"eval.shots": [[1], [5, "a"]]}}, "sweep 'nca'.grid.eval.shots[1]: must be an integer, got \"a\""),
    ({"grid": {"train.lr": [0.1, 0.2]}, "quick": {"grid": {"train.lr": ["fast"]}}},
     "quick.grid.train.lr: must be a number, got \"fast\""),
    ({"quick": {"set": {"train.flip": "no"}}}, "quick.set.train.flip: must be true or false, got \"no\""),
    # the quick scale replaces the paper's epochs: checked as the study is read, it hid the paper's error
    ({"set": {"train.epochs": "3"}, "quick": {"set": {"train.epochs": 1}}},
     "sweep 'nca'.set.train.epochs: must be an integer, got \"3\""),
])
def test_a_value_of_the_wrong_type_is_refused_as_the_study_is_read(change, said):
    """A study file's value of the wrong type for one of fslab's keys was found only where a scale resolved
    it: one the quick scale replaces passed fslab study show and run --scale quick (only the paper scale or
    the kit's test said it). It is checked as a sweep file's is, when the file is read."""
    data, change = tiny(published=[]), dict(change)
    data.update({"quick": change.pop("quick")} if "quick" in change else {})
    data["sweep"][0].update(change)
    with pytest.raises(ConfigError) as error:
        parse_study(data, "studies/tiny.toml")
    assert str(error.value) == f"studies/tiny.toml: {said}"


def test_a_set_on_the_command_line_is_not_blamed_on_the_study_file(registry, tmp_path):
    study = parse_study(tiny(published=[]), "studies/tiny.toml", path=Path("studies/tiny.toml"))
    with pytest.raises(UsageError) as error:
        resolve_study(study, "paper", settings=store(tmp_path), registry=registry,
                      extra=({"train": {"epochs": "one"}},))
    assert str(error.value).startswith("study tiny, sweep 'nca' on synthetic: config key 'train.epochs'"), error.value


def test_a_run_the_checks_refuse_names_the_study_file_and_key_and_queues_nothing(registry, tmp_path):
    """The checks before queueing (here: more ways than the validation split has classes) said 'study tiny,
    sweep 'nca' on synthetic: ...' of a value the study file gave, as resolving did."""
    data = tiny(published=[])
    data["sweep"][0]["set"].update({"eval.ways": 10, "dataset.val_classes": 6})
    study = parse_study(data, "studies/tiny.toml", path=Path("studies/tiny.toml"))
    with pytest.raises(UsageError) as error:
        queue_study(study, "paper", settings=store(tmp_path), registry=registry)
    assert str(error.value).startswith("studies/tiny.toml: sweep 'nca'.set.eval.ways (on synthetic): config key "
                                       "'eval.ways' must be at most 6 for synthetic's val split"), str(error.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("extra, given, evaluated", [
    ({"eval": {"ways": 10}}, "--set eval.ways", "10-way 1, 5-shot"),
    ({"eval": {"shots": [5]}}, "--set eval.shots", "5-way 5-shot"),
])
def test_a_set_that_leaves_a_published_cell_without_runs_is_named(registry, tmp_path, extra, given, evaluated):
    """--set eval.ways=10 was refused as the study file's mistake: '...tiny.toml: the published 5-way 1-shot
    cell ...; set eval.extra_ways or eval.shots in the sweep', a file the user had not touched."""
    study = parse_study(tiny(), "studies/tiny.toml", path=Path("studies/tiny.toml"))
    with pytest.raises(UsageError) as error:
        resolve_study(study, "paper", settings=store(tmp_path), registry=registry, extra=(extra,))
    assert str(error.value) == (f"{given}: study tiny's runs of sweep 'nca' on synthetic would evaluate {evaluated}, "
                                f"not its published 5-way 1-shot cell; leave it out"), str(error.value)


def test_a_queue_lock_the_system_refuses_exits_1_and_one_in_the_way_2(tmp_path, monkeypatch):
    """fslab study run on a read-only store exited 2, as for a mistake in its input, where fslab run and
    fslab sweep exit 1 (a file the system refused); a folder standing where the lock goes is the user's to
    remove: 2, as before."""
    import errno

    from fslab.core.errors import FslabError, UsageError
    from fslab.execution import studies

    def refusing(path):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(studies, "open_lock_or_read", refusing)
    with pytest.raises(FslabError) as refused:
        studies._open_queue_lock(tmp_path / "runs" / studies.QUEUE_LOCK)
    assert refused.value.exit_code == 1 and "(Read-only file system)" in str(refused.value)
    monkeypatch.undo()
    (tmp_path / "runs" / studies.QUEUE_LOCK).mkdir(parents=True)
    with pytest.raises(UsageError) as in_the_way:
        studies._open_queue_lock(tmp_path / "runs" / studies.QUEUE_LOCK)
    assert in_the_way.value.exit_code == 2


def test_the_quick_grid_takes_only_values_of_the_paper_grid():
    """[quick] grid is the paper's grid with fewer values (the README's words), but any value was taken:
    a quick point of a value the study never runs at the paper scale, reported beside no published one."""
    data = tiny(published=[])
    data["sweep"][0]["grid"] = {"train.lr": [0.1, 0.05]}
    data["quick"] = {"grid": {"train.lr": [0.05, 0.2]}}
    with pytest.raises(ConfigError) as error:
        parse_study(data, "studies/tiny.toml")
    assert str(error.value) == ("studies/tiny.toml: quick.grid.train.lr: lists 0.2, which no sweep's grid gives it; "
                                "the quick scale takes fewer of the paper's values: some of [0.1, 0.05]")
    data["quick"] = {"grid": {"train.lr": [0.05]}}
    assert parse_study(data, "studies/tiny.toml").quick.grid == {"train.lr": [0.05]}


def test_the_command_that_goes_on_plans_the_runs_the_study_planned(tmp_path, monkeypatch):
    """--data-root '' plans no root (the dataset's own), but the command that goes on (what fslab stop SWEEP
    says) gave --data-root and the current folder: a root the runs never had."""
    monkeypatch.chdir(tmp_path)
    assert run_options("paper", data_root="") == ["--scale", "paper"]
    assert run_options("quick", data_root="data") == ["--scale", "quick", "--data-root", str(tmp_path / "data")]


def test_a_study_path_that_is_a_folder_is_said_to_be_one(registry, tmp_path):
    """A folder named x.toml was 'no study file', as if nothing were there."""
    (tmp_path / "x.toml").mkdir()
    with pytest.raises(UsageError, match=r"x\.toml' is a folder, not a study file; give the path of a study's "):
        find_study(registry, str(tmp_path / "x.toml"))
    with pytest.raises(UsageError, match=r"^no study file '.*y\.toml'$"):
        find_study(registry, str(tmp_path / "y.toml"))


def test_a_dataset_option_naming_no_dataset_is_said_of_the_option(registry, tmp_path):
    """fslab study run nca-supcon --dataset nosuch said "sweep 'supcon' on miniimagenet: Unknown dataset
    'nosuch'", naming the study's dataset that --dataset replaces, not the option that gave the name."""
    study = parse_study(tiny(published=[]), "studies/tiny.toml", path=Path("studies/tiny.toml"))
    with pytest.raises(UsageError) as error:
        resolve_study(study, "paper", settings=store(tmp_path), registry=registry, dataset="synthetik")
    assert str(error.value).startswith("--dataset synthetik: Unknown dataset 'synthetik'. Did you mean 'synthetic'?")


def test_study_list_names_a_plugin_that_failed_to_load_and_exits_1(project):
    """fslab study list exited 0 when a plugin failed to load (its studies missing from the list), where
    fslab plugins exits 1, so a script or a CI job checking a study package saw a success."""
    from .test_registry import write_plugin

    write_plugin(project / "local", "broken", "import not_a_module_anywhere\n")
    (project / "fslab.toml").write_text('[project]\nplugin_dirs = ["local"]\n')
    listed = fslab("study", "list", cwd=project)
    assert listed.returncode == 1 and "nca-table3" in listed.stdout  # the others listed whole first
    assert listed.stderr == (f"fslab plugin 'local:broken' failed to load: ModuleNotFoundError: No module named "
                             f"'not_a_module_anywhere'; raised loading {project / 'local' / 'broken.py'} (a file of "
                             f"plugin_dirs in fslab.toml)\n")


def test_a_study_s_runs_wait_for_a_scheduler_only_once_its_record_names_them(registry, tmp_path, monkeypatch):
    """As a sweep's: a study queued each run, tagged it, and wrote its record last, so a scheduler listing
    the store meanwhile started runs of no recorded study. They are held until the record is written."""
    from fslab.core import sweeps
    from fslab.execution import studies
    from fslab.execution.scheduler import waiting_runs

    config = store(tmp_path)
    seen, write_status, save_sweep = [], Run.write_status, studies.save_sweep

    def a_scheduler_looks(self, **fields):
        write_status(self, **fields)
        seen.append((fields.get("sweep"), waiting_runs(config.runs_dir)))

    def recorded_then_looks(runs_dir, sweep_id, **record):
        seen.append(("before the record", waiting_runs(runs_dir)))
        return save_sweep(runs_dir, sweep_id, **record)

    monkeypatch.setattr(Run, "write_status", a_scheduler_looks)
    monkeypatch.setattr(studies, "save_sweep", recorded_then_looks)
    outcome = queue_study(parse_study(tiny(), "tiny.toml"), "paper", settings=config, registry=registry)
    assert seen == [(outcome.sweep_id, [])] * 6 + [("before the record", [])]
    assert sorted(run.id for run in waiting_runs(config.runs_dir)) == sorted(outcome.created)
    assert sweeps.load_sweep(config.runs_dir, outcome.sweep_id)["runs"] == outcome.created
