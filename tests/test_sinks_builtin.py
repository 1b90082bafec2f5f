"""The built-in sinks with the real packages, no mocks: a real run sent live to
TensorBoard, MLflow and W&B (offline), each read back with the tool's own
reader and compared with metrics.jsonl; then ``fslab export`` over the live
records, which must leave one record per run in each."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, events, fslab, fslab_here, wait_for

pytestmark = pytest.mark.slow

tensorboard = pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")
wandb = pytest.importorskip("wandb")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A project with one real run sent to the three sinks as it trained."""
    project = tmp_path_factory.mktemp("sinks")
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS, "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    env.pop("FSLAB_CONFIG", None)
    result = fslab("run", "nca", *TINY, "--epochs", "2", "--set", "eval.final_val=true", "--sink", "tensorboard",
                   "--sink", "mlflow", "--sink", "wandb", cwd=project, env=env)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (project / "runs").iterdir()
    assert (run_dir / "stderr.log").read_text() == ""  # no sink complained
    return project, run_dir, env


def _train(run_dir) -> list[tuple[int, float]]:
    return [(e["step"], e["loss"]) for e in events(run_dir, "train")]


def _evals(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Each evaluation's tag and points; the final network's validation scores
    (eval.final_val: a val evaluation without an epoch) are apart, as val_final."""
    out: dict = {}
    for e in events(run_dir, "eval"):
        split = "val_final" if e["split"] == "val" and "epoch" not in e else e["split"]
        out.setdefault(f"{split}/{e['ways']}way_{e['shots']}shot/accuracy", []).append((e["step"], e["accuracy"]))
    return out


# -- TensorBoard --------------------------------------------------------------------


def _board(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    board.Reload()
    return board


def test_tensorboard_holds_the_runs_scalars_on_its_steps(exported):
    _, run_dir, _ = exported
    board = _board(run_dir / "tb")
    loss = [(s.step, s.value) for s in board.Scalars("train/loss")]
    assert [step for step, _ in loss] == [step for step, _ in _train(run_dir)]
    assert [v for _, v in loss] == pytest.approx([v for _, v in _train(run_dir)], rel=1e-6)  # stored as float32
    for tag, points in _evals(run_dir).items():
        got = [(s.step, s.value) for s in board.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points] and [v for _, v in got] == pytest.approx(
            [v for _, v in points], rel=1e-6)
    assert {"train/positives", "train/negatives", "train/lr", "train/images_per_s",
            "test/5way_5shot/accuracy_ci95", "val_final/5way_5shot/accuracy"} <= set(board.Tags()["scalars"])
    assert "config/text_summary" in board.Tags()["tensors"]


# -- MLflow -------------------------------------------------------------------------


def _mlflow_runs(project):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(project / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("fslab")
    return client, client.search_runs([experiment.experiment_id])


def test_mlflow_holds_params_metric_histories_tags_and_artifacts(exported):
    project, run_dir, _ = exported
    client, runs = _mlflow_runs(project)
    assert len(runs) == 1
    run = runs[0]
    config = json.loads((run_dir / "config.json").read_text())
    assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == str(config["train"]["lr"])
    assert run.data.params["loss.name"] == "nca" and run.data.params["eval.shots"] == "[1, 5]"
    assert {k: run.data.tags[f"fslab.{k}"] for k in ("run_id", "method", "backbone", "dataset", "seed")} == {
        "run_id": run_dir.name, "method": "nca", "backbone": "conv4", "dataset": "synthetic", "seed": "0"}
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == _train(run_dir)
    for tag, points in _evals(run_dir).items():
        assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag)) == points
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.json", "results.json"}


# -- W&B ---------------------------------------------------------------------------


def wandb_records(path) -> list:
    """The records of an offline ``.wandb`` file: W&B's log format (a 7-byte
    header, then 32 KiB blocks of records, each with a 7-byte header:
    checksum, length, type full/first/middle/last) holding protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, chunks, pending = 7, [], b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind in (2, 3):
            pending += chunk
        elif kind == 4:
            chunks.append(pending + chunk)
            pending = b""
    records = []
    for raw in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


# A run's configuration as the sinks read it (its method, seed, components and episode shape).
RUN_CONFIG = {"method": "nca", "seed": 0, "loss": {"name": "nca"}, "backbone": {"name": "conv4"},
              "dataset": {"name": "synthetic"}, "eval": {"ways": 5}, "evaluator": {"name": "centroid"}}


def _offline_trackers(monkeypatch) -> None:
    """W&B offline and quiet, MLflow on its file store: the trackers write files here, and reach nothing."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def _fed(sink, stream, logged: list[dict]) -> None:
    """``sink`` fed ``stream`` as a worker logs it: each event appended to ``logged`` and the run's
    metrics.jsonl rewritten to hold them (which a resuming sink reads back), then written; then closed."""
    for event in stream:
        logged.append(event)
        (Path(sink.run.path) / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in logged))
        sink.write(event)
    sink.close()


def _wandb_history(folder, run_name: str) -> list[dict] | None:
    """The history rows of an offline W&B record (each a dict from a key to its value); None while the
    file cannot be read whole yet (W&B writes it as the run goes)."""
    try:
        records = wandb_records(folder / f"run-{run_name}.wandb")
    except Exception:
        return None
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def _offline(run_dir) -> list:
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{run_dir.name}"))


def test_wandb_offline_holds_the_run_history_and_summary(exported):
    _, run_dir, _ = exported
    (folder,) = _offline(run_dir)
    records = wandb_records(folder / f"run-{run_dir.name}.wandb")
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.run_id == run_dir.name and run.display_name == run_dir.name
    assert list(run.tags) == ["nca", "conv4", "synthetic", "seed=0"]  # method and loss both nca: once
    def key(item) -> str:  # written as key or as nested_key, by wandb's version
        return item.key or "/".join(item.nested_key)

    history = [{key(item): json.loads(item.value_json) for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    losses = [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h]
    assert losses == _train(run_dir)
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({key(item): json.loads(item.value_json) for item in r.summary.update})
    results = json.loads((run_dir / "results.json").read_text())["test"]
    assert summary["test/5way_5shot/accuracy"] == results["5-shot"]["accuracy"]


# -- fslab export -----------------------------------------------------------------------


def test_exporting_over_the_live_record_leaves_one_record_in_each(exported, builtin_plugins):
    """The live run wrote a record in each tracker; an export writes the run again,
    replacing it (the same path an export takes over an earlier export)."""
    project, run_dir, env = exported
    for sink in ("tensorboard", "mlflow", "wandb"):
        out = fslab_here("export", "all", "--to", sink, "--json", cwd=project, env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"run": run_dir.name, "sink": sink, "state": "completed",
                                          "events": len(events(run_dir))}
    assert len(list((run_dir / "tb").iterdir())) == 1
    assert [(s.step, s.value) for s in _board(run_dir / "tb").Scalars("train/loss")] == pytest.approx(
        _train(run_dir), rel=1e-6)
    _, runs = _mlflow_runs(project)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert len(_offline(run_dir)) == 1


def test_export_refuses_in_one_line(exported, builtin_plugins):
    project, _, env = exported
    unknown = fslab_here("export", "all", "--to", "tensorbored", cwd=project, env=env)
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        "error: Unknown sink 'tensorbored'. Did you mean 'tensorboard'? Allowed: mlflow, tensorboard, wandb."]
    bad = fslab_here("export", "all", "--to", "mlflow", "--set", "trackinguri=x", cwd=project, env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert bad.stderr == ("error: unknown parameter --set trackinguri for sink 'mlflow'. Did you mean 'tracking_uri'? "
                          "Allowed: experiment, tracking_uri.\n")  # named as given, not sinks.mlflow.trackinguri


def test_an_mlflow_server_that_does_not_answer_stops_the_export_at_once(exported):
    # MLflow's client retried a refused connection for minutes (an export seemed to hang), then each run
    # of 'all' did the same; a port nothing listens on now fails at once, in one line, and no run is tried
    import socket

    project, _, env = exported
    with socket.socket() as closed:  # bound, never listening, for the whole export: no test beside it can
        closed.bind(("127.0.0.1", 0))  # take the port and answer there (a connection to it is refused)
        port = closed.getsockname()[1]
        result = fslab("export", "all", "--to", "mlflow", "--set", f"tracking_uri=http://127.0.0.1:{port}",
                       cwd=project, env=env, timeout=60)
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        f"error: sink 'mlflow' failed: no MLflow server answers at http://127.0.0.1:{port} ([Errno 111] "
        f"Connection refused); start it (mlflow server --port ...), or give the sink's tracking_uri"]
    assert "exported" not in result.stdout


def test_an_evaluation_is_tagged_apart_from_the_runs_own_scores_unless_it_is_one_of_them():
    from fslab_plugins.sinks.common import eval_prefix

    config = {"evaluator": {"name": "knn", "k": 3, "ties": "nearest"}}
    test = {"split": "test", "ways": 5, "shots": 1, "queries": 15, "episodes": 100, "step": 56}
    # the run's own evaluator, parameters and all, tests with no label: the tag its summary reads
    assert eval_prefix({**test, "evaluator": "knn[k=3,ties=nearest]"}, config) == "test/5way_1shot"
    assert eval_prefix(test, config) == "test/5way_1shot"  # logged before evaluators were named
    assert eval_prefix({**test, "evaluator": "centroid"}, config) == "test/5way_1shot/centroid"
    # fslab eval afterwards: its own tag with its episodes, never over the training's test or val curve
    later = {**test, "evaluator": "knn[k=3,ties=nearest]", "source": "fslab eval", "episodes": 3, "queries": 1}
    assert eval_prefix(later, config) == "eval/test/5way_1shot/knn[k=3]/1q_3ep"  # ties at its default: left out
    assert eval_prefix({**later, "split": "val", "epoch": 2}, config) == "eval/val/5way_1shot/knn[k=3]/1q_3ep"
    # an older run's spelt-out label and today's short one are the same evaluator: the run's own
    assert eval_prefix({**test, "evaluator": "knn[k=3]"}, config) == "test/5way_1shot"
    assert eval_prefix({**test, "evaluator": "knn[k=3,ties=smallest]"}, config) == \
        "test/5way_1shot/knn[k=3,ties=smallest]"
    assert eval_prefix({**test, "split": "val", "evaluator": "centroid"}, {}) == "val_final/5way_1shot"


def test_a_run_scored_in_map_names_its_final_scores_map_in_tensorboard_and_wandb(tmp_path, monkeypatch):
    """A run tested with retrieval-map: its HPARAMS metric pointed at test/5way_1shot/accuracy, a scalar
    that does not exist (the test scalar is .../map), and W&B's summary held the mAP as .../accuracy."""
    from fslab_plugins.sinks.tensorboard import TensorBoardSink
    from fslab_plugins.sinks.wandb import WandbSink
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.plugins.hparams import plugin_data_pb2

    from fslab.plugin import SinkRun

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "runs" / "20260101-000000-nca-rmap"
    run_dir.mkdir(parents=True)
    label = "retrieval-map[images_per_class=10]"
    config = {"method": "nca", "seed": 0, "loss": {"name": "nca"}, "backbone": {"name": "conv4"},
              "dataset": {"name": "synthetic"}, "eval": {"ways": 5},
              "evaluator": {"name": "retrieval-map", "images_per_class": 10}}
    test = {"event": "eval", "time": 2.0, "split": "test", "ways": 5, "shots": 1, "queries": 9, "episodes": 40,
            "evaluator": label, "metric": "map", "accuracy": 0.4064, "ci95": 0.0123, "step": 7}
    stream = [{"event": "start", "time": 0.0},
              {"event": "train", "time": 1.0, "step": 7, "epoch": 1, "loss": 2.26, "positives": 37, "negatives": 456,
               "lr": 0.0025, "images_per_s": 1872.0},
              {**test, "evaluator": "centroid", "metric": "accuracy", "accuracy": 0.5},  # another evaluator's
              test,
              {"event": "end", "time": 3.0, "results": {"1-shot": {"accuracy": 0.4064, "ci95": 0.0123}}}]
    for sink in (TensorBoardSink(SinkRun(run_dir.name, str(run_dir), config)),
                 WandbSink(SinkRun(run_dir.name, str(run_dir), config))):
        sink.run.state = "completed"
        for event in stream:
            sink.write(event)
        sink.close()
    hparam_metrics = []
    for path in (run_dir / "tb").iterdir():
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "hparams":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    if data.HasField("experiment"):
                        hparam_metrics += [m.name.tag for m in data.experiment.metric_infos]
    assert hparam_metrics == ["test/5way_1shot/map"]
    assert "test/5way_1shot/map" in _board(run_dir / "tb").Tags()["scalars"]

    def key(item) -> str:
        return item.key or "/".join(item.nested_key)

    (folder,) = _offline(run_dir)

    def written() -> dict | None:
        """The summary as the file holds it so far; None while a record is half written."""
        found = {}
        try:
            for record in wandb_records(folder / f"run-{run_dir.name}.wandb"):
                if record.WhichOneof("record_type") == "summary":
                    found.update({key(item): json.loads(item.value_json) for item in record.summary.update})
        except Exception:
            return None
        return found if "test/5way_1shot/map_ci95" in found else None

    # W&B's service process may still be writing the file's last records when finish() returns (once in a
    # CI run on a loaded machine the summary was not there yet): read it again until it is, for a while
    summary = wait_for(written, timeout=120, what="W&B's summary record")
    assert summary["test/5way_1shot/map"] == 0.4064 and summary["test/5way_1shot/map_ci95"] == 0.0123
    assert summary["test/5way_1shot/centroid/accuracy"] == 0.5
    assert "test/5way_1shot/accuracy" not in summary


def _run_seen_from_a_subfolder(tmp_path, monkeypatch, tag):
    """A project with a run folder, and the command's folder a subfolder of it: the project, that
    subfolder, the run's folder and a configuration a sink reads."""
    project, elsewhere = tmp_path / "project", tmp_path / "project" / "sub"
    run_dir = project / "runs" / f"20260101-000000-nca-{tag}"
    run_dir.mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = {"method": "nca", "seed": 0, "eval": {"ways": 5}, "evaluator": {"name": "centroid"}}
    return project, elsewhere, run_dir, config


def test_a_relative_folder_is_taken_from_the_project_not_from_where_the_command_ran(tmp_path, monkeypatch):
    """log_dir = "tb" in fslab.toml: the live run (started in the project) wrote project/tb/<id>, and
    fslab export from a subfolder (FSLAB_CONFIG=../fslab.toml) wrote sub/tb/<id>, a second record."""
    from fslab_plugins.sinks.tensorboard import TensorBoardSink
    from fslab_plugins.sinks.wandb import WandbSink

    from fslab.plugin import SinkRun

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    project, elsewhere, run_dir, config = _run_seen_from_a_subfolder(tmp_path, monkeypatch, "rel0")
    for replay in (False, True):  # the live run, then an export
        run = SinkRun(run_dir.name, str(run_dir), config, replay=replay, state="completed")
        for sink in (TensorBoardSink(run, log_dir="tb"), WandbSink(run, dir="wb")):
            sink.write({"event": "train", "time": 1.0, "step": 3, "epoch": 1, "loss": 2.5})
            sink.close()
    assert [(s.step, s.value) for s in _board(project / "tb" / run_dir.name).Scalars("train/loss")] == [(3, 2.5)]
    assert len(list((project / "wb" / "wandb").glob(f"offline-run-*-{run_dir.name}"))) == 1
    assert not list(elsewhere.iterdir())


def test_a_relative_mlflow_store_is_taken_from_the_project_too(tmp_path, monkeypatch):
    """tracking_uri = "store": the live run wrote project/store, an export from a subfolder sub/store,
    a second MLflow run of the same fslab run in another store, the first never replaced."""
    from fslab_plugins.sinks.mlflow import MLflowSink
    from mlflow.tracking import MlflowClient

    from fslab.plugin import SinkRun

    project, elsewhere, run_dir, config = _run_seen_from_a_subfolder(tmp_path, monkeypatch, "rel1")
    for replay in (False, True):  # the live run, then an export
        sink = MLflowSink(SinkRun(run_dir.name, str(run_dir), config, replay=replay, state="completed"),
                          tracking_uri="store")
        sink.write({"event": "train", "time": 1.0, "step": 3, "epoch": 1, "loss": 2.5})
        sink.close()
    assert not list(elsewhere.iterdir())
    client = MlflowClient(tracking_uri=(project / "store").as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("fslab").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "train/loss")] == [(3, 2.5)]


def test_fslab_eval_s_scores_are_placed_at_the_step_of_the_checkpoint_they_scored(tmp_path, monkeypatch):
    """A run killed at step 5, its checkpoint at step 3, then scored by fslab eval: the scores were placed
    at step 5 (where the log stood), so the resumed run's TensorBoard, purging from step 4 on, hid them,
    and an export after the resume moved them to step 3. W&B, which refuses a step below one it has
    logged, charts them on their own axis, checkpoint_step."""
    from fslab_plugins.sinks.mlflow import MLflowSink
    from fslab_plugins.sinks.tensorboard import TensorBoardSink
    from fslab_plugins.sinks.wandb import WandbSink
    from mlflow.tracking import MlflowClient

    from fslab.plugin import SinkRun

    _offline_trackers(monkeypatch)
    run_dir = tmp_path / "runs" / "20260101-000000-nca-ckst"
    run_dir.mkdir(parents=True)
    config = RUN_CONFIG
    stream = [{"event": "start", "time": 0.0}]
    stream += [{"event": "train", "time": float(s), "step": s, "epoch": 1 + (s > 3), "loss": 3.0 - s / 10}
               for s in (1, 2, 3)]
    stream += [{"event": "checkpoint", "time": 3.5, "epoch": 1, "step": 3, "path": "checkpoints/last.pt"}]
    stream += [{"event": "train", "time": float(s), "step": s, "epoch": 2, "loss": 3.0 - s / 10} for s in (4, 5)]
    stream += [{"event": "eval", "time": 9.0, "source": "fslab eval", "split": "test", "ways": 5, "shots": 1,
                "queries": 5, "episodes": 30, "evaluator": "centroid", "metric": "accuracy", "seed": 0,
                "stream": 2, "epoch": 1, "accuracy": 0.41, "ci95": 0.04}]
    run = SinkRun(run_dir.name, str(run_dir), config, replay=True, state="killed")
    for sink in (TensorBoardSink(run), MLflowSink(run), WandbSink(run)):
        for event in stream:
            sink.write(event)
        sink.close()
    tag = "eval/test/5way_1shot/centroid/5q_30ep/accuracy"
    assert [(s.step, s.value) for s in _board(run_dir / "tb").Scalars(tag)] == [(3, pytest.approx(0.41))]
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("fslab").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, tag)] == [(3, 0.41)]
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "train/loss")] == [
        (s, pytest.approx(3.0 - s / 10)) for s in (1, 2, 3, 4, 5)]

    (folder,) = _offline(run_dir)

    def written() -> list | None:
        """The rows holding the score, with their step and checkpoint_step; None until the file holds them."""
        if (rows := _wandb_history(folder, run_dir.name)) is None:
            return None
        found = [(row["_step"], row.get("checkpoint_step"), row[tag]) for row in rows if tag in row]
        return found or None

    assert wait_for(written, timeout=120, what="W&B's history record") == [(5, 3, 0.41)]


def _shown(folder):
    """The record as TensorBoard's own reader keeps it: it purges text too, and takes the first session
    start it reads as the record's beginning, purging only from the next one."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    board = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    board.Reload()
    return board


def _points(board, tag) -> list[tuple[int, float]]:
    from tensorboard.util.tensor_util import make_ndarray

    return [(t.step, pytest.approx(float(make_ndarray(t.tensor_proto)))) for t in board.Tensors(tag)]


@pytest.fixture
def fresh_writer_numbers(monkeypatch):
    """Event files numbered from 0 in this process, as in each worker's: TensorBoard reads a folder's
    files in the order of their names (time in seconds, host, pid, then that number), and this process's
    tenth file, made in the same second as its ninth, would be read before it."""
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(0))


def test_a_resumed_run_s_tensorboard_holds_each_step_s_numbers_once(tmp_path, fresh_writer_numbers):
    """A run killed mid-epoch, resumed, then stopped during its final test (after its last checkpoint) and
    resumed again: the cut-short test's 1-shot scores were logged at the checkpoint's own step, which the
    resume's purge (from the next step on) kept, so TensorBoard held the 1-shot test twice at that step."""
    from fslab_plugins.sinks.tensorboard import TensorBoardSink

    from fslab.plugin import SinkRun

    run_dir = tmp_path / "runs" / "20260101-000000-nca-rsme"
    run_dir.mkdir(parents=True)
    config = {"method": "nca", "seed": 0, "eval": {"ways": 5}, "evaluator": {"name": "centroid"}}

    def train(s, epoch):
        return {"event": "train", "time": float(s), "step": s, "epoch": epoch, "loss": 3.0 - s / 10}

    def evaluation(split, shots, accuracy, **at):
        return {"event": "eval", "time": 0.0, "split": split, "ways": 5, "shots": shots, "queries": 5,
                "episodes": 20, "evaluator": "centroid", "metric": "accuracy", "accuracy": accuracy, "ci95": 0.01,
                **at}

    def checkpoint(s, epoch):
        return {"event": "checkpoint", "time": 0.0, "epoch": epoch, "step": s, "path": "checkpoints/last.pt"}

    start = {"event": "start", "time": 0.0}
    epoch1 = [start, train(1, 1), train(2, 1), evaluation("val", 5, 0.3, epoch=1, step=2), checkpoint(2, 1)]
    epoch2 = [train(3, 2), train(4, 2), evaluation("val", 5, 0.4, epoch=2, step=4), checkpoint(4, 2)]
    logged: list[dict] = []

    def attempt(stream, resume_at=None):
        """The worker's file (cut back to the checkpoint, then the resume), and the sink fed as it logs."""
        if resume_at is not None:
            stream = [start, {"event": "resume", "time": 0.0, "epoch": 1, "step": resume_at}, *stream]
        _fed(TensorBoardSink(SinkRun(run_dir.name, str(run_dir), config, state="killed")), stream, logged)

    attempt([*epoch1, train(3, 2), train(4, 2)])  # killed mid-epoch 2
    del logged[len(epoch1):]
    attempt([*epoch2, evaluation("test", 1, 0.5)], resume_at=2)  # stopped during its test
    del logged[len(epoch1) + 2 + len(epoch2):]
    attempt([evaluation("test", 1, 0.6), evaluation("test", 5, 0.7), {"event": "end", "time": 0.0, "results": {}}],
            resume_at=4)
    board = _shown(run_dir / "tb")
    assert _points(board, "train/loss") == [(s, 3.0 - s / 10) for s in (1, 2, 3, 4)]
    assert _points(board, "val/5way_5shot/accuracy") == [(2, 0.3), (4, 0.4)]
    assert _points(board, "test/5way_1shot/accuracy") == [(4, 0.6)]
    assert _points(board, "test/5way_5shot/accuracy") == [(4, 0.7)]


def test_a_run_started_again_keeps_one_tensorboard_record_and_one_config_text(tmp_path, fresh_writer_numbers):
    """A run queued again after it ended before its first checkpoint starts from step 0 (its metrics.jsonl
    emptied): TensorBoard kept the earlier start's steps beside the new ones, each twice; and every start,
    a resume's too (and an export replaying it), wrote the configuration's text at step 0 again."""
    from fslab_plugins.sinks.tensorboard import TensorBoardSink

    from fslab.plugin import SinkRun

    run_dir = tmp_path / "runs" / "20260101-000000-nca-agan"
    run_dir.mkdir(parents=True)
    config = {"method": "nca", "seed": 0, "eval": {"ways": 5}, "evaluator": {"name": "centroid"}}

    def train(s, loss):
        return {"event": "train", "time": float(s), "step": s, "epoch": 1, "loss": loss}

    start = {"event": "start", "time": 0.0}
    checkpoint = {"event": "checkpoint", "time": 0.0, "epoch": 1, "step": 2, "path": "checkpoints/last.pt"}
    logged: list[dict] = []

    def attempt(stream):
        _fed(TensorBoardSink(SinkRun(run_dir.name, str(run_dir), config, state="killed")), stream, logged)

    attempt([start, train(1, 9.0), train(2, 8.0), train(3, 7.0)])  # ended before its first checkpoint
    logged.clear()  # start_afresh
    attempt([start, train(1, 3.0), train(2, 2.0), checkpoint, train(3, 1.5)])
    del logged[4:]  # cut back to the checkpoint
    attempt([start, {"event": "resume", "time": 0.0, "epoch": 1, "step": 2}, train(3, 1.0)])
    for export in (False, True, True):  # the live record, then fslab export, twice: it replays both starts
        if export:
            sink = TensorBoardSink(SinkRun(run_dir.name, str(run_dir), config, replay=True, state="completed"))
            for event in logged:
                sink.write(event)
            sink.close()
        board = _shown(run_dir / "tb")
        assert _points(board, "train/loss") == [(1, 3.0), (2, 2.0), (3, 1.0)]
        assert [t.step for t in board.Tensors("config/text_summary")] == [0]


def test_a_resumed_run_s_offline_wandb_record_is_one_holding_each_step_once(tmp_path, monkeypatch):
    """A run killed mid-epoch, then resumed: W&B's offline sink started a second record of the same id, so
    `wandb sync` sent the steps after the checkpoint twice, and W&B (which ignores a step below one it has
    logged) kept the killed run's values. Now the resumed record replaces the first, holding the whole run."""
    from fslab_plugins.sinks.wandb import WandbSink

    from fslab.plugin import SinkRun

    _offline_trackers(monkeypatch)
    run_dir = tmp_path / "runs" / "20260101-000000-nca-wbrs"
    run_dir.mkdir(parents=True)
    config = RUN_CONFIG

    def train(s, loss):
        return {"event": "train", "time": float(s), "step": s, "epoch": 1 + (s > 2), "loss": loss}

    start = {"event": "start", "time": 0.0}
    checkpoint = {"event": "checkpoint", "time": 0.0, "epoch": 1, "step": 2, "path": "checkpoints/last.pt"}
    logged: list[dict] = []

    def attempt(stream, state):
        sink = WandbSink(SinkRun(run_dir.name, str(run_dir), config, state=state))
        for event in stream:
            logged.append(event)
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in logged))
            sink.write(event)
        sink.close()

    attempt([start, train(1, 3.0), train(2, 2.0), checkpoint, train(3, 9.0), train(4, 8.0)], "killed")
    del logged[4:]
    attempt([start, {"event": "resume", "time": 0.0, "epoch": 1, "step": 2}, train(3, 1.5), train(4, 1.0),
             {"event": "end", "time": 0.0, "results": {}}], "completed")
    # W&B names a record made in the same second as an earlier one of the id ...-<id>-1
    (folder,) = (run_dir / "wandb").glob("offline-run-*")

    def losses() -> list | None:
        if (rows := _wandb_history(folder, run_dir.name)) is None:
            return None
        found = [(row["_step"], row["train/loss"]) for row in rows if "train/loss" in row]
        return found if len(found) >= 4 else None

    assert wait_for(losses, timeout=120, what="W&B's history records") == [(1, 3.0), (2, 2.0), (3, 1.5), (4, 1.0)]


def test_a_resumed_run_s_mlflow_metric_shows_the_resumed_value_as_its_latest(tmp_path, monkeypatch):
    """MLflow cannot drop a value once logged (README, Sinks): a test cut short after the last checkpoint,
    then resumed, holds its 1-shot score twice at the checkpoint's step, and the resumed run's, stamped
    later, is the one MLflow shows."""
    from fslab_plugins.sinks.mlflow import MLflowSink
    from mlflow.tracking import MlflowClient

    from fslab.plugin import SinkRun

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run_dir = tmp_path / "runs" / "20260101-000000-nca-mlrs"
    run_dir.mkdir(parents=True)
    config = {"method": "nca", "seed": 0, "eval": {"ways": 5}, "evaluator": {"name": "centroid"}}

    def test(accuracy, time):
        return {"event": "eval", "time": time, "split": "test", "ways": 5, "shots": 1, "queries": 5,
                "episodes": 20, "evaluator": "centroid", "metric": "accuracy", "accuracy": accuracy, "ci95": 0.01}

    checkpoint = {"event": "checkpoint", "time": 2.0, "epoch": 1, "step": 2, "path": "checkpoints/last.pt"}
    first = [{"event": "start", "time": 0.0}, {"event": "train", "time": 1.0, "step": 2, "epoch": 1, "loss": 2.0},
             checkpoint, test(0.5, 3.0)]
    resumed = [{"event": "start", "time": 4.0}, {"event": "resume", "time": 4.0, "epoch": 1, "step": 2},
               test(0.6, 5.0), {"event": "end", "time": 6.0, "results": {}}]
    for stream, state in ((first, "killed"), (resumed, "completed")):
        sink = MLflowSink(SinkRun(run_dir.name, str(run_dir), config, state=state))
        for event in stream:
            sink.write(event)
        sink.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("fslab").experiment_id])
    tag = "test/5way_1shot/accuracy"
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, tag)] == [(2, 0.5), (2, 0.6)]
    assert found.data.metrics[tag] == 0.6


def test_an_export_replaces_the_offline_record_w_and_b_named_id_dash_1_too(tmp_path, monkeypatch):
    """W&B names a record made in the same second as another of the id `offline-run-STAMP-<id>-1`: the live
    resume's clean-up found it, but an export, setting the earlier records aside, did not, so `wandb sync`
    sent the run twice. One finder (offline_records) now serves both: the export replaces every record of
    the run, and one that fails puts them all back; another run's record is never touched."""
    from fslab_plugins.sinks.wandb import WandbSink, offline_records

    from fslab.plugin import SinkRun

    _offline_trackers(monkeypatch)
    run_dir = tmp_path / "runs" / "20260101-000000-nca-wbd1"
    records = run_dir / "wandb"
    earlier = [records / f"offline-run-20260101_000000-{run_dir.name}{tail}" for tail in ("", "-1")]
    other = records / f"offline-run-20260101_000000-{run_dir.name}-x"  # no record of this run's
    for folder in (*earlier, other):
        folder.mkdir(parents=True)
        (folder / "mark").write_text("earlier")
    assert offline_records(records, run_dir.name) == earlier
    for cut_short in (True, False):  # an export that failed midway, then one that completed
        run = SinkRun(run_dir.name, str(run_dir), RUN_CONFIG, replay=True, state="completed", cut_short=cut_short)
        sink = WandbSink(run)
        assert offline_records(records, run_dir.name, aside=True) == sorted(
            records / f".{path.name}.old" for path in earlier)
        sink.write({"event": "train", "time": 1.0, "step": 3, "epoch": 1, "loss": 2.5})
        sink.close()
        found = offline_records(records, run_dir.name)
        if cut_short:
            assert found == earlier and all((path / "mark").is_file() for path in earlier)
    assert len(found) == 1 and found[0] not in earlier and not (found[0] / "mark").exists()
    assert sorted(p.name for p in records.glob("*offline-run-*")) == sorted([found[0].name, other.name])


def test_an_export_cut_short_points_w_and_b_s_links_at_the_earlier_record_again(tmp_path, monkeypatch):
    """W&B links latest-run, debug.log and debug-internal.log in its folder to the record it starts: an export
    cut short removed its record and put the earlier one back, but left the links dangling at the removed one."""
    from fslab_plugins.sinks.wandb import LINKS, WandbSink

    from fslab.plugin import SinkRun

    _offline_trackers(monkeypatch)
    run_dir = tmp_path / "runs" / "20260101-000000-nca-wbln"
    records = run_dir / "wandb"
    earlier = records / f"offline-run-20260101_000000-{run_dir.name}"  # a second no export starts in
    (earlier / "logs").mkdir(parents=True)
    made = {"latest-run": earlier.name, "debug.log": f"{earlier.name}/logs/debug.log",
            "debug-internal.log": f"{earlier.name}/logs/debug-internal.log"}
    for name, target in made.items():
        (records / target).touch()
        os.symlink(target, records / name)
    for links in (made, {}):  # the earlier record's links, then none (W&B had made none)
        for name in LINKS:
            if name not in links:
                (records / name).unlink(missing_ok=True)
        run = SinkRun(run_dir.name, str(run_dir), RUN_CONFIG, replay=True, state="completed")
        sink = WandbSink(run)
        assert os.readlink(records / "latest-run") != earlier.name  # W&B's links point at the new record
        sink.write({"event": "train", "time": 1.0, "step": 3, "epoch": 1, "loss": 2.5})
        run.cut_short = True
        sink.close()
        assert {name: os.readlink(records / name) for name in LINKS if (records / name).is_symlink()} == links
        assert all((records / name).exists() for name in links)
        assert sorted(p.name for p in records.glob("*offline-run-*")) == [earlier.name]


def test_what_a_sink_replays_before_a_resume_is_read_as_fslab_reads_the_log(tmp_path):
    """logged_before (what the TensorBoard and W&B sinks replay after a resume) parsed metrics.jsonl with a
    reader of its own: a last line still being written that happened to be JSON was replayed, a line that was
    JSON but no object (`[1]`, a damaged copy) stopped the sink with an AttributeError, and an event without
    the fields of its kind went to the tracker. It now reads through run_events, the one reader the export,
    the summaries and fslab show use, so a sink replays exactly the events the export does."""
    from fslab_plugins.sinks.common import logged_before

    from fslab.core.runstore import Run
    from fslab.plugin import run_events

    def line(event) -> str:
        return json.dumps(event) + "\n"

    start = {"event": "start", "time": 0.0, "epochs": 2}
    trains = [{"event": "train", "time": 1.0, "step": s, "epoch": 1, "loss": 2.0 / s} for s in (1, 2)]
    checkpoint = {"event": "checkpoint", "time": 2.0, "epoch": 1, "step": 2}
    resume = {"event": "resume", "time": 3.0, "epoch": 1, "step": 2}
    torn = line({"event": "train", "time": 4.0, "step": 3, "epoch": 2, "loss": 0.5}).rstrip("\n")  # being written
    (tmp_path / "metrics.jsonl").write_text(
        line(start) + line(trains[0]) + "[1]\n" + '{"event": "train", "step": 9}\n' + "{not json\n"
        + line(trains[1]) + line(checkpoint) + line(resume) + torn)
    assert run_events(tmp_path) == Run(tmp_path).events() == [start, *trains, checkpoint, resume]
    assert logged_before(tmp_path, "resume") == [start, *trains, checkpoint]
    assert logged_before(tmp_path, "start") == []  # no earlier start: nothing before the first
    with open(tmp_path / "metrics.jsonl", "a") as file:  # the torn line whole, and a second resume's cut
        file.write("\n" + line({**resume, "time": 5.0}))
    assert logged_before(tmp_path, "resume") == [start, *trains, checkpoint, resume, {**json.loads(torn)}]
    assert run_events(tmp_path / "nothing") == []
