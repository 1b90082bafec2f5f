"""``fslab eval``: cached features, fixed episodes, the worker's own numbers reproduced."""

import json

import pytest

from fslab.core.runstore import create_run

from .runs_helpers import TINY, events, fslab
from .test_cli_json import documented_keys

pytestmark = pytest.mark.slow


def test_eval_reproduces_the_final_test_and_caches_features(project):
    assert fslab("run", "nca", *TINY, "--epochs", "2", cwd=project).returncode == 0
    run_dir = next((project / "runs").iterdir())
    final = json.loads((run_dir / "results.json").read_text())["test"]
    config = json.loads((run_dir / "config.json").read_text())
    episodes, queries = config["eval"]["test_episodes"], config["eval"]["queries"]

    args = ["eval", run_dir.name, "--shots", "1,5", "--queries", str(queries), "--episodes", str(episodes), "--json"]
    first = fslab(*args, cwd=project)
    assert first.returncode == 0, first.stderr
    results = [json.loads(line) for line in first.stdout.splitlines()]
    assert all(set(r) == documented_keys("eval")[None] for r in results)  # the README's JSON table
    assert [(r["shots"], r["features_cached"]) for r in results] == [(1, False), (5, True)]
    for r in results:  # same checkpoint, training mean, seed and episodes as the worker's test
        assert r["accuracy"] == final[f"{r['shots']}-shot"]["accuracy"]
        assert r["ci95"] == final[f"{r['shots']}-shot"]["ci95"]
    assert [p.name for p in (run_dir / "features").iterdir()] == ["test-epoch2.pt"]

    again = [json.loads(line) for line in fslab(*args, cwd=project).stdout.splitlines()]
    assert [r["features_cached"] for r in again] == [True, True]
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in results]

    saved = json.loads(next((run_dir / "evaluations").glob("test-centroid-5way-5shot-*.json")).read_text())
    assert len(saved["accuracies"]) == episodes
    assert abs(sum(saved["accuracies"]) / episodes - saved["accuracy"]) < 1e-5
    logged = [e for e in events(run_dir, "eval") if e.get("source") == "fslab eval"]
    assert len(logged) == 4 and {e["shots"] for e in logged} == {1, 5}

    val = [json.loads(line) for line in fslab("eval", run_dir.name, "--split", "val", "--shots", "5",
                                               "--queries", "5", "--episodes", "50", "--json",
                                               cwd=project).stdout.splitlines()]
    assert val[0]["split"] == "val" and val[0]["episodes"] == 50 and not val[0]["features_cached"]


def test_final_val_scores_the_final_network_on_the_validation_classes_as_fslab_eval_does(project):
    """eval.final_val: the final network tested on the validation classes as on the test ones, its
    per-episode scores kept; fslab eval --split val of the final checkpoint gives the same numbers, and
    training's validations (and the best of them) are untouched."""
    assert fslab("run", "nca", *TINY, "--epochs", "2", "--set", "eval.final_val=true", cwd=project).returncode == 0
    run_dir = next((project / "runs").iterdir())
    results = json.loads((run_dir / "results.json").read_text())
    episodes = json.loads((run_dir / "config.json").read_text())["eval"]["test_episodes"]
    saved = {n: json.loads(next((run_dir / "evaluations").glob(f"val-centroid-5way-{n}shot-*.json")).read_text())
             for n in (1, 5)}
    assert [len(saved[n]["accuracies"]) for n in (1, 5)] == [episodes, episodes]
    assert set(results["val"]) == {"1-shot", "5-shot"} and results["val"] != results["test"]
    for n in (1, 5):
        assert results["val"][f"{n}-shot"]["accuracy"] == saved[n]["accuracy"]
    again = fslab("eval", run_dir.name, "--split", "val", "--shots", "1,5", "--queries", "5", "--episodes",
                  str(episodes), "--json", cwd=project)
    assert again.returncode == 0, again.stderr
    for r in map(json.loads, again.stdout.splitlines()):  # same checkpoint, training mean, seed and episodes
        assert (r["accuracy"], r["ci95"]) == (results["val"][f"{r['shots']}-shot"]["accuracy"],
                                              results["val"][f"{r['shots']}-shot"]["ci95"])
    validations = [e for e in events(run_dir, "eval") if e["split"] == "val" and "epoch" in e and "source" not in e]
    assert [e["epoch"] for e in validations] == [1, 2]
    assert results["best_val_accuracy"] == max(e["accuracy"] for e in validations)
    shown = json.loads(fslab("show", run_dir.name, "--json", cwd=project).stdout)
    assert shown["best_val"]["accuracy"] == results["best_val_accuracy"]
    assert shown["time"]["validations"] == 2


@pytest.mark.parametrize("argv, message", [
    (["--shots", "one"], "--shots takes whole numbers separated by commas"),
    (["--split", "train"], "--split must be test or val"),
    (["--evaluator", "centriod"], "Unknown evaluator 'centriod'. Did you mean 'centroid'?"),
    ([], "has no checkpoint yet"),
])
def test_eval_bad_input(project, argv, message):
    run = create_run(project / "runs", "nca", {"method": "nca"})
    result = fslab("eval", run.id, *argv, cwd=project)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
