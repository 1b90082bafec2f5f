"""Backbones map a batch to (B, out_dim) features and train end to end;
plugin listing stays free of torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from fslab.errors import UsageError
from fslab.registry import keyword_params

TINY = {"conv4": {"hidden": 8}, "resnet12": {"widths": [8, 16, 16, 32]}}


@pytest.mark.parametrize(
    "name, params, channels, size, out_dim",
    [
        ("conv4", {}, 1, 16, 64),
        ("conv4", {"hidden": 8}, 3, 28, 8),
        ("conv4", {"hidden": 8}, 3, 5, 8),  # smaller than 2**4: pooling rounds up
        ("resnet12", TINY["resnet12"], 1, 16, 32),
        ("resnet12", TINY["resnet12"], 3, 21, 32),
    ],
)
def test_backbone_output_shape(registry, torch_seed, name, params, channels, size, out_dim):
    model = registry.create("backbone", name, in_channels=channels, **params)
    assert model.out_dim == out_dim
    assert model(torch.randn(3, channels, size, size)).shape == (3, out_dim)


@pytest.mark.parametrize("name", ["conv4", "resnet12"])
def test_every_parameter_gets_a_gradient(registry, torch_seed, name):
    model = registry.create("backbone", name, in_channels=1, **TINY[name])
    features = model(torch.randn(4, 1, 16, 16))
    (features**2).sum().backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, param_name
        assert torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("name", ["conv4", "resnet12"])
def test_lazy_registration_declares_the_real_parameters(registry, name):
    component = registry.get("backbone", name)
    assert isinstance(component.target, str)
    assert component.params == keyword_params(component.resolve())


def test_full_resnet12_has_the_paper_widths(registry):
    model = registry.create("backbone", "resnet12", in_channels=3)
    widths = [stage.shortcut[0].out_channels for stage in model.stages]
    assert widths == [64, 160, 320, 640] and model.out_dim == 640
    assert not any(type(m).__name__ == "DropBlock" for m in model.modules())  # off by default


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
    from fslab_plugins.networks import DropBlock

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
        os.environ["FSLAB_PLUGINS"] = "nca,protonet,resnet12,synthetic"
        os.environ["FSLAB_STRICT_PLUGINS"] = "1"
        from fslab.registry import load_registry
        registry = load_registry()
        names = {kind: registry.names(kind) for kind in ("loss", "backbone", "sampler", "evaluator", "dataset", "method")}
        assert names["backbone"] == ["conv4", "resnet12"], names
        assert names["method"] == ["nca", "protonet"], names
        heavy = [m for m in ("torch", "numpy") if m in sys.modules]
        assert not heavy, heavy
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
