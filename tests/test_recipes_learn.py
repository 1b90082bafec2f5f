"""Each method recipe of the paper plugins learns: on the built-in synthetic glyphs,
a tiny Conv4 trained for a short budget with the recipe's loss and sampler beats
both chance (20%) and the untrained network on 5-way 5-shot test episodes.

Runs in-process with the plugin objects and fslab.training.evaluation (no worker), one
thread (two threads are slower than one for these tiny convolutions on a 2-core
machine), about 40 s in all.
"""

from __future__ import annotations

import pytest
import torch

from fslab.core.config import resolve
from fslab.core.settings import Settings
from fslab.training import evaluation
from fslab.training.build import to_input

from .conftest import builtin_registry

pytestmark = pytest.mark.slow

# The entry points whose recipes are checked here (the core recipes `nca` and
# `protonet` also train end to end in test_lifecycle.py).
PAPER_PLUGINS = ("nca", "nca_ablations", "map", "large_margin", "sen")
HIDDEN, STEPS, LR = 16, 30, 0.05
EPISODES = 300


def recipes():
    registry = builtin_registry()
    return [n for n in registry.names("method") if registry.get("method", n).plugin in PAPER_PLUGINS]


@pytest.fixture(scope="module")
def setup():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    registry = builtin_registry()
    dataset = registry.create("dataset", "synthetic")
    train, test = dataset.load("train"), dataset.load("test")
    untrained = accuracy(fresh_network(registry), train, test, registry.create("evaluator", "centroid"))
    yield registry, train, test, untrained
    torch.set_num_threads(threads)


def fresh_network(registry):
    torch.manual_seed(0)
    return registry.create("backbone", "conv4", in_channels=1, hidden=HIDDEN)


def accuracy(network, train, test, classify):
    features = evaluation.extract_features(network, test.images, 512, "cpu", to_input)
    center = evaluation.extract_features(network, train.images[:1024], 512, "cpu", to_input).mean(0)
    accuracies = evaluation.episode_scores(features, test.labels, classify, 5, 5, 15, EPISODES, seed=0,
                                           center=center)
    return float(accuracies.mean())


def test_the_paper_recipes_are_all_checked():
    names = set(recipes())
    assert {"map-ssvm", "map-dlm", "lpn", "triplet", "sen", "ring", "supcon", "matchingnet", "protonet-noproto",
            "protonet-nosq", "protonet-noproto-nosq", "matchingnet-nosq", "protonet-snell", "protonet-best"} <= names


@pytest.mark.parametrize("method", recipes())
def test_recipe_learns_on_synthetic_glyphs(setup, method):
    registry, train, test, untrained = setup
    # every recipe whose batch follows train.batch_size at 128 (protonet-best states 512, the ablations
    # 256): the same budget for all; an explicit episode shape (ways given) fixes its own batch
    config = resolve(method, registry=registry, settings=Settings())
    if not config["sampler"].get("ways"):
        config = resolve(method, registry=registry, settings=Settings(), overrides=[{"train": {"batch_size": 128}}])
    network = fresh_network(registry)
    params = {k: v for k, v in config["loss"].items() if k != "name"}
    loss = registry.create("loss", config["loss"]["name"], **params,
                           context={"out_dim": HIDDEN, "num_classes": len(train.classes)})
    trainable = list(network.parameters()) + (list(loss.parameters()) if isinstance(loss, torch.nn.Module) else [])
    optimizer = torch.optim.SGD(trainable, lr=LR, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sampler_params = {k: v for k, v in config["sampler"].items() if k != "name"}
    sampler = registry.create("sampler", config["sampler"]["name"], labels=train.labels.tolist(),
                              batch_size=config["train"]["batch_size"], seed=0, **sampler_params)
    step, epoch = 0, 0
    network.train()
    while step < STEPS:
        for batch in sampler.batches(epoch):
            index = torch.as_tensor(batch.indices)
            support = None if batch.support is None else torch.as_tensor(batch.support)
            out = loss(network(to_input(train.images[index])), train.labels[index], support)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            step += 1
            if step == STEPS:
                break
        epoch += 1
    assert torch.isfinite(out.loss)
    classify = registry.create("evaluator", config["evaluator"]["name"])
    trained = accuracy(network, train, test, classify)
    assert trained > max(0.5, untrained + 0.08), f"{method}: {trained:.3f} (untrained {untrained:.3f}, chance 0.2)"
