"""``fslab eval``: cached features, fixed episodes, the worker's own numbers reproduced."""

import json
import os
import shutil
from pathlib import Path

import pytest

from fslab.core.runstore import create_run

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, events, fslab, fslab_here, wait_for
from .test_cli_json import documented_keys

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two runs of 2 epochs trained once for the module, which each test copies into its own
    project (a run of its own, as fslab eval writes into it): a plain one, and one of another
    seed that also tested its final network on the validation classes and at 3 ways."""
    project = tmp_path_factory.mktemp("trained")
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    plain = fslab("run", "nca", *TINY, "--epochs", "2", cwd=project, env=env)
    assert plain.returncode == 0, plain.stderr[-2000:]
    final = fslab("run", "nca", *TINY, "--epochs", "2", "--seed", "2", "--set", "eval.final_val=true", "--set",
                  "eval.extra_ways=[3]", cwd=project, env=env)
    assert final.returncode == 0, final.stderr[-2000:]
    by_seed = {json.loads((p / "config.json").read_text())["seed"]: p for p in (project / "runs").glob("2*")}
    return {"plain": by_seed[0], "final": by_seed[2], "final_stdout": final.stdout}


def copied(project, run_dir):
    """A copy of ``run_dir`` in ``project``'s store."""
    return shutil.copytree(run_dir, project / "runs" / run_dir.name)


def test_eval_reproduces_the_final_test_and_caches_features(project, trained):
    run_dir = copied(project, trained["plain"])
    final = json.loads((run_dir / "results.json").read_text())["test"]
    config = json.loads((run_dir / "config.json").read_text())
    episodes, queries = config["eval"]["test_episodes"], config["eval"]["queries"]

    args = ["eval", run_dir.name, "--shots", "1,5", "--queries", str(queries), "--episodes", str(episodes), "--json"]
    first = fslab_here(*args, cwd=project)
    assert first.returncode == 0, first.stderr
    results = [json.loads(line) for line in first.stdout.splitlines()]
    assert all(set(r) == documented_keys("eval")[None] for r in results)  # the JSON table of docs/commands.md
    assert [(r["shots"], r["features_cached"]) for r in results] == [(1, False), (5, True)]
    for r in results:  # same checkpoint, training mean, seed and episodes as the worker's test
        assert r["accuracy"] == final[f"{r['shots']}-shot"]["accuracy"]
        assert r["ci95"] == final[f"{r['shots']}-shot"]["ci95"]
    assert [p.name for p in (run_dir / "features").iterdir()] == ["test-epoch2.pt"]

    again = [json.loads(line) for line in fslab_here(*args, cwd=project).stdout.splitlines()]
    assert [r["features_cached"] for r in again] == [True, True]
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in results]
    cache = run_dir / "features" / "test-epoch2.pt"
    cache.write_bytes(cache.read_bytes()[:1000])  # cut short: embedded again (it was a traceback), same scores
    redone = [json.loads(line) for line in fslab_here(*args, cwd=project).stdout.splitlines()]
    assert [(r["features_cached"], r["accuracy"]) for r in redone] == [(False, results[0]["accuracy"]),
                                                                        (True, results[1]["accuracy"])]

    saved = json.loads(next((run_dir / "evaluations").glob("test-centroid-5way-5shot-*.json")).read_text())
    assert len(saved["accuracies"]) == episodes
    assert abs(sum(saved["accuracies"]) / episodes - saved["accuracy"]) < 1e-5
    logged = [e for e in events(run_dir, "eval") if e.get("source") == "fslab eval"]
    assert len(logged) == 6 and {e["shots"] for e in logged} == {1, 5}

    val = [json.loads(line) for line in fslab_here("eval", run_dir.name, "--split", "val", "--shots", "5",
                                               "--queries", "5", "--episodes", "50", "--json",
                                               cwd=project).stdout.splitlines()]
    assert val[0]["split"] == "val" and val[0]["episodes"] == 50 and not val[0]["features_cached"]


NOTED = """
import torch

from fslab.plugin import hookimpl


def noted(support, query, *, note: str = ""):  # the centroid rule, with a parameter of any length
    return torch.cdist(query, support.mean(dim=2)).argmin(dim=-1)


@hookimpl
def register_evaluators(register):
    register(noted, name="noted", description="local")
"""


def test_an_evaluator_with_long_parameters_saves_its_scores_under_a_name_that_fits(project, trained):
    """An evaluation's file is named by its evaluator's parameters: a plugin's long one (a note, a path)
    made a name past the 255 bytes a file name may have, and fslab eval failed to save the scores. The
    name is cut, with a hash of the whole; the file holds the evaluator's whole label, which readers use."""
    run_dir = copied(project, trained["plain"])
    (project / "mine").mkdir()
    (project / "mine" / "noted.py").write_text(NOTED)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    notes = ["n" * 300, "n" * 299 + "m"]  # two labels that begin alike: two files
    for note in notes:
        done = fslab_here("eval", run_dir.name, "--evaluator", "noted", "--set", f"evaluator.note={note}", "--shots",
                          "1", "--episodes", "10", "--json", cwd=project)
        assert done.returncode == 0, done.stderr
    saved = sorted((run_dir / "evaluations").glob("test-noted*"))
    assert len(saved) == 2 and all(len(os.fsencode(path.name)) <= 255 for path in saved)
    assert sorted(json.loads(path.read_text())["evaluator"] for path in saved) == [f"noted[note={n}]" for n in
                                                                                  sorted(notes)]
    listed = fslab_here("runs", "--evaluator", f"noted[note={notes[0]}]", "--json", cwd=project)
    assert listed.returncode == 0 and json.loads(listed.stdout)["id"] == run_dir.name, listed.stderr


def test_eval_of_a_sweep_scores_each_run_and_leaves_out_one_without_a_checkpoint(project, trained):
    """fslab eval SWEEP is fslab eval of each run in turn, in one process; a run still queued (no
    checkpoint yet) is left out with its reason where several are named, refused where named alone."""
    from fslab.core.sweeps import save_sweep

    runs = [copied(project, trained[key]) for key in ("plain", "final")]
    waiting = create_run(project / "runs", "nca", json.loads((runs[0] / "config.json").read_text()))
    save_sweep(project / "runs", "sweep-20261128-100000-ab12", method="nca", grid={}, seeds=3,
               runs=[r.name for r in runs] + [waiting.id])
    result = fslab_here("eval", "sweep-20261128", "--shots", "5", "--episodes", "40", "--json", "--no-sinks",
                        cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"left out: run {waiting.id} has no checkpoint yet (one is written after each epoch)\n")
    scores = [json.loads(line) for line in result.stdout.splitlines()]
    assert [s["run"] for s in scores] == [r.name for r in runs]
    for score, run_dir in zip(scores, runs):  # each run's own episodes: the worker's final test again
        final = json.loads((run_dir / "results.json").read_text())["test"]["5-shot"]
        assert (score["accuracy"], score["ci95"], score["episodes"]) == (final["accuracy"], final["ci95"], 40)
    alone = fslab_here("eval", waiting.id, "--no-sinks", cwd=project)
    assert (alone.returncode, alone.stderr) == (2, f"error: run {waiting.id} has no checkpoint yet (one is written "
                                                   "after each epoch)\n")
    none = fslab_here("eval", waiting.id, "sweep-nope", cwd=project)
    assert none.returncode == 2 and none.stderr.startswith("error: 'sweep-nope' matches no sweep")


def test_a_run_whose_episodes_the_evaluator_refuses_is_left_out_and_the_others_scored(project, trained):
    """knn's k above the support points of one run's episodes (3-way 1-shot: 3) leaves that run out, in a
    line naming it, and the other runs named are scored all the same; a --data-root that is no folder is said
    once, not once for each run."""
    runs = [copied(project, trained["plain"]), copied(project, trained["final"])]
    config = json.loads((runs[0] / "config.json").read_text())
    config["eval"]["ways"] = 3
    (runs[0] / "config.json").write_text(json.dumps(config))
    result = fslab_here("eval", runs[0].name, runs[1].name, "--shots", "1", "--episodes", "20", "--evaluator", "knn",
                   "--set", "evaluator.k=4", "--json", "--no-sinks", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (f"left out: run {runs[0].name}: knn: k must be between 1 and the 3 support points "
                             "(0 = shots), got 4\n")
    assert [json.loads(line)["run"] for line in result.stdout.splitlines()] == [runs[1].name]
    unknown = fslab_here("eval", runs[0].name, runs[1].name, "--set", "evaluator.k=3", cwd=project)  # each its own
    assert (unknown.returncode, unknown.stderr) == (2, "".join(  # evaluator, centroid: each line names its run
        f"left out: run {r.name}: unknown parameter 'evaluator.k' for evaluator 'centroid', which takes no "
        f"parameters. Evaluator 'knn' has it: --evaluator knn\n"
        for r in runs) + "error: none of the 2 runs named can be evaluated (each is said above)\n")
    gone = fslab_here("eval", runs[0].name, runs[1].name, "--data-root", str(project / "nope"), cwd=project)
    assert (gone.returncode, gone.stderr) == (2, f"error: --data-root {project / 'nope'} is not a folder\n")


def test_one_data_root_for_runs_of_two_datasets_is_refused_before_any_is_scored(project, trained):
    """fslab eval A B --data-root DIR scored both runs on DIR's images, though they trained on two datasets (or
    two folders of one): one was scored on the other's data. Refused now, naming each dataset's runs. Runs
    of synthetic, which reads no files, have no root: two an earlier fslab saved with different ones (it
    filled one in) were refused as trained on two."""
    runs = [copied(project, trained["plain"]), copied(project, trained["final"])]
    config = json.loads((runs[1] / "config.json").read_text())
    (project / "moved").mkdir()
    for dataset, refused_ in (("synthetic", False), ("folder", True)):
        config["dataset"] = {**config["dataset"], "name": dataset, "root": str(project / "elsewhere")}
        (runs[1] / "config.json").write_text(json.dumps(config))
        refused = fslab_here("eval", runs[0].name, runs[1].name, "--data-root", str(project / "moved"),
                             "--no-sinks", "--split", "val", "--shots", "1", "--episodes", "5", cwd=project)
        assert (refused.returncode == 2) == refused_, refused.stderr
        for run_dir in runs:  # what the synthetic runs' evaluation embedded: the refused one must embed nothing
            shutil.rmtree(run_dir / "features", ignore_errors=True)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        f"error: --data-root gives one dataset's folder, but the runs named trained on 2 (synthetic: "
        f"{runs[0].name}; folder in {project / 'elsewhere'}: {runs[1].name}); evaluate the runs of each apart, "
        "each with its own --data-root\n")
    assert not (runs[0] / "features").exists() and not (runs[1] / "features").exists()


def test_a_newer_epoch_cached_removes_the_splits_caches_of_earlier_epochs(project, trained):
    """A run keeps only its last checkpoint, so a cache of an earlier epoch is never read again; a run
    evaluated at each epoch as it trained kept one file per epoch (tens of MB each at a paper's size)."""
    run_dir = copied(project, trained["plain"])  # its checkpoint is of epoch 2
    features = run_dir / "features"
    features.mkdir()
    for name in ("test-epoch1.pt", "test-epoch1-stages3.pt", "test-epoch1-bf16.pt", "val-epoch1.pt",
                 "test-epoch1.pt.notes", "test-epoch3.pt"):
        (features / name).write_bytes(b"stale")
    result = fslab_here("eval", run_dir.name, "--shots", "1", "--episodes", "20", "--json", "--no-sinks", cwd=project)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["features_cached"] is False
    # the test split's earlier epochs go; the other split, a later epoch and files of other names stay
    assert sorted(p.name for p in features.iterdir()) == ["test-epoch1.pt.notes", "test-epoch2.pt",
                                                          "test-epoch3.pt", "val-epoch1.pt"]


def test_a_checkpoint_copied_in_from_another_run_is_embedded_again_not_scored_with_cached_features(project,
                                                                                                   trained):
    """Features are cached by the checkpoint's epoch: another run's checkpoint of the same epoch
    (copied in, a run folder synced over) was scored with the features of the weights it replaced."""
    mine, other = copied(project, trained["plain"]), copied(project, trained["final"])  # seeds 0 and 2
    args = ["--shots", "1", "--episodes", "50", "--json"]

    def scores(run_dir):
        done = fslab_here("eval", run_dir.name, *args, cwd=project)
        assert done.returncode == 0, done.stderr
        (result,) = [json.loads(line) for line in done.stdout.splitlines()]
        return result["accuracy"], result["features_cached"]

    own, _ = scores(mine)
    theirs, _ = scores(other)
    assert own != theirs
    (mine / "checkpoints" / "last.pt").write_bytes((other / "checkpoints" / "last.pt").read_bytes())
    assert scores(mine) == (theirs, False)
    assert scores(mine) == (theirs, True)


def test_a_checkpoint_whose_network_is_not_finite_is_refused_not_scored_at_chance(project, trained):
    """A run that diverged before fslab refused it at the epoch's end (a batch-norm variance that
    overflowed) left a checkpoint whose features are NaN: fslab eval scored it 20.00 ± 0.00% at
    5 ways, and a feature cache of NaNs it wrote kept scoring so."""
    import torch

    run_dir = copied(project, trained["plain"])  # its checkpoint is of epoch 2
    args = ["eval", run_dir.name, "--shots", "1", "--episodes", "20", "--json"]
    done = fslab_here(*args, cwd=project)
    assert done.returncode == 0, done.stderr
    (kept,) = [json.loads(line)["accuracy"] for line in done.stdout.splitlines()]
    cache = run_dir / "features" / "test-epoch2.pt"
    saved = torch.load(cache, weights_only=True)
    torch.save({**saved, "features": torch.full_like(saved["features"], float("nan"))}, cache)
    redone = fslab_here(*args, cwd=project)  # the NaN cache is not used: embedded again, the same score
    assert [(r["accuracy"], r["features_cached"]) for r in map(json.loads, redone.stdout.splitlines())] == [
        (kept, False)]

    path = run_dir / "checkpoints" / "last.pt"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["model"]["blocks.5.running_var"].fill_(float("inf"))
    torch.save(checkpoint, path)
    refused = fslab_here(*args, cwd=project)
    assert refused.returncode == 2 and not refused.stdout
    assert refused.stderr.strip().splitlines() == [
        f"error: the checkpoint runs/{run_dir.name}/checkpoints/last.pt (epoch 2) is not finite: "
        f"its blocks.5.running_var holds inf, as a run that diverged leaves it; train it again with a lower "
        f"learning rate: fslab run --like {run_dir.name} --lr 0.0025"]
    assert len(events(run_dir, "eval")) == 4 + 2  # the run's two validations and test, the two fslab evals


def test_features_that_are_not_finite_are_refused_not_scored():
    """Features that hold NaN (a network broken in a way its weights do not show, features that
    overflow eval.precision) scored chance on every episode, 20.00 ± 0.00% at 5 ways."""
    import torch

    from fslab.core.errors import FslabError
    from fslab.training.evaluation import extract_features

    network = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 4))
    images = torch.zeros(5, 3, 2, 2, dtype=torch.uint8)
    assert extract_features(network, images, 2, "cpu", lambda batch: batch.float()).shape == (5, 4)
    with torch.no_grad():
        network[1].bias[1] = float("nan")
    with pytest.raises(FslabError, match=r"^the network's features of 5 of 5 images hold nan: its weights or "):
        extract_features(network, images, 2, "cpu", lambda batch: batch.float())


RECORDING_SINK = """
import json
from pathlib import Path

from fslab.plugin import hookimpl


class Recorder:
    \"\"\"Every event it is given, one JSON line a line; a replay (fslab export) writes the file anew.\"\"\"

    def __init__(self, run):
        self.file = open(Path(run.path) / "recorded.jsonl", "w" if run.replay else "a")

    def write(self, event):
        self.file.write(json.dumps(event) + "\\n")

    def close(self):
        self.file.close()


@hookimpl
def register_sinks(register):
    register(Recorder, name="recorder", description="records the events it gets")
"""


def test_eval_sends_the_new_scores_to_the_sinks_the_run_trained_with(project):
    """A run sent to a tracker as it trained: a later fslab eval's scores reach it too (the run
    exported again, as fslab export does, so nothing is recorded twice); --no-sinks leaves it."""
    (project / "mine").mkdir()
    (project / "mine" / "recorder.py").write_text(RECORDING_SINK)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    assert fslab("run", "nca", *TINY, "--epochs", "1", "--sink", "recorder", cwd=project).returncode == 0
    run_dir = next((project / "runs").iterdir())

    def recorded():
        return [json.loads(line) for line in (run_dir / "recorded.jsonl").read_text().splitlines()]

    assert recorded() == events(run_dir)  # what the live sink got
    done = fslab_here("eval", run_dir.name, "--evaluator", "knn", "--shots", "1", "--episodes", "20", cwd=project)
    assert done.returncode == 0, done.stderr
    # the run's own episodes (eval.queries=5), as fslab compare and fslab runs --evaluator read them
    assert done.stdout.startswith(f"{run_dir.name} test 5-way 1-shot, 5 queries, 20 episodes (knn, checkpoint ")
    sent = len(events(run_dir))
    assert done.stderr == f"{run_dir.name}: sent again to recorder with the new scores ({sent} events)\n"
    assert recorded() == events(run_dir)  # once each, the new evaluation among them
    assert [e["evaluator"] for e in recorded() if e.get("source") == "fslab eval"] == ["knn[k=0,ties=nearest]"]
    quiet = fslab_here("eval", run_dir.name, "--shots", "5", "--episodes", "20", "--no-sinks", cwd=project)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert len(events(run_dir)) == len(recorded()) + 1  # saved, not sent


def test_final_val_and_extra_ways_test_the_final_network_as_fslab_eval_does(project, trained):
    """eval.final_val: the final network tested on the validation classes as on the test ones;
    eval.extra_ways: both also at another number of classes. Each keeps its per-episode scores, and
    fslab eval of the final checkpoint gives the same numbers; training's validations (and the best of
    them) and the run's summed-up test (eval.ways's) are untouched."""
    run_dir = copied(project, trained["final"])
    results = json.loads((run_dir / "results.json").read_text())
    episodes = json.loads((run_dir / "config.json").read_text())["eval"]["test_episodes"]
    assert {k for k in results if k.startswith(("test", "val"))} == {"test", "val", "test_3way", "val_3way"}
    # fslab run prints every test it made, the 3-way one included (it printed the 5-way one alone)
    printed = [line.split(":")[0] for line in trained["final_stdout"].splitlines() if line.startswith("test ")]
    assert printed == ["test 5-way 1-shot", "test 5-way 5-shot", "test 3-way 1-shot", "test 3-way 5-shot"]
    assert f"test 3-way 5-shot: {100 * results['test_3way']['5-shot']['accuracy']:.2f} ± " in trained["final_stdout"]
    for key, split, ways in (("val", "val", 5), ("test_3way", "test", 3), ("val_3way", "val", 3)):
        assert set(results[key]) == {"1-shot", "5-shot"} and results[key] != results["test"]
        for n in (1, 5):
            saved = json.loads(next((run_dir / "evaluations").glob(f"{split}-centroid-{ways}way-{n}shot-*.json"))
                               .read_text())
            assert len(saved["accuracies"]) == episodes
            assert results[key][f"{n}-shot"]["accuracy"] == saved["accuracy"]
        again = fslab_here("eval", run_dir.name, "--split", split, "--ways", str(ways), "--shots", "1,5", "--queries",
                      "5", "--episodes", str(episodes), "--json", cwd=project)
        assert again.returncode == 0, again.stderr
        for r in map(json.loads, again.stdout.splitlines()):  # same checkpoint, training mean, seed and episodes
            assert (r["accuracy"], r["ci95"]) == (results[key][f"{r['shots']}-shot"]["accuracy"],
                                                  results[key][f"{r['shots']}-shot"]["ci95"])
    validations = [e for e in events(run_dir, "eval") if e["split"] == "val" and "epoch" in e and "source" not in e]
    assert [e["epoch"] for e in validations] == [1, 2]
    assert results["best_val_accuracy"] == max(e["accuracy"] for e in validations)
    shown = json.loads(fslab_here("show", run_dir.name, "--json", cwd=project).stdout)
    assert shown["best_val"]["accuracy"] == results["best_val_accuracy"]
    assert {k: v["accuracy"] for k, v in shown["test"].items()} == \
        {k: v["accuracy"] for k, v in results["test"].items()}  # 5-way, whatever else was tested or evaluated
    assert shown["time"]["validations"] == 2
    # shapes are all checked before any is scored: a refused one leaves the run's files as they were
    before = (run_dir / "metrics.jsonl").read_bytes(), sorted((run_dir / "evaluations").iterdir())
    refused = fslab_here("eval", run_dir.name, "--shots", "1,100", "--episodes", "4", cwd=project)
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: 5-way episodes with 100 shots and 5 queries need 5 classes with at least 105 images; this split "
        "has 0 such classes (of "), refused.stderr
    assert ((run_dir / "metrics.jsonl").read_bytes(), sorted((run_dir / "evaluations").iterdir())) == before


@pytest.mark.parametrize("argv, message", [
    (["--shots", "one"], "--shots takes whole numbers separated by commas"),
    (["--episodes", "99999999999"], "--episodes must be from 2 to 1,000,000"),
    (["--episodes", "1"], "--episodes must be from 2 to 1,000,000 (one episode gives no 95% CI), got 1"),
    (["--split", "train"], "--split must be test or val"),
    (["--evaluator", "centriod"], "Unknown evaluator 'centriod'. Did you mean 'centroid'?"),
    (["--set", "evaluator.name=knn"], "fslab eval names its evaluator with --evaluator, not --set: --evaluator knn"),
    (["--evaluator", ""], "--evaluator needs an evaluator's name, one of ap, centroid, finetune, knn"),  # was the run's
    (["--evaluator", "knn[k=3,ties=smallest]"],  # a label as fslab runs shows it: was "Unknown evaluator"
     "'knn[k=3,ties=smallest]' is a label, as fslab runs and fslab compare show scores; evaluate by it with "
     "--evaluator knn --set evaluator.k=3 --set evaluator.ties=smallest"),
    (["--device", "cuda:x"], "--device must be auto, cpu, cuda (a GPU) or cuda:N, got \"cuda:x\""),
    ([], "has no checkpoint yet"),
    (["damaged"], "config.json is missing or not a JSON object"),
    (["version"], ": config_version must be a whole number >= 0, got 'x'"),
])
def test_eval_bad_input(project, argv, message):
    from fslab.core.config import CONFIG_VERSION, DEFAULTS

    version = "x" if argv == ["version"] else CONFIG_VERSION
    run = create_run(project / "runs", "nca", {**DEFAULTS, "method": "nca", "config_version": version})
    if argv == ["damaged"]:
        (run.path / "config.json").write_text('{"method": "nca", ')  # cut short
    argv = [] if argv in (["damaged"], ["version"]) else argv
    result = fslab_here("eval", run.id, *argv, cwd=project)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count(f"run {run.id}") <= 1, result.stderr  # the run named once
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("option", ["--shots", "--queries"])
def test_shots_or_queries_beyond_64_bits_are_refused_in_one_line(project, option):
    """fslab eval RUN --shots 99999999999999999999999 was a traceback (OverflowError: int too big to convert)."""
    fixture = Path(__file__).parent / "fixtures" / "runs-0.1" / "20261123-181250-nca-910d"
    shutil.copytree(fixture, project / "runs" / fixture.name)
    result = fslab_here("eval", fixture.name, option, "99999999999999999999999", cwd=project)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: 5-way episodes with ") and len(result.stderr.splitlines()) == 1
    assert "need 5 classes with at least 1000000000000000000000" in result.stderr


@pytest.mark.parametrize("checkpoint", [None, b"PK, cut short"])
def test_a_run_without_a_whole_checkpoint_is_refused_before_torch_loads(project, checkpoint):
    """fslab eval of a run with no checkpoint (or a damaged one) loaded torch first: 2-4 s to refuse."""
    import subprocess
    import sys

    from fslab.core.config import CONFIG_VERSION, DEFAULTS

    run = create_run(project / "runs", "nca", {**DEFAULTS, "method": "nca", "config_version": CONFIG_VERSION})
    run.write_status(state="failed", ended=1.0)
    if checkpoint is not None:
        run.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        run.checkpoint_path.write_bytes(checkpoint)
    code = ("import sys\nfrom fslab.cli import main\nsys.argv = ['fslab', 'eval', sys.argv[1]]\ntry:\n    main()\n"
            "finally:\n    sys.stderr.write('TORCH' if 'torch' in sys.modules else 'NO TORCH')\n")
    done = subprocess.run([sys.executable, "-c", code, run.id], cwd=project, capture_output=True, text=True,
                          timeout=120)
    said = "has no checkpoint (one is written" if checkpoint is None else "is damaged"
    assert done.returncode == 2 and said in done.stderr and done.stderr.endswith("\nNO TORCH"), done.stderr


def test_a_run_whose_own_evaluator_is_not_installed_is_told_to_name_one(project):
    """It said "Unknown evaluator 'gone'. Allowed: ...", as if --evaluator had named it."""
    from fslab.core.config import DEFAULTS

    run = create_run(project / "runs", "nca", {**DEFAULTS, "method": "nca", "evaluator": {"name": "gone"}})
    result = fslab_here("eval", run.id, cwd=project)
    assert result.returncode == 2 and result.stderr.startswith(
        f"error: run {run.id} was tested by evaluator 'gone', which no installed plugin registers; evaluate it with "
        f"--evaluator NAME, one of ap, centroid, "), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_run_whose_dataset_is_not_installed_is_told_so_before_its_evaluator(project):
    """Its package uninstalled, fslab eval RUN said to name another evaluator, and with --evaluator
    centroid then "Unknown dataset 'gone-data'. Allowed: ...", naming no run: no evaluator mends that."""
    from fslab.core.config import DEFAULTS

    config = {**DEFAULTS, "method": "nca", "evaluator": {"name": "gone"}, "dataset": {"name": "gone-data"}}
    run = create_run(project / "runs", "nca", config)
    for options in ([], ["--evaluator", "centroid"]):
        result = fslab_here("eval", run.id, *options, cwd=project)
        assert result.returncode == 2 and result.stderr == (
            f"error: run {run.id} was trained with dataset 'gone-data', which no installed plugin registers (fslab "
            f"plugins --kind dataset lists those that are); install its plugin to evaluate the run: fslab eval reads "
            f"its images through it\n"), result.stderr


def test_a_checkpoint_of_another_shape_is_one_line_not_a_key_error(tmp_path):
    """fslab eval and a resume read the checkpoint through load_checkpoint: a file torch
    loads but fslab did not write (or a damaged one) is named, without torch's advice
    to load it with weights_only=False."""
    import torch

    from fslab.core.errors import FslabError
    from fslab.training.checkpoint import CHECKPOINT_KEYS, load_checkpoint, mismatch_reason

    path = tmp_path / "last.pt"
    whole = {key: {} for key in CHECKPOINT_KEYS} | {"epoch": 3}
    torch.save(whole, path)
    assert load_checkpoint(path, "cpu")["epoch"] == 3
    for value, message in [({"a": 1}, "it has no model, head, optimizer"), ([1], "it has no model"),
                           ({**whole, "train_mean": None} | {"epoch": "3"}, "its epoch or model is of another kind")]:
        torch.save(value, path)
        with pytest.raises(FslabError, match=rf"^the checkpoint {path} is not one fslab wrote: {message}"):
            load_checkpoint(path, "cpu")
    path.write_bytes(b"\x80\x04junk" * 100)
    with pytest.raises(FslabError) as error:
        load_checkpoint(path, "cpu")
    assert "weights_only" not in str(error.value)
    try:
        torch.nn.Linear(2, 2).load_state_dict({"w": torch.zeros(2)})
    except RuntimeError as exc:
        assert mismatch_reason(exc).startswith("Missing key(s) in state_dict: \"weight\"")
    try:  # a conv4 of 3 input channels loaded into one of 1: both shapes are told, not cut at the second
        torch.nn.Conv2d(1, 64, 3).load_state_dict(torch.nn.Conv2d(3, 64, 3).state_dict())
    except RuntimeError as exc:
        assert mismatch_reason(exc) == ("size mismatch for weight: copying a param with shape [64, 3, 3, 3] from "
                                      "checkpoint, the shape in current model is [64, 1, 3, 3].")


def test_a_run_folder_that_cannot_be_written_is_refused_before_anything_is_embedded(tmp_path, monkeypatch):
    """On a read-only copy of a store, fslab eval embedded the whole split and then said only
    'error: Read-only file system: runs/ID/features'; it says why it writes there, before any work."""
    import os

    from fslab.cli import reports
    from fslab.core.errors import FslabError

    run = create_run(tmp_path / "my runs", "nca", {"method": "nca"})
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: writable(path, mode) and path != run.path)
    called = []
    with pytest.raises(FslabError) as refused:
        reports._evaluate(lambda *args, **kwargs: called.append(1), run, None, None)
    assert called == [] and str(refused.value) == (
        f"cannot write into {run.path}: fslab eval keeps the features it embeds and the scores it measures in the "
        f"run's folder; evaluate a copy in a store this user can write (cp -r '{run.path}' OTHER/runs/)")


def test_fslab_eval_freezes_torchs_objects_before_it_evaluates(tmp_path):
    """As the worker does (test_lifecycle): torch is imported by then, and its objects are walked by
    no collection again, the one as fslab eval exits included."""
    import gc

    from fslab.cli import reports

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    gc.unfreeze()  # whatever an earlier test in this process froze
    frozen = []
    assert reports._evaluate(lambda *args, **kwargs: frozen.append(gc.get_freeze_count()) or [], run, None,
                             None) == []
    assert frozen and frozen[0] > 0


def test_a_feature_cache_the_disk_refuses_is_a_warning_and_the_scores_are_kept(project, trained, monkeypatch):
    """The feature cache written on a full disk ended fslab eval in torch's RuntimeError, the split's scores
    lost, and left its half-written temporary file in features/ taking the space. The scores need no cache.
    Here torch.save writes part of the cache, then fails as it does on a full disk (a RuntimeError naming
    no cause)."""
    import torch

    save = torch.save

    def full(obj, f, *args, **kwargs):
        if "features" in str(f):
            open(f, "wb").write(b"x" * 64)
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
        return save(obj, f, *args, **kwargs)

    run_dir = copied(project, trained["plain"])
    args = ["eval", run_dir.name, "--shots", "1", "--episodes", "30", "--json"]
    with monkeypatch.context() as patched:
        patched.setattr(torch, "save", full)
        done = fslab_here(*args, cwd=project)
    assert done.returncode == 0, done.stderr
    (result,) = [json.loads(line) for line in done.stdout.splitlines()]
    cache = run_dir / "features" / "test-epoch2.pt"
    warning = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warning == [f"warning: the features were not cached ({cache.relative_to(project)}: [enforce fail at "
                       f"inline_container.cc:626] . unexpected pos 64 vs 0); the next fslab eval of this checkpoint "
                       f"embeds them again"]
    assert list((run_dir / "features").iterdir()) == []  # no temporary file left behind
    again = fslab_here(*args, cwd=project)
    assert again.returncode == 0 and json.loads(again.stdout)["accuracy"] == result["accuracy"]
    assert not result["features_cached"] and not json.loads(again.stdout)["features_cached"] and cache.is_file()


def test_an_eval_that_fails_on_the_full_disk_that_refused_its_cache_is_one_line(project, trained, monkeypatch):
    """On a full disk fslab eval warned that the features were not cached, then failed saving the scores on the
    same disk: two lines where a failure is one. The warning is said once the scores are saved, and not where
    the command then fails. Here torch.save refuses the cache, then the scores' file is refused."""
    import torch

    from fslab.core.runstore import Run

    save = torch.save

    def full(obj, f, *args, **kwargs):
        if "features" in str(f):
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
        return save(obj, f, *args, **kwargs)

    def refused(self, *args, **kwargs):
        raise OSError(28, "No space left on device", str(self.path / "evaluations"))

    run_dir = copied(project, trained["plain"])
    with monkeypatch.context() as patched:
        patched.setattr(torch, "save", full)
        patched.setattr(Run, "save_accuracies", refused)
        done = fslab_here("eval", run_dir.name, "--shots", "1", "--episodes", "30", cwd=project)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: ") and "No space left on device" in done.stderr, done.stderr


def test_two_evals_of_one_run_at_once_embed_its_split_once(project, trained):
    """Two fslab eval of a run at the same time (two evaluators, say) each embedded the split, minutes
    of duplicated work at a paper's size. The one that embeds holds a lock beside the cache (here the
    test holds it, as that eval would), and the other says it waits, then reads the features it cached."""
    import fcntl
    import subprocess
    import sys

    run_dir = copied(project, trained["plain"])
    args = ["eval", run_dir.name, "--shots", "5", "--episodes", "20", "--json"]
    first = fslab_here(*args, cwd=project)
    assert first.returncode == 0 and not json.loads(first.stdout)["features_cached"], first.stderr
    cache = run_dir / "features" / "test-epoch2.pt"
    aside = cache.rename(project / "cached.pt")  # as if the first eval were still embedding
    lock = run_dir / "features" / ".test-epoch2.pt.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with open(project / "second.err", "w") as err:
            second = subprocess.Popen([sys.executable, "-m", "fslab", *args, "--evaluator", "knn"], cwd=project,
                                      stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            wait_for(lambda: "waiting" in (project / "second.err").read_text() or second.poll() is not None,
                     timeout=120, what="the second eval to wait")
            assert (project / "second.err").read_text().startswith(
                "waiting for the fslab eval that is embedding the test split of this checkpoint, to read its "
                "features"), (project / "second.err").read_text()
            aside.rename(cache)  # the first one's features, cached
            lock.unlink()
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
        out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, (project / "second.err").read_text()
    assert json.loads(out)["features_cached"] is True
    assert sorted(p.name for p in (run_dir / "features").iterdir()) == ["test-epoch2.pt"]


def removed(folder):
    """Delete a run folder the way fslab delete does: out of the store in one rename, then removed. A plain
    rmtree races the eval waiting on its embedding lock, which opens the lock file anew every 50 ms and can
    make it again between rmtree's last unlink in features/ and its rmdir (Directory not empty)."""
    aside = folder.with_name(f".gone-{folder.name}")
    folder.rename(aside)
    shutil.rmtree(aside)


def test_a_run_deleted_while_it_is_evaluated_is_said_so(project, trained):
    """rm -rf of a run while fslab eval scored it ended in the system's words about a folder of it,
    'error: No such file or directory: runs/ID/evaluations'. The eval here waits on the embedding
    lock the test holds, the run is deleted meanwhile, and nothing of it is made again."""
    import fcntl
    import subprocess
    import sys

    run_dir = copied(project, trained["plain"])
    (run_dir / "features").mkdir()
    lock = run_dir / "features" / ".test-epoch2.pt.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with open(project / "eval.err", "w") as err:
            evaluating = subprocess.Popen([sys.executable, "-m", "fslab", "eval", run_dir.name, "--shots", "5",
                                           "--episodes", "20"], cwd=project, stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_for(lambda: "waiting" in (project / "eval.err").read_text() or evaluating.poll() is not None,
                     timeout=120, what="fslab eval to wait")
            removed(run_dir)
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
        evaluating.wait(timeout=120)
    lines = (project / "eval.err").read_text().splitlines()
    assert evaluating.returncode == 1 and lines[-1] == (
        f"error: run {run_dir.name} was deleted while fslab eval scored it (its folder runs/{run_dir.name} is gone, "
        f"and the scores with it)"), lines
    assert "Traceback" not in "\n".join(lines) and not run_dir.exists()
    assert not any(line.startswith("warning: the features were not cached") for line in lines), lines


def test_runs_deleted_during_an_eval_of_several_are_left_out_and_the_others_scored(project, trained):
    """fslab delete of runs a sweep's eval names: one deleted while it was scored stopped the command and
    the runs after it went unscored; one deleted before its turn was said to be a folder this user cannot
    write, to be copied elsewhere. Each is now left out in a line saying it was deleted, and the rest scored."""
    import fcntl
    import subprocess
    import sys

    first, scored = copied(project, trained["plain"]), copied(project, trained["final"])
    last = shutil.copytree(trained["final"], project / "runs" / "20261128-100000-nca-cccc")
    (first / "features").mkdir()
    with open(first / "features" / ".test-epoch2.pt.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with open(project / "eval.err", "w") as err:
            evaluating = subprocess.Popen([sys.executable, "-m", "fslab", "eval", first.name, scored.name, last.name,
                                           "--shots", "5", "--episodes", "20", "--json", "--no-sinks"], cwd=project,
                                          stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            wait_for(lambda: "waiting" in (project / "eval.err").read_text() or evaluating.poll() is not None,
                     timeout=120, what="fslab eval to wait")
            removed(first)
            removed(last)
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
        out, _ = evaluating.communicate(timeout=120)
    lines = (project / "eval.err").read_text().splitlines()
    assert evaluating.returncode == 0, lines
    assert [json.loads(line)["run"] for line in out.splitlines()] == [scored.name]
    assert lines[1:] == [
        f"left out: run {first.name} was deleted while fslab eval scored it (its folder runs/{first.name} is gone, "
        "and the scores with it)",
        f"left out: run {last.name} was deleted before fslab eval scored it (its folder runs/{last.name} is gone)"]



def _blocked_on(lock: Path, timeout: float = 30.0) -> bool:
    """Whether a process or thread comes to wait for ``lock`` in the kernel within ``timeout`` seconds:
    Linux lists a blocked flock in /proc/locks, as ``-> FLOCK`` on the file's device:inode."""
    import time

    st = lock.stat()
    file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.split()[1:2] == ["->"] and file in line.split()
               for line in Path("/proc/locks").read_text().splitlines()):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks to see a blocked flock")
def test_an_eval_waiting_to_embed_makes_no_features_folder_again_once_it_is_deleted(tmp_path):
    """The eval waiting on another's embedding lock opened it anew at each poll, making features/ first:
    an rm -rf of the run that had just removed features/ then failed on the run's folder (Directory not
    empty). The folder is made once; a waiter whose lock file was deleted under it, finding features/
    gone, goes on without the lock."""
    import fcntl
    import threading

    from fslab.training.run_eval import embedding

    features = tmp_path / "run" / "features"
    features.mkdir(parents=True)
    entered = []

    def waiter():
        with embedding(features / "test-epoch2.pt", "test"):
            entered.append(features.exists())

    lock = features / ".test-epoch2.pt.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        thread = threading.Thread(target=waiter)
        thread.start()
        assert _blocked_on(lock), "the eval never waited on the held lock"
        shutil.rmtree(features)  # the delete, mid-way: features/ gone, the run's folder not yet
    thread.join(30)
    assert not thread.is_alive(), "the eval still waits for a lock file deleted under it"
    assert entered == [False]
    assert not features.exists()


# `fslab ARGS` as the real CLI runs it, with a Ctrl-C (or SIGTERM) arriving as its second run is scored.
INTERRUPTED_EVAL = """
import os, signal, sys
import fslab.training.run_eval as run_eval

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever started the test
real, seen = run_eval.evaluate_run, []
def evaluate_run(run, **kwargs):
    seen.append(run.id)
    if len(seen) == 2:
        os.kill(os.getpid(), signal.{sent})
    return real(run, **kwargs)
run_eval.evaluate_run = evaluate_run
sys.argv = ["fslab", *sys.argv[1:]]
from fslab.cli import main
main()
"""


@pytest.mark.parametrize("sent, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_eval_of_a_sweep_interrupted_midway_says_what_it_saved(project, trained, sent, code):
    """A Ctrl-C ended fslab eval of several runs without a word (a SIGTERM killed it outright): which runs
    were scored, and kept their scores, was for the user to guess."""
    import subprocess
    import sys

    from fslab.core.sweeps import save_sweep

    runs = [copied(project, trained[key]) for key in ("plain", "final")]
    save_sweep(project / "runs", "sweep-20261128-100000-ab12", method="nca", grid={}, seeds=2,
               runs=[r.name for r in runs])
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_EVAL.replace("{sent}", sent), "eval", "sweep-2026",
                             "--shots", "5", "--episodes", "40", "--no-sinks"], cwd=project, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == code, result.stderr
    assert result.stderr == ("fslab eval interrupted after 1 of 2 runs: the scores of 1 run printed above are "
                             "saved; the same command again scores the rest (and those again, from the features "
                             "they cached)\n")
    first = result.stdout.splitlines()
    assert len(first) == 1 and first[0].startswith(runs[0].name), result.stdout
    assert list((runs[0] / "evaluations").glob("test-*-40ep-*.json")) and not list(project.rglob("*.tmp"))
    again = fslab_here("eval", "sweep-2026", "--shots", "5", "--episodes", "40", "--no-sinks", cwd=project)
    assert again.returncode == 0 and len(again.stdout.splitlines()) == 2, again.stderr


def test_an_event_the_disk_refuses_is_one_line_naming_the_file(project):
    """fslab eval on a full disk ended in `error: No space left on device` (or `File too large`), naming no
    file: a write the disk refuses names none, where a failed open names its own. The file-size limit
    (RLIMIT_FSIZE) refuses every write past its size, as a full disk does: here the eval event appended
    to metrics.jsonl, which is longer already (the feature cache, larger, is a warning)."""
    import resource
    import subprocess
    import sys

    fixture = Path(__file__).parent / "fixtures" / "runs-0.1" / "20261123-181250-nca-910d"
    run_dir = shutil.copytree(fixture, project / "runs" / fixture.name)
    events_before = (run_dir / "metrics.jsonl").read_bytes()

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    done = subprocess.run([sys.executable, "-m", "fslab", "eval", fixture.name, "--episodes", "5", "--queries", "5"],
                          cwd=project, capture_output=True, text=True, preexec_fn=limited, timeout=120)
    error = [line for line in done.stderr.splitlines() if not line.startswith("warning: ")]
    assert done.returncode == 1 and error == [f"error: File too large: runs/{fixture.name}/metrics.jsonl"], done.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == events_before
    assert not [p.name for p in run_dir.rglob(".*.tmp")]
