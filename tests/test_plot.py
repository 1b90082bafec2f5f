"""`fslab plot`: the PNG it writes and the numbers it draws, checked against a direct computation."""

import json
import math
import random
import re
import struct

import pytest

from fslab.core.runstore import create_run

from .runs_helpers import fslab_here, with_checkpoint


def direct_ci(values):
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return mean, 1.96 * std / math.sqrt(len(values))


def png_size(path):
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def make_run(runs_dir, seed, accuracies_by_shots, *, loss, batch_size=128, sampler=None, pair_counts=()):
    config = {"method": "study", "seed": seed, "device": "cpu", "loss": loss,
              "sampler": sampler or {"name": "iid"}, "train": {"batch_size": batch_size, "epochs": 2}}
    run = create_run(runs_dir, loss["name"], config)
    for shots, accuracies in accuracies_by_shots.items():
        run.save_accuracies({"split": "test", "ways": 5, "shots": shots, "queries": 15, "episodes": len(accuracies),
                             "evaluator": "centroid", "seed": 0, "epoch": 2,
                             "accuracy": sum(accuracies) / len(accuracies), "ci95": 0.0}, accuracies)
    with open(run.metrics_path, "a") as fh:
        for step, (positives, negatives) in enumerate(pair_counts, 1):
            fh.write(json.dumps({"event": "train", "step": step, "epoch": 1, "loss": 1.0, "positives": positives,
                                 "negatives": negatives}) + "\n")
    return run


def accuracies(rng, base):
    return {n: [min(1.0, rng.choice([0.4, 0.6, 0.8, 1.0]) + base + 0.1 * (n == 5)) for _ in range(30)] for n in (1, 5)}


@pytest.fixture
def batch_store(tmp_path, builtin_plugins, monkeypatch):
    """NCA and ProtoNet runs at batch sizes 128 and 256, two seeds each."""
    rng = random.Random(0)
    data = {}
    for name, base in (("nca", 0.1), ("protonet", 0.0)):
        for batch in (128, 256):
            for seed in (0, 1):
                accs = accuracies(rng, base + batch / 2560)
                make_run(tmp_path / "runs", seed, accs, loss={"name": name}, batch_size=batch)
                data[(name, batch, seed)] = accs
    monkeypatch.chdir(tmp_path)
    return tmp_path, data


def test_batch_size_figure_draws_the_pooled_means_and_cis(batch_store, builtin_plugins):
    folder, data = batch_store
    result = fslab_here("plot", "batch-size", "all", "--out", "figs/fig2.png", "--json", cwd=folder)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert png_size(folder / "figs" / "fig2.png") == (1000, 420) == (report["width"], report["height"])
    assert report["x"] == "train.batch_size" and [p["shots"] for p in report["panels"]] == [1, 5]
    assert report["y"] == "accuracy (%), mean ± 95% CI"
    for panel in report["panels"]:
        n = panel["shots"]
        assert [s["label"] for s in panel["series"]] == ["loss.name=nca", "loss.name=protonet"]
        for line, name in zip(panel["series"], ("nca", "protonet")):
            assert [p["x"] for p in line["points"]] == [128, 256]
            for point in line["points"]:
                mean, ci = direct_ci(data[(name, point["x"], 0)][n] + data[(name, point["x"], 1)][n])
                assert point["episodes"] == 60 and point["runs"] == 2
                assert math.isclose(point["accuracy"], mean) and math.isclose(point["ci95"], ci)


def test_size_shots_and_series_options(batch_store, builtin_plugins):
    folder, data = batch_store
    result = fslab_here("plot", "batch-size", "all", "--shots", "5", "--size", "640x480", "--series", "method",
                   "--out", "one.png", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "wrote one.png (640x480 px, 1 panel, 2 points)"
    assert png_size(folder / "one.png") == (640, 480)
    # one line (every run has method=study): each batch size pools both losses' four runs
    report = json.loads(fslab_here("plot", "batch-size", "all", "--shots", "5", "--series", "method", "--json",
                              cwd=folder).stdout)
    (line,) = report["panels"][0]["series"]
    assert line["label"] == "method=study" and [p["runs"] for p in line["points"]] == [4, 4]
    pooled = [a for name in ("nca", "protonet") for seed in (0, 1) for a in data[(name, 256, seed)][5]]
    assert math.isclose(line["points"][1]["accuracy"], direct_ci(pooled)[0])


def test_one_point_is_counted_in_the_singular(batch_store, builtin_plugins):
    folder, _ = batch_store
    run_id = sorted(p.name for p in (folder / "runs").iterdir() if p.name[0].isdigit())[0]
    result = fslab_here("plot", "batch-size", run_id, "--shots", "5", "--out", "single.png", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "wrote single.png (500x420 px, 1 panel, 1 point)"


def test_pairs_figure_places_protonets_by_the_pairs_they_used(tmp_path, builtin_plugins, monkeypatch):
    rng = random.Random(1)
    data = {}
    for fraction in (0.25, 0.5, 1.0):
        for seed in (0, 1):
            data[(fraction, seed)] = accuracies(rng, fraction / 10)
            make_run(tmp_path / "runs", seed, data[(fraction, seed)], batch_size=64,
                     loss={"name": "nca", "pair_fraction": fraction})
    # a 4-way episode of 2 support + 6 queries: 32 rows; logged query-support pairs per batch
    episodic = {"name": "episodic", "ways": 4, "shots": 2, "queries": 6}
    proto = accuracies(rng, 0.0)
    make_run(tmp_path / "runs", 0, proto, batch_size=64, loss={"name": "protonet"}, sampler=episodic,
             pair_counts=[(48, 144), (48, 144), (50, 150)])
    monkeypatch.chdir(tmp_path)
    result = fslab_here("plot", "pairs", "all", "--shots", "1", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert png_size(tmp_path / "pairs.png") == (500, 420)
    (panel,) = report["panels"]
    nca, protonet = panel["series"]
    assert [p["x"] for p in nca["points"]] == [0.25, 0.5, 1.0]
    mean, ci = direct_ci(data[(0.5, 0)][1] + data[(0.5, 1)][1])
    assert math.isclose(nca["points"][1]["accuracy"], mean) and math.isclose(nca["points"][1]["ci95"], ci)
    (point,) = protonet["points"]
    assert math.isclose(point["x"], (192 + 192 + 200) / 3 / (32 * 31 / 2))
    assert math.isclose(point["accuracy"], direct_ci(proto[1])[0])


def test_an_x_no_run_has_is_told_the_closest_key_or_preset(batch_store, builtin_plugins):
    """fslab plot batchsize all said "See its keys with: fslab show RUN", which lists only the settings that are
    not defaults, and never named the batch-size it meant; compare --group-by's hint said better (one helper now)."""
    folder, _ = batch_store
    for x, hint in [("batchsize", "Did you mean batch-size?"), ("eval.epochs", "Did you mean train.epochs?"),
                    ("batch_size", "Did you mean train.batch_size?"),
                    ("zzz", "See its keys with: fslab show ID --json")]:  # the run it names, as typed
        result = fslab_here("plot", x, "all", cwd=folder)
        assert result.returncode == 2 and result.stderr.startswith(f"error: none of the 8 runs gives '{x}' a value")
        named = re.search(r"run (\S+) has no configuration key", result.stderr).group(1)
        assert result.stderr.endswith(f"has no configuration key '{x}'. {hint.replace('ID', named)}\n"), result.stderr


def test_bad_input_is_one_line_and_exit_2(batch_store, tmp_path, builtin_plugins):
    folder, _ = batch_store
    for args, message in [
        # every run lacks it: said of them all (it named the first run alone, as if the others had it)
        (["train.momentum", "all"], "none of the 8 runs gives 'train.momentum' a value; run "),
        (["train.momentum", "all"], "has no configuration key 'train.momentum'"),
        (["batch-size", "all", "--size", "big"], "--size takes WIDTHxHEIGHT in pixels"),
        (["batch-size", "all", "--queries", "5"],
         "none of these runs has saved test accuracies for 5-way 1,5-shot, 5 queries"),
        (["batch-size", "nosuchrun"], "no run 'nosuchrun'"),
        # a PNG was written under any name asked for: fig.pdf was a PNG, a folder's name a traceback-free error 1
        (["batch-size", "all", "--out", "fig.pdf"],
         "--out fig.pdf: fslab plot writes a PNG image; name a .png file, e.g. --out fig.png"),
        (["batch-size", "all", "--out", "runs"], "name a .png file, e.g. --out runs/batch-size.png"),
        # quoted as the shell reads it: a name with a space was split when pasted
        (["batch-size", "all", "--out", "my fig.pdf"], "name a .png file, e.g. --out 'my fig.png'"),
    ]:
        result = fslab_here("plot", *args, cwd=folder)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    result = fslab_here("plot", "batch-size", "all", cwd=empty)
    assert result.returncode == 2 and result.stderr.startswith("error: no runs to plot")
    assert not (folder / "batch-size.png").exists() and not (folder / "fig.pdf").exists()


def test_a_figure_that_cannot_be_written_says_so_and_how_to_write_it_elsewhere(batch_store):
    """In a read-only copy of a store (here no file may grow), fslab plot said only the system's words
    and the file's name: which file, why, and --out are said."""
    import resource
    import subprocess
    import sys

    folder, _ = batch_store
    no_growth = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # noqa: E731
    result = subprocess.run([sys.executable, "-m", "fslab", "plot", "batch-size", "all"], cwd=folder,
                            capture_output=True, text=True, timeout=300, preexec_fn=no_growth)
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "error: cannot write batch-size.png (File too large); name a file in a folder this user can write with "
        "--out FILE.png"], result.stderr


def test_a_figure_that_fails_to_be_written_keeps_the_one_that_was_there(batch_store, builtin_plugins):
    """fslab plot wrote the PNG in place: a write that failed midway (a full disk, here a limit on a file's
    size) left the first bytes of the new figure where the whole old one was, and a viewer reading the
    file while a second fslab plot rewrote it read half a figure. It is written beside it, then renamed."""
    import resource
    import subprocess
    import sys

    folder, _ = batch_store
    assert fslab_here("plot", "batch-size", "all", cwd=folder).returncode == 0
    before = (folder / "batch-size.png").read_bytes()
    assert len(before) > 4096
    small = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # noqa: E731
    result = subprocess.run([sys.executable, "-m", "fslab", "plot", "batch-size", "all", "--size", "1200x500"],
                            cwd=folder, capture_output=True, text=True, timeout=300, preexec_fn=small)
    assert result.returncode == 1 and result.stderr.startswith("error: cannot write batch-size.png (File too large)")
    assert (folder / "batch-size.png").read_bytes() == before
    assert not list(folder.glob(".batch-size.png.*"))


def test_runs_without_a_point_are_left_out_and_named_and_a_list_setting_is_a_category(tmp_path, builtin_plugins,
                                                                                       monkeypatch):
    rng = random.Random(2)
    data = {fraction: accuracies(rng, fraction / 10) for fraction in (0.5, 1.0)}
    older = make_run(tmp_path / "runs", 0, data[0.5], loss={"name": "nca", "pair_fraction": 0.5})
    whole = make_run(tmp_path / "runs", 0, data[1.0], loss={"name": "nca", "pair_fraction": 1.0})
    # a repeat of the first run (its settings and seed), a ProtoNet run killed before it logged a
    # batch, and a run whose configuration was damaged
    repeat_accuracies = accuracies(rng, 0.3)
    repeat = make_run(tmp_path / "runs", 0, repeat_accuracies, loss={"name": "nca", "pair_fraction": 0.5})
    unlogged = make_run(tmp_path / "runs", 0, {}, loss={"name": "protonet"})
    damaged = make_run(tmp_path / "runs", 1, accuracies(rng, 0.0), loss={"name": "nca"})
    (damaged.path / "config.json").write_text("{not json")
    monkeypatch.chdir(tmp_path)
    result = fslab_here("plot", "pairs", "all", "--shots", "1", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (line,) = report["panels"][0]["series"]
    assert [(p["x"], p["run_ids"]) for p in line["points"]] == [(0.5, [repeat.id]), (1.0, [whole.id])]
    assert line["points"][0]["accuracy"] == pytest.approx(direct_ci(repeat_accuracies[1])[0])  # the newer of the two
    left = {item["run"]: item["why"] for item in report["left_out"]}
    assert left == {older.id: "it repeats the settings and seed of another run",
                    unlogged.id: left[unlogged.id], damaged.id: "its configuration cannot be read"}
    assert "no loss.pair_fraction and no logged pair counts" in left[unlogged.id]
    assert sorted(result.stderr.splitlines()) == sorted(f"left out {run}: {why}" for run, why in left.items())
    # a list-valued setting is a category on the x axis, written as --set takes it
    for run, milestones in ((older, [0.5]), (repeat, [0.5]), (unlogged, [0.25, 0.75])):
        config = json.loads((run.path / "config.json").read_text())
        config["train"]["milestones"] = milestones
        (run.path / "config.json").write_text(json.dumps(config))
    result = fslab_here("plot", "train.milestones", "all", "--shots", "1", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    xs = {p["x"] for panel in json.loads(result.stdout)["panels"] for s in panel["series"] for p in s["points"]}
    assert xs == {"[0.5]"}  # the other runs have no milestones key, or no test accuracies (the ProtoNet run)


def test_runs_with_no_scores_yet_are_left_out_and_named_not_silently_dropped(batch_store, builtin_plugins):
    """A sweep half done: a seed still queued and one that failed add no scores to their point; the figure
    said nothing of them (its point read as the whole of its seeds), and --json listed them with its runs."""
    tmp_path, data = batch_store
    waiting = make_run(tmp_path / "runs", 2, {}, loss={"name": "nca"}, batch_size=128)
    failed = make_run(tmp_path / "runs", 3, {}, loss={"name": "nca"}, batch_size=128)
    failed.write_status(state="failed", error="boom")
    result = fslab_here("plot", "batch-size", "all", "--shots", "1", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    why = "has no saved test accuracies for 5-way 1-shot, 15 queries"
    assert report["left_out"] == [{"run": waiting.id, "why": f"it is queued and {why}"},
                                  {"run": failed.id, "why": f"it is failed and {why}"}]
    assert sorted(result.stderr.splitlines()) == sorted(f"left out {item['run']}: {item['why']}"
                                                        for item in report["left_out"])
    nca = next(s for s in report["panels"][0]["series"] if "nca" in s["label"])
    point = next(p for p in nca["points"] if p["x"] == 128)
    assert point["runs"] == 2 and len(point["run_ids"]) == 2 and {waiting.id, failed.id}.isdisjoint(point["run_ids"])
    assert point["accuracy"] == pytest.approx(direct_ci(data[("nca", 128, 0)][1] + data[("nca", 128, 1)][1])[0])


def test_runs_scored_only_at_another_episode_shape_are_named_with_the_options_that_read_them(tmp_path, monkeypatch,
                                                                                             builtin_plugins):
    """plot reads one episode shape (--ways 5 --queries 15), as compare does: a run evaluated only with
    5 queries was left out as if it had no scores, and 'no results' did not say which shapes the runs have."""
    from typer.testing import CliRunner

    from fslab.cli import app
    from fslab.core.errors import UsageError

    def make(seed, batch, queries):
        run = make_run(tmp_path / "runs", seed, {}, loss={"name": "nca"}, batch_size=batch)
        for shots in (1, 5):
            run.save_accuracies({"split": "test", "ways": 5, "shots": shots, "queries": queries, "episodes": 2,
                                 "evaluator": "centroid", "seed": 0, "epoch": 1, "stream": 2, "accuracy": 0.5,
                                 "ci95": 0.1}, [0.4, 0.6])
        run.write_status(state="completed")
        with_checkpoint(run)
        return run

    fifteen, five = make(0, 128, 15), make(0, 256, 5)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    both = runner.invoke(app, ["plot", "batch-size", fifteen.id, five.id, "--json"])
    assert both.exit_code == 0, both.output
    why = ("it is completed and has no saved test accuracies for 5-way 1,5-shot, 15 queries; "
           "it has them for 5-way, 5 queries (--ways 5 --queries 5)")
    assert both.stderr.strip() == f"left out {five.id}: {why}"
    report = json.loads(both.stdout)
    assert report["left_out"] == [{"run": five.id, "why": why}]
    assert [p["run_ids"] for p in report["panels"][0]["series"][0]["points"]] == [[fifteen.id]]
    assert runner.invoke(app, ["plot", "batch-size", five.id]).exit_code == 0  # the one shape its scores have
    alone = runner.invoke(app, ["plot", "batch-size", five.id, "--queries", "15"])
    assert isinstance(alone.exception, UsageError)
    assert str(alone.exception) == ("none of these runs has saved test accuracies for 5-way 1,5-shot, 15 queries; "
                                    "they have them for 5-way, 5 queries (--ways 5 --queries 5); "
                                    f"run: fslab eval {five.id} --queries 15")  # completed: no "finish them"
    read = runner.invoke(app, ["plot", "batch-size", fifteen.id, five.id, "--queries", "5", "--json"])
    assert read.exit_code == 0, read.output
    assert read.stderr.strip() == (f"left out {fifteen.id}: it is completed and has no saved test accuracies for "
                                   f"5-way 1,5-shot, 5 queries; it has them for 5-way, 15 queries "
                                   f"(--ways 5 --queries 15)")


def test_runs_tested_with_a_retrieval_evaluator_plot_their_map_on_an_axis_that_says_so(tmp_path, builtin_plugins,
                                                                                        monkeypatch):
    """The y axis said accuracy for the pooled mAP of runs tested with retrieval-map."""
    for batch in (128, 256):
        run = create_run(tmp_path / "runs", "map", {"method": "map", "seed": 0, "loss": {"name": "nca"},
                                                    "evaluator": {"name": "retrieval-map"},
                                                    "train": {"batch_size": batch, "epochs": 2}})
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2,
                             "evaluator": "retrieval-map", "metric": "map", "seed": 0, "epoch": 2,
                             "accuracy": 0.5, "ci95": 0.0}, [0.4, 0.6])
    monkeypatch.chdir(tmp_path)
    result = fslab_here("plot", "batch-size", "all", "--shots", "5", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [p["metric"] for p in report["panels"][0]["series"][0]["points"]] == ["map", "map"]
    assert report["y"] == "mAP (%), mean ± 95% CI"


def test_a_configuration_scored_on_two_data_is_two_lines_not_one_pooled(tmp_path, builtin_plugins, monkeypatch):
    """Two folder datasets (or files changed on disk) at the same settings and seed: plot pooled them into one
    point and took the second for a repeat of the first, as compare did before it split groups by data."""
    for root, data, base in (("/x", "a" * 32, 0.4), ("/y", "b" * 32, 0.8)):
        for batch in (128, 256):
            run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "loss": {"name": "nca"},
                                                        "dataset": {"name": "folder", "root": root},
                                                        "train": {"batch_size": batch, "epochs": 2}})
            run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2,
                                 "evaluator": "centroid", "seed": 0, "epoch": 2, "data": data,
                                 "accuracy": base, "ci95": 0.0}, [base, base])
    monkeypatch.chdir(tmp_path)
    result = fslab_here("plot", "batch-size", "all", "--shots", "5", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    lines = {s["label"]: [(p["x"], p["accuracy"], p["runs"]) for p in s["points"]]
             for s in report["panels"][0]["series"]}
    assert lines == {"method=nca, dataset.root=/x": [(128, 0.4, 1), (256, 0.4, 1)],
                     "method=nca, dataset.root=/y": [(128, 0.8, 1), (256, 0.8, 1)]}
    assert report["left_out"] == [] and report["data_split"] == ["method=nca"]
    assert "1 line split by the data its runs were scored on" in result.stderr


def test_an_evaluation_of_another_shape_on_other_data_leaves_a_line_whole(tmp_path):
    """A later fslab eval --data-root of another shape (3-way, on b) of one run scored 5-way on a:
    plot --ways 5 took that run's data from the 3-way scores and split its line in two."""
    from fslab.reports.plot import series_data

    runs = []
    for batch in (128, 256):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "loss": {"name": "nca"},
                                                    "train": {"batch_size": batch, "epochs": 2}})
        for ways, data, episodes in ((5, "a" * 32, 2), (3, "b" * 32, 4))[:2 if batch == 256 else 1]:
            run.save_accuracies({"split": "test", "ways": ways, "shots": 5, "queries": 15, "episodes": episodes,
                                 "evaluator": "centroid", "seed": 0, "epoch": 2, "data": data,
                                 "accuracy": 0.5, "ci95": 0.0}, [0.5] * episodes)
        runs.append(run)
    report = series_data(runs, "batch-size", shots=[5])
    assert report["data_split"] == []
    ((line,),) = [[s for s in panel["series"]] for panel in report["panels"]]
    assert [p["x"] for p in line["points"]] == [128, 256]


def test_a_point_of_runs_also_scored_on_more_episodes_is_read_as_compare_reads_it(tmp_path, builtin_plugins):
    """fslab plot said it draws what fslab compare computes, but a point whose runs were all evaluated
    again on more episodes (fslab eval --episodes) was drawn from those, while compare read every run
    on the count all of them share: the same group was 75.00 in compare and 95.00 in the figure."""
    from fslab.reports.compare import compare
    from fslab.reports.plot import series_data

    runs = []
    for batch in (128, 256):
        run = make_run(tmp_path / "runs", 0, {5: [0.5, 1.0]}, loss={"name": "nca"}, batch_size=batch)
        if batch == 256:  # evaluated again on 10 episodes
            run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 10,
                                 "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.95, "ci95": 0.0},
                                [1.0] * 9 + [0.5])
        runs.append(run)
    groups = compare(runs, shots=[5])["groups"]
    assert [g["results"]["5-shot"]["episodes"] for g in groups] == [2, 2]
    ((line,),) = [panel["series"] for panel in series_data(runs, "batch-size", shots=[5])["panels"]]
    assert [(p["accuracy"], p["episodes"]) for p in line["points"]] == [(0.75, 2), (0.75, 2)]
    assert [p["accuracy"] for p in line["points"]] == [g["results"]["5-shot"]["accuracy"] for g in groups]
    alone = series_data(runs[1:], "batch-size", shots=[5])["panels"][0]["series"][0]["points"]
    assert [(p["accuracy"], p["episodes"]) for p in alone] == [(pytest.approx(0.95), 10)]  # alone: its most


def test_a_run_scored_only_on_more_episodes_is_read_on_its_first_as_many_as_every_run_reaches(tmp_path,
                                                                                              builtin_plugins):
    """A run scored only on 10 episodes beside one scored on 2 was drawn from its 10, its point weighing five
    times as many episodes: it is read on its first 2, as fslab compare reads it, and stderr names it."""
    from fslab.reports.plot import series_data

    short = make_run(tmp_path / "runs", 0, {5: [0.5, 1.0]}, loss={"name": "nca"}, batch_size=128)
    long = make_run(tmp_path / "runs", 0, {}, loss={"name": "nca"}, batch_size=256)
    long.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 10,
                          "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.55, "ci95": 0.0},
                         [1.0, 0.0] + [0.5] * 8)
    data = series_data([short, long], "batch-size", shots=[5])
    ((line,),) = [panel["series"] for panel in data["panels"]]
    assert [(p["accuracy"], p["episodes"]) for p in line["points"]] == [(0.75, 2), (0.5, 2)]
    assert data["cut"] == [long.id]
    done = fslab_here("plot", "batch-size", short.id, long.id, "--shots", "5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (f"1 run scored on more episodes than every run of its panel reaches, so read on its first as many, as "
            f"fslab compare reads it: {long.id}") in " ".join(done.stderr.split())


@pytest.mark.parametrize(("key", "xs", "numeric", "ticks"), [
    ("seed", [1, 2, 3], True, "whole"),  # was ticked at 1.25, 1.5, 1.75 ...
    ("train.epochs", [10, 20], True, "whole"),
    ("seed", [1], True, [1]),  # one value was ticked at 0.945, 0.96, ... 1.05
    ("train.epochs", [1000], True, [1000]),
    ("train.lr", [0.025, 0.05], True, "any"),
    ("train.batch_size", [128, 256, 512], True, [128, 256, 512]),
    ("loss.name", ["nca", "protonet"], False, [0, 1]),
])
def test_the_x_axis_ticks_whole_number_settings_at_whole_numbers(key, xs, numeric, ticks):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fslab.reports.plot import x_axis

    fig, ax = plt.subplots()
    ax.plot(xs if numeric else range(len(xs)), [0.5] * len(xs))
    x_axis(ax, key, xs, numeric)
    fig.canvas.draw()
    low, high = ax.get_xlim()
    shown = [t for t in ax.get_xticks() if low <= t <= high]
    plt.close(fig)
    if ticks == "whole":
        assert len(shown) >= 2 and all(float(t).is_integer() for t in shown), shown
    elif ticks == "any":
        assert not all(float(t).is_integer() for t in shown), shown
    else:
        assert list(shown) == ticks


def test_lines_are_labelled_by_what_differs_among_the_lines_drawn(batch_store):
    """A killed run of another backbone, left out for want of scores, made the one line drawn read
    'backbone.name=..., train.epochs=...': settings that told it apart from no other line."""
    from fslab.core.runstore import list_runs
    from fslab.reports.plot import series_data

    tmp_path, _ = batch_store
    killed = make_run(tmp_path / "runs", 0, {}, loss={"name": "nca"}, batch_size=128)
    config = json.loads((killed.path / "config.json").read_text())
    (killed.path / "config.json").write_text(json.dumps({**config, "backbone": {"name": "resnet12"}, "train": {
        **config["train"], "epochs": 7}}))
    killed.write_status(state="killed")
    runs = [r for r in list_runs(tmp_path / "runs") if "nca" in r.id]
    data = series_data(runs, "batch-size", shots=[1])
    assert [item["run"] for item in data["left_out"]] == [killed.id]
    assert [s["label"] for s in data["panels"][0]["series"]] == ["method=study"]


def test_a_true_false_setting_is_a_category_ticked_false_and_true(tmp_path, monkeypatch):
    """eval.center on the x axis was drawn as the numbers 0 and 1 (a bool is an int to Python),
    ticked 0.0, 0.2 ... 1.0 with no word of false or true."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fslab.core.runstore import list_runs
    from fslab.reports.plot import draw, series_data

    rng = random.Random(4)
    for center in (True, False):
        for seed in (0, 1):
            config = {"method": "nca", "seed": seed, "eval": {"center": center}}
            run = create_run(tmp_path / "runs", "nca", config)
            scores = [rng.choice([0.4, 0.8]) for _ in range(10)]
            run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 10,
                                 "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.6, "ci95": 0.0}, scores)
    data = series_data(list_runs(tmp_path / "runs"), "eval.center", shots=[5])
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # keep the figure to read its axis
    draw(data, tmp_path / "center.png")
    (ax,) = drawn[0].axes
    low, high = ax.get_xlim()
    ticks = [(t, label.get_text()) for t, label in zip(ax.get_xticks(), ax.get_xticklabels()) if low <= t <= high]
    assert ticks == [(0, "false"), (1, "true")]
    assert [p["x"] for p in data["panels"][0]["series"][0]["points"]] == [False, True]


def test_more_lines_than_matplotlib_has_colours_each_look_their_own(tmp_path, monkeypatch):
    """A figure of 12 lines (a sweep of 12 learning rates, --series train.lr) drew the 11th and 12th lines in
    the 1st's and 2nd's colour and line, in the panels as in the legend: two settings that could not be told
    apart. Each line now has a colour and line style of its own, the same in every panel and the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fslab.reports.plot import draw

    labels = [f"train.lr={lr}" for lr in range(1, 13)]
    panels = [{"shots": shots, "series": [{"label": label, "points": [
        {"x": 16, "accuracy": 0.5 + i / 100, "ci95": 0.01}, {"x": 32, "accuracy": 0.6 + i / 100, "ci95": 0.01}]}
        for i, label in enumerate(labels)]} for shots in (1, 5)]
    data = {"x": "train.batch_size", "split": "test", "ways": 5, "queries": 15, "panels": panels}
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # keep the figure to read its lines
    draw(data, tmp_path / "lr.png")
    look = lambda line: (matplotlib.colors.to_hex(line.get_color()), line.get_linestyle())
    in_panels = [[look(bars.lines[0]) for bars in ax.containers] for ax in drawn[0].axes]
    assert len(set(in_panels[0])) == len(labels) and in_panels[0] == in_panels[1]
    (legend,) = drawn[0].legends
    assert [text.get_text() for text in legend.get_texts()] == labels
    keys = [look(line) for line in legend.findobj(matplotlib.lines.Line2D) if line.get_linestyle() != "None"]
    assert keys == in_panels[0]  # each entry's line drawn as its line is (its marker apart)


def test_dollar_signs_in_a_title_a_label_or_a_category_are_drawn_as_they_are(batch_store, builtin_plugins):
    """matplotlib reads text between two $ as math: --title 'cost $5 to $10' was drawn 'cost 5to10',
    and a title, a line's setting or a category holding math it cannot parse ($\\foo$) ended in a traceback."""
    tmp_path, _ = batch_store
    result = fslab_here("plot", "batch-size", "all", "--title", "a $\\foo$ b", "--out", "t.png", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert png_size(tmp_path / "t.png") == (1000, 420)

    from fslab.reports.plot import draw, literal

    data = {"x": "loss.note", "split": "test", "ways": 5, "queries": 15,
            "panels": [{"shots": 5, "series": [{"label": "loss.tag=$\\foo$", "points": [
                {"x": "$\\bar$", "accuracy": 0.5, "ci95": 0.1}, {"x": "$5 to $10", "accuracy": 0.6, "ci95": 0.1}]}]}]}
    assert draw(data, tmp_path / "d.png", title="$\\baz$") == (500, 420)
    import matplotlib.text

    shown = matplotlib.text.Text(text=literal("cost $5 to $10"))
    assert shown._preprocess_math(shown.get_text()) == ("cost $5 to $10", False)  # drawn as plain text


def test_a_panel_no_run_has_scores_for_is_said_on_stderr_with_the_eval_that_fills_it(batch_store, builtin_plugins):
    """--shots 1,20 where no run was scored 20-shot drew an empty 20-shot panel (a bare 0-1 axis) without a word.
    Its fslab eval is of the episodes the 1-shot panel reads the runs on (without --episodes: 10,000), and of the
    runs fslab eval scores: a run whose checkpoint is damaged was covered by its RUN too, and said nothing of."""
    from fslab.core.runstore import list_runs

    tmp_path, _ = batch_store
    runs = list_runs(tmp_path / "runs")
    for run in runs:
        with_checkpoint(run)
    result = fslab_here("plot", "batch-size", "all", "--shots", "1,20", "--out", "e.png", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [len(panel["series"]) for panel in json.loads(result.stdout)["panels"]] == [2, 0]
    assert result.stderr.splitlines() == [
        "the 20-shot panel is empty: none of these runs has saved test accuracies for 5-way 20-shot, 15 queries; "
        f"finish them or run: fslab eval {' '.join(run.id for run in runs)} --shots 20 --episodes 30"]
    runs[0].checkpoint_path.write_bytes(b"cut short")  # fslab eval refuses it: its line, and the others' command
    result = fslab_here("plot", "batch-size", "all", "--shots", "1,20", "--out", "e.png", cwd=tmp_path)
    (line,) = result.stderr.splitlines()
    assert f"; the checkpoint of run {runs[0].id} is damaged (" in line, line
    others = " ".join(run.id for run in runs[1:])  # more than three: every one named, so the line runs as typed
    assert len(runs) > 4 and line.endswith(f"; finish them or run: fslab eval {others} --shots 20 --episodes 30")


def test_a_size_too_small_for_the_panels_and_legend_is_one_line_naming_a_size_that_fits(batch_store, builtin_plugins):
    """--size 10000x100 wrote a PNG of slivers with matplotlib's two-line UserWarning (pointing into fslab's
    code) on stderr and exit 0; the panels collapsed to nothing."""
    tmp_path, _ = batch_store
    result = fslab_here("plot", "batch-size", "all", "--size", "10000x100", "--out", "w.png", cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "w.png").exists()
    assert result.stderr.splitlines() == [
        "error: --size 10000x100 leaves no room for 2 panels and the legend of 2 lines (matplotlib collapses the "
        "panels to nothing); give more pixels, e.g. --size 10000x420"]
    fits = fslab_here("plot", "batch-size", "all", "--size", "10000x420", "--out", "w.png", cwd=tmp_path)
    assert fits.returncode == 0 and fits.stderr == "" and png_size(tmp_path / "w.png") == (10000, 420)


def test_measured_pair_fractions_are_a_point_per_configuration_with_series_too(tmp_path):
    """--series loss.name put ProtoNets of batch 100 (a tenth of the pairs) and 200 (a fifth) in one line,
    and their measured x in one point: at 0.15, pooling both configurations' episodes."""
    from fslab.core.runstore import list_runs
    from fslab.reports.plot import series_data

    rng = random.Random(5)
    data = {}
    for batch, pairs, base in ((100, 495, 0.0), (200, 3980, 0.1)):  # 495 of 4950 pairs; 3980 of 19900
        for seed in (0, 1):
            accs = accuracies(rng, base)
            make_run(tmp_path / "runs", seed, accs, loss={"name": "protonet"}, batch_size=batch,
                     pair_counts=[(pairs // 10, pairs - pairs // 10)])
            data.setdefault(batch, []).extend(accs[5])
    (line,) = series_data(list_runs(tmp_path / "runs"), "pairs", series=["loss.name"], shots=[5])["panels"][0]["series"]
    assert [(p["x"], p["episodes"]) for p in line["points"]] == [(pytest.approx(0.1), 60), (pytest.approx(0.2), 60)]
    for point, batch in zip(line["points"], (100, 200)):
        assert point["accuracy"] == pytest.approx(direct_ci(data[batch])[0])


def test_list_categories_are_in_the_order_of_their_numbers(tmp_path, monkeypatch):
    """train.milestones [100], [30], [5] were ticked [100], [30], [5]: categories sorted as text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fslab.core.runstore import list_runs
    from fslab.reports.plot import draw, series_data

    for milestones in ([100], [30], [5], [10, 20]):
        run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "train": {"milestones": milestones}})
        run.save_accuracies({"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2,
                             "evaluator": "centroid", "seed": 0, "epoch": 2, "accuracy": 0.5, "ci95": 0.0}, [0.4, 0.6])
    data = series_data(list_runs(tmp_path / "runs"), "train.milestones", shots=[5])
    assert [p["x"] for p in data["panels"][0]["series"][0]["points"]] == ["[5]", "[10, 20]", "[30]", "[100]"]
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)
    draw(data, tmp_path / "m.png")
    assert [label.get_text() for label in drawn[0].axes[0].get_xticklabels()] == ["[5]", "[10, 20]", "[30]", "[100]"]


@pytest.mark.parametrize(("xs", "scale"), [
    ([0.0001, 0.001, 0.01], "log"),  # two decades: all but 0.01 were bunched at the axis's left end
    ([1, 10, 100, 1000], "log"),
    ([0.001, 0.05], "linear"),  # under two decades
    ([0, 0.001, 0.1], "linear"),  # a zero has no place on a log axis
    ([-0.1, 0.001, 0.1], "linear"),
])
def test_positive_values_over_two_decades_or_more_go_on_a_log_axis(xs, scale):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fslab.reports.plot import x_axis

    fig, ax = plt.subplots()
    ax.plot(xs, [0.5] * len(xs))
    x_axis(ax, "train.lr", xs, True)
    assert ax.get_xscale() == scale
    plt.close(fig)


def test_series_that_names_the_x_key_is_refused_in_one_line(batch_store, builtin_plugins):
    """--series train.batch_size with x batch-size drew each run's point as a line of its own."""
    folder, _ = batch_store
    for x, series in (("batch-size", "train.batch_size"), ("train.batch_size", "loss.name,train.batch_size")):
        bad = fslab_here("plot", x, "all", "--series", series, "--out", str(folder / "p.png"), cwd=folder)
        assert bad.returncode == 2 and bad.stderr == (
            "error: --series names train.batch_size, the x axis: each line would be one point; name the settings "
            "that tell lines apart (e.g. --series loss.name), or leave --series out\n"), (x, series)
    assert not (folder / "p.png").exists()


def test_a_sweep_s_run_whose_folder_was_deleted_is_said_to_be_gone_by_plot_and_compare(tmp_path, builtin_plugins,
                                                                                        monkeypatch):
    """A run a sweep's record names, its folder deleted, was left out as one whose configuration cannot be
    read, where fslab show RUN finds no run at all: both say its folder is gone."""
    from fslab.core.sweeps import save_sweep

    kept = make_run(tmp_path / "runs", 0, accuracies(random.Random(3), 0.1), loss={"name": "nca"})
    save_sweep(tmp_path / "runs", "sweep-20260101-000000-ab12", runs=[kept.id, "20260101-000000-nca-gone"],
               method="nca")
    monkeypatch.chdir(tmp_path)
    plotted = fslab_here("plot", "batch-size", "ab12", "--out", str(tmp_path / "fig.png"), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr
    assert plotted.stderr.splitlines() == [
        "left out 20260101-000000-nca-gone: its folder is gone, though its sweep's record names it"]
    compared = fslab_here("compare", "ab12", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert compared.stderr.splitlines() == [
        "1 run left out, each one whose folder is gone, though its sweep's record names it: 20260101-000000-nca-gone"]
