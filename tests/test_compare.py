"""Pooled and paired comparisons, checked against direct computation."""

import csv
import io
import json
import math
import random
import re
from fractions import Fraction

import hypothesis
import pytest
from hypothesis import strategies as st

from fslab.core.errors import UsageError
from fslab.core.runstore import create_run, list_runs
from fslab.core.text import percent
from fslab.reports.compare import caption, compare, md, mean_ci, render, tex

from .runs_helpers import fslab_here, with_checkpoint


def direct_ci(values):
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return mean, 1.96 * std / math.sqrt(len(values))


def make_run(runs_dir, lr, seed, accuracies_by_shots):
    run = create_run(runs_dir, "nca", {"method": "nca", "seed": seed, "device": "cpu",
                                       "train": {"lr": lr, "epochs": 2}, "loss": {"name": "nca"}})
    for shots, accuracies in accuracies_by_shots.items():
        run.save_accuracies({"split": "test", "ways": 5, "shots": shots, "queries": 15, "episodes": len(accuracies),
                             "evaluator": "centroid", "seed": 0, "epoch": 2,
                             "accuracy": sum(accuracies) / len(accuracies), "ci95": 0.0}, accuracies)
    return run


@pytest.fixture
def store(tmp_path):
    rng = random.Random(0)
    data = {}
    for lr in (0.1, 0.05):
        for seed in (0, 1, 2):
            accs = {n: [rng.choice([0.6, 0.8, 1.0]) - (0.1 if lr == 0.05 else 0) for _ in range(40)] for n in (1, 5)}
            data[(lr, seed)] = (make_run(tmp_path / "runs", lr, seed, accs), accs)
    return tmp_path, data


def test_groups_pool_seeds_and_pair_by_seed(store):
    _, data = store
    report = compare([r for r, _ in data.values()], shots=[1, 5])
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [("train.lr=0.1", 3), ("train.lr=0.05", 3)]
    for g, lr in zip(report["groups"], (0.1, 0.05)):
        for n in (1, 5):
            pooled = [a for seed in (0, 1, 2) for a in data[(lr, seed)][1][n]]
            mean, ci = direct_ci(pooled)
            got = g["results"][f"{n}-shot"]
            assert got["episodes"] == 120 and math.isclose(got["accuracy"], mean) and math.isclose(got["ci95"], ci)
    (five,) = [p for p in report["paired"] if p["shots"] == 5]
    diffs = [b - a for seed in (0, 1, 2) for a, b in zip(data[(0.1, seed)][1][5], data[(0.05, seed)][1][5])]
    mean, ci = direct_ci(diffs)
    assert five["episodes"] == 120 and math.isclose(five["difference"], mean) and math.isclose(five["ci95"], ci)


def test_group_by_a_key_merges_the_rest(store):
    _, data = store
    report = compare([r for r, _ in data.values()], shots=[5], group_by=["loss.name"])
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [("loss.name=nca", 6)]
    assert report["paired"] == []


def test_group_by_pairs_each_run_with_its_twin_in_the_other_settings_too(tmp_path):
    # --group-by loss.name pools both learning rates in each group, so a group holds two runs of each seed:
    # every run of a seed was paired with the same one of the baseline (the last of that seed), here the
    # other learning rate's, where a paired difference must hold all but the compared key fixed
    rng = random.Random(1)
    accs = {}
    for loss in ("nca", "protonet"):
        for lr in (0.1, 0.05):
            for seed in (0, 1):
                scores = [rng.choice([0.2, 0.6, 1.0]) for _ in range(30)]
                run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "device": "cpu",
                                                            "train": {"lr": lr}, "loss": {"name": loss}})
                run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 30,
                                     "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0},
                                    scores)
                accs[(loss, lr, seed)] = scores
    report = compare(list_runs(tmp_path / "runs"), shots=[5], group_by=["loss.name"])
    assert [g["group"] for g in report["groups"]] == ["loss.name=nca", "loss.name=protonet"]
    (paired,) = report["paired"]
    diffs = [b - a for lr in (0.1, 0.05) for seed in (0, 1)
             for a, b in zip(accs[("nca", lr, seed)], accs[("protonet", lr, seed)])]
    mean, ci = direct_ci(diffs)
    assert paired["episodes"] == 120 and math.isclose(paired["difference"], mean) and math.isclose(paired["ci95"], ci)

def test_runs_on_several_gpus_fall_in_the_group_of_their_one_gpu_twins(tmp_path):
    """--gpus N trains as one process on the whole batch: like the device, the number of
    processes says where a run trained, not what it learned, so it splits no group."""
    accs = {5: [0.6, 0.8, 1.0, 0.8]}
    one = make_run(tmp_path / "runs", 0.1, 0, accs)
    two = make_run(tmp_path / "runs", 0.1, 1, accs)
    config = json.loads((two.path / "config.json").read_text())
    config["train"]["processes"] = 2
    (two.path / "config.json").write_text(json.dumps(config))
    report = compare([one, two], shots=[5])
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [("method=nca", 2)]


def test_groups_are_labelled_as_set_takes_their_settings(tmp_path):
    runs = []
    for seed, (center, widths) in enumerate([(True, [8, 16]), (False, [8, 16]), (False, [16, 32])]):
        run = make_run(tmp_path / "runs", 0.1, seed, {5: [0.5, 1.0]})
        config = json.loads((run.path / "config.json").read_text())
        config["eval"], config["backbone"] = {"center": center}, {"widths": widths}
        (run.path / "config.json").write_text(json.dumps(config))
        runs.append(run)
    report = compare(runs, shots=[5])
    assert [g["group"] for g in report["groups"]] == [  # not Python's True and False, which --set refuses
        "backbone.widths=[8, 16], eval.center=true", "backbone.widths=[8, 16], eval.center=false",
        "backbone.widths=[16, 32], eval.center=false"]


def test_csv_and_json_parse_back(store):
    _, data = store
    report = compare([r for r, _ in data.values()], shots=[1, 5])
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert [(r["group"], r["baseline"]) for r in rows] == [
        ("train.lr=0.1", ""), ("train.lr=0.05", ""), ("train.lr=0.05", "train.lr=0.1")]
    for row, group in zip(rows, report["groups"]):
        for n in ("1-shot", "5-shot"):
            result = group["results"][n]
            assert [float(row[f"{n} {c}"]) for c in ("accuracy", "ci95")] == [result["accuracy"], result["ci95"]]
            assert int(row[f"{n} episodes"]) == result["episodes"] and row[f"{n} difference"] == ""
    for n in (1, 5):  # a difference has columns of its own, never an accuracy's
        pair = next(p for p in report["paired"] if p["shots"] == n)
        assert float(rows[2][f"{n}-shot difference"]) == pair["difference"] < 0
        assert float(rows[2][f"{n}-shot difference ci95"]) == pair["ci95"]
        assert int(rows[2][f"{n}-shot difference episodes"]) == pair["episodes"] == 120
        assert rows[2][f"{n}-shot accuracy"] == rows[2]["seeds"] == ""
    assert json.loads(render(report, "json")) == json.loads(json.dumps(report))
    md = render(report, "md").splitlines()
    assert md[2] == "| group | seeds | 1-shot | 5-shot |" and len(md) == 7
    one, five = (next(p for p in report["paired"] if p["shots"] == n) for n in (1, 5))
    assert md[6] == (f"| train.lr=0.05 − train.lr=0.1, paired over the same episodes | - | "
                     f"{100 * one['difference']:+.2f} ± {100 * one['ci95']:.2f} | "
                     f"{100 * five['difference']:+.2f} ± {100 * five['ci95']:.2f} |")
    latex = render(report, "latex")
    assert latex.splitlines()[1] == "\\begin{tabular}{lrrr}" and "$\\pm$" in latex
    assert "train.lr=0.05 $-$ train.lr=0.1, paired over the same episodes & - & " in latex
    # a negative difference's sign is a minus, not the hyphen LaTeX's text mode would set for '-'
    assert latex.splitlines()[-2] == (f"train.lr=0.05 $-$ train.lr=0.1, paired over the same episodes & - & "
                                      f"$-${-100 * one['difference']:.2f} $\\pm$ {100 * one['ci95']:.2f} & "
                                      f"$-${-100 * five['difference']:.2f} $\\pm$ {100 * five['ci95']:.2f} \\\\")
    assert tex("lr=-1, run-2, x-.5, -.5, 1e-3, -") == "lr=$-$1, run-2, x-.5, $-$.5, 1e-3, -"


def test_latex_names_the_characters_its_default_font_sets_as_others():
    """LaTeX's default encoding (OT1) sets '|' as an em dash and '<', '>' as '¡', '¿': a study's label
    'ProtoNet | pipe' or a setting 'a<b' came out in a table as other text."""
    assert tex("ProtoNet | pipe, a<b, c>d, x->y") == ("ProtoNet \\textbar{} pipe, a\\textless{}b, "
                                                      "c\\textgreater{}d, x$\\to$y")


def test_md_latex_and_csv_have_the_columns_of_shots_in_its_order_as_the_table(store):
    """--shots 5,1,20 gave the table 5-shot, 1-shot and 20-shot columns (20-shot all '-'), md, latex
    and csv only 1-shot and 5-shot, sorted: the formats of one comparison disagreed."""
    _, data = store
    report = compare([r for r, _ in data.values()], shots=[5, 1, 20])
    assert render(report, "md").splitlines()[2] == "| group | seeds | 5-shot | 1-shot | 20-shot |"
    assert render(report, "md").splitlines()[4].endswith(" | - |")  # no run has 20-shot scores
    assert render(report, "latex").splitlines()[2] == "group & seeds & 5-shot & 1-shot & 20-shot \\\\"
    header = next(csv.reader(io.StringIO(render(report, "csv"))))
    assert [c for c in header if c.endswith("accuracy")] == ["5-shot accuracy", "1-shot accuracy", "20-shot accuracy"]


def test_seed_values_are_in_numeric_order(tmp_path):
    """fslab sweep --seed 8 --seeds 3 gave seed_values [10, 8, 9] (sorted as text), here and on the dashboard."""
    for seed in (9, 10, 8):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed})
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2,
                             "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0}, [0.4, 0.6])
    (group,) = compare(list_runs(tmp_path / "runs"), shots=[5])["groups"]
    assert group["seed_values"] == [8, 9, 10]


def test_cli_compare(store, builtin_plugins, monkeypatch):
    folder, data = store
    monkeypatch.chdir(folder)
    out = fslab_here("compare", "all", "--format", "json", cwd=folder)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["groups"]) == 2
    table = fslab_here("compare", "all", cwd=folder).stdout
    assert "train.lr=0.05 − train.lr=0.1, 5-shot:" in table
    bad = fslab_here("compare", "all", "--format", "xls", cwd=folder)
    assert bad.returncode == 2 and "unknown format 'xls'" in bad.stderr
    for args, message in [(["all", "--split", "train"], "--split must be test or val, got 'train'"),
                          # an impossible shape was "none of these runs has saved test accuracies for 0-way ..."
                          (["all", "--ways", "0"], "--ways must be at least 2, got 0"),
                          (["all", "--queries", "-1"], "--queries must be at least 1, got -1"),
                          (["all", "--shots", "1,0"], "--shots takes whole numbers of at least 1 separated by "
                                                      "commas (e.g. 1,5), got '1,0'"),
                          (["all", next(iter(data.values()))[0].id], "'all' names every run: give it alone, or "
                                                                      "name the runs and sweeps")]:
        bad = fslab_here("compare", *args, cwd=folder)
        assert bad.returncode == 2 and bad.stderr == f"error: {message}\n", args
    (folder / "empty").mkdir()
    none = fslab_here("compare", "all", cwd=folder / "empty")
    assert none.returncode == 2 and none.stderr.startswith("error: no runs to compare: runs/ holds none yet")


def test_eval_compare_and_plot_check_their_episode_options_in_one_place(store, monkeypatch, builtin_plugins):
    from fslab.cli.reports import episode_options

    assert episode_options("val", "5, 1", 20, 15, 100) == [5, 1]
    for args, message in [(("test", "1", 1, 15), "--ways must be at least 2, got 1"),
                          (("test", "1", 5, 0), "--queries must be at least 1, got 0"),
                          (("test", "1", 5, 15, 0), "--episodes must be from 2 to 1,000,000 (one episode gives no "
                                                       "95% CI), got 0"),
                          (("test", "", 5, 15), "--shots takes whole numbers of at least 1 separated by commas "
                                                "(e.g. 1,5), got ''"),
                          # an empty item is a typo, as in --grid (it was read as 1,5)
                          (("test", "1,,5", 5, 15), "--shots takes whole numbers separated by commas (e.g. 1,5), "
                                                    "got '1,,5'")]:
        with pytest.raises(UsageError) as error:
            episode_options(*args)
        assert str(error.value) == message
    folder, _ = store
    bad = fslab_here("plot", "batch-size", "all", "--ways", "1", "--out", str(folder / "p.png"), cwd=folder)
    assert bad.returncode == 2 and bad.stderr == "error: --ways must be at least 2, got 1\n"
    assert not (folder / "p.png").exists()


def test_a_run_whose_configuration_sections_are_not_tables_is_left_out_not_fatal(tmp_path, builtin_plugins):
    """Pairing read dataset settings with .items(): "dataset": ["x"] raised AttributeError."""
    good = make_run(tmp_path / "runs", 0.1, 0, {5: [0.5, 1.0]})
    other = make_run(tmp_path / "runs", 0.05, 0, {5: [1.0, 1.0]})
    damaged = make_run(tmp_path / "runs", 0.2, 0, {5: [1.0, 0.5]})
    config = json.loads((damaged.path / "config.json").read_text())
    config["dataset"] = ["x"]
    (damaged.path / "config.json").write_text(json.dumps(config))
    report = compare([good, other, damaged], shots=[5])
    assert report["unreadable"] == [damaged.id]
    assert [g["group"] for g in report["groups"]] == ["train.lr=0.1", "train.lr=0.05"]
    assert [(p["shots"], p["difference"]) for p in report["paired"]] == [(5, pytest.approx(0.25))]
    shown = fslab_here("compare", "all", "--shots", "5", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stderr == f"1 run left out, each one whose configuration cannot be " \
                                                     f"read: {damaged.id}\n"  # not "1 run ..., their configuration"


def test_all_names_a_run_whose_config_json_is_gone_as_fslab_runs_lists_it(tmp_path, builtin_plugins):
    """fslab runs lists a run whose config.json is gone (unreadable) and fslab compare ID names it left out,
    but 'all' counted only folders with a config.json: fslab compare all dropped it without a word. Every
    listing takes a run as fslab runs does, and 'last' names the newest so too."""
    make_run(tmp_path / "runs", 0.1, 0, {5: [0.5, 1.0]})
    make_run(tmp_path / "runs", 0.05, 0, {5: [1.0, 1.0]})
    gone = make_run(tmp_path / "runs", 0.2, 0, {5: [1.0, 0.5]})
    (gone.path / "config.json").unlink()
    shown = fslab_here("compare", "all", "--shots", "5", cwd=tmp_path)
    assert shown.returncode == 0
    assert shown.stderr == f"1 run left out, each one whose configuration cannot be read: {gone.id}\n"
    assert fslab_here("show", "last", cwd=tmp_path).stdout.split()[:2] == [gone.id, "unreadable"]
    assert fslab_here("runs", "--ids", cwd=tmp_path).stdout.split()[0] == gone.id


def test_no_scores_by_the_evaluator_asked_for_names_it_and_how_to_get_them(store, builtin_plugins):
    folder, data = store
    for run, _ in data.values():  # a checkpoint fslab eval scores (without, the line names none it would refuse)
        with_checkpoint(run)
    ids = " ".join(run.id for run in list_runs(folder / "runs"))  # every run, by id: the line runs as printed
    bad = fslab_here("compare", "all", "--evaluator", "knn", cwd=folder)
    assert (bad.returncode, bad.stderr) == (2, "error: none of these runs has saved test accuracies by evaluator "
                                               "'knn' for 5-way 1,5-shot, 15 queries; they have them by centroid "
                                               "(--evaluator centroid); finish them or run: fslab eval "
                                               f"{ids} --evaluator knn\n")
    # a label with parameters gives the --set of each, ready to paste (it said evaluator.KEY=VALUE)
    bad = fslab_here("compare", "all", "--evaluator", "knn[k=3,ties=smallest]", cwd=folder)
    assert bad.returncode == 2 and bad.stderr.endswith(
        f"run: fslab eval {ids} --evaluator knn --set evaluator.k=3 --set evaluator.ties=smallest\n"), bad.stderr


def test_no_scores_names_the_fslab_eval_of_the_split_shots_and_shape_asked_for(store, builtin_plugins):
    """The fslab eval that 'no results' suggested was always that of the test split, 1 and 5 shots and
    each run's own shape: for --split val, --shots 20 or --ways 10 it made scores compare still lacked."""
    folder, data = store
    for run, _ in data.values():  # a checkpoint fslab eval scores (without, the line names none it would refuse)
        with_checkpoint(run)
    ids = " ".join(run.id for run in list_runs(folder / "runs"))
    for options, wanted in ((["--split", "val"], f"fslab eval {ids} --split val"),
                            (["--shots", "20"], f"fslab eval {ids} --shots 20"),
                            (["--ways", "10", "--queries", "5", "--shots", "1,5"],
                             f"fslab eval {ids} --ways 10 --queries 5")):
        bad = fslab_here("compare", "all", *options, cwd=folder)
        assert bad.returncode == 2 and bad.stderr.endswith(f"; finish them or run: {wanted}\n"), bad.stderr
        bad = fslab_here("plot", "train.lr", "all", *options, cwd=folder)
        assert bad.returncode == 2 and bad.stderr.endswith(f"; finish them or run: {wanted}\n"), bad.stderr


def test_no_scores_names_the_fslab_eval_on_the_episodes_the_runs_own_test_drew(tmp_path, builtin_plugins):
    """Where no run had the scores asked for (--shots 20, --split val, --ways 3), the fslab eval RUN named had no
    --episodes: fslab eval's default, the protocol's 10,000, for runs tested on 4 and 6. It names the fewest of
    the counts each run's own test drew (its log), else its eval.test_episodes, as the --precision lines do."""
    runs = []
    for seed, test_episodes, drawn in ((0, 10000, 4), (1, 6, 6)):  # the first a finetune run's: 4 of its 10,000
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "train": {"lr": 0.1},
                                                    "eval": {"test_episodes": test_episodes}})
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": drawn,
                             "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0},
                            [0.5] * drawn)
        with_checkpoint(run)
        runs.append(run)
    with runs[0].metrics_path.open("a") as log:  # only the first one's log keeps its test
        log.write(json.dumps({"event": "eval", "time": 1.0, "split": "test", "ways": 5, "shots": 5, "queries": 15,
                              "episodes": 4, "evaluator": "centroid", "accuracy": 0.5, "ci95": 0.0}) + "\n")
    ids = " ".join(run.id for run in list_runs(tmp_path / "runs"))
    for options, wanted in ((["--shots", "20"], f"fslab eval {ids} --shots 20 --episodes 4"),
                            (["--split", "val", "--shots", "5"],
                             f"fslab eval {ids} --split val --shots 5 --episodes 4"),
                            (["--ways", "3", "--shots", "5"], f"fslab eval {ids} --shots 5 --ways 3 --episodes 4")):
        for command in (["compare", "all"], ["plot", "train.lr", "all"]):
            bad = fslab_here(*command, *options, cwd=tmp_path)
            assert bad.returncode == 2 and bad.stderr.endswith(f"; finish them or run: {wanted}\n"), bad.stderr
    runs[0].metrics_path.write_text("")  # no test logged: each one's eval.test_episodes, the fewest of 10,000 and 6
    bad = fslab_here("compare", "all", "--shots", "20", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.endswith(f"; finish them or run: fslab eval {ids} --shots 20 "
                                                       f"--episodes 6\n")


def test_mean_ci_matches_the_formula():
    values = [0.0, 1.0, 0.0, 1.0]
    assert mean_ci(values) == (0.5, 1.96 * 0.5 / 2)


def test_differences_are_to_the_first_group_with_scores_when_the_first_is_still_queued(tmp_path):
    """A first group without scores (its runs queued, running or failed) was the baseline, so compare gave no
    paired difference at all, though the other groups' runs paired by seed."""
    runs_dir = tmp_path / "runs"
    queued = make_run(runs_dir, 0.2, 0, {})
    base = make_run(runs_dir, 0.1, 0, {5: [0.5, 1.0]})
    other = make_run(runs_dir, 0.05, 0, {5: [1.0, 1.0]})
    report = compare([queued, base, other], shots=[5])
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [("train.lr=0.2", 0), ("train.lr=0.1", 1),
                                                                    ("train.lr=0.05", 1)]
    assert [(p["group"], p["baseline"], p["difference"]) for p in report["paired"]] == [
        ("train.lr=0.05", "train.lr=0.1", pytest.approx(0.25))]
    assert render(report, "md").splitlines()[-1] == ("| train.lr=0.05 − train.lr=0.1, paired over the same "
                                                     "episodes | - | +25.00 ± 34.65 |")


def test_scores_of_an_older_checkpoint_are_not_read_on_more_episodes(tmp_path):
    """A run scored by fslab eval on 100 episodes at epoch 1, then resumed and tested at epoch 2 on 40, was read
    on the 100 episodes of the network it no longer has, since every run had been scored on 100."""
    runs_dir = tmp_path / "runs"
    runs = []
    for lr, old, new in ((0.1, 0.25, 0.5), (0.05, 0.25, 1.0)):
        run = make_run(runs_dir, lr, 0, {})
        for epoch, episodes, accuracy in ((1, 4, old), (2, 2, new)):
            run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": episodes,
                                 "evaluator": "centroid", "seed": 0, "epoch": epoch, "accuracy": accuracy,
                                 "ci95": 0.0}, [accuracy] * episodes)
        runs.append(run)
    report = compare(runs, shots=[5])
    assert [(g["results"]["5-shot"]["accuracy"], g["results"]["5-shot"]["episodes"]) for g in report["groups"]] == [
        (0.5, 2), (1.0, 2)]
    assert [(p["difference"], p["episodes"]) for p in report["paired"]] == [(0.5, 2)]


def test_a_run_counts_once_named_twice_or_repeated_and_seeds_count_runs_with_results(tmp_path, builtin_plugins):
    runs_dir = tmp_path / "runs"
    first = make_run(runs_dir, 0.1, 0, {5: [0.5, 1.0]})
    second = make_run(runs_dir, 0.1, 1, {5: [0.25, 0.75]})
    repeat = make_run(runs_dir, 0.1, 0, {5: [1.0, 1.0]})  # the same settings and seed as the first
    unfinished = make_run(runs_dir, 0.1, 2, {})
    report = compare([first, second, second, repeat, unfinished], shots=[5])
    (group,) = report["groups"]
    assert report["repeated"] == [first.id]  # the newest of the two with results counts
    assert group["runs"] == [second.id, repeat.id, unfinished.id] and group["seeds"] == 2
    assert group["seed_values"] == [0, 1, 2]
    result = group["results"]["5-shot"]
    mean, ci = direct_ci([0.25, 0.75, 1.0, 1.0])
    assert result["episodes"] == 4 and result["runs"] == 2
    assert math.isclose(result["accuracy"], mean) and math.isclose(result["ci95"], ci)
    shown = fslab_here("compare", first.id, second.id, second.id, repeat.id, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.strip() == (f"1 run left out, each repeating the settings and seed of another "
                                    f"(the newest with results counts): {first.id}")


def save(run, accuracies, episodes_seed=0):
    run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": len(accuracies),
                         "evaluator": "centroid", "seed": episodes_seed, "epoch": 2,
                         "accuracy": sum(accuracies) / len(accuracies), "ci95": 0.0}, accuracies)


def test_every_run_is_read_on_the_episodes_all_of_them_share(tmp_path):
    """A run evaluated again on more episodes (fslab eval --episodes) weighs as
    much as the others, and still pairs with its baseline."""
    runs_dir = tmp_path / "runs"
    base = [make_run(runs_dir, 0.1, seed, {5: [0.5, 0.5, 1.0, 1.0]}) for seed in (0, 1)]
    other = [make_run(runs_dir, 0.05, seed, {5: [1.0, 1.0, 1.0, 0.5]}) for seed in (0, 1)]
    save(other[0], [0.0] * 100)  # the same run scored on 100 episodes too
    report = compare([*base, *other], shots=[5])
    assert [g["results"]["5-shot"]["episodes"] for g in report["groups"]] == [8, 8]
    assert math.isclose(report["groups"][1]["results"]["5-shot"]["accuracy"], 0.875)
    (pair,) = report["paired"]
    assert pair["episodes"] == 8 and math.isclose(pair["difference"], 0.125)
    alone = compare([other[0]], shots=[5])  # by itself, a run is read on its most episodes
    assert alone["groups"][0]["results"]["5-shot"]["episodes"] == 100


def test_runs_that_share_no_episode_count_are_each_read_on_the_count_all_reach(tmp_path):
    """One seed scored only on more episodes (fslab eval's 10,000 beside another's own 50) was read on its
    most: the pool weighed it more, and it paired with nothing. Each run is now read on its first as many
    episodes as every run reaches (the same episodes, to the bit), and the caption says which were cut."""
    runs_dir = tmp_path / "runs"
    base = make_run(runs_dir, 0.1, 0, {5: [0.5, 0.5, 1.0, 1.0]})
    more = make_run(runs_dir, 0.1, 1, {})
    save(more, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # only ever scored on 6
    other = make_run(runs_dir, 0.05, 0, {})
    save(other, [1.0] * 10)
    report = compare([base, more, other], shots=[5])
    first, second = (g["results"]["5-shot"] for g in report["groups"])
    assert (first["episodes"], first["episodes_per_run"], first["cut"]) == (8, 4, [more.id])
    assert math.isclose(first["accuracy"], 0.625) and second["episodes"] == 4
    assert report["episodes_per_run"] == {"5-shot": 4} and report["cut"] == sorted([more.id, other.id])
    (pair,) = report["paired"]
    assert pair["episodes"] == 4 and math.isclose(pair["difference"], 0.25)
    assert caption(report).endswith(
        f"over pooled episodes (each cell's count), each run read on its first 4 episodes, the most every run "
        f"reaches (2 runs scored on more, so cut: {', '.join(sorted([more.id, other.id]))})")
    shown = fslab_here("compare", base.id, more.id, other.id, "--shots", "5", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "each run read on its first 4 episodes, the most every run reaches (2 runs scored on more, so cut:" in (
        " ".join(shown.stdout.split()))


def test_runs_on_different_data_are_not_paired(tmp_path):
    runs = []
    for dataset in ("synthetic", "omniglot"):
        run = make_run(tmp_path / "runs", 0.1, 0, {5: [0.5, 1.0]})
        config = json.loads((run.path / "config.json").read_text())
        config["dataset"] = {"name": dataset, "root": f"/data/{dataset}"}
        (run.path / "config.json").write_text(json.dumps(config))
        runs.append(run)
    report = compare(runs, shots=[5])
    assert [g["group"] for g in report["groups"]] == ["dataset.name=synthetic", "dataset.name=omniglot"]
    assert report["paired"] == []  # the same episode seed draws other images from other data


def scored_on(run, data, accuracies=(0.5, 1.0)):
    """The run's 5-shot test scores saved again, with the fingerprint of the data they were scored on."""
    run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": len(accuracies),
                         "evaluator": "centroid", "seed": 0, "epoch": 2, **({"data": data} if data else {}),
                         "accuracy": sum(accuracies) / len(accuracies), "ci95": 0.0}, list(accuracies))
    return run


def test_runs_scored_on_other_data_are_not_paired_even_with_the_same_dataset_settings(tmp_path):
    """A folder dataset's root is its data: two runs of it on other folders share every
    setting that pairing read, and their "paired difference" was one of unrelated images."""
    runs_dir = tmp_path / "runs"
    base = scored_on(make_run(runs_dir, 0.1, 0, {}), "a" * 32, (0.5, 1.0))
    same = scored_on(make_run(runs_dir, 0.05, 0, {}), "a" * 32, (1.0, 1.0))
    other = scored_on(make_run(runs_dir, 0.05, 0, {}), "b" * 32, (1.0, 1.0))
    old = scored_on(make_run(runs_dir, 0.05, 0, {}), None, (1.0, 1.0))  # an fslab that saved no fingerprint
    (pair,) = compare([base, same], shots=[5])["paired"]
    assert pair["episodes"] == 2 and math.isclose(pair["difference"], 0.25)
    report = compare([base, other], shots=[5])
    assert report["paired"] == [] and report["data_split"] == []
    assert [g["seeds"] for g in report["groups"]] == [1, 1]
    (pair,) = compare([base, old], shots=[5])["paired"]  # as before fingerprints were saved
    assert math.isclose(pair["difference"], 0.25)
    (saved,) = (old.path / "evaluations").glob("*.json")
    saved.write_text(json.dumps({**json.loads(saved.read_text()), "data": 5}))  # hand-edited: read as unrecorded
    (pair,) = compare([base, old], shots=[5])["paired"]
    assert math.isclose(pair["difference"], 0.25)


def test_a_group_of_runs_scored_on_other_data_is_split_by_data_not_pooled(tmp_path, builtin_plugins):
    """Same settings, other data: its seeds are not seeds of one experiment, and the same seed on
    other data is no repeat; the group is split, each part labelled by the root that tells them apart."""
    runs_dir = tmp_path / "runs"
    runs = []
    for root, seed, data in (("/data/x", 0, "a" * 32), ("/data/x", 1, "a" * 32), ("/data/y", 0, "b" * 32)):
        run = scored_on(make_run(runs_dir, 0.1, seed, {}), data)
        config = json.loads((run.path / "config.json").read_text())
        config["dataset"] = {"name": "folder", "root": root}
        (run.path / "config.json").write_text(json.dumps(config))
        runs.append(run)
    report = compare(runs, shots=[5])
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [
        ("method=nca, dataset.root=/data/x", 2), ("method=nca, dataset.root=/data/y", 1)]
    assert report["repeated"] == [] and report["data_split"] == ["method=nca"]
    assert report["paired"] == []  # seed 0 on y against seed 0 on x: other data
    shown = fslab_here("compare", *(r.id for r in runs), "--shots", "5", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.strip() == ("1 group split by the data its runs were scored on (the fingerprints saved with "
                                    "their scores differ; runs on different data are neither pooled nor paired): "
                                    "method=nca")


def test_an_evaluation_of_another_shape_on_other_data_does_not_move_a_run_to_that_data(tmp_path):
    """fslab eval --data-root B --ways 3 of a run trained and scored 5-way on A: compare --ways 5
    took the run's data from that 3-way evaluation, split it from its seeds on A and, where another
    run had its seed on B, left it out as that run's repeat; its 5-way scores are A's."""
    runs_dir = tmp_path / "runs"
    first, second = (scored_on(make_run(runs_dir, 0.1, seed, {}), "a" * 32) for seed in (0, 1))
    second.save_accuracies({"split": "test", "ways": 3, "shots": 5, "queries": 15, "episodes": 4,
                            "evaluator": "centroid", "seed": 0, "epoch": 2, "data": "b" * 32,
                            "accuracy": 0.5, "ci95": 0.0}, [0.5] * 4)
    report = compare([first, second], shots=[5])
    assert report["data_split"] == [] and report["repeated"] == []
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [("method=nca", 2)]
    assert compare([first, second], shots=[5], ways=3)["groups"][0]["seeds"] == 1  # the 3-way scores: b's alone


def noted_runs(folder, notes: tuple[str, ...]) -> list:
    """A run per note, the same scores each, told apart by loss.note: a label holding what a format escapes."""
    runs = []
    for note in notes:
        run = make_run(folder, 0.1, 0, {5: [0.5, 1.0]})
        config = json.loads((run.path / "config.json").read_text())
        config["loss"]["note"] = note
        (run.path / "config.json").write_text(json.dumps(config))
        runs.append(run)
    return runs


def test_markdown_escapes_a_bar_in_a_label(tmp_path):
    """A | in a label split its Markdown cell in two, shifting every number a column right."""
    md = render(compare(noted_runs(tmp_path / "runs", ("a|b", "c")), shots=[5]), "md").splitlines()
    assert md[4:7] == ["| loss.note=a\\|b | 1 | 75.00 ± 34.65 |", "| loss.note=c | 1 | 75.00 ± 34.65 |",
                       "| loss.note=c − loss.note=a\\|b, paired over the same episodes | - | +0.00 ± 0.00 |"]


def _rendered_cells(markdown: str) -> list[str]:
    """The text of each cell of a Markdown table as a CommonMark renderer with GitHub's tables and
    strikethrough shows it (markdown-it-py, which rich brings)."""
    import html

    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown)
    return [html.unescape(re.sub("<[^>]+>", "", cell)) for cell in re.findall(r"<td>(.*?)</td>", rendered, re.S)]


LABEL_CHARACTERS = list("ab1_*~[]()!<>&`\\| #=.-:é")


@hypothesis.settings(max_examples=400)
@hypothesis.given(st.lists(st.sampled_from(LABEL_CHARACTERS), min_size=1, max_size=14).map("".join)
       | st.sampled_from(["[a](b)", "![a](b)", "a [b][c]", "x\\|y", "_a_", "~~x~~", "&amp;", "<b>x</b>", "`c`"]))
def test_a_markdown_cell_renders_as_the_label_it_escapes(label):
    """md() escaped only |: a label [a](b) rendered as a link 'a', a\\|b as a|b, _x_ in italics."""
    label = label.strip() or "x"  # a cell's edges are trimmed, as every table's
    assert _rendered_cells(f"| h | n |\n|---|---|\n| {md(label)} | 1 |\n") == [label, "1"]


def test_latex_escapes_what_a_label_may_hold(tmp_path):
    latex = render(compare(noted_runs(tmp_path / "runs", ("a & b", "50% of #1 {x_y}")), shots=[5]),
                   "latex").splitlines()
    assert latex[4:7] == ["loss.note=a \\& b & 1 & 75.00 $\\pm$ 34.65 \\\\",
                          "loss.note=50\\% of \\#1 \\{x\\_y\\} & 1 & 75.00 $\\pm$ 34.65 \\\\",
                          "loss.note=50\\% of \\#1 \\{x\\_y\\} $-$ loss.note=a \\& b, paired over the same episodes "
                          "& - & +0.00 $\\pm$ 0.00 \\\\"]


def test_runs_scored_only_at_another_episode_shape_are_named_with_the_options_that_read_them(tmp_path, monkeypatch):
    """compare reads one episode shape (--ways 5 --queries 15): a run evaluated only with 5 queries was
    left out without a word, and 'no results' did not say which shapes the runs have."""
    from typer.testing import CliRunner

    from fslab.cli import app
    from fslab.core.errors import UsageError
    from fslab.core.runstore import create_run

    def make(seed, queries):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "evaluator": {"name": "centroid"}})
        for shots in (1, 5):
            run.save_accuracies({"split": "test", "ways": 5, "shots": shots, "queries": queries, "episodes": 2,
                                 "evaluator": "centroid", "seed": 0, "epoch": 1, "stream": 2, "accuracy": 0.5,
                                 "ci95": 0.1}, [0.4, 0.6])
        with_checkpoint(run)
        return run

    fifteen, five = make(0, 15), make(1, 5)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    both = runner.invoke(app, ["compare", fifteen.id, five.id, "--json"])  # two shapes: the papers' 15 queries
    assert both.exit_code == 0, both.output
    assert both.stderr.strip() == (f"1 run without test scores for 5-way, 15 queries (left out): {five.id}; "
                                   f"they have them for 5-way, 5 queries (--ways 5 --queries 5)")
    assert [json.loads(line)["seeds"] for line in both.stdout.splitlines()] == [1]
    alone = runner.invoke(app, ["compare", five.id, "--queries", "15"])
    assert isinstance(alone.exception, UsageError)
    assert str(alone.exception) == ("none of these runs has saved test accuracies for 5-way 1,5-shot, 15 queries; "
                                    "they have them for 5-way, 5 queries (--ways 5 --queries 5); finish them or "
                                    f"run: fslab eval {five.id} --queries 15")
    assert runner.invoke(app, ["compare", five.id, "--queries", "5"]).exit_code == 0
    own = runner.invoke(app, ["compare", five.id, "--json"])  # no --queries: the one shape its scores have
    assert own.exit_code == 0 and own.stderr == ""
    assert [(line["ways"], line["queries"]) for line in map(json.loads, own.stdout.splitlines())] == [(5, 5)]


def test_a_retrieval_evaluators_pooled_map_is_labelled_in_every_format(tmp_path, builtin_plugins):
    """Runs tested with retrieval-map pool their mAP; compare showed it as a bare number, read as accuracy."""
    for seed, scores in ((0, [0.4, 0.5]), (1, [0.3, 0.6])):
        config = {"method": "map", "seed": seed, "evaluator": {"name": "retrieval-map"}, "loss": {"name": "map"}}
        run = create_run(tmp_path / "runs", "map", config)
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2,
                             "evaluator": "retrieval-map", "metric": "map", "seed": 0, "epoch": 2,
                             "accuracy": sum(scores) / 2, "ci95": 0.0}, scores)
    report = compare(list_runs(tmp_path / "runs"), shots=[5])
    (row,) = report["groups"]
    mean, ci = direct_ci([0.4, 0.5, 0.3, 0.6])
    got = dict(row["results"]["5-shot"])
    assert math.isclose(got.pop("accuracy"), mean) and math.isclose(got.pop("ci95"), ci)
    assert got == {"episodes": 4, "episodes_per_run": 2, "runs": 2, "metric": "map"}
    assert f"| mAP {100 * mean:.2f} ± {100 * ci:.2f} |" in render(report, "md")
    assert "mAP 45.00" in render(report, "latex")
    header, line = list(csv.reader(io.StringIO(render(report, "csv"))))
    assert header[-1] == "metric" and line[-1] == "map"
    shown = fslab_here("compare", "all", "--shots", "5", cwd=tmp_path)
    assert shown.returncode == 0 and f"mAP {100 * mean:.2f}±{100 * ci:.2f} (4)" in shown.stdout, shown.stderr


def test_an_map_is_never_paired_with_an_accuracy(tmp_path):
    """A run tested with retrieval-map and one tested with centroid, both scored on 5-way 1-shot 9-query
    episodes: compare gave 'retrieval-map − centroid: +x points', an mAP less an accuracy."""
    rng = random.Random(3)
    for name, metric, lr in (("centroid", "accuracy", 0.05), ("retrieval-map", "map", 0.1),
                             ("centroid", "accuracy", 0.01)):
        for seed in (0, 1):
            scores = [rng.choice([0.2, 0.6, 1.0]) for _ in range(10)]
            config = {"method": "nca", "seed": seed, "evaluator": {"name": name}, "train": {"lr": lr}}
            run = create_run(tmp_path / "runs", "nca", config)
            run.save_accuracies({"split": "test", "ways": 5, "shots": 1, "queries": 9, "episodes": 10,
                                 "evaluator": name, "metric": metric, "seed": 0, "epoch": 2,
                                 "accuracy": sum(scores) / 10, "ci95": 0.0}, scores)
    report = compare(list_runs(tmp_path / "runs"), shots=[1], ways=5, queries=9)
    assert [g["group"] for g in report["groups"]] == ["evaluator.name=centroid, train.lr=0.05",
                                                      "evaluator.name=retrieval-map, train.lr=0.1",
                                                      "evaluator.name=centroid, train.lr=0.01"]
    # the two accuracy groups still pair; the mAP group pairs with neither
    assert [(p["group"], p["episodes"]) for p in report["paired"]] == [("evaluator.name=centroid, train.lr=0.01", 20)]
    assert "retrieval-map −" not in render(report, "md")


def test_a_difference_that_rounds_to_zero_has_no_minus_sign(tmp_path, builtin_plugins):
    """Episodes (0.2, 0.4, 0.8) against (0.4, 0.8, 0.2) differ by -1.85e-17 on average, a float's noise:
    the table, md and latex printed it as '-0.00', a loss where there is none."""
    for lr, scores in ((0.1, [0.2, 0.4, 0.8]), (0.05, [0.4, 0.8, 0.2])):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "train": {"lr": lr}})
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 3,
                             "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.0, "ci95": 0.0}, scores)
    report = compare(list_runs(tmp_path / "runs"), shots=[5])
    (paired,) = report["paired"]
    assert -1e-12 < paired["difference"] < 0  # the noise this is about
    assert "| +0.00 ± " in render(report, "md") and "& +0.00 $\\pm$ " in render(report, "latex")
    shown = fslab_here("compare", "all", "--shots", "5", cwd=tmp_path)
    assert shown.returncode == 0 and "5-shot: +0.00 ± " in shown.stdout, shown.stdout + shown.stderr
    assert percent(-0.00004, sign=True) == "+0.00" and percent(-0.00005001, sign=True) == "-0.01"
    assert percent(0.0, sign=True) == "+0.00"


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.example(1e15)  # decimal's 28 digits: InvalidOperation, a traceback, from 1e15 up
@hypothesis.given(st.floats())
def test_any_float_in_percent_is_it_rounded_to_two_decimals_never_minus_zero(fraction):
    for sign in (False, True):
        text = percent(fraction, sign=sign)
        if not math.isfinite(fraction):
            assert text == f"{100 * fraction:{'+' if sign else ''}.2f}"
            continue
        assert re.fullmatch(r"[+-]\d+\.\d\d" if sign else r"-?\d+\.\d\d", text) and text != "-0.00"
        # within half a hundredth of the fraction's decimal value (repr's), less the 13 decimals it is first taken to
        assert abs(Fraction(text) - 100 * Fraction(repr(fraction))) <= Fraction(1, 200) + Fraction(1, 10**11)


def test_a_fraction_from_1e15_up_is_written_in_percent_not_raised():
    assert percent(1e15) == "100000000000000000.00" and percent(-1e20, sign=True) == "-" + "1" + "0" * 22 + ".00"


def test_no_scores_by_the_evaluator_asked_for_names_those_the_runs_have(tmp_path, builtin_plugins):
    """--evaluator knn where the runs were evaluated by knn[k=3] said only to run fslab eval --evaluator knn,
    not that --evaluator 'knn[k=3]' reads the scores they have."""
    for seed in (0, 1):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed})
        for label in ("centroid", "knn[k=3]"):
            run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2,
                                 "evaluator": label, "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0},
                                [0.4, 0.6])
        with_checkpoint(run)
    result = fslab_here("compare", "all", "--evaluator", "knn", "--shots", "5", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: none of these runs has saved test accuracies by evaluator 'knn' for 5-way 5-shot, 15 queries; they "
        "have them by knn[k=3], centroid (--evaluator 'knn[k=3]'); finish them or run: fslab eval "
        f"{' '.join(run.id for run in list_runs(tmp_path / 'runs'))} --shots 5 "
        "--evaluator knn"]
    read = fslab_here("compare", "all", "--evaluator", "knn[k=3]", "--shots", "5", cwd=tmp_path)
    # the table's title says whose scores it holds (it read as the runs' own evaluator's)
    assert read.returncode == 0 and read.stdout.splitlines()[0] == (
        "test, 5-way, 15 queries, by knn[k=3], mean ± 95% CI over 4 pooled episodes per cell")


@pytest.mark.parametrize("scored, configured, given, read", [
    ([(5, 5)], [(5, 15)], (None, None), (5, 5)),  # the one shape the scores have
    ([(5, 5), (5, 15)], [(5, 5), (5, 5)], (None, None), (5, 5)),  # two scored: the one the runs evaluate
    ([(5, 5), (5, 15)], [(5, 5), (5, 15)], (None, None), (5, 15)),  # nothing shared: the papers'
    ([], [(10, 3), (10, 3)], (None, None), (10, 3)),  # nothing scored yet (running): the configured one
    ([(5, 5), (10, 3)], [(5, 5), (10, 3)], (10, None), (10, 3)),  # --ways 10 leaves one shape
    # none agrees with --ways 20: the queries the runs share, which fslab eval --ways 20 scores them with (it
    # read the papers' 15, and the error's fslab eval then scored episodes compare still did not read)
    ([(5, 5)], [(5, 5)], (20, None), (20, 5)),
    ([(5, 5), (5, 10)], [(5, 5), (5, 10)], (20, None), (20, 15)),  # the runs share no queries: the papers' 15
    ([(5, 5), (5, 10)], [(5, 10), (5, 10)], (20, None), (20, 10)),  # scores disagree: the configured ones'
    ([(5, 5), (10, 5)], [(5, 5), (10, 5)], (None, None), (5, 5)),  # no one shape: 5 queries shared, the papers' 5-way
    ([(5, 5)], [(5, 5)], (None, 15), (5, 15)),  # --queries 15: the runs' 5-way
    ([(5, 5)], [(5, 5)], (5, 15), (5, 15)),  # both given: as given
    ([], [(10, 3), ("five", None)], (None, None), (10, 3)),  # a damaged eval section says nothing
])
def test_the_episode_shape_read_by_default_is_the_runs_own(tmp_path, scored, configured, given, read):
    """compare, plot and the dashboard's comparison read --ways/--queries the runs were scored at, where
    left out; before, compare and plot read 5-way 15 queries and the dashboard the first run's configuration."""
    from fslab.core.runstore import create_run
    from fslab.reports.compare import RunFiles, scored_shape

    runs = []
    for seed, (ways, queries) in enumerate(configured):
        runs.append(create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "evaluator": {"name": "knn"},
                                                          "eval": {"ways": ways, "queries": queries}}))
    for run, (ways, queries) in zip(runs, scored):
        run.save_accuracies({"split": "test", "ways": ways, "shots": 1, "queries": queries, "episodes": 2,
                             "evaluator": "knn", "seed": 0, "epoch": 1, "stream": 2, "accuracy": 0.5,
                             "ci95": 0.1}, [0.4, 0.6])
    assert scored_shape(runs, "test", [1, 5], *given, None, RunFiles()) == read


def test_one_query_and_one_episode_are_said_in_the_singular(tmp_path, builtin_plugins):
    """'1 queries' and 'paired over 1 episodes' in the table's title and paired lines and in the errors."""
    runs = []
    for lr, accuracy in ((0.1, 0.5), (0.05, 1.0)):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "device": "cpu",
                                                    "train": {"lr": lr}, "eval": {"queries": 1}})
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 1, "episodes": 1,
                             "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": accuracy, "ci95": 0.0},
                            [accuracy])
        with_checkpoint(run)
        runs.append(run)
    shown = fslab_here("compare", "all", "--shots", "5", "--wide", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == ("test, 5-way, 1 query, by centroid, mean ± 95% CI over 1 pooled "
                                            "episode per cell")
    assert shown.stdout.splitlines()[-1] == ("train.lr=0.05 − train.lr=0.1, 5-shot: +50.00 ± 0.00 points "
                                             "(paired over 1 episode)")
    bad = fslab_here("compare", "all", "--shots", "1", cwd=tmp_path)
    assert bad.returncode == 2 and "for 5-way 1-shot, 1 query; finish them" in bad.stderr, bad.stderr


def test_a_group_by_key_a_run_lacks_is_refused_with_the_keys_it_may_mean(tmp_path):
    """A misspelt --group-by (or --series) key was refused with no hint of the keys there are."""
    runs = [make_run(tmp_path / "runs", 0.1, 0, {5: [0.5, 1.0]})]
    with pytest.raises(UsageError) as typo:
        compare(runs, shots=[5], group_by=["train.lrr"])
    assert str(typo.value) == (f"--group-by key 'train.lrr' is not in the configuration of run {runs[0].id}. "
                               f"Did you mean train.lr?")
    with pytest.raises(UsageError) as short:
        compare(runs, shots=[5], group_by=["lr"])
    assert str(short.value).endswith("Did you mean train.lr?")
    with pytest.raises(UsageError) as unknown:
        compare(runs, shots=[5], group_by=["zzz"])
    assert str(unknown.value).endswith("is not in the configuration of run "
                                       f"{runs[0].id}. See its keys with: fslab show {runs[0].id} --json")


def test_shots_named_twice_are_refused_by_compare_plot_and_eval(store, builtin_plugins):
    """--shots 5,5 gave two 5-shot columns and each paired difference twice (plot: two equal panels;
    eval: the same episodes scored twice)."""
    folder, _ = store
    for command in (["compare", "all"], ["plot", "train.lr", "all"], ["eval", "all"]):
        bad = fslab_here(*command, "--shots", "1,5,1", cwd=folder)
        assert (bad.returncode, bad.stderr) == (2, "error: --shots lists 1 twice; each number of shots is scored "
                                                   "once: list it once\n")


def test_runs_without_any_scores_are_named_on_stderr_with_their_state(store, monkeypatch):
    """A run still training, or killed or failed before its test, joined its group's run list and added
    no seed, without a word: a missing seed looked like a settings mismatch."""
    from typer.testing import CliRunner

    from fslab.cli import app

    folder, _ = store
    killed = create_run(folder / "runs", "nca", {"method": "nca", "seed": 3, "device": "cpu",
                                                   "train": {"lr": 0.1, "epochs": 2}, "loss": {"name": "nca"}})
    killed.write_status(state="killed")
    monkeypatch.chdir(folder)
    done = CliRunner().invoke(app, ["compare", "all", "--json"])
    assert done.exit_code == 0, done.output
    assert done.stderr.strip() == f"1 run without test scores (left out): {killed.id} (killed)"
    groups = [json.loads(line) for line in done.stdout.splitlines() if json.loads(line)["type"] == "group"]
    assert [(g["group"], g["seeds"], len(g["runs"])) for g in groups] == [("train.lr=0.1", 3, 4),
                                                                         ("train.lr=0.05", 3, 3)]
    assert compare([killed])["unscored"] == {killed.id: "killed"}


def test_what_else_a_run_was_evaluated_on_makes_no_group(store):
    """Seeds of one setting whose runs also validated on other episodes, tested extra ways or scored
    the final network on validation were split into groups of one seed each, unpaired; those change
    neither what a run learns nor its test at eval.ways. A training key still splits them."""
    _, data = store
    runs = [data[(0.1, seed)][0] for seed in (0, 1, 2)]
    for run, evaluated in zip(runs, ({"val_episodes": 100, "val_shots": 1}, {"extra_ways": [20], "final_val": True},
                                     {"before_training": True})):
        config = json.loads((run.path / "config.json").read_text())
        (run.path / "config.json").write_text(json.dumps({**config, "eval": {**config.get("eval", {}), **evaluated}}))
    report = compare(runs, shots=[1, 5])
    assert [(g["group"], g["seeds"]) for g in report["groups"]] == [("method=nca", 3)]
    for n in (1, 5):
        assert report["groups"][0]["results"][f"{n}-shot"]["accuracy"] == pytest.approx(
            mean_ci([a for seed in (0, 1, 2) for a in data[(0.1, seed)][1][n]])[0])
    config = json.loads((runs[2].path / "config.json").read_text())
    (runs[2].path / "config.json").write_text(json.dumps({**config, "train": {**config["train"], "epochs": 3}}))
    assert [g["seeds"] for g in compare(runs, shots=[1, 5])["groups"]] == [2, 1]


def test_json_with_another_format_is_refused_in_one_line(store, builtin_plugins):
    """fslab compare all --format latex --json printed JSON lines: --json won over --format unsaid."""
    folder, _ = store
    for fmt, what in [("latex", "a LaTeX table"), ("json", "the whole report as one JSON document")]:
        bad = fslab_here("compare", "all", "--format", fmt, "--json", cwd=folder)
        assert bad.returncode == 2 and bad.stdout == "" and bad.stderr == (
            f"error: give --json or --format {fmt}, not both: --json prints a JSON line per group and per "
            f"paired difference, --format {fmt} {what}\n")
    lines = fslab_here("compare", "all", "--json", cwd=folder)  # alone, or with the default table
    assert lines.returncode == 0 and [json.loads(line)["type"] for line in lines.stdout.splitlines()] == [
        "group", "group", "paired", "paired"]


def test_json_lines_name_the_evaluator_the_scores_are_by(store, builtin_plugins):
    """fslab compare --json said "evaluator": null where no --evaluator was given, while the table's first
    line said "by centroid" and csv's evaluator column centroid: a script could not tell whose scores it read."""
    folder, _ = store
    for asked, said in [((), None), (("--evaluator", "centroid"), "centroid")]:
        lines = fslab_here("compare", "all", "--json", *asked, cwd=folder)
        assert lines.returncode == 0, lines.stderr
        assert {(json.loads(line)["evaluator"], tuple(json.loads(line)["evaluators"]))
                for line in lines.stdout.splitlines()} == {(said, ("centroid",))}


def test_an_empty_group_by_or_series_key_is_refused_in_one_line(store, builtin_plugins):
    """--group-by '' was taken as not given (every setting grouped, unsaid), and --group-by train.lr,,
    said "key '' is not in the configuration"; --series alike."""
    folder, _ = store
    for command in (("compare", "all"), ("plot", "train.lr", "all", "--out", str(folder / "p.png"))):
        option = "--group-by" if command[0] == "compare" else "--series"
        for given in ("", "train.lr,,", " , "):
            bad = fslab_here(*command, option, given, cwd=folder)
            assert bad.returncode == 2 and bad.stderr == (
                f"error: {option} takes config keys separated by commas (e.g. train.lr,loss.name), "
                f"got '{given}'\n"), (command, given)
        # a key listed twice was drawn twice in every group's label (train.lr=0.1, train.lr=0.1)
        twice = fslab_here(*command, option, "train.lr, train.lr", cwd=folder)
        assert twice.returncode == 2 and twice.stderr == (
            f"error: {option} lists train.lr twice; each key is one part of a group's label: list it once\n")
    assert not (folder / "p.png").exists()


def test_md_right_aligns_the_number_columns_and_latex_keeps_two_hyphens_apart(store):
    """md's columns were all left-aligned (|---|---|), so numbers of unequal width did not line up as in
    the table and latex; and LaTeX joined '--' in a label into an en dash ('---' an em dash)."""
    _, data = store
    report = compare([r for r, _ in data.values()], shots=[1, 5])
    assert render(report, "md").splitlines()[3] == "|---|---:|---:|---:|"
    assert tex("--lr, a---b, x-->y, --1") == "-{}-lr, a-{}-{}-b, x-{}$\\to$y, -{}-1"
    assert tex("run-2, -0.5") == "run-2, $-$0.5"


def test_md_latex_and_csv_say_the_split_episode_shape_and_evaluator_of_their_numbers(tmp_path):
    """md and latex gave no split, episode shape or evaluator (the table's title does), so a
    --split val table read as a test one; csv gave neither, nor how many runs each cell pools."""
    for seed in (0, 1):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "evaluator": {"name": "knn"}})
        for shots in (1, 5) if seed == 0 else (1,):  # seed 1 has no 5-shot scores: that cell pools one run
            run.save_accuracies({"split": "val", "ways": 10, "shots": shots, "queries": 5, "episodes": 2,
                                 "evaluator": "knn", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0}, [0.4, 0.6])
    report = compare(list_runs(tmp_path / "runs"), split="val", shots=[1, 5], ways=None, queries=None)
    said = "val, 10-way, 5 queries, by knn, mean ± 95% CI over pooled episodes (each cell's count)"
    assert render(report, "md").splitlines()[:3] == [said, "", "| group | seeds | 1-shot | 5-shot |"]
    assert render(report, "latex").splitlines()[:2] == [f"% {said}", "\\begin{tabular}{lrrr}"]
    # 1-shot pools two runs of 2 episodes (1.96 · 0.1 / √4), 5-shot one run's (/ √2): md and latex gave no count
    assert render(report, "md").splitlines()[4] == "| method=nca | 2 | 50.00 ± 9.80 (4) | 50.00 ± 13.86 (2) |"
    (row,) = csv.DictReader(io.StringIO(render(report, "csv")))
    assert [row[k] for k in ("1-shot runs", "5-shot runs", "split", "ways", "queries", "evaluator", "metric")] == [
        "2", "1", "val", "10", "5", "knn", "accuracy"]
    assert report["evaluators"] == ["knn"]
    # one count for every cell: in the caption, as a cell writes it (the README's 20,000, not 20000)
    one_count = {**report, "groups": [{**g, "results": {"1-shot": {**g["results"]["1-shot"], "episodes": 20000}}}
                                      for g in report["groups"]]}
    assert caption(one_count) == "val, 10-way, 5 queries, by knn, mean ± 95% CI over 20,000 pooled episodes per cell"


def test_runs_tested_on_more_episodes_are_seeds_of_their_group_not_a_group_of_their_own(tmp_path):
    """A seed added with eval.test_episodes=100 to seeds tested on 40 made a group of its own, labelled
    eval.test_episodes=100 and paired with no run, though it trained the same way and its first 40
    episodes are the others' 40 (the stream is drawn in whole blocks)."""
    rng = random.Random(2)
    stream = [rng.choice([0.4, 0.6, 0.8]) for _ in range(100)]
    for lr in (0.1, 0.05):
        for seed, episodes in ((0, 40), (1, 40), (2, 100)):
            run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": seed, "train": {"lr": lr},
                                                        "eval": {"test_episodes": episodes}})
            scores = [a - (0.1 if lr == 0.05 else 0) for a in stream[:episodes]]
            run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": episodes,
                                 "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0}, scores)
    report = compare(list_runs(tmp_path / "runs"), shots=[5])
    assert [(g["group"], g["seeds"], g["results"]["5-shot"]["episodes"]) for g in report["groups"]] == [
        ("train.lr=0.1", 3, 120), ("train.lr=0.05", 3, 120)]  # each seed on the first 40 all of them reach
    assert report["cut"] and all(g["results"]["5-shot"]["cut"] for g in report["groups"])
    (paired,) = report["paired"]
    assert paired["episodes"] == 120 and paired["difference"] == pytest.approx(-0.1)
    # a seed tested again on more episodes is a repeat of the same network: the newer one counts
    again = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "train": {"lr": 0.1},
                                                  "eval": {"test_episodes": 100}})
    again.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 100,
                           "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0}, stream)
    report = compare(list_runs(tmp_path / "runs"), shots=[5])
    assert report["repeated"] and again.id in report["groups"][0]["runs"] and report["groups"][0]["seeds"] == 3


def test_a_runs_logged_score_is_the_one_compare_reads_from_its_saved_episodes(project, builtin_plugins):
    """A run's test score was computed twice: in training, from the evaluator's float32 episode scores
    (results.json, the metrics' eval event: fslab runs and show), and by compare, from the same scores as
    evaluations/ keeps them (6 decimals). The two differed in the ninth digit, enough at a .x5 boundary
    for runs to print 35.13 where compare printed 35.12 for the same episodes. Now one function computes
    both from the kept scores: each surface shows the number recomputed here from the saved file."""
    from fractions import Fraction

    from .runs_helpers import TINY, train_run

    run_dir, logged = train_run(project, "nca", *TINY, "--epochs", "1", "--set", "eval.test_episodes=32",
                                "--seed", "0")
    listed = json.loads(fslab_here("runs", "--json", cwd=project).stdout)["test"]
    compared = json.loads(fslab_here("compare", run_dir.name, "--format", "json", cwd=project).stdout)
    table = fslab_here("runs", "--wide", cwd=project).stdout
    for shots in ("1-shot", "5-shot"):
        (saved,) = run_dir.glob(f"evaluations/test-centroid-5way-{shots[0]}shot-*.json")
        scores = [Fraction(a) for a in json.loads(saved.read_text())["accuracies"]]
        mean = sum(scores) / len(scores)
        ci = 1.96 * math.sqrt(sum((a - mean) ** 2 for a in scores) / len(scores)) / math.sqrt(len(scores))
        pooled = compared["groups"][0]["results"][shots]
        for score in (logged[shots], listed[shots], pooled):
            assert score["accuracy"] == pytest.approx(float(mean), rel=0, abs=1e-12)
            assert score["ci95"] == pytest.approx(ci, rel=0, abs=1e-12)
        assert (logged[shots]["accuracy"], logged[shots]["ci95"]) == (pooled["accuracy"], pooled["ci95"])
        assert f"{_half_up(mean.numerator, mean.denominator)}±{100 * ci:.2f}" in table


def test_a_damaged_saved_evaluation_is_named_not_left_out_in_silence(store, builtin_plugins):
    """A saved evaluation holding NaN (or any score that is not a fraction) was dropped without a word:
    compare printed '-' or pooled the other seeds alone, and plot said the runs had no such scores and
    should be evaluated. Each now names the file in one line on stderr; the numbers shown are those of
    the readable files, recomputed here from them."""
    folder, data = store
    run, accs = data[(0.1, 0)]
    (damaged,) = run.path.glob("evaluations/*-5shot-*.json")
    damaged.write_text(damaged.read_text().replace(str(accs[5][3]), "NaN", 1))
    assert "NaN" in damaged.read_text()
    line = (f"1 saved evaluation left out, damaged (not JSON, a score that is not a number from 0 to 1, such as NaN, "
            f"Infinity or a percent, or not one score per episode): {run.id}/evaluations/{damaged.name}; score those "
            f"episodes again with: fslab eval {run.id} --ways 5 --shots 5 --queries 15 --episodes 40 --evaluator "
            f"centroid\n")  # the file's, read from its name: fslab eval's defaults are the run's, which may differ
    out = fslab_here("compare", "all", "--format", "json", cwd=folder)
    assert out.returncode == 0 and out.stderr == line, out.stderr
    report = json.loads(out.stdout)
    assert report["damaged"] == {run.id: [damaged.name]}
    (group,) = [g for g in report["groups"] if run.id in g["runs"]]
    pooled = [a for seed in (1, 2) for a in data[(0.1, seed)][1][5]]  # the two readable seeds
    assert group["results"]["5-shot"]["accuracy"] == pytest.approx(direct_ci(pooled)[0], abs=1e-12)
    assert group["results"]["5-shot"]["ci95"] == pytest.approx(direct_ci(pooled)[1], abs=1e-12)
    assert group["results"]["5-shot"]["episodes"] == 80
    plotted = fslab_here("plot", "train.lr", "all", "--shots", "5", "--json", "--out", str(folder / "p.png"),
                         cwd=folder)
    assert plotted.returncode == 0 and plotted.stderr.endswith(line), plotted.stderr  # after the run left out
    # the run left out says why it has no such scores: not unscored (evaluate it) but a file that cannot be read
    assert plotted.stderr.splitlines()[0] == (
        f"left out {run.id}: it is queued and has no saved test accuracies for 5-way 5-shot, 15 queries; 1 saved "
        f"evaluation of it cannot be read: {damaged.name}")


def test_the_fslab_eval_named_for_a_damaged_evaluation_is_read_from_the_name_its_file_was_given(tmp_path):
    """The line for a damaged saved evaluation said 'fslab eval ID (the file's name gives the split, shots, queries
    and episodes)', a command to finish by hand: it names the fslab eval of the file's episodes, read back from the
    name save_accuracies gave it (the same code), its evaluator's parameters and precision too."""
    from fslab.core.runstore import evaluation_named
    from fslab.reports.eval_commands import rescore_commands

    run = make_run(tmp_path / "runs", 0.1, 0, {})
    base = {"split": "val", "ways": 10, "queries": 5, "episodes": 24, "evaluator": "knn[k=3]", "seed": 7, "epoch": 3,
            "accuracy": 0.5, "ci95": 0.0, "precision": "bf16", "run_precision": "fp32"}
    names = [run.save_accuracies({**base, "shots": shots}, [0.5] * 24).name for shots in (1, 5)]
    fp32 = run.save_accuracies({**base, "split": "test", "shots": 20, "evaluator": "centroid",
                                "precision": "fp32", "data": "abc"}, [0.5] * 24).name
    assert evaluation_named(names[0]) == {"split": "val", "evaluator": "knn[k=3]", "ways": 10, "shots": 1,
                                          "queries": 5, "episodes": 24, "seed": 7, "epoch": 3, "precision": "bf16"}
    assert rescore_commands(run.id, [*names, fp32, "test-cut~0123456789ab.json"]) == [
        f"fslab eval {run.id} --split val --ways 10 --queries 5 --episodes 24 --precision bf16 --evaluator knn "
        f"--set evaluator.k=3",
        f"fslab eval {run.id} --ways 10 --shots 20 --queries 5 --episodes 24 --evaluator centroid",
        f"fslab eval {run.id} (of the split, shots, queries and episodes its file's name gives)"]


def _half_up(numerator: int, denominator: int) -> str:
    """numerator/denominator (a fraction) in percent to two decimals, a tie rounded up: by whole numbers."""
    assert numerator >= 0
    cents, rest = divmod(10000 * numerator, denominator)
    cents += 2 * rest >= denominator
    return f"{cents // 100}.{cents % 100:02d}"


def test_every_surface_rounds_a_tie_the_same_way_up(tmp_path):
    """Each surface printed f"{100 * x:.2f}", which rounds the binary product: a mean of 0.35125 (32 5-way
    episodes of 5 queries) printed as 35.12, and which way a tie went depended on its bits. Every score,
    interval and difference now goes through one rounding, a tie away from zero, checked here against
    whole-number arithmetic for every mean such episodes can have."""
    from fslab.core.events import accuracy_text, score_cell

    for k in range(801):  # k correct answers of 800
        x = k / 800
        assert score_cell({"accuracy": x, "ci95": x}) == f"{_half_up(k, 800)}±{_half_up(k, 800)}", k
        assert accuracy_text({"accuracy": x, "ci95": x}) == f"{_half_up(k, 800)} ± {_half_up(k, 800)}%", k
    # compare's md and latex of runs whose pooled mean is such a tie, in decimal (its float mean is not)
    accs = {1: [0.36] * 16 + [0.3425] * 16, 5: [0.46] * 16 + [0.4425] * 16}
    make_run(tmp_path / "runs", 0.1, 0, accs)
    make_run(tmp_path / "runs", 0.2, 0, {n: [round(a - 0.1, 6) for a in v] for n, v in accs.items()})
    md = render(compare(list_runs(tmp_path / "runs"), ways=5, queries=15), "md")
    latex = render(compare(list_runs(tmp_path / "runs"), ways=5, queries=15), "latex")
    for lr, less in (("0.1", 0), ("0.2", 10)):
        cells = []
        for n in (1, 5):
            scores = [Fraction(str(round(a - less / 100, 6))) for a in accs[n]]
            mean = sum(scores) / len(scores)
            ci = 1.96 * math.sqrt(sum((a - mean) ** 2 for a in scores) / len(scores)) / math.sqrt(len(scores))
            cells.append(f"{_half_up(mean.numerator, mean.denominator)} ± {100 * ci:.2f}")
        assert f"| train.lr={lr} | 1 | {cells[0]} | {cells[1]} |" in md, md
        assert cells[0].replace("±", "$\\pm$") in latex, latex
    assert "| +10.00 ± 0.00 | +10.00 ± 0.00 |" in md or "| -10.00 ± 0.00 | -10.00 ± 0.00 |" in md, md


def test_runs_without_any_scores_are_named_with_their_state_when_no_run_has_scores(tmp_path, builtin_plugins):
    """Where every run named lacked scores (one still queued, one killed before its test), compare and plot
    refused with 'none of these runs has saved test accuracies ... run: fslab eval RUN' and no word of the
    runs' states, which the line naming them says where other runs have scores: it was raised first. Neither
    has a checkpoint, so the line says so, as fslab eval would, and names no fslab eval RUN it would refuse."""
    queued = make_run(tmp_path / "runs", 0.1, 0, {})
    killed = make_run(tmp_path / "runs", 0.1, 1, {})
    killed.write_status(state="killed")
    named = (f"2 runs with no test scores at all: {queued.id} (queued), {killed.id} (killed); run {queued.id} has no "
             f"checkpoint yet (one is written after each epoch); run {killed.id} has no checkpoint (one is written "
             f"after each epoch; it ended before its first); train it again with: fslab run --like {killed.id}")
    for command in (["compare", queued.id, killed.id], ["plot", "train.lr", queued.id, killed.id]):
        done = fslab_here(*command, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", command
        (line,) = done.stderr.splitlines()
        assert line == ("error: none of these runs has saved test accuracies for 5-way 1,5-shot, 15 queries; "
                        f"{named}"), (command, line)
    # a run scored at other shots is none of those without scores: fslab eval scores it, and the line says how
    scored = make_run(tmp_path / "runs", 0.1, 2, {1: [0.5] * 4, 5: [0.5] * 4})
    with_checkpoint(scored)
    for command in (["compare", scored.id, queued.id, "--shots", "20"],
                    ["plot", "train.lr", scored.id, queued.id, "--shots", "20"]):
        done = fslab_here(*command, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.rstrip().endswith(
            f"; finish them or run: fslab eval {scored.id} --shots 20"), (command, done.stderr)


def test_no_scores_names_the_runs_its_fslab_eval_scores_where_fslab_eval_refuses_others(tmp_path,
                                                                                        builtin_plugins):
    """Where no run had the scores asked for (--shots 20) and fslab eval would refuse some of the runs named (one
    queued, one completed whose checkpoint went since, though it has scores of other shots), compare and plot
    ended with one 'finish them or run: fslab eval RUN --shots 20' that read as covering every run, the refused
    ones too, and said nothing of the run whose checkpoint is gone. The line names the runs the fslab eval
    scores, and for each other fslab eval's own line."""
    runs_dir = tmp_path / "runs"
    scored = [make_run(runs_dir, lr, 0, {1: [0.5] * 4, 5: [0.5] * 4}) for lr in (0.1, 0.05)]
    for run in scored:
        with_checkpoint(run)
    queued = make_run(runs_dir, 0.2, 0, {})
    gone = make_run(runs_dir, 0.3, 0, {1: [0.5] * 4, 5: [0.5] * 4})  # scored, then its checkpoint deleted
    gone.metrics_path.write_text(json.dumps({"event": "checkpoint", "time": 1.0, "epoch": 1, "step": 4,
                                             "path": str(gone.checkpoint_path)}) + "\n")
    gone.write_status(state="completed", ended=2.0, exit_code=0)
    ids = [run.id for run in (*scored, queued, gone)]
    for command in (["compare", *ids, "--shots", "20"], ["plot", "train.lr", *ids, "--shots", "20"]):
        done = fslab_here(*command, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", command
        (line,) = done.stderr.splitlines()
        assert f"run {queued.id} has no checkpoint yet (one is written after each epoch); " in line, line
        assert f"run {gone.id} completed, but its checkpoint " in line and " is gone " in line, line
        assert line.endswith(f"; finish them or run: fslab eval {scored[0].id} {scored[1].id} --shots 20"), line
    # one run fslab eval scores: its id in the command; more than three: every one's id, as typed it runs
    done = fslab_here("compare", scored[0].id, queued.id, "--shots", "20", cwd=tmp_path)
    assert done.stderr.rstrip().endswith(f"; finish them or run: fslab eval {scored[0].id} --shots 20"), done.stderr
    more = [make_run(runs_dir, lr, 0, {5: [0.5] * 4}) for lr in (0.4, 0.5)]
    for run in more:
        with_checkpoint(run)
    done = fslab_here("compare", *ids, *(run.id for run in more), "--shots", "20", cwd=tmp_path)
    scorable = [run.id for run in (*scored, *more)]
    assert done.stderr.rstrip().endswith(f"; finish them or run: fslab eval {' '.join(scorable)} --shots 20"), \
        done.stderr


def test_scores_of_a_checkpoint_the_run_trained_past_are_pooled_by_no_surface(tmp_path):
    """A run scored at epoch 2, then resumed and trained on (its latest checkpoint of epoch 3, not scored yet),
    was pooled by compare and plot on the scores of a network it no longer has, where fslab runs (the summary)
    leaves out a checkpoint's later scores once the run writes a newer one: the same run, two answers."""
    from fslab.core.summary import read_summary
    from fslab.reports.plot import series_data

    runs_dir = tmp_path / "runs"
    resumed = make_run(runs_dir, 0.1, 0, {5: [0.5, 1.0]})  # scored at epoch 2
    other = make_run(runs_dir, 0.1, 1, {5: [0.25, 0.75]})

    def checkpoint(epoch):
        with open(resumed.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"event": "checkpoint", "time": 1.0 + epoch, "epoch": epoch, "step": 10 * epoch,
                                "path": "checkpoints/last.pt"}) + "\n")

    checkpoint(2)
    (group,) = compare([resumed, other], shots=[5])["groups"]
    assert (group["seeds"], group["results"]["5-shot"]["episodes"]) == (2, 4)
    checkpoint(3)  # resumed, and trained on past the checkpoint scored
    assert read_summary(resumed.path, save=False).checkpoint == 3
    report = compare([resumed, other], shots=[5])
    (group,) = report["groups"]
    assert group["seeds"] == 1 and group["results"]["5-shot"] == {
        "accuracy": 0.5, "ci95": pytest.approx(direct_ci([0.25, 0.75])[1]), "episodes": 2, "episodes_per_run": 2,
        "runs": 1}
    assert report["unscored"] == {resumed.id: "queued"}
    plotted = series_data([resumed, other], "train.lr", shots=[5])
    (line,) = plotted["panels"][0]["series"]
    assert [(p["run_ids"], p["episodes"]) for p in line["points"]] == [([other.id], 2)]
    assert [item["run"] for item in plotted["left_out"]] == [resumed.id]


def test_a_comparison_refused_for_want_of_scores_says_so_in_one_line(tmp_path, builtin_plugins):
    """Refused (an evaluator that no plugin registers, no scores of the episodes asked for), compare printed the
    runs it had left out (a repeat of another's settings and seed) in lines of their own above its error: bad
    input's one line, with what else it had to say in it."""
    runs_dir = tmp_path / "runs"
    first = make_run(runs_dir, 0.1, 0, {5: [0.5, 1.0]})
    repeat = make_run(runs_dir, 0.1, 0, {5: [1.0, 1.0]})  # the same settings and seed: the first is left out
    for run in (first, repeat):
        with_checkpoint(run)
    repeated = (f"1 run left out, each repeating the settings and seed of another (the newest with results counts): "
                f"{first.id}")
    refused = fslab_here("compare", first.id, repeat.id, "--evaluator", "knnn", cwd=tmp_path)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines() == ["error: Unknown evaluator 'knnn'. Did you mean 'knn'? Allowed: ap, "
                                           "centroid, finetune, knn, retrieval-map, sen, soft."]
    refused = fslab_here("compare", first.id, repeat.id, "--shots", "1", cwd=tmp_path)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines() == [f"error: none of these runs has saved test accuracies for 5-way 1-shot, "
                                           f"15 queries; {repeated}; finish them or run: fslab eval {first.id} "
                                           f"{repeat.id} --shots 1"]
    shown = fslab_here("compare", first.id, repeat.id, "--shots", "5", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stderr.splitlines() == [repeated]  # said on its own where scores show


def test_scores_of_other_data_are_kept_beside_the_runs_own_and_compare_reads_the_runs_own(tmp_path):
    # fslab eval --data-root on images that differ, at the training test's shape and episode count, wrote its
    # scores in place of the training's own: those were lost, and compare then disagreed with fslab runs
    run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "device": "cpu",
                                                "train": {"lr": 0.1, "epochs": 2}, "loss": {"name": "nca"}})

    def save_on(data, accuracies):
        return run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 4,
                                    "evaluator": "centroid", "seed": 0, "epoch": 2, "data": data,
                                    "accuracy": sum(accuracies) / 4, "ci95": 0.0}, accuracies)

    own = save_on("a" * 32, [1.0, 1.0, 0.5, 0.5])
    other = save_on("b" * 32, [0.0, 0.0, 0.25, 0.25])
    assert other != own and other.name.endswith("_data" + "b" * 16 + ".json")
    assert json.loads(own.read_text())["accuracies"] == [1.0, 1.0, 0.5, 0.5]  # not replaced
    assert save_on("a" * 32, [1.0, 1.0, 0.5, 0.5]) == own  # the same data again: the same file
    assert save_on("b" * 32, [0.0, 0.0, 0.25, 0.25]) == other
    assert sorted(p.name for p in (run.path / "evaluations").iterdir()) == sorted([own.name, other.name])
    report = compare([run], shots=[5])
    assert report["groups"][0]["results"]["5-shot"]["accuracy"] == pytest.approx(0.75)


def _scored_in(runs_dir, seed, own, scores):
    """A completed run whose start recorded ``own`` as its evaluation precision, with its checkpoint (a whole
    archive, all fslab eval checks before it loads torch) and saved 5-shot test scores by precision: those of
    ``own`` as training saves them (naming no precision), the others as fslab eval --precision saves them
    (beside them, naming both)."""
    run = create_run(runs_dir, "nca", {"method": "nca", "seed": seed, "device": "cuda",
                                       "train": {"lr": 0.1, "epochs": 2}, "loss": {"name": "nca"}})
    _completed(run, own)
    for precision, accuracies in scores.items():
        named = {} if precision == own else {"precision": precision, "run_precision": own}
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": len(accuracies),
                             "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": sum(accuracies) / 4,
                             "ci95": 0.0, **named}, accuracies)
    return run


def _completed(run, precision: str) -> None:
    """``run`` completed, its start having recorded ``precision``, with a whole checkpoint (a zip archive)."""
    run.metrics_path.write_text(json.dumps({"event": "start", "time": 1.0, "device": "cuda:0",
                                            "precision": precision, "eval_precision": precision}) + "\n")
    with_checkpoint(run)
    run.write_status(state="completed")


def test_compare_precision_reads_the_scores_of_the_networks_run_in_it_and_names_runs_without_them(tmp_path,
                                                                                                 builtin_plugins):
    """fslab compare left out every score of a network run in another precision than its run's own (fslab eval
    --precision), so a set of runs could not be compared in one precision; --precision reads those, or a run's own
    where it is its precision, and names the runs that have none, with the fslab eval that scores them."""
    runs = tmp_path / "runs"
    bf16_fp32 = _scored_in(runs, 0, "bf16", {"bf16": [0.6, 0.8, 0.8, 1.0], "fp32": [0.6, 0.6, 0.8, 1.0]})
    fp32 = _scored_in(runs, 1, "fp32", {"fp32": [0.4, 0.6, 0.6, 0.8]})
    bf16 = _scored_in(runs, 2, "bf16", {"bf16": [1.0, 1.0, 0.8, 0.8]})
    ids = [bf16_fp32.id, fp32.id, bf16.id]

    def pooled_5shot(*args):
        done = fslab_here("compare", *ids, "--shots", "5", "--json", *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        (group,) = [json.loads(line) for line in done.stdout.splitlines()]
        return group, done.stderr

    own, said = pooled_5shot()
    assert said == "" and own["seeds"] == 3 and own["precision"] is None
    assert math.isclose(own["results"]["5-shot"]["accuracy"], direct_ci([0.6, 0.8, 0.8, 1.0, 0.4, 0.6, 0.6, 0.8,
                                                                         1.0, 1.0, 0.8, 0.8])[0])
    for precision, pooled, left_out in (("fp32", [0.6, 0.6, 0.8, 1.0, 0.4, 0.6, 0.6, 0.8], bf16.id),
                                        ("bf16", [0.6, 0.8, 0.8, 1.0, 1.0, 1.0, 0.8, 0.8], fp32.id)):
        group, said = pooled_5shot("--precision", precision)
        mean, ci = direct_ci(pooled)
        got = group["results"]["5-shot"]
        assert (group["precision"], group["seeds"], got["episodes"]) == (precision, 2, 8)
        assert math.isclose(got["accuracy"], mean) and math.isclose(got["ci95"], ci)
        assert said == (f"1 run without test scores of the network in {precision} (left out): {left_out} "
                        f"(completed); score it so with: fslab eval {left_out} --episodes 4 --precision {precision}\n")
    table = fslab_here("compare", *ids, "--shots", "5", "--format", "md", "--precision", "fp32", cwd=tmp_path)
    assert table.stdout.startswith("test, 5-way, 15 queries, by centroid, network in fp32, mean ± 95% CI over 8 ")
    none = fslab_here("compare", *ids, "--shots", "5", "--precision", "fp16", cwd=tmp_path)
    assert none.returncode == 2 and len(none.stderr.splitlines()) == 1
    assert none.stderr.startswith("error: none of these runs has saved test accuracies of the network in fp16 for "
                                  "5-way 5-shot, 15 queries; 3 runs with no test scores of the network in fp16: ")
    # every run completed: finishing gives none of them these scores, only fslab eval does
    assert none.stderr.rstrip().endswith(f"(completed); run: fslab eval {' '.join(ids)} --shots 5 --precision fp16")
    bad = fslab_here("compare", *ids, "--precision", "fp64", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --precision must be one of auto, fp32, bf16, fp16")


def test_plot_precision_draws_the_scores_of_the_networks_run_in_it_as_compare_reads_them(tmp_path, builtin_plugins):
    """fslab plot took no --precision: it drew each run's own scores only, where fslab compare --precision fp32
    reads those of the networks run in fp32; plot reads them the same way and names a run without them alike."""
    runs = tmp_path / "runs"
    bf16_fp32 = _scored_in(runs, 0, "bf16", {"bf16": [0.6, 0.8, 0.8, 1.0], "fp32": [0.6, 0.6, 0.8, 1.0]})
    fp32 = _scored_in(runs, 1, "fp32", {"fp32": [0.4, 0.6, 0.6, 0.8]})
    bf16 = _scored_in(runs, 2, "bf16", {"bf16": [1.0, 1.0, 0.8, 0.8]})
    ids = [bf16_fp32.id, fp32.id, bf16.id]
    drawn = fslab_here("plot", "train.lr", *ids, "--shots", "5", "--precision", "fp32", "--json",
                       "--out", str(tmp_path / "lr.png"), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    data = json.loads(drawn.stdout)
    (point,) = data["panels"][0]["series"][0]["points"]
    mean, ci = direct_ci([0.6, 0.6, 0.8, 1.0, 0.4, 0.6, 0.6, 0.8])
    assert math.isclose(point["accuracy"], mean) and math.isclose(point["ci95"], ci) and point["episodes"] == 8
    assert data["precision"] == "fp32" and data["y"] == "accuracy (%), network in fp32, mean ± 95% CI"
    assert drawn.stderr == (f"left out {bf16.id}: it is completed and has no saved test accuracies of the network in "
                            f"fp32 for 5-way 5-shot, 15 queries; score it so with: fslab eval {bf16.id} --episodes 4 "
                            f"--precision fp32\n")
    none = fslab_here("plot", "train.lr", *ids, "--shots", "5", "--precision", "fp16", cwd=tmp_path)
    assert none.returncode == 2
    assert none.stderr.rstrip().endswith(f"fslab eval {' '.join(ids)} --shots 5 --precision fp16")


def test_the_eval_compare_and_plot_name_for_a_run_without_scores_in_a_precision_scores_it_as_the_rest_is_read(
        tmp_path, builtin_plugins):
    """fslab compare --precision and fslab plot --precision named a plain fslab eval ID --precision fp32 for a run
    without scores of the network in fp32: fslab eval scores the run's own shape (here 10-way, 10 queries) on the
    protocol's 10,000 episodes, so the scores it saved were left out again, or outweighed the runs read on 4. The
    eval named now scores the shape the others are read at, on the episodes they are read on, as study report's."""
    runs = tmp_path / "runs"
    scored = [_scored_in(runs, seed, "fp32", {"fp32": [0.4, 0.6, 0.6, 0.8, 1.0][seed:seed + 4]}) for seed in (0, 1)]
    other = create_run(runs, "nca", {"method": "nca", "seed": 2, "device": "cuda", "train": {"lr": 0.1, "epochs": 2},
                                     "loss": {"name": "nca"}, "eval": {"ways": 10, "queries": 10,
                                                                       "test_episodes": 10000}})
    _completed(other, "bf16")
    ids = [*(r.id for r in scored), other.id]
    wanted = f"score it so with: fslab eval {other.id} --ways 5 --queries 15 --episodes 4 --precision fp32\n"
    compared = fslab_here("compare", *ids, "--shots", "5", "--ways", "5", "--queries", "15", "--precision", "fp32",
                          cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert compared.stderr.endswith(f"{other.id} (completed); {wanted}")
    drawn = fslab_here("plot", "train.lr", *ids, "--shots", "5", "--ways", "5", "--queries", "15", "--precision",
                       "fp32", "--out", str(tmp_path / "lr.png"), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stderr.endswith(f"15 queries; {wanted}")
    shots_10 = fslab_here("compare", *ids, "--shots", "5,10", "--ways", "5", "--queries", "15", "--precision",
                          "fp32", cwd=tmp_path)
    assert shots_10.stderr.endswith(f"fslab eval {other.id} --ways 5 --shots 5,10 --queries 15 --episodes 4 "
                                    f"--precision fp32\n")


def test_compare_and_plot_precision_name_fslab_eval_only_for_runs_it_scores_and_what_the_others_lack(
        tmp_path, builtin_plugins):
    """fslab compare --precision and fslab plot --precision named an fslab eval for every run without scores in
    the precision, a queued run and one killed before its first checkpoint too, which fslab eval then refused
    (no checkpoint): they name it only for a run fslab eval scores, and for the others, fslab eval's own line."""
    runs = tmp_path / "runs"
    scored = _scored_in(runs, 0, "fp32", {"fp32": [0.4, 0.6, 0.6, 0.8]})
    unscored = _scored_in(runs, 1, "bf16", {"bf16": [0.6, 0.8, 0.8, 1.0]})
    queued = create_run(runs, "nca", {"method": "nca", "seed": 2, "device": "cuda", "train": {"lr": 0.1, "epochs": 2},
                                      "loss": {"name": "nca"}})
    ids = [scored.id, unscored.id, queued.id]
    no_checkpoint = f"run {queued.id} has no checkpoint yet (one is written after each epoch)"
    compared = fslab_here("compare", *ids, "--shots", "5", "--precision", "fp32", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert compared.stderr == (f"2 runs without test scores of the network in fp32 (left out): {unscored.id} "
                               f"(completed), {queued.id} (queued); {no_checkpoint}; score the other so with: "
                               f"fslab eval {unscored.id} --episodes 4 --precision fp32\n")
    as_json = json.loads(fslab_here("compare", *ids, "--shots", "5", "--precision", "fp32", "--format", "json",
                                    cwd=tmp_path).stdout)
    assert (list(as_json["unscored_commands"]), as_json["unevaluable"]) == ([unscored.id], {queued.id: no_checkpoint})
    drawn = fslab_here("plot", "train.lr", *ids, "--shots", "5", "--precision", "fp32", "--out",
                       str(tmp_path / "lr.png"), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert f"left out {queued.id}: it is queued and has no saved test accuracies of the network in fp32 for 5-way " \
           f"5-shot, 15 queries; {no_checkpoint}\n" in drawn.stderr
    assert f"fslab eval {queued.id}" not in drawn.stderr and f"fslab eval {unscored.id} --episodes 4" in drawn.stderr
    none = fslab_here("compare", unscored.id, queued.id, "--shots", "5", "--precision", "fp32", cwd=tmp_path)
    assert none.returncode == 2 and f"(queued); {no_checkpoint}; finish them or run: " in none.stderr


def test_the_eval_compare_names_for_a_run_without_an_evaluators_scores_in_a_precision_is_by_that_evaluator(
        tmp_path, builtin_plugins):
    """fslab compare --evaluator knn[k=3] --precision fp32 named an fslab eval of the run's own evaluator for a run
    without knn[k=3]'s fp32 scores: the scores it saved were centroid's, and the run was left out again."""
    runs = tmp_path / "runs"
    scored = _scored_in(runs, 0, "fp32", {})
    scored.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 4,
                            "evaluator": "knn[k=3]", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0},
                           [0.25, 0.5, 0.5, 0.75])
    other = _scored_in(runs, 1, "bf16", {"bf16": [0.6, 0.8, 0.8, 1.0]})
    compared = fslab_here("compare", scored.id, other.id, "--shots", "5", "--evaluator", "knn[k=3]", "--precision",
                          "fp32", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert compared.stderr.endswith(f"score it so with: fslab eval {other.id} --episodes 4 --precision fp32 "
                                    f"--evaluator knn --set evaluator.k=3\n")
