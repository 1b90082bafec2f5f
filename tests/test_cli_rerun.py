"""A run started again with the same settings: ``fslab run --like RUN``, the
dashboard's "new run like this", and honest words about checkpoints when a
run is stopped or cannot resume."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest

from fslab.core.errors import UsageError
from fslab.core.rerun import like
from fslab.core.runstore import Run, create_run

from .runs_helpers import LONG, TINY, as_in_a_terminal, fslab, fslab_here, wait_for


def resolved_run(project, registry, *options: dict) -> Run:
    """A run folder with a real resolved configuration (TINY's settings and
    ``options``), as fslab run makes it, without starting a worker."""
    from fslab.cli.common import overrides
    from fslab.core.config import merge
    from fslab.core.settings import load_settings
    from fslab.execution.executor import prepare

    sets = [v for flag, v in zip(TINY, TINY[1:]) if flag == "--set"]
    layers = overrides("conv4", None, None, 1, 32, None, 4, "cpu", sets)
    for layer in options:
        layers[-1] = merge(layers[-1], layer)
    config = prepare("nca", layers, settings=load_settings(), registry=registry)
    return create_run(project / "runs", "nca", config)


def resolve_like(run: Run, registry, options: list[dict]) -> dict:
    from fslab.core.settings import load_settings
    from fslab.execution.executor import prepare

    method, layers = like(run, options, registry)
    return prepare(method, layers, settings=load_settings(), registry=registry)


def without(config: dict, *keys: str) -> dict:
    out = json.loads(json.dumps(config))
    for key in keys:
        *path, last = key.split(".")
        section = out
        for part in path:
            section = section[part]
        section.pop(last)
    return out


def test_like_keeps_every_saved_key_and_layers_the_options_on_top(project, registry):
    old = resolved_run(project, registry, {"loss": {"temperature": 0.5}, "train": {"lr": 0.07}})
    (project / "fslab.toml").write_text("[run.train]\nlr = 0.3\nepochs = 9\n")  # changed since: must not leak in
    same = resolve_like(old, registry, [])
    assert same == old.config()
    reseeded = resolve_like(old, registry, [{"seed": 11}])
    assert reseeded["seed"] == 11 and without(reseeded, "seed") == without(old.config(), "seed")


def test_like_with_another_plugin_drops_the_old_plugins_parameters(project, registry):
    old = resolved_run(project, registry)
    assert old.config()["backbone"]["hidden"] == 8
    changed = resolve_like(old, registry, [{"backbone": {"name": "resnet12"}}])
    assert changed["backbone"]["name"] == "resnet12" and "hidden" not in changed["backbone"]
    assert changed["train"] == old.config()["train"]
    method, layers = like(old, [{"dataset": {"name": "folder"}}], registry)
    assert method == "nca" and layers[0]["dataset"] == {"name": "folder"}  # not the synthetic root


def test_like_of_a_run_without_configuration_is_one_line(project, registry):
    run = create_run(project / "runs", "nca", {"seed": 1})
    with pytest.raises(UsageError, match="has no readable configuration"):
        like(run, [], registry)
    result = fslab_here("run", "--like", run.id, cwd=project)
    assert result.returncode == 2 and result.stderr.startswith("error: run ") and "Traceback" not in result.stderr


def test_like_of_a_run_whose_data_root_is_gone_names_the_option_that_moves_it(project, registry, tmp_path):
    """The dataset's own line said to give the root with --data-root or [data_roots] of fslab.toml; the
    saved root is a layer above [data_roots], so that changed nothing."""
    old = resolved_run(project, registry)
    gone = tmp_path / "moved-away"
    config = {**old.config(), "dataset": {"name": "folder", "root": str(gone), "cache_dir": "", "grayscale": False,
                                          "image_size": 16}}
    (old.path / "config.json").write_text(json.dumps(config))
    (project / "fslab.toml").write_text(f"[data_roots]\nfolder = '{tmp_path / 'elsewhere'}'\n")
    result = fslab_here("run", "--like", old.id, cwd=project)
    assert result.returncode == 2
    assert result.stderr == (f"error: --like {old.id}: that run was trained on {gone}, which is not a folder now; "
                             f"a run like it reads its data there too: if the data moved, give where it lies with "
                             f"--data-root DIR\n")
    assert list((project / "runs").iterdir()) == [old.path]  # nothing created
    # this project's folder for the dataset is there (a store copied with its data): named in the option to give
    (tmp_path / "elsewhere").mkdir()
    named = fslab_here("run", "--like", old.id, cwd=project)
    assert named.returncode == 2 and named.stderr == (
        f"error: --like {old.id}: that run was trained on {gone}, which is not a folder now; a run like it reads its "
        f"data there too: if the data moved, give where it lies with --data-root {tmp_path / 'elsewhere'} (this "
        f"project's folder for dataset 'folder', from [data_roots] of fslab.toml)\n")
    assert list((project / "runs").iterdir()) == [old.path]
    elsewhere = fslab_here("run", "--like", old.id, "--data-root", str(tmp_path / "nor-here"), cwd=project)
    assert elsewhere.returncode == 2 and "folder: the data root" in elsewhere.stderr  # the dataset's line for that root


def test_like_of_a_run_whose_recipe_or_plugin_is_no_longer_installed_names_the_run(project, registry):
    """fslab run --like of a run whose recipe (or loss, dataset...) no installed plugin registers now said
    "Unknown method 'tau'. Allowed: ...", as if the command line had named it: the run is named now, as
    fslab resume names it, with how to go on; an option that replaces the plugin starts the run."""
    old = resolved_run(project, registry)
    saved = old.config()
    (old.path / "config.json").write_text(json.dumps({**saved, "method": "tau"}))
    result = fslab_here("run", "--like", old.id, cwd=project)
    assert result.returncode == 2 and result.stderr == (
        f"error: run {old.id} was trained with method 'tau', which no installed plugin registers (fslab plugins "
        f"--kind method lists those that are); install its plugin to start a run like it\n")
    (old.path / "config.json").write_text(json.dumps({**saved, "loss": {"name": "gone-one"}}))
    result = fslab_here("run", "--like", old.id, cwd=project)
    assert result.returncode == 2 and result.stderr == (
        f"error: run {old.id} was trained with loss 'gone-one', which no installed plugin registers (fslab plugins "
        f"--kind loss lists those that are); install its plugin to start a run like it, or give it another: "
        f"fslab run --like {old.id} --set loss.name=NAME\n")
    assert list((project / "runs").iterdir()) == [old.path]  # nothing created
    assert resolve_like(old, registry, [{"loss": {"name": "nca"}}])["loss"]["name"] == "nca"


@pytest.mark.parametrize("argv, expected", [
    (["run"], "fslab run needs a METHOD (e.g. fslab run nca) or --like RUN"),
    (["run", "nca", "--like", "last"], "give either METHOD or --like RUN, not both"),
    (["run", "--like", "nothing-like-this"], "no run 'nothing-like-this'"),
])
def test_run_without_a_method_or_with_both_is_refused(project, argv, expected):
    result = fslab_here(*argv, cwd=project)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_run_like_starts_the_same_configuration_and_stop_says_there_is_no_checkpoint(project, registry):
    old = resolved_run(project, registry)
    old.write_status(state="killed")
    started = fslab("run", "--like", old.id[-4:], "--seed", "7", "--epochs", LONG, "--detach", cwd=project)
    assert started.returncode == 0, started.stderr
    new = Run(project / "runs" / started.stdout.strip())
    assert without(new.config(), "seed", "train.epochs") == without(old.config(), "seed", "train.epochs")
    assert (new.config()["seed"], new.config()["train"]["epochs"]) == (7, int(LONG))
    stopped = fslab("stop", new.id, cwd=project)
    assert stopped.stdout.strip() == f"{new.id}: killed", stopped.stderr
    if new.checkpoint_path.exists():  # a very fast first epoch: resume is the way on
        assert f"continue with: fslab resume {new.id}" in stopped.stderr
        return
    when = "before it started" if new.status().get("started") is None else "before its first epoch ended"
    if new.events_of("checkpoint"):  # stopped as its first checkpoint, announced, was about to be written
        when = "after its first epoch ended, before its first checkpoint was on disk"
    assert (f"no checkpoint yet (it stopped {when}); "
            f"start it again with: fslab run --like {new.id}") in stopped.stderr
    resumed = fslab_here("resume", new.id, cwd=project)
    assert resumed.returncode == 2, resumed.stderr
    assert f"start it again with the same settings: fslab run --like {new.id}" in resumed.stderr


@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_claims_none(project):
    follower = subprocess.Popen([sys.executable, "-m", "fslab", "run", "nca", *TINY, "--epochs", LONG],
                                cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=as_in_a_terminal)
    first = follower.stdout.readline()
    assert first.startswith("run "), first + follower.stderr.read()
    run = Run(project / "runs" / first.split()[1])
    wait_for(lambda: run.status().get("pid"), what="the worker to be recorded")  # Ctrl-C at once: stops it too
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 130, err
    assert not run.checkpoint_path.exists() and run.state() == "killed"
    assert f"{run.id}: killed; no checkpoint yet" in out and f"fslab run --like {run.id}" in out
    assert "checkpoint kept" not in out


def test_dashboard_new_run_like_this_prefills_the_form_and_launches_through_like(project, registry):
    from textual.widgets import Input, Select

    from fslab.tui import make_app

    old = resolved_run(project, registry, {"loss": {"temperature": 0.5}})
    old.write_status(state="killed")
    launched = []

    async def main():
        app = make_app(project / "runs", tick=3600, cursor_blink=False)
        app.launch = lambda method, layers, reg: launched.append((method, layers))
        async with app.run_test(size=(120, 36)) as pilot:
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()
            await pilot.press("N")
            await pilot.pause()
            form = app.screen
            assert type(form).__name__ == "LaunchScreen" and old.id in str(form.query_one("#launch-title").render())
            assert form.query_one("#method", Select).disabled
            assert form.query_one("#backbone", Select).value == "conv4"
            assert form.query_one("#seed", Input).value == "4" and form.query_one("#epochs", Input).value == "1"
            form.query_one("#seed", Input).value = "5"
            await pilot.press("ctrl+s")
            await pilot.pause()

    asyncio.run(main())
    [(method, layers)] = launched
    from fslab.core.settings import load_settings
    from fslab.execution.executor import prepare

    config = prepare(method, layers, settings=load_settings(), registry=registry)
    assert config["seed"] == 5 and without(config, "seed") == without(old.config(), "seed")


def test_eval_of_a_run_that_ended_without_a_checkpoint_says_how_to_train_it_again(project):
    """fslab eval said only that the run had no checkpoint; a run that ended before its
    first has none to come, and the line now gives the command that trains it again."""
    from fslab.core.config import CONFIG_VERSION, DEFAULTS

    run = create_run(project / "runs", "nca", {**DEFAULTS, "method": "nca", "config_version": CONFIG_VERSION})
    run.write_status(state="killed", ended=1.0)
    result = fslab_here("eval", run.id[-4:], cwd=project)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"error: run {run.id} has no checkpoint (one is written after each epoch; it "
                                     f"ended before its first); train it again with: fslab run --like {run.id}")


def test_eval_of_a_completed_run_whose_checkpoint_file_went_says_it_is_gone(project):
    """A completed run logged its checkpoints; where the file is missing now (deleted, or its folder copied
    without it), fslab eval said the run ended before its first checkpoint. It says the file is gone."""
    from fslab.core.config import CONFIG_VERSION, DEFAULTS

    run = create_run(project / "runs", "nca", {**DEFAULTS, "method": "nca", "config_version": CONFIG_VERSION})
    run.metrics_path.write_text(json.dumps({"event": "checkpoint", "time": 1.0, "epoch": 1, "step": 4,
                                            "path": str(run.checkpoint_path)}) + "\n")
    run.write_status(state="completed", ended=2.0, exit_code=0)
    result = fslab_here("eval", run.id, cwd=project)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"error: run {run.id} completed, but its checkpoint "
                                     f"{run.checkpoint_path.relative_to(project)} is gone "
                                     f"(deleted, or not copied with the run's folder); copy it back from where the run "
                                     f"trained, or train the run again with: fslab run --like {run.id}")
