"""Evaluate-and-record (the one path to eval events and saved scores) and the checkpoint dict."""

import json
import math
import random
from fractions import Fraction

import pytest
import torch
from fslab_plugins.methods.nca import centroid

from fslab.core.eventlog import EventLog
from fslab.core.runstore import create_run
from fslab.core.types import DEFAULT_EPISODES
from fslab.training import evaluation
from fslab.training.checkpoint import (
    load_checkpoint,
    restore_training,
    save_checkpoint,
    training_checkpoint,
)
from fslab.training.record import (
    Episodes,
    EvaluationInputs,
    episode_count,
    evaluate_and_record,
)

CLASSES, PER_CLASS = 6, 10


@pytest.fixture
def split():
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(CLASSES).repeat_interleave(PER_CLASS)
    features = torch.randn(len(labels), 4, generator=generator) + labels[:, None].float()  # learnable classes
    return features, labels


def logged_evals(run):
    return [json.loads(line) for line in run.metrics_path.read_text().splitlines()]


def episodes(split_name="test", shots=(1, 3), count=30, epoch=4):
    return Episodes(split=split_name, ways=3, shots=shots, queries=2, count=count, seed=5, epoch=epoch)


def test_fslab_eval_records_the_scores_the_episodes_give(tmp_path, split):
    features, labels = split
    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    center = features.mean(0)
    inputs = EvaluationInputs(labels=labels, features=features, center=center, features_cached=False)
    results = evaluate_and_record(EventLog(run, echo=False), centroid, "centroid", inputs, episodes(), save=True,
                                  source="fslab eval")

    assert [(r["shots"], r["features_cached"]) for r in results] == [(1, False), (3, True)]
    events = logged_evals(run)
    saved = sorted(run.saved_accuracies(), key=lambda s: s["shots"])
    for result, event, kept in zip(results, events, saved):
        scores = evaluation.episode_scores(features, labels, centroid, 3, result["shots"], 2, 30, 5, center=center)
        kept_scores = [Fraction(repr(round(float(s), 6))) for s in scores]  # as evaluations/ keeps them
        mean = sum(kept_scores) / len(kept_scores)  # exact, then the population std
        std = math.sqrt(sum((s - mean) ** 2 for s in kept_scores) / len(kept_scores))
        assert result["accuracy"] == pytest.approx(float(mean), abs=1e-12)
        assert result["ci95"] == pytest.approx(1.96 * std / math.sqrt(30), abs=1e-12)
        identity = {"split": "test", "ways": 3, "queries": 2, "episodes": 30, "evaluator": "centroid",
                    "metric": "accuracy", "seed": 5, "stream": evaluation.EPISODE_STREAM, "epoch": 4}
        assert {k: result[k] for k in identity} == identity
        assert set(event) == {"event", "time", "source", *identity, "shots", "accuracy", "ci95"}
        assert event["source"] == "fslab eval" and event["accuracy"] == result["accuracy"]
        assert kept == {**result, "accuracies": [round(float(s), 6) for s in scores]}


def test_a_shape_the_evaluator_refuses_records_none_of_the_shapes_before_it(tmp_path, split):
    # fslab eval --evaluator knn --set evaluator.k=4 --shots 3,1: k=4 fits the 3-shot episodes' 9 support
    # points, not the 1-shot ones' 3; the command exits 2, and must not leave the 3-shot scores behind
    from fslab_plugins.methods.nca_evaluators import knn

    from fslab.core.errors import UsageError

    features, labels = split
    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    inputs = EvaluationInputs(labels=labels, features=features, features_cached=False)
    with pytest.raises(UsageError, match="k must be between 1 and the 3 support points"):
        evaluate_and_record(EventLog(run, echo=False), lambda s, q: knn(s, q, k=4), "knn[k=4]", inputs,
                            episodes(shots=(3, 1)), save=True, source="fslab eval")
    assert run.saved_accuracies() == []
    assert not run.metrics_path.exists() or logged_evals(run) == []


def test_a_fixed_episode_shape_too_large_for_the_split_says_the_evaluator_draws_it(tmp_path, split):
    # fslab eval --evaluator retrieval-map --set evaluator.images_per_class=11: the line said "episodes with
    # 1 shot and 10 queries", which no option asked for
    from fslab_plugins.methods.map import RetrievalMAP

    from fslab.core.errors import UsageError

    features, labels = split
    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    inputs = EvaluationInputs(labels=labels, features=features)
    with pytest.raises(UsageError, match=r"^evaluator 'retrieval-map' draws its own episode shape, 1 \+ 10 images "
                                         r"per class \(shots \+ queries\): 3-way episodes with 1 shot and 10 "):
        evaluate_and_record(EventLog(run, echo=False), RetrievalMAP(images_per_class=11),
                            "retrieval-map[images_per_class=11]", inputs, episodes(), save=True, source="fslab eval")
    assert run.saved_accuracies() == []


def test_training_records_by_epoch_and_step_and_saves_only_when_asked(tmp_path, split):
    features, labels = split
    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    log = EventLog(run, echo=False)
    embedded = []
    inputs = EvaluationInputs(labels=labels, features=lambda: embedded.append(1) or features)
    evaluate_and_record(log, centroid, "centroid", inputs, episodes("val", shots=[3], epoch=2), save=False,
                        at={"epoch": 2, "step": 14})
    results = evaluate_and_record(log, centroid, "centroid", inputs, episodes(), save=True, at={"step": 20})

    assert len(embedded) == 2  # once per evaluation, not once per shape
    val, *test = logged_evals(run)
    shape = {"event", "time", "split", "ways", "shots", "queries", "episodes", "evaluator", "metric", "accuracy",
             "ci95"}
    assert set(val) == shape | {"epoch", "step"} and (val["epoch"], val["step"]) == (2, 14)
    assert [set(e) for e in test] == [shape | {"step"}] * 2
    assert all("features_cached" not in r for r in results)
    assert [s["split"] for s in run.saved_accuracies()] == ["test", "test"]  # the validation is not kept


class SlowAdapter:
    """A model-aware evaluator as the core sees it (no call needed here)."""

    needs_model = True
    default_episodes = 100


def test_episode_counts_of_fast_and_model_aware_evaluators():
    assert episode_count(centroid, None) == DEFAULT_EPISODES
    assert episode_count(centroid, 500, during_training=True) == 500
    assert episode_count(SlowAdapter(), None) == 100
    assert episode_count(SlowAdapter(), 300) == 300  # fslab eval runs what is asked for
    assert episode_count(SlowAdapter(), 500, during_training=True) == 100
    assert episode_count(SlowAdapter(), 20, during_training=True) == 20


def tiny_training():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    head = torch.nn.Linear(4, 2)
    loss = torch.nn.Linear(2, 3)  # a loss with parameters of its own
    params = [*model.parameters(), *head.parameters(), *loss.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [2], gamma=0.1)
    return model, head, loss, optimizer, scheduler


def draws(augment_rng):
    return torch.rand(3).tolist(), torch.rand(2, generator=augment_rng).tolist(), random.random()


def test_a_checkpoint_restores_weights_optimiser_schedule_and_random_streams(tmp_path):
    torch.manual_seed(0)
    model, head, loss, optimizer, scheduler = tiny_training()
    augment_rng = torch.Generator().manual_seed(1)
    loss(head(model(torch.randn(5, 3)))).sum().backward()
    optimizer.step()
    scheduler.step()
    path = tmp_path / "last.pt"
    save_checkpoint(path, training_checkpoint(
        model=model, head=head, loss_fn=loss, optimizer=optimizer, scheduler=scheduler, epoch=3, step=7,
        config={"method": "nca"}, best_val=0.5, train_mean=torch.ones(4), augment_rng=augment_rng,
        device=torch.device("cpu")))
    expected = draws(augment_rng)

    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left
    checkpoint = load_checkpoint(path, "cpu")
    assert set(checkpoint) == {"model", "head", "optimizer", "loss", "scheduler", "epoch", "step", "config",
                               "best_val", "train_mean", "rng"}
    torch.manual_seed(99)  # fresh weights and streams, all to be replaced
    fresh = tiny_training()
    fresh_rng = torch.Generator().manual_seed(2)
    restore_training(checkpoint, model=fresh[0], head=fresh[1], loss_fn=fresh[2], optimizer=fresh[3],
                     scheduler=fresh[4], augment_rng=fresh_rng)
    assert draws(fresh_rng) == expected
    for before, after in zip((model, head, loss), fresh[:3]):
        for (name, a), b in zip(before.state_dict().items(), after.state_dict().values()):
            assert torch.equal(a, b), name
    momentum = [o.state_dict()["state"][0]["momentum_buffer"] for o in (optimizer, fresh[3])]
    assert torch.equal(*momentum) and momentum[0].abs().sum() > 0
    assert fresh[4].state_dict() == scheduler.state_dict()


KNN = {"split": "test", "ways": 5, "shots": 1, "queries": 15, "episodes": 50, "evaluator": "knn",
       "metric": "accuracy", "seed": 0, "stream": 1, "epoch": 1, "accuracy": 0.4, "ci95": 0.02}


def logged_life(run):
    """A killed run's log: epoch 1 checkpointed, epoch 2 half trained, then fslab eval's score of the
    epoch-1 checkpoint, and a torn last line."""
    log = EventLog(run, echo=False)
    log.write("train", step=1, epoch=1, loss=2.0, positives=1, negatives=2)
    log.write("checkpoint", epoch=1, step=1)
    log.write("train", step=2, epoch=2, loss=1.5, positives=1, negatives=2)
    log.write("eval", source="fslab eval", **KNN)
    log.close()
    with open(run.metrics_path, "a") as fh:
        fh.write('{"event": "train", "st')


def test_a_resume_keeps_the_evaluations_fslab_eval_logged_after_its_checkpoint(tmp_path):
    """The log is cut back to the checkpoint a resume starts from, but fslab eval's scores of a checkpoint
    (their scores stay in evaluations/) are no training to repeat: fslab show and fslab runs --evaluator
    lost them at the resume."""
    from fslab.core.eventlog import truncate_to_checkpoint
    from fslab.core.summary import read_summary

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    logged_life(run)
    truncate_to_checkpoint(run, 1)
    assert [(e["event"], e.get("step"), e.get("source")) for e in logged_evals_and_all(run)] == [
        ("train", 1, None), ("checkpoint", 1, None), ("eval", None, "fslab eval")]
    assert read_summary(run.path).test_by_evaluator == {"knn": {"1-shot": {"accuracy": 0.4, "ci95": 0.02,
                                                                           "episodes": 50, "epoch": 1}}}


def test_the_event_of_a_data_root_moved_outlives_a_resume_s_cut_and_a_start_afresh(tmp_path):
    """fslab resume --data-root keeps the root a run leaves in a data_root event, appended after its checkpoint:
    the worker's cut back to the checkpoint (or, for a run queued again before one, its emptied log) would lose
    it, and with it where the run's data was."""
    from fslab.core.eventlog import start_afresh, truncate_to_checkpoint

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    logged_life(run)
    with open(run.metrics_path, "a") as fh:
        fh.write("\n")  # the torn line ended, as the next writer ends it
    log = EventLog(run, echo=False)
    log.write("data_root", root="/new", was="/old")
    log.close()
    truncate_to_checkpoint(run, 1)
    assert [e["event"] for e in run.events()] == ["train", "checkpoint", "eval", "data_root"]
    start_afresh(run)
    assert [(e["event"], e.get("root"), e.get("was")) for e in run.events()] == [("data_root", "/new", "/old")]


def test_fslab_eval_beside_a_resume_logs_into_the_file_the_resume_left(tmp_path):
    """fslab eval opens the log before it scores; a resume that cuts the log back meanwhile replaces the
    file, and the evaluation's line went to the replaced one, lost with it."""
    from fslab.core.eventlog import truncate_to_checkpoint

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    logged_life(run)
    log = EventLog(run, echo=False)  # fslab eval, scoring
    truncate_to_checkpoint(run, 1)  # fslab resume's worker starts
    log.write("eval", source="fslab eval", **{**KNN, "shots": 5})
    log.close()
    assert [(e["event"], e.get("shots")) for e in logged_evals_and_all(run)] == [
        ("train", None), ("checkpoint", None), ("eval", 1), ("eval", 5)]


def test_fslab_eval_logging_while_a_resume_cuts_the_log_back_loses_no_line(tmp_path, monkeypatch):
    """A resume reads the log, then replaces it with the lines it keeps; a score fslab eval appended between
    the two went to the replaced file and was lost (the cut now holds the log's lock, which appends take)."""
    import threading

    from fslab.core import eventlog

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    logged_life(run)
    log = EventLog(run, echo=False)  # fslab eval, scoring
    done = threading.Event()
    write = eventlog.atomic_write_text

    def between_read_and_rename(path, text):  # fslab eval logs its score now, from another thread
        threading.Thread(target=lambda: (log.write("eval", source="fslab eval", **{**KNN, "shots": 5}),
                                         done.set()), daemon=True).start()
        done.wait(0.5)  # held off by the cut's lock: it lands once the file is replaced
        write(path, text)

    monkeypatch.setattr(eventlog, "atomic_write_text", between_read_and_rename)
    eventlog.truncate_to_checkpoint(run, 1)
    assert done.wait(5)
    log.close()
    assert [(e["event"], e.get("shots")) for e in logged_evals_and_all(run)] == [
        ("train", None), ("checkpoint", None), ("eval", 1), ("eval", 5)]


def test_a_log_whose_path_now_holds_what_cannot_be_opened_writes_on_in_its_own_file(tmp_path):
    """An append waits for the file at the path to be the one it holds; one it cannot open there
    (a folder; another user's file) must not keep it waiting for ever."""
    import threading

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    log = EventLog(run, echo=False)
    held = open(run.metrics_path, "rb")  # the file the log appends to, read once the path is taken
    run.metrics_path.unlink()
    run.metrics_path.mkdir()
    writer = threading.Thread(target=log.write, args=("train",), kwargs={"step": 1}, daemon=True)
    writer.start()
    writer.join(120)  # for ever, were it still waiting; a moment where it is not
    assert not writer.is_alive()
    assert json.loads(held.read())["step"] == 1
    held.close()
    log.close()


def logged_evals_and_all(run):
    return [json.loads(line) for line in run.metrics_path.read_text().splitlines()]


def test_a_log_cut_before_the_checkpoints_event_is_one_line_saying_what_to_do(tmp_path):
    """A resume cuts the log back to the checkpoint's event; a log cut short or edited before it failed the run
    with 'RuntimeError: metrics.jsonl has no checkpoint event for epoch 1; cannot resume cleanly'."""
    from fslab.core.errors import FslabError
    from fslab.core.eventlog import truncate_to_checkpoint
    from fslab.execution.worker import _one_line

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    logged_life(run)
    before = run.metrics_path.read_bytes()
    with pytest.raises(FslabError) as error:
        truncate_to_checkpoint(run, 2)
    assert _one_line(error.value) == (
        f"{run.metrics_path} has no checkpoint event for epoch 2, the epoch of the checkpoint (the file was cut "
        f"short or edited); the run cannot go on from there: start it again with fslab run --like {run.id}")
    assert run.metrics_path.read_bytes() == before  # nothing written
    run.metrics_path.unlink()  # deleted, or left out of a copy: it failed the run with a FileNotFoundError
    with pytest.raises(FslabError) as error:
        truncate_to_checkpoint(run, 2)
    assert _one_line(error.value) == (
        f"{run.metrics_path} is missing, and with it the checkpoint event of epoch 2, the epoch of the checkpoint; "
        f"the run cannot go on from there: start it again with fslab run --like {run.id}")
    assert not run.metrics_path.exists()


def test_a_log_whose_run_folder_is_removed_goes_on_without_failing(tmp_path):
    """Following a replaced metrics.jsonl must not fail a worker whose run folder was removed under it."""
    import shutil

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    log = EventLog(run, echo=False)
    log.write("note", text="before")
    shutil.rmtree(run.path)
    assert log.write("note", text="after")["text"] == "after"
    log.close()
    assert not run.path.exists()
