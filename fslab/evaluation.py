"""Few-shot evaluation: features once per split, many episodes, mean ± 95% CI.

The protocol is the NCA paper's (Sec. 3.4 and 4.1, SPEC §4): w-way n-shot
episodes with q queries per class drawn from held-out classes, features centred
by the training mean and L2-normalised, one accuracy per episode, reported as
mean ± 1.96·std/√N.

Two things make this fast and comparable. With batch norm in eval mode and a
non-transductive classifier, an image's features do not depend on the episode,
so a split's features are extracted once and episodes only gather rows. And
episodes are drawn in bulk from a seeded ``torch.Generator``, so a fixed
evaluation seed gives the same episodes in every run: two methods are compared
on identical episodes.

Only the training worker imports this module, so importing torch here is fine.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from fslab.errors import UsageError

# Episodes are drawn in blocks of this many; it is a constant (not a parameter)
# because the random stream, and therefore the episodes, depend on it.
EPISODE_BLOCK = 500


def ci95(accuracies: Sequence[float] | torch.Tensor) -> tuple[float, float]:
    """Mean and 95% confidence half-width ``1.96 * std / sqrt(N)``.

    ``std`` is the population standard deviation (ddof=0, numpy's default), as
    in the SimpleShot and NCA evaluation code; with thousands of episodes the
    difference from ddof=1 is far below the reported precision.
    """
    values = torch.as_tensor(accuracies, dtype=torch.float64).flatten()
    if values.numel() == 0:
        raise UsageError("ci95: no accuracies to summarise")
    mean = values.mean()
    std = values.std(correction=0)
    return float(mean), float(1.96 * std / math.sqrt(values.numel()))


def sample_episodes(
    labels: Sequence[int] | torch.Tensor,
    ways: int,
    shots: int,
    queries: int,
    episodes: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``episodes`` few-shot episodes as dataset indices.

    Returns ``support_idx [E, ways, shots]`` and ``query_idx [E, ways, queries]``.
    Each episode has ``ways`` distinct classes and ``shots + queries`` distinct
    images per class; classes with fewer images than that are never drawn. The
    same arguments always give the same episodes.
    """
    labels = torch.as_tensor(labels, dtype=torch.long).flatten().cpu()
    per_class = shots + queries
    if ways < 2 or shots < 1 or queries < 1 or episodes < 1:
        raise UsageError(
            f"episodes need ways >= 2, shots >= 1, queries >= 1 and at least one episode; "
            f"got ways={ways}, shots={shots}, queries={queries}, episodes={episodes}"
        )
    classes, counts = torch.unique(labels, return_counts=True)
    eligible = classes[counts >= per_class]
    if eligible.numel() < ways:
        raise UsageError(
            f"{ways}-way episodes with {shots} shots and {queries} queries need {ways} classes "
            f"with at least {per_class} images; this split has {eligible.numel()}"
        )

    # Table of each eligible class's dataset indices, padded to the largest class.
    order = torch.argsort(labels, stable=True)
    sorted_labels = labels[order]
    class_counts = counts[counts >= per_class]
    starts = torch.searchsorted(sorted_labels, eligible)
    width = int(class_counts.max())
    positions = torch.arange(width)
    table = order[(starts[:, None] + positions).clamp(max=labels.numel() - 1)]
    padding = positions[None, :] >= class_counts[:, None]  # [C, width]

    generator = torch.Generator().manual_seed(int(seed))
    support_blocks, query_blocks = [], []
    for first in range(0, episodes, EPISODE_BLOCK):
        block = min(EPISODE_BLOCK, episodes - first)
        # The `ways` smallest of one random key per class: distinct random classes.
        chosen = torch.rand(block, eligible.numel(), generator=generator).topk(ways, dim=1, largest=False).indices
        # Random keys per image; padding gets a key above any real one, so the
        # `per_class` smallest keys of each row are distinct real images
        # (topk, unlike a full sort, costs little for 600-image classes).
        keys = torch.rand(block, ways, width, generator=generator)
        keys = keys.masked_fill(padding[chosen], 2.0)
        picked = keys.topk(per_class, dim=2, largest=False, sorted=True).indices
        indices = table[chosen[:, :, None], picked]  # [block, ways, per_class]
        support_blocks.append(indices[:, :, :shots])
        query_blocks.append(indices[:, :, shots:])
    return torch.cat(support_blocks), torch.cat(query_blocks)


def episode_accuracies(
    features: torch.Tensor,
    labels: Sequence[int] | torch.Tensor,
    classify: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ways: int,
    shots: int,
    queries: int,
    episodes: int,
    seed: int,
    *,
    center: torch.Tensor | None = None,
    normalize: bool = True,
    chunk: int = 1000,
) -> torch.Tensor:
    """Accuracy of ``classify`` on each of ``episodes`` episodes, ``float [E]``.

    ``features [N, d]`` are one split's features, extracted once. ``center``
    (the mean training feature) is subtracted and rows are L2-normalised before
    any episode is drawn (SimpleShot normalisation). ``classify(support
    [e, w, n, d], query [e, w*q, d])`` returns each query's way index; queries
    come way by way, so the truth is ``[0]*q + [1]*q + ...``.
    """
    chunk = max(1, chunk)
    features = features.float()
    if center is not None:
        features = features - center.to(features)
    if normalize:
        features = F.normalize(features, dim=1)
    support_idx, query_idx = sample_episodes(labels, ways, shots, queries, episodes, seed)
    truth = torch.arange(ways, device=features.device).repeat_interleave(queries)
    support_idx = support_idx.to(features.device)
    query_idx = query_idx.to(features.device)
    accuracies = []
    for first in range(0, episodes, chunk):
        support = features[support_idx[first : first + chunk]]  # [e, w, n, d]
        query = features[query_idx[first : first + chunk]].flatten(1, 2)  # [e, w*q, d]
        predictions = classify(support, query)
        accuracies.append((predictions == truth).float().mean(dim=1))
    return torch.cat(accuracies).cpu()


def extract_features(
    model: torch.nn.Module,
    images_uint8: torch.Tensor,
    batch_size: int,
    device: torch.device | str,
    normalize_fn: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Embed every image once: ``uint8 [N, C, H, W]`` -> ``float [N, d]`` on the CPU.

    Runs in eval mode (batch norm uses its running statistics, so features do
    not depend on what else is in the batch) and restores the model's mode
    afterwards. ``normalize_fn`` turns a uint8 batch already on ``device`` into
    the network's float input.
    """
    was_training = model.training
    model.eval()
    outputs = []
    try:
        with torch.no_grad():
            for first in range(0, images_uint8.shape[0], batch_size):
                batch = images_uint8[first : first + batch_size].to(device, non_blocking=True)
                outputs.append(model(normalize_fn(batch)).float().cpu())
    finally:
        model.train(was_training)
    if not outputs:
        raise UsageError("extract_features: no images to embed")
    return torch.cat(outputs)
