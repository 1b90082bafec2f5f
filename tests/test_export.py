"""``fslab export`` (fslab.execution.export) and the built-in sinks' handling of
a resumed run, with the real TensorBoard and MLflow packages, no mocks: which
runs a reference selects, which are left out and why (one line each), where
the sink's parameters come from, and what the command prints."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from fslab.core.sinks import failures

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, events, fslab, fslab_here

pytestmark = pytest.mark.slow

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")


def _board(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    board.Reload()
    return board


def _copy(runs, source, run_id, **status):
    """A copy of ``source`` as run ``run_id``, its status.json changed by ``status``."""
    shutil.copytree(runs / source, runs / run_id)
    saved = json.loads((runs / run_id / "status.json").read_text())
    (runs / run_id / "status.json").write_text(json.dumps({**saved, **status}))
    return runs / run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One real finished run, a copy of it in a sweep, a queued one, one whose
    config.json is damaged and one that never logged an event."""
    project = tmp_path_factory.mktemp("export")
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS, "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    env.pop("FSLAB_CONFIG", None)
    result = fslab("run", "nca", *TINY, "--epochs", "1", cwd=project, env=env)
    assert result.returncode == 0, result.stderr
    runs = project / "runs"
    (real,) = runs.iterdir()
    _copy(runs, real.name, "20200101-000000-nca-swep", sweep="sweep-20200101-000000")
    (runs / "sweeps").mkdir()
    (runs / "sweeps" / "sweep-20200101-000000.json").write_text(
        json.dumps({"id": "sweep-20200101-000000", "runs": ["20200101-000000-nca-swep"]}))
    _copy(runs, real.name, "20200101-000001-nca-wait", state="queued", started=None, ended=None, pid=None)
    (_copy(runs, real.name, "20200101-000002-nca-dmgd") / "config.json").write_text("{not json")
    (_copy(runs, real.name, "20200101-000003-nca-none") / "metrics.jsonl").write_text("")
    return project, real, env


def test_all_exports_the_finished_runs_and_says_why_the_others_are_left_out(store):
    project, real, env = store
    out = fslab_here("export", "all", "--to", "tensorboard", cwd=project, env=env)
    assert out.returncode == 0, out.stderr
    count = len(events(real))
    assert sorted(out.stdout.splitlines()[:-1]) == sorted([
        f"{real.name} (completed): {count} events -> tensorboard",
        f"20200101-000000-nca-swep (completed): {count} events -> tensorboard"])
    assert out.stdout.splitlines()[-1] == "exported 2 runs to tensorboard; 3 left out"
    assert sorted(out.stderr.splitlines()) == [
        "20200101-000001-nca-wait is queued: export it once it has ended",
        "20200101-000002-nca-dmgd: config.json is missing or unreadable; nothing to export",
        "20200101-000003-nca-none (completed) logged no event; nothing to export"]
    runs = project / "runs"
    assert not any((runs / name / "tb").exists() for name in ("20200101-000001-nca-wait", "20200101-000002-nca-dmgd",
                                                              "20200101-000003-nca-none"))
    assert [s.step for s in _board(real / "tb").Scalars("train/loss")] == [e["step"] for e in events(real, "train")]


def test_a_run_of_one_event_is_counted_in_the_singular(store):
    project, real, env = store
    one = _copy(project / "runs", real.name, "20200101-000008-nca-once")
    shutil.rmtree(one / "tb", ignore_errors=True)  # an earlier test's export
    first = (one / "metrics.jsonl").read_text().splitlines(keepends=True)[0]
    (one / "metrics.jsonl").write_text(first)
    try:
        out = fslab_here("export", one.name, "--to", "tensorboard", cwd=project, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [f"{one.name} (completed): 1 event -> tensorboard",
                                           "exported 1 run to tensorboard"]
    finally:
        shutil.rmtree(one)


def test_a_sweep_exports_its_runs_with_the_sweep_as_tag(store):
    project, _, env = store
    uri = (project / "sweep-mlruns").as_uri()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses file stores without it
    out = fslab_here("export", "sweep-2020", "--to", "mlflow", "--set", f"tracking_uri={uri}", "--json",
                cwd=project, env=env)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["run"] for line in out.stdout.splitlines()] == ["20200101-000000-nca-swep"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fslab").experiment_id])
    assert run.data.tags["fslab.sweep"] == "sweep-20200101-000000"
    assert run.data.tags["fslab.run_id"] == run.info.run_name == "20200101-000000-nca-swep"


def test_parameters_come_from_the_run_then_fslab_toml_then_set(store, tmp_path):
    project, real, env = store
    config = json.loads((real / "config.json").read_text())
    own = _copy(project / "runs", real.name, "20200101-000009-nca-sink")
    shutil.rmtree(own / "tb", ignore_errors=True)  # an earlier test's export
    (own / "config.json").write_text(json.dumps({**config, "sinks": {"tensorboard": {"log_dir": str(tmp_path / "a")}}}))
    try:
        assert fslab_here("export", own.name, "--to", "tensorboard", cwd=project, env=env).returncode == 0
        assert (tmp_path / "a" / own.name).is_dir() and not (own / "tb").exists()
        (project / "fslab.toml").write_text(f"[run.sinks.tensorboard]\nlog_dir = '{tmp_path / 'b'}'\n")
        assert fslab_here("export", own.name, "--to", "tensorboard", cwd=project, env=env).returncode == 0
        assert (tmp_path / "b" / own.name).is_dir()
        out = fslab_here("export", own.name, "--to", "tensorboard", "--set", f"log_dir={tmp_path / 'c'}",
                    cwd=project, env=env)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "c" / own.name).is_dir()
    finally:
        (project / "fslab.toml").unlink(missing_ok=True)
        shutil.rmtree(own)


@pytest.mark.parametrize(("argv", "expected"), [
    (["nosuchrun", "--to", "tensorboard"], "error: no run 'nosuchrun' in runs. List them with: fslab runs"),
    (["sweep-nope", "--to", "tensorboard"], "error: 'sweep-nope' matches no sweep. Sweeps: sweep-20200101-000000"),
    (["all", "--to", "tensorbored"],
     "error: Unknown sink 'tensorbored'. Did you mean 'tensorboard'? Allowed: mlflow, tensorboard, wandb."),
    (["all", "--to", "wandb", "--set", "mode=onlin"],  # named sinks.wandb.mode, which --set was not given
     "error: --set mode must be one of offline, online, got \"onlin\". Did you mean 'online'?"),
    (["all", "--to", "tensorboard", "--set", "bogus=1"],
     "error: unknown parameter --set bogus for sink 'tensorboard'. Allowed: log_dir."),
    (["all", "--to", "tensorboard", "--set", "sinks.tensorboard.bogus=1"],
     "error: unknown parameter --set sinks.tensorboard.bogus for sink 'tensorboard'. Allowed: log_dir."),
    (["all", "--to", "tensorboard", "--set", "log_dir"],  # not --set's example for a run, train.lr=0.05
     "error: --set takes KEY=VALUE for a parameter of sink 'tensorboard' (log_dir), got 'log_dir'"),
    (["all", "--to", "mlflow", "--set", "train.lr=0.05"],
     "error: --set takes KEY=VALUE for a parameter of sink 'mlflow' (experiment, tracking_uri), got 'train.lr=0.05'"),
])
def test_a_wrong_command_is_one_line_and_exports_nothing(store, argv, expected):
    project, real, env = store
    before = sorted(p.name for p in (project / "runs").iterdir())
    out = fslab_here("export", *argv, cwd=project, env=env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    if expected:
        assert out.stderr.strip() == expected
    assert sorted(p.name for p in (project / "runs").iterdir()) == before


def test_a_resumed_run_hides_in_tensorboard_what_it_logged_after_its_checkpoint(tmp_path):
    """A live sink of a resumed run: the events after the checkpoint come again
    (after the ``resume`` event); TensorBoard shows the second ones only."""
    from fslab_plugins.sinks.tensorboard import TensorBoardSink

    from fslab.plugin import SinkRun

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    config = {"method": "nca", "eval": {"ways": 5}, "evaluator": {"name": "centroid"}}
    first = TensorBoardSink(SinkRun("r1", str(run_dir), config))
    first.write({"event": "start", "time": 0})
    for step in range(1, 7):  # killed during step 6; the checkpoint was at step 3
        first.write({"event": "train", "time": step, "step": step, "epoch": 1 + (step > 3), "loss": 10.0 + step})
    first.close()
    # the resumed worker cut metrics.jsonl back to the checkpoint and logged its resume, which the sink reads
    kept = [{"event": "start", "time": 0}, *({"event": "train", "time": step, "step": step, "epoch": 1,
                                               "loss": 10.0 + step} for step in range(1, 4)),
            {"event": "resume", "time": 7, "epoch": 1, "step": 3}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    second = TensorBoardSink(SinkRun("r1", str(run_dir), config))  # the resumed worker's
    second.write(kept[-1])
    for step in range(4, 9):
        second.write({"event": "train", "time": 7 + step, "step": step, "epoch": 2, "loss": 20.0 + step})
    second.run.state = "completed"
    second.write({"event": "end", "time": 20, "step": 8, "results": {"1-shot": {"accuracy": 0.5, "ci95": 0.1}}})
    second.close()
    got = [(s.step, s.value) for s in _board(run_dir / "tb").Scalars("train/loss")]
    assert got == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 24.0), (5, 25.0), (6, 26.0), (7, 27.0), (8, 28.0)]


def test_a_sink_whose_package_is_missing_is_one_line_before_any_run(store):
    """As a Python without wandb sees it: the import fails (``None`` in sys.modules)."""
    import subprocess
    import sys

    project, _, env = store
    code = ("import sys; sys.modules['wandb'] = None\n"
            "from fslab.cli import main\n"
            "sys.argv = ['fslab', 'export', 'all', '--to', 'wandb']\n"
            "main()\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: sink 'wandb' needs the wandb package (")
    assert out.stderr.strip().endswith("pip install 'fslab[wandb]'") and "Traceback" not in out.stderr


@pytest.mark.parametrize("sink", ["tensorboard", "mlflow", "wandb"])
def test_a_run_given_a_sink_whose_package_is_missing_is_refused_before_it_exists(store, sink):
    """fslab run --sink tensorboard on a Python without tensorboard trained the run all the same, the sink's
    failure one line in its stderr.log: the tracker was found empty only later. The run is refused now, in
    one line, before its folder is made."""
    import subprocess
    import sys

    project, _, env = store
    code = (f"import sys; sys.modules['{sink}'] = None\nfrom fslab.cli import main\n"
            "sys.argv = ['fslab', 'run', 'nca', *sys.argv[1:]]\nmain()\n")
    before = sorted(p.name for p in (project / "runs").iterdir())
    out = subprocess.run([sys.executable, "-c", code, *TINY, "--epochs", "1", "--sink", sink], cwd=project, env=env,
                         capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr == (f"error: sink '{sink}' needs the {sink} package, which is not installed here: pip install "
                          f"'fslab[{sink}]' (or leave the sink out)\n")
    assert sorted(p.name for p in (project / "runs").iterdir()) == before


def test_an_export_searches_the_mlflow_store_once_not_once_per_run(store, tmp_path, monkeypatch, builtin_plugins):
    """A file store reads every run of the experiment for each search: one search per exported run
    for its earlier record took an export of 400 runs 8 minutes. One search per export; exporting
    again still replaces each run's record."""
    import fslab_plugins.sinks.mlflow as mlflow_sink
    from mlflow.tracking import MlflowClient

    project, real, env = store
    (tmp_path / "runs").mkdir()
    copies = [f"20200102-00000{i}-nca-many" for i in range(4)]
    for run_id in copies:
        shutil.copytree(real, tmp_path / "runs" / run_id)
    uri = (tmp_path / "mlruns").as_uri()
    search, calls = MlflowClient.search_runs, []

    def counted(self, *args, **kwargs):
        calls.append(1)
        return search(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "search_runs", counted)
    for _ in range(2):  # each command a process of its own, which starts with no runs searched
        monkeypatch.setattr(mlflow_sink, "_EXPORTED", {})
        calls.clear()
        out = fslab_here("export", "all", "--to", "mlflow", "--set", f"tracking_uri={uri}", cwd=tmp_path, env=env)
        assert out.returncode == 0 and out.stdout.strip().endswith("exported 4 runs to mlflow"), out.stderr[-2000:]
        assert len(calls) == 1

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    found = client.search_runs([client.get_experiment_by_name("fslab").experiment_id])
    assert sorted(run.data.tags["fslab.run_id"] for run in found) == copies  # each once: the first export replaced


def test_a_runs_folder_that_links_to_another_disk_keeps_mlruns_and_log_dirs_in_the_project(store, tmp_path):
    """runs/ a link to a larger disk: mlruns/ (and a relative log_dir) went beside the link's target, on the
    disk, where `mlflow ui --backend-store-uri mlruns` in the project finds nothing."""
    project, real, env = store
    (tmp_path / "disk" / "runs").mkdir(parents=True)
    shutil.copytree(real, tmp_path / "disk" / "runs" / real.name)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "runs").symlink_to(tmp_path / "disk" / "runs")
    for sink, where in (("mlflow", []), ("tensorboard", ["--set", "log_dir=tb"])):
        out = fslab_here("export", "all", "--to", sink, *where, cwd=tmp_path / "project", env=env)
        assert out.returncode == 0, out.stderr
    assert (tmp_path / "project" / "mlruns").is_dir() and (tmp_path / "project" / "tb" / real.name).is_dir()
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["runs"]


def test_an_mlflow_store_copied_with_its_project_refuses_to_write_artifacts_back_where_it_came_from(store, tmp_path):
    """MLflow's file store saves each experiment's artifact folder as an absolute file: URI. A project copied to
    another place (another machine) with its mlruns/: fslab export there wrote each new MLflow run's config.json
    and results.json into the first place's mlruns/ (made anew where it was gone), where neither the copy nor
    its mlflow ui finds them. It is now one line naming both folders and --set experiment=NAME, which works:
    one for the command, with how many runs it concerns (it was the same error: line again for each run, exit
    code 1), exit code 2 as any refusal; a run whose own configuration names another experiment is exported."""
    project, real, env = store
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "runs").mkdir(parents=True)
    copies = [real.name, "20200101-000010-nca-cpya", "20200101-000011-nca-cpyb"]
    for name in copies:
        shutil.copytree(real, first / "runs" / name)
    assert fslab_here("export", "all", "--to", "mlflow", cwd=first, env=env).returncode == 0
    shutil.copytree(first, second)
    before = sorted(p.relative_to(first) for p in first.rglob("*"))
    (experiment,) = [p for p in (second / "mlruns").iterdir() if p.name not in ("0", ".trash", "models")]
    refusal = (f"sink 'mlflow' refused: MLflow experiment 'fslab' keeps its artifacts in "
               f"{first / 'mlruns' / experiment.name}, outside its store (copied or moved from there), where each new "
               f"run's would go; log to a new experiment: --set experiment=NAME")
    out = fslab_here("export", "all", "--to", "mlflow", cwd=second, env=env)
    assert (out.returncode, out.stdout, out.stderr.splitlines()) == (2, "", [f"error: 3 runs not exported: {refusal}"])
    out = fslab_here("export", real.name, "--to", "mlflow", cwd=second, env=env)
    assert out.stderr.splitlines() == [f"error: run {real.name} not exported: {refusal}"] and out.returncode == 2
    own = second / "runs" / "20200101-000012-nca-owne"  # its configuration logs to an experiment of its own
    shutil.copytree(real, own)
    (own / "config.json").write_text(json.dumps({**json.loads((real / "config.json").read_text()),
                                                 "sinks": {"mlflow": {"experiment": "own"}}}))
    out = fslab_here("export", "all", "--to", "mlflow", cwd=second, env=env)
    assert out.returncode == 2 and out.stderr.splitlines() == [f"error: 3 runs not exported: {refusal}"]
    assert out.stdout.splitlines()[-1] == "exported 1 run to mlflow; 3 refused by it", out.stdout
    assert sorted(p.relative_to(first) for p in first.rglob("*")) == before  # nothing written back there
    here = fslab_here("export", real.name, "--to", "mlflow", "--set", "experiment=here", cwd=second, env=env)
    assert here.returncode == 0, here.stderr
    assert sorted(p.relative_to(first) for p in first.rglob("*")) == before
    assert len(list((second / "mlruns").rglob("artifacts/results.json"))) == 5  # 3 first, the own one's, this one


def test_wandb_refuses_a_run_folder_it_cannot_write_rather_than_write_elsewhere(tmp_path, monkeypatch):
    """On a read-only store W&B wrote the offline run to a temporary folder of its own (a warning among
    its messages) and fslab export said it had exported the run. The sink says what it cannot write."""
    from fslab_plugins.sinks import wandb as wandb_sink

    from fslab.plugin import SinkRun

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where W&B went instead
    monkeypatch.setenv("WANDB_SILENT", "true")
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: str(path) != str(run_dir) and access(path, mode, **kw))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PermissionError) as refused:
        wandb_sink.WandbSink(SinkRun("r1", run_dir, {"method": "nca", "seed": 0}, replay=True))
    assert refused.value.filename == str(run_dir) and "cannot write there" in str(refused.value)
    assert not any(tmp_path.rglob("offline-run-*"))


def test_a_sink_that_fails_on_a_run_is_that_runs_line(store, tmp_path):
    project, real, env = store
    (tmp_path / "file").write_text("")
    inside_a_file = (tmp_path / "file" / "store").as_uri()
    out = fslab_here("export", real.name, "--to", "mlflow", "--set", f"tracking_uri={inside_a_file}", cwd=project,
                     env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {real.name}: sink 'mlflow' from plugin 'mlflow_sink' failed: ")
    assert out.stdout.strip() == "exported 0 runs to mlflow; 1 failed in the sink"


def test_tensorboard_that_cannot_write_its_event_file_is_one_line_without_its_thread_s_traceback(store, tmp_path):
    """TensorBoard writes in a thread of its own: a store it cannot write (read-only, full; here files
    may not grow) failed the sink in one line, after the thread's traceback on stderr."""
    import resource
    import subprocess
    import sys

    project, real, env = store
    no_growth = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # noqa: E731
    out = subprocess.run([sys.executable, "-m", "fslab", "export", real.name, "--to", "tensorboard", "--set",
                          f"log_dir={tmp_path / 'tb'}"], cwd=project, env=env, capture_output=True, text=True,
                         timeout=300, preexec_fn=no_growth)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()
    assert line == (f"error: {real.name}: sink 'tensorboard' from plugin 'tensorboard_sink' failed: "
                    "OSError: [Errno 27] File too large")
    assert out.stdout.strip() == "exported 0 runs to tensorboard; 1 failed in the sink"


def test_a_sweep_s_run_whose_folder_was_deleted_is_said_to_be_gone(store, tmp_path):
    """A run a sweep's record names, its folder deleted, was left out as 'status.json is missing or
    unreadable ... (fslab show RUN says why)', where fslab show RUN finds no run."""
    project, real, env = store
    record = project / "runs" / "sweeps" / "sweep-20200101-000009.json"
    record.write_text(json.dumps({"id": "sweep-20200101-000009", "runs": ["20200101-000009-nca-gone", real.name]}))
    try:
        out = fslab_here("export", "sweep-20200101-000009", "--to", "tensorboard", "--set",
                    f"log_dir={tmp_path / 'tb'}", cwd=project, env=env)
        assert out.stderr == ("20200101-000009-nca-gone: its folder is gone from the store, though its sweep's "
                              "record names it; nothing to export\n")
        assert out.stdout.splitlines()[-1] == "exported 1 run to tensorboard; 1 left out"
        assert not (project / "runs" / "20200101-000009-nca-gone").exists()
        # with none of its runs left, the sweep is one line naming the command that removes its record
        record.write_text(json.dumps({"id": "sweep-20200101-000009", "runs": ["20200101-000009-nca-gone"]}))
        out = fslab_here("export", "sweep-20200101-000009", "--to", "tensorboard", cwd=project, env=env)
        assert (out.returncode, out.stdout) == (2, "")
        assert out.stderr.endswith("remove the record with: fslab delete sweep-20200101-000009\n")
    finally:
        record.unlink()


def test_an_end_event_of_the_wrong_shape_is_left_to_the_files_not_fed_to_a_sink(store, tmp_path):
    """An edited end event ("results": "n/a") reached TensorBoard's hparams as an AttributeError."""
    project, real, env = store
    copy = _copy(project / "runs", real.name, "20200101-000004-nca-edit")
    try:
        with open(copy / "metrics.jsonl", "a") as fh:
            fh.write('{"event": "end", "time": 1.0, "results": "n/a"}\n')
        out = fslab_here("export", copy.name, "--to", "tensorboard", "--set", f"log_dir={tmp_path / 'tb'}", cwd=project,
                    env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().endswith("exported 1 run to tensorboard")
    finally:
        shutil.rmtree(copy)


def test_a_run_whose_status_cannot_be_read_is_left_out_as_it_may_not_have_ended(store, tmp_path):
    """A damaged status.json used to be exported, its MLflow status FAILED and W&B exit code 1: a guess."""
    project, real, env = store
    copy = _copy(project / "runs", real.name, "20200101-000005-nca-nost")
    try:
        (copy / "status.json").write_text("{half a status")
        out = fslab_here("export", copy.name, "--to", "tensorboard", "--set", f"log_dir={tmp_path / 'tb'}", cwd=project,
                    env=env)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert out.stderr.strip() == (f"{copy.name}: status.json is missing or unreadable, so whether and how it "
                                      f"ended cannot be told; nothing to export (fslab show {copy.name} says why)")
        assert out.stdout.strip() == "exported 0 runs to tensorboard; 1 left out"
        assert not (tmp_path / "tb").exists()
    finally:
        shutil.rmtree(copy)


def test_all_in_a_store_without_runs_is_one_error_line(tmp_path):
    """It printed 'exported 0 runs to tensorboard' and exit code 1, with no error: line."""
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    (tmp_path / "runs").mkdir()
    out = fslab_here("export", "all", "--to", "tensorboard", cwd=tmp_path, env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == "error: no runs to export: runs/ holds none yet (start one with: fslab run METHOD)"
    # it said to name run ids, sweep ids or 'all', which it had been given; compare and plot said the same
    for verb in ("compare", "plot batch-size"):
        out = fslab_here(*verb.split(), "all", cwd=tmp_path, env=env)
        assert out.returncode == 2 and out.stderr.strip() == (
            f"error: no runs to {verb.split()[0]}: runs/ holds none yet (start one with: fslab run METHOD)")
    sweeps = tmp_path / "runs" / "sweeps"
    sweeps.mkdir()
    (sweeps / "sweep-20260101-000000-abcd.json").write_text(
        '{"id": "sweep-20260101-000000-abcd", "method": "nca", "runs": [], "fail_fast": false, "created": 1.0}')
    out = fslab_here("compare", "sweep-20260101-000000-abcd", cwd=tmp_path, env=env)
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: no runs to compare: the sweep named holds none (list runs and sweeps with: fslab runs)")


def test_a_run_whose_own_sink_parameters_are_wrong_is_named_in_its_line(store, tmp_path):
    """The line said "config key 'sinks.wandb.mode' must be one of offline, online, got 'x'" without the
    run's id: among many runs, which one was left out could not be told."""
    project, real, env = store
    copy = _copy(project / "runs", real.name, "20200101-000006-nca-sink")
    try:
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, "sinks": {"tensorboard": {"logdir": "x"}}}))
        out = fslab_here("export", copy.name, "--to", "tensorboard", "--set", f"log_dir={tmp_path / 'tb'}", cwd=project,
                    env=env)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith(f"{copy.name}: the parameters its configuration gives sink 'tensorboard' cannot be "
                               f"used (unknown parameter 'sinks.tensorboard.logdir' for sink 'tensorboard'.")
        assert line.endswith("nothing to export (fslab export's --set KEY=VALUE gives a parameter over the run's)")
        assert not (tmp_path / "tb").exists()
    finally:
        shutil.rmtree(copy)


def test_a_value_of_fslab_toml_that_cannot_be_used_is_named_as_fslab_toml_s(store, builtin_plugins):
    """[run.sinks.tensorboard] log_dir = 5 in fslab.toml: fslab eval's warning blamed the run ('the parameters
    its configuration gives sink ...'), whose config.json is fine, and fslab export's line named no file."""
    project, real, env = store
    copy = _copy(project / "runs", real.name, "20200101-000007-nca-toml")
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "sinks": {"tensorboard": {}}}))
    (project / "fslab.toml").write_text("[run.sinks.tensorboard]\nlog_dir = 5\n")
    said = ("fslab.toml: [run.sinks.tensorboard]: config key 'sinks.tensorboard.log_dir' must be a string, got 5; "
            "a text TOML reads as a number is written in quotes: \"5\" (on a command line, '\"5\"')")
    try:
        out = fslab_here("export", copy.name, "--to", "tensorboard", cwd=project, env=env)
        assert (out.returncode, out.stderr) == (2, f"error: {said}\n")
        out = fslab_here("export", copy.name, "--to", "tensorboard", "--set", "log_dir=", cwd=project, env=env)
        assert out.returncode == 0, out.stderr  # the command's value over fslab.toml's
        shutil.rmtree(copy / "tb")
        out = fslab_here("eval", copy.name, "--shots", "1", "--episodes", "20", cwd=project, env=env)
        assert out.returncode == 0 and out.stderr == (f"warning: {said}; the scores are saved; send the scores later "
                                                      f"with: fslab export {copy.name} --to tensorboard\n")
        assert not (copy / "tb").exists()
        # the sink lacks the new scores: fslab show names the export that sends them, the next fslab eval sends the run
        assert {name: (f["failed"], f["error"]) for name, f in failures(copy).items()} == {
            "tensorboard": ("to take fslab eval's scores", said)}
    finally:
        (project / "fslab.toml").unlink(missing_ok=True)
        shutil.rmtree(copy)



def test_fslab_eval_goes_on_past_a_sink_whose_server_does_not_answer(store):
    """A run sent to MLflow and TensorBoard as it trained, the MLflow server down since: fslab eval of
    two such runs stopped at the first one's MLflow export (exit code 1), so TensorBoard never got its new
    scores and the second run was never scored, where a sink that fails is a warning and the scores stay.
    The second run's export does not try the server again."""
    import socket

    project, real, env = store
    copies = [_copy(project / "runs", real.name, f"20200101-00001{i}-nca-down") for i in (0, 1)]
    with socket.socket() as closed:  # bound, never listening: a connection to it is refused
        closed.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{closed.getsockname()[1]}"
        for copy in copies:
            config = json.loads((copy / "config.json").read_text())
            sinks = {"mlflow": {"tracking_uri": uri, "experiment": "fslab"}, "tensorboard": {"log_dir": ""}}
            (copy / "config.json").write_text(json.dumps({**config, "sinks": sinks}))
        out = fslab("eval", *(c.name for c in copies), "--shots", "1", "--episodes", "20", cwd=project, env=env,
                    timeout=120)
    try:
        assert out.returncode == 0, out.stderr
        lines = out.stderr.splitlines()
        said = (f"warning: sink 'mlflow' failed: no MLflow server answers at {uri} ([Errno 111] Connection "
                f"refused); start it (mlflow server --port ...), or give the sink's tracking_uri")
        # a server that does not answer takes 10 s each time: the next run does not wait for it again
        for copy, again in zip(copies, ("", " (not tried again)")):
            assert (f"{said}{again}; the scores are saved; send the scores later with: fslab export {copy.name} "
                    f"--to mlflow") in lines
            # added to the copied record where an earlier test exported the run to TensorBoard, else the whole run
            assert any(line.startswith((f"{copy.name}: sent again to tensorboard",
                                        f"{copy.name}: the new scores added to tensorboard's")) for line in lines)
            assert {name: (f["failed"], f["error"]) for name, f in failures(copy).items()} == {  # tried or not
                "mlflow": ("to take fslab eval's scores", said.removeprefix("warning: sink 'mlflow' failed: "))}
            assert "eval/test/5way_1shot/centroid/5q_20ep/accuracy" in _board(copy / "tb").Tags()["scalars"]
            assert [p.name for p in (copy / "evaluations").glob("*-20ep-*")]
    finally:
        for copy in copies:
            shutil.rmtree(copy)


def test_wandb_on_a_full_disk_is_one_line_not_a_traceback_per_log_line(store):
    """W&B writes its debug.log through Python's logging, which printed a traceback ("--- Logging error
    ---") for each line it could not write: 400 lines on stderr before the sink's one line. A limit on
    the size of the files the command writes stands in for a full disk (EFBIG where ENOSPC would be)."""
    import resource
    import signal
    import subprocess
    import sys

    pytest.importorskip("wandb")
    project, real, env = store
    copy = _copy(project / "runs", real.name, "20200101-000020-nca-full")

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, not kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    try:
        out = subprocess.run([sys.executable, "-m", "fslab", "export", copy.name, "--to", "wandb"], cwd=project,
                             env=env, capture_output=True, text=True, timeout=300, preexec_fn=small_files)
        assert out.returncode == 1
        assert out.stderr == (f"error: {copy.name}: sink 'wandb' from plugin 'wandb_sink' failed: "
                              "OSError: [Errno 27] File too large\n")
        assert json.loads((copy / "config.json").read_text()) == json.loads((real / "config.json").read_text())
    finally:
        shutil.rmtree(copy)


@pytest.mark.parametrize(("sink", "limit"), [("tensorboard", 3000), ("wandb", 3000), ("mlflow", 1000)])
def test_an_export_that_fails_midway_keeps_the_earlier_record(store, sink, limit):
    """The sinks removed the earlier record (TensorBoard's folder, W&B's offline record, the MLflow run)
    before writing the new one: an export that then failed (a full disk; a limit on the size of the files
    the command writes stands in for it, one MLflow's artifact config.json passes) left the tracker a record
    cut short (an MLflow run still RUNNING, without artifacts), or none, for a run it had whole."""
    import resource
    import signal
    import subprocess
    import sys

    pytest.importorskip(sink)
    project, real, env = store
    copy = _copy(project / "runs", real.name, f"20200101-00003{len(sink) % 10}-nca-keep")

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, not kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    def record() -> dict:
        """The run's record in the sink: each file with its bytes; for MLflow each active run's state."""
        if sink == "mlflow":
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=(project / "mlruns").as_uri())
            found = client.search_runs([client.get_experiment_by_name("fslab").experiment_id],
                                       filter_string=f"tags.`fslab.run_id` = '{copy.name}'")
            return {r.info.run_id: (r.info.status, sorted(a.path for a in client.list_artifacts(r.info.run_id)),
                                    r.data.metrics) for r in found}
        return tracker_files(copy, sink)

    try:
        # W&B's own service finishes its record after the export returns: a process of its own ends it
        done = (fslab if sink == "wandb" else fslab_here)("export", copy.name, "--to", sink, cwd=project, env=env)
        assert done.returncode == 0, done.stderr
        before = record()
        assert len(before) == 1 if sink == "mlflow" else any(len(data) > limit for data in before.values())
        out = subprocess.run([sys.executable, "-m", "fslab", "export", copy.name, "--to", sink], cwd=project,
                             env=env, capture_output=True, text=True, timeout=300, preexec_fn=small_files)
        assert out.returncode == 1
        assert out.stderr == (f"error: {copy.name}: sink '{sink}' from plugin '{sink}_sink' failed: "
                              "OSError: [Errno 27] File too large\n")
        assert record() == before
        assert [p.name for p in copy.iterdir() if p.name.startswith((".tb", ".offline"))] == []
        if sink == "wandb":
            assert not list((copy / "wandb").glob(".offline-run-*"))
    finally:
        shutil.rmtree(copy)

READ_ONLY_SINK = '''
import errno, os
from pathlib import Path

from fslab.plugin import hookimpl


class ReadOnly:
    """Writes beside the run, on a file system that refuses every write (as a read-only copy of a store)."""

    def __init__(self, run, *, log_dir: str = ""):
        with open(Path(os.environ["TRIED"]), "a") as tried:
            tried.write(run.id + "\\n")
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(Path(run.path) / "ro"))

    def write(self, event):
        pass

    def close(self):
        pass


@hookimpl
def register_sinks(register):
    register(ReadOnly, name="read-only", description="a sink on a read-only file system")
'''


def test_a_read_only_file_system_stops_the_export_at_its_first_run_in_one_line(store, tmp_path):
    """On a read-only copy of a store, each run failed in its own line with the system's words
    (400 lines for 400 runs); the first refusal is one line naming where to point the sink."""
    project, real, env = store
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "ro.py").write_text(READ_ONLY_SINK)
    shutil.copytree(project / "runs", tmp_path / "runs")
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    tried = tmp_path / "tried"
    out = fslab_here("export", "all", "--to", "read-only", cwd=tmp_path, env={**env, "TRIED": str(tried)})
    first = tried.read_text().split()
    assert out.returncode == 1 and len(first) == 1 and out.stdout == ""
    assert out.stderr == (f"error: sink 'read-only' cannot write runs/{first[0]}/ro: the file system is read-only, "
                          f"so no other run was tried; point it at a folder this machine can write with --set "
                          f"KEY=VALUE (its parameters: log_dir)\n")


def test_a_sink_this_user_may_not_write_for_says_where_to_point_it_and_the_export_goes_on(store, tmp_path):
    """A store unpacked read-only as another user: each run's line was the system's "sink 'tensorboard' from
    plugin ... failed: PermissionError: [Errno 13] Permission denied: 'runs/ID/.tb.export'". It now says this
    user may not write there and names the parameters that point the sink elsewhere; the other runs are still
    tried (a shared store may hold this user's own runs too)."""
    project, real, env = store
    (tmp_path / "theirs").mkdir()  # a folder of its own: the registry of this process is kept by plugin_dirs
    (tmp_path / "theirs" / "denied.py").write_text(READ_ONLY_SINK.replace("errno.EROFS", "errno.EACCES").replace(
        'name="read-only"', 'name="denied"'))
    shutil.copytree(project / "runs", tmp_path / "runs")
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['theirs']\n")
    tried = tmp_path / "tried"
    out = fslab_here("export", real.name, "20200101-000000-nca-swep", "--to", "denied", cwd=tmp_path,
                     env={**env, "TRIED": str(tried)})
    assert out.returncode == 1 and tried.read_text().split() == [real.name, "20200101-000000-nca-swep"]
    assert out.stderr.splitlines() == [
        f"error: {run}: sink 'denied' cannot write runs/{run}/ro: this user may not write there; point it at a "
        f"folder this user can write with --set KEY=VALUE (its parameters: log_dir)"
        for run in (real.name, "20200101-000000-nca-swep")]


def test_wandb_on_a_read_only_file_system_says_so(tmp_path, monkeypatch):
    """W&B's own check said 'this user cannot write there' (EACCES), so fslab export went on to the next
    run of the same read-only store; a read-only file system is EROFS, which stops the export."""
    import errno

    from fslab_plugins.sinks import wandb as wandb_sink

    from fslab.plugin import SinkRun

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    monkeypatch.setenv("WANDB_SILENT", "true")
    access, statvfs = os.access, os.statvfs
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: str(path) != str(run_dir) and access(path, mode, **kw))
    read_only = type("Stat", (), {"f_flag": os.ST_RDONLY})
    monkeypatch.setattr(os, "statvfs", lambda path: read_only if str(path) == str(run_dir) else statvfs(path))
    with pytest.raises(OSError) as refused:
        wandb_sink.WandbSink(SinkRun("r1", run_dir, {"method": "nca", "seed": 0}, replay=True))
    assert (refused.value.errno, refused.value.filename) == (errno.EROFS, str(run_dir))


GATED_SINK = '''
import json, os, shutil, time
from pathlib import Path

from fslab.plugin import hookimpl


class Gated:
    """Replaces its folder as the tensorboard sink does: cleared, then a file of its own. With GATE set, it
    says it has cleared the folder (the file GATE.cleared) and waits for the file GATE.go before going on."""

    def __init__(self, run, *, log_dir: str = ""):
        self.folder = Path(run.path) / "gated"
        shutil.rmtree(self.folder, ignore_errors=True)
        gate = os.environ.get("GATE")
        if gate:
            Path(gate + ".cleared").touch()
            while not Path(gate + ".go").exists():
                time.sleep(0.01)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.file = open(self.folder / f"events.{os.getpid()}", "w")

    def write(self, event):
        self.file.write(json.dumps(event) + "\\n")

    def close(self):
        self.file.close()


@hookimpl
def register_sinks(register):
    register(Gated, name="gated", description="a sink that clears its folder, then waits to be let go on")
'''


def test_two_exports_of_a_run_to_one_sink_at_once_leave_one_record_not_two(store, tmp_path):
    """Each export cleared the sink's folder and then wrote its own file: two at once (a second shell, or
    fslab eval sending new scores) could both clear it before either wrote, leaving the record twice.
    The second now waits for the first, saying so, and then replaces its record."""
    import subprocess
    import sys
    import time

    from fslab.core.states import HOST

    project, real, env = store
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "gated.py").write_text(GATED_SINK)
    shutil.copytree(project / "runs", tmp_path / "runs")
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    gate = tmp_path / "gate"
    argv = [sys.executable, "-m", "fslab", "export", real.name, "--to", "gated"]
    first = subprocess.Popen(argv, cwd=tmp_path, env={**env, "GATE": str(gate)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    while not gate.with_suffix(".cleared").exists():  # the first has cleared the folder, and waits
        assert first.poll() is None, first.communicate()
        time.sleep(0.01)
    second = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = second.stderr.readline()  # its waiting line, or nothing where it went on and ended
    gate.with_suffix(".go").touch()
    out, err = second.communicate()
    first_out, first_err = first.communicate()
    assert first.returncode == 0 and second.returncode == 0, (first_err, said + err)
    (record,) = (tmp_path / "runs" / real.name / "gated").iterdir()
    assert record.name == f"events.{second.pid}"
    assert len(record.read_text().splitlines()) == len(events(tmp_path / "runs" / real.name))
    assert said == (f"{real.name}: waiting for the export (pid {first.pid} on host {HOST}) that is sending "
                    f"it to sink 'gated', "
                    f"so that its record there is replaced once, not mixed\n")
    assert not list((tmp_path / "runs" / real.name).glob(".export-*"))


def test_an_export_waits_for_the_worker_still_closing_the_run_s_own_sinks(store, tmp_path):
    """A worker records its run's end, then gives the run's sinks up to [sinks] close_wait_s to finish: an
    export then (the run listed as completed) cleared the sink's folder while the live sink still wrote into
    it. It now waits for the worker to be gone, in one line on stderr."""
    import subprocess
    import sys

    from fslab.core import worklock

    project, real, env = store
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "gated.py").write_text(GATED_SINK)
    shutil.copytree(project / "runs", tmp_path / "runs")
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    run_dir = tmp_path / "runs" / real.name
    fd = worklock.take(run_dir)  # this test is the worker, closing its sinks
    worklock.name_holder(fd)
    try:
        export = subprocess.Popen([sys.executable, "-m", "fslab", "export", real.name, "--to", "gated"],
                                  cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = export.stderr.readline()  # its waiting line, or nothing where it exported at once
        untouched = not (run_dir / "gated").exists()
    finally:
        os.close(fd)  # the worker exits
    out, err = export.communicate()
    assert export.returncode == 0, said + err
    assert said == (f"{real.name}: waiting for its worker (pid {os.getpid()} on host {worklock.HOST}) to finish "
                    f"closing its sinks before exporting it\n") and untouched
    (record,) = (run_dir / "gated").iterdir()
    assert len(record.read_text().splitlines()) == len(events(run_dir))


def test_a_sink_whose_name_holds_a_slash_is_exported_under_its_lock_too(tmp_path):
    """The lock file was named after the sink as it is: a plugin's sink named team/board pointed it into
    a folder that is not there, and the export went on without the lock."""
    from fslab.core.runstore import Run
    from fslab.execution.export import exporting

    run = Run(tmp_path / "20260101-000000-nca-abcd")
    run.path.mkdir()
    with exporting(run, "team/board"):
        assert [p.name for p in run.path.iterdir()] == [".export-team_board.lock"]
    assert list(run.path.iterdir()) == []
    # a name past a file name's 255 bytes, as a plugin may give its sink: "File name too long", and no lock
    names = []
    for sink in ("s" * 300, "s" * 299 + "t"):
        with exporting(run, sink):
            (lock,) = run.path.iterdir()
            assert lock.name.startswith(".export-sss") and len(os.fsencode(lock.name)) <= 255
            names.append(lock.name)
    assert names[0] != names[1] and list(run.path.iterdir()) == []


# `fslab export RUN --to SINK` as the real CLI runs it, with a Ctrl-C arriving between two of its writes
# (the events' iterator raises it: where no write of the sink's own sees it).
INTERRUPTED_BETWEEN_WRITES = """
import sys
import fslab.core.sinks as sinks
import fslab.execution.export as export

real = sinks.replay
def replay(registry, name, run, params, events):
    def cut():
        for i, event in enumerate(events):
            if i == 5:
                raise KeyboardInterrupt
            yield event
    return real(registry, name, run, params, cut())
export.replay = replay
sys.argv = ["fslab", *sys.argv[1:]]
from fslab.cli import main
main()
"""


@pytest.mark.parametrize("sink", ["tensorboard", "wandb"])
def test_an_export_interrupted_between_two_writes_keeps_the_earlier_record(store, sink):
    """A Ctrl-C between two writes reached no write of the sink's, which then closed as if whole and put
    the events written so far in place of the run's whole record."""
    import subprocess
    import sys

    pytest.importorskip(sink)
    project, real, env = store
    copy = _copy(project / "runs", real.name, f"20200101-00004{len(sink) % 10}-nca-ctrl")

    try:
        # W&B's own service finishes its record after the export returns: a process of its own ends it
        done = (fslab if sink == "wandb" else fslab_here)("export", copy.name, "--to", sink, cwd=project, env=env)
        assert done.returncode == 0, done.stderr
        before = tracker_files(copy, sink)
        out = subprocess.run([sys.executable, "-c", INTERRUPTED_BETWEEN_WRITES, "export", copy.name, "--to", sink],
                             cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 130, out.stderr
        assert out.stderr == (f"fslab export interrupted among 1 run: those said above were exported, the one it "
                              f"was exporting keeps its earlier record in {sink}; the same command again exports "
                              f"them all\n")
        assert tracker_files(copy, sink) == before
        assert [p.name for p in copy.iterdir() if p.name.startswith((".tb", ".offline"))] == []
    finally:
        shutil.rmtree(copy)


def tracker_files(copy, sink: str) -> dict[str, bytes]:
    """Each file of a run's TensorBoard or W&B record (its tb/ or wandb/ folder), by path, with its bytes."""
    folder = copy / ("tb" if sink == "tensorboard" else "wandb")
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}
