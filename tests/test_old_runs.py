"""Run folders written by fslab 0.1 (before the layered layout, the persisted
summary and ``config_version``) still list, show, compare and resume.

``tests/fixtures/runs-0.1`` was made with the 0.1 code: two completed NCA runs
(seeds 0 and 1, each later evaluated with ``fslab eval --evaluator knn --set
evaluator.k=3``), a run stopped during its second epoch, and the same
configuration trained without a stop, whose results the resumed run must match.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.runs_helpers import assert_same_test, fslab_here

FIXTURE = Path(__file__).parent / "fixtures" / "runs-0.1"
SEED0, SEED1 = "20261123-181250-nca-910d", "20261123-181256-nca-f8c6"
STOPPED, UNSTOPPED = "20261123-181312-nca-018e", "20261123-181316-nca-53db"


@pytest.fixture
def old_store(project):
    shutil.copytree(FIXTURE, project / "runs")
    return project / "runs"


def results(runs_dir: Path, run_id: str) -> dict:
    return json.loads((runs_dir / run_id / "results.json").read_text())["test"]


def test_old_runs_list_with_the_test_accuracy_of_their_own_evaluator(old_store, project):
    out = fslab_here("runs", "--json", "--all", cwd=project)
    assert out.returncode == 0, out.stderr
    listed = {s["id"]: s for s in map(json.loads, out.stdout.splitlines())}
    assert set(listed) == {SEED0, SEED1, STOPPED, UNSTOPPED}
    assert {i: s["state"] for i, s in listed.items()} == {
        SEED0: "completed", SEED1: "completed", STOPPED: "killed", UNSTOPPED: "completed"}
    for run_id in (SEED0, SEED1, UNSTOPPED):
        # the training's centroid test, not the later knn evaluation
        assert listed[run_id]["test"] == {k: {**v, "episodes": 40} for k, v in results(old_store, run_id).items()}
    assert listed[SEED0]["epochs"] == 2 and listed[SEED0]["seed"] == 0
    knn = listed[SEED0]["test_by_evaluator"]["knn[k=3]"]["5-shot"]
    saved = json.loads((old_store / SEED0 / "evaluations" /
                        "test-knn[k=3]-5way-5shot-5q-40ep-seed0-epoch2.json").read_text())
    assert knn["accuracy"] == pytest.approx(saved["accuracy"])


def test_old_runs_show_and_compare(old_store, project):
    out = fslab_here("show", SEED0, "--json", cwd=project)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert {(e["evaluator"], e["shots"]) for e in shown["evaluations"] if e["split"] == "test"} == {
        ("centroid", 1), ("centroid", 5), ("knn[k=3]", 1), ("knn[k=3]", 5)}
    out = fslab_here("compare", SEED0, SEED1, "--format", "json", "--queries", "5", cwd=project)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    (group,) = report["groups"]
    assert group["seeds"] == 2 and group["results"]["5-shot"]["episodes"] == 80
    own = [results(old_store, r)["5-shot"]["accuracy"] for r in (SEED0, SEED1)]
    assert group["results"]["5-shot"]["accuracy"] == pytest.approx(sum(own) / 2)
    out = fslab_here("compare", SEED0, SEED1, "--format", "json", "--queries", "5", "--evaluator", "knn[k=3]",
                cwd=project)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["groups"][0]["results"]["5-shot"]["episodes"] == 80


@pytest.mark.slow
def test_an_old_stopped_run_resumes_to_the_results_of_an_unstopped_one(old_store, project):
    out = fslab_here("resume", STOPPED, cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert_same_test(old_store / STOPPED, old_store / UNSTOPPED)
    out = fslab_here("runs", "--json", "--all", cwd=project)
    listed = {s["id"]: s for s in map(json.loads, out.stdout.splitlines())}
    assert listed[STOPPED]["state"] == "completed" and listed[STOPPED]["epoch"] == 4
