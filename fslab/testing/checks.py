"""fslab's contracts, one check per kind of component: what the trainer and
the evaluation core rely on, asserted on a registered component by name.

Each ``check_*`` function builds the component from a registry with small,
seeded inputs and raises AssertionError (with the component's name) when a
promise is broken. :class:`fslab.testing.ContractTests` calls them for every
component of a plugin; they can also be called from a plugin's own tests.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
from torch import nn

from fslab.core.param_defaults import mistyped_default
from fslab.core.registry import Registry, keyword_params
from fslab.core.types import evaluator_traits, trait_problem
from fslab.plugin import Backbone, Batch, Dataset, LossOutput, Sampler, SizedDataset, Split, UsageError

WAYS, SHOTS, QUERIES, DIM = 4, 3, 3, 16
# The batch's classes as a run numbers them: the training split's class numbers (of CLASSES), not 0..WAYS-1
BATCH_CLASSES, CLASSES = (9, 2, 6, 4), 10


def episode(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Embeddings ``[24, 16]`` of 4 classes × (3 support + 3 query rows), labels and support marks."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor(BATCH_CLASSES).repeat_interleave(SHOTS + QUERIES)
    support = torch.tensor(([True] * SHOTS + [False] * QUERIES) * WAYS)
    z = (0.5 * torch.randn(len(labels), DIM, generator=generator)).requires_grad_()
    return z, labels, support


def check_count(name: str, what: str, value: Any, most: int) -> int:
    """A pair count: an int or a 0-d integer tensor, between 0 and ``most``."""
    if isinstance(value, torch.Tensor):
        assert value.dim() == 0 and not value.is_floating_point(), \
            f"{name}: {what} {value!r} is not an int or a 0-d integer tensor"
    else:
        assert isinstance(value, int) and not isinstance(value, bool), f"{name}: {what} {value!r} is not an int"
    assert 0 <= int(value) <= most, f"{name}: {what} = {int(value)}, outside 0..{most} (the batch's unordered pairs)"
    return int(value)


def build_loss(registry: Registry, name: str) -> Any:
    return registry.create("loss", name, context={"out_dim": DIM, "num_classes": CLASSES})


def call_loss(loss: Any, name: str, z: torch.Tensor, labels: torch.Tensor, marks) -> Any:
    """``loss(z, labels, marks)``; one that raises on the split's class numbers but not on
    the batch's classes renumbered 0..WAYS-1 is told that a run does not renumber them."""
    try:
        return loss(z, labels, marks)
    except Exception as error:
        renumbered = torch.unique(labels, return_inverse=True)[1]
        try:
            loss(z.detach().clone().requires_grad_(), renumbered, marks)
        except Exception:
            raise error from None
        raise AssertionError(
            f"{name}: raised {type(error).__name__}: {error} on a batch of classes "
            f"{', '.join(map(str, BATCH_CLASSES))} of {CLASSES}, and not with them renumbered 0..{WAYS - 1}; a run "
            f"passes the training split's class numbers, the same in every batch, not renumbered per batch") from error


def check_loss(registry: Registry, name: str) -> None:
    """A finite scalar loss that gives every embedding (and every parameter of
    the loss) a finite gradient; pair counts within the batch's unordered
    same-class and different-class pairs; the same value twice for a seed."""
    from fslab.training.outputs import check_extra

    episodic = registry.get("loss", name).info.get("episodic", False)
    _, labels, support = episode()
    same = int((labels[:, None] == labels[None, :]).triu(1).sum())
    different = len(labels) * (len(labels) - 1) // 2 - same
    for marks in ([support] if episodic else [support, None]):
        torch.manual_seed(0)
        loss = build_loss(registry, name)
        z = episode()[0]
        try:
            out = call_loss(loss, name, z, labels, marks)
        except Exception as error:
            if marks is not None or isinstance(error, AssertionError):
                raise
            raise AssertionError(f"{name}: raised {type(error).__name__}: {error} when called with support=None, "
                                 f"as a sampler that marks no support rows calls it; a loss that needs the marks "
                                 f"registers with episodic=True") from error
        assert isinstance(out, LossOutput), \
            f"{name}: returned a {type(out).__name__}, not LossOutput(loss, positives, negatives)"
        assert isinstance(out.loss, torch.Tensor) and out.loss.dim() == 0, \
            f"{name}: the loss is not a 0-d tensor" + (f" (shape {list(out.loss.shape)}; reduce it over the "
                                                       f"batch, e.g. .mean())" if torch.is_tensor(out.loss) else "")
        assert out.loss.requires_grad, (f"{name}: the loss has no gradient; compute it from z with differentiable "
                                        f"operations (not .detach(), .item(), argmax or a constant)")
        assert torch.isfinite(out.loss), f"{name}: loss {out.loss}"
        check_count(name, "positives", out.positives, same)
        check_count(name, "negatives", out.negatives, different)
        try:  # the check a run makes of every step's output: one fact, one place
            check_extra(out.extra, f"{name}:")
        except TypeError as error:
            raise AssertionError(str(error)) from None
        for key, value in (out.extra or {}).items():
            assert torch.isfinite(torch.as_tensor(value, dtype=torch.float64)).all(), f"{name}: extra {key}"
        out.loss.backward()
        assert z.grad is not None and torch.isfinite(z.grad).all(), f"{name}: missing or non-finite gradient"
        assert (z.grad.abs().sum(dim=1) > 0).all(), f"{name}: some embedding rows get no gradient"
        if isinstance(loss, nn.Module):
            for parameter_name, parameter in loss.named_parameters():
                assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), \
                    f"{name}: parameter {parameter_name} gets no finite gradient"
        torch.manual_seed(0)
        again = build_loss(registry, name)(episode()[0], labels, marks)
        assert torch.equal(out.loss.detach(), again.loss.detach()), f"{name}: not deterministic for a seed"
        if isinstance(loss, nn.Module):
            check_loss_restores(registry, name, loss, labels, marks)


def check_loss_restores(registry: Registry, name: str, loss: nn.Module, labels: torch.Tensor, marks) -> None:
    """A loss module that has seen a batch, and a new one given its ``state_dict`` (what a
    resumed run does with the checkpoint's ``loss``), give the same loss on the next batch:
    what the loss measured or learned on the first (a margin, a radius) is in its state."""
    restored = build_loss(registry, name)
    restored.load_state_dict(loss.state_dict())
    z = episode(1)[0]
    torch.manual_seed(1)
    expected = loss(z, labels, marks).loss.detach()
    torch.manual_seed(1)
    got = restored(z.detach().clone().requires_grad_(), labels, marks).loss.detach()
    assert torch.equal(expected, got), (
        f"{name}: a copy given its state_dict after one batch computes {float(got):.6g} on the next batch, "
        f"the loss itself {float(expected):.6g}; a resumed run restores the loss from its state_dict, so keep "
        f"what it measures or learns in parameters or buffers (register_buffer), or set it again in a "
        f"load_state_dict hook")


def checked_params(registry: Registry, kind: str, name: str, params: dict | None) -> dict:
    """``params`` for component ``name`` checked as a run's configuration is (the names it declares,
    their types, its ``allowed`` rules), its defaults filled in: a contract checked with a value a run
    refuses (``distance="manhattan"`` where ``one_of("euclidean", "cosine")`` is declared) proved nothing."""
    from fslab.core.errors import ConfigError
    from fslab.core.plugin_params import plugin_params

    try:
        return plugin_params(registry, kind, name, params or {})
    except ConfigError as error:
        raise AssertionError(f"{name}: the parameters given to its contract test are not a run's: {error}") from None


def build_backbone(registry: Registry, name: str, params: dict, channels: int, image_size: tuple[int, int]):
    return registry.create("backbone", name, in_channels=channels, context={"image_size": image_size}, **params)


def check_backbone(registry: Registry, name: str, params: dict | None = None, image_size: tuple[int, int] = (16, 16),
                   channels: int = 3) -> None:
    """Images ``[2, C, H, W]`` to finite features ``[2, out_dim]``; every
    parameter gets a gradient; ``features(x, k)`` of a multi-stage backbone
    has the width of its last ``k`` stages; the same weights for a seed; the
    same training forward once restored from its ``state_dict``."""
    params = checked_params(registry, "backbone", name, params)
    torch.manual_seed(0)
    model = build_backbone(registry, name, params, channels, image_size)
    assert isinstance(model, nn.Module) and isinstance(model, Backbone), f"{name}: not an nn.Module with out_dim"
    torch.manual_seed(0)
    twin = build_backbone(registry, name, params, channels, image_size)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values())), \
        f"{name}: two backbones built after the same seed differ"
    x = torch.randn(2, channels, *image_size, generator=torch.Generator().manual_seed(0))
    features = model(x)
    assert tuple(features.shape) == (2, model.out_dim), \
        f"{name}: features {tuple(features.shape)}, expected (2, out_dim={model.out_dim})"
    assert torch.isfinite(features).all(), f"{name}: non-finite features"
    features.pow(2).sum().backward()
    for parameter_name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), \
                f"{name}: parameter {parameter_name} gets no finite gradient"
    dims = getattr(model, "stage_dims", None)
    if dims:
        assert callable(getattr(model, "features", None)), f"{name}: stage_dims without features(x, stages)"
        for stages in range(1, len(dims) + 1):
            width = model.features(x, stages).shape
            assert tuple(width) == (2, sum(dims[-stages:])), \
                f"{name}: features(x, {stages}) is {tuple(width)}, expected (2, {sum(dims[-stages:])})"
    check_backbone_restores(registry, name, params, channels, image_size, model)
    check_backbone_channels(registry, name, params, 1 if channels != 1 else 3, image_size)


def check_backbone_channels(registry: Registry, name: str, params: dict, channels: int,
                            image_size: tuple[int, int]) -> None:
    """Built for images of other channels (1 for Omniglot's grayscale, 3 for colour), it
    takes them: its first layer is sized by ``in_channels``, not for one kind of image. One that
    refuses them as it is built, in one line (a UsageError: colour images only), says so to a run."""
    torch.manual_seed(0)
    try:
        model = build_backbone(registry, name, params, channels, image_size).eval()
    except UsageError:
        return
    x = torch.zeros(2, channels, *image_size)
    try:
        with torch.no_grad():
            shape = tuple(model(x).shape)
    except Exception as error:
        raise AssertionError(f"{name}: built with in_channels={channels}, raised {type(error).__name__}: {error} on "
                             f"images of {channels} channel(s); size the first layer by in_channels (1 for a "
                             f"grayscale dataset such as omniglot)") from error
    assert shape == (2, model.out_dim), \
        f"{name}: built with in_channels={channels}, features {shape}, expected (2, out_dim={model.out_dim})"


def check_backbone_restores(registry: Registry, name: str, params: dict, channels: int,
                            image_size: tuple[int, int], model: nn.Module) -> None:
    """A backbone that has trained on a batch, and a new one given its ``state_dict`` (what a
    resumed run does with the checkpoint's ``model``), compute the same training forward on the
    next batch, the same random numbers drawn: what the backbone counts or measures as it trains
    (the steps of a DropBlock schedule) is in its state."""
    torch.manual_seed(1)
    restored = build_backbone(registry, name, params, channels, image_size)
    restored.load_state_dict(model.state_dict())
    model.train(), restored.train()
    x = torch.randn(2, channels, *image_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.manual_seed(2)
        expected = model(x)
        torch.manual_seed(2)
        got = restored(x)
    assert torch.equal(expected, got), (
        f"{name}: a copy given its state_dict after a training batch computes other features on the next one; "
        f"a resumed run restores the backbone from its state_dict, so keep what it counts or measures in "
        f"training in parameters or persistent buffers (register_buffer), not in attributes")


def sampler_labels() -> list[int]:
    """30 classes of 8 to 12 images."""
    return [c for c in range(30) for _ in range(8 + c % 5)]


def _indices(sampler, epoch: int) -> list[list[int]]:
    return [list(batch.indices) for batch in sampler.batches(epoch)]


def check_sampler(registry: Registry, name: str, params: dict | None = None, batch_size: int = 32) -> None:
    """``len()`` batches of ``batch_size`` distinct, valid indices; an episodic
    sampler marks support and query rows and gives every query class support;
    batches depend on the seed and the epoch only (and survive pickling), and
    another seed gives others."""
    labels, params = sampler_labels(), checked_params(registry, "sampler", name, params)
    rows_of = registry.get("sampler", name).info.get("batch")
    if rows_of is not None:  # its own parameters fix a batch's rows (an episode's), as a run's batch size then says
        batch_size = rows_of({**registry.get("sampler", name).params, **params}, batch_size)
    def build(seed: int):
        return registry.create("sampler", name, labels=labels, batch_size=batch_size, seed=seed, **params)

    sampler = build(0)
    assert isinstance(sampler, Sampler), f"{name}: no len() or batches(epoch)"
    episodic = registry.get("sampler", name).info.get("episodic", False)
    batches = list(sampler.batches(0))
    for batch in batches:
        assert isinstance(batch, Batch), \
            f"{name}: batches(epoch) yielded a {type(batch).__name__}, not Batch(indices, support)"
    assert len(batches) == len(sampler) > 0, f"{name}: {len(batches)} batches, len() says {len(sampler)}"
    for batch in batches:
        assert len(batch.indices) == batch_size, f"{name}: a batch of {len(batch.indices)}, not {batch_size}"
        assert len(set(batch.indices)) == len(batch.indices), f"{name}: an image repeats within a batch"
        assert all(0 <= i < len(labels) for i in batch.indices), f"{name}: an index outside the dataset"
        if episodic:
            assert batch.support is not None and len(batch.support) == len(batch.indices), \
                f"{name}: an episodic sampler must mark each row support or query"
            assert any(batch.support) and not all(batch.support), f"{name}: an episode needs support and query rows"
            with_support = {labels[i] for i, s in zip(batch.indices, batch.support) if s}
            assert {labels[i] for i in batch.indices} <= with_support, f"{name}: a query class has no support"
        else:
            assert batch.support is None, f"{name}: a sampler not registered episodic=True marks support rows"
    assert _indices(build(0), 3) == _indices(sampler, 3), f"{name}: not deterministic for a seed"
    assert _indices(pickle.loads(pickle.dumps(sampler)), 3) == _indices(sampler, 3), \
        f"{name}: not deterministic after pickling"
    assert _indices(sampler, 3) != _indices(sampler, 4), f"{name}: epochs give the same batches"
    assert _indices(build(1), 3) != _indices(sampler, 3), \
        f"{name}: seeds 0 and 1 give the same batches; draw them from the seed it is given (a run's --seed)"


class TinyNet(nn.Module):
    """A one-layer network for model-aware evaluators."""

    def __init__(self, channels: int, size: int, out_dim: int = 8):
        super().__init__()
        self.out_dim = out_dim
        self.layer = nn.Linear(channels * size * size, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.flatten(1))


def check_evaluator(registry: Registry, name: str, params: dict | None = None) -> None:
    """Scores in [0, 1] per episode, the same twice for a seed; an accuracy
    evaluator finds well-separated classes (as nearest centroid does); a
    model-aware one leaves the caller's network unchanged."""
    from fslab.training import evaluation

    try:
        _check_evaluator(registry, name, params)
    except evaluation.EvaluatorError as error:  # it raised, or returned the wrong shape: say which evaluator
        raise AssertionError(error.naming(name)) from error


def _check_evaluator(registry: Registry, name: str, params: dict | None) -> None:
    from fslab.training import evaluation

    evaluator = registry.create("evaluator", name, **checked_params(registry, "evaluator", name, params))
    problem = trait_problem(registry.get("evaluator", name).resolve())  # a lazy target's, read once imported
    assert problem is None, f"{name}: {problem}"
    traits = evaluator_traits(evaluator)
    labels = torch.arange(6).repeat_interleave(12)
    generator = torch.Generator().manual_seed(0)
    (shots, queries), = evaluation.episode_shapes(evaluator, [3], 4)
    if traits.needs_model:
        torch.manual_seed(0)
        model = TinyNet(1, 12)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        images = torch.randint(0, 256, (len(labels), 1, 12, 12), generator=generator, dtype=torch.uint8)
        def run():
            return evaluation.run_episodes(evaluator, labels, 3, shots, queries, 2, seed=0, model=model,
                                           images=images, to_input=lambda x: x.float() / 255, device="cpu")

        scores = run()
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), f"{name}: changed the network"
    else:
        centres = 4 * torch.randn(6, DIM, generator=generator)
        features = centres[labels] + 0.1 * torch.randn(len(labels), DIM, generator=generator)
        def run():
            return evaluation.episode_scores(features, labels, evaluator, 3, shots, queries, 20, seed=0)

        scores = run()
        if traits.metric == "accuracy":
            assert float(scores.mean()) > 0.9, \
                f"{name}: {float(scores.mean()):.2f} accuracy on well-separated classes (nearest centroid: 1.0)"
        check_scores_follow_features(name, evaluator, traits, labels, shots, queries, generator)
    assert scores.dim() == 1 and torch.isfinite(scores).all(), f"{name}: scores {scores}"
    assert bool(((scores >= 0) & (scores <= 1)).all()), f"{name}: a score outside [0, 1]"
    assert torch.equal(scores, run()), f"{name}: not deterministic for a seed"


def check_scores_follow_features(name: str, evaluator: Any, traits: Any, labels: torch.Tensor, shots: int,
                                 queries: int, generator: torch.Generator) -> None:
    """On features without class structure, episodes score differently, and near chance: an
    evaluator that scores every episode from the first (written for one episode), or predicts
    from where each query sits in its episode, scored 1.0 on the well-separated ones too."""
    from fslab.training import evaluation

    noise = torch.randn(len(labels), DIM, generator=generator)
    scores = evaluation.episode_scores(noise, labels, evaluator, 3, shots, queries, 20, seed=0)
    if traits.metric == "accuracy":
        assert float(scores.mean()) < 0.9, (
            f"{name}: {float(scores.mean()):.2f} accuracy on features without class structure (chance: 0.33); "
            f"predict from the features, not from where a query sits in its episode")
    assert not bool((scores == scores[0]).all()), (
        f"{name}: the 20 episodes of features without class structure all score {float(scores[0]):.2f}; score "
        f"each of the E episodes it is given from its own support and query features (not the first for all)")


def check_dataset(registry: Registry, name: str, args: dict) -> None:
    """Built as ``Dataset(root, **params)`` from ``args``: each split uint8
    images ``[N, channels, H, W]`` and int64 labels numbered 0..classes-1,
    every class present; the same twice; ``split_sizes()`` as loaded."""
    args = dict(args)
    dataset = registry.create("dataset", name, root=args.pop("root", None), **args)
    assert isinstance(dataset, Dataset), f"{name}: no channels or load(split)"
    sizes = dataset.split_sizes() if isinstance(dataset, SizedDataset) else {}
    for split_name in ("train", "val", "test"):
        try:
            split = dataset.load(split_name)
        except Exception as error:  # a split it does not give: say which, rather than a bare KeyError: 'val'
            raise AssertionError(f"{name}: load({split_name!r}) raised {type(error).__name__}: {error}; a dataset "
                                 f"gives each of the splits 'train', 'val' and 'test'") from error
        assert isinstance(split, Split), f"{name}: load({split_name!r}) is not a Split"
        images, labels = split.images, split.labels
        assert images.dtype == torch.uint8 and images.dim() == 4, f"{name}: {split_name} images not uint8 [N, C, H, W]"
        assert images.shape[1] == dataset.channels, f"{name}: {split_name} images have {images.shape[1]} channels, " \
                                                    f"the dataset says {dataset.channels}"
        assert labels.dtype == torch.int64 and tuple(labels.shape) == (images.shape[0],), \
            f"{name}: {split_name} labels not int64 [N]"
        assert len(labels) == 0 or int(labels.min()) >= 0, \
            f"{name}: {split_name} labels include {int(labels.min())}; they number its classes 0..classes-1"
        counts = torch.bincount(labels, minlength=len(split.classes))
        assert len(counts) == len(split.classes) and bool((counts > 0).all()), \
            f"{name}: {split_name} labels must number its {len(split.classes)} classes 0..classes-1, each present"
        again = dataset.load(split_name)
        assert torch.equal(again.images, images) and torch.equal(again.labels, labels), \
            f"{name}: {split_name} differs between two loads"
        if split_name in sizes:
            assert sorted(sizes[split_name]) == sorted(counts.tolist()), \
                f"{name}: split_sizes()[{split_name!r}] does not match the images load() gives"


def check_parameters(registry: Registry, kind: str, name: str) -> None:
    """What ``register()`` declares (``params``) is what the target takes:
    its keyword-only parameters and their defaults, a lazy ``"module:attr"``
    target imported to compare; and it has a description."""
    component = registry.get(kind, name)
    assert component.description, f"{kind} {name}: register(..., description=...) is empty"
    target = component.resolve()
    signature = keyword_params(target, kind)
    # 1 == 1.0 in Python: a declared 1 where the signature says 1.0 made a run take whole numbers only
    assert component.params == signature and all(
        type(value) is type(signature[param]) for param, value in component.params.items()), (
        f"{kind} {name}: register() declares params {component.params}, "
        f"the keyword-only parameters of {component.target!r} are {signature}")
    mistyped = mistyped_default(target, component.params, f"sinks.{name}" if kind == "sink" else kind)
    if mistyped is not None:
        raise AssertionError(f"{kind} {name}: {mistyped}")


def check_method(registry: Registry, name: str) -> None:
    """A recipe that resolves to a full configuration naming installed components."""
    from fslab.core.config import resolve
    from fslab.core.settings import Settings

    recipe = registry.create("method", name)
    assert isinstance(recipe, dict), f"method {name}: a recipe is a dict"
    config = resolve(name, registry=registry, settings=Settings())
    assert config["method"] == name
    for kind in ("loss", "sampler", "evaluator", "backbone", "dataset"):
        registry.get(kind, config[kind]["name"])


def check_study(registry: Registry, name: str, tmp_path) -> None:
    """A study whose every run resolves at both scales as ``fslab study run`` resolves it (its
    methods installed, its settings valid, each published cell one its runs evaluate)."""
    from fslab.core.settings import Settings
    from fslab.core.studies import SCALES, find_study
    from fslab.core.study_plan import resolve_study

    study = find_study(registry, name)
    assert study.name == name, f"study {name}: its file names it '{study.name}'"
    for scale in SCALES:
        resolved = resolve_study(study, scale, settings=Settings(runs_dir=tmp_path / "runs"), registry=registry)
        assert len(resolved) == study.run_count(scale) > 0, f"study {name}: no runs at scale {scale}"


def sink_config(registry: Registry, name: str, params: dict) -> dict:
    """A resolved configuration to feed a sink: the ``nca`` recipe with this
    sink named in ``sinks``, or a small one where ``nca`` is not installed."""
    from fslab.core.config import resolve
    from fslab.core.settings import Settings

    sinks = {"sinks": {name: params}}
    if "nca" in registry.names("method"):
        return resolve("nca", registry=registry, settings=Settings(), overrides=[sinks])
    return {"method": "nca", "seed": 0, "loss": {"name": "nca", "temperature": 0.9}, "backbone": {"name": "conv4"},
            "dataset": {"name": "synthetic"}, "evaluator": {"name": "centroid"},
            "train": {"epochs": 2, "batch_size": 32, "lr": 0.1, "milestones": [1]},
            "eval": {"ways": 5, "shots": [1, 5], "queries": 15, "test_episodes": 100}, **sinks}


def sink_events(epochs: int = 2, steps: int = 2) -> list[dict]:
    """What a short run's worker writes to ``metrics.jsonl``, in its order and
    with its fields: ``start``; per epoch ``train`` events, a validation
    ``eval`` and a ``checkpoint``; then a test ``eval`` per shot and ``end``."""
    def evaluation(split: str, shots: int, accuracy: float, **at) -> dict:
        return {"event": "eval", "time": 1.7e9 + at["step"], "split": split, "ways": 5, "shots": shots,
                "queries": 15, "episodes": 100, "evaluator": "centroid", "metric": "accuracy", "accuracy": accuracy,
                "ci95": 0.0123, **at}

    events = [{"event": "start", "time": 1.7e9, "device": "cpu", "epochs": epochs, "steps_per_epoch": steps,
               "total_steps": epochs * steps, "train_images": 64 * steps, "backbone_params": 29_000, "out_dim": 64,
               "processes": 1, "precision": "fp32", "eval_precision": "fp32", "channels_last": False,
               "compile": "off", "tf32": False, "deterministic": False,
               "data": {split: {"images": images, "classes": classes, "labels": "0123456789abcdef"}
                        for split, images, classes in (("train", 64 * steps, 16), ("val", 160, 8), ("test", 200, 10))}}]
    step = 0
    for epoch in range(1, epochs + 1):
        for _ in range(steps):
            step += 1
            events.append({"event": "train", "time": 1.7e9 + step, "step": step, "epoch": epoch,
                           "loss": 2.0 / step, "positives": 96, "negatives": 1920, "lr": 0.1, "images_per_s": 250.0,
                           "rows_without_positive": 1.0})  # a counter of the loss's own (LossOutput.extra)
        events.append(evaluation("val", 5, 0.5 + 0.1 * epoch, epoch=epoch, step=step))
        events.append({"event": "checkpoint", "time": 1.7e9 + step, "epoch": epoch, "step": step,
                       "path": "checkpoints/last.pt"})
    test = {shots: evaluation("test", shots, 0.4 + 0.08 * shots, step=step) for shots in (1, 5)}
    events += test.values()
    events.append({"event": "end", "time": 1.7e9 + step, "results": {
        f"{shots}-shot": {"accuracy": e["accuracy"], "ci95": e["ci95"]} for shots, e in test.items()}})
    return events


def _files_under(folder) -> list[str]:
    """Every file and link under ``folder``, by its path relative to it."""
    import os

    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def _snapshot(folder) -> dict[str, tuple[bool, bytes]]:
    """Every file under ``folder``: whether it is a link, and its bytes (a link's: where it points, and
    whether anything is there)."""
    import os

    def held(full: str) -> tuple[bool, bytes]:
        if os.path.islink(full):
            return True, os.fsencode(os.readlink(full)) + (b"" if os.path.exists(full) else b" (dangling)")
        with open(full, "rb") as file:
            return False, file.read()

    return {path: held(os.path.join(folder, path)) for path in _files_under(folder)}


def _kept(before: tuple[bool, bytes], after: tuple[bool, bytes] | None) -> bool:
    """Whether a file (or link) ``before`` is still there ``after``: as it was, or a file only added to."""
    return after == before or (after is not None and not (before[0] or after[0]) and after[1].startswith(before[1]))


class _CutShort(Exception):
    """What stops the export the sink check cuts short."""


def _export_cut_short(registry: Registry, name: str, run, params: dict, events: list[dict]) -> None:
    """An export of ``run`` (``run.replay``) stopped after ``events``: ``run.cut_short`` at ``close()``."""
    from fslab.core.sinks import replay

    def cut():
        yield from events
        raise _CutShort

    try:
        replay(registry, name, run, params, cut())
    except _CutShort:
        pass


def check_cut_short(registry: Registry, name: str, run, params: dict, events: list[dict], folder) -> None:
    """Exports of ``run`` (``run.replay``) cut short (``run.cut_short`` at ``close()``), before their first
    event and then after half of ``events``, keep the record the earlier, whole export left: every file under
    ``folder`` stays as it was, or, a log the sink keeps of its own, is only added to, and by no more lines
    after half the events than before the first (more are the events' records written a second time)."""
    import dataclasses

    before = _snapshot(folder)
    _export_cut_short(registry, name, dataclasses.replace(run, cut_short=False), params, [])
    opened = _snapshot(folder)
    _export_cut_short(registry, name, run, params, events[:len(events) // 2])
    after = _snapshot(folder)
    lost = [path for path, held in before.items()
            if not (_kept(held, opened.get(path)) and _kept(opened[path], after.get(path)))]
    assert not lost, (f"sink {name}: an export cut short (run.cut_short at close()) did not keep the earlier "
                      f"export's record: {', '.join(lost[:5])} {'was' if len(lost) == 1 else 'were'} changed or "
                      f"removed; export into new files that take the old ones' place at close() unless "
                      f"run.cut_short, as fslab's own sinks do")

    def added(path: str, old: dict, new: dict) -> int:
        return new[path][1].count(b"\n") - old[path][1].count(b"\n")

    again = [path for path in before if added(path, opened, after) > added(path, before, opened)]
    assert not again, (f"sink {name}: an export cut short (run.cut_short at close()) wrote records of the earlier "
                       f"export again: {', '.join(again[:5])} gained more lines from half of the run's events than "
                       f"from none (a log of the sink's own may gain its own lines at each export); export into new "
                       f"files that take the old ones' place at close() unless run.cut_short, as fslab's own sinks do")


def check_addition(registry: Registry, name: str, run, params: dict, folder) -> None:
    """A sink whose class has ``reopen`` (``fslab eval``'s scores added to its record of the finished
    ``run``, whose ``metrics.jsonl`` gets them first): an addition cut short (``run.cut_short`` at
    ``close()``) leaves every file under ``folder`` as it was, and makes none (a log of the sink's own may
    gain the lines an addition cut short before its first event adds); a whole one takes the score (or,
    finding no record, returns None: the whole run is exported then)."""
    import dataclasses
    import json
    from pathlib import Path

    from fslab.core.sinks import add

    if not callable(getattr(registry.get("sink", name).resolve(), "reopen", None)):
        return
    logged = Path(run.path) / "metrics.jsonl"
    last = json.loads(logged.read_text().splitlines()[-1])
    scored = {"event": "eval", "time": last["time"] + 1.0, "source": "fslab eval", "split": "test", "ways": 5,
              "shots": 1, "queries": 15, "episodes": 200, "evaluator": "knn[k=3,ties=nearest]", "metric": "accuracy",
              "seed": 0, "stream": 2, "epoch": 2, "accuracy": 0.61, "ci95": 0.021}
    with logged.open("a") as file:
        file.write(json.dumps(scored) + "\n")
    before = _snapshot(folder)
    add(registry, name, dataclasses.replace(run, cut_short=True), params, [])
    opened = _snapshot(folder)
    add(registry, name, dataclasses.replace(run, cut_short=True), params, [scored])
    after = _snapshot(folder)

    def lines(path: str, old: dict, new: dict) -> int:
        return new[path][1].count(b"\n") - old[path][1].count(b"\n")

    changed = [path for path, held in before.items() if not (_kept(held, opened.get(path))
                                                            and _kept(opened[path], after.get(path)))]
    changed += [path for path in after if path not in before]  # a file of the addition's own, left behind
    changed += [path for path in before if path not in changed
                and lines(path, opened, after) > lines(path, before, opened)]  # the score written into the record
    assert not changed, (f"sink {name}: an addition cut short (reopen, run.cut_short at close()) did not leave the "
                         f"record as it was: {', '.join(changed[:5])}; write what you add into new files that join "
                         f"the record at close() unless run.cut_short, as fslab's own sinks do")
    taken = add(registry, name, run, params, [scored])
    assert taken in (1, None), f"sink {name}: an addition of one event (reopen) took {taken}"


def check_sink(registry: Registry, name: str, params: dict | None, folder) -> None:
    """In ``folder`` (an empty directory, also the current one): a sink fed a
    run's events live, from fslab's own thread and queue, starts, writes and
    closes with nothing reported; it changes neither an event (every sink of a
    run gets the same dicts) nor the run's own files, and writes nothing into
    the current directory (only under the run's folder or where its parameters
    say); an export (``run.replay``) takes every event, and so does a second one; exports cut short keep
    the earlier export's record, neither losing nor repeating it (:func:`check_cut_short`); and where the
    sink can add to its record (``reopen``), an addition cut short leaves it too (:func:`check_addition`)."""
    import copy
    import json
    import os
    from pathlib import Path

    from fslab.core.sinks import SinkFeed, build_sink, replay
    from fslab.core.types import SinkRun
    from fslab.plugin import Sink

    params = dict(params or {})
    project, elsewhere = Path(folder) / "project", Path(folder) / "elsewhere"
    run_path = project / "runs" / "20260101-000000-nca-c0de"
    run_path.mkdir(parents=True)
    elsewhere.mkdir()
    config, events = sink_config(registry, name, params), sink_events()
    own = {"config.json": json.dumps(config), "metrics.jsonl": "".join(json.dumps(e) + "\n" for e in events),
           "results.json": json.dumps({"run": run_path.name, "test": events[-1]["results"]})}
    for file_name, text in own.items():
        (run_path / file_name).write_text(text)
    sent = copy.deepcopy(events)
    cwd = os.getcwd()
    os.chdir(elsewhere)
    try:
        said: list[str] = []
        feed = SinkFeed(registry, SinkRun(run_path.name, run_path, config), say=said.append)
        for event in sent:
            feed(event)
        feed.close("completed", wait=60.0)  # what it writes is checked, not how fast: a loaded machine is slow
        assert not said, f"sink {name}, fed a live run: {' / '.join(said)}"
        assert sent == events, f"sink {name} changed the events it was given (other sinks of the run get the same)"
        finished = SinkRun(run_path.name, run_path, config, replay=True, state="completed")
        sink = build_sink(registry, name, finished, params)
        assert isinstance(sink, Sink), f"sink {name}: no write(event) or close()"
        for event in sent:
            sink.write(event)
        sink.close()
        again = SinkRun(run_path.name, run_path, config, replay=True, state="completed")
        assert replay(registry, name, again, params, iter(sent)) == len(events), \
            f"sink {name}: a second export did not take every event"
        assert sent == events, f"sink {name} changed the events of an export"
        stray = _files_under(elsewhere)
        assert not stray, f"sink {name} wrote into the current directory: {', '.join(stray[:5])}"
        for file_name, text in own.items():
            assert (run_path / file_name).read_text() == text, f"sink {name} changed the run's {file_name}"
        cut = SinkRun(run_path.name, run_path, config, replay=True, state="completed")
        check_cut_short(registry, name, cut, params, sent, folder)
        check_addition(registry, name, SinkRun(run_path.name, run_path, config, replay=True, state="completed"),
                       params, folder)
        stray = _files_under(elsewhere)
        assert not stray, f"sink {name} wrote into the current directory as it added to its record: {stray[0]}"
    finally:
        os.chdir(cwd)
