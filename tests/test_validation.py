"""Nothing a late error can break: every configuration mistake is refused by
the real CLI before a run folder exists, in one line naming the key and what
is allowed, with exit code 2; and what only the worker can find (an image
that cannot be decoded) fails the run at its start, not after training."""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import pytest

from .runs_helpers import events, fslab, fslab_here
from .test_datasets_disk import make_folder_tree

# Small and fast for what does get past the checks; each case below is refused before any training.
SMALL = ["--backbone", "conv4", "--set", "backbone.hidden=8", "--device", "cpu"]


def refused(project, *argv, env=None, expect=(), runs_before=()):
    """Run the CLI; it must exit 2 with one ``error:`` line holding every ``expect``
    fragment, no traceback, and no run folder beyond ``runs_before``. In this process (a
    traceback would raise here), but in one of its own for an ``env`` of other visible GPUs,
    which the machine's GPU libraries may read once per process."""
    result = fslab_here(*argv, cwd=project) if env is None else fslab(*argv, cwd=project, env=env, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in expect:
        assert fragment in lines[0], (fragment, lines[0])
    runs = project / "runs"
    made = sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []
    assert made == sorted(runs_before), made
    return lines[0]


# (--set or option arguments, fragments the one line must hold: the key, the value, what is allowed)
CONFIG_CASES = {
    "test-episodes-0": (["--set", "eval.test_episodes=0"], ["'eval.test_episodes'", "from 2 to 1,000,000", "got 0"]),
    "shots-1000": (["--set", "eval.shots=[1000]"],
                   ["'eval.shots'", "got 1000", "test split (40 classes of 30 images)", "at most 30"]),
    "ways-0": (["--set", "eval.ways=0"], ["'eval.ways'", "at least 2", "got 0"]),
    "ways-100": (["--set", "eval.ways=100"], ["'eval.ways'", "at most 40", "val split", "got 100"]),
    "queries-too-many": (["--set", "eval.queries=40"], ["'eval.queries'", "got 40", "at most 30"]),
    "extra-ways-100": (["--set", "eval.extra_ways=[5,100]"],
                       ["'eval.extra_ways'", "at most 40", "test split (40 classes of 30 images)", "got 100"]),
    "lr-negative": (["--lr", "-0.1"], ["--lr must", "> 0", "got -0.1"]),
    "lr-zero": (["--lr", "0"], ["--lr must", "> 0", "got 0.0"]),
    "lr-inf": (["--lr", "inf"], ["--lr must", "finite number", "got inf"]),
    "lr-nan": (["--lr", "nan"], ["--lr must", "finite number", "got nan"]),
    "temperature-0": (["--set", "loss.temperature=0"], ["loss.temperature", "> 0", "got 0.0"]),
    "temperature-negative": (["--set", "loss.name=supcon", "--set", "loss.temperature=-1"],
                             ["supcon", "loss.temperature", "> 0", "got -1.0"]),
    "temperature-nan": (["--set", "loss.temperature=nan"], ["'loss.temperature'", "finite number", "got nan"]),
    "pair-fraction": (["--set", "loss.pair_fraction=1.5"], ["loss.pair_fraction", "(0, 1]", "got 1.5"]),
    "batch-larger-than-data": (["--batch-size", "5000"],
                               ["train.batch_size 5000", "3600 training images", "sampler.drop_last=false"]),
    "knn-k": (["--set", "evaluator.name=knn", "--set", "evaluator.k=6"],
              ["evaluator.k", "between 1 and the 5 support points", "got 6"]),
    "finetune-1-shot": (["--set", "evaluator.name=finetune"], ["finetune", "eval.shots", ">= 2", "[1, 5]"]),
    "feature-stages": (["--set", "eval.feature_stages=5"], ["eval.feature_stages", "between 1 and 4", "got 5"]),
    "device-word": (["--device", "tpu"], ["--device must", "auto, cpu, cuda (a GPU) or cuda:N", '"tpu"']),
}

# Every range declared on the typed sections: a value just outside it.
RANGE_CASES = {
    "train.epochs=0": "from 1 to 1,000,000", "train.batch_size=1": "at least 2",
    "train.optimizer=adm": "one of sgd, adam",
    "train.momentum=1.5": "between 0 and 1", "train.weight_decay=-0.1": "from 0 to 3.4e38",
    "train.weight_decay=nan": "finite number", "train.milestones=[1.5]": "between 0 and 1",
    "train.milestones=[-0.5]": "between 0 and 1", "train.gamma=0": "> 0", "train.crop_padding=-1": "from 0 to 256",
    "train.projection_dim=-1": "from 0 to 100,000",
    # absurd values that used to pass and fail in the worker (an overflow, the memory)
    "train.projection_dim=9223372036854775807": "a whole number from 0 to 100,000",
    "train.crop_padding=100000": "a whole number from 0 to 256", "train.lr=1e+308": "at most 3.4e38",
    "train.weight_decay=1e+39": "from 0 to 3.4e38", "train.lr=0": "> 0 and at most 3.4e38",
    "train.log_every=0": "at least 1", "train.heartbeat=0": "> 0",
    "train.processes=0": "at least 1", "eval.shots=[0]": "at least 1", "eval.shots=[]": "at least one value",
    # a milestone listed twice decayed once (the schedule's steps are a set): a typo, as a grid's repeated value
    "train.milestones=[0.5, 0.5]": "lists 0.5 twice; give each value once",
    "eval.queries=0": "at least 1", "eval.val_shots=0": "at least 1",
    "eval.val_episodes=0": "a whole number from 2 to 1,000,000",
    "eval.test_episodes=1": "a whole number from 2 to 1,000,000 (a 95% CI needs two episodes at least)",
    "eval.test_episodes=99999999999": "a whole number from 2 to 1,000,000",
    "eval.val_every=0": "at least 1", "eval.extra_ways=[1]": "at least 2",
    "eval.seed=-1": "from 0 to", "eval.center_images=-1": "at least 0", "eval.batch_size=0": "at least 1",
    "eval.feature_stages=0": "at least 1", "seed=-1": "from 0 to",
    "train.precision=fp8": "one of auto, fp32, bf16, fp16", "eval.precision=half": "one of auto, fp32, bf16, fp16",
    "train.compile=fast": "one of off, default, max-autotune", "train.channels_last=yes": "one of auto, on, off",
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_bad_value_is_refused_before_a_run_exists(project, case):
    argv, expect = CONFIG_CASES[case]
    refused(project, "run", "nca", *SMALL, *argv, expect=expect)


@pytest.mark.parametrize("assignment", list(RANGE_CASES))
def test_every_declared_range_is_refused_in_one_line(project, assignment):
    key, _, value = assignment.partition("=")
    refused(project, "run", "nca", *SMALL, "--set", assignment,
            expect=[f"'{key}", RANGE_CASES[assignment], value.strip("[]") or "[]"])


@pytest.mark.parametrize("value, reads_as", [("2024", "a number"), ("true", "true or false")])
def test_a_text_toml_reads_as_another_value_is_told_to_quote_it(project, value, reads_as):
    """--set sinks.tensorboard.log_dir=2024 (a folder named by its year) said only "must be a string,
    got 2024"; the line says how to give the text."""
    refused(project, "run", "nca", *SMALL, "--set", f"sinks.tensorboard.log_dir={value}",
            expect=["'sinks.tensorboard.log_dir' must be a string",
                    f"; a text TOML reads as {reads_as} is written in quotes: \"{value}\" (on a command line, "
                    f"'\"{value}\"')"])


def test_nesterov_without_momentum_is_refused(project):
    refused(project, "run", "nca", *SMALL, "--set", "train.momentum=0",
            expect=["'train.momentum'", "train.nesterov=true", "train.nesterov=false"])


@pytest.mark.parametrize("argv, expect", [
    (["protonet", "--set", "sampler.ways=500"], ["500 ways", "at least 20 images", "has 120", "at most 120"]),
    (["protonet", "--set", "sampler.per_class=16"],
     ["sampler.per_class=16", "sampler.ways=20", "sampler.queries=15", "not both"]),
    (["protonet-best", "--set", "sampler.ways=20"], ["sampler.per_class=16", "sampler.ways=20", "not both"]),
    # a recipe of per_class given ways and queries: the way out is per_class=0, not ways=0 and queries=0
    (["matchingnet", "--set", "sampler.ways=10", "--set", "sampler.queries=3"],
     ["sampler.per_class=8", "not both", "set sampler.per_class=0 to use ways and queries"]),
    (["nca", "--set", "sampler.name=fixed", "--set", "sampler.ways=500"],
     ["500 ways", "sampler.ways (or train.batch_size / sampler.per_class) must be at most 120"]),
    (["protonet", "--set", "sampler.shots=0"], ["sampler.shots", "at least 1", "got 0"]),
    (["protonet-best", "--batch-size", "100"],
     ["not divisible by sampler.per_class 16", "a multiple of 16 (96 or 112)"]),
    (["matchingnet", "--batch-size", "12"], ["not divisible by sampler.per_class 8", "a multiple of 8 (16)"]),
])
def test_sampler_shapes_are_refused_against_the_training_split(project, argv, expect):
    refused(project, "run", *argv, *SMALL, expect=expect)


@pytest.mark.parametrize("argv, expect", [
    (["protonet", "--set", "sampler.shots=20"],
     ["35 images (shots + queries)", "has 0", "sampler.shots + sampler.queries must be at most 30"]),
    (["map-ssvm", "--set", "sampler.per_class=40"],
     ["at least 40 images each", "has 0", "sampler.per_class must be at most 30"]),
    # an episode shaped by per_class: the line named sampler.shots + sampler.queries, and queries
    # cannot be given with per_class
    (["matchingnet", "--set", "sampler.per_class=40", "--batch-size", "80"],
     ["40 images (per_class)", "has 0", "so sampler.per_class must be at most 30"]),
    (["nca", "--set", "sampler.name=fixed", "--set", "sampler.ways=130", "--set", "sampler.per_class=40"],
     ["has 0", "must be at most 120 (its classes) and sampler.per_class at most 30"]),
])
def test_a_sampler_asking_more_images_than_any_class_holds_says_how_many_fit(project, argv, expect):
    # synthetic's 120 training classes hold 30 images each: fewer images per class fits, no number of ways
    # alone does
    line = refused(project, "run", *argv, *SMALL, expect=expect)
    assert "at most 0" not in line


@pytest.mark.parametrize("visible, expect", [
    ("", ["device 'cuda:7'", "none is visible", "--device cpu"]),
    ("0,1", ["device 'cuda:7'", "needs 8 visible GPUs", "2 are visible", "cuda:0 to cuda:1"]),
])
def test_a_device_this_machine_lacks_is_refused(project, visible, expect):
    refused(project, "run", "nca", *SMALL[:4], "--device", "cuda:7",
            env={**os.environ, "CUDA_VISIBLE_DEVICES": visible}, expect=expect)


def test_cuda_without_a_gpu_suggests_the_cpu(project):
    refused(project, "run", "nca", *SMALL[:4], "--device", "cuda", env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
            expect=["device 'cuda'", "--device cpu"])


@pytest.mark.parametrize("argv, expect", [
    (["run", "nca", "--epochs", "abc"], ["'--epochs'", "integer", "got 'abc'", "fslab run --help"]),
    (["run", "nca", "--epochs=abc"], ["'--epochs'", "got 'abc'"]),
    (["run", "nca", "--epoch", "3"], ["No such option: --epoch", "--epochs"]),
    (["run"], ["fslab run needs a METHOD (e.g. fslab run nca) or --like RUN"]),
    (["runs", "--limit", "x"], ["'--limit'", "got 'x'"]),
    (["runs", "--all", "--limit", "3"], ["give --all or --limit N, not both: --all lists every run, --limit 3"]),
])
def test_a_command_line_typer_cannot_parse_is_one_line(project, argv, expect):
    refused(project, *argv, expect=expect)


def test_help_still_works(project):
    result = fslab("run", "--help", cwd=project)
    assert result.returncode == 0 and "--epochs" in result.stdout and not result.stderr


# -- folder datasets: what the CLI can count without decoding a thing ----------------------------


def folder_run(root, *extra):
    return ["run", "nca", *SMALL, "--dataset", "folder", "--data-root", str(root), "--set", "dataset.image_size=8",
            "--batch-size", "8", "--set", "eval.queries=2", *extra]


def test_a_folder_split_with_fewer_classes_than_ways_is_refused(project):
    make_folder_tree(project / "tree", classes=3, per_class=4)
    line = refused(project, *folder_run(project / "tree"),
                   expect=["'eval.ways' must be at most 3", "folder's val split (3 classes of 4 images)", "got 5"])
    assert line.endswith("got 5")  # a folder's classes are its folders: no setting gives it more


def test_a_folder_split_of_one_class_is_refused_without_asking_for_one_way(project):
    """No eval.ways fits a split of one class (2 at least): the line said 'eval.ways must be at
    most 1 ... (1 classes of 8 images)', a value the next check refuses."""
    make_folder_tree(project / "tree", classes=5, per_class=8)
    for extra in ("val-class1", "val-class2", "val-class3", "val-class4"):
        shutil.rmtree(project / "tree" / "val" / extra)
    line = refused(project, *folder_run(project / "tree"), expect=[])
    assert line == ("error: folder's val split (1 class of 8 images) cannot give an episode: one needs 2 classes "
                    "at least (eval.ways is at least 2), so the split needs more classes")


def test_a_folder_training_split_of_one_class_is_refused(project):
    """With one training class every loss was 0 at every step (nca: pairs +28/-0): the run ended
    'completed' having trained nothing, and scored its untrained network."""
    make_folder_tree(project / "tree", classes=5, per_class=8)
    for extra in ("train-class1", "train-class2", "train-class3", "train-class4"):
        shutil.rmtree(project / "tree" / "train" / extra)
    for loss in ("nca", "simpleshot"):
        line = refused(project, *folder_run(project / "tree", "--set", f"loss.name={loss}"))
        assert line == ("error: folder's train split (1 class of 8 images) cannot train a network: a loss learns "
                        "by telling classes apart, so the split needs 2 classes at least")


def test_a_folder_image_that_is_no_image_is_refused_before_the_run_exists(project):
    """An empty file and a page saved as .png in the class folders: the run was made, decoded its training
    split in the worker and failed there, naming the file by its whole path. Every header is read first
    (a split already cached is not read again), each file named by its path in the data root."""
    tree = project / "tree"
    make_folder_tree(tree, classes=5, per_class=8)
    (tree / "train" / "train-class2" / "03.png").write_text("<html>a page, saved as an image</html>")
    (tree / "test" / "test-class0" / "05.png").write_bytes(b"")
    refused(project, *folder_run(tree), expect=[
        f"error: folder: cannot read image train/train-class2/03.png (in the data root {tree}): cannot identify "
        f"image file", "(2 files cannot be read); replace or remove the file"])
    # the check wrote nothing in the data root: it made ROOT/.fslab-cache, an empty folder left in a lab's shared copy
    assert sorted(p.name for p in tree.iterdir()) == ["test", "train", "val"]


def test_a_pair_loss_on_a_training_split_whose_classes_hold_one_image_each_is_refused(project):
    """No training class held 2 images: nca, supcon, triplet and the mAP losses on i.i.d. batches found no
    positive pair in any batch, logged loss 0 (every row counted without a positive) at every step, and the
    run ended 'completed' having trained nothing. simpleshot compares no pairs, and trains."""
    make_folder_tree(project / "tree", classes=10, per_class=8)
    for c in range(10):
        for extra in range(1, 8):
            (project / "tree" / "train" / f"train-class{c}" / f"{extra:02d}.png").unlink()
    for loss in ("nca", "nca-learned-temperature", "supcon", "triplet", "map-ssvm", "map-dlm"):
        line = refused(project, *folder_run(project / "tree", "--set", f"loss.name={loss}", "--set",
                                            "sampler.name=iid", "--set", "eval.ways=3", "--epochs", "1",
                                            "--set", "eval.val_episodes=2", "--set", "eval.test_episodes=2"))
        assert line == (f"error: {'nca' if loss.startswith('nca') else loss}: no class of the training split "
                        f"has 2 images (its 10 classes hold 1 image each at most), so no batch holds a positive "
                        f"pair and the loss would be 0 at every step; give training classes 2 images at least, "
                        f"or train a method that compares no pairs (simpleshot)")


def test_a_drawn_dataset_with_too_few_classes_for_the_ways_says_which_setting_gives_more(project):
    refused(project, "run", "nca", *SMALL, "--set", "eval.ways=50",
            expect=["'eval.ways' must be at most 40 for synthetic's val split (40 classes of 30 images), got 50; "
                    "--set dataset.val_classes=50 gives the split that many"])
    refused(project, "run", "nca", *SMALL, "--set", "eval.ways=50", "--set", "dataset.val_classes=50",
            expect=["'eval.ways' must be at most 40 for synthetic's test split", "dataset.test_classes=50"])


def test_a_folder_split_without_enough_images_for_the_shots_is_refused(project):
    make_folder_tree(project / "tree", classes=5, per_class=4)
    refused(project, *folder_run(project / "tree"),
            expect=["'eval.val_shots'", "got 5", "5 + 2 images per class", "at most 4"])


def test_final_val_needs_the_validation_split_to_give_the_test_s_episodes(project):
    make_folder_tree(project / "tree", classes=5, per_class=8)
    for extra in sorted((project / "tree" / "val").glob("*/0[4-7].png")):
        extra.unlink()  # 4 validation images a class: enough for 1 + 2, not for the test's 5 + 2
    shapes = ["--set", "eval.shots=[5]", "--set", "eval.val_shots=1"]
    refused(project, *folder_run(project / "tree"), *shapes, "--set", "eval.final_val=true",
            expect=["'eval.shots' is too large here, got 5", "5-way val episodes of 5 + 2 images",
                    "folder's val split (5 classes of 4 images)"])


def test_an_empty_class_folder_is_refused(project):
    make_folder_tree(project / "tree", classes=5, per_class=8)
    (project / "tree" / "test" / "class9").mkdir()
    refused(project, *folder_run(project / "tree"), expect=["class9 has no image files", "empty class folder"])


def test_a_class_in_two_splits_is_refused_naming_it_and_both_folders(project):
    """The same class folder in train/ and test/ trained on the classes it then tested, and the run's
    few-shot scores said nothing of unseen classes."""
    make_folder_tree(project / "tree", classes=5, per_class=8)
    shutil.copytree(project / "tree" / "train" / "train-class3", project / "tree" / "test" / "train-class3")
    tree = project / "tree"
    line = refused(project, *folder_run(tree))
    assert line == (f"error: folder: the class 'train-class3' is in both {tree / 'train'}/ and {tree / 'test'}/; "
                    f"few-shot splits must hold disjoint classes (a test class seen in training inflates its "
                    f"scores): rename the folders, or move each class into one split")


@pytest.mark.slow
def test_an_image_cut_short_fails_the_run_at_its_start_naming_the_file_in_the_data_root(project):
    """A file cut short after its header passes the check of every header before the run exists; the
    decode at the run's start finds it: the run ends failed with the one line in status.json, its folder
    kept, the file named by its path in the data root (by its whole path before)."""
    tree = project / "tree"
    make_folder_tree(tree, classes=5, per_class=8, size=(64, 64))
    cut = tree / "test" / "test-class2" / "02.png"  # the split tested last
    cut.write_bytes(cut.read_bytes()[:4000])
    result = fslab(*folder_run(tree, "--epochs", "3"), cwd=project, timeout=300)
    assert result.returncode == 1, result.stderr
    (run_dir,) = (project / "runs").iterdir()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and "\n" not in status["error"]
    assert status["error"].startswith(f"cannot decode image test/test-class2/02.png (in the data root {tree}): ")
    assert status["error"].endswith("; replace or remove the file")
    assert not events(run_dir, "train") and not events(run_dir, "checkpoint")  # at its start, not after training


# -- every way a run starts: sweeps, resume ---------------------------------------------------------


def test_a_sweep_with_one_bad_combination_queues_nothing(project):
    refused(project, "sweep", "nca", *SMALL, "--grid", "eval.ways=5,100", "--seeds", "2",
            expect=["'eval.ways' must be at most 40", "got 100"])
    refused(project, "sweep", "nca", *SMALL, "--grid", "loss.temperature=1,0", expect=["loss.temperature", "> 0"])


def test_resume_checks_the_saved_configuration_again(project):
    from fslab.core.config import resolve
    from fslab.core.registry import load_registry
    from fslab.core.runstore import create_run
    from fslab.core.settings import Settings

    config = resolve("nca", registry=load_registry(), settings=Settings(),
                     overrides=[{"device": "cuda:3", "backbone": {"name": "conv4"}}])
    run = create_run(project / "runs", "nca", config)
    run.write_status(state="killed", ended=1.0)
    (run.checkpoint_path).parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(run.checkpoint_path, "w") as archive:  # complete as far as the check reads it
        archive.writestr("checkpoint/data.pkl", b"weights")
    before = (run.path / "status.json").read_text()
    refused(project, "resume", run.id, env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
            expect=["device 'cuda:3'", "needs 4 visible GPUs", "1 is visible"], runs_before=[run.id])
    assert (run.path / "status.json").read_text() == before  # not queued, not touched


# -- a plugin's own check (register(..., check=f)) -------------------------------------------------------

LOCAL_PLUGIN = '''
from fslab.plugin import UsageError, hookimpl


def margin_loss(z, labels, support=None, *, margin: float = 1.0, classes_needed: int = 0):
    raise AssertionError("never trained here")


def check_margin(params, context):
    if not params["margin"] > 0:
        raise UsageError(f"margin: loss.margin must be > 0, got {params['margin']}")
    train = context.split("train")  # None at resolve time, the split's sizes before a run is created
    if train is not None and train.classes < params["classes_needed"]:
        raise UsageError(f"margin: loss.classes_needed={params['classes_needed']} but the training split has "
                         f"{train.classes} classes of at least {train.smallest} images "
                         f"(batch {context.config['train']['batch_size']})")


@hookimpl
def register_losses(register):
    register(margin_loss, name="margin", description="a margin loss", check=check_margin)
'''


@pytest.fixture
def local_plugin(project):
    (project / "mine").mkdir()
    (project / "mine" / "margin.py").write_text(LOCAL_PLUGIN)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    return project


def test_a_plugin_check_runs_at_resolve_time_and_again_with_the_split_sizes(local_plugin):
    refused(local_plugin, "run", "nca", *SMALL, "--set", "loss.name=margin", "--set", "loss.margin=-1",
            expect=["margin: loss.margin must be > 0, got -1.0"])
    refused(local_plugin, "run", "nca", *SMALL, "--set", "loss.name=margin", "--set", "loss.classes_needed=500",
            expect=["loss.classes_needed=500 but the training split has 120 classes of at least 30 images (batch 128)"])


def test_a_check_that_is_no_function_fails_its_plugin_and_a_broken_check_is_one_line(project, monkeypatch):
    from fslab.core.config import resolve
    from fslab.core.errors import PluginError
    from fslab.core.registry import load_registry
    from fslab.core.settings import Settings

    (project / "mine").mkdir()
    (project / "mine" / "notcallable.py").write_text(LOCAL_PLUGIN.replace("check=check_margin", "check=True"))
    registry = load_registry([project / "mine"])
    assert "margin" not in registry.names("loss")
    assert "check= must be a function" in registry.failures[0].error
    (project / "mine" / "notcallable.py").write_text(LOCAL_PLUGIN.replace('params["margin"]', 'params["nope"]'))
    registry = load_registry([project / "mine"])
    with pytest.raises(PluginError, match=r"the check of loss 'margin' from plugin 'local:notcallable' failed: "
                                          r"KeyError: 'nope'"):
        resolve("nca", registry=registry, settings=Settings(), overrides=[{"loss": {"name": "margin"}}])


@pytest.mark.parametrize("toml, expect", [
    ("train = {lr = -1.0}", ["'train.lr' must be > 0 and at most 3.4e38 (float32's largest), got -1.0",
                             "(set by train.lr in [run] of fslab.toml)"]),
    ("eval = {ways = 100}", ["'eval.ways' must be at most 40", "(set by eval.ways in [run] of fslab.toml)"]),
    ("loss = {temperature = 0}", ["loss.temperature must be > 0", "(set by loss.temperature in [run] of fslab.toml)"]),
])
def test_a_bad_value_from_the_project_file_names_the_file(project, toml, expect):
    (project / "fslab.toml").write_text(f"[run]\n{toml}\n")
    refused(project, "run", "nca", *SMALL, expect=expect)
    refused(project, "sweep", "nca", *SMALL, "--seeds", "2", expect=expect)


def test_an_option_that_replaces_the_file_value_is_not_blamed_on_the_file(project):
    (project / "fslab.toml").write_text("[run]\neval = {ways = 100}\n")
    line = refused(project, "run", "nca", *SMALL, "--set", "eval.ways=50", expect=["got 50"])
    assert "fslab.toml" not in line


RAISING_PLUGIN = '''
from fslab.plugin import Batch, hookimpl


class OpensNothing:
    channels = 1

    def __init__(self, root=None, *, size: int = 3):
        raise ValueError("cannot open the index")


class CountsNothing:
    channels = 1

    def __init__(self, root=None, *, size: int = 3):
        pass

    def split_sizes(self):
        raise ValueError("bad row 7")


class Shapeless:
    def __init__(self, labels, batch_size, seed, *, ways: int = 5):
        pass


def rows_of(params, batch_size):
    return params["shots"] * params["ways"]  # a key the sampler does not have


@hookimpl
def register_datasets(register):
    register(OpensNothing, name="opens-nothing", description="d", check_early=True)
    register(CountsNothing, name="counts-nothing", description="d", check_early=True)


@hookimpl
def register_samplers(register):
    register(Shapeless, name="shapeless", description="d", batch=rows_of)
'''


@pytest.mark.parametrize("options, message", [
    (["--dataset", "opens-nothing"],
     "dataset 'opens-nothing' from plugin 'local:raising' failed to build: ValueError: cannot open the index"),
    (["--dataset", "counts-nothing"], "dataset 'counts-nothing': split_sizes() failed: ValueError: bad row 7"),
    (["--set", "sampler.name=shapeless"],
     "the batch= function of sampler 'shapeless' from plugin 'local:raising' failed: KeyError: 'shots'"),
])
def test_a_plugin_that_raises_before_a_run_exists_is_one_line_naming_it(project, options, message):
    """A check_early dataset's constructor or split_sizes(), or a sampler's batch= function, that
    raised printed its traceback from fslab run, as a check= that raises does not."""
    (project / "mine").mkdir()
    (project / "mine" / "raising.py").write_text(RAISING_PLUGIN)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    result = fslab("run", "nca", *SMALL, *options, cwd=project, timeout=120)
    assert result.returncode == 1 and result.stderr == f"error: {message}\n", result.stderr
    assert not (project / "runs").is_dir() or not any((project / "runs").glob("2*"))


# A dataset that reads files (it takes a root) with no check_early: fslab does not build it before the run exists.
LATE_DATASET = '''
import os

from fslab.plugin import hookimpl


class OnDisk:
    channels = 1

    def __init__(self, root):
        if not os.path.isdir(root):
            raise FileNotFoundError(f"no such folder: {root}")


@hookimpl
def register_datasets(register):
    register(OnDisk, name="ondisk", description="reads images from a folder")
'''


def test_a_missing_data_root_of_a_dataset_not_checked_early_is_refused_before_any_run_folder(project):
    """--data-root naming nothing (or a file) for a dataset registered without check_early made the run's folder,
    and the run failed in its worker with the plugin's FileNotFoundError (exit code 1)."""
    (project / "mine").mkdir()
    (project / "mine" / "late.py").write_text(LATE_DATASET)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    (project / "a-file").write_text("")
    for root, what in (("missing", "does not exist"), ("a-file", "is not a folder")):
        result = fslab_here("run", "nca", *SMALL, "--dataset", "ondisk", "--data-root", root, cwd=project)
        assert result.returncode == 2 and result.stderr == (
            f"error: dataset 'ondisk' reads its files from a folder, and its data root {project / root} {what}; "
            f"give the folder with --data-root DIR or [data_roots] ondisk in fslab.toml\n"), result.stderr
    assert not (project / "runs").exists()
    swept = fslab_here("sweep", "nca", *SMALL, "--dataset", "ondisk", "--grid", "train.lr=0.1,0.2", cwd=project)
    assert swept.returncode == 2 and f"its data root {project / 'data' / 'ondisk'} does not exist" in swept.stderr
    assert not (project / "runs").exists() or not any((project / "runs").glob("2*"))


def test_a_device_in_capitals_or_called_gpu_gets_a_hint():
    """--device CPU and --device gpu listed the allowed words with no suggestion."""
    from fslab.core.config import RunConfig
    from fslab.core.errors import ConfigError
    from fslab.core.limits import check_fields

    for given, hint in (("CPU", ". Did you mean 'cpu'?"), ("CUDA:1", ". Did you mean 'cuda:1'?"), ("gpu", "")):
        with pytest.raises(ConfigError) as caught:
            check_fields(RunConfig, {"device": given})
        assert str(caught.value) == (f"config key 'device' must be auto, cpu, cuda (a GPU) or cuda:N, "
                                     f'got "{given}"{hint}')
