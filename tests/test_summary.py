"""The run summary (fslab.core.summary): folded event by event, kept in
summary.json, checked against the files it summarises, listed newest first.

The fold is compared with a brute-force second implementation that parses
every line of metrics.jsonl at once."""

from __future__ import annotations

import json
import os
import random

import pytest

from fslab.core.runstore import create_run
from fslab.core.summary import SUMMARY_FILE, SummaryFile, list_summaries, read_summary


def own_config(**extra) -> dict:
    return {"method": "nca", "seed": 0, "evaluator": {"name": "centroid"}, "train": {"epochs": 3}, **extra}


def random_events(rng: random.Random, count: int) -> list[dict]:
    """A plausible stream: training steps, validations, test evaluations by the
    training and by fslab eval (another evaluator), checkpoints, and now and then a
    resumed life after a stop (a start long after the last event)."""
    clock = iter(range(1000, 10**9))
    events, step, epoch = [{"event": "start", "time": 990.0, "epochs": 3, "total_steps": 999}], 0, 1
    for _ in range(count):
        kind = rng.random()
        if kind < 0.7:
            step += 1
            events.append({"event": "train", "time": float(next(clock)), "step": step, "epoch": epoch,
                           "loss": rng.random(), "positives": rng.randrange(100), "negatives": rng.randrange(9000)})
        elif kind < 0.8:
            events.append({"event": "eval", "split": "val", "ways": 5, "shots": 5, "queries": 15, "episodes": 100,
                           "evaluator": "centroid", "epoch": epoch, "accuracy": rng.random(), "ci95": 0.01,
                           "time": float(next(clock))})
            events.append({"event": "checkpoint", "epoch": epoch, "step": step, "path": "checkpoints/last.pt",
                           "time": float(next(clock))})
            epoch += 1
        elif kind < 0.98:
            source = {"source": "fslab eval"} if rng.random() < 0.5 else {}
            if source:  # of the latest checkpoint mostly; of an older one, or of no epoch said, now and then
                source |= {"epoch": e} if (e := rng.choice([epoch - 1, epoch - 1, epoch - 2, None])) else {}
            label = rng.choice(["centroid", "knn[k=3]"]) if source else "centroid"
            events.append({"event": "eval", "split": "test", "ways": 5, "shots": rng.choice([1, 5]), "queries": 15,
                           "episodes": rng.choice([100, 2000]), "evaluator": label, "accuracy": rng.random(),
                           "ci95": 0.02, "time": float(next(clock) + (10**5 if source else 0)), **source})
        else:  # stopped, then resumed much later
            for _ in range(rng.randrange(1, 5000)):
                next(clock)
            events.append({"event": "start", "time": float(next(clock)), "epochs": 3, "total_steps": 999})
    return events


def brute_force(events: list[dict]) -> dict:
    """The summary's metrics part, computed the slow, obvious way."""
    trains = [e for e in events if e["event"] == "train"]
    last = trains[-1] if trains else {}
    own_val = [e for e in events if e["event"] == "eval" and e["split"] == "val" and "source" not in e]
    best = max(own_val, key=lambda e: e["accuracy"], default=None)  # the first of equal maxima
    test, others, checkpoint = {}, {}, 0
    for e in events:
        if e["event"] == "checkpoint":
            checkpoint = max(checkpoint, e["epoch"])
        if e["event"] == "eval" and e["split"] == "test":
            value = {"accuracy": e["accuracy"], "ci95": e["ci95"], "episodes": e["episodes"]}
            if "source" in e and e.get("epoch", checkpoint) >= checkpoint:  # not of an older checkpoint
                others.setdefault(e["evaluator"], {})[f"{e['shots']}-shot"] = value | (
                    {"epoch": e["epoch"]} if "epoch" in e else {})
            elif "source" not in e:
                test[f"{e['shots']}-shot"] = value
    # a later checkpoint takes the scores of the ones before it away
    others = {label: kept for label, scores in others.items()
              if (kept := {n: v for n, v in scores.items() if v.get("epoch", checkpoint) >= checkpoint})}
    own = [e for e in events if "source" not in e]  # fslab eval's events are not the training's time
    starts = [i for i, e in enumerate(own) if e["event"] == "start"]
    life = [e for e in own[starts[-1]:] if e["event"] == "train"]  # the latest life's steps: the ETA's
    return {"step": last.get("step"), "epoch": last.get("epoch"), "loss": last.get("loss"),
            "positives": last.get("positives"), "negatives": last.get("negatives"),
            "best_val": best and {"accuracy": best["accuracy"], "ci95": best["ci95"], "episodes": 100,
                                  "epoch": best["epoch"]},
            "test": test, "test_by_evaluator": others,
            "first_train": (life[0]["time"], life[0]["step"]) if life else None,
            "last_time": own[-1]["time"],
            "downtime": sum(own[i]["time"] - own[i - 1]["time"] for i in starts if i)}


@pytest.mark.parametrize("seed", range(6))
def test_folding_in_any_pieces_equals_the_brute_force(tmp_path, seed):
    rng = random.Random(seed)
    events = random_events(rng, 300)
    run = create_run(tmp_path, "nca", own_config())
    keeper = SummaryFile(run.path)
    data = "".join(json.dumps(e) + "\n" for e in events).encode()
    written = 0
    while written < len(data):  # appended in random pieces, torn lines included, folded as they come
        piece = rng.randint(1, 4000)
        with open(run.metrics_path, "ab") as fh:
            fh.write(data[written : written + piece])
        written += piece
        keeper.refresh()
        if rng.random() < 0.3:  # saved and loaded again: the file carries everything the fold needs
            keeper.dirty = True
            keeper.save()
            keeper = SummaryFile(run.path)
            assert keeper.load()
    keeper.refresh()
    got = {k: getattr(keeper.summary, k) for k in brute_force(events)}
    assert got == brute_force(events)
    assert keeper.summary.corrupt == 0 and keeper.summary.total_steps == 999


def test_the_test_accuracy_is_the_trainings_own_and_later_evaluations_are_listed_by_label(tmp_path):
    run = create_run(tmp_path, "nca", own_config())
    events = [{"event": "eval", "split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2000,
               "evaluator": "centroid", "accuracy": 0.7, "ci95": 0.01},
              {"event": "eval", "split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 10000,
               "evaluator": "knn[k=3]", "accuracy": 0.6, "ci95": 0.005, "source": "fslab eval"}]
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = read_summary(run.path)
    assert summary.test == {"5-shot": {"accuracy": 0.7, "ci95": 0.01, "episodes": 2000}}
    assert summary.test_by_evaluator == {"knn[k=3]": {"5-shot": {"accuracy": 0.6, "ci95": 0.005, "episodes": 10000}}}
    assert summary.test_of("knn[k=3]") == summary.test_by_evaluator["knn[k=3]"]
    assert summary.test_of("centroid") == summary.test_of() == summary.test


def test_a_retrieval_runs_scores_are_listed_as_map_in_fslab_runs_and_the_dashboard(tmp_path, monkeypatch):
    """A run tested with retrieval-map showed its mAP in fslab runs and the dashboard as a bare number
    under the test columns, where fslab show and the evals tab say mAP."""
    from rich.text import Text
    from typer.testing import CliRunner

    from fslab.cli import app
    from fslab.tui.model import row_cells

    run = create_run(tmp_path / "runs", "map", {"method": "map", "seed": 0, "eval": {"ways": 5},
                                                "evaluator": {"name": "retrieval-map"}})
    shape = {"event": "eval", "ways": 5, "queries": 9, "episodes": 40, "evaluator": "retrieval-map", "metric": "map"}
    events = [{**shape, "split": "val", "shots": 1, "epoch": 1, "accuracy": 0.5, "ci95": 0.02},
              {**shape, "split": "test", "shots": 1, "accuracy": 0.4064, "ci95": 0.0123},
              {**shape, "split": "test", "shots": 5, "evaluator": "centroid", "metric": "accuracy", "queries": 15,
               "accuracy": 0.7, "ci95": 0.01, "source": "fslab eval"}]
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    for _ in range(2):  # folded from the files, then read back from summary.json
        summary = read_summary(run.path)
        assert summary.test == {"1-shot": {"accuracy": 0.4064, "ci95": 0.0123, "episodes": 40, "metric": "map"}}
        assert summary.best_val["metric"] == "map"
        assert "metric" not in summary.test_of("centroid")["5-shot"]  # an accuracy stays unlabelled
    cells = [c.plain if isinstance(c, Text) else c for c in row_cells(summary, 0.0, False)]
    assert "mAP 40.64±1.23" in cells and "mAP 50.00±2.00" in cells
    monkeypatch.chdir(tmp_path)
    listed = CliRunner().invoke(app, ["runs", "--wide"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0, listed.output
    assert "mAP 40.64±1.23" in listed.stdout and "mAP 50.00±2.00" in listed.stdout
    by_centroid = CliRunner().invoke(app, ["runs", "--wide", "--evaluator", "centroid"], env={"COLUMNS": "250"})
    assert "70.00±1.00" in by_centroid.stdout and "mAP 70" not in by_centroid.stdout


def test_a_loss_logged_as_minus_0_before_the_fix_shows_as_0_in_every_surface(tmp_path):
    """Runs logged before the train event wrote -0.0 as 0.0 hold ``"loss": -0.0``: fslab show, fslab runs,
    the worker's lines and the dashboard's table showed a loss of -0.0000, and its chart an axis of -0.00."""
    from rich.text import Text

    from fslab.core.events import describe_event
    from fslab.tui.charts import MinMaxSeries, Plot, render_chart
    from fslab.tui.model import row_cells

    from .runs_helpers import fslab_here

    run = create_run(tmp_path / "runs", "supcon", {"method": "supcon", "seed": 0, "train": {"epochs": 1}})
    train = {"event": "train", "time": 1.0, "epoch": 1, "positives": 0, "negatives": 496, "lr": 0.1,
             "images_per_s": 50.0}
    events = [{**train, "step": 1, "loss": 2.0}, {**train, "step": 2, "loss": -0.0}]
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert describe_event(events[-1]).startswith("epoch 1 step 2: loss 0.0000, ")
    cells = [c.plain if isinstance(c, Text) else c for c in row_cells(read_summary(run.path), 0.0, False)]
    assert "0.0000" in cells and "-0.0000" not in cells
    shown = fslab_here("show", run.id, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "step 2, loss 0.0000, pairs +0/-496" in shown.stdout
    listed = fslab_here("runs", "--wide", cwd=tmp_path, env={**os.environ, "COLUMNS": "250"})
    assert " 0.0000 " in listed.stdout and "-0.0000" not in listed.stdout
    losses = MinMaxSeries()
    for event in events:
        losses.append(event["step"], event["loss"])
    axis = [line.split("│")[0].strip() for line in render_chart(Plot([("loss", losses)]), 60, 10).plain.splitlines()]
    assert "0.00" in axis and "-0.00" not in axis


def test_the_saved_summary_is_used_only_while_it_matches_the_files(tmp_path):
    run = create_run(tmp_path, "nca", own_config())
    train = {"event": "train", "time": 1.0, "step": 1, "epoch": 1, "loss": 0.5, "positives": 1, "negatives": 2}
    run.metrics_path.write_text(json.dumps(train) + "\n")
    assert read_summary(run.path).loss == 0.5
    saved = json.loads((run.path / SUMMARY_FILE).read_text())
    # A summary that matches its files is taken as it is (the files are not read again) ...
    saved["summary"]["loss"] = 0.25
    (run.path / SUMMARY_FILE).write_text(json.dumps(saved))
    assert read_summary(run.path, save=False).loss == 0.25
    # ... but once a file it summarises changes, only what is new is folded on top,
    with open(run.metrics_path, "a") as fh:
        fh.write(json.dumps({**train, "step": 2, "loss": 0.125}) + "\n")
    assert read_summary(run.path).step == 2
    # and a rewritten file (a resume cuts it back) is folded again from the top.
    run.metrics_path.unlink()
    run.metrics_path.write_text(json.dumps({**train, "loss": 0.75}) + "\n")
    assert read_summary(run.path).loss == 0.75
    # The status and the configuration are checked the same way.
    run.write_status(state="failed", error="boom")
    summary = read_summary(run.path)
    assert (summary.state, summary.error) == ("failed", "boom")
    (run.path / "config.json").write_text(json.dumps(own_config(method="protonet")))
    assert read_summary(run.path).method == "protonet"
    for damaged in ("not json", json.dumps({"format": 999}), json.dumps([1, 2])):
        (run.path / SUMMARY_FILE).write_text(damaged)
        assert read_summary(run.path).loss == 0.75  # rebuilt from the files


def test_a_saved_summary_of_any_heartbeat_is_taken_as_it_is_and_a_read_rewrites_nothing(tmp_path):
    """A run with its own train.heartbeat (0.2, as the tests' tiny runs have) kept a beat_every that
    summary.json's field types left out, so every read took the summary for damaged: it folded the whole
    metrics.jsonl again and rewrote summary.json, a listing changing every run folder it only read (the
    files of a copied store too). Every field the summary keeps has a type it is checked against."""
    from fslab.core.summary import FIELD_NAMES, NOT_KEPT, SAVED_TYPES

    assert [name for name in FIELD_NAMES if name not in NOT_KEPT and name not in SAVED_TYPES] == []
    run = create_run(tmp_path, "nca", own_config(train={"epochs": 3, "heartbeat": 0.2}))
    train = {"event": "train", "time": 1.0, "step": 1, "epoch": 1, "loss": 0.5, "positives": 1, "negatives": 2}
    run.metrics_path.write_text(json.dumps(train) + "\n")
    assert read_summary(run.path).beat_every == 0.2
    kept = run.path / SUMMARY_FILE
    written = kept.stat().st_mtime_ns
    keeper = SummaryFile(run.path)
    assert keeper.load() and keeper.summary.beat_every == 0.2
    os.utime(kept, ns=(written - 10**9, written - 10**9))
    assert read_summary(run.path).loss == 0.5
    assert kept.stat().st_mtime_ns == written - 10**9  # read, not written again


def test_a_metrics_file_overwritten_in_place_is_folded_again_never_read_from_the_old_offset(tmp_path):
    """summary.json knew metrics.jsonl by its inode and the offset read: a copy written over it in
    place (cp, scp, a hand edit: the same inode) of the same size was never read, and a longer one
    was read from the old offset, in the middle of a line of other events."""
    import os

    run = create_run(tmp_path, "nca", own_config())
    test = {"event": "eval", "split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 2000,
            "evaluator": "centroid", "accuracy": 0.5320, "ci95": 0.01}
    train = {"event": "train", "time": 1.0, "step": 1, "epoch": 1, "loss": 0.5, "positives": 1, "negatives": 2}
    run.metrics_path.write_text(json.dumps(train) + "\n" + json.dumps(test) + "\n")
    inode = os.stat(run.metrics_path).st_ino
    assert read_summary(run.path).test["5-shot"]["accuracy"] == 0.5320
    with open(run.metrics_path, "w") as fh:  # the same size, in place
        fh.write(json.dumps(train) + "\n" + json.dumps({**test, "accuracy": 0.6320}) + "\n")
    assert os.stat(run.metrics_path).st_ino == inode
    assert read_summary(run.path).test["5-shot"]["accuracy"] == 0.6320
    # a resumed copy from elsewhere: other steps before the old offset, more lines after it
    other = [{**train, "step": 5, "loss": 0.25}, {**test, "accuracy": 0.7}, {**train, "step": 6, "loss": 0.125}]
    with open(run.metrics_path, "w") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in other))
    summary = read_summary(run.path)
    assert (summary.step, summary.loss, summary.test["5-shot"]["accuracy"], summary.corrupt) == (6, 0.125, 0.7, 0)


def test_a_config_edited_to_another_evaluator_or_shape_folds_the_events_again(tmp_path):
    """Which test is the run's own, and which episodes count, follow config.json's evaluator, eval.ways
    and eval.queries: an edit of them kept the scores summary.json had folded under the old ones."""
    run = create_run(tmp_path, "nca", own_config(eval={"ways": 5, "queries": 15}))
    shape = {"event": "eval", "split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 100, "ci95": 0.01}
    events = [{**shape, "evaluator": "centroid", "accuracy": 0.5},
              {**shape, "evaluator": "knn[k=3]", "accuracy": 0.6, "source": "fslab eval", "epoch": 1},
              {**shape, "ways": 10, "evaluator": "centroid", "accuracy": 0.3}]
    run.metrics_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert read_summary(run.path).test["5-shot"]["accuracy"] == 0.5
    for edit in ({"evaluator": {"name": "knn", "k": 3}}, {"eval": {"ways": 10, "queries": 15}}):
        (run.path / "config.json").write_text(json.dumps(own_config(**edit)))
        cached = read_summary(run.path)
        (run.path / SUMMARY_FILE).unlink()
        fresh = read_summary(run.path)
        assert (cached.test, cached.test_by_evaluator) == (fresh.test, fresh.test_by_evaluator), edit
        assert cached.test != {"5-shot": {"accuracy": 0.5, "ci95": 0.01, "episodes": 100}}


def test_a_summary_that_cannot_be_written_is_still_right(tmp_path):
    """Where summary.json cannot be written (here a folder stands in its place,
    which stops root too) every reader folds the files again and is right."""
    run = create_run(tmp_path, "nca", own_config())
    run.metrics_path.write_text(json.dumps({"event": "train", "step": 7, "epoch": 1, "loss": 0.5}) + "\n")
    (run.path / SUMMARY_FILE).mkdir()
    assert read_summary(run.path).step == 7
    with open(run.metrics_path, "a") as fh:
        fh.write(json.dumps({"event": "train", "step": 8, "epoch": 1, "loss": 0.25}) + "\n")
    assert read_summary(run.path).step == 8
    assert (run.path / SUMMARY_FILE).is_dir() and not list(run.path.glob(".summary.json.*"))


def test_corrupt_and_badly_shaped_lines_are_counted_not_fatal(tmp_path):
    run = create_run(tmp_path, "nca", own_config())
    lines = ['{"event": "train", "step": 1, "epoch": 1, "loss": 0.5}', "not json", "[1, 2]",
             '{"event": "eval", "split": "val"}', '{"event": "train", "step": "x", "epoch": 1, "loss": 1}',
             '{"event": "eval", "split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 9, '
             '"accuracy": "high", "ci95": 0.1}']
    run.metrics_path.write_text("\n".join(lines) + "\n")
    summary = read_summary(run.path)
    assert summary.step == 1 and summary.best_val is None and summary.test == {}
    assert summary.corrupt == 5


def test_listing_is_newest_first_with_a_limit_and_filters(tmp_path):
    methods = ["nca" if i % 2 else "protonet" for i in range(7)]
    runs = [create_run(tmp_path, m, own_config(method=m)) for m in methods]
    for i, run in enumerate(runs):
        run.write_status(state="completed" if i < 5 else "failed", sweep="sweep-x" if i % 3 == 0 else None)
    # newest first: made in one second (their ids' random suffixes say nothing), as they were created;
    # the listings went by id, while 'last' named the run created last, often not the top row
    from fslab.core.runstore import find_run

    ids = [r.id for r in reversed(runs)]
    assert [s.id for s in list_summaries(tmp_path, limit=None)] == ids
    assert find_run(tmp_path, "last").id == ids[0]
    assert [s.id for s in list_summaries(tmp_path, limit=3)] == ids[:3]
    assert {s.id for s in list_summaries(tmp_path, states=("failed",))} == {runs[5].id, runs[6].id}
    assert {s.id for s in list_summaries(tmp_path, sweep="x")} == {runs[0].id, runs[3].id, runs[6].id}
    assert all(s.method == "nca" for s in list_summaries(tmp_path, method="nca"))
    assert len(list_summaries(tmp_path, method="nca", limit=None)) == 3


def test_elapsed_and_eta_leave_out_the_time_a_resumed_run_lay_stopped_and_a_lost_run_after_its_last_beat():
    from fslab.core.summary import RunSummary, add_lines, apply_status
    from fslab.tui.model import elapsed, eta

    def lines(*events):
        return "".join(json.dumps(e) + "\n" for e in events).encode()

    def start(t):
        return {"event": "start", "time": t, "epochs": 2, "total_steps": 101}

    def train(step, t):
        return {"event": "train", "time": t, "step": step, "epoch": 1, "loss": 1.0, "positives": 1, "negatives": 2}

    # first life: worker started at 1000, trained steps 1-40 from 1010 to 1100, then stopped
    first_life = lines(start(1004.0), *(train(s, 1010.0 + (s - 1) * 90 / 39) for s in range(1, 41)))
    row = RunSummary(id="r", state="running")
    apply_status(row, {"started": 1000.0, "heartbeat": 1100.0})
    add_lines(row, first_life)
    assert elapsed(row, 1100.0) == 100.0
    row.state = "lost"  # its worker died at 1100 (last heartbeat 1103): the clock no longer counts for it
    apply_status(row, {"started": 1000.0, "heartbeat": 1103.0})
    assert elapsed(row, 9999.0) == 103.0

    # resumed at 5000; until its worker logs its start, the 3,900 s stop is already left out
    row.state = "running"
    apply_status(row, {"started": 1000.0, "resumed": 5000.0, "heartbeat": 5002.0})
    assert elapsed(row, 5002.0) == 102.0
    # its second life logs steps 41-91 from 5010 to 5060: one step a second
    add_lines(row, lines(start(5004.0), *(train(s, 5010.0 + s - 41) for s in range(41, 92))))
    assert row.downtime == 3900.0 and row.first_train == (5010.0, 41)
    assert elapsed(row, 5065.0) == 165.0  # 100 s, then 65 s since 5000
    assert eta(row, 5065.0) == 101 - 91 - 5  # 10 steps at this life's rate, 5 s of them gone
    # paused (SIGSTOP) after its last heartbeat at 5062: once three beats of 5 s are missed (5077) the ETA
    # stops counting, where it went on to 0:00 while nothing trained
    apply_status(row, {"started": 1000.0, "resumed": 5000.0, "heartbeat": 5062.0})
    row.total_steps = 401  # a longer run: 310 steps to go at one a second after step 91 at 5060
    assert eta(row, 5070.0) == 310 - 10
    assert eta(row, 5077.0) == eta(row, 5400.0) == eta(row, 9999.0) == 310 - 17
    row.beat_every = 60.0  # train.heartbeat = 60: three minutes without a beat before it stops
    assert eta(row, 5200.0) == 310 - 140 and eta(row, 9999.0) == 310 - (5062 + 180 - 5060)
    row.total_steps = 101
    # the same folded from scratch, both lives in one read
    again = RunSummary(id="r", state="running")
    apply_status(again, {"started": 1000.0, "resumed": 5000.0, "heartbeat": 5062.0})
    add_lines(again, first_life + lines(start(5004.0), *(train(s, 5010.0 + s - 41) for s in range(41, 92))))
    assert (again.downtime, again.first_train, elapsed(again, 5065.0)) == (3900.0, (5010.0, 41), 165.0)


def test_a_later_evaluation_of_an_older_checkpoint_no_longer_counts_once_the_run_trains_on(tmp_path):
    """fslab eval scored a run's checkpoint of epoch 2; the run was then resumed and trained to epoch 3,
    and fslab runs --evaluator knn still showed the epoch-2 network's score as the run's."""
    from fslab.core.eventlog import EventLog

    from .runs_helpers import fslab

    run = create_run(tmp_path / "runs", "nca", own_config())
    log = EventLog(run, echo=False)  # keeps summary.json in step, event by event, as the worker and fslab eval do
    score = {"split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 10000, "evaluator": "knn",
             "ci95": 0.01, "source": "fslab eval"}

    def knn_test():
        listed = fslab("runs", "--json", "--evaluator", "knn", cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        (line,) = listed.stdout.splitlines()
        return json.loads(line)["test"]

    log.write("start", epochs=3, total_steps=30)
    log.write("train", step=20, epoch=2, loss=0.5)
    log.write("checkpoint", epoch=2, step=20)
    log.write("eval", **score, epoch=2, accuracy=0.6)
    assert knn_test() == {"5-shot": {"accuracy": 0.6, "ci95": 0.01, "episodes": 10000, "epoch": 2}}
    log.write("start", epochs=3, total_steps=30)  # resumed: the network changes from here on
    log.write("train", step=30, epoch=3, loss=0.4)
    assert knn_test()["5-shot"]["epoch"] == 2  # still the latest checkpoint's score
    log.write("checkpoint", epoch=3, step=30)
    assert knn_test() == {}  # the epoch-2 network is gone
    log.write("eval", **score, epoch=2, accuracy=0.61)  # begun before the checkpoint of epoch 3, logged after it
    assert knn_test() == {}
    log.write("eval", **score, epoch=3, accuracy=0.7)
    assert knn_test() == {"5-shot": {"accuracy": 0.7, "ci95": 0.01, "episodes": 10000, "epoch": 3}}
    log.close()
    (run.path / SUMMARY_FILE).unlink()  # folded afresh from the files: the same
    assert read_summary(run.path).test_of("knn") == {"5-shot": {"accuracy": 0.7, "ci95": 0.01, "episodes": 10000,
                                                                "epoch": 3}}


def test_a_later_evaluation_of_another_query_count_gives_way_to_one_of_the_runs_own(tmp_path):
    """fslab eval --queries 5 after fslab eval at the run's 15 queries took the run's knn column, unsaid."""
    from fslab.core.eventlog import EventLog
    from fslab.core.events import table_score

    run = create_run(tmp_path / "runs", "nca", own_config(eval={"ways": 5, "queries": 15}))
    log = EventLog(run, echo=False)
    score = {"split": "test", "ways": 5, "shots": 5, "episodes": 1000, "evaluator": "knn", "ci95": 0.01,
             "source": "fslab eval"}
    log.write("checkpoint", epoch=2, step=20)
    log.write("eval", **score, queries=5, epoch=2, accuracy=0.5)  # the only one yet: shown, its count said
    held = read_summary(run.path).test_of("knn")["5-shot"]
    assert held == {"accuracy": 0.5, "ci95": 0.01, "episodes": 1000, "epoch": 2, "queries": 5}
    assert table_score(held) == "50.00±1.00 (5q)"
    log.write("eval", **score, queries=15, epoch=2, accuracy=0.6)  # the run's own count takes its place
    log.write("eval", **score, queries=5, epoch=2, accuracy=0.55)  # and keeps it against another count
    log.write("eval", **score | {"shots": 1}, queries=30, epoch=2, accuracy=0.4)
    expected = {"5-shot": {"accuracy": 0.6, "ci95": 0.01, "episodes": 1000, "epoch": 2},
                "1-shot": {"accuracy": 0.4, "ci95": 0.01, "episodes": 1000, "epoch": 2, "queries": 30}}
    assert read_summary(run.path).test_of("knn") == expected
    log.write("checkpoint", epoch=3, step=30)
    log.write("eval", **score, queries=5, epoch=3, accuracy=0.7)  # of a newer network: the only score of it
    assert read_summary(run.path).test_of("knn") == {
        "5-shot": {"accuracy": 0.7, "ci95": 0.01, "episodes": 1000, "epoch": 3, "queries": 5}}
    log.close()
    (run.path / SUMMARY_FILE).unlink()  # folded afresh from the files: the same
    assert read_summary(run.path).test_of("knn")["5-shot"]["queries"] == 5


def test_a_run_folder_being_deleted_is_not_given_a_summary_again(tmp_path):
    """rm -rf of a run while fslab runs (or show) read it: the reader folded what was left
    (metrics.jsonl, its config.json and status.json already removed) and wrote summary.json back
    into the folder, so rm failed with 'Directory not empty' and the folder stayed behind."""
    run = create_run(tmp_path, "nca", own_config())
    train = {"event": "train", "time": 1.0, "step": 1, "epoch": 1, "loss": 0.5, "positives": 1, "negatives": 2}
    run.metrics_path.write_text(json.dumps(train) + "\n")
    read_summary(run.path)
    keeper = SummaryFile(run.path)  # a reader that loaded summary.json before the deletion began
    keeper.load()
    (run.path / SUMMARY_FILE).unlink()  # rm -rf removes it first
    with open(run.metrics_path, "a") as fh:  # and the reader has something new to fold and save
        fh.write(json.dumps({**train, "step": 2}) + "\n")
    assert keeper.refresh()
    keeper.save()
    assert not (run.path / SUMMARY_FILE).exists()
    for name in ("config.json", "status.json"):  # rm -rf, halfway through
        (run.path / name).unlink()
    assert list_summaries(tmp_path) == []
    read_summary(run.path)
    # .status.lock: made with the run's first status (Run.write_status), not by the reader
    assert sorted(p.name for p in run.path.iterdir()) == [".status.lock", "checkpoints", "metrics.jsonl"]
    run.metrics_path.unlink()
    (run.path / ".status.lock").unlink()
    (run.path / "checkpoints").rmdir()
    run.path.rmdir()  # the rest of rm -rf succeeds
