"""Evaluate and record: from an evaluator and a split to the ``eval`` events in
``metrics.jsonl`` and the per-episode scores in ``evaluations/``.

The training loop (validation after every epoch, the test at the end) and
``fslab eval`` both evaluate through :func:`evaluate_and_record`, so a number
in a run's log means the same whoever wrote it. What differs is said by the
caller: training places its events by epoch and step, ``fslab eval`` (which
evaluates a checkpoint after the fact) names itself and the episodes' seed,
stream and checkpoint epoch; the training's test and ``fslab eval`` keep their
per-episode scores, for paired comparisons (:meth:`Run.save_accuracies`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fslab.core.config import run_config
from fslab.core.errors import PluginError, UsageError
from fslab.core.eventlog import EventLog
from fslab.core.types import evaluator_traits
from fslab.training import evaluation
from fslab.training.build import build_dataset, load_split, to_input

# What fixes an evaluation's episodes and network besides its shape: the
# evaluation seed, the episode stream's version and the checkpoint's epoch.
IDENTITY = ("seed", "stream", "epoch")


@dataclass(frozen=True)
class Episodes:
    """The episodes an evaluation runs: a split, their shape(s) and count, and
    what fixes them (the seed, and the epoch of the checkpoint evaluated)."""

    split: str
    ways: int
    shots: Sequence[int]
    queries: int
    count: int
    seed: int
    epoch: int


@dataclass(frozen=True)
class EvaluationInputs:
    """What the evaluator sees of the split. An evaluator on features gets
    ``features`` (or a function that embeds them, called once); a model-aware
    one (``needs_model``) gets the ``network`` and the split's uint8 ``images``."""

    labels: torch.Tensor
    features: torch.Tensor | Callable[[], torch.Tensor] | None = None
    network: nn.Module | None = None
    images: torch.Tensor | None = None
    center: torch.Tensor | None = None  # the training mean, subtracted before normalising
    normalize: bool = True
    device: torch.device | str = "cpu"
    # fslab eval: whether the features came from its cache (reported and saved); None where there is no cache
    features_cached: bool | None = None
    # the split's data_fingerprint, saved with each evaluation so that compare pairs only runs scored on the same data
    data: str | None = None
    # fslab eval: the precision the features were embedded in (reported, logged and saved); None in training
    precision: str | None = None
    # fslab eval --precision: the run's own precision, where ``precision`` is another (said in the records, whose
    # scores then go beside the run's own: fslab.core.events.other_precision); None otherwise
    run_precision: str | None = None


def data_fingerprint(images: torch.Tensor, labels: torch.Tensor) -> str:
    """A digest of a split's images and labels (BLAKE2b, ~1 GB/s: a quarter second for miniImageNet's test)."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in (labels, images):
        digest.update(str((tuple(tensor.shape), str(tensor.dtype))).encode())
        digest.update(tensor.contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def split_outline(split) -> dict:
    """What a run's start records of a split (``Split``): its images and classes, and a digest of its class
    names, labels and image shape, so a resume tells a split whose files were added, removed or moved between
    classes since (:func:`data_change_note`). The labels alone: hashing the images as :func:`data_fingerprint`
    does would add seconds to every start at tieredImageNet's size."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(json.dumps([list(split.classes), list(split.images.shape[1:])]).encode())
    digest.update(split.labels.contiguous().cpu().numpy().tobytes())
    return {"images": len(split.labels), "classes": len(split.classes), "labels": digest.hexdigest()}


def data_change_note(run_id: str, before: dict, now: dict) -> str | None:
    """The line a resumed run says where a split's :func:`split_outline` differs from its first start's
    (``before``; None for a split that recorded none, a run of an earlier fslab), else None."""
    if (told := outline_changes(before, now)) is None:
        return None
    return (f"note: the data differs from that run {run_id} started on ({told}: files of its data root added, "
            f"removed or moved since); it goes on with the data as it is now; to train on one set of images, "
            f"put them back as they were, or start anew with fslab run --like {run_id}")


def outline_changes(before: dict, now: dict) -> str | None:
    """Each split whose :func:`split_outline` ``now`` differs from ``before`` (a run's first start's; a split
    that recorded none is passed over), with its counts now and then: ``train: 16 images in 4 classes now, 12
    in 3 then``; None where none differs (a resume's note says it, and fslab resume --data-root's refusal)."""
    changed = [split for split, outline in now.items()
               if isinstance(before.get(split), dict) and before[split].get("labels") != outline["labels"]]
    if not changed:
        return None
    return "; ".join(f"{split}: {now[split]['images']} images in {now[split]['classes']} classes now, "
                     f"{before[split].get('images')} in {before[split].get('classes')} then" for split in changed)


def outlines_at(config: dict, registry, splits: list[str]) -> dict:
    """The :func:`split_outline` of each of ``splits`` as the run's dataset (``config``'s section, at its root)
    loads it now: built and loaded as the worker does (:func:`fslab.training.build.load_split`), from its
    decoded images' cache where it has one."""
    cfg = run_config(config)
    dataset = build_dataset(registry, cfg)
    named = registry.get("dataset", cfg.dataset["name"]).named
    return {split: split_outline(load_split(dataset, split, named)) for split in splits}


def weights_fingerprint(state: dict) -> str:
    """A digest of a network's weights (a state dict): which checkpoint a split's features were embedded with."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        tensor = state[name]
        digest.update(str((name, tuple(tensor.shape), str(tensor.dtype))).encode())
        digest.update(tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def episode_count(evaluator, asked: int | None, *, during_training: bool = False) -> int:
    """How many episodes to run: as many as asked, else the evaluator's
    ``default_episodes``. A model-aware evaluator adapts the network on every
    episode, which is slow, so during training it runs at most its default."""
    traits = evaluator_traits(evaluator)
    count = asked or traits.default_episodes
    if during_training and traits.needs_model:
        count = min(count, traits.default_episodes)
    return count


def evaluate_and_record(log: EventLog, evaluator, label: str, inputs: EvaluationInputs, episodes: Episodes, *,
                        save: bool, at: dict | None = None, source: str | None = None,
                        named: str | None = None, recording: Callable[[], object] | None = None) -> list[dict]:
    """Run ``episodes`` for each episode shape (each number of shots, or the evaluator's own fixed shape),
    and for each: mean ± 95% CI of the episode scores, an ``eval`` event, and with ``save`` the per-episode
    scores.

    ``label`` is the evaluator's label as records spell it (:func:`fslab.core.events.recorded_evaluator`).
    An evaluation during training is placed in the log by ``at`` (its epoch and step); one made afterwards
    names its ``source`` and, since its place in the log says nothing, the episodes' identity
    (:data:`IDENTITY`). ``named``: how a line that blames the evaluator names it and its plugin
    (:attr:`fslab.core.registry.Component.named`). ``recording`` is called once every shape is scored,
    before the first event is written (``fslab eval`` takes its hold on the run's exports to its sinks there:
    :func:`fslab.execution.export.sending`). Returns one result per shape: split, ways, shots, queries,
    episodes, evaluator, metric, seed, stream, epoch, accuracy (the score, whatever the metric), ci95, and
    ``precision``, ``run_precision`` and ``features_cached`` where the inputs say. The saved scores also hold
    the split's ``data`` fingerprint where the inputs give it.
    """
    traits = evaluator_traits(evaluator)
    name = label.partition("[")[0]  # the evaluator's name, without its parameters
    shapes = evaluation.episode_shapes(evaluator, episodes.shots, episodes.queries)
    evaluation.check_refused(evaluator, episodes.ways, episodes.shots, episodes.queries)
    for shots, queries in shapes:  # every shape before any is scored: a refused one records nothing
        try:
            evaluation.check_classes(inputs.labels, episodes.ways, shots, queries)
        except UsageError as exc:
            if traits.episode_shape is None:
                raise
            raise UsageError(f"evaluator '{name}' draws its own episode shape, {shots} + {queries} "
                             f"images per class (shots + queries): {exc}") from None
    features = inputs.features
    if callable(features) and not traits.needs_model:
        features = features()  # embedded once for every shape
    all_scores = []
    for shots, queries in shapes:  # every shape scored before any is recorded: one the evaluator refuses
        try:                       # (knn's k above a 1-shot episode's support points) records nothing
            all_scores.append(evaluation.run_episodes(
                evaluator, inputs.labels, episodes.ways, shots, queries, episodes.count, episodes.seed,
                features=features, model=inputs.network, images=inputs.images, to_input=to_input,
                device=inputs.device, center=inputs.center, normalize=inputs.normalize))
        except evaluation.EvaluatorError as exc:  # named here, where its name is known: one line, exit code 1
            raise PluginError(exc.naming(name) if named is None else exc.blaming(named)) from exc
    cached = inputs.features_cached
    if recording is not None:
        recording()
    results = []
    for (shots, queries), scores in zip(shapes, all_scores, strict=True):
        mean, ci = evaluation.ci95(scores)
        result = {"split": episodes.split, "ways": episodes.ways, "shots": shots, "queries": queries,
                  "episodes": episodes.count, "evaluator": label, "metric": traits.metric, "seed": episodes.seed,
                  "stream": evaluation.EPISODE_STREAM, "epoch": episodes.epoch, "accuracy": mean, "ci95": ci,
                  **({"precision": inputs.precision} if inputs.precision is not None else {}),
                  **({"run_precision": inputs.run_precision} if inputs.run_precision is not None else {})}
        if source is None:
            log.write("eval", **{k: v for k, v in result.items() if k not in IDENTITY}, **(at or {}))
        else:
            log.write("eval", source=source, **result)
        if cached is not None:
            result["features_cached"] = cached
            cached = features is not None  # the next shape reuses the features already in memory
        if save:
            saved = result if inputs.data is None else {**result, "data": inputs.data}
            log.run.save_accuracies(saved, scores.tolist())
        results.append(result)
    return results

