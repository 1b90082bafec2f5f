"""``fslab eval``: evaluate a run's checkpoint on many episodes, features cached.

The backbone embeds each image of a split once; the features are cached in
``runs/<id>/features/<split>-epoch<E>.pt`` (keyed by the checkpoint's epoch, so
a newer checkpoint is embedded again). Episodes come from the fixed evaluation
seed of the run's configuration, so every run is scored on the same episodes
and two runs can be compared episode by episode. Each evaluation is appended to
``metrics.jsonl`` as an ``eval`` event, and its per-episode accuracies are kept
in ``runs/<id>/evaluations/`` for paired comparisons.
"""

from __future__ import annotations

import os
import torch

from fslab import evaluation
from fslab.errors import UsageError
from fslab.registry import load_registry
from fslab.runstore import Run
from fslab.settings import load_settings
from fslab.train import MetricsLog, pick_device, plugin_kwargs, to_input


def load_features(run: Run, split: str, checkpoint: dict, device: torch.device, registry) -> tuple:
    """The split's features from the cache, or embedded now and cached."""
    cache = run.path / "features" / f"{split}-epoch{checkpoint['epoch']}.pt"
    if cache.exists():
        saved = torch.load(cache, weights_only=True)
        return saved["features"], saved["labels"], True
    cfg = run.config()
    dataset = registry.create("dataset", cfg["dataset"]["name"], root=cfg["dataset"]["root"],
                              **plugin_kwargs(cfg["dataset"], "root"))
    data = dataset.load(split)
    model = registry.create("backbone", cfg["backbone"]["name"], in_channels=dataset.channels,
                            **plugin_kwargs(cfg["backbone"])).to(device)
    model.load_state_dict(checkpoint["model"])
    features = evaluation.extract_features(model, data.images, cfg["eval"]["batch_size"], device, to_input)
    cache.parent.mkdir(exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    torch.save({"features": features, "labels": data.labels, "epoch": checkpoint["epoch"]}, tmp)
    os.replace(tmp, cache)
    return features, data.labels, False


def evaluate_run(run: Run, *, split: str, ways: int, shots: list[int], queries: int, episodes: int,
                 evaluator: str | None = None, device: str | None = None) -> list[dict]:
    """Evaluate the run's last checkpoint; returns one result per number of shots."""
    if not run.checkpoint_path.exists():
        raise UsageError(f"run {run.id} has no checkpoint yet (one is written after each epoch)")
    cfg = run.config()
    registry = load_registry(load_settings().plugin_dirs)
    torch_device = pick_device(device or cfg["device"])
    checkpoint = torch.load(run.checkpoint_path, map_location="cpu", weights_only=True)
    features, labels, cached = load_features(run, split, checkpoint, torch_device, registry)
    evaluator = evaluator or cfg["evaluator"]["name"]
    params = plugin_kwargs(cfg["evaluator"]) if evaluator == cfg["evaluator"]["name"] else {}
    classify = registry.create("evaluator", evaluator, **params)
    center = checkpoint["train_mean"] if cfg["eval"]["center"] else None
    seed = cfg["eval"]["seed"]
    log = MetricsLog(run, echo=False)
    results = []
    for n in shots:
        accuracies = evaluation.episode_accuracies(features, labels, classify, ways, n, queries, episodes, seed,
                                                   center=center, normalize=cfg["eval"]["normalize"])
        mean, ci = evaluation.ci95(accuracies)
        result = {"split": split, "ways": ways, "shots": n, "queries": queries, "episodes": episodes,
                  "evaluator": evaluator, "seed": seed, "epoch": checkpoint["epoch"], "accuracy": mean,
                  "ci95": ci, "features_cached": cached}
        log.write("eval", source="fslab eval", **{k: v for k, v in result.items() if k != "features_cached"})
        run.save_accuracies(result, accuracies)
        results.append(result)
        cached = True
    return results
