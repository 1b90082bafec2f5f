"""The command line and the dashboard tell the same story about a run.

A real tiny run is trained (its centroid test saved by the training), then
evaluated again with ``fslab eval --evaluator knn``. ``fslab runs``, ``fslab
show``, ``fslab compare`` and the dashboard's runs table and compare screen
must all show the training's own (centroid) test accuracy, with the k-NN
result listed apart under its label."""

from __future__ import annotations

import asyncio
import json

import pytest

from fslab.tui import make_app

from .runs_helpers import TINY, fslab, fslab_here

KNN = "knn[k=3]"


@pytest.mark.slow
def test_cli_and_dashboard_show_the_same_test_accuracy_after_a_knn_evaluation(project):
    out = fslab("run", "nca", *TINY, "--epochs", "1", "--device", "cpu", "--detach", cwd=project)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    out = fslab_here("logs", run_id, "--follow", cwd=project)  # returns when the run has ended
    assert out.returncode == 0, out.stderr
    knn = fslab_here("eval", run_id, "--evaluator", "knn", "--set", "evaluator.k=3", "--episodes", "40",
                "--queries", "5", "--json", cwd=project)
    assert knn.returncode == 0, knn.stderr
    knn_results = {f"{r['shots']}-shot": r for r in map(json.loads, knn.stdout.splitlines())}
    results = json.loads((project / "runs" / run_id / "results.json").read_text())["test"]

    [listed] = map(json.loads, fslab_here("runs", "--json", cwd=project).stdout.splitlines())
    assert listed["state"] == "completed"
    assert {k: (v["accuracy"], v["ci95"]) for k, v in listed["test"].items()} == \
        {k: (v["accuracy"], v["ci95"]) for k, v in results.items()}
    assert {k: (v["accuracy"], v["ci95"]) for k, v in listed["test_by_evaluator"][KNN].items()} == \
        {k: (v["accuracy"], v["ci95"]) for k, v in knn_results.items()}
    assert json.loads(fslab_here("show", run_id, "--json", cwd=project).stdout)["test"] == listed["test"]
    by_knn = [json.loads(line)
              for line in fslab_here("runs", "--json", "--evaluator", KNN, cwd=project).stdout.splitlines()]
    assert by_knn[0]["test"] == listed["test_by_evaluator"][KNN]
    report = json.loads(fslab_here("compare", run_id, "--format", "json", "--queries", "5", cwd=project).stdout)
    compared = report["groups"][0]["results"]

    async def dashboard():
        app = make_app(project / "runs", tick=3600, cursor_blink=False)
        async with app.run_test(size=(120, 36)) as pilot:
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()
            row = app.rows[run_id]
            cells = " ".join(c.plain for c in app.screen.cells(run_id))
            await pilot.press("space", "c")
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()
            groups = app.screen.query_one("#groups")
            group = [c.plain for c in groups.get_row_at(0)]
            await pilot.press("escape", "enter")  # the run's own screen
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()
            return row, cells, group, str(app.screen.query_one("#summary").content).splitlines()[-1]

    row, cells, group, time_line = asyncio.run(dashboard())
    # where the run's time went: one split, the same line in fslab show and the dashboard, fslab eval's later
    # evaluations (the k-NN one above) left out of it
    shown = fslab_here("show", run_id, cwd=project).stdout
    assert time_line.startswith("time: start ") and time_line in shown.replace("\n", " ")
    spent, status = (json.loads(fslab_here("show", run_id, "--json", cwd=project).stdout)[k]
                     for k in ("time", "status"))
    assert spent["total_s"] == pytest.approx(status["ended"] - status["started"])
    assert row.test == listed["test"] and row.test_by_evaluator == listed["test_by_evaluator"]
    for shots in ("1-shot", "5-shot"):
        assert f"{100 * results[shots]['accuracy']:.2f}±{100 * results[shots]['ci95']:.2f}" in cells
    assert group[3] == f"{100 * compared['1-shot']['accuracy']:.2f}±{100 * compared['1-shot']['ci95']:.2f}"
    assert group[4] == f"{100 * compared['5-shot']['accuracy']:.2f}±{100 * compared['5-shot']['ci95']:.2f}"
    assert compared["5-shot"]["accuracy"] == pytest.approx(results["5-shot"]["accuracy"])
