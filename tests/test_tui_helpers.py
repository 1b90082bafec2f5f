"""Tiny run stores written by the dashboard tests: fixed times, no training (no tests here)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

FROZEN = 1_800_000_000.0  # "now" for every dashboard test with a frozen clock


def config(method="nca", backbone="conv4", dataset="synthetic", seed=0, epochs=3, loss=None):
    return {"method": method, "seed": seed, "device": "cpu", "dataset": {"name": dataset, "root": "data"},
            "backbone": {"name": backbone}, "loss": {"name": loss or method}, "sampler": {"name": "iid"},
            "evaluator": {"name": "centroid"}, "train": {"epochs": epochs, "batch_size": 32, "lr": 0.1}}


def complete_config(**changes) -> dict:
    """A run's whole configuration, as fslab saves it (what fslab resume checks before it starts a run)."""
    from fslab.core.config import CONFIG_VERSION, DEFAULTS, merge

    return merge({**DEFAULTS, "config_version": CONFIG_VERSION}, merge(config(), changes))


def train(step, epoch, loss, t=None, positives=60, negatives=6000, lr=0.1):
    return {"event": "train", "time": t if t is not None else FROZEN - 600 + step, "step": step, "epoch": epoch,
            "loss": loss, "positives": positives, "negatives": negatives, "lr": lr, "images_per_s": 50.0}


def evaluation(split, shots, accuracy, ci95, episodes, epoch=None, t=None):
    event = {"event": "eval", "time": FROZEN - 300 if t is None else t, "split": split, "ways": 5, "shots": shots,
             "queries": 15, "episodes": episodes, "accuracy": accuracy, "ci95": ci95}
    if epoch is not None:
        event["epoch"] = epoch
    return event


def history(epochs=3, steps_per_epoch=4, tests=((1, 0.5422, 0.0044), (5, 0.7107, 0.0039))):
    """The events of a run: start, train steps, a val eval per epoch, test evals;
    timed as a run would be (a step 20 s, a validation 8 s, a checkpoint 1 s, a test 10 s)."""
    t = FROZEN - 601
    events = [{"event": "start", "time": t, "device": "cpu", "epochs": epochs,
               "steps_per_epoch": steps_per_epoch, "total_steps": epochs * steps_per_epoch, "train_images": 128}]
    step = 0
    for epoch in range(1, epochs + 1):
        for _ in range(steps_per_epoch):
            step, t = step + 1, t + 20
            events.append(train(step, epoch, 3.0 * math.exp(-step / 5) + 0.5, t=t,
                                lr=0.1 if epoch < epochs else 0.01))
        t += 8
        events.append(evaluation("val", 5, 0.5 + 0.05 * epoch, 0.01, 300, epoch=epoch, t=t))
        t += 1
        events.append({"event": "checkpoint", "time": t, "epoch": epoch, "step": step,
                       "path": "checkpoints/last.pt"})
    for shots, accuracy, ci in tests:
        t += 5
        events.append(evaluation("test", shots, accuracy, ci, 2000, t=t))
    return events


def write_run(runs: Path, run_id: str, *, state="completed", cfg=None, events=(), error=None, stdout="",
              stderr="", started=FROZEN - 605.0, ended=FROZEN - 100.0) -> Path:
    folder = runs / run_id
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg or config()))
    status = {"state": state, "host": "fixture-host", "pid": 1, "created": started - 1, "started": started,
              "heartbeat": FROZEN - 1 if state in ("queued", "running") else started + 10}
    if state in ("completed", "failed", "killed"):
        status.update(ended=ended, exit_code=0 if state == "completed" else 1, error=error)
    elif error:
        status["error"] = error
    write_status(folder, status)
    with open(folder / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in events)
    (folder / "stdout.log").write_text(stdout)
    (folder / "stderr.log").write_text(stderr)
    return folder


def write_status(folder: Path, status: dict) -> None:
    """``status.json`` as the fixture's host wrote it at its latest time: the filesystem's stamp agrees
    with the frozen clock, as a live host's would (fslab.core.clocks reads another host's clock from it)."""
    from fslab.core.clocks import written_at

    path = folder / "status.json"
    path.write_text(json.dumps(status))
    if (at := written_at(status)) is not None:
        os.utime(path, (at, at))


def append(folder: Path, text: str) -> None:
    with open(folder / "metrics.jsonl", "a") as fh:
        fh.write(text)


def standard_store(runs: Path) -> dict[str, Path]:
    """Four runs in four states, two of them seeds of one configuration."""
    return {
        "done0": write_run(runs, "20260101-100000-nca-aaaa", cfg=config(seed=0), events=history(),
                           stdout="epoch 1 step 1: loss 3.0\ndone\n"),
        "done1": write_run(runs, "20260101-110000-nca-bbbb", cfg=config(seed=1),
                           events=history(tests=((1, 0.5622, 0.0040), (5, 0.7307, 0.0035)))),
        "failed": write_run(runs, "20260101-120000-protonet-cccc", state="failed",
                            cfg=config(method="protonet", backbone="resnet12"), events=history(epochs=3)[:6],
                            error="RuntimeError: CUDA out of memory",
                            stderr="Traceback (most recent call last):\n  File \"train.py\"\n"
                                   "RuntimeError: CUDA out of memory\n"),
        "running": write_run(runs, "20260101-130000-nca-dddd", state="running", cfg=config(epochs=3),
                             events=history(epochs=3)[:6]),
    }


def save_episode_scores(folder: Path, seed: int, episodes: int = 2000) -> dict[int, list[float]]:
    """Per-episode test accuracies in ``evaluations/``, as training saves them
    (5-way, 15 queries: each accuracy is k/75), seeded; returns them by shots."""
    import random

    rng = random.Random(seed)
    (folder / "evaluations").mkdir(exist_ok=True)
    scores = {}
    for shots, centre in ((1, 40), (5, 53)):
        scores[shots] = [min(75, max(0, round(rng.gauss(centre, 6)))) / 75 for _ in range(episodes)]
        record = {"split": "test", "ways": 5, "shots": shots, "queries": 15, "episodes": episodes,
                  "evaluator": "centroid", "metric": "accuracy", "seed": 0, "stream": 2, "epoch": 3,
                  "accuracies": scores[shots]}
        name = f"test-centroid-5way-{shots}shot-15q-{episodes}ep-seed0-epoch3.json"
        (folder / "evaluations" / name).write_text(json.dumps(record))
    return scores


def test_the_launch_forms_set_field_splits_where_the_shell_would_not_break_a_value():
    from fslab.core.assignments import parse_assignment
    from fslab.tui.launch_screen import _assignments

    text = 'train.milestones=[0.5, 0.75]  dataset.root="/tmp/a b" loss.name=nca eval.extra={a = 1, b = [2, 3]}'
    assert [parse_assignment(t) for t in _assignments(text)] == [
        (["train", "milestones"], [0.5, 0.75]), (["dataset", "root"], "/tmp/a b"), (["loss", "name"], "nca"),
        (["eval", "extra"], {"a": 1, "b": [2, 3]})]
    assert _assignments("") == [] and _assignments("  x=1 ") == ["x=1"]
    # a quote escaped inside double quotes closed them: the space after it split the value
    assert _assignments('dataset.root="/a\\" b" x=1') == ['dataset.root="/a\\" b"', "x=1"]


def test_the_dashboard_lists_runs_of_one_second_as_fslab_runs_does_newest_created_first():
    """Ids begin with their second; a sweep's runs share one, and their random suffixes said
    nothing of which came last: the dashboard went by id, fslab runs too, 'last' by creation."""
    from fslab.core.summary import RunSummary
    from fslab.tui.model import sort_rows

    rows = [RunSummary(id="20261128-100000-nca-ffff", created=1.0),
            RunSummary(id="20261128-100000-nca-0000", created=2.0),
            RunSummary(id="20261128-095959-nca-zzzz", created=3.0)]  # a clock set back: the id's second comes first
    newest_first = ["20261128-100000-nca-0000", "20261128-100000-nca-ffff", "20261128-095959-nca-zzzz"]
    assert [r.id for r in sort_rows(rows, "id", True, 0.0)] == newest_first
    assert [r.id for r in sort_rows(rows, "method", False, 0.0)] == newest_first  # ties: newest first
