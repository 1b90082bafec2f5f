"""Registry-driven contracts: every registered loss, sampler and method recipe,
whoever registered it, keeps the promises the trainer relies on."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from fslab.core.config import resolve
from fslab.core.errors import UsageError
from fslab.core.registry import load_registry
from fslab.core.settings import Settings

from .conftest import BUILTIN_PLUGINS


def builtin_registry():
    """fslab's own entry points, loaded strictly, outside any fixture (collection time)."""
    saved = {k: os.environ.get(k) for k in ("FSLAB_PLUGINS", "FSLAB_STRICT_PLUGINS")}
    os.environ["FSLAB_PLUGINS"], os.environ["FSLAB_STRICT_PLUGINS"] = BUILTIN_PLUGINS, "1"
    try:
        return load_registry()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _names(kind: str) -> list[str]:
    return builtin_registry().names(kind)


WAYS, SHOTS, QUERIES, DIM = 4, 3, 3, 16
# Parameters a sampler needs beyond its defaults to draw 32-row batches here.
SAMPLER_PARAMS = {"episodic": {"shots": 2, "per_class": 4}}


def episode():
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(WAYS).repeat_interleave(SHOTS + QUERIES)
    support = torch.tensor(([True] * SHOTS + [False] * QUERIES) * WAYS)
    z = (0.5 * torch.randn(len(labels), DIM, generator=generator)).requires_grad_()
    return z, labels, support


def build_loss(registry, name):
    return registry.create("loss", name, context={"out_dim": DIM, "num_classes": WAYS})


def check_count(value):
    if isinstance(value, torch.Tensor):
        assert value.dim() == 0 and not value.is_floating_point(), f"count {value!r} is not a 0-d integer tensor"
    else:
        assert isinstance(value, int)
    assert int(value) >= 0


@pytest.mark.parametrize("name", _names("loss"))
def test_loss_contract(registry, name):
    torch.manual_seed(0)
    loss = build_loss(registry, name)
    episodic = registry.get("loss", name).info.get("episodic", False)
    for support in ([episode()[2]] if episodic else [episode()[2], None]):
        z, labels, _ = episode()
        out = loss(z, labels, support)
        assert out.loss.dim() == 0 and torch.isfinite(out.loss), f"{name}: loss {out.loss}"
        check_count(out.positives)
        check_count(out.negatives)
        for key, value in (out.extra or {}).items():
            assert torch.isfinite(torch.as_tensor(value, dtype=torch.float64)), f"{name}: extra {key}"
        out.loss.backward()
        assert torch.isfinite(z.grad).all(), f"{name}: non-finite gradient"
        assert (z.grad.abs().sum(dim=1) > 0).all(), f"{name}: some embedding rows get no gradient"
        if isinstance(loss, torch.nn.Module):
            for parameter_name, parameter in loss.named_parameters():
                assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), parameter_name
                parameter.grad = None


@pytest.mark.parametrize("name", [n for n in _names("loss") if builtin_registry().get("loss", n).info.get("episodic")])
def test_episodic_losses_refuse_a_batch_without_support_rows(registry, name):
    z, labels, _ = episode()
    with pytest.raises(UsageError, match="episodic sampler"):
        build_loss(registry, name)(z, labels, None)


def sampler_labels():
    return [c for c in range(30) for _ in range(8 + c % 5)]


def indices(sampler, epoch):
    return [list(batch.indices) for batch in sampler.batches(epoch)]


@pytest.mark.parametrize("name", _names("sampler"))
def test_sampler_contract(registry, name):
    labels = sampler_labels()
    sampler = registry.create("sampler", name, labels=labels, batch_size=32, seed=0, **SAMPLER_PARAMS.get(name, {}))
    episodic = registry.get("sampler", name).info.get("episodic", False)
    batches = list(sampler.batches(0))
    assert len(batches) == len(sampler) > 0
    for batch in batches:
        assert len(batch.indices) == 32
        assert len(set(batch.indices)) == len(batch.indices), f"{name}: an image repeats within a batch"
        assert all(0 <= i < len(labels) for i in batch.indices)
        if episodic:
            assert batch.support is not None and len(batch.support) == len(batch.indices)
            assert any(batch.support) and not all(batch.support)
            support_labels = {labels[i] for i, s in zip(batch.indices, batch.support) if s}
            assert {labels[i] for i in batch.indices} <= support_labels  # every query class has support
        else:
            assert batch.support is None
    clone = pickle.loads(pickle.dumps(sampler))
    assert indices(clone, 3) == indices(sampler, 3), f"{name}: not deterministic after pickling"
    assert indices(sampler, 3) != indices(sampler, 4), f"{name}: epochs give the same batches"


@pytest.mark.parametrize("name", _names("method"))
def test_every_recipe_resolves_and_names_its_paper(registry, name):
    config = resolve(name, registry=registry, settings=Settings())
    assert config["method"] == name
    component = registry.get("method", name)
    assert component.paper and component.description
    recipe = registry.create("method", name)
    assert {"loss", "sampler"} <= set(recipe)


@pytest.mark.parametrize("name", _names("evaluator"))
def test_evaluator_contract(registry, name):
    """Every evaluator scores episodes in [0, 1], the same twice, and knows its paper;
    a model-aware one leaves the caller's network unchanged."""
    from fslab.core.types import evaluator_traits
    from fslab.training import evaluation

    component = registry.get("evaluator", name)
    assert component.paper and component.description
    evaluator = registry.create("evaluator", name)
    traits = evaluator_traits(evaluator)
    labels = torch.arange(6).repeat_interleave(12)
    generator = torch.Generator().manual_seed(0)
    (shots, queries), = evaluation.episode_shapes(evaluator, [3], 4)
    if traits.needs_model:
        from fslab_plugins.backbones.networks import Conv4

        torch.manual_seed(0)
        model = Conv4(1, hidden=4)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        images = torch.randint(0, 256, (len(labels), 1, 12, 12), generator=generator, dtype=torch.uint8)
        def run():
            return evaluation.run_episodes(evaluator, labels, 3, shots, queries, 2, seed=0, model=model,
                                           images=images, to_input=lambda x: x.float() / 255, device="cpu")

        scores = run()
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), f"{name}: changed the network"
    else:
        features = torch.randn(len(labels), DIM, generator=generator) + torch.randn(6, DIM, generator=generator)[labels]
        def run():
            return evaluation.episode_scores(features, labels, evaluator, 3, shots, queries, 20, seed=0)

        scores = run()
    assert scores.dim() == 1 and torch.isfinite(scores).all() and bool(((scores >= 0) & (scores <= 1)).all())
    assert torch.equal(scores, run()), f"{name}: not deterministic"
