"""Few-shot evaluation speed, one command: ``python benchmarks/bench_eval.py``.

1. 10,000 episodes (5-way 5-shot, 15 queries) on cached 640-d features of
   12,000 images (20 classes × 600, miniImageNet's test split size).
2. fslab's way (embed every image once, then gather episodes) against the way
   common few-shot libraries evaluate (run the backbone on every episode's
   100 images), same backbone and images; the per-episode loop is timed on a
   few episodes and extrapolated, and both accuracies are printed with their CI.
"""

from __future__ import annotations

import argparse
import time

import torch

from fslab import evaluation
from fslab.train import to_input
from fslab_plugins.nca import centroid


def cached_features(episodes: int) -> None:
    torch.manual_seed(0)
    labels = torch.arange(20).repeat_interleave(600)
    features = torch.randn(12000, 640) + 0.3 * torch.randn(20, 640)[labels]
    center = features.mean(0)
    evaluation.episode_accuracies(features, labels, centroid, 5, 5, 15, 100, 0, center=center)  # warm-up
    start = time.perf_counter()
    accuracies = evaluation.episode_accuracies(features, labels, centroid, 5, 5, 15, episodes, 0, center=center)
    seconds = time.perf_counter() - start
    mean, ci = evaluation.ci95(accuracies)
    print(f"{episodes} episodes on cached 12,000 x 640 features: {seconds:.2f} s "
          f"({1e6 * seconds / episodes:.0f} us/episode; accuracy {100 * mean:.2f} ± {100 * ci:.2f}%)")


def per_episode_vs_cached(backbone: str, episodes: int, loop_episodes: int) -> None:
    import fslab

    torch.manual_seed(0)
    data = fslab.create("dataset", "synthetic", root=None).load("test")
    model = fslab.create("backbone", backbone, in_channels=1).eval()
    ways, shots, queries = 5, 5, 15
    support_idx, query_idx = evaluation.sample_episodes(data.labels, ways, shots, queries, episodes, seed=0)

    start = time.perf_counter()
    features = evaluation.extract_features(model, data.images, 256, "cpu", to_input)
    center = features.mean(0)
    fast = evaluation.episode_accuracies(features, data.labels, centroid, ways, shots, queries, episodes, 0, center=center)
    fast_seconds = time.perf_counter() - start

    truth = torch.arange(ways).repeat_interleave(queries)
    slow = []
    start = time.perf_counter()
    with torch.no_grad():
        for e in range(loop_episodes):
            images = torch.cat([data.images[support_idx[e].flatten()], data.images[query_idx[e].flatten()]])
            z = model(to_input(images))
            z = torch.nn.functional.normalize(z - center, dim=1)
            support, query = z[: ways * shots].view(1, ways, shots, -1), z[ways * shots :][None]
            slow.append((centroid(support, query)[0] == truth).float().mean())
    loop_seconds = (time.perf_counter() - start) / loop_episodes * episodes
    fast_mean, fast_ci = evaluation.ci95(fast)
    slow_mean, slow_ci = evaluation.ci95(torch.stack(slow))
    print(f"{backbone}, {len(data)} test images, {episodes} episodes:")
    print(f"  embed once + cached episodes: {fast_seconds:8.2f} s   accuracy {100 * fast_mean:.2f} ± {100 * fast_ci:.2f}%")
    print(f"  backbone per episode (est.):  {loop_seconds:8.2f} s   accuracy {100 * slow_mean:.2f} ± {100 * slow_ci:.2f}% "
          f"(first {loop_episodes} episodes)")
    print(f"  speed-up: {loop_seconds / fast_seconds:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10000)
    parser.add_argument("--backbone", default="resnet12")
    parser.add_argument("--loop-episodes", type=int, default=20)
    options = parser.parse_args()
    cached_features(options.episodes)
    per_episode_vs_cached(options.backbone, options.episodes, options.loop_episodes)


if __name__ == "__main__":
    main()
