"""Neighbourhood Component Analysis for few-shot learning.

Laenen & Bertinetto, "On Episodes, Prototypical Networks, and Few-Shot
Learning", NeurIPS 2021, arXiv:2012.09831.

The paper asks what episodes buy Prototypical Networks and finds: nothing that
a plain mini-batch does not give better. Splitting a batch into support and
query sets, and comparing queries only with class prototypes, throws away most
of the pairwise distances a batch offers (Sec. 3.3, Table 1). Replacing the
prototypical loss by the NCA loss (Goldberger et al., 2005) over *all* pairs of
an ordinary i.i.d. mini-batch (Eq. 3) — every embedding pulled towards the
others of its class, pushed from the rest, through one softmax over squared
Euclidean distances — removes the episode hyper-parameters (ways, shots,
queries) and improves accuracy. At test time the embedding is used as is:
features are centred and L2-normalised and each query takes the class of the
nearest support centroid (Sec. 3.4).

This module registers the NCA loss, the i.i.d. sampler without replacement,
the nearest-centroid evaluator and the ``nca`` method recipe. torch is imported
inside the functions that need it, so listing plugins stays light.
"""

from __future__ import annotations

import random
from typing import Iterator, Sequence

from fslab.errors import UsageError
from fslab.hookspecs import hookimpl
from fslab.types import Batch, LossOutput

PAPER = "Laenen & Bertinetto, On Episodes, Prototypical Networks, and Few-Shot Learning, NeurIPS 2021 (arXiv:2012.09831)"


def squared_distances(a, b):
    """All squared Euclidean distances ``[len(a), len(b)]`` via
    ``|a|² + |b|² - 2ab`` (one matrix product; the ``[b, b, d]`` difference
    tensor would not fit for a 512 × 640 batch), clamped at 0 against rounding."""
    sq_a = (a * a).sum(-1, keepdim=True)
    sq_b = (b * b).sum(-1, keepdim=True)
    return (sq_a + sq_b.transpose(-1, -2) - 2.0 * a @ b.transpose(-1, -2)).clamp(min=0.0)


def nca(z, labels, support=None, *, temperature: float = 1.0) -> LossOutput:
    """NCA loss of Eq. 3 over every pair in the batch.

    For row i: ``-log( sum_{j != i, y_j = y_i} exp(-d_ij / T) / sum_{k != i} exp(-d_ik / T) )``
    with ``d`` the squared Euclidean distance and ``T`` the temperature. A row
    whose class appears only once has no positive and no defined loss: it is
    left out of the average and counted in ``extra["rows_without_positive"]``.

    Pair counts are unordered pairs (SPEC §2): positives are same-class pairs;
    negatives are different-class pairs with at least one end that has a
    positive (a pair of two lone rows reaches no loss term). ``support`` is
    ignored: NCA treats every row alike.
    """
    import torch

    if temperature <= 0:
        raise UsageError(f"nca: temperature must be > 0, got {temperature}")
    rows = z.shape[0]
    labels = labels.to(z.device)
    same = labels[:, None] == labels[None, :]  # diagonal included
    class_size = same.sum(dim=1)  # each row's class count in the batch
    has_positive = class_size > 1
    lone_rows = rows - has_positive.sum()
    positives = (same.sum() - rows) // 2
    different_pairs = (rows * rows - same.sum()) // 2
    negatives = different_pairs - lone_rows * (lone_rows - 1) // 2
    extra = {"rows_without_positive": lone_rows}
    if rows < 2:
        return LossOutput(z.sum() * 0.0, positives, negatives, extra)

    logits = -squared_distances(z, z) / temperature
    eye = torch.eye(rows, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(eye, float("-inf"))
    log_denominator = torch.logsumexp(logits, dim=1)
    positive_logits = logits.masked_fill(~same | eye, float("-inf"))
    # A lone row's positive logits are all -inf, and logsumexp's gradient there
    # is NaN even when the row is later multiplied by 0: give it finite values.
    positive_logits = torch.where(has_positive[:, None], positive_logits, torch.zeros_like(logits))
    log_numerator = torch.logsumexp(positive_logits, dim=1)
    per_row = (log_denominator - log_numerator) * has_positive
    loss = per_row.sum() / has_positive.sum().clamp(min=1)
    return LossOutput(loss, positives, negatives, extra)


class IIDSampler:
    """Ordinary mini-batches: each epoch is a fresh permutation of the dataset
    cut into batches, so every image is seen exactly once per epoch (sampling
    without replacement, as the NCA paper trains).

    The order depends only on ``(seed, epoch)``, so a resumed run sees the same
    batches. Only the dataset size is kept, so the sampler pickles cheaply into
    data-loader workers.
    """

    def __init__(self, labels: Sequence[int], batch_size: int, seed: int, *, drop_last: bool = True):
        self.size = len(labels)
        if batch_size < 1:
            raise UsageError(f"iid sampler: batch_size must be >= 1, got {batch_size}")
        if drop_last and self.size < batch_size:
            raise UsageError(
                f"iid sampler: batch_size {batch_size} is larger than the {self.size} training "
                f"images, so drop_last would leave no batch; lower batch_size or set drop_last=false"
            )
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last

    def __len__(self) -> int:
        if self.drop_last:
            return self.size // self.batch_size
        return -(-self.size // self.batch_size)

    def batches(self, epoch: int) -> Iterator[Batch]:
        order = list(range(self.size))
        random.Random(f"fslab-iid:{self.seed}:{epoch}").shuffle(order)
        for number in range(len(self)):
            yield Batch(order[number * self.batch_size : (number + 1) * self.batch_size], None)


def centroid(support, query):
    """Nearest class centroid (NCA paper Sec. 3.4, "1-NN with class centroids").

    ``support [E, w, n, d]`` and ``query [E, Q, d]``; returns ``long [E, Q]``,
    the way index of the centroid closest to each query in squared Euclidean
    distance. Centring and normalisation are done by the evaluation core.
    """
    centroids = support.mean(dim=2)  # [E, w, d]
    return squared_distances(query, centroids).argmin(dim=-1)


@hookimpl
def register_losses(register):
    register(
        nca,
        name="nca",
        description="NCA loss over all pairs of a batch (Eq. 3): softmax over negative squared distances.",
        paper=PAPER,
        episodic=False,
    )


@hookimpl
def register_samplers(register):
    register(
        IIDSampler,
        name="iid",
        description="Mini-batches without replacement: every image once per epoch.",
        paper=PAPER,
        episodic=False,
    )


@hookimpl
def register_evaluators(register):
    register(
        centroid,
        name="centroid",
        description="1-NN to class centroids in squared Euclidean distance.",
        paper=PAPER,
    )


@hookimpl
def register_methods(register):
    register(
        {"loss": {"name": "nca"}, "sampler": {"name": "iid"}, "evaluator": {"name": "centroid"}},
        name="nca",
        description="NCA loss on i.i.d. mini-batches, nearest-centroid evaluation.",
        paper=f"{PAPER}, Table 3",
    )
