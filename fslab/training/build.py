"""What a run is made of, built from its configuration and the plugin registry.

Training (:mod:`fslab.training.train`) and ``fslab eval``
(:mod:`fslab.training.run_eval`) build through here, so both make the same
backbone from the same configuration, choose the device and turn images into
network input the same way. :func:`build_training` creates the components in
the order the seeded global generator must see them (the backbone's and the
head's initial weights, then a loss's own parameters), which a resumed or
repeated run relies on to be bitwise identical.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fslab.core.config import RunConfig, TrainConfig
from fslab.core.errors import FslabError, PluginError, exception_words, plugin_call
from fslab.core.registry import Registry, create_dataset
from fslab.core.text import count
from fslab.core.types import Split
from fslab.training import distributed
from fslab.training.optimizers import EagerAdam, EagerSGD
from fslab.training.outputs import batch_count


def plugin_kwargs(section: dict) -> dict:
    """A plugin section's parameters: every key but ``name``."""
    return {k: v for k, v in section.items() if k != "name"}


def pick_device(name: str) -> torch.device:
    """``auto`` is CUDA when there is a GPU here; a CUDA device asked for on a
    machine without one is an error, not a silent fall back to the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' was asked for but CUDA is not available here; use --device cpu")
    return torch.device(name)


def to_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 [B, C, H, W] on the device -> float in [-1, 1]."""
    return images.float().div_(127.5).sub_(1.0)


def host_to_device(values, device: torch.device) -> torch.Tensor:
    """Small host values (a batch's indices, augmentation draws) as a tensor on
    ``device``, without stopping the host: PyTorch copies from ordinary host
    memory to a GPU and then waits for the GPU to finish all it was given,
    which would empty its queue several times a step; a copy from pinned
    memory is queued like a kernel (the pinned block is kept until it is done)."""
    tensor = torch.as_tensor(values)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def make_optimizer(params, train: TrainConfig) -> torch.optim.Optimizer:
    """``train.optimizer``: SGD with (Nesterov) momentum, or Adam with its
    default betas; both with ``train.lr`` and ``train.weight_decay`` (L2).
    torch.optim's own, without the import of torch._dynamo its wrappers make
    (:mod:`fslab.training.optimizers`)."""
    if train.optimizer == "adam":
        return EagerAdam(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return EagerSGD(params, lr=train.lr, momentum=train.momentum, nesterov=train.nesterov,
                        weight_decay=train.weight_decay)
    raise ValueError(f"train.optimizer must be sgd or adam, got '{train.optimizer}'")  # resolve() rejects it first


def make_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig,
                   steps_per_epoch: int) -> torch.optim.lr_scheduler.MultiStepLR:
    """The learning rate times ``train.gamma`` after each ``train.milestones``
    fraction of all steps; stepped once per training step."""
    total_steps = train.epochs * steps_per_epoch
    milestones = sorted({max(1, round(f * total_steps)) for f in train.milestones})
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=train.gamma)


def built(registry: Registry, kind: str, name: str, build: Callable[[], Any],
          passes: tuple[type[BaseException], ...] = ()) -> Any:
    """``build()``, a component of a run built by the worker: what the component's own code raises (not
    the UsageError of a value it refuses, torch's out-of-memory error nor ``passes``) is one line naming it
    and its plugin (``sampler 'mine' from plugin 'mine' failed to build: KeyError: ...``), as it is where a
    dataset is built before a run exists; the run's line read only ``KeyError: ...``, naming no one."""
    return registry.get(kind, name).built(build, passes=(torch.OutOfMemoryError, *passes))


def build_dataset(registry: Registry, cfg: RunConfig) -> Any:
    # an OSError (a folder it cannot read) is the system's, as where it loads a split
    dataset = built(registry, "dataset", cfg.dataset["name"], lambda: create_dataset(registry, cfg.as_dict()),
                    passes=(OSError,))
    channels = getattr(dataset, "channels", None)
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise TypeError(f"{registry.get('dataset', cfg.dataset['name']).named} must set channels to the "
                        f"number of channels of its images (an int, 1 or 3), got {channels!r}")
    return dataset


def load_split(dataset: Any, split: str, named: str) -> Split:
    """``dataset.load(split)``, refused in one line naming the dataset and its plugin (``named``, as
    :attr:`Component.named` says it, as a loss's, a sampler's and a backbone's lines do) unless it holds uint8 images
    ``[N, channels, H, W]`` and one integer label per image: float images (in [0, 1], say) would
    otherwise train as images near black, and a run would end with nothing said. Only shapes and
    types are read. What else ``load`` raises (a KeyError for a split it lacks) is a PluginError
    naming the dataset and the split; a UsageError of its own (a file it cannot read) goes on, as
    does an OSError (a full disk under its cache: the system's fault, not the plugin's)."""
    data = plugin_call(lambda: dataset.load(split), f"{named} failed to load its {split} split",
                       passes=(OSError,))
    images, labels = getattr(data, "images", None), getattr(data, "labels", None)
    wanted = "load(split) returns Split(images uint8 [N, C, H, W], labels int64 [N], classes)"
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
        got = (f"of dtype {images.dtype} and shape {list(images.shape)}" if isinstance(images, torch.Tensor)
               else f"of type {type(images).__name__}")
        raise TypeError(f"{named} gave {split} images {got}; {wanted}")
    if images.shape[1] != dataset.channels:
        raise TypeError(f"{named} gave {split} images of {count(images.shape[1], 'channel')} but says "
                        f"channels = {dataset.channels}; {wanted}")
    if (not isinstance(labels, torch.Tensor) or labels.is_floating_point()
            or tuple(labels.shape) != (images.shape[0],)):
        got = (f"of dtype {labels.dtype} and shape {list(labels.shape)}" if isinstance(labels, torch.Tensor)
               else f"of type {type(labels).__name__}")
        raise TypeError(f"{named} gave {split} labels {got} for {count(images.shape[0], 'image')}; {wanted}")
    check_label_range(labels, len(getattr(data, "classes", None) or ()), f"{named} gave {split} labels")
    return data


def check_label_range(labels: torch.Tensor, classes: int, gave: str) -> None:
    """A ValueError unless ``labels`` number the split's ``classes`` ``0 .. classes - 1``: labels from 1,
    or a classes list shorter than the labels, trained in silence with the loss's classifier sized one
    class short (a run with one failed at its first step, in PyTorch's words)."""
    if not len(labels):
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        raise ValueError(f"{gave} {low}..{high} for {classes} classes (Split.classes); labels number the "
                         f"classes 0..{classes - 1}, one name in classes for each")


def build_backbone(registry: Registry, cfg: RunConfig, in_channels: int, device: torch.device,
                   image_size: tuple[int, int] | None = None) -> nn.Module:
    """The backbone, told ``in_channels`` and, if its signature names it, the
    images' ``image_size`` as ``(height, width)``."""
    section = cfg.backbone
    context = {"image_size": image_size} if image_size is not None else None
    return built(registry, "backbone", section["name"], lambda: registry.create(
        "backbone", section["name"], in_channels=in_channels, context=context, **plugin_kwargs(section))).to(device)


def check_out_dim(model: nn.Module, name: str, image_shape: tuple[int, int, int], device: torch.device, *,
                  named: str | None = None) -> None:
    """A TypeError naming the backbone unless its ``out_dim`` is the number of values it returns
    per image (the loss, its classifier and the projection are sized by it): one forward of two
    blank images in eval mode, which changes no weight, statistic or random stream of the built-ins.
    Where that forward raises, the line names the backbone as ``named`` does, its plugin too
    (``backbone 'mine' from plugin 'local:mine'``, as a training step that raises names it)."""
    declared = getattr(model, "out_dim", None)
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 1:
        raise TypeError(f"{named or f'backbone {name!r}'} must set self.out_dim to the number of values it returns "
                        f"per image (an int), got {declared!r}")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            features = model(torch.zeros(2, *image_shape, device=device))
    except (torch.OutOfMemoryError, FslabError):
        raise
    except Exception as error:  # its own error names no backbone (mat1 and mat2 shapes cannot be multiplied)
        # PyTorch's shape errors are RuntimeErrors; not a NotImplementedError (a forward misspelt: no forward)
        sized = isinstance(error, RuntimeError) and not isinstance(error, NotImplementedError)
        hint = "; a backbone whose layers depend on the image size names image_size in its __init__ to be told it"
        line = (f"{named or f'backbone {name!r}'} failed on 2 images of shape {[2, *image_shape]}: "
                f"{exception_words(error)}{hint if sized else ''}")
        raise (PluginError if named else TypeError)(line) from error
    model.train(was_training)
    check_features(features, named or f"backbone '{name}'", declared)


def check_features(features, named: str, out_dim: int) -> None:
    """A TypeError naming the backbone (``named``, its plugin too where known) unless ``features``, its
    output for 2 blank images, are finite floats ``[2, out_dim]``: integer features had no gradient and
    NaN ones a NaN loss, and both failed the run at its first step blaming the loss."""
    shape = list(getattr(features, "shape", ()))
    if not isinstance(features, torch.Tensor) or shape != [2, out_dim]:
        flat = f": pool or flatten it to [2, {math.prod(shape[1:])}]" if len(shape) > 2 else ""
        got = f"of shape {shape}" if isinstance(features, torch.Tensor) else f"a {type(features).__name__}"
        raise TypeError(f"{named} returned features {got} for 2 images, not [2, out_dim] "
                        f"with its out_dim={out_dim}{flat}")
    if not features.is_floating_point():
        raise TypeError(f"{named} returned features of dtype {features.dtype} for 2 images; a backbone returns "
                        f"floating-point features, through differentiable operations")
    if not bool(torch.isfinite(features).all()):
        raise TypeError(f"{named} returned features that are not finite (NaN or infinite) for 2 blank images, "
                        f"before any update; its layers or their initial weights give them")


def build_loss(registry: Registry, cfg: RunConfig, out_dim: int, num_classes: int,
               device: torch.device) -> tuple[Callable, list[nn.Parameter]]:
    """The run's loss for embeddings of ``out_dim`` values and ``num_classes``
    training classes, on ``device``, with its own parameters (a loss module's,
    such as a learned temperature; none for a plain function) for the optimiser."""
    loss_fn = built(registry, "loss", cfg.loss["name"], lambda: registry.create(
        "loss", cfg.loss["name"], **plugin_kwargs(cfg.loss), context={"out_dim": out_dim, "num_classes": num_classes}))
    if not isinstance(loss_fn, nn.Module):
        return loss_fn, []
    return loss_fn.to(device), list(loss_fn.parameters())


def image_size_of(split: Split) -> tuple[int, int]:
    """The ``(height, width)`` of a split's images."""
    height, width = split.images.shape[-2:]
    return int(height), int(width)


def build_evaluator(registry: Registry, section: dict, training_loss: dict) -> Callable:
    """The evaluator a section names (``name`` and its parameters), offered the run's
    loss section as ``training_loss`` (an evaluator that names it tests with the
    loss's own parameters, as ``sen`` takes the loss's ε_p)."""
    return built(registry, "evaluator", section["name"], lambda: registry.create(
        "evaluator", section["name"], context={"training_loss": dict(training_loss)}, **plugin_kwargs(section)))


@dataclass
class TrainingParts:
    """Everything training builds from the configuration."""

    dataset: Any
    train_split: Split
    val_split: Split
    test_split: Split | None  # read at the start on rank 0, which alone tests
    model: nn.Module  # the backbone, with global batch norm under several processes
    head: nn.Module  # the training-only projection, or an identity
    loss_fn: Callable  # an nn.Module when the loss has parameters of its own
    sampler: Any
    evaluator: Callable
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.MultiStepLR
    named: dict = field(default_factory=dict)  # loss, sampler, evaluator, backbone: as a line blaming one names it

    def failed(self, kind: str) -> str:
        """The start of the line a run fails with when the loss, the sampler or the backbone raises:
        ``loss 'boom' from plugin 'local:boom' failed``."""
        return f"{self.named[kind]} failed"


def build_training(registry: Registry, cfg: RunConfig, world: distributed.World, device: torch.device, *,
                   channels_last: bool = False) -> TrainingParts:
    """The run's components, created in a fixed order (module docstring);
    ``channels_last``: the backbone's weights in that memory format."""
    dataset = build_dataset(registry, cfg)
    named = registry.get("dataset", cfg.dataset["name"]).named
    train_split, val_split = load_split(dataset, "train", named), load_split(dataset, "val", named)
    # Read (and on a first run decoded) before training, not after it: an image that cannot be decoded
    # fails the run at its start, naming the file. Reading draws no random number.
    test_split = load_split(dataset, "test", named) if world.main else None
    model = build_backbone(registry, cfg, dataset.channels, device, image_size_of(train_split))
    check_out_dim(model, cfg.backbone["name"], (dataset.channels, *image_size_of(train_split)), device,
                  named=registry.get("backbone", cfg.backbone["name"]).named)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    # A training-only linear projection on top of the backbone (NCA paper App. A.4).
    head = torch.nn.Identity()
    if cfg.train.projection_dim > 0:
        head = torch.nn.Linear(model.out_dim, cfg.train.projection_dim).to(device)
    model = distributed.synchronise_batch_norm(model, world, device)  # global-batch statistics when N > 1
    loss_fn, loss_params = build_loss(registry, cfg, cfg.train.projection_dim or model.out_dim,
                                      len(train_split.classes), device)
    trainable = list(model.parameters()) + list(head.parameters()) + loss_params
    sampler = built(registry, "sampler", cfg.sampler["name"], lambda: registry.create(
        "sampler", cfg.sampler["name"], labels=train_split.labels.tolist(), batch_size=cfg.train.batch_size,
        seed=cfg.seed, **plugin_kwargs(cfg.sampler)))
    evaluator = build_evaluator(registry, cfg.evaluator, cfg.loss)
    optimizer = make_optimizer(trainable, cfg.train)
    scheduler = make_scheduler(optimizer, cfg.train,
                               batch_count(sampler, registry.get("sampler", cfg.sampler["name"]).named))
    return TrainingParts(dataset, train_split, val_split, test_split, model, head, loss_fn, sampler, evaluator,
                         optimizer, scheduler, {kind: registry.get(kind, getattr(cfg, kind)["name"]).named
                                                for kind in ("loss", "sampler", "evaluator", "backbone")})
