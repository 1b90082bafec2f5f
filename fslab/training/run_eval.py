"""``fslab eval``: evaluate a run's checkpoint on many episodes, features cached.

The backbone embeds each image of a split once; the features are cached in
``runs/<id>/features/<split>-epoch<E>.pt`` (keyed by the checkpoint's epoch, so
a newer checkpoint is embedded again; ``-stages<k>`` is added for multi-stage
features, ``eval.feature_stages`` > 1). Episodes come from the fixed evaluation
seed of the run's configuration, so every run is scored on the same episodes
and two runs can be compared episode by episode. Each evaluation is appended to
``metrics.jsonl`` as an ``eval`` event, and its per-episode scores are kept
in ``runs/<id>/evaluations/`` for paired comparisons, under the evaluator's
label (its name, plus its parameters when any are set: ``knn[k=3]``).

A model-aware evaluator (``finetune``) adapts the network on every episode,
so it gets the checkpoint's network and the split's images instead of cached
features, and runs its own small default number of episodes.
"""

from __future__ import annotations

import os

import torch

from fslab.training import evaluation
from fslab.core.errors import UsageError
from fslab.core.eventlog import EventLog
from fslab.core.events import evaluator_label
from fslab.training.features import feature_network
from fslab.core.registry import create_dataset, load_registry
from fslab.core.runstore import Run
from fslab.core.settings import load_settings
from fslab.training.train import pick_device, plugin_kwargs, to_input


class Checkpoint:
    """The run's last checkpoint, and the network and split images built from
    it on demand (embedding a split needs both; a cached split needs neither)."""

    def __init__(self, run: Run, device: torch.device, registry) -> None:
        self.run, self.device, self.registry = run, device, registry
        self.cfg = run.config()
        self.state = torch.load(run.checkpoint_path, map_location="cpu", weights_only=True)
        self.epoch = self.state["epoch"]
        self.stages = self.cfg["eval"].get("feature_stages", 1)
        self._dataset = None

    def dataset(self):
        if self._dataset is None:
            self._dataset = create_dataset(self.registry, self.cfg)
        return self._dataset

    def network(self) -> torch.nn.Module:
        """The evaluation network (the backbone, or its multi-stage features) on the device."""
        cfg = self.cfg
        model = self.registry.create("backbone", cfg["backbone"]["name"], in_channels=self.dataset().channels,
                                     **plugin_kwargs(cfg["backbone"])).to(self.device)
        model.load_state_dict(self.state["model"])
        return feature_network(model, self.stages)


def load_features(run: Run, split: str, checkpoint: Checkpoint) -> tuple:
    """The split's features from the cache, or embedded now and cached."""
    stages = checkpoint.stages  # multi-stage features are cached apart
    cache = run.path / "features" / (f"{split}-epoch{checkpoint.epoch}" + (f"-stages{stages}" if stages > 1 else "") + ".pt")
    if cache.exists():
        saved = torch.load(cache, weights_only=True)
        return saved["features"], saved["labels"], True
    data = checkpoint.dataset().load(split)
    features = evaluation.extract_features(checkpoint.network(), data.images, checkpoint.cfg["eval"]["batch_size"],
                                           checkpoint.device, to_input)
    cache.parent.mkdir(exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    torch.save({"features": features, "labels": data.labels, "epoch": checkpoint.epoch}, tmp)
    os.replace(tmp, cache)
    return features, data.labels, False


def evaluate_run(run: Run, *, split: str, ways: int, shots: list[int], queries: int, episodes: int | None = None,
                 evaluator: str | None = None, params: dict | None = None, device: str | None = None) -> list[dict]:
    """Evaluate the run's last checkpoint; returns one result per episode shape
    (per number of shots, or the evaluator's own fixed shape).

    ``evaluator`` defaults to the run's, with the run's parameters; ``params``
    override or add parameters. ``episodes`` defaults to 10,000, or to the
    evaluator's ``default_episodes`` for a slow model-aware one.
    """
    if not run.checkpoint_path.exists():
        raise UsageError(f"run {run.id} has no checkpoint yet (one is written after each epoch)")
    cfg = run.config()
    registry = load_registry(load_settings().plugin_dirs)
    torch_device = pick_device(device or cfg["device"])
    checkpoint = Checkpoint(run, torch_device, registry)
    name = evaluator or cfg["evaluator"]["name"]
    section = {**(plugin_kwargs(cfg["evaluator"]) if name == cfg["evaluator"]["name"] else {}), **(params or {})}
    classify = registry.create("evaluator", name, **section)
    label = evaluator_label({"name": name, **section})
    traits = evaluation.traits(classify)
    episodes = episodes or traits.default_episodes
    center = checkpoint.state["train_mean"] if cfg["eval"]["center"] else None
    seed = cfg["eval"]["seed"]

    if traits.needs_model:
        data = checkpoint.dataset().load(split)
        model, images, labels, features, cached = checkpoint.network(), data.images, data.labels, None, False
    else:
        model = images = None
        features, labels, cached = load_features(run, split, checkpoint)
    log = EventLog(run, echo=False)
    results = []
    for n, q in evaluation.episode_shapes(classify, shots, queries):
        scores = evaluation.run_episodes(classify, labels, ways, n, q, episodes, seed, features=features, model=model,
                                         images=images, to_input=to_input, device=torch_device, center=center,
                                         normalize=cfg["eval"]["normalize"])
        mean, ci = evaluation.ci95(scores)
        result = {"split": split, "ways": ways, "shots": n, "queries": q, "episodes": episodes,
                  "evaluator": label, "metric": traits.metric, "seed": seed, "stream": evaluation.EPISODE_STREAM,
                  "epoch": checkpoint.epoch, "accuracy": mean, "ci95": ci, "features_cached": cached}
        log.write("eval", source="fslab eval", **{k: v for k, v in result.items() if k != "features_cached"})
        run.save_accuracies(result, scores)
        results.append(result)
        cached = features is not None
    return results
