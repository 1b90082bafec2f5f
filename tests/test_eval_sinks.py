"""``fslab eval`` and a run's sinks, with the real TensorBoard and MLflow packages, no mocks: the new
scores are added to each sink's record of the run (a new TensorBoard event file, the same MLflow run),
and that record then holds what an export of the whole run would give; a sink whose record lacks part
of the run gets the whole run instead, and one that fails to take the scores is recorded as lacking them."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, fslab, fslab_here

pytestmark = pytest.mark.slow

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")

EVAL = ("--shots", "1", "--episodes", "20")


def _board(folder) -> dict:
    """Every scalar of a TensorBoard record, as TensorBoard reads the folder: {tag: [(step, value)]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    board.Reload()
    return {tag: [(s.step, s.value) for s in board.Scalars(tag)] for tag in board.Tags()["scalars"]}


def _mlflow(project) -> tuple[str, dict]:
    """The one MLflow run of the file store: its id, and what it holds (metric histories with their
    steps, values and times, parameters, fslab's tags, status, artifacts)."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(project / "mlruns").as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("fslab").experiment_id])
    run_id = found.info.run_id
    metrics = {key: sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))
               for key in found.data.metrics}
    tags = {k: v for k, v in found.data.tags.items() if k.startswith("fslab.")}
    return run_id, {"metrics": metrics, "params": found.data.params, "tags": tags, "status": found.info.status,
                    "artifacts": sorted(a.path for a in client.list_artifacts(run_id))}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A project holding one run sent to TensorBoard and MLflow as it trained, trained once for the module's
    tests (each copies it: ~3 s a test before), in the environment the ``project`` fixture gives."""
    folder = tmp_path_factory.mktemp("sent") / "project"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("FSLAB_STRICT_PLUGINS", "FSLAB_CONFIG")}
    done = fslab("run", "nca", *TINY, "--epochs", "1", "--sink", "tensorboard", "--sink", "mlflow", cwd=folder,
                 env={**env, "FSLAB_PLUGINS": BUILTIN_PLUGINS})
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


@pytest.fixture
def sent(project, trained):
    """A run sent to TensorBoard and MLflow as it trained: the module's one, copied into this test's project
    (times kept), with the absolute paths MLflow's file store writes (its meta.yaml files) made this project's,
    as a run trained here would have them."""
    shutil.copytree(trained, project, dirs_exist_ok=True)
    for meta in (project / "mlruns").rglob("meta.yaml"):
        meta.write_text(meta.read_text().replace(str(trained), str(project)))
    (run_dir,) = (project / "runs").glob("2*")
    assert not (run_dir / "sink_failures.json").exists()
    return run_dir


def test_eval_adds_its_scores_to_each_record_which_then_holds_what_a_whole_export_gives(project, sent):
    run_dir = sent
    live_files = {p.name for p in (run_dir / "tb").iterdir()}
    live_mlflow, _ = _mlflow(project)
    done = fslab_here("eval", run_dir.name, *EVAL, cwd=project)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"{run_dir.name}: the new scores added to {sink}'s record of the run (1 event)"
                                        for sink in ("mlflow", "tensorboard")]  # as the run's sinks
    files = {p.name for p in (run_dir / "tb").iterdir()}
    assert live_files < files and len(files - live_files) == 1  # the live record kept, one event file added
    assert not list(run_dir.glob(".tb*"))
    added_to, held = _mlflow(project)
    assert added_to == live_mlflow  # the same MLflow run, not a new one
    board = _board(run_dir / "tb")
    tag = "eval/test/5way_1shot/centroid/5q_20ep/accuracy"
    (scored,) = [e for e in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
                 if e.get("source")]
    assert [v for _, v in board[tag]] == pytest.approx([scored["accuracy"]])
    assert [v for _, v, _ in held["metrics"][tag]] == [scored["accuracy"]]

    for sink in ("tensorboard", "mlflow"):  # the whole run exported anew: the records read the same
        again = fslab_here("export", run_dir.name, "--to", sink, cwd=project)
        assert again.returncode == 0, again.stderr
    assert _board(run_dir / "tb") == board
    exported, whole = _mlflow(project)
    assert exported != live_mlflow and whole == held


def test_the_added_event_file_is_read_after_the_record_s_own(project, sent):
    """TensorBoard reads a folder's event files in the order of their names (the second each was made
    in, then host and pid), and the record's first file opens with a session start, which hides every
    step of a file read before it: an added file that would sort first (a clock set back, or the same
    second and a lower pid) is named to come last."""
    run_dir = sent
    for path in (run_dir / "tb").iterdir():  # made in a later second than the one fslab eval writes in
        head, stamp, rest = path.name.split(".", 4)[:3], path.name.split(".", 4)[3], path.name.split(".", 4)[4]
        path.rename(path.with_name(".".join([*head, str(int(stamp) + 3600), rest])))
    done = fslab_here("eval", run_dir.name, *EVAL, cwd=project)
    assert done.returncode == 0, done.stderr
    assert [v for _, v in _board(run_dir / "tb")["eval/test/5way_1shot/centroid/5q_20ep/accuracy"]] == [
        pytest.approx(e["accuracy"]) for e in (json.loads(line) for line in (run_dir / "metrics.jsonl").open())
        if e.get("source")]


def test_eval_sends_the_whole_run_to_a_sink_whose_record_lacks_part_of_it(project, sent):
    """A sink recorded as failed as the run trained gets the whole run (which catches it up); one that
    cannot take the new scores is recorded as lacking them, and the next fslab eval sends it the whole
    run; scores of the network in another precision than the run's are sent to none."""
    from fslab.core.sinks import failures, record_failure

    run_dir = sent
    record_failure(run_dir, "tensorboard", {"failed": "to keep up", "error": "missed 3 events", "time": 1.0})
    done = fslab_here("eval", run_dir.name, *EVAL, cwd=project)
    assert done.returncode == 0, done.stderr
    logged = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert done.stderr.splitlines() == [
        f"{run_dir.name}: the new scores added to mlflow's record of the run (1 event)",
        f"{run_dir.name}: sent again to tensorboard with the new scores ({logged} events)"]
    assert failures(run_dir) == {}

    config = json.loads((run_dir / "config.json").read_text())
    config["sinks"]["mlflow"] = {"tracking_uri": str(project / "runs" / run_dir.name / "config.json")}  # not a store
    (run_dir / "config.json").write_text(json.dumps(config))
    refused = fslab_here("eval", run_dir.name, *EVAL, cwd=project)
    assert refused.returncode == 0, refused.stderr
    assert refused.stderr.splitlines()[0].startswith(f"warning: {run_dir.name}: sink 'mlflow'")
    assert refused.stderr.splitlines()[1:] == [
        f"{run_dir.name}: the new scores added to tensorboard's record of the run (1 event)"]
    assert set(failures(run_dir)) == {"mlflow"}
    assert failures(run_dir)["mlflow"]["failed"] == "to take fslab eval's scores"
    assert failures(run_dir)["mlflow"]["error"].startswith("NotADirectoryError: ")  # the sink's own error
    shown = fslab_here("show", run_dir.name, cwd=project).stdout
    assert "sink 'mlflow' failed to take fslab eval's scores" in shown and "it lacks those scores" in shown

    config["sinks"]["mlflow"] = {}
    (run_dir / "config.json").write_text(json.dumps(config))
    other = fslab_here("eval", run_dir.name, *EVAL, "--precision", "bf16", cwd=project)
    assert other.returncode == 0, other.stderr
    logged = sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line).get("run_precision") is None)
    assert other.stderr.splitlines() == [
        f"{run_dir.name}: sent again to mlflow with the new scores ({logged} events)",
        f"{run_dir.name}: nothing sent to tensorboard: the new scores, of the network in another precision than "
        f"the run's, stay in its folder"]
    assert failures(run_dir) == {}


def test_an_addition_cut_short_leaves_each_record_as_it_was(project, sent, registry):
    """A Ctrl-C between two of the new events: TensorBoard's event file half written is removed, and
    MLflow, which sends the events together at the end, is sent none."""
    from fslab.core.sinks import add
    from fslab.core.types import SinkRun

    run_dir = sent
    config = json.loads((run_dir / "config.json").read_text())
    board, (mlflow_run, held) = _board(run_dir / "tb"), _mlflow(project)
    scored = {"event": "eval", "time": 9.0, "source": "fslab eval", "split": "test", "ways": 5, "shots": 1,
              "queries": 5, "episodes": 20, "evaluator": "centroid", "metric": "accuracy", "seed": 0, "stream": 2,
              "epoch": 1, "accuracy": 0.41, "ci95": 0.04}

    def cut_short():
        yield scored
        raise KeyboardInterrupt

    for name in ("tensorboard", "mlflow"):
        run = SinkRun(run_dir.name, run_dir, config, replay=True, state="completed")
        with pytest.raises(KeyboardInterrupt):
            add(registry, name, run, config["sinks"][name], cut_short())
        assert run.cut_short
    assert _board(run_dir / "tb") == board and _mlflow(project) == (mlflow_run, held)
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".tb")) == []


@pytest.mark.parametrize("when", ["just after fslab eval appended its scores", "having read the log just before"])
def test_an_export_beside_fslab_eval_leaves_the_record_a_whole_export_gives(project, sent, registry, monkeypatch,
                                                                           when):
    """fslab export RUN --to tensorboard started while fslab eval appends its scores to metrics.jsonl and
    adds them to the sink's record: whichever goes first, the record ends as one whole export leaves it,
    the scores in it once (not twice: exported whole, then added again; nor lost: a log read before the
    scores were appended, exported after they were added). Events force each order, no sleeps."""
    import threading

    from fslab.core import eventlog, flocks
    from fslab.core.runstore import Run
    from fslab.execution.export import export_run

    run_dir = sent
    settled, go, exporter = threading.Event(), threading.Event(), []  # the export read the log, waits, or is done
    real_write, real_wait, real_events = eventlog.EventLog.write, flocks._wait_for, Run.events

    def exporting():
        try:
            export_run(registry, Run(run_dir), "tensorboard", [{}, {}])
        finally:
            settled.set()

    def in_exporter(real):
        def hooked(*args):
            if threading.current_thread() in exporter:
                settled.set()  # it waits for the lock: fslab eval goes on meanwhile
            return real(*args)
        return hooked

    def reading(self):
        found = real_events(self)
        if threading.current_thread() in exporter:
            settled.set()
            go.wait(60)  # exports what it read once fslab eval is done
        return found

    def write(self, event, **fields):
        if fields.get("source") != "fslab eval" or exporter:
            return real_write(self, event, **fields)
        exporter.append(threading.Thread(target=exporting))
        if when.startswith("just after"):
            go.set()
            written = real_write(self, event, **fields)
            exporter[0].start()
            assert settled.wait(60)
            return written
        exporter[0].start()
        assert settled.wait(60)
        return real_write(self, event, **fields)

    monkeypatch.setattr(eventlog.EventLog, "write", write)
    monkeypatch.setattr(flocks, "_wait_for", in_exporter(real_wait))
    monkeypatch.setattr(Run, "events", reading)
    done = fslab_here("eval", run_dir.name, *EVAL, cwd=project)
    go.set()
    exporter[0].join(60)
    assert done.returncode == 0, done.stderr
    assert not exporter[0].is_alive()
    board = _board(run_dir / "tb")
    (scored,) = [e["accuracy"] for e in (json.loads(line) for line in (run_dir / "metrics.jsonl").open())
                 if e.get("source")]
    assert [v for _, v in board["eval/test/5way_1shot/centroid/5q_20ep/accuracy"]] == [pytest.approx(scored)]
    again = fslab_here("export", run_dir.name, "--to", "tensorboard", cwd=project)
    assert again.returncode == 0, again.stderr
    assert _board(run_dir / "tb") == board
