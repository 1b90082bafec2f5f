"""The plugin author kit: `fslab new plugin`, and fslab.testing's checks
failing on components that break their contract."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fslab
from fslab.cli import app
from fslab.kit import KINDS

from .runs_helpers import fslab_here

runner = CliRunner()


def test_new_plugin_writes_a_package_with_one_module_per_kind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["new", "plugin", "fslab_margin", "--kind", "loss", "--kind", "evaluator"])
    assert result.exit_code == 0, result.output
    # the next step installs the test extra: pytest is none of fslab's own dependencies ('pytest: command not found')
    next_step = "next: pip install -e './fslab_margin[test]' && (cd fslab_margin && pytest)"
    assert result.output.splitlines()[-1] == next_step
    package = tmp_path / "fslab_margin"
    assert sorted(p.name for p in (package / "fslab_margin").iterdir()) == ["__init__.py", "evaluator.py", "loss.py"]
    pyproject = (package / "pyproject.toml").read_text()
    assert 'fslab_margin_loss = "fslab_margin.loss"' in pyproject and "[project.entry-points.fslab]" in pyproject
    assert 'test = ["pytest>=7"]' in pyproject
    # the least fslab it was written for, as docs/plugins.md's Publishing advises (it named fslab alone)
    assert 'dependencies = ["fslab>=0.1"]' in pyproject and fslab.__version__.startswith("0.1.")
    # the README's Publish lines install what they run: neither build nor twine comes with fslab
    publish = (package / "README.md").read_text().split("## Publish")[1].split()
    assert publish[:6] == ["python", "-m", "pip", "install", "build", "twine"], publish
    tests = (package / "tests" / "test_contracts.py").read_text()
    assert "plugins = ['fslab_margin_loss', 'fslab_margin_evaluator']" in tests
    for path in package.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")


def test_the_generated_sampler_check_leaves_to_its_constructor_what_fslab_create_cannot_tell(tmp_path, monkeypatch):
    """fslab.create runs check= with no run (context None): the sampler the kit writes then
    leaves the batch's shape to its constructor, which checks it against the batch_size it is given."""
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["new", "plugin", "fslab_balanced", "--kind", "sampler"]).exit_code == 0
    monkeypatch.syspath_prepend(str(tmp_path / "fslab_balanced"))
    from fslab_balanced import sampler

    from fslab.plugin import UsageError

    sampler.check({"per_class": 3}, None)
    # its messages name the sampler, as the built-ins' do (they said "sampler:", whichever sampler it was)
    with pytest.raises(UsageError,
                       match="^fslab-balanced: train.batch_size 8 is not a multiple of sampler.per_class 3"):
        sampler.check({"per_class": 3}, None, 8)


def test_the_generated_dataset_reads_no_files_so_its_runs_get_no_data_root(tmp_path, monkeypatch):
    """It named root=None and ignored it, so fslab took it for a dataset that reads files: its runs were
    filled in data/NAME and fslab show named that folder, which nothing had made, as the run's data root."""
    from fslab.core.config import resolve
    from fslab.core.registry import load_registry
    from fslab.core.settings import Settings

    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["new", "plugin", "fslab_patterns", "--kind", "dataset"]).exit_code == 0
    registry = load_registry([tmp_path / "fslab_patterns" / "fslab_patterns"])
    assert not registry.failures and not registry.reads_files("fslab-patterns")
    config = resolve("nca", registry=registry, settings=Settings(), overrides=[{"dataset": {"name": "fslab-patterns"}}])
    assert not config["dataset"]["root"], config["dataset"]  # none filled in (old: TMP/data/fslab-patterns)
    assert len(registry.create("dataset", "fslab-patterns", root=str(tmp_path)).load("val").labels) == 100


def test_the_generated_sampler_counts_images_and_classes_in_words(tmp_path, monkeypatch):
    """Its messages said "512 classes with 1 images each" (sampler.per_class=1); they count through
    fslab.plugin's count, as fslab's own messages do."""
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["new", "plugin", "fslab_counted", "--kind", "sampler"]).exit_code == 0
    monkeypatch.syspath_prepend(str(tmp_path / "fslab_counted"))
    from fslab_counted import sampler

    from fslab.core.types import CheckContext, SplitSizes
    from fslab.plugin import UsageError

    context = CheckContext({"train": {"batch_size": 512}}, {"train": SplitSizes((2, 2, 2))})
    with pytest.raises(UsageError, match=r"^fslab-counted: train.batch_size 512 needs 512 classes with 1 image each, "
                                         r"the training set has 3; lower train.batch_size$"):
        sampler.check({"per_class": 1}, context)
    with pytest.raises(UsageError, match=r"^fslab-counted: a batch needs 1 class with 4 images each, "
                                         r"the training set has 0$"):
        sampler.ClassBalancedSampler([0, 0, 1], 4, seed=0, per_class=4)


@pytest.mark.parametrize("argv, message", [
    (["new", "plugin", "Bad-Name"], "is not a valid package name"),
    # the example is the name as a package name would spell it (it was fslab_margin, whatever the name)
    (["new", "plugin", "My-Loss"], "'My-Loss' is not a valid package name: use lowercase letters, digits and _, "
                                   "starting with a letter (e.g. my_loss)"),
    (["new", "plugin", "2loss"], "starting with a letter (e.g. fslab_2loss)"),
    (["new", "plugin", "Torch"], "starting with a letter (e.g. fslab_torch)"),  # not torch, which is taken
    (["new", "plugin", "Café"], "starting with a letter (e.g. cafe)"),
    # its distribution 'fslab-margin-' failed pip install: a name ending in - is no PEP 508 name
    (["new", "plugin", "fslab_margin_"], "'fslab_margin_' is not a valid package name: its distribution would be "
                                         "named 'fslab-margin-', and pip refuses a name ending in -; end it with a "
                                         "letter or digit (e.g. fslab_margin)"),
    # its README's `fslab run nca --set loss.name=nan` read a number, not the loss 'nan'
    (["new", "plugin", "nan"], "'nan' cannot name a plugin's components: --set loss.name=nan reads it as a TOML "
                               "number, not a name; choose another (e.g. fslab_nan)"),
    (["new", "plugin", "true"], "reads it as a TOML boolean"),
    (["new", "plugin", "NaN"], "starting with a letter (e.g. fslab_nan)"),
    (["new", "plugin", "class"], "'class' is not a valid package name: it is a Python keyword; choose another "
                                 "(e.g. fslab_class)"),
    # a link to nothing: it said 'error: File exists: gone' and exited 1
    (["new", "plugin", "gone"], "gone already exists; choose another name or remove it"),
    (["new", "plugin", "ok", "--kind", "los"], "Did you mean 'loss'?"),
    # the kind where the command is: "No such command 'loss'", which named neither the command nor --kind
    (["new", "loss", "ok"], "fslab new takes the kind as an option: fslab new plugin ok --kind loss writes a plugin "
                            "package with a loss (see fslab new plugin --help)"),
    (["new", "sampler"], "fslab new plugin NAME --kind sampler"),
    (["new", "plugin", "taken"], "already exists"),
    # a package named after fslab, torch or the standard library's test would hide it once installed
    (["new", "plugin", "fslab"], "'fslab' is already the name of an importable module"),
    (["new", "plugin", "torch"], "choose another (e.g. fslab_torch)"),
    (["new", "plugin", "test"], "'test' is already the name of an importable module"),
    # Pillow's module is PIL: `pip install -e ./pillow` uninstalled Pillow, which fslab needs, for the plugin
    (["new", "plugin", "pillow"], "'pillow' would be installed as the distribution 'pillow', the name of the "
                                  "installed "),
    # installed beside the built-in, its loss 'protonet' made every fslab command fail (registered twice)
    (["new", "plugin", "protonet"], "'protonet' would register the loss 'protonet', which plugin 'protonet' "
                                    "registers already; installed beside it, every fslab command would fail on the "
                                    "name: choose another (e.g. fslab_protonet)"),
    (["new", "plugin", "fslab_knn", "--kind", "loss", "--kind", "evaluator"], "evaluator 'fslab-knn'"),
    # 'error: File name too long' and exit 1, a system's refusal of what was a bad name
    (["new", "plugin", "a" + "b" * 300], "'a" + "b" * 39 + "...' is 301 characters long; a package name may have "
                                         "at most 100: choose a shorter one"),
])
def test_new_plugin_refuses_in_one_line(tmp_path, argv, message):
    (tmp_path / "taken").mkdir()
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "mine").mkdir()  # a project's own plugin folder counts too
    (tmp_path / "mine" / "knn.py").write_text(
        "from fslab.plugin import hookimpl\n\ndef knn(support, query):\n    return None\n\n@hookimpl\n"
        "def register_evaluators(register):\n    register(knn, name='fslab-knn', description='local')\n")
    (tmp_path / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    result = fslab_here(*argv, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not any((tmp_path / name).exists() for name in ("ok", "nowhere", "protonet", "fslab_knn", "fslab_margin_"))


@pytest.mark.parametrize("toml, env", [
    # a broken fslab.toml failed the registry's loading, and the check of the names was skipped
    ("[project\nplugin_dirs = ", {}),
    # FSLAB_PLUGINS left the other built-ins out of the check; installed, the package met them once it was unset
    ("", {"FSLAB_PLUGINS": "nca"}),
])
def test_new_plugin_checks_every_installed_name(tmp_path, toml, env):
    """`fslab new plugin protonet` wrote a package whose loss 'protonet', installed, failed every fslab command."""
    (tmp_path / "fslab.toml").write_text(toml)
    result = fslab_here("new", "plugin", "protonet", cwd=tmp_path, env={**os.environ, **env})
    taken = "error: 'protonet' would register the loss 'protonet', which plugin 'protonet' registers already"
    assert result.returncode == 2 and result.stderr.startswith(taken), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "protonet").exists()


BROKEN = '''
import torch
from fslab.plugin import LossOutput, UsageError, hookimpl

def detached(z, labels, support=None, *, margin: float = 1.0):
    loss = z[:1].pow(2).sum()           # only the first row gets a gradient
    return LossOutput(loss, 10_000, 0)  # more positives than the batch has pairs

def clumsy(support, query, *, k: int = 1):
    return torch.zeros(query.shape[:2], dtype=torch.long)  # always way 0

class Lazy:
    def __init__(self, in_channels, *, width: int = 8):
        self.out_dim = width

def per_row(z, labels, support=None):
    return LossOutput(z.pow(2).sum(dim=1), 0, 0)  # one loss per row: never reduced over the batch

def bare(z, labels, support=None):
    return z.pow(2).sum()  # no LossOutput

def split(z, labels, support=None):
    return LossOutput(z[support].pow(2).mean() + z[~support].pow(2).mean(), 0, 0)  # needs support, not episodic

def hard(z, labels, support=None):
    return LossOutput(z.argmax(dim=1).float().mean(), 0, 0)  # argmax has no gradient

class Forgetful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.0))
        self.measured = False  # not in the state_dict: a resumed run measures the scale again

    def forward(self, z, labels, support=None):
        if not self.measured:
            with torch.no_grad():
                self.scale.copy_(z.norm(dim=1).mean())
            self.measured = True
        return LossOutput((z / self.scale).pow(2).mean(), 0, 0)

def renumbering(z, labels, support=None):  # the batch's classes taken as 0..ways-1: a run's labels index past them
    ways = int(labels.unique().numel())
    centres = torch.zeros(ways, z.shape[1]).index_add(0, labels, z)
    return LossOutput(torch.nn.functional.cross_entropy(-torch.cdist(z, centres), labels), 0, 0)


class Scaled:
    def __init__(self, in_channels, *, scale: float = 1.0):
        self.out_dim = 8

class Whole:
    def __init__(self, in_channels, *, scale: float = 1):  # a float whose default is an int
        self.out_dim = 8

@hookimpl
def register_losses(register):
    register(detached, name="detached", description="broken")
    register(renumbering, name="renumbering", description="broken")
    register(per_row, name="per-row", description="broken")
    register(bare, name="bare", description="broken")
    register(hard, name="hard", description="broken")
    register(split, name="split", description="broken")
    register(Forgetful, name="forgetful", description="broken")
    register(noted, name="noted", description="broken")

def raising(support, query):
    raise RuntimeError("a bug in the plugin")

def flat(support, query):
    return torch.zeros(query.shape[0], dtype=torch.long)  # one way per episode, not per query

def listed(support, query):
    return torch.zeros(query.shape[:2], dtype=torch.long).tolist()  # the right ways, as a list

def first_only(support, query):  # written for one episode: the first one's predictions for every episode
    centres = support[:1].mean(dim=2)
    return torch.cdist(query[:1], centres).argmin(dim=-1).expand(query.shape[0], -1)

def by_position(support, query):  # queries come way by way: the right ways without a look at the features
    ways = support.shape[1]
    return torch.arange(ways).repeat_interleave(query.shape[1] // ways).expand(query.shape[0], -1)

@hookimpl
def register_evaluators(register):
    register(clumsy, name="clumsy", description="broken")
    register(first_only, name="first-only", description="broken")
    register(by_position, name="by-position", description="broken")
    register(listed, name="listed", description="broken")
    register(raising, name="raising", description="broken")
    register(flat, name="flat", description="broken")

class FloatImages:
    channels = 1

    def __init__(self, root=None):
        pass

    def load(self, split):
        from fslab.plugin import Split

        labels = torch.arange(8).repeat_interleave(10)
        return Split(torch.rand(80, 1, 16, 16), labels, [str(c) for c in range(8)])  # floats in [0, 1]

class Channelless:  # no channels: the run failed with Python's AttributeError, naming no plugin
    def __init__(self, root=None):
        pass

    def load(self, split):
        from fslab.plugin import Split

        labels = torch.arange(8).repeat_interleave(10)
        return Split(torch.zeros(80, 1, 16, 16, dtype=torch.uint8), labels, [str(c) for c in range(8)])

class TrainOnly(FloatImages):
    def load(self, split):
        from fslab.plugin import Split

        labels = torch.arange(8).repeat_interleave(10)
        train = Split(torch.zeros(80, 1, 16, 16, dtype=torch.uint8), labels, [str(c) for c in range(8)])
        return {"train": train}[split]

class FromOne(FloatImages):
    def load(self, split):
        from fslab.plugin import Split

        labels = torch.arange(-1, 7).repeat_interleave(10)  # numbered from -1
        return Split(torch.zeros(80, 1, 16, 16, dtype=torch.uint8), labels, [str(c) for c in range(8)])

class SaysColour(TrainOnly):  # grayscale images
    channels = 3

@hookimpl
def register_datasets(register):
    register(FloatImages, name="float-images", description="broken",
             defaults={"train": {"batch_size": 16, "crop_padding": 0}})
    register(TrainOnly, name="train-only", description="broken")
    register(Channelless, name="channelless", description="broken")
    register(FromOne, name="from-one", description="broken")
    register(SaysColour, name="says-colour", description="broken")

class Lists:
    def __init__(self, labels, batch_size, seed):
        self.count, self.batch_size = len(labels), batch_size

    def __len__(self):
        return 2

    def batches(self, epoch):
        for start in (0, self.batch_size):
            yield list(range(start, start + self.batch_size))  # indices, not Batch(indices)

class Wrapping(Lists):
    def batches(self, epoch):
        from fslab.plugin import Batch

        for start in (0, self.batch_size):
            yield Batch([-1, *range(start + 1, start + self.batch_size)])  # -1 read the last image, in silence

def noted(z, labels, support=None):
    return LossOutput(z.pow(2).mean(), 0, 0, [1, 2])  # extra a list, not a dict of counters

class Empty(Lists):
    def __len__(self):
        return 0  # no batch per epoch (fewer images than a batch): the run trained no step

    def batches(self, epoch):
        return iter(())

class Unseeded:
    def __init__(self, labels, batch_size, seed):
        self.count, self.batch_size = len(labels), batch_size  # the seed is never used

    def __len__(self):
        return 2

    def batches(self, epoch):
        from fslab.plugin import Batch

        order = torch.randperm(self.count, generator=torch.Generator().manual_seed(epoch)).tolist()
        for start in (0, self.batch_size):
            yield Batch(order[start:start + self.batch_size], None)

@hookimpl
def register_samplers(register):
    register(Lists, name="lists", description="broken")
    register(Unseeded, name="unseeded", description="broken")
    register(Wrapping, name="wrapping", description="broken")
    register(Empty, name="empty", description="broken")

class Fixed(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.out_dim = 8
        self.layer = torch.nn.Linear(in_channels * 84 * 84, 8)  # sized for 84x84 images, whatever the dataset's

    def forward(self, x):
        return self.layer(x.flatten(1))

class Counting(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.out_dim = 8
        self.layer = torch.nn.Linear(in_channels, 8)
        self.steps = 0  # not in the state_dict: a resumed run starts the drop schedule again

    def forward(self, x):
        if self.training:
            self.steps += 1
            x = torch.nn.functional.dropout(x, p=min(0.5, 0.1 * self.steps))
        return self.layer(x.mean(dim=(2, 3)))

class Colour(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.out_dim = 8
        self.conv = torch.nn.Conv2d(3, 8, 3)  # three channels, whatever in_channels says

    def forward(self, x):
        return self.conv(x).mean(dim=(2, 3))

class ColourOnly(Colour):
    def __init__(self, in_channels):
        if in_channels != 3:  # refused in one line, as a run then says: not broken
            raise UsageError(f"colour-only takes colour images, not {in_channels} channel(s)")
        super().__init__(in_channels)

@hookimpl
def register_backbones(register):
    register("fslab_local_plugins.broken:Lazy", name="lazy", description="declares another default",
             params={"width": 16})
    register("fslab_local_plugins.broken:Scaled", name="scaled", description="declares 1 for 1.0",
             params={"scale": 1})
    # known only when the lazy target is imported: a plugin's loading refuses the same of a target it has
    register("fslab_local_plugins.broken:Whole", name="whole", description="an int default for a float",
             params={"scale": 1})
    register(Colour, name="colour", description="broken")
    register(ColourOnly, name="colour-only", description="colour images only")
    register(Fixed, name="fixed", description="broken")
    register(Counting, name="counting", description="broken")
'''


@pytest.fixture
def broken(tmp_path, builtin_plugins):
    from fslab.core.registry import load_registry

    (tmp_path / "broken.py").write_text(BROKEN)
    return load_registry([tmp_path])


def test_the_checks_catch_what_breaks_a_contract(broken):
    from fslab.testing.checks import (
        check_backbone,
        check_dataset,
        check_evaluator,
        check_loss,
        check_parameters,
        check_sampler,
    )

    with pytest.raises(AssertionError, match="detached: positives = 10000, outside 0..60"):
        check_loss(broken, "detached")
    with pytest.raises(AssertionError, match="clumsy: 0.3. accuracy on well-separated classes"):
        check_evaluator(broken, "clumsy")
    with pytest.raises(AssertionError, match=r"declares params \{'width': 16\}.*are \{'width': 8\}"):
        check_parameters(broken, "backbone", "lazy")
    # a loss that returns no LossOutput was an AttributeError from inside the check
    with pytest.raises(AssertionError, match="bare: returned a Tensor, not LossOutput"):
        check_loss(broken, "bare")
    with pytest.raises(AssertionError, match=r"per-row: the loss is not a 0-d tensor \(shape \[24\]; reduce it"):
        check_loss(broken, "per-row")
    # a loss with no gradient was PyTorch's RuntimeError on backward, naming no loss
    with pytest.raises(AssertionError, match=r"hard: the loss has no gradient; compute it from z with differentiable"):
        check_loss(broken, "hard")
    # a loss that needs support marks but does not say so was its own TypeError, naming no loss or cause
    with pytest.raises(AssertionError, match=r"^split: raised TypeError: .* when called with support=None, as a "
                                             r"sampler that marks no support rows calls it; a loss that needs the "
                                             r"marks registers with episodic=True$"):
        check_loss(broken, "split")
    # a loss that took the batch's classes for 0..ways-1 passed (the checks' batch was of classes 0..3), and every
    # run of it failed at its first step (index 112 is out of bounds for dimension 0 with size 80)
    with pytest.raises(AssertionError, match=r"^renumbering: raised RuntimeError: .* on a batch of classes 9, 2, 6, 4 "
                                             r"of 10, and not with them renumbered 0..3; a run passes the training "
                                             r"split's class numbers, the same in every batch, not renumbered"):
        check_loss(broken, "renumbering")
    # a loss measuring its scale on the first batch into an attribute passed, and a resumed run measured it again
    with pytest.raises(AssertionError, match=r"^forgetful: a copy given its state_dict after one batch computes .* "
                                             r"on the next batch, the loss itself .*; a resumed run restores the "
                                             r"loss from its state_dict, so keep what it measures"):
        check_loss(broken, "forgetful")
    # a backbone counting its training steps in an attribute passed, and a resumed run counted from 0 again
    with pytest.raises(AssertionError, match=r"^counting: a copy given its state_dict after a training batch computes "
                                             r"other features on the next one; a resumed run restores the backbone"):
        check_backbone(broken, "counting")
    # a sampler that drew from the epoch alone passed, and every seed of a sweep trained on the same batches
    with pytest.raises(AssertionError, match=r"^unseeded: seeds 0 and 1 give the same batches; draw them"):
        check_sampler(broken, "unseeded")
    # a backbone that took three channels whatever in_channels said passed (checked on colour images only), and every
    # run of it on omniglot failed before training
    with pytest.raises(AssertionError, match=r"^colour: built with in_channels=1, raised RuntimeError: .* on images of "
                                             r"1 channel\(s\); size the first layer by in_channels"):
        check_backbone(broken, "colour")
    check_backbone(broken, "colour-only")  # one that refuses grayscale images as it is built says so to a run
    # a sampler that yields bare indices was an AttributeError ('list' object has no attribute 'indices')
    with pytest.raises(AssertionError, match=r"lists: batches\(epoch\) yielded a list, not Batch\(indices, support\)"):
        check_sampler(broken, "lists")
    # a dataset without a split was the dataset's own KeyError: 'val', naming neither it nor the split
    with pytest.raises(AssertionError, match=r"train-only: load\('val'\) raised KeyError: 'val'; a dataset gives "
                                             r"each of the splits 'train', 'val' and 'test'"):
        check_dataset(broken, "train-only", {"root": None})
    # torch.bincount's RuntimeError (bincount only supports 1-d non-negative integral inputs), naming no dataset
    with pytest.raises(AssertionError, match=r"^from-one: train labels include -1; they number its classes "
                                             r"0..classes-1"):
        check_dataset(broken, "from-one", {"root": None})
    # AttributeError: 'list' object has no attribute 'shape'; and an evaluator's error named no evaluator
    with pytest.raises(AssertionError, match="^evaluator 'listed' returned a list, not a tensor$"):
        check_evaluator(broken, "listed")
    with pytest.raises(AssertionError, match="^evaluator 'raising' failed: RuntimeError: a bug in the plugin$"):
        check_evaluator(broken, "raising")
    # both scored 1.0 on the well-separated features and passed; in a run, one reported the first episode's score
    # for every episode (a CI of 0), the other 100% whatever the network
    with pytest.raises(AssertionError, match=r"^first-only: the 20 episodes of features without class structure all "
                                             r"score 0\.\d\d; score each of the E episodes"):
        check_evaluator(broken, "first-only")
    with pytest.raises(AssertionError, match=r"^by-position: 1\.00 accuracy on features without class structure "
                                             r"\(chance: 0\.33\); predict from the features"):
        check_evaluator(broken, "by-position")
    # AttributeError: 'list' object has no attribute 'items', from inside the check; a run failed on it too
    with pytest.raises(AssertionError, match=r"^noted: returned LossOutput extra=\[1, 2\], not a dict of counters"):
        check_loss(broken, "noted")
    check_evaluator(broken, "centroid")  # the built-in keeps them all
    check_parameters(broken, "loss", "detached")


def test_the_parameter_check_catches_a_default_of_another_type_than_the_parameter(broken):
    from fslab.testing.checks import check_parameters

    # both passed: a run takes a value of the default's type, so --set loss.margin=0.5 was refused as no integer
    with pytest.raises(AssertionError, match=re.escape(
            "backbone whole: parameter 'scale' is annotated float but its default 1 is int, and a run takes only "
            "values of its default's type (--set backbone.scale=0.5 is refused): give it a default of type float, "
            "scale: float = 1.0")):
        check_parameters(broken, "backbone", "whole")
    with pytest.raises(AssertionError, match=re.escape(
            "backbone scaled: register() declares params {'scale': 1}, the keyword-only parameters of "
            "'fslab_local_plugins.broken:Scaled' are {'scale': 1.0}")):
        check_parameters(broken, "backbone", "scaled")


BROKEN_SINKS = '''
import json
import os
from pathlib import Path

from fslab.plugin import hookimpl


class Tidy:
    def __init__(self, run):
        self.run, self.path = run, Path(run.path) / "tidy.jsonl"
        self.new = self.path.with_suffix(".new") if run.replay else None  # in place of the old at close()
        self.file = open(self.new or self.path, "w" if run.replay else "a")

    def write(self, event):
        self.file.write(json.dumps(event) + "\\n")

    def close(self):
        self.file.close()
        if self.new and not self.run.cut_short:
            os.replace(self.new, self.path)


class Strips(Tidy):
    def write(self, event):
        event.pop("time", None)  # every other sink of the run gets this dict too


class Scatters(Tidy):
    def __init__(self, run):
        super().__init__(run)
        self.file.close()
        self.file = open("events.jsonl", "a")  # the current directory, wherever the worker runs


class Tramples(Tidy):
    def __init__(self, run):
        super().__init__(run)
        self.file.close()
        self.file = open(Path(run.path) / "metrics.jsonl", "a")  # the run's own record


class Truncates(Tidy):
    def __init__(self, run):
        super().__init__(run)
        if run.replay:  # an export opens the file anew: one cut short loses the earlier export's
            self.file.close()
            self.new, self.file = None, open(self.path, "w")


class Repeats(Tidy):
    def __init__(self, run):
        super().__init__(run)
        if run.replay:  # an export adds to the earlier one's file: one cut short writes its first rows twice
            self.file.close()
            self.new, self.file = None, open(self.path, "a")


class Logs(Tidy):
    def __init__(self, run):
        super().__init__(run)
        self.log("opened")  # a log of its own, added to at every open: the same line, from the same process

    def log(self, line):
        with open(Path(self.run.path) / "tidy.log", "a") as log:
            log.write(f"{line} by pid {os.getpid()}\\n")

    def close(self):
        super().close()
        self.log("closed, cut short" if self.run.cut_short else "closed")


class Breaks(Tidy):
    def write(self, event):
        if event["event"] == "eval":
            raise ConnectionError("tracker unreachable")


class Forgets(Tidy):
    def __init__(self, run):
        super().__init__(run)
        if run.replay:
            raise RuntimeError("exports were never tried")


class Spills(Tidy):
    @classmethod
    def reopen(cls, run):  # fslab eval's scores written straight into the record: one cut short keeps its part
        added = cls.__new__(cls)
        added.run, added.path, added.new = run, Path(run.path) / "tidy.jsonl", None
        added.file = open(added.path, "a")
        return added


@hookimpl
def register_sinks(register):
    for sink in (Tidy, Strips, Scatters, Tramples, Breaks, Forgets, Truncates, Repeats, Logs, Spills):
        register(sink, name=sink.__name__.lower(), description="a sink")
'''


@pytest.mark.parametrize("name, message", [
    ("strips", "sink strips changed the events it was given"),
    ("scatters", "sink scatters wrote into the current directory: events.jsonl"),
    ("tramples", "sink tramples changed the run's metrics.jsonl"),
    ("breaks", "sink breaks, fed a live run: sink 'breaks' from plugin 'local:sinks' failed on an eval event: "
               "ConnectionError: tracker unreachable; the run goes on without it"),
    ("forgets", "exports were never tried"),
    ("truncates", "sink truncates: an export cut short (run.cut_short at close()) did not keep the earlier "
                  "export's record: project/runs/20260101-000000-nca-c0de/tidy.jsonl was changed or removed; "
                  "export into new files that take the old ones' place at close() unless run.cut_short"),
    ("repeats", "sink repeats: an export cut short (run.cut_short at close()) wrote records of the earlier export "
                "again: project/runs/20260101-000000-nca-c0de/tidy.jsonl gained more lines from half of the run's "
                "events than from none"),
    ("spills", "sink spills: an addition cut short (reopen, run.cut_short at close()) did not leave the record as "
               "it was: project/runs/20260101-000000-nca-c0de/tidy.jsonl; write what you add into new files"),
])
def test_the_sink_check_catches_what_breaks_its_contract(tmp_path, builtin_plugins, monkeypatch, name, message):
    from fslab.core.registry import load_registry
    from fslab.testing.checks import check_sink

    (tmp_path / "sinks.py").write_text(BROKEN_SINKS)
    registry = load_registry([tmp_path])
    monkeypatch.chdir(tmp_path)
    with pytest.raises((AssertionError, RuntimeError), match=re.escape(message)):
        check_sink(registry, name, {}, tmp_path / name)
    check_sink(registry, "tidy", {}, tmp_path / "tidy")
    assert os.getcwd() == str(tmp_path)  # the check went back where it was


def test_the_sink_check_passes_a_sink_that_adds_to_a_log_of_its_own_at_every_export(tmp_path, builtin_plugins,
                                                                                      monkeypatch):
    """The check of an export cut short took any file it added to for an earlier record changed, so a sink
    that keeps a log of its own (a line at each open and close) failed it, keeping its records as it should;
    one whose export adds the run's rows to the earlier ones fails it still (above, `repeats`)."""
    from fslab.core.registry import load_registry
    from fslab.testing.checks import check_sink

    (tmp_path / "sinks.py").write_text(BROKEN_SINKS)
    registry = load_registry([tmp_path])
    monkeypatch.chdir(tmp_path)
    check_sink(registry, "logs", {}, tmp_path / "logs")
    log = (tmp_path / "logs" / "project" / "runs" / "20260101-000000-nca-c0de" / "tidy.log").read_text()
    assert log.count("opened") == 5 and log.count("closed, cut short") == 2  # live, 2 whole exports, 2 cut short


def test_the_generated_csv_sink_passes_the_sink_check_export_cut_short_included(tmp_path, builtin_plugins):
    """The check never cut an export short, so a sink that lost its earlier record then passed it."""
    import shutil

    from fslab.core.registry import load_registry
    from fslab.kit import write_plugin
    from fslab.testing.checks import check_sink

    write_plugin(tmp_path / "pkg", "fslab_rows", ["sink"])
    (tmp_path / "local").mkdir()
    shutil.copy(tmp_path / "pkg" / "fslab_rows" / "sink.py", tmp_path / "local" / "rows.py")
    registry = load_registry([tmp_path / "local"])
    (name,) = [n for n in registry.names("sink") if "rows" in n]
    check_sink(registry, name, {}, tmp_path / "check")
    assert (tmp_path / "check" / "project" / "runs" / "20260101-000000-nca-c0de" / f"{name}.csv").is_file()


def test_sink_check_feeds_events_shaped_as_a_run_logs_them():
    from fslab.core import schemas
    from fslab.testing.checks import sink_events

    events = sink_events(epochs=2, steps=3)
    assert all(schemas.event(e) is e for e in events)
    assert [e["event"] for e in events] == ["start", *["train"] * 3, "eval", "checkpoint", *["train"] * 3, "eval",
                                            "checkpoint", "eval", "eval", "end"]
    assert [e["step"] for e in events if e["event"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert events[-1]["results"] == {f"{e['shots']}-shot": {"accuracy": e["accuracy"], "ci95": e["ci95"]}
                                     for e in events if e["event"] == "eval" and e["split"] == "test"}


def _csv_sink(tmp_path):
    """The sink module `fslab new plugin --kind sink` writes, imported from the generated package."""
    import importlib.util

    from fslab.kit import write_plugin

    write_plugin(tmp_path / "pkg", "fslab_rows", ["sink"])
    spec = importlib.util.spec_from_file_location("fslab_rows_sink", tmp_path / "pkg" / "fslab_rows" / "sink.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CsvSink


def test_the_generated_recipe_says_what_it_trains(tmp_path):
    """Its description said "the components of this package" where the package has none of the kind: a
    recipe package alone trains fslab's nca, iid and centroid."""
    import importlib.util

    from fslab.kit import write_plugin

    write_plugin(tmp_path / "pkg", "fslab_recipe", ["method", "backbone"])
    path = tmp_path / "pkg" / "fslab_recipe" / "method.py"
    spec = importlib.util.spec_from_file_location("fslab_recipe_method", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registered = []
    module.register_methods(lambda target, **info: registered.append((target, info)))
    ((recipe, info),) = registered
    assert recipe == {"loss": {"name": "nca"}, "sampler": {"name": "iid"}, "evaluator": {"name": "centroid"},
                      "backbone": {"name": "fslab-recipe"}}
    assert info == {"name": "fslab-recipe", "description": "loss nca, sampler iid, evaluator centroid, "
                                                           "backbone fslab-recipe"}


def _rows_expected(events) -> list[list[str]]:
    """The CSV rows of ``events``, computed apart from the sink."""
    rows = []
    for e in events:
        if e["event"] == "train":
            rows += [[str(e["step"]), str(e["epoch"]), f"train/{k}", str(e[k])]
                     for k in ("loss", "positives", "negatives", "lr", "images_per_s", "rows_without_positive")]
        elif e["event"] == "eval":
            name = f"{e['split']}/{e['ways']}way_{e['shots']}shot"
            at = [str(e["step"]), str(e.get("epoch", ""))]  # a test evaluation has no epoch
            rows += [[*at, f"{name}/accuracy", str(e["accuracy"])], [*at, f"{name}/ci95", str(e["ci95"])]]
        elif e["event"] == "checkpoint":  # where a resume cuts the file back to
            rows.append([str(e["step"]), str(e["epoch"]), "checkpoint", str(e["epoch"])])
    return rows


def test_the_generated_csv_sink_keeps_one_row_per_number_through_resume_and_export(tmp_path):
    import csv

    from fslab.core.types import SinkRun
    from fslab.testing.checks import sink_events

    CsvSink = _csv_sink(tmp_path)
    run_path = tmp_path / "run"
    run_path.mkdir()
    events = sink_events(epochs=3, steps=2)
    checkpoint = [i for i, e in enumerate(events) if e["event"] == "checkpoint"][0]  # after epoch 1, step 2

    def feed(run, stream):
        sink = CsvSink(run)
        for event in stream:
            sink.write(event)
        sink.close()

    def rows():
        with open(run_path / "fslab-rows.csv", newline="") as file:
            table = list(csv.reader(file))
        assert table[0] == ["step", "epoch", "name", "value"]
        return table[1:]

    # a live run killed during epoch 2 (one step past its checkpoint), then resumed from that checkpoint
    feed(SinkRun("r", run_path, {}), events[:checkpoint + 2])
    assert rows() == _rows_expected(events[:checkpoint + 2])
    resume = {"event": "resume", "time": 0.0, "epoch": 1, "step": events[checkpoint]["step"]}
    feed(SinkRun("r", run_path, {}), [resume, *events[checkpoint + 1:]])
    assert rows() == _rows_expected(events)
    feed(SinkRun("r", run_path, {}, replay=True, state="completed"), events)
    feed(SinkRun("r", run_path, {}, replay=True, state="completed"), events)
    assert rows() == _rows_expected(events)


def test_the_generated_csv_sink_keeps_its_earlier_file_where_an_export_is_cut_short(tmp_path):
    """An export opened the file anew as it began, so one cut short (an error, a Ctrl-C between two events:
    run.cut_short at close) left the rows up to there in place of the whole run's, where fslab's own sinks
    keep their earlier record (README, Sinks)."""
    from fslab.core.types import SinkRun
    from fslab.testing.checks import sink_events

    CsvSink = _csv_sink(tmp_path)
    run_path = tmp_path / "run"
    run_path.mkdir()
    events = sink_events(epochs=2, steps=2)
    whole = CsvSink(SinkRun("r", run_path, {}, replay=True, state="completed"))
    for event in events:
        whole.write(event)
    whole.close()
    before = (run_path / "fslab-rows.csv").read_text()
    run = SinkRun("r", run_path, {}, replay=True, state="completed")
    cut = CsvSink(run)
    for event in events[:3]:
        cut.write(event)
    run.cut_short = True  # as fslab.core.sinks.replay marks it before it closes the sink
    cut.close()
    assert (run_path / "fslab-rows.csv").read_text() == before
    assert sorted(p.name for p in run_path.iterdir()) == ["fslab-rows.csv"]


def test_the_generated_csv_sink_after_a_test_cut_short_a_start_again_and_a_file_left_empty(tmp_path):
    """A run stopped during its test, after its last checkpoint, then resumed: the resumed worker tests again
    at the checkpoint's step, and the CSV kept the first test's rows (no later than that step) beside the new
    ones, each twice, where metrics.jsonl was cut back to the checkpoint. A run killed at once left the file
    empty (its header still buffered) and the run queued again wrote rows under no header; one stopped before
    its first checkpoint and queued again kept the earlier start's rows, each step twice."""
    import csv

    from fslab.core.types import SinkRun
    from fslab.testing.checks import sink_events

    CsvSink = _csv_sink(tmp_path)
    run_path = tmp_path / "run"
    run_path.mkdir()
    path = run_path / "fslab-rows.csv"
    events = sink_events(epochs=2, steps=2)
    last = [i for i, e in enumerate(events) if e["event"] == "checkpoint"][-1]

    def feed(stream):
        sink = CsvSink(SinkRun("r", run_path, {"evaluator": {"name": "centroid"}}))
        for event in stream:
            sink.write(event)
        sink.close()

    def rows():
        with open(path, newline="") as file:
            table = list(csv.reader(file))
        assert table[0] == ["step", "epoch", "name", "value"]
        return table[1:]

    # stopped during the test (its 1-shot scores logged), scored by fslab eval, then resumed from epoch 2
    feed(events[:last + 2])
    scored = {"event": "eval", "time": 0.0, "split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 20,
              "evaluator": "centroid", "metric": "accuracy", "accuracy": 0.6, "ci95": 0.01, "epoch": 2,
              "source": "fslab eval"}
    feed([scored])
    resume = {"event": "resume", "time": 0.0, "epoch": 2, "step": events[last]["step"]}
    feed([events[0], resume, *events[last + 1:]])
    kept = [["0", "2", "eval/test/5way_5shot/centroid/15q_20ep/accuracy", "0.6"],
            ["0", "2", "eval/test/5way_5shot/centroid/15q_20ep/ci95", "0.01"]]
    named = [(row[0], row[2]) for row in rows()]
    assert len(named) == len(set(named))  # each number once: the 1-shot test's was there twice
    assert rows() == _rows_expected(events[:last + 1]) + kept + _rows_expected(events[last + 1:])

    # killed right after its start: an empty file; the run queued again starts from step 0
    path.write_text("")
    feed(events)
    assert rows() == _rows_expected(events)
    # stopped in its first epoch (two steps logged, a third torn), queued again: that start's rows go
    path.write_text("")
    feed(events[:3])
    with open(path, "a") as file:
        file.write("3,1,train/lo")
    feed(events)
    assert rows() == _rows_expected(events)


def test_the_generated_csv_sink_keeps_other_evaluations_apart_from_the_runs_own_test(tmp_path, builtin_plugins):
    """`fslab eval --evaluator knn --set evaluator.k=3` sends its scores to the run's sinks: the CSV named them
    test/5way_5shot/accuracy at step 0, as it names the training's own test, so the last row of that name gave
    knn's score as the run's; a score in mAP was named accuracy; eval.final_val's score took the name of the
    last epoch's validation, at the same step."""
    import csv

    from fslab.core.types import SinkRun

    CsvSink = _csv_sink(tmp_path)
    run_path = tmp_path / "run"
    run_path.mkdir()
    shape = {"event": "eval", "time": 0.0, "split": "test", "ways": 5, "shots": 5, "queries": 15, "episodes": 20,
             "metric": "accuracy", "ci95": 0.01}
    sink = CsvSink(SinkRun("r", run_path, {"evaluator": {"name": "centroid"}}))
    for event in [{**shape, "evaluator": "centroid", "accuracy": 0.4, "step": 12},
                  {**shape, "evaluator": "knn[k=3,ties=nearest]", "accuracy": 0.5, "step": 12},
                  {**shape, "evaluator": "retrieval-map[images_per_class=10]", "metric": "map", "accuracy": 0.3,
                   "step": 12},
                  {**shape, "source": "fslab eval", "evaluator": "knn[k=3,ties=nearest]", "accuracy": 0.6,
                   "epoch": 1},
                  # the last epoch's validation, then eval.final_val's of the final network (no epoch)
                  {**shape, "split": "val", "evaluator": "centroid", "accuracy": 0.7, "step": 12, "epoch": 1},
                  {**shape, "split": "val", "evaluator": "centroid", "accuracy": 0.8, "step": 12}]:
        sink.write(event)
    sink.close()
    with open(run_path / "fslab-rows.csv", newline="") as file:
        scores = [row for row in csv.reader(file) if not row[2].endswith("ci95")][1:]
    assert scores == [["12", "", "test/5way_5shot/accuracy", "0.4"],
                      ["12", "", "test/5way_5shot/knn[k=3]/accuracy", "0.5"],
                      ["12", "", "test/5way_5shot/retrieval-map/map", "0.3"],
                      ["0", "1", "eval/test/5way_5shot/knn[k=3]/15q_20ep/accuracy", "0.6"],
                      ["12", "1", "val/5way_5shot/accuracy", "0.7"],
                      ["12", "", "val_final/5way_5shot/accuracy", "0.8"]]


@pytest.mark.slow
def test_a_generated_package_installs_lists_and_passes_its_own_tests(tmp_path):
    """Every kind, installed editable into a fresh venv that sees this environment's packages."""
    kinds = [arg for kind in KINDS for arg in ("--kind", kind)]
    made = subprocess.run([sys.executable, "-m", "fslab", "new", "plugin", "fslab_every", *kinds], cwd=tmp_path,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # A venv made from a venv sees the base interpreter only: add this one's packages (fslab's dependencies,
    # pip) as a site directory, so that its own .pth files (fslab's editable install among them) are read too.
    parent = sysconfig.get_paths()["purelib"]
    (Path(site) / "parent.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    env = {**os.environ, "FSLAB_STRICT_PLUGINS": "1"}
    env.pop("FSLAB_PLUGINS", None)
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                              str(tmp_path / "fslab_every")], capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stderr
    # the wheel a package author publishes carries the study file, and setuptools finds no folder
    # it was not told about (its warning shows without -q)
    wheel = subprocess.run([str(python), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp_path / "wheel"), str(tmp_path / "fslab_every")], capture_output=True, text=True)
    assert wheel.returncode == 0, wheel.stderr
    assert "absent from the `packages` configuration" not in wheel.stdout + wheel.stderr
    (built,) = (tmp_path / "wheel").glob("*.whl")
    assert "fslab_every/studies/fslab-every.toml" in zipfile.ZipFile(built).namelist()
    listed = subprocess.run([str(python), "-m", "fslab", "plugins", "--json"], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    ours = {(c["kind"], c["name"]) for c in map(json.loads, listed.stdout.splitlines())
            if c["plugin"].startswith("fslab_every_")}
    assert ours == {(kind, "fslab-every") for kind in KINDS}, listed.stderr
    tested = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], capture_output=True,
                            text=True, env=env, cwd=tmp_path / "fslab_every")
    assert tested.returncode == 0, tested.stdout[-3000:]
    assert "22 passed" in tested.stdout and "skipped" not in tested.stdout, tested.stdout[-2000:]
    # the study file came with the package: its sweep trains the package's own recipe, by batch size
    shown = subprocess.run([str(python), "-m", "fslab", "study", "show", "fslab-every", "--json"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    study = json.loads(shown.stdout)
    assert study["runs"] == 9 and [s["method"] for s in study["sweeps"]] == ["fslab-every"], shown.stderr
    # the generated README's command for the recipe trains as written: the dataset's defaults size
    # the run for its 400 images (fslab's own are the papers' batches of 512)
    trained = subprocess.run([str(python), "-m", "fslab", "run", "fslab-every"], capture_output=True, text=True,
                             env=env, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert re.search(r"^test 5-way 5-shot: [\d.]+ ± [\d.]+% \(500 episodes\)$", trained.stdout, re.M), trained.stdout
    # the sampler's check reads the training split's sizes, so a batch it cannot fill is refused before a run exists
    runs_before = sorted((tmp_path / "runs").iterdir())
    refused = subprocess.run([str(python), "-m", "fslab", "run", "fslab-every", "--batch-size", "128"],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr == (
        "error: fslab-every: train.batch_size 128 needs 32 classes with 4 images each, the training set has 20; "
        "lower train.batch_size\n"), refused.stderr
    assert sorted((tmp_path / "runs").iterdir()) == runs_before


LOCAL_PLUGIN = '''
from fslab.plugin import LossOutput, hookimpl

def sloppy(z, labels, support=None, *, margin: float = 1.0):
    return LossOutput(z.pow(2).sum(), -1, 0)  # a negative pair count

def tidy(z, labels, support=None):
    return LossOutput(z.pow(2).mean(), 0, 0)  # compares no two embeddings

@hookimpl
def register_losses(register):
    register(sloppy, name="sloppy", description="breaks the pair counts")
    register(tidy, name="tidy", description="keeps the contract")
'''


def test_contract_tests_take_one_plugin_named_without_a_list(tmp_path, monkeypatch, builtin_plugins):
    """plugins = "local:mine" was read a letter at a time: a test per letter ("no fslab plugin 'l'
    is installed") and no component of the plugin checked."""
    import fslab.testing
    from fslab.testing import ContractTests

    monkeypatch.setattr(fslab.testing, "_registries", {})
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "mine.py").write_text(LOCAL_PLUGIN)

    class One(ContractTests):
        plugins = "local:mine"
        plugin_dirs = (str(tmp_path / "local"),)

    assert One()._plugins(None) == ["local:mine"]
    assert One()._components(None, ["loss"]) == [("loss", "sloppy"), ("loss", "tidy")]


def test_contract_tests_read_the_ini_option_and_fail_a_broken_component(tmp_path):
    """The pytest route an author takes: the plugin named in the ini option
    fslab_plugins, the tests one ContractTests subclass."""
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "mine.py").write_text(LOCAL_PLUGIN)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfslab_plugins = local:mine\n")
    (tmp_path / "test_mine.py").write_text(
        "from fslab.testing import ContractTests\n\n\n"
        "class TestMine(ContractTests):\n    plugin_dirs = ('local',)\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "fslab.testing", "-p", "no:cacheprovider",
                             "-v", "-rfs"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "FAILED test_mine.py::TestMine::test_loss[sloppy]" in result.stdout
    assert "sloppy: positives = -1, outside 0..60" in result.stdout
    assert "test_loss[tidy] PASSED" in result.stdout
    # the other loss, both parameter checks and the loading pass; the kinds the plugin lacks are skipped, saying so
    assert "1 failed, 4 passed, 7 skipped" in result.stdout and "the plugins register no sampler" in result.stdout
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    unnamed = subprocess.run([sys.executable, "-m", "pytest", "-p", "fslab.testing", "-p", "no:cacheprovider"],
                             cwd=tmp_path, capture_output=True, text=True)
    assert unnamed.returncode != 0 and "name the fslab plugins to check" in unnamed.stdout + unnamed.stderr


def test_a_local_plugin_that_is_not_found_is_told_why(tmp_path, monkeypatch, builtin_plugins):
    """A relative plugin_dirs is read from the current directory: pytest run from the folder
    above the test file failed with "no fslab plugin 'local:mine' is installed (entry points
    ...); pip install -e . first", which said nothing of the folder."""
    import fslab.testing
    from fslab.testing import ContractTests

    monkeypatch.setattr(fslab.testing, "_registries", {})
    (tmp_path / "pkg" / "local").mkdir(parents=True)
    (tmp_path / "pkg" / "local" / "mine.py").write_text(LOCAL_PLUGIN)
    monkeypatch.chdir(tmp_path)

    class Relative(ContractTests):
        plugin_dirs = ("local",)

    class Absolute(ContractTests):
        plugin_dirs = (str(tmp_path / "pkg" / "local"),)

    with pytest.raises(AssertionError) as caught:
        Relative().test_plugin_loads("local:mine")
    assert str(caught.value).splitlines()[0] == (
        f"plugin_dirs names local, which is not a folder under the current directory {tmp_path}; a relative folder "
        f'is read from there, so give it from the test file: str(Path(__file__).parent / "local")')
    Absolute().test_plugin_loads("local:mine")
    with pytest.raises(AssertionError, match=r"^no other\.py in plugin_dirs /.*/pkg/local\n"):
        Absolute().test_plugin_loads("local:other")
    with pytest.raises(AssertionError, match=r"^no plugin folder to find 'local:mine' in: set plugin_dirs = "):
        ContractTests().test_plugin_loads("local:mine")

    class Alone(ContractTests):  # the comma forgotten: it was read as a folder per letter (/, t, m, p, ...)
        plugin_dirs = (str(tmp_path / "pkg" / "local"))

    Alone().test_plugin_loads("local:mine")
    assert Alone().registry.failures == []


def test_a_plugin_that_registers_nothing_fails_its_loading_test(tmp_path, monkeypatch, builtin_plugins):
    """A module with no hook (its hook written in another file, or not at all) passed test_plugin_loads,
    and every other contract was skipped for want of a component: the plugin's CI stayed green."""
    import fslab.testing
    from fslab.testing import ContractTests

    monkeypatch.setattr(fslab.testing, "_registries", {})
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "empty.py").write_text('"""The loss is to come."""\n')

    class Empty(ContractTests):
        plugin_dirs = (str(tmp_path / "local"),)

    with pytest.raises(AssertionError) as caught:
        Empty().test_plugin_loads("local:empty")
    assert str(caught.value).splitlines()[0] == (
        "plugin 'local:empty' loads but registers no component: implement a hook of fslab (register_losses, "
        "register_backbones, register_samplers, register_evaluators, register_datasets, register_methods, "
        "register_studies, register_sinks) with @hookimpl above it, calling register(...)")


def test_an_installed_plugin_that_fslab_plugins_leaves_out_is_told_so(monkeypatch):
    """With FSLAB_PLUGINS set in the shell, a generated package's `pytest` failed with "no fslab plugin
    'fslab_margin_loss' is installed ...; pip install -e . first": it was installed, and left out."""
    import fslab.testing
    from fslab.testing import ContractTests

    monkeypatch.setattr(fslab.testing, "_registries", {})
    monkeypatch.setenv("FSLAB_PLUGINS", "nca")
    with pytest.raises(AssertionError) as caught:
        ContractTests().test_plugin_loads("protonet")
    assert str(caught.value).splitlines()[0] == ("fslab plugin 'protonet' is installed, but FSLAB_PLUGINS=nca leaves "
                                                 "it out: add it there, or unset FSLAB_PLUGINS")
    with pytest.raises(AssertionError, match=r"^no fslab plugin 'fslab_nowhere' is installed \(entry points of "
                                             r"group 'fslab': nca\); pip install -e \. first"):
        ContractTests().test_plugin_loads("fslab_nowhere")
    # misspelt, or named by its package (qk_loss for the entry point qk_loss_loss): the closest is suggested
    with pytest.raises(AssertionError, match=r"^no fslab plugin 'nac' is installed\. Did you mean 'nca'\? "
                                             r"\(entry points of group 'fslab': nca\); pip install -e \. first"):
        ContractTests().test_plugin_loads("nac")
    ContractTests().test_plugin_loads("nca")


FILES_DATASET = """
from pathlib import Path

import torch
from fslab.plugin import Split, UsageError, hookimpl


class Files:
    channels = 1

    def __init__(self, root=None):
        if root is None or not (Path(root) / "train").is_dir():
            raise UsageError(f"files: no {root}/train folder")
        self.root = Path(root)

    def load(self, split):
        count = len(list((self.root / split).iterdir()))
        return Split(torch.zeros(2 * count, 1, 8, 8, dtype=torch.uint8), torch.arange(count).repeat_interleave(2),
                     [str(c) for c in range(count)])


@hookimpl
def register_datasets(register):
    register(Files, name="files", description="reads files")
"""


def test_a_dataset_that_reads_files_is_told_where_a_tests_files_come_from(tmp_path, monkeypatch, builtin_plugins):
    """Built on the default empty folder, a dataset that reads files failed with its own line
    (no .../train folder), which did not say that dataset_args gives a test its files."""
    import fslab.testing
    from fslab.testing import ContractTests

    monkeypatch.setattr(fslab.testing, "_registries", {})
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "files.py").write_text(FILES_DATASET)

    class Default(ContractTests):
        plugin_dirs = (str(tmp_path / "local"),)

    class Layout(Default):
        def dataset_args(self, name, tmp_path):
            for split in ("train", "val", "test"):
                for c in range(2):
                    (tmp_path / split / str(c)).mkdir(parents=True)
            return {"root": str(tmp_path)}

    (tmp_path / "empty").mkdir()
    with pytest.raises(AssertionError) as caught:
        Default().test_dataset("files", tmp_path / "empty")
    assert str(caught.value) == (
        f"files: built with an empty folder as root, it says: files: no {tmp_path / 'empty'}/train folder; a dataset "
        "that reads files gets them from dataset_args(self, name, tmp_path): override it to write a tiny layout "
        "under tmp_path and return {'root': ..., **params}")
    (tmp_path / "layout").mkdir()
    Layout().test_dataset("files", tmp_path / "layout")


def test_declared_values_are_refused_at_launch_and_listed(tmp_path):
    def fslab(*argv):
        return fslab_here(*argv, cwd=tmp_path)

    refused = fslab("run", "nca", "--set", "evaluator.name=knn", "--set", "evaluator.k=-3")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip() == "error: config key 'evaluator.k' must be at least 0, got -3"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    listed = {c["name"]: c for c in map(json.loads, fslab("plugins", "--kind", "loss", "--json").stdout.splitlines())}
    assert listed["protonet"]["allowed"] == {"distance": "one of euclidean, cosine"}
    assert "allowed" not in listed["nca"]  # its ranges are cross-checked by its own check=
    table = fslab("plugins", "--kind", "backbone").stdout
    assert "hidden=64 (at least 1)" in table


def test_new_plugin_imports_no_torch(tmp_path):
    code = ("import sys\nfrom fslab.cli import app\ntry:\n"
            "    app(['new', 'plugin', 'fslab_light', '--kind', 'backbone', '--kind', 'method'])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('torch loaded:', 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "torch loaded: False" in result.stdout
    assert (tmp_path / "fslab_light" / "fslab_light" / "method.py").exists()


REGISTER_EVERY_MODULE = """
import importlib, sys
from fslab.core.registry import HOOKS
seen = {}
for kind in sys.argv[1:]:
    hook = getattr(importlib.import_module(f"fslab_every.{kind}"), HOOKS[kind])
    hook(register=lambda target, *, name, description, **info: seen.setdefault(kind, (name, target)))
print("torch loaded:", "torch" in sys.modules)
print("backbone target:", seen["backbone"][1])
"""


def test_the_generated_modules_register_without_importing_torch(tmp_path):
    """fslab imports every plugin module to list the components (`fslab plugins`, shell
    completion): the generated ones import torch only where a run uses it, the backbone's
    network through a lazy target, as the built-in plugins do."""
    kinds = [arg for kind in KINDS for arg in ("--kind", kind)]
    made = subprocess.run([sys.executable, "-m", "fslab", "new", "plugin", "fslab_every", *kinds], cwd=tmp_path,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    package = tmp_path / "fslab_every"
    result = subprocess.run([sys.executable, "-c", REGISTER_EVERY_MODULE, *KINDS], cwd=package,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "torch loaded: False" in result.stdout
    assert "backbone target: fslab_every.network:SmallConvNet" in result.stdout
    # the lazy target names a class that exists, with the parameters backbone.py declares
    network = (package / "fslab_every" / "network.py").read_text()
    assert "class SmallConvNet(nn.Module):" in network and "width: int = 32, out_dim: int = 64" in network
    assert "`fslab_every/network.py` | the backbone's network" in (package / "README.md").read_text()


def test_the_study_check_resolves_every_run_and_catches_a_recipe_not_installed(tmp_path):
    """check_study: the study the kit writes passes; the same file naming a recipe no plugin
    registers fails, naming the study, the sweep and the recipe."""
    from fslab.core.errors import UsageError
    from fslab.core.registry import load_registry
    from fslab.kit import write_plugin
    from fslab.testing.checks import check_study

    write_plugin(tmp_path / "pkg", "fslab_paper", ["study"])
    studies = tmp_path / "pkg" / "fslab_paper" / "studies"
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "paper.py").write_text(
        "from pathlib import Path\n\nfrom fslab.plugin import hookimpl, register_study_files\n\n\n"
        f"@hookimpl\ndef register_studies(register):\n    register_study_files(register, Path({str(studies)!r}))\n")
    check_study(load_registry((str(tmp_path / "local"),)), "fslab-paper", tmp_path)  # nca by batch size
    text = (studies / "fslab-paper.toml").read_text()
    # the keys its description gives a published cell are those a cell takes (it left out accuracy, the number)
    from fslab.core.studies import CELL_KEYS

    listed = re.search(r"each with its (.*?), which the report", text, re.S).group(1)
    assert sorted(re.findall(r"\b(?!and\b)[a-z0-9]+", listed)) == sorted(CELL_KEYS), listed
    (studies / "fslab-paper.toml").write_text(text.replace('method = "nca"', 'method = "nca-by-hand"'))
    with pytest.raises(UsageError, match=r"fslab-paper\.toml: sweep 'fslab-paper'\.method \(on synthetic\): "
                                         r"Unknown method 'nca-by-hand'"):
        check_study(load_registry((str(tmp_path / "local"),)), "fslab-paper", tmp_path)


@pytest.mark.parametrize("options, message", [
    (["--set", "loss.name=per-row"],
     "TypeError: loss 'per-row' from plugin 'local:broken' returned a loss of shape [32]; LossOutput's loss must "
     "be a 0-d tensor: reduce it over the batch (e.g. .mean())"),
    (["--set", "loss.name=bare"],
     "TypeError: loss 'bare' from plugin 'local:broken' returned a Tensor of shape [], not "
     "LossOutput(loss, positives, negatives)"),
    # trained on the last image of the split where the batch named index -1, and completed
    (["--set", "sampler.name=wrapping"],
     "ValueError: sampler 'wrapping' from plugin 'local:broken' yielded the index -1, out of the training split's "
     "range 0..239"),
    # AttributeError: 'list' object has no attribute 'items', naming no loss
    (["--set", "loss.name=noted"],
     "TypeError: loss 'noted' from plugin 'local:broken' returned LossOutput extra=[1, 2], not a dict of counters"),
    (["--set", "sampler.name=empty"],
     "ValueError: sampler 'empty' from plugin 'local:broken' has len() 0, no batch per epoch: the run would train "
     "no step"),
    # labels numbered from -1: trained in silence (an episode drew its classes among -1..6)
    (["--dataset", "from-one", "--batch-size", "16", "--set", "eval.queries=5", "--set", "eval.center_images=0"],
     "ValueError: dataset 'from-one' from plugin 'local:broken' gave train labels -1..6 for 8 classes "
     "(Split.classes); labels number the "
     "classes 0..7, one name in classes for each"),
    (["--set", "sampler.name=lists"],
     "TypeError: sampler 'lists' from plugin 'local:broken' yielded a list, not Batch(indices, support): "
     "batches(epoch) yields fslab.plugin.Batch"),
    # PyTorch's words from the check's forward, naming no backbone: mat1 and mat2 shapes cannot be multiplied;
    # then the backbone without its plugin, where a training step that raises names both
    (["--backbone", "fixed"],
     "backbone 'fixed' from plugin 'local:broken' failed on 2 images of shape [2, 1, 16, 16]: RuntimeError: mat1 "
     "and mat2 shapes "
     "cannot be multiplied (2x256 and 7056x8); a backbone whose layers depend on the image size names image_size "
     "in its __init__ to be told it"),
    (["--set", "loss.name=hard"], "TypeError: loss 'hard' from plugin 'local:broken' returned a loss with no "
                                  "gradient; compute it from z with differentiable operations (not .detach(), "
                                  ".item(), argmax or a constant)"),
    (["--dataset", "channelless", "--set", "eval.queries=5", "--set", "eval.center_images=0"],
     "TypeError: dataset 'channelless' from plugin 'local:broken' must set channels to the number of channels of "
     "its images (an int, 1 or 3), got None"),
    # the plugin's bare KeyError: 'val', naming no dataset; then the dataset, but not its plugin (as the lines
    # blaming a loss, a sampler or a backbone name it), nor did those of its images or labels
    (["--dataset", "train-only", "--set", "eval.queries=5", "--set", "eval.center_images=0"],
     "dataset 'train-only' from plugin 'local:broken' failed to load its val split: KeyError: 'val'"),
    (["--dataset", "says-colour", "--set", "eval.queries=5", "--set", "eval.center_images=0"],
     "TypeError: dataset 'says-colour' from plugin 'local:broken' gave train images of 1 channel but says "
     "channels = 3"),
    # it trained on images near black (uint8 is what fslab scales) and the run ended completed
    (["--dataset", "float-images", "--set", "eval.queries=5", "--set", "eval.center_images=0"],
     "TypeError: dataset 'float-images' from plugin 'local:broken' gave train images of dtype torch.float32 and "
     "shape [80, 1, 16, 16]; "
     "load(split) returns Split(images uint8 [N, C, H, W], labels int64 [N], classes)"),
])
def test_a_run_whose_plugin_gives_the_wrong_thing_fails_naming_it(project, options, message):
    """It failed with PyTorch's own words (grad can be implicitly created only for scalar
    outputs; 'Tensor' object has no attribute 'loss'), which name no plugin, or did not fail."""
    from tests.runs_helpers import TINY, fslab_here

    (project / "mine").mkdir()
    (project / "mine" / "broken.py").write_text(BROKEN)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    # TINY sizes the synthetic dataset, whose parameters another dataset does not take
    tiny = ["--backbone", "conv4", "--set", "backbone.hidden=8"] if "--dataset" in options else TINY
    if "--dataset" in options:  # each takes a root, so reads files: its data root, data/NAME, must be a folder
        (project / "data" / options[options.index("--dataset") + 1]).mkdir(parents=True)
    if "--backbone" in options:  # TINY's first four: --backbone conv4 --set backbone.hidden=8, conv4's parameter
        tiny = TINY[4:]
    # the CLI in this process (the worker is a process of its own still): the interpreter's start and torch's
    # import, 2-3 s a case, are not what this test is about
    result = fslab_here("run", "nca", *tiny, "--epochs", "1", "--device", "cpu", *options, cwd=project)
    assert result.returncode == 1 and f"failed: {message}" in result.stderr, result.stderr


def test_fslab_eval_with_an_evaluator_that_breaks_is_one_line_naming_it(project):
    """fslab eval printed the evaluator's traceback (RuntimeError, or ValueError: evaluator returned
    shape ...), naming no evaluator (a run that tests with it now fails naming it too: the same code)."""
    from tests.runs_helpers import TINY, fslab, fslab_here

    (project / "mine").mkdir()
    (project / "mine" / "broken.py").write_text(BROKEN)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    assert fslab("run", "nca", *TINY, "--epochs", "1", "--device", "cpu", cwd=project).returncode == 0
    named = "from plugin 'local:broken'"  # as a loss's or a sampler's line names its plugin
    for evaluator, message in (("raising", f"evaluator 'raising' {named} failed: RuntimeError: a bug in the "
                                           "plugin"),
                               ("flat", f"evaluator 'flat' {named} returned shape (20,), expected predictions "
                                        "(20, 25)"),
                               ("listed", f"evaluator 'listed' {named} returned a list, not a tensor")):
        result = fslab_here("eval", "last", "--evaluator", evaluator, "--episodes", "20", "--queries", "5",
                            "--shots", "1", cwd=project)
        assert result.returncode == 1 and result.stderr == f"error: {message}\n", result.stderr


MIDWAY = '''
import torch
from fslab.plugin import hookimpl


class Flaky(torch.nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.out_dim = 8
        self.conv = torch.nn.Conv2d(in_channels, 8, 3)
        self.steps = 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            if self.steps == 3:  # the check's forward and two steps went well
                raise ValueError("flaky forward")
        return self.conv(x).mean(dim=(2, 3))


class Blind(Flaky):
    def forward(self, x):
        if not self.training and x.shape[0] > 2:  # the build's check embeds 2 images
            raise ValueError("cannot embed in eval mode")
        return self.conv(x).mean(dim=(2, 3))


def raising(support, query):
    raise RuntimeError("a bug in the evaluator")


def asserting(support, query):
    assert support.shape[2] == 99


@hookimpl
def register_backbones(register):
    register(Flaky, name="flaky", description="fails at its second training step")
    register(Blind, name="blind", description="fails as it embeds images for an evaluation")


@hookimpl
def register_evaluators(register):
    register(raising, name="raising", description="fails as it classifies")
    register(asserting, name="asserting", description="fails a bare assert as it classifies")
'''


@pytest.mark.parametrize("options, message", [
    (["--backbone", "flaky"], "backbone 'flaky' from plugin 'local:midway' failed: ValueError: flaky forward"),
    (["--backbone", "blind"],
     "backbone 'blind' from plugin 'local:midway' failed: ValueError: cannot embed in eval mode"),
    (["--set", "evaluator.name=raising"],
     "evaluator 'raising' from plugin 'local:midway' failed: RuntimeError: a bug in the evaluator"),
    # an assert without a message read "failed: AssertionError:.", naming no check and no file
    (["--set", "evaluator.name=asserting"], "evaluator 'asserting' from plugin 'local:midway' failed: AssertionError "
     "at {file} line {line}: assert support.shape[2] == 99"),
])
def test_a_backbone_or_evaluator_that_raises_midway_fails_the_run_naming_it_and_its_plugin(project, options, message):
    """A backbone raising in a training step, or as it embedded images for an evaluation, failed the run with its
    bare "ValueError: ...", and an evaluator raising at the first validation named itself but not its plugin,
    where a loss or a sampler names both."""
    from tests.runs_helpers import TINY, fslab_here

    (project / "mine").mkdir()
    (project / "mine" / "midway.py").write_text(MIDWAY)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    tiny = TINY[4:] if "--backbone" in options else TINY  # TINY's first four: conv4 and its parameter
    # the CLI in this process, its worker a process of its own
    result = fslab_here("run", "nca", *tiny, "--epochs", "1", "--device", "cpu", *options, cwd=project)
    line = MIDWAY.splitlines().index("    assert support.shape[2] == 99") + 1
    message = message.replace("{file}", str(project / "mine" / "midway.py")).replace("{line}", str(line))
    assert result.returncode == 1 and f"failed: {message}. See: fslab logs" in result.stderr, result.stderr


LOCAL_SAMPLERS = '''
import random

from fslab.plugin import Batch, hookimpl


class Plain:
    def __init__(self, labels, batch_size, seed):
        self.count, self.batch_size, self.seed = len(labels), batch_size, seed

    def __len__(self):
        return 3

    def batches(self, epoch):
        rng = random.Random(self.seed * 1000 + epoch)
        for _ in range(3):
            yield Batch(rng.sample(range(self.count), self.batch_size))


class Episodes(Plain):
    def __init__(self, labels, batch_size, seed, *, ways: int = 5, shots: int = 1, queries: int = 3):
        self.by_class, self.seed = {}, seed
        for index, label in enumerate(labels):
            self.by_class.setdefault(label, []).append(index)
        self.ways, self.shots, self.queries = ways, shots, queries

    def batches(self, epoch):
        rng = random.Random(self.seed * 1000 + epoch)
        for _ in range(3):
            indices, support = [], []
            for label in rng.sample(sorted(self.by_class), self.ways):
                indices += rng.sample(self.by_class[label], self.shots + self.queries)
                support += [True] * self.shots + [False] * self.queries
            yield Batch(indices, support)


def rows(params, batch_size):
    return params["ways"] * (params["shots"] + params["queries"])


@hookimpl
def register_samplers(register):
    register(Plain, name="plain", description="a sampler of a project's own plugin folder")
    register(Episodes, name="episodes", description="its parameters fix a batch's rows", episodic=True, batch=rows)
'''


def test_a_sampler_of_a_local_plugin_folder_survives_pickling(tmp_path, builtin_plugins):
    """The contract asks a sampler to survive pickling; one defined in a plugin_dirs file could not
    (Can't pickle <class 'fslab_local_plugins.mine.Plain'>: import of module 'fslab_local_plugins.mine'
    failed), however it was written: its module had no parent package to import it through."""
    import pickle

    from fslab.core.registry import load_registry
    from fslab.testing.checks import check_sampler

    (tmp_path / "mine.py").write_text(LOCAL_SAMPLERS)
    registry = load_registry([tmp_path])
    check_sampler(registry, "plain")
    sampler = registry.create("sampler", "plain", labels=[0, 1] * 20, batch_size=4, seed=3)
    assert list(pickle.loads(pickle.dumps(sampler)).batches(2)) == list(sampler.batches(2))


def test_the_sampler_check_draws_the_batches_a_batch_function_fixes(tmp_path, builtin_plugins):
    """A sampler whose parameters fix a batch's rows (register(..., batch=f)) trains with that many,
    saved as train.batch_size; its contract test asked for the 32 rows of sampler_batch_size instead
    and failed a correct sampler: "episodes: a batch of 20, not 32"."""
    from fslab.core.registry import load_registry
    from fslab.testing.checks import check_sampler

    (tmp_path / "mine.py").write_text(LOCAL_SAMPLERS)
    registry = load_registry([tmp_path])
    check_sampler(registry, "episodes")  # 5 ways x (1 + 3)
    check_sampler(registry, "episodes", {"ways": 3, "queries": 5})
    check_sampler(registry, "plain", batch_size=12)  # without batch=, the size asked for


def test_contract_tests_check_the_parameters_they_are_given(builtin_plugins, monkeypatch):
    """evaluator_params = {"knn": {"k": -3}} checked knn with a k a run refuses; a misspelt name
    ({"kn": ...}) was never used, its test run with the defaults; a misspelt parameter was the
    component's own error, listing labels and seed as settable; backbone_image_size = 16 was
    "'int' object is not subscriptable"."""
    import types

    import fslab.testing
    from fslab.testing import ContractTests

    monkeypatch.setattr(fslab.testing, "_registries", {})

    class Checks(ContractTests):
        plugins = ["nca_evaluators", "protonet"]
        evaluator_params = {"kn": {"k": 3}}

    class Metafunc:
        config, function = None, types.SimpleNamespace(__name__="test_evaluator")

        def parametrize(self, *args):
            self.args = args

    with pytest.raises(pytest.UsageError) as caught:
        Checks().pytest_generate_tests(Metafunc())
    assert str(caught.value) == ("Checks: evaluator_params names 'kn', but the plugins checked register no evaluator "
                                 "of that name. Did you mean 'knn'? Their evaluators: finetune, knn, soft")
    Checks.evaluator_params = {"knn": {"k": -3}}
    with pytest.raises(AssertionError, match=r"^knn: the parameters given to its contract test are not a run's: "
                                             r"config key 'evaluator.k' must be at least 0, got -3$"):
        Checks().test_evaluator("knn")
    Checks.sampler_params = {"episodic": {"shot": 2}}
    with pytest.raises(AssertionError, match=r"unknown parameter 'sampler.shot' for sampler 'episodic'\. Did you mean "
                                             r"'shots'\? Allowed: per_class, queries, shots, ways\.$"):
        Checks().test_sampler("episodic")
    Checks.backbone_image_size = 16
    with pytest.raises(AssertionError, match=r"^backbone_image_size is the images' \(height, width\), such as "
                                             r"\(16, 16\), got 16$"):
        Checks().test_backbone("conv4")
    Checks.evaluator_params = {"knn": {"k": 1}}
    Checks().test_evaluator("knn")
    Checks().pytest_generate_tests(metafunc := Metafunc())
    assert metafunc.args == ("name", ["finetune", "knn", "soft"])
