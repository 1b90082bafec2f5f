"""Real runs in real worker processes: completed, failed, killed, lost."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from .runs_helpers import LONG, TINY, as_in_a_terminal, events, fslab, wait_for

pytestmark = pytest.mark.slow


def only_run(project):
    runs = [p for p in (project / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def status(run_dir):
    return json.loads((run_dir / "status.json").read_text())


def test_completed_run_leaves_every_file(project):
    result = fslab("run", "nca", *TINY, "--epochs", "2", cwd=project)
    assert result.returncode == 0, result.stderr + result.stdout
    run_dir = only_run(project)
    st = status(run_dir)
    assert st["state"] == "completed" and st["exit_code"] == 0 and st["ended"] >= st["started"]
    assert st["pid"] != os.getpid()

    config = json.loads((run_dir / "config.json").read_text())
    assert config["backbone"] == {"name": "conv4", "hidden": 8, "head": "average"} and config["train"]["epochs"] == 2

    train = events(run_dir, "train")
    start = events(run_dir, "start")[0]
    assert [e["step"] for e in train] == list(range(1, start["total_steps"] + 1))  # log_every=1
    for e in train:
        assert e["loss"] > 0 and e["lr"] > 0 and e["images_per_s"] > 0
        # 32 images from 18 classes: every positive pair is also counted once
        assert 0 < e["positives"] and e["positives"] + e["negatives"] <= 32 * 31 // 2

    val = events(run_dir, "eval")
    assert [(e["split"], e["shots"]) for e in val] == [("val", 5), ("val", 5), ("test", 1), ("test", 5)]
    for e in val:
        assert 0 <= e["accuracy"] <= 1 and e["ci95"] > 0 and e["ways"] == 5 and e["queries"] == 5

    results = json.loads((run_dir / "results.json").read_text())
    assert set(results["test"]) == {"1-shot", "5-shot"}
    assert results["test"]["5-shot"]["accuracy"] == val[-1]["accuracy"]
    assert f"{100 * results['test']['5-shot']['accuracy']:.2f}" in result.stdout

    import torch

    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert {"model", "optimizer", "scheduler", "epoch", "step", "config", "rng", "train_mean"} <= set(checkpoint)
    assert checkpoint["epoch"] == 2 and checkpoint["step"] == start["total_steps"]
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["last.pt"]
    shown = json.loads(fslab("show", run_dir.name, "--json", cwd=project).stdout)
    assert shown["state"] == "completed" and len(shown["evaluations"]) == 4
    log = fslab("logs", run_dir.name, cwd=project).stdout.splitlines()
    first = train[0]
    assert f"epoch 1 step 1: loss {first['loss']:.4f}, pairs +{first['positives']}/-{first['negatives']}" in log[1]
    assert log[-1].startswith("done: test 1-shot ")


def test_a_failed_runs_line_puts_no_period_after_the_errors_question():
    """A lazy target's typo failed its run with "Did you mean 'pkg.network:SmallConvNet'?. See: fslab logs"."""
    from fslab.cli.common import ended_line

    error = "backbone 'mine' points at 'pkg.nets:Net', which cannot be imported. Did you mean 'pkg.net:Net'?"
    assert ended_line("r1", "failed", error) == f"r1: failed: {error} See: fslab logs r1 --stderr"
    assert ended_line("r1", "failed", "it broke.") == "r1: failed: it broke. See: fslab logs r1 --stderr"


def test_failing_loss_gives_failed_with_the_error(project):
    plugins = project / "local_plugins"
    plugins.mkdir()
    (plugins / "boom.py").write_text(textwrap.dedent("""
        from fslab.plugin import hookimpl

        def boom(z, labels, support=None):
            raise RuntimeError("the loss exploded on purpose.")

        @hookimpl
        def register_losses(register):
            register(boom, name="boom", description="always raises")
    """))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['local_plugins']\n")
    result = fslab("run", "nca", *TINY, "--set", "loss.name=boom", cwd=project)
    assert result.returncode == 1
    run_dir = only_run(project)
    # the error's own period is not doubled before "See:" (it read "on purpose.. See:"); the line names the loss
    # and its plugin, as an evaluator's does (it read "failed: RuntimeError: ...", whose code it was not said)
    error = "loss 'boom' from plugin 'local:boom' failed: RuntimeError: the loss exploded on purpose."
    assert result.stderr.splitlines()[-1] == f"{run_dir.name}: failed: {error} See: fslab logs {run_dir.name} --stderr"
    st = status(run_dir)
    assert st["state"] == "failed" and st["exit_code"] == 1
    assert st["error"] == error
    assert "Traceback" in (run_dir / "stderr.log").read_text()
    assert "exploded" in fslab("logs", run_dir.name, "--stderr", cwd=project).stdout


DRAWER = """
    from fslab.plugin import Batch, hookimpl

    class Drawer:
        def __init__(self, labels, batch_size, seed):
            self.batch_size = batch_size

        def __len__(self):
            return 3

        def batches(self, epoch):
            yield Batch(list(range(self.batch_size)))
            raise ValueError("the sampler ran dry on purpose")

    @hookimpl
    def register_samplers(register):
        register(Drawer, name="drawer", description="raises at its second batch")
"""

FRAGILE = """
    from fslab.plugin import hookimpl

    class Fragile:
        def __init__(self, labels, batch_size, seed):
            raise KeyError("per_class")

    @hookimpl
    def register_samplers(register):
        register(Fragile, name="fragile", description="raises when it is built")
"""


@pytest.mark.parametrize("name, source, error", [
    # it read "failed: ValueError: the sampler ran dry on purpose", whose code it was not said
    ("drawer", DRAWER,
     "sampler 'drawer' from plugin 'local:drawer' failed: ValueError: the sampler ran dry on purpose"),
    # it read "failed: KeyError: 'per_class'", naming neither the sampler nor its plugin
    ("fragile", FRAGILE, "sampler 'fragile' from plugin 'local:fragile' failed to build: KeyError: 'per_class'"),
])
def test_a_sampler_that_raises_as_it_is_built_or_draws_fails_the_run_in_a_line_naming_it(project, name, source,
                                                                                        error):
    plugins = project / "local_plugins"
    plugins.mkdir()
    (plugins / f"{name}.py").write_text(textwrap.dedent(source))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['local_plugins']\n")
    result = fslab("run", "nca", *TINY, "--set", f"sampler.name={name}", cwd=project)
    assert result.returncode == 1
    run_dir = only_run(project)
    assert result.stderr.splitlines()[-1] == f"{run_dir.name}: failed: {error}. See: fslab logs {run_dir.name} --stderr"
    assert status(run_dir)["error"] == error
    assert "Traceback" in (run_dir / "stderr.log").read_text()


def test_a_network_broken_by_a_finite_loss_fails_the_run_and_keeps_the_checkpoint_before(project):
    """A step whose loss is finite can still leave the network NaN (a NaN gradient; a batch-norm
    variance that overflows at a huge --lr, as `fslab run nca --epochs 1 --lr 1e5` on TINY did):
    the run completed with every accuracy 20.00 ± 0.00% and saved the broken network. It now fails
    at the epoch's end, before validating or overwriting the last good checkpoint."""
    plugins = project / "local_plugins"
    plugins.mkdir()
    (plugins / "breaks.py").write_text(textwrap.dedent("""
        import torch
        from fslab.plugin import LossOutput, hookimpl

        class Breaks(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("calls", torch.zeros((), dtype=torch.long))

            def forward(self, z, labels, support=None):
                self.calls += 1
                loss = (z - z.mean(0)).pow(2).mean()
                if int(self.calls) == 14:  # the last step of epoch 2: a finite loss, a NaN gradient
                    loss = loss + 0 * torch.sqrt((z - z.detach()).abs()).sum()
                return LossOutput(loss, 0, 0)

        @hookimpl
        def register_losses(register):
            register(Breaks, name="breaks", description="a NaN gradient at step 14")
    """))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['local_plugins']\n")
    result = fslab("run", "nca", *TINY, "--epochs", "3", "--set", "loss.name=breaks", cwd=project)
    assert result.returncode == 1, result.stderr
    run_dir = only_run(project)
    st = status(run_dir)
    assert st["state"] == "failed" and st["exit_code"] == 1
    assert st["error"].startswith("FloatingPointError: the network is no longer finite after step 14 (epoch 2): "
                                  "the model's "), st["error"]
    assert st["error"].endswith("holds nan, though the logged losses were finite; start it again at a lower "
                                f"learning rate: fslab run --like {run_dir.name} --lr 0.0025")
    assert all(math.isfinite(e["loss"]) for e in events(run_dir, "train"))
    assert [e["epoch"] for e in events(run_dir, "eval")] == [1]  # the broken network was not scored
    assert [e["epoch"] for e in events(run_dir, "checkpoint")] == [1]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["epoch"] == 1 and all(torch.isfinite(v).all() for v in checkpoint["model"].values())
    assert not (run_dir / "results.json").exists()


def test_a_loss_that_diverges_fails_the_run_with_the_command_that_starts_it_at_a_lower_rate(project):
    """The error said 'try a lower --lr', an option fslab resume does not take (it keeps the rate)."""
    result = fslab("run", "nca", *TINY, "--epochs", "1", "--lr", "1e6", cwd=project)
    assert result.returncode == 1, result.stderr
    run_dir = only_run(project)
    st = status(run_dir)
    assert st["state"] == "failed"
    assert re.fullmatch(rf"FloatingPointError: loss became nan at step [2-7] \(epoch 1\); start it again at a "
                        rf"lower learning rate: fslab run --like {run_dir.name} --lr 100000", st["error"]), st["error"]


@pytest.mark.parametrize("log_every", ["1", "10"])
def test_a_loss_that_is_nan_before_any_update_blames_the_loss_not_the_learning_rate(project, log_every):
    """NCA at loss.temperature=1e-38 is NaN on the untrained network: the run's error said
    'try a lower --lr', which cannot help; it names the loss and its parameters. With the default
    train.log_every=10 the first step was not logged, and the error of step 10 blamed the rate."""
    result = fslab("run", "nca", *TINY, "--epochs", "1", "--set", "loss.temperature=1e-38",
                   "--set", f"train.log_every={log_every}", cwd=project)
    assert result.returncode == 1, result.stderr
    st = status(only_run(project))
    assert st["state"] == "failed"
    assert st["error"] == ("FloatingPointError: loss 'nca' from plugin 'nca' was nan at step 1, before any update, "
                           "so not from the learning rate; check the loss's parameters "
                           "(loss.pair_fraction=1.0, loss.temperature=1e-38)")


def test_stop_kills_cleanly_and_keeps_the_checkpoint(project):
    result = fslab("run", "nca", *TINY, "--epochs", LONG, "--detach", cwd=project)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    run_dir = project / "runs" / run_id
    wait_for(lambda: events(run_dir, "checkpoint"), what="the first checkpoint")
    stopped = fslab("stop", run_id, cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"{run_id}: killed"
    st = status(run_dir)
    assert st["state"] == "killed" and st["exit_code"] == 128 + signal.SIGTERM
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert fslab("stop", run_id, cwd=project).returncode == 2  # nothing left to stop


STOP_INSIDE_NUMPYS_IMPORT = textwrap.dedent("""
    import importlib.abc, os, signal, sys
    from fslab.execution.worker import Stopped, import_train, stop_on_signals

    class StopOnNumpy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "numpy":  # torch's C code imports it, and drops any exception the import raises
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGTERM)  # handled at the next line of Python: inside that import
            return None

    stop_on_signals()
    sys.meta_path.insert(0, StopOnNumpy())
    try:
        import_train()
        print("not stopped")
    except Stopped as stop:
        print("stopped", stop.signum)
    import numpy
    print(numpy.multiply(2, 3))
""")


def test_a_stop_while_torch_imports_numpy_is_not_lost():
    """A stop that lands while torch imports numpy is held back until the import is over, then
    raised: raised inside, torch's C code discarded it, and the run went on to fail with an
    unrelated error (seen as `fslab stop` answering 'failed' for a run stopped as it started)."""
    done = subprocess.run([sys.executable, "-c", STOP_INSIDE_NUMPYS_IMPORT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [f"stopped {int(signal.SIGTERM)}", "6"]  # and numpy is whole


def test_the_worker_freezes_torchs_objects_once_it_has_imported_training():
    """torch's modules hold hundreds of thousands of objects that live as long as the process: frozen
    (gc.freeze), no full collection walks them, the one Python makes as a worker exits included
    (0.3-0.4 s of CPU at the end of each worker, and of each fslab eval, on a 2-core machine)."""
    code = ("import gc, sys\nfrom fslab.execution.worker import import_train\nbefore = gc.get_freeze_count()\n"
            "import_train()\nprint(before, 'torch' in sys.modules, gc.get_freeze_count())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, imported, frozen = done.stdout.split()
    assert (before, imported) == ("0", "True") and int(frozen) > 100_000, done.stdout


@pytest.mark.parametrize("sent, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_while_following_stops_the_worker(project, sent, code):
    """Ctrl-C, and a SIGTERM (kill, timeout, a job's end): the follower used to die at a SIGTERM and
    leave its worker training with no one to stop it."""
    follower = subprocess.Popen([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", LONG],
                                cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=as_in_a_terminal)
    run_dir = wait_for(lambda: next((p for p in (project / "runs").iterdir() if p.is_dir()), None)
                       if (project / "runs").exists() else None, what="the run folder")
    wait_for(lambda: events(run_dir, "checkpoint"), what="the first checkpoint")
    follower.send_signal(sent)
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == code, err
    assert "killed; last checkpoint kept" in out
    st = status(run_dir)
    assert st["state"] == "killed" and not _alive(st["pid"])


def _followed_into_a_closed_pipe(project, *args):
    """``fslab ARGS | head -1``: the follower's stdout a pipe whose reader leaves after the first line."""
    read, write = os.pipe()
    follower = subprocess.Popen([sys.executable, "-m", "fslab", *args], cwd=project, stdout=write,
                                stderr=subprocess.PIPE, text=True)
    os.close(write)
    with os.fdopen(read) as reader:
        first = reader.readline()
    _, err = follower.communicate(timeout=120)
    return first, follower.returncode, err


def test_a_follower_whose_reader_went_away_leaves_the_run_training_and_says_so(project):
    """`fslab run nca | head -2` exited 141 without a word, and the worker trained on unseen: the run goes on,
    as with --detach, and stderr says so with the commands that follow and stop it; so does `fslab resume`."""
    first, code, err = _followed_into_a_closed_pipe(project, "run", "nca", *TINY, "--epochs", LONG)
    run_dir = only_run(project)
    try:
        assert first.startswith(f"run {run_dir.name} in "), first
        went_on = (f"run {run_dir.name} trains on: the reader of this output went away; follow it with: fslab logs "
                   f"{run_dir.name} --follow; stop it with: fslab stop {run_dir.name}")
        assert (code, err.strip()) == (141, went_on), err
        trained = len(events(run_dir, "train"))
        wait_for(lambda: len(events(run_dir, "train")) > trained and events(run_dir, "checkpoint"),
                 what="training after the follower left")
        st = status(run_dir)
        assert st["state"] == "running" and _alive(st["pid"]), st
        assert fslab("stop", run_dir.name, cwd=project).returncode == 0

        first, code, err = _followed_into_a_closed_pipe(project, "resume", run_dir.name)
        assert (code, err.strip()) == (141, went_on), err
        st = status(run_dir)
        assert st["state"] in ("queued", "running") and _alive(st["pid"]), st
        assert fslab("stop", run_dir.name, cwd=project).returncode == 0
    finally:  # a worker left training is not for the suite to wait on
        st = status(run_dir)
        if st.get("pid") and _alive(st["pid"]) and st["state"] in ("queued", "running"):
            os.kill(st["pid"], signal.SIGKILL)


def test_detach_into_a_closed_pipe_says_the_id_on_stderr(project):
    """`fslab run nca --detach | true`: the id, its one line, went nowhere and nothing said which run started;
    stderr names it with the commands that follow and stop it (exit code 141, as any command cut short)."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the id is written
    try:
        done = subprocess.run([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", LONG, "--detach"],
                              cwd=project, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    run_dir = only_run(project)
    try:
        went_on = (f"run {run_dir.name} trains on: the reader of this output went away; follow it with: fslab logs "
                   f"{run_dir.name} --follow; stop it with: fslab stop {run_dir.name}")
        assert (done.returncode, done.stderr.strip()) == (141, went_on), done.stderr
        assert status(run_dir)["state"] in ("queued", "running")
        assert fslab("stop", run_dir.name, cwd=project).returncode == 0
    finally:
        st = status(run_dir)
        if st.get("pid") and _alive(st["pid"]) and st["state"] in ("queued", "running"):
            os.kill(st["pid"], signal.SIGKILL)


# `fslab run` or `fslab resume` with a Ctrl-C (or SIGTERM) that arrives the moment its worker has started,
# before following it: the command used to exit 130 without a word while the worker trained on unfollowed.
SIGNALLED_AT_START = textwrap.dedent("""
    import os, signal, sys
    import fslab.execution.executor as executor
    real = executor.start_worker
    def start_worker(*args, **kwargs):
        process = real(*args, **kwargs)
        os.kill(os.getpid(), signal.{sent})
        return process
    executor.start_worker = start_worker
    from fslab.cli import main
    sys.argv = ["fslab", *sys.argv[1:]]
    main()
""")


@pytest.mark.parametrize("sent, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_as_the_worker_starts_stops_it(project, sent, code):
    def signalled(*args):
        return subprocess.run([sys.executable, "-c", SIGNALLED_AT_START.format(sent=sent), *args], cwd=project,
                              capture_output=True, text=True, timeout=120, preexec_fn=as_in_a_terminal)

    started = signalled("run", "nca", *TINY, "--epochs", LONG)
    run_dir = only_run(project)
    st = status(run_dir)
    if st.get("pid") and _alive(st["pid"]) and st["state"] != "killed":  # left training: not for the suite to wait on
        os.kill(st["pid"], signal.SIGKILL)
    assert started.returncode == code, started.stderr
    assert st["state"] == "killed" and not _alive(st["pid"]), st
    assert f"{run_dir.name}: killed; no checkpoint yet" in started.stdout, started.stdout
    assert "Traceback" not in started.stderr, started.stderr

    # the same for fslab resume of a run with a checkpoint: killed again, its checkpoint kept
    assert fslab("resume", run_dir.name, "--detach", cwd=project).returncode == 2  # no checkpoint: refused
    followed = subprocess.Popen([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", LONG],
                                cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=as_in_a_terminal)
    second = wait_for(lambda: next((p for p in (project / "runs").iterdir() if p.is_dir() and p != run_dir), None),
                      what="the second run's folder")
    wait_for(lambda: events(second, "checkpoint"), what="its first checkpoint")
    followed.send_signal(signal.SIGINT)
    followed.communicate(timeout=60)
    resumed = signalled("resume", second.name)
    assert resumed.returncode == code, resumed.stderr
    st = status(second)
    assert st["state"] == "killed" and not _alive(st["pid"]), st
    assert f"{second.name}: killed; last checkpoint kept" in resumed.stdout, resumed.stdout


def test_a_run_stopped_from_elsewhere_while_followed_exits_as_after_ctrl_c(project):
    follower = subprocess.Popen([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", LONG],
                                cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = wait_for(lambda: next((p for p in (project / "runs").iterdir() if p.is_dir()), None)
                       if (project / "runs").exists() else None, what="the run folder")
    wait_for(lambda: events(run_dir, "checkpoint"), what="the first checkpoint")
    assert fslab("stop", run_dir.name, cwd=project).returncode == 0
    _, err = follower.communicate(timeout=60)
    assert follower.returncode == 130, err
    assert err.strip().splitlines()[-1] == (f"{run_dir.name}: killed (stopped by SIGTERM); last checkpoint kept in "
                                            f"runs/{run_dir.name}/checkpoints/last.pt; continue with: fslab resume "
                                            f"{run_dir.name}")


def test_worker_killed_by_sigkill_shows_as_lost(project):
    run_id = fslab("run", "nca", *TINY, "--epochs", LONG, "--detach", cwd=project).stdout.strip()
    run_dir = project / "runs" / run_id
    wait_for(lambda: events(run_dir, "train"), what="training to start")
    pid = status(run_dir)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _alive(pid), what="the worker to die")
    rows = [json.loads(line) for line in fslab("runs", "--json", cwd=project).stdout.splitlines()]
    assert [(r["id"], r["state"]) for r in rows] == [(run_id, "lost")]
    assert status(run_dir)["state"] == "running"  # nothing rewrote the file; lost is detected


def _alive(pid):
    from fslab.core.states import pid_alive

    return pid_alive(pid)


def test_episodic_protonet_run_counts_prototype_pairs(project):
    shape = ["--epochs", "1", "--set", "sampler.ways=5", "--set", "sampler.shots=2", "--set", "sampler.queries=3"]
    # the episode shape fixes the batch: TINY's --batch-size 32 would be ignored, so it is refused
    refused = fslab("run", "protonet", *TINY, *shape, cwd=project)
    assert refused.returncode == 2 and "config key 'train.batch_size' is 32, but sampler 'episodic' draws " \
                                      "batches of 25 rows" in refused.stderr
    tiny = [a for i, a in enumerate(TINY) if "--batch-size" not in TINY[max(i - 1, 0):i + 1]]
    result = fslab("run", "protonet", *tiny, *shape, cwd=project)
    assert result.returncode == 0, result.stderr
    run_dir = only_run(project)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["sampler"] == {"name": "episodic", "ways": 5, "shots": 2, "queries": 3, "per_class": 0}
    assert config["train"]["batch_size"] == 25  # what trained, not the default
    train = events(run_dir, "train")
    # 12 training classes × 20 images = 240 images, episodes of 5 × (2 + 3) = 25 rows.
    assert len(train) == events(run_dir, "start")[0]["steps_per_epoch"] == 10
    for event in train:  # NCA paper Sec. 3.3: w·m·n positives, w(w−1)·m·n negatives
        assert (event["positives"], event["negatives"]) == (5 * 3 * 2, 5 * 4 * 3 * 2)


def test_training_beats_the_untrained_network(project):
    """The built-in dataset is learnable: a short NCA run on a small Conv4 lifts
    validation accuracy well above both chance and the untrained network."""
    args = ["--backbone", "conv4", "--set", "backbone.hidden=32", "--epochs", "4", "--batch-size", "64",
            "--lr", "0.05", "--set", "dataset.classes=100", "--set", "dataset.val_classes=20",
            "--set", "dataset.test_classes=20", "--set", "train.crop_padding=0", "--set", "train.flip=false",
            "--set", "eval.before_training=true", "--set", "eval.val_episodes=300",
            "--set", "eval.test_episodes=300", "--set", "eval.center_images=512"]
    result = fslab("run", "nca", *args, cwd=project)
    assert result.returncode == 0, result.stderr
    val = [e for e in events(only_run(project), "eval") if e["split"] == "val"]
    assert [e["epoch"] for e in val] == [0, 1, 2, 3, 4]
    untrained, trained = val[0]["accuracy"], max(e["accuracy"] for e in val[1:])
    assert trained > untrained + 0.05 and trained > 0.5, (untrained, trained)


def test_logs_follow_prints_until_the_run_ends(project):
    run_id = fslab("run", "nca", *TINY, "--epochs", "2", "--detach", cwd=project).stdout.strip()
    followed = fslab("logs", run_id, "--follow", cwd=project)
    assert followed.returncode == 0
    lines = followed.stdout.splitlines()
    assert lines[0].startswith("training on cpu: 2 epochs")
    assert lines[-1].startswith("done: test 1-shot ")
    assert status(project / "runs" / run_id)["state"] == "completed"
    assert followed.stdout == (project / "runs" / run_id / "stdout.log").read_text()


@pytest.mark.parametrize("stderr", [False, True])
def test_logs_follow_of_a_run_whose_worker_was_killed_outright_says_how_it_ended(project, stderr):
    """A worker killed by SIGKILL writes no last line: fslab logs --follow ended as quietly, and with
    the same exit code, as after a completed run, and the one following never learned it died."""
    from fslab.core.runstore import create_run
    from fslab.core.states import HOST

    run = create_run(project / "runs", "nca", {"method": "nca"})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run.write_status(state="running", host=HOST, pid=dead.pid, started=1.0)
    (run.path / "stdout.log").write_text("epoch 1 step 1: loss 2.0\n")
    (run.path / "stderr.log").write_text("")
    followed = fslab("logs", run.id, "--follow", *(["--stderr"] if stderr else []), cwd=project)
    assert followed.returncode == 0
    assert followed.stdout == ("" if stderr else "epoch 1 step 1: loss 2.0\n")
    see = "" if stderr else f". See: fslab logs {run.id} --stderr"
    assert followed.stderr.splitlines() == [
        f"{run.id}: lost: its worker died without recording an end (killed outright, or its machine went down)"
        f"{see}; no checkpoint yet (it stopped before its first epoch ended); start it again with: "
        f"fslab run --like {run.id}"]
    assert fslab("logs", run.id, cwd=project).stderr == ""  # without --follow, the log alone, as before


def test_simpleshot_with_a_training_only_projection_head(project):
    result = fslab("run", "simpleshot", *TINY, "--epochs", "1", "--set", "train.projection_dim=16", cwd=project)
    assert result.returncode == 0, result.stderr
    run_dir = only_run(project)
    for event in events(run_dir, "train"):  # a classifier compares no embedding pairs
        assert (event["positives"], event["negatives"]) == (0, 0)
    import torch

    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert tuple(checkpoint["head"]["weight"].shape) == (16, 8)  # conv4 hidden=8 -> 16
    assert tuple(checkpoint["loss"]["classifier.weight"].shape) == (12, 16)  # 12 training classes
    # evaluation uses the backbone's 8-d features, not the head
    assert tuple(checkpoint["train_mean"].shape) == (8,)


def test_a_train_event_logs_the_learning_rate_its_step_trained_with(project):
    """TINY at batch 32 is 7 steps an epoch: over 2 epochs the rate falls after step 7 (milestone 0.5),
    so step 7 trained at the full rate and step 8 at a tenth of it."""
    result = fslab("run", "nca", *TINY, "--epochs", "2", "--lr", "0.1", "--set", "train.milestones=[0.5]",
                   cwd=project)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (project / "runs").glob("2*")
    rates = {e["step"]: e["lr"] for e in events(run_dir, "train")}
    assert len(rates) == 14
    assert [rates[s] for s in (1, 7)] == [0.1, 0.1]
    assert [rates[s] for s in (8, 14)] == pytest.approx([0.01, 0.01])


APART = """
    from fslab.plugin import Batch, hookimpl

    class Apart:
        def __init__(self, labels, batch_size, seed):
            firsts = {}
            for index, label in enumerate(labels):
                firsts.setdefault(int(label), index)
            self.indices = list(firsts.values())[:batch_size]

        def __len__(self):
            return 2

        def batches(self, epoch):
            for _ in range(2):
                yield Batch(self.indices)

    @hookimpl
    def register_samplers(register):
        register(Apart, name="apart", description="one image of each class: no positive pair")
"""


def test_a_batch_of_no_positive_pair_logs_its_loss_as_0_not_minus_0(project):
    """supcon's loss (form nca-code) of a batch with no positive pair is a zero made by negating a sum,
    -0.0 (as mAP's is where the features sum below 0), which metrics.jsonl, and the dashboard and
    ``fslab logs`` reading it, showed as a loss of -0.0."""
    plugins = project / "local_plugins"
    plugins.mkdir()
    (plugins / "apart.py").write_text(textwrap.dedent(APART))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['local_plugins']\n")
    result = fslab("run", "nca", *TINY, "--epochs", "1", "--batch-size", "8", "--set", "sampler.name=apart",
                   "--set", "loss.name=supcon", "--set", "loss.form=nca-code", cwd=project)
    assert result.returncode == 0, result.stderr
    run_dir = only_run(project)
    train = events(run_dir, "train")
    assert [(e["positives"], e["loss"]) for e in train] == [(0, 0.0), (0, 0.0)]
    assert all(math.copysign(1.0, e["loss"]) == 1.0 for e in train), train
    assert '"loss": -0.0' not in (run_dir / "metrics.jsonl").read_text()


# A list that counts how often its length is asked: the sampler's batches below, and the test's own conversion.
COUNTED_LIST = """
    class Counted:
        reads = 0  # how many times fslab asked a batch's indices or marks their length

        def __init__(self, values):
            self.values = values

        def __len__(self):
            Counted.reads += 1
            return len(self.values)

        def __getitem__(self, row):
            return self.values[row]
"""

COUNTED = """
    import json

    from fslab.plugin import Batch, hookimpl
""" + COUNTED_LIST + """
    class Reading:
        def __init__(self, labels, batch_size, seed):
            self.batch_size = batch_size

        def __len__(self):
            return 3

        def batches(self, epoch):
            for step in range(3):
                rows = range(step * self.batch_size, (step + 1) * self.batch_size)
                yield Batch(Counted(list(rows)), Counted([row % 2 == 0 for row in rows]))
            with open(REPORT, "w") as fh:
                json.dump(Counted.reads, fh)

    @hookimpl
    def register_samplers(register):
        register(Reading, name="reading", description="counts how often its batches are read")
"""


def test_a_step_converts_its_sampler_batch_once(project):
    """The training step converted a sampler's indices (and support marks) to a tensor to check them,
    then again to move them to the device: every batch's lists were read twice per step."""
    import torch

    report = project / "reads.json"
    plugins = project / "local_plugins"
    plugins.mkdir()
    (plugins / "reading.py").write_text(textwrap.dedent(COUNTED).replace("REPORT", repr(str(report))))
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['local_plugins']\n")
    result = fslab("run", "nca", *TINY, "--epochs", "1", "--batch-size", "8", "--set", "sampler.name=reading",
                   cwd=project)
    assert result.returncode == 0, result.stderr
    assert [e["step"] for e in events(only_run(project), "train")] == [1, 2, 3]

    namespace = {}
    exec(textwrap.dedent(COUNTED_LIST), namespace)  # the plugin's class, to count the reads of one conversion
    Counted = namespace["Counted"]
    torch.as_tensor(Counted(list(range(8))))
    torch.as_tensor(Counted([True] * 8))
    assert json.loads(report.read_text()) == 3 * Counted.reads


def test_a_followed_run_whose_worker_is_killed_says_how_to_go_on(project):
    """fslab run following a worker killed by SIGKILL (the kernel's out-of-memory killer) said
    only that the run was lost; it says, as after a stop, that the last checkpoint is kept and
    continues with fslab resume."""
    follower = subprocess.Popen([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", LONG],
                                cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = wait_for(lambda: next((p for p in (project / "runs").iterdir() if p.is_dir()), None)
                       if (project / "runs").exists() else None, what="the run folder")
    wait_for(lambda: (run_dir / "checkpoints" / "last.pt").exists(), what="the first checkpoint")
    os.kill(status(run_dir)["pid"], signal.SIGKILL)
    _, err = follower.communicate(timeout=60)
    assert follower.returncode == 1, err
    assert err.strip().splitlines()[-1] == (
        f"{run_dir.name}: lost: the worker was killed by SIGKILL (out of memory, or another program). See: fslab "
        f"logs {run_dir.name} --stderr; last checkpoint kept in runs/{run_dir.name}/checkpoints/last.pt; continue "
        f"with: fslab resume {run_dir.name}")


@pytest.mark.parametrize("sigterm", [False, True])
def test_a_stop_that_comes_after_the_run_completed_reports_it_completed(tmp_path, monkeypatch, capsys, sigterm):
    """Ctrl-C (or a SIGTERM) in the moment the worker finished found nothing to stop: fslab run said
    'completed; last checkpoint kept ...; continue with: fslab resume RUN', which refuses a completed run,
    and exited 130 (143) as for a stopped run. It now prints the test scores as any completed run does."""
    import fslab.cli.follow
    from fslab.cli import launch
    from fslab.core.errors import Terminated
    from fslab.core.runstore import create_run

    run = create_run(tmp_path / "runs", "nca", {"method": "nca", "seed": 0, "device": "cpu"})
    run.checkpoint_path.write_bytes(b"weights")
    (run.path / "results.json").write_text(json.dumps({"ways": 5, "episodes": 50, "test": {
        "1-shot": {"accuracy": 0.5, "ci95": 0.02}, "5-shot": {"accuracy": 0.75, "ci95": 0.01}}}))
    run.write_status(state="completed", ended=1.0, exit_code=0)

    def finished_then_interrupted(*_args, **_kwargs):
        raise Terminated if sigterm else KeyboardInterrupt

    monkeypatch.setattr(fslab.cli.follow, "follow", finished_then_interrupted)
    launch._follow_to_end(run, subprocess.Popen(["true"]))  # returns: no typer.Exit(130 or 143)
    out = capsys.readouterr().out
    assert "test 5-way 1-shot: 50.00 ± 2.00% (50 episodes)" in out and "75.00 ± 1.00%" in out, out
    assert "fslab resume" not in out and "checkpoint kept" not in out, out


def test_a_worker_is_reaped_even_where_a_ctrl_c_left_popen_s_lock_held():
    """A Ctrl-C raised inside Popen.poll(), between its lock's acquire and the try that releases it, left the
    lock held; the follower's process.wait() after stopping the worker then blocked for ever (a CI run: the
    follower asleep on a futex, its worker a zombie). reap() waits on the pid itself."""
    import threading

    from fslab.execution.local import reap

    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process._waitpid_lock.acquire()  # as the interrupted poll() left it
    codes = []
    waiter = threading.Thread(target=lambda: codes.append(reap(process)), daemon=True)
    waiter.start()
    waiter.join(60)
    assert codes == [3] and process.returncode == 3
    assert reap(process) == 3  # once reaped, said again without waiting


def test_an_end_the_status_cannot_take_is_one_line_on_stderr_not_a_second_traceback(tmp_path, monkeypatch, capsys):
    """A run whose folder was made read-only as it trained failed at its next write, and its worker then
    died in a second traceback where status.json refused the failure (the run, its lock freed, is lost):
    the end it could not record is one line in stderr.log, and the worker exits with the run's exit code."""
    from fslab.core.runstore import Run, create_run
    from fslab.execution.worker import StatusKeeper

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    keeper = StatusKeeper(run, 1.0)

    def refused(self, **fields):
        raise PermissionError(13, "Permission denied", str(self.path / "status.json"))

    monkeypatch.setattr(Run, "write_status", refused)
    keeper.finish("failed", 1, "cannot write the checkpoint runs/ID/checkpoints/last.pt: Permission denied")
    assert capsys.readouterr().err == (
        "fslab: the run ended failed (cannot write the checkpoint runs/ID/checkpoints/last.pt: Permission denied), "
        f"which status.json could not record (PermissionError: [Errno 13] Permission denied: "
        f"'{run.path / 'status.json'}'); fslab lists the run as lost\n")


def test_a_heartbeat_that_comes_as_the_run_ends_writes_nothing_after_the_end(tmp_path, monkeypatch):
    """A beat whose thread woke as the run finished wrote status.json once more after the end, which the
    worker's os._exit could cut short: a completed run kept a half-written .status.json.PID@HOST.tmp (CI's
    copy of one failed a test that looks for temporaries). The beat now writes only while the run lives."""
    import threading

    from fslab.core.runstore import Run, create_run
    from fslab.execution.worker import StatusKeeper

    run = create_run(tmp_path / "runs", "nca", {"method": "nca"})
    keeper = StatusKeeper(run, 0.001)
    woke, go_on, written = threading.Event(), threading.Event(), []
    write_status = Run.write_status

    def recorded(self, **fields):
        written.append(fields)
        write_status(self, **fields)

    monkeypatch.setattr(Run, "write_status", recorded)
    monkeypatch.setattr(keeper, "sample_usage", lambda: (woke.set(), go_on.wait(10), None)[-1])
    keeper.start(resume=False)
    assert woke.wait(10)  # the beat is under way, about to write
    keeper.finish("completed", 0)
    go_on.set()
    keeper.thread.join(10)
    assert not keeper.thread.is_alive() and written[-1].get("state") == "completed", written[-1]
    assert run.status()["state"] == "completed" and not list(run.path.glob(".*.tmp"))


def test_sinks_of_a_run_whose_end_status_cannot_be_written_are_closed_with_that_end(tmp_path, monkeypatch, capsys):
    """A failed run whose status.json refused its end (a full disk) closed its sinks with the state status.json
    still held, 'running': each sink is told the end the worker gave, 'failed'."""
    from fslab.core.runstore import Run, create_run
    from fslab.execution import worker

    run = create_run(tmp_path / "runs", "nca", {"method": "nca", "train": {"heartbeat": 60}})
    closed = []

    class Sinks:
        def close(self, state):
            closed.append(state)

    def fails_on_a_full_disk(run, resume, keeper, opened):
        opened.append(Sinks())
        monkeypatch.setattr(Run, "write_status", lambda self, **fields: (_ for _ in ()).throw(
            OSError(28, "No space left on device")))
        keeper.finish("failed", 1, "RuntimeError: boom")
        return 1

    for name in ("stop_on_signals", "watch_torchrun", "utf8_logs"):
        monkeypatch.setattr(worker, name, lambda: None)
    monkeypatch.setattr(worker, "take_worker_lock", lambda run: 99)
    monkeypatch.setattr(worker, "_train", fails_on_a_full_disk)
    assert worker.main([str(run.path)]) == 1
    assert run.status()["state"] == "running" and closed == ["failed"]
    assert "which status.json could not record" in capsys.readouterr().err
