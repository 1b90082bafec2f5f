"""Resume: an interrupted and resumed run ends exactly where an uninterrupted one does."""

import json
import os
import signal
import textwrap

import pytest

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import TINY, events, fslab, fslab_here, wait_for

pytestmark = pytest.mark.slow

# The same NCA loss, slowed down so the test can stop the run mid-training.
SLOW_NCA = """
    import time

    from fslab.plugin import hookimpl
    from fslab_plugins.methods.nca import nca


    def slow_nca(z, labels, support=None, *, temperature: float = 1.0):
        time.sleep(0.1)
        return nca(z, labels, support, temperature=temperature)


    @hookimpl
    def register_losses(register):
        register(slow_nca, name="slow-nca", description="NCA with a pause per step")
"""
ARGS = [*TINY, "--epochs", "5", "--seed", "5", "--set", "loss.name=slow-nca"]


def trajectory(run_dir):
    """Everything that must match: each logged step and every evaluation."""
    train = [(e["step"], e["epoch"], e["loss"], e["positives"], e["negatives"], e["lr"])
             for e in events(run_dir, "train")]
    evals = [(e["split"], e.get("epoch"), e["shots"], e["accuracy"], e["ci95"]) for e in events(run_dir, "eval")]
    return train, evals


def with_slow_nca(project):
    (project / "mine").mkdir()
    (project / "mine" / "slow.py").write_text(textwrap.dedent(SLOW_NCA))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    return project


@pytest.fixture
def slow_project(project):
    return with_slow_nca(project)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of ARGS, one for the module (every test only reads it): started in
    the background, it trains alongside the first test's run (its loss mostly sleeps)."""
    project = with_slow_nca(tmp_path_factory.mktemp("reference"))
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    started = fslab("run", "nca", *ARGS, "--detach", cwd=project, env=env)
    assert started.returncode == 0, started.stderr
    folder = project / "runs" / started.stdout.strip()
    yield folder
    wait_for(lambda: ended(folder), what="the reference run to end")  # no worker left behind


def ended(folder):
    return json.loads((folder / "status.json").read_text())["state"] not in ("queued", "running")


@pytest.mark.parametrize("interrupt", ["stop", "sigkill"])
def test_interrupted_and_resumed_equals_uninterrupted(slow_project, reference, interrupt):
    run_id = fslab("run", "nca", *ARGS, "--detach", cwd=slow_project).stdout.strip()
    run_dir = slow_project / "runs" / run_id
    wait_for(lambda: [e for e in events(run_dir, "train") if e["epoch"] == 2], what="epoch 2 to start")
    if interrupt == "stop":
        assert fslab("stop", run_id, cwd=slow_project).returncode == 0
        expected_state = "killed"
    else:
        pid = json.loads((run_dir / "status.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        expected_state = "lost"
        # killed in mid-write, it would leave its temporary file; one of a live process (this one) is not its
        (run_dir / f".status.json.{pid}.tmp").write_text('{"state": "runn')
        (run_dir / f".results.json.{os.getpid()}.tmp").write_text("{")
    rows = [json.loads(line) for line in fslab("runs", "--json", cwd=slow_project).stdout.splitlines()]
    assert {r["id"]: r["state"] for r in rows}[run_id] == expected_state
    assert 1 <= len(events(run_dir, "checkpoint")) < 5

    resumed = fslab("resume", run_id, cwd=slow_project)
    assert resumed.returncode == 0, resumed.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["exit_code"] == 0 and status["error"] is None
    wait_for(lambda: json.loads((reference / "status.json").read_text())["state"] == "completed",
             what="the reference run to complete")

    train, evals = trajectory(run_dir)
    assert [t[0] for t in train] == list(range(1, len(train) + 1))  # no step repeated or missing
    assert (train, evals) == trajectory(reference)
    assert json.loads((run_dir / "results.json").read_text())["test"] == \
        json.loads((reference / "results.json").read_text())["test"]
    assert len(events(run_dir, "resume")) == 1
    if interrupt == "sigkill":  # the resumed worker removed the dead worker's leftover, and only that
        assert sorted(p.name for p in run_dir.rglob(".*.tmp")) == [f".results.json.{os.getpid()}.tmp"]


def test_resume_refuses_what_cannot_resume(project):
    result = fslab_here("run", "nca", *TINY, "--epochs", "1", cwd=project)
    assert result.returncode == 0, result.stderr
    run_id = next((project / "runs").iterdir()).name
    refused = fslab_here("resume", run_id, cwd=project)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (f"error: run {run_id} is completed; only killed, lost or failed runs can "
                                      f"resume; to train a run like it from the start: fslab run --like {run_id}")
    # a bad --executor is said first, as the value of any other option is (it said the run was completed)
    wrong = fslab_here("resume", run_id, "--executor", "k8s", cwd=project)
    assert wrong.returncode == 2 and wrong.stderr.startswith("error: ") and "k8s" in wrong.stderr
    assert "completed" not in wrong.stderr


def test_what_this_machine_lacks_for_a_resume_is_said_with_the_command_that_starts_it_anew(project):
    """fslab resume of a run this machine cannot run (its GPUs, its compiler) said 'use --device cpu'
    or '--set train.compile=off', options fslab resume does not take; it now names fslab run --like."""
    import zipfile

    import fslab as api
    from fslab.core.config import resolve
    from fslab.core.runstore import create_run
    from fslab.core.settings import Settings

    def killed_run(**changes):
        config = resolve("nca", registry=api.get_registry(), settings=Settings(),
                         overrides=[{"train": {"epochs": 2}}, changes])
        run = create_run(project / "runs", "nca", config)
        run.write_status(state="killed", ended=1.0)
        with zipfile.ZipFile(run.checkpoint_path, "w") as archive:  # whole, as far as a resume's check reads
            archive.writestr("data.pkl", b"")
        return run.id

    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for changes, expected in [
        ({"device": "cuda"}, "device 'cuda' needs a CUDA GPU, but none is visible here (CUDA_VISIBLE_DEVICES, "
                             "nvidia-smi); resume it where one is, or start it again on the CPU: "
                             "fslab run --like {id} --device cpu"),
        ({"device": "cuda", "train": {"processes": 2}},
         "--gpus 2 (train.processes) needs 2 GPUs but 0 are visible here; resume it where 2 are, or start it again "
         "on fewer: fslab run --like {id} --device cpu --gpus 1"),  # --gpus 1 alone: refused again, on device cuda
        ({"device": "auto", "train": {"processes": 2}},
         "--gpus 2 (train.processes) needs 2 GPUs but 0 are visible here; resume it where 2 are, or start it again "
         "on fewer: fslab run --like {id} --gpus 1"),  # auto trains one process on the CPU
    ]:
        run_id = killed_run(**changes)
        refused = fslab("resume", run_id, cwd=project, env=no_gpu)
        assert refused.returncode == 2 and refused.stderr == f"error: {expected.format(id=run_id)}\n"
    run_id = killed_run(device="cpu", train={"compile": "default"})
    refused = fslab("resume", run_id, cwd=project, env={**no_gpu, "CXX": "/nope/c++"})
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        f"install it, set $CXX to one that is, or start the run again without compiling: fslab run --like {run_id} "
        f"--set train.compile=off")
    # fslab run itself still names its own options
    fresh = fslab("run", "nca", *TINY, "--device", "cuda", cwd=project, env=no_gpu)
    assert fresh.returncode == 2 and fresh.stderr.strip().endswith("use --device cpu, or --device auto")
    fresh = fslab("run", "nca", *TINY, "--device", "cuda", "--gpus", "2", cwd=project, env=no_gpu)
    assert fresh.returncode == 2 and fresh.stderr.strip().endswith(
        "use --device cpu --gpus 1, or --device cpu --gpus 2 for 2 gloo processes on the CPU (slow; for testing)")


def test_a_run_whose_plugin_is_no_longer_installed_is_named_with_how_it_goes_on(project):
    """fslab resume of a run trained with a loss (or a dataset...) whose plugin is gone said "Unknown loss
    'x'. Allowed: ...", as if the command line had named it: neither whose name it was nor how to go on.
    A recipe that is gone stops nothing: the saved configuration has every key."""
    import zipfile

    import fslab as api
    from fslab.core.config import resolve
    from fslab.core.runstore import create_run
    from fslab.core.settings import Settings

    config = resolve("nca", registry=api.get_registry(), settings=Settings(), overrides=[{"train": {"epochs": 2}}])
    for section, option in [("loss", "--set loss.name=NAME"), ("dataset", "--dataset NAME")]:
        run = create_run(project / "runs", "nca", {**config, section: {**config[section], "name": "gone-one"}})
        run.write_status(state="killed", ended=1.0)
        with zipfile.ZipFile(run.checkpoint_path, "w") as archive:
            archive.writestr("data.pkl", b"")
        refused = fslab_here("resume", run.id, cwd=project)
        assert refused.returncode == 2 and refused.stderr == (
            f"error: run {run.id} was trained with {section} 'gone-one', which no installed plugin registers "
            f"(fslab plugins --kind {section} lists those that are); install its plugin to resume the run, or start "
            f"a run like it with another: fslab run --like {run.id} {option}\n")
        assert run.state() == "killed"


def test_a_run_whose_plugin_fails_to_load_now_is_named_with_why_in_one_line(project):
    """fslab resume of a run whose loss's plugin fails to load now (a package it imports uninstalled) printed
    the load warning, then "... which no installed plugin registers (not among them: ...)": the plugin its
    source names, and why it failed, in one line now."""
    import zipfile

    import fslab as api
    from fslab.core.config import resolve
    from fslab.core.runstore import create_run
    from fslab.core.settings import Settings

    config = resolve("nca", registry=api.get_registry(), settings=Settings(), overrides=[{"train": {"epochs": 2}}])
    run = create_run(project / "runs", "nca", {**config, "loss": {"name": "boomloss"}})
    run.write_status(state="killed", ended=1.0)
    with zipfile.ZipFile(run.checkpoint_path, "w") as archive:
        archive.writestr("data.pkl", b"")
    (project / "mine").mkdir()
    (project / "mine" / "boom.py").write_text("import not_installed_anywhere\n# register(f, name='boomloss')\n")
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    refused = fslab_here("resume", run.id, cwd=project)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {run.id} was trained with loss 'boomloss' of plugin 'local:boom' (whose source names it), which "
        f"failed to load: ModuleNotFoundError: No module named 'not_installed_anywhere'; raised loading "
        f"{project / 'mine' / 'boom.py'} (a file of plugin_dirs in fslab.toml); put it right to resume the "
        f"run, or start a run like it with another: fslab run --like {run.id} --set loss.name=NAME\n")
    assert run.state() == "killed"


def test_a_run_killed_while_its_first_checkpoint_was_written_is_said_so(project):
    """The first checkpoint is written while the second epoch trains; a worker killed outright then
    (SIGKILL, the machine's end) leaves a half-written temporary file and no checkpoint, and fslab resume
    said the run "stopped before its first epoch ended", when two had."""
    import fslab as api
    from fslab.core.config import resolve
    from fslab.core.runstore import create_run
    from fslab.core.settings import Settings

    config = resolve("nca", registry=api.get_registry(), settings=Settings(), overrides=[{"train": {"epochs": 3}}])
    run = create_run(project / "runs", "nca", config)
    run.write_status(state="killed", started=1.0, ended=2.0)
    run.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    (run.checkpoint_path.parent / ".last.pt.4242.tmp").write_bytes(b"PK\x03\x04 half")
    refused = fslab_here("resume", run.id, cwd=project)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {run.id} has no checkpoint (it stopped while its first checkpoint was being written, and left "
        f"it half-written in checkpoints/.last.pt.4242.tmp); start it again with the same settings: "
        f"fslab run --like {run.id}\n")


def test_a_first_checkpoint_a_live_writer_is_writing_is_not_called_half_written(project):
    """A runs folder shared between a cluster's nodes: the `.last.pt.PID@HOST.tmp` that node A's worker is
    writing right now was, to fslab resume on node B, the half-written file of a killed run, as was one a
    live process of this host writes. Only a file whose writer is gone (files.writer_gone) is said so; one
    being written names its writer."""
    import fslab as api
    from fslab.core import files, states
    from fslab.core.config import resolve
    from fslab.core.runstore import create_run
    from fslab.core.settings import Settings

    from .test_temporaries import a_day_untouched, left_by_a_killed_writer

    config = resolve("nca", registry=api.get_registry(), settings=Settings(), overrides=[{"train": {"epochs": 3}}])
    run = create_run(project / "runs", "nca", config)
    run.write_status(state="killed", started=1.0, ended=2.0)
    run.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    theirs = left_by_a_killed_writer(run.checkpoint_path, "node-a")  # its pid runs no process here
    pid = int(theirs.name.split(".")[-2].partition("@")[0])
    refused = fslab_here("resume", run.id, cwd=project)
    assert refused.returncode == 2 and refused.stderr == (
        f"error: run {run.id} has no checkpoint (it stopped while its first checkpoint was being written, which "
        f"pid {pid} on host node-a is writing still, in checkpoints/{theirs.name}: fslab resume {run.id} once it "
        f"is written); start it again with the same settings: fslab run --like {run.id}\n")
    a_day_untouched(theirs)  # node-a lost: its writer taken for gone
    mine = files.temporary_path(run.checkpoint_path)  # this process's, alive: this host's writer
    mine.write_bytes(b"PK\x03\x04 half")
    assert (f"which pid {os.getpid()} on host {states.HOST} is writing still, in checkpoints/{mine.name}"
            in fslab_here("resume", run.id, cwd=project).stderr)
    mine.unlink()
    assert (f"(it stopped while its first checkpoint was being written, and left it half-written in "
            f"checkpoints/{theirs.name});" in fslab_here("resume", run.id, cwd=project).stderr)


def test_a_checkpoint_that_no_longer_fits_the_network_is_one_line_naming_the_difference(project):
    """A resume whose configuration builds another network than the checkpoint's (config.json edited, a
    backbone plugin changed) failed with "RuntimeError: Error(s) in loading state_dict for Conv4:"."""
    done = fslab_here("run", "nca", *TINY, "--epochs", "1", cwd=project)
    assert done.returncode == 0, done.stderr
    run_dir = next((project / "runs").glob("2*"))
    status = json.loads((run_dir / "status.json").read_text())
    (run_dir / "status.json").write_text(json.dumps({**status, "state": "killed"}))
    config = json.loads((run_dir / "config.json").read_text())
    config["backbone"]["hidden"] = 16
    (run_dir / "config.json").write_text(json.dumps(config))
    assert fslab_here("resume", run_dir.name, cwd=project).returncode == 1
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["error"] == (
        f"the checkpoint {run_dir / 'checkpoints' / 'last.pt'} does not fit the network the run's configuration "
        f"builds here (its config.json edited, or its backbone's plugin changed, since it was written): size "
        f"mismatch for blocks.0.weight: copying a param with shape [8, 1, 3, 3] from checkpoint, the shape in "
        f"current model is [16, 1, 3, 3]; start the run again: fslab run --like {run_dir.name}")


def test_a_sweep_whose_run_folders_cannot_be_written_is_refused_before_any_is_queued_again(project, registry,
                                                                                            monkeypatch):
    """On a read-only copy of a store (a tar unpacked as another user), fslab sweep resume said only "error:
    Permission denied: runs/ID/.claimed", a hidden file it failed on; it now says fslab resume's line, naming the
    command, before it queues any run again. (Root writes every folder: os.access refuses these here.)"""
    from fslab.core.settings import load_settings
    from fslab.execution.sweep import create_sweep

    sweep_id, runs = create_sweep("nca", {}, 2, base=[{"device": "cpu"}], settings=load_settings(),
                                  registry=registry)
    for run in runs:
        run.write_status(state="failed")
    before = {run.id: sorted(p.name for p in run.path.iterdir()) for run in runs}
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: writable(path, mode, **kw)
                        and os.path.abspath(path) != os.path.abspath(runs[1].path))
    refused = fslab_here("sweep", "resume", sweep_id, cwd=project)
    assert (refused.returncode, refused.stderr) == (1, (
        f"error: cannot write into runs/{runs[1].id}: fslab sweep resume keeps the training's status, logs and "
        f"checkpoints in the run's folder; resume a copy in a store this user can write (cp -r runs/{runs[1].id} "
        f"OTHER/runs/)\n"))
    assert [run.state() for run in runs] == ["failed", "failed"]
    assert {run.id: sorted(p.name for p in run.path.iterdir()) for run in runs} == before


def test_a_run_folder_that_cannot_be_written_is_refused_before_the_resume_starts(project, monkeypatch):
    """On a read-only copy of a store (or another user's run), fslab resume said only 'error: Permission
    denied: runs/ID/stdout.log', the first file it failed on; it says why it writes there, and what to do,
    as fslab eval does, and changes none of its files. (Root writes every folder: os.access refuses this one here.)"""
    import shutil
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "runs-0.1" / "20261123-181312-nca-018e"  # stopped after epoch 2
    run = Path(shutil.copytree(fixture, project / "runs" / fixture.name))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and not p.name.startswith(".")}
    writable = os.access

    def access(path, mode, **kw):
        return writable(path, mode, **kw) and os.path.abspath(path) != str(run)

    monkeypatch.setattr(os, "access", access)
    refused = fslab_here("resume", fixture.name, "--detach", cwd=project)
    assert (refused.returncode, refused.stderr) == (1, (
        f"error: cannot write into runs/{fixture.name}: fslab resume keeps the training's status, logs and "
        f"checkpoints in the run's folder; resume a copy in a store this user can write (cp -r runs/{fixture.name} "
        f"OTHER/runs/)\n"))
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and not p.name.startswith(".")} == before


def test_resume_data_root_is_refused_for_no_folder_and_for_a_dataset_that_reads_no_files(project):
    """fslab resume --data-root moves a run's data root; a DIR that is no folder, or one given a run of synthetic
    (which reads no files), is one line, exit code 2, before anything of the run changes."""
    from fslab.core.runstore import create_run

    from .runs_helpers import with_checkpoint
    from .test_tui_helpers import complete_config

    run = create_run(project / "runs", "nca", complete_config())  # synthetic
    run.write_status(state="killed")
    with_checkpoint(run)
    saved = (run.path / "config.json").read_bytes()
    missing = fslab_here("resume", run.id, "--data-root", "nowhere", cwd=project)
    assert (missing.returncode, missing.stderr) == (2, "error: --data-root nowhere is not a folder\n")
    (project / "data").mkdir()
    rootless = fslab_here("resume", run.id, "--data-root", "data", cwd=project)
    assert (rootless.returncode, rootless.stderr) == (2, (
        f"error: run {run.id} trained on dataset 'synthetic', which reads no files: --data-root gives it none; "
        f"resume it without --data-root\n"))
    assert (run.path / "config.json").read_bytes() == saved and run.state() == "killed"
    home = fslab_here("resume", run.id, "--data-root", "~/data", cwd=project, env={**os.environ, "HOME": str(project)})
    assert home.stderr == rootless.stderr  # '~/data' quoted is the home's data, not "no folder"
