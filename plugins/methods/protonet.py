"""Prototypical Networks: their loss, the episodic sampler, the Conv-4 backbone and the ``protonet`` recipe.

Snell, Swersky & Zemel, "Prototypical Networks for Few-shot Learning",
NeurIPS 2017, arXiv:1703.05175.

Training imitates testing: each batch is an episode of w classes with n
labelled "support" images and m "query" images per class. A class is
represented by its prototype, the mean embedding of its support images, and a
query is classified by a softmax over negative squared Euclidean distances to
all prototypes (Eq. 2); the loss is the queries' mean negative log-likelihood.
The same nearest-prototype rule classifies test episodes. The embedding of the
paper is Conv4, four blocks of 3×3 convolution, batch norm, ReLU and max-pool.

This module registers the prototypical loss, the episodic sampler, the Conv4
backbone (lazily: the network lives in :mod:`fslab_plugins.backbones.networks`, which
imports torch) and the ``protonet`` recipe with Snell's 5-shot training episodes.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterator, Sequence

from fslab_plugins.backbones.shapes import check_conv4
from fslab_plugins.methods.nca import fewer_rows_hint

from fslab.plugin import Batch, LossOutput, SplitSizes, UsageError, at_least, hookimpl, one_of

PAPER = "Snell, Swersky & Zemel, Prototypical Networks for Few-shot Learning, NeurIPS 2017 (arXiv:1703.05175)"
DISTANCES = ("euclidean", "cosine")


def check_distance(name: str, distance: str) -> None:
    if distance not in DISTANCES:
        raise UsageError(f"{name}: unknown distance '{distance}' (loss.distance). Allowed: {', '.join(DISTANCES)}.")


def check_protonet(params: dict, context=None) -> None:
    check_distance("protonet", params["distance"])


def protonet(z, labels, support=None, *, distance: str = "euclidean") -> LossOutput:
    """Prototypical loss (Snell Eq. 2; NCA paper Eq. 2): :func:`prototypical`."""
    return prototypical(z, labels, support, distance, "protonet")


def prototypical(z, labels, support, distance: str = "euclidean", name: str = "protonet") -> LossOutput:
    """Prototypical loss (Snell Eq. 2; NCA paper Eq. 2), for ``protonet`` and the
    losses built on it; ``name`` is the loss that messages name.

    ``support`` marks the support rows (bool, one per row); the others are
    queries. Prototypes are the mean support embedding of each class present in
    the support set, whatever the label values. With ``distance="euclidean"``
    the logits are negative squared distances; with ``"cosine"`` they are
    cosine similarities (bounded, so they learn slowly without a scale).

    Pair counts follow the NCA paper's Sec. 3.3 counts: gradients reach every support point through its
    prototype, so a query has as many positives as its class has support points
    and as many negatives as the other classes have.
    """
    import torch
    import torch.nn.functional as F

    check_distance(name, distance)
    if support is None:
        raise UsageError(
            f"{name} needs an episodic sampler (one that marks support and query rows), "
            "e.g. sampler 'episodic'"
        )
    support = torch.as_tensor(support, dtype=torch.bool, device=z.device)
    labels = labels.to(z.device)
    support_labels, query_labels = labels[support], labels[~support]
    classes, support_class = torch.unique(support_labels, return_inverse=True)
    if query_labels.numel() == 0:
        raise UsageError(f"{name}: the episode has no query rows")
    query_class = torch.searchsorted(classes, query_labels).clamp(max=classes.numel() - 1)
    if not bool((classes[query_class] == query_labels).all()):
        raise UsageError(f"{name}: a query's class has no support image in the episode")

    support_count = torch.bincount(support_class, minlength=classes.numel())  # [C]
    prototypes = torch.zeros(classes.numel(), z.shape[1], dtype=z.dtype, device=z.device)
    prototypes = prototypes.index_add(0, support_class, z[support]) / support_count[:, None].to(z.dtype)

    queries = z[~support]
    if distance == "euclidean":
        from fslab_plugins.methods.nca import squared_distances

        logits = -squared_distances(queries, prototypes)
    else:
        logits = F.normalize(queries, dim=1) @ F.normalize(prototypes, dim=1).T
    loss = F.cross_entropy(logits, query_class)

    positives = support_count[query_class].sum()
    negatives = query_class.numel() * support_count.sum() - positives
    return LossOutput(loss, positives, negatives, None)


class EpisodicSampler:
    """Episodes of ``ways`` classes × (``shots`` support + ``queries`` query) images.

    The shape is given either as (ways, shots, queries), in which case the
    framework's ``batch_size`` is ignored and the batch is ``ways·(shots+queries)``
    rows, or as the NCA paper's (shots n, per_class a, batch_size b): m = a − n
    queries and w = b / a ways.

    Rows come class by class: the n support rows of the first class, its m query
    rows, then the next class. No image repeats within an episode; an image can
    appear in several episodes of an epoch and some images in none (episodes
    sample with replacement across the epoch, as in Snell et al.). An epoch has
    ``ceil(N / episode_size)`` episodes, about as many images as an i.i.d. epoch.
    The episodes depend only on ``(seed, epoch)``.
    """

    def __init__(
        self,
        labels: Sequence[int],
        batch_size: int,
        seed: int,
        *,
        ways: int = 0,
        shots: int = 5,
        queries: int = 0,
        per_class: int = 0,
    ):
        self.ways, self.shots, self.queries = resolve_episode_shape(batch_size, ways, shots, queries, per_class)
        self.seed = seed
        self.size = len(labels)
        by_class: dict[int, list[int]] = defaultdict(list)
        for index, label in enumerate(labels.tolist() if hasattr(labels, "tolist") else labels):
            by_class[int(label)].append(index)
        needed = self.shots + self.queries
        self.images_by_class = {c: rows for c, rows in sorted(by_class.items()) if len(rows) >= needed}
        check_episode_classes(self.ways, needed, len(self.images_by_class),
                              SplitSizes(tuple(len(rows) for rows in by_class.values())), per_class=bool(per_class))
        self.batch_size = self.ways * needed

    def __len__(self) -> int:
        return math.ceil(self.size / self.batch_size)

    def batches(self, epoch: int) -> Iterator[Batch]:
        rng = random.Random(f"fslab-episodic:{self.seed}:{epoch}")
        classes = list(self.images_by_class)
        support_pattern = [True] * self.shots + [False] * self.queries
        for _ in range(len(self)):
            indices: list[int] = []
            for label in rng.sample(classes, self.ways):
                indices += rng.sample(self.images_by_class[label], self.shots + self.queries)
            yield Batch(indices, support_pattern * self.ways)


def episode_rows(params: dict, batch_size: int) -> int:
    """The rows of an episode: ways × (shots + queries) when they are given,
    else train.batch_size (the per_class parameterisation divides it)."""
    if params["per_class"] or not params["ways"]:
        return batch_size
    return params["ways"] * (params["shots"] + params["queries"])


def resolve_episode_shape(batch_size: int, ways: int, shots: int, queries: int, per_class: int) -> tuple[int, int, int]:
    """(ways, shots, queries) from either parameterisation, or a UsageError
    that names the keys at fault and says what would be accepted."""
    if shots < 1:
        raise UsageError(f"episodic sampler: shots must be >= 1 (sampler.shots), got {shots}")
    if per_class:
        if ways or queries:
            raise UsageError(
                f"episodic sampler: sampler.per_class={per_class} cannot be given with sampler.ways={ways} and "
                f"sampler.queries={queries}: give either ways and queries, or per_class (with train.batch_size), "
                f"not both (set sampler.per_class=0 to use ways and queries, or sampler.ways=0 and "
                f"sampler.queries=0 to use per_class)"
            )
        if per_class <= shots:
            raise UsageError(
                f"episodic sampler: per_class ({per_class}) must exceed shots ({shots}) to leave queries "
                f"(sampler.per_class > sampler.shots)"
            )
        if batch_size % per_class:
            raise UsageError(
                f"episodic sampler: train.batch_size {batch_size} is not divisible by sampler.per_class {per_class}; "
                f"use a multiple of {per_class} ({nearby_multiples(batch_size, per_class)}), "
                f"or change sampler.per_class"
            )
        ways, queries = batch_size // per_class, per_class - shots
    elif ways < 1 or queries < 1:
        raise UsageError(
            f"episodic sampler: set ways and queries (e.g. ways=20, shots=5, queries=15), "
            f"or per_class to derive them from batch_size; got sampler.ways={ways}, sampler.queries={queries}"
        )
    if ways < 2:
        raise UsageError(f"episodic sampler: an episode needs at least 2 ways (sampler.ways, or "
                         f"train.batch_size / sampler.per_class), got {ways}")
    return ways, shots, queries


def nearby_multiples(batch_size: int, per_class: int) -> str:
    """The multiples of ``per_class`` on either side of ``batch_size`` (from 2 classes' worth)."""
    below, above = batch_size // per_class * per_class, (batch_size // per_class + 1) * per_class
    return f"{below} or {above}" if below >= 2 * per_class else f"{max(above, 2 * per_class)}"


def check_episode_classes(ways: int, needed: int, have: int, split=None, *, per_class: bool = False) -> None:
    """``ways`` classes of ``needed`` images (shots + queries), of which the training split has ``have``
    (``split``: its sizes, where known, to say what would fit); ``per_class``: the episode's shape comes
    from sampler.per_class, the key the line then names (sampler.queries may not be given with it)."""
    if have < ways:
        images = "sampler.per_class" if per_class else "sampler.shots + sampler.queries"
        raise UsageError(
            f"episodic sampler: {ways} ways need {ways} classes with at least {needed} images "
            f"({'per_class' if per_class else 'shots + queries'}); "
            f"the training set has {have}, so " + fewer_rows_hint(ways, have, split, images)
        )


def check_episodic(params: dict, context) -> None:
    """The sampler's shape from its parameters and ``train.batch_size``, and,
    once the training split's sizes are known, enough classes for it (with no
    run, in fslab.create, the constructor checks the shape it is given)."""
    if context is None:
        return
    ways, shots, queries = resolve_episode_shape(context.config["train"]["batch_size"], params["ways"],
                                                 params["shots"], params["queries"], params["per_class"])
    train = context.split("train")
    if train is not None:
        check_episode_classes(ways, shots + queries, train.classes_with(shots + queries), train,
                              per_class=bool(params["per_class"]))


@hookimpl
def register_losses(register):
    register(
        protonet,
        name="protonet",
        description="Prototypical loss: softmax over distances from queries to support-class means.",
        paper=PAPER,
        episodic=True,
        allowed={"distance": one_of(*DISTANCES)},
        check=check_protonet,
    )


@hookimpl
def register_samplers(register):
    register(
        EpisodicSampler,
        name="episodic",
        description="Episodes of w ways × (n shots + m queries), support rows marked.",
        paper=PAPER,
        episodic=True,
        allowed={"ways": at_least(0), "shots": at_least(1), "queries": at_least(0), "per_class": at_least(0)},
        check=check_episodic,
        batch=episode_rows,
    )


@hookimpl
def register_backbones(register):
    register(
        "fslab_plugins.backbones.networks:Conv4",
        name="conv4",
        description="Four blocks of 3×3 conv (64), batch norm, ReLU, 2×2 max-pool; the last map averaged "
                    "(head=average) or flattened as Snell et al. do (head=flatten: 1,600 values at 84×84).",
        paper=PAPER,
        params={"hidden": 64, "head": "average"},
        allowed={"hidden": at_least(1), "head": one_of("average", "flatten")},
        check=check_conv4,
    )


@hookimpl
def register_methods(register):
    register(
        {
            "loss": {"name": "protonet"},
            "sampler": {"name": "episodic", "ways": 20, "shots": 5, "queries": 15},
            "evaluator": {"name": "centroid"},
        },
        name="protonet",
        description="Prototypical Networks with Snell's 5-shot episodes (20 ways, 5 shots, 15 queries).",
        paper="Laenen & Bertinetto, NeurIPS 2021, Table 3, 'ProtoNet (Snell setup)'; " + PAPER,
    )
