"""Backbones map a batch to (B, out_dim) features and train end to end; each
can also return the pooled outputs of its last k stages (NCA paper App. A.1);
parameter counts match the papers; plugin listing stays free of torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from fslab.core.errors import ConfigError, PluginError, UsageError
from fslab.core.registry import keyword_params

from .runs_helpers import TINY as TINY_RUN
from .runs_helpers import fslab, fslab_here

BACKBONES = ["conv4", "resnet12", "resnet12-nca", "wrn28-10"]
TINY = {
    "conv4": {"hidden": 8},
    "resnet12": {"widths": [8, 16, 16, 32]},
    "resnet12-nca": {"widths": [8, 16, 16, 32]},
    "wrn28-10": {"depth": 10, "widen_factor": 1},  # WRN-10-1: one block per group, widths 16-32-64
}
STAGE_DIMS = {"conv4": [8] * 4, "resnet12": [8, 16, 16, 32], "resnet12-nca": [8, 16, 16, 32], "wrn28-10": [16, 32, 64]}


def tiny(registry, name, channels=1):
    return registry.create("backbone", name, in_channels=channels, **TINY[name])


@pytest.mark.parametrize(
    "name, params, channels, size, out_dim",
    [
        ("conv4", {}, 1, 16, 64),
        ("conv4", {"hidden": 8}, 3, 28, 8),
        ("conv4", {"hidden": 8}, 3, 5, 8),  # smaller than 2**4: pooling rounds up
        ("resnet12", TINY["resnet12"], 1, 16, 32),
        ("resnet12", TINY["resnet12"], 3, 21, 32),
        ("resnet12-nca", TINY["resnet12-nca"], 1, 16, 32),
        ("resnet12-nca", TINY["resnet12-nca"], 3, 32, 32),
        ("resnet12-nca", TINY["resnet12-nca"], 3, 5, 32),  # stride-2 convolutions pad: 5 -> 3 -> 2 -> 1
        ("wrn28-10", TINY["wrn28-10"], 1, 16, 64),
        ("wrn28-10", TINY["wrn28-10"], 3, 32, 64),
    ],
)
def test_backbone_output_shape(registry, torch_seed, name, params, channels, size, out_dim):
    model = registry.create("backbone", name, in_channels=channels, **params)
    assert model.out_dim == out_dim == model.stage_dims[-1]
    assert model(torch.randn(3, channels, size, size)).shape == (3, out_dim)


@pytest.mark.parametrize("name", BACKBONES)
def test_every_parameter_gets_a_gradient(registry, torch_seed, name):
    model = tiny(registry, name)
    features = model(torch.randn(4, 1, 16, 16))
    (features**2).sum().backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, param_name
        assert torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("name", BACKBONES)
def test_lazy_registration_declares_the_real_parameters(registry, name):
    component = registry.get("backbone", name)
    assert isinstance(component.target, str)
    assert component.params == keyword_params(component.resolve(), "backbone")  # image_size is fslab's to fill in


# -- multi-stage features ------------------------------------------------------

def stage_modules(model, name):
    """The modules whose outputs are the stages' feature maps, found by hand
    for each architecture (a second implementation of ``stage_maps``)."""
    if name == "conv4":
        return [model.blocks[i] for i in (3, 7, 11, 15)]  # each block's max-pool
    if name == "wrn28-10":
        return [model.groups[0], model.groups[1], model.final]  # the last group after its BN + ReLU
    return list(model.stages)


@pytest.mark.parametrize("name", BACKBONES)
def test_multi_stage_features_are_the_pooled_stage_outputs(registry, torch_seed, name):
    model = tiny(registry, name, channels=3).eval()
    assert model.stage_dims == STAGE_DIMS[name]
    maps = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: maps.append(out.clone())) for m in stage_modules(model, name)]
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        output = model(x)
    for hook in hooks:
        hook.remove()
    pooled = [m.mean(dim=(2, 3)) for m in maps]
    assert len(pooled) == len(model.stage_dims)
    assert [p.shape[1] for p in pooled] == model.stage_dims
    assert torch.allclose(output, pooled[-1], atol=1e-6)
    with torch.no_grad():
        for k in range(1, len(pooled) + 1):
            features = model.features(x, k)
            assert features.shape == (2, sum(model.stage_dims[-k:]))
            assert torch.allclose(features, torch.cat(pooled[-k:], dim=1), atol=1e-6), k


@pytest.mark.parametrize("stages", [0, 5])
def test_asking_for_more_stages_than_exist_is_a_clear_error(registry, stages):
    model = tiny(registry, "resnet12")
    with pytest.raises(UsageError, match="between 1 and 4"):
        model.features(torch.randn(1, 1, 8, 8), stages)


def test_feature_network_is_the_backbone_for_one_stage_and_a_wrapper_otherwise(registry, torch_seed):
    from fslab.training import evaluation
    from fslab.training.build import to_input
    from fslab.training.features import feature_network

    model = tiny(registry, "conv4")
    assert feature_network(model, 1) is model
    images = torch.randint(0, 256, (10, 1, 16, 16), dtype=torch.uint8)
    wrapped = feature_network(model, 3)
    features = evaluation.extract_features(wrapped, images, 4, "cpu", to_input)
    model.eval()
    with torch.no_grad():
        expected = model.features(to_input(images.clone()), 3)
    assert features.shape == (10, 24) and torch.allclose(features, expected, atol=1e-6)
    with pytest.raises(ConfigError, match="between 1 and 4"):
        feature_network(model, 5)
    plain = torch.nn.Sequential(torch.nn.Flatten())
    with pytest.raises(ConfigError, match="multi-stage features"):
        feature_network(plain, 2)


# -- the NCA paper code's ResNet-12 -----------------------------------------------

def conv(cin, cout, k):
    return cin * cout * k * k


def bn(c):
    return 2 * c  # weight and bias


def basic_block(cin, cout):
    """Two 3×3 conv + BN, and a 1×1 conv + BN shortcut when the shape changes."""
    shortcut = conv(cin, cout, 1) + bn(cout) if cin != cout else 0
    return conv(cin, cout, 3) + bn(cout) + conv(cout, cout, 3) + bn(cout) + shortcut


def test_resnet12_nca_parameter_count_by_hand(registry):
    model = registry.create("backbone", "resnet12-nca", in_channels=3)
    stem = conv(3, 64, 3) + bn(64)
    # layer1 64 -> 64 (identity shortcut, stride 1), layer2 -> 160, layer3 -> 320 twice, layer4 -> 640.
    expected = (stem + basic_block(64, 64) + basic_block(64, 160) + basic_block(160, 320)
                + basic_block(320, 320) + basic_block(320, 640))
    assert expected == 9_427_840
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.out_dim == 640 and model.stage_dims == [64, 160, 320, 640]
    # App. A.1's multi-layer features (last three stages) on an 84×84 image.
    assert sum(model.stage_dims[-3:]) == 1120


def test_resnet12_nca_layout_follows_the_released_code(registry):
    from fslab_plugins.backbones.networks import BasicBlock

    model = registry.create("backbone", "resnet12-nca", in_channels=3, **TINY["resnet12-nca"])
    assert [len(stage) for stage in model.stages] == [1, 1, 2, 1]
    assert all(isinstance(block, BasicBlock) for stage in model.stages for block in stage)
    stem_conv = model.stem[0]
    assert stem_conv.kernel_size == (3, 3) and stem_conv.stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert [stage[0].conv1.stride for stage in model.stages] == [(1, 1), (2, 2), (2, 2), (2, 2)]
    # the first stage keeps width and resolution: identity shortcut; the later ones downsample
    assert model.stages[0][0].downsample is None and model.stages[2][1].downsample is None
    for stage in list(model.stages)[1:]:
        shortcut = stage[0].downsample[0]
        assert shortcut.kernel_size == (1, 1) and shortcut.stride == (2, 2)
    assert not any(isinstance(m, torch.nn.LeakyReLU) for m in model.modules())


def test_resnet12_nca_rejects_wrong_layers(registry):
    with pytest.raises(UsageError, match="four positive block counts"):
        registry.create("backbone", "resnet12-nca", in_channels=1, layers=[1, 1, 2])


# -- WRN-28-10 -----------------------------------------------------------------

def wide_block(cin, cout):
    """BN, conv 3×3, BN, conv 3×3, and a 1×1 conv shortcut (no BN) when the shape changes."""
    shortcut = conv(cin, cout, 1) if cin != cout else 0
    return bn(cin) + conv(cin, cout, 3) + bn(cout) + conv(cout, cout, 3) + shortcut


def test_wrn28_10_size_layout_and_one_forward(registry, torch_seed):
    model = registry.create("backbone", "wrn28-10", in_channels=3).eval()
    expected = conv(3, 16, 3) + bn(640)  # stem, final BN
    for cin, cout in ((16, 160), (160, 320), (320, 640)):
        expected += wide_block(cin, cout) + 3 * wide_block(cout, cout)
    count = sum(p.numel() for p in model.parameters())
    assert count == expected
    # Zagoruyko & Komodakis report 36.5M parameters with the 10-class CIFAR classifier.
    assert round((count + 640 * 10 + 10) / 1e6, 1) == 36.5
    assert [len(group) for group in model.groups] == [4, 4, 4]
    assert model.stage_dims == [160, 320, 640] and model.out_dim == 640
    assert [group[0].conv1.stride for group in model.groups] == [(1, 1), (2, 2), (2, 2)]
    from fslab_plugins.backbones.networks import RowDropout

    assert not any(isinstance(m, (torch.nn.Dropout, RowDropout)) for m in model.modules())  # off by default
    with torch.no_grad():
        out = model(torch.randn(1, 3, 8, 8))
    assert out.shape == (1, 640) and torch.isfinite(out).all()


def test_wrn_block_is_pre_activation(registry, torch_seed):
    """Zagoruyko & Komodakis's block: the residual branch is
    conv(dropout(relu(bn(conv(relu(bn(x))))))), added to x (same width)."""
    from fslab_plugins.backbones.networks import WideBlock

    block = WideBlock(4, 4, 1, 0.0).eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        branch = block(x) - x  # identity shortcut
        activated = torch.relu(block.bn1(x))
        by_hand = block.conv2(torch.relu(block.bn2(block.conv1(activated))))
    assert torch.allclose(branch, by_hand, atol=1e-6)


def test_wrn_dropout_is_stochastic_only_in_training(registry, torch_seed):
    model = registry.create("backbone", "wrn28-10", in_channels=1, depth=10, widen_factor=1, dropout=0.3)
    x = torch.randn(2, 1, 8, 8)
    model.train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))


def test_wrn_dropout_under_gpus_keeps_its_rows_of_one_process_noise(registry):
    """Under --gpus N a process embeds a block of the batch's rows: its dropout must drop the units
    one process drops in those rows, and draw as much as the others (their generators stay in step)."""
    from fslab_plugins.backbones.networks import WideBlock

    from fslab.core.global_batch import BatchShare, sharing

    model = registry.create("backbone", "wrn28-10", in_channels=1, depth=10, widen_factor=1, dropout=0.3)
    drop = next(m for m in model.modules() if isinstance(m, WideBlock)).dropout.train()
    x = torch.rand(5, 4, 3, 3) + 1.0  # no unit is zero before dropout
    torch.manual_seed(0)
    whole, after_whole = drop(x), torch.rand(3)
    assert 0 < int((whole == 0).sum()) < whole.numel()
    for rows in (slice(0, 3), slice(3, 5)):  # a batch of 5 split unevenly over 2 processes
        torch.manual_seed(0)
        with sharing(BatchShare(rows, 5, lambda t: t)):
            part = drop(x[rows])
        assert torch.equal(part, whole[rows])
        assert torch.equal(torch.rand(3), after_whole)


@pytest.mark.parametrize("params, message", [({"depth": 27}, "6n \\+ 4"), ({"widen_factor": 0}, "widen_factor"),
                                             ({"dropout": 1.0}, "dropout")])
def test_wrn_rejects_impossible_shapes(registry, params, message):
    with pytest.raises(UsageError, match=message):
        registry.create("backbone", "wrn28-10", in_channels=1, **params)


# -- Lee et al.'s ResNet-12 --------------------------------------------------------

def test_full_resnet12_has_the_paper_widths(registry):
    model = registry.create("backbone", "resnet12", in_channels=3)
    widths = [stage.shortcut[0].out_channels for stage in model.stages]
    assert widths == [64, 160, 320, 640] and model.out_dim == 640
    assert not any(type(m).__name__ == "DropBlock" for m in model.modules())  # off by default
    # three 3×3 conv + BN per stage, 1×1 conv + BN shortcut
    expected, cin = 0, 3
    for width in (64, 160, 320, 640):
        expected += conv(cin, width, 3) + 2 * conv(width, width, 3) + 3 * bn(width) + conv(cin, width, 1) + bn(width)
        cin = width
    assert sum(p.numel() for p in model.parameters()) == expected


def test_resnet12_stage_layout_follows_lee_et_al(registry):
    model = registry.create("backbone", "resnet12", in_channels=1, **TINY["resnet12"])
    for stage in model.stages:
        convs = [m for m in stage.body if isinstance(m, torch.nn.Conv2d)]
        activations = [m for m in stage.body if isinstance(m, torch.nn.LeakyReLU)]
        assert [c.kernel_size for c in convs] == [(3, 3)] * 3
        assert len(activations) == 2  # the third follows the residual sum
        assert all(a.negative_slope == 0.1 for a in activations + [stage.activation])
        assert stage.shortcut[0].kernel_size == (1, 1)
        assert isinstance(stage.shortcut[1], torch.nn.BatchNorm2d)


def test_resnet12_rejects_wrong_widths(registry):
    with pytest.raises(UsageError, match="four positive"):
        registry.create("backbone", "resnet12", in_channels=1, widths=[8, 16, 32])


def test_dropblock_drops_blocks_in_training_only(torch_seed):
    from fslab_plugins.backbones.networks import DropBlock

    drop = DropBlock(drop_rate=0.2, block_size=3)
    x = torch.ones(16, 4, 12, 12)
    out = drop.train()(x)
    dropped = float((out == 0).float().mean())
    assert 0.1 < dropped < 0.3
    assert torch.allclose(out.mean(), torch.tensor(1.0))  # rescaled to keep the mean
    assert torch.equal(drop.eval()(x), x)


def test_resnet12_with_dropblock_is_stochastic_only_in_training(registry, torch_seed):
    model = registry.create("backbone", "resnet12", in_channels=1, widths=[8, 8, 8, 8], drop_rate=0.3)
    x = torch.randn(2, 1, 16, 16)
    model.train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))


def test_listing_plugins_imports_neither_torch_nor_numpy():
    code = textwrap.dedent(
        """
        import os, sys
        os.environ["FSLAB_PLUGINS"] = "nca,protonet,resnet12,synthetic,wrn"
        os.environ["FSLAB_STRICT_PLUGINS"] = "1"
        from fslab.core.registry import load_registry
        registry = load_registry()
        names = {kind: registry.names(kind)
                 for kind in ("loss", "backbone", "sampler", "evaluator", "dataset", "method")}
        assert names["backbone"] == ["conv4", "resnet12", "resnet12-nca", "wrn28-10"], names
        assert names["method"] == ["nca", "protonet"], names
        heavy = [m for m in ("torch", "numpy") if m in sys.modules]
        assert not heavy, heavy
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_a_run_evaluates_and_caches_multi_stage_features(project):
    """eval.feature_stages=2 end to end: the worker's training mean, its test and
    `fslab eval` all use the 16 values of the last two Conv4 stages, cached apart."""
    result = fslab_here("run", "nca", *TINY_RUN, "--epochs", "1", "--set", "eval.feature_stages=2", cwd=project)
    assert result.returncode == 0, result.stderr
    run_dir = next((project / "runs").iterdir())
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["train_mean"].shape == (16,)  # 2 stages × hidden 8
    final = json.loads((run_dir / "results.json").read_text())["test"]
    config = json.loads((run_dir / "config.json").read_text())
    args = ["eval", run_dir.name, "--shots", "5", "--queries", str(config["eval"]["queries"]),
            "--episodes", str(config["eval"]["test_episodes"]), "--json"]
    evaluated = fslab_here(*args, cwd=project)
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout.splitlines()[0])["accuracy"] == final["5-shot"]["accuracy"]
    cache = run_dir / "features" / "test-epoch1-stages2.pt"
    assert [p.name for p in (run_dir / "features").iterdir()] == [cache.name]
    assert torch.load(cache, weights_only=True)["features"].shape[1] == 16


@pytest.mark.slow
def test_a_backbone_without_that_many_stages_fails_at_start(project):
    result = fslab("run", "nca", *TINY_RUN, "--epochs", "1", "--set", "eval.feature_stages=5", cwd=project)
    assert result.returncode != 0
    assert "eval.feature_stages must be between 1 and 4" in result.stdout + result.stderr


# -- Conv-4 as the papers build it (head=flatten) ---------------------------------------------------


@pytest.mark.parametrize("size, cells", [(84, 25), (28, 1), (32, 4), (16, 1)])
def test_conv4_flatten_head_flattens_the_floor_pooled_map(registry, torch_seed, size, cells):
    """Snell et al.'s Conv-4: 84×84 -> a 5×5 map of 64 channels = 1,600 values; 28×28 -> 1×1 (64)."""
    model = registry.create("backbone", "conv4", in_channels=3, head="flatten", image_size=(size, size))
    assert model.out_dim == 64 * cells and model.stage_dims == [64, 64, 64, 64 * cells]
    x = torch.randn(2, 3, size, size)
    assert model(x).shape == (2, 64 * cells)
    assert model.features(x, 1).shape == (2, 64 * cells)
    assert model.features(x, 2).shape == (2, 64 + 64 * cells)  # earlier stages averaged, the last flattened


def test_conv4_flatten_at_28_keeps_the_top_left_two_by_two_of_a_three_by_three_map(registry, torch_seed):
    model = registry.create("backbone", "conv4", in_channels=1, hidden=8, head="flatten", image_size=(28, 28)).eval()
    x = torch.randn(3, 1, 28, 28)
    third = model.blocks[:12](x)  # three blocks: 28 -> 14 -> 7 -> 3
    assert third.shape[-2:] == (3, 3)
    before_pool = model.blocks[12:15](third)  # the fourth block's convolution, batch norm and ReLU
    expected = before_pool[..., :2, :2].amax(dim=(2, 3))
    assert torch.equal(model(x), expected)


def test_conv4_average_head_is_unchanged_and_loads_the_same_weights(registry, torch_seed):
    average = registry.create("backbone", "conv4", in_channels=3, hidden=8)
    flatten = registry.create("backbone", "conv4", in_channels=3, hidden=8, head="flatten", image_size=(84, 84))
    assert average.out_dim == 8 and average.blocks[3].ceil_mode and not flatten.blocks[3].ceil_mode
    assert list(average.state_dict()) == list(flatten.state_dict())  # the same parameters, another head
    flatten.load_state_dict(average.state_dict())


def test_conv4_flatten_needs_an_image_size_it_can_pool(registry):
    with pytest.raises(UsageError, match="head=flatten needs the image size"):
        registry.create("backbone", "conv4", in_channels=3, head="flatten")
    with pytest.raises(UsageError, match="at least 16×16"):
        registry.create("backbone", "conv4", in_channels=3, head="flatten", image_size=(12, 12))


@pytest.mark.slow
def test_a_run_with_the_flatten_head_trains_and_evaluates(project):
    """fslab tells the backbone the images' size in training and in fslab eval (32×32: a 2×2 map)."""
    result = fslab_here("run", "nca", *TINY_RUN, "--set", "dataset.image_size=32", "--set", "backbone.head=flatten",
                   "--epochs", "1", "--device", "cpu", cwd=project)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = (project / "runs").glob("2*")
    start = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["out_dim"] == 8 * 4  # hidden 8 × a 2×2 map
    evaluated = fslab_here("eval", run.name, "--episodes", "20", "--json", cwd=project)
    assert evaluated.returncode == 0, evaluated.stderr


class _Probe(torch.nn.Module):
    """A backbone whose output and declared out_dim a test chooses; counts its forwards."""

    def __init__(self, out_dim, pooled=True):
        super().__init__()
        self.conv, self.out_dim, self.pooled, self.calls = torch.nn.Conv2d(3, 4, 3, padding=1), out_dim, pooled, 0
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        self.calls += 1
        features = self.norm(self.conv(x))
        return features.mean((2, 3)) if self.pooled else features


@pytest.mark.parametrize("out_dim, pooled, message", [
    (4, True, None),
    (99, True, r"^backbone 'probe' returned features of shape \[2, 4\] for 2 images, not \[2, out_dim\] with "
                r"its out_dim=99$"),
    (4, False, r"shape \[2, 4, 6, 6\] .* out_dim=4: pool or flatten it to \[2, 144\]$"),
    (None, True, r"^backbone 'probe' must set self.out_dim to the number of values it returns per image \(an int\), "
                 r"got None$"),
    (4.0, True, r"got 4.0$"),
])
def test_a_run_checks_the_backbones_out_dim_before_it_trains(torch_seed, out_dim, pooled, message):
    """What the loss, its classifier and the projection are sized by is checked by one eval-mode forward
    that leaves the network as it was (the run's seeded weights and statistics untouched)."""
    from fslab.training.build import check_out_dim

    model = _Probe(out_dim, pooled).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if message is None:
        check_out_dim(model, "probe", (3, 6, 6), torch.device("cpu"))
        assert model.calls == 1 and model.training
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        return
    with pytest.raises(TypeError, match=message):
        check_out_dim(model, "probe", (3, 6, 6), torch.device("cpu"))


WRONG_OUT_DIM = '''
from torch import nn
from fslab.plugin import hookimpl


class Wrong(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.conv, self.out_dim = nn.Conv2d(in_channels, 8, 3, padding=1), 99

    def forward(self, x):
        return self.conv(x).mean((2, 3))


@hookimpl
def register_backbones(register):
    register(Wrong, name="wrong", description="declares 99 values, returns 8")
'''


def test_a_backbone_without_out_dim_or_forward_is_named_with_its_plugin_and_no_image_size_hint(torch_seed):
    """Without out_dim the line named the backbone but not its plugin, where every other line blaming a backbone
    names both; with forward misspelt (no forward) it advised naming image_size, which had nothing to do with it."""
    from fslab.training.build import check_out_dim

    named = "backbone 'probe' from plugin 'local:probe'"
    with pytest.raises(TypeError, match=rf"^{named} must set self.out_dim to the number of values"):
        check_out_dim(_Probe(None, True), "probe", (3, 6, 6), torch.device("cpu"), named=named)
    forwardless = _Probe(4, True)
    forwardless.forward = torch.nn.Module.forward.__get__(forwardless)  # nn.Module's: no forward of its own
    with pytest.raises(PluginError) as caught:
        check_out_dim(forwardless, "probe", (3, 6, 6), torch.device("cpu"), named=named)
    assert str(caught.value).startswith(f"{named} failed on 2 images of shape [2, 3, 6, 6]: NotImplementedError: ")
    assert "image_size" not in str(caught.value)


def test_a_backbone_with_a_wrong_out_dim_fails_its_run_at_the_start_naming_it(project):
    """A loss with a classifier (simpleshot) failed at its first step with PyTorch's shape error."""
    (project / "mine").mkdir()
    (project / "mine" / "wrong.py").write_text(WRONG_OUT_DIM)
    (project / "fslab.toml").write_text("[project]\nplugin_dirs = ['mine']\n")
    result = fslab_here("run", "simpleshot", *TINY_RUN[4:], "--backbone", "wrong", cwd=project)
    assert result.returncode == 1
    assert ("failed: TypeError: backbone 'wrong' from plugin 'local:wrong' returned features of shape [2, 8] for 2 "
            "images, not [2, out_dim] with its out_dim=99") in result.stderr
    (run,) = (project / "runs").iterdir()
    assert not [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if e["event"] == "train"]
