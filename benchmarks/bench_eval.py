"""Few-shot evaluation speed, one command: ``python benchmarks/bench_eval.py``.

1. 10,000 episodes (5-way 5-shot, 15 queries) on cached 640-d features of
   12,000 images (20 classes × 600, miniImageNet's test split size), against
   the previous implementation measured in the same run (random keys + topk
   sampling, 1,000-episode chunks, full distance matrices). The new code is
   also run on the previous implementation's episodes, to show that only the
   episode stream changed, not the scores.
2. Every other feature evaluator on the same 10,000 episodes.
3. fslab's way (embed every image once, then gather episodes) against the way
   common few-shot libraries evaluate (run the backbone on every episode's
   100 images), same backbone and images; the per-episode loop is timed on a
   few episodes and extrapolated, and both accuracies are printed with their CI.

Timings are the best of ``--repeats``; the machine's load average is printed
(other processes slow everything down).

With ``--device cuda`` it measures a run's whole test evaluation on the GPU
instead: the 12,000 test images (84×84) embedded by a ResNet-12 in each
``eval.precision`` (channels-last), then 10,000 episodes of each of 1 and 5
shots from the float32 features, on the GPU and, for comparison, on the CPU
(with how many episode accuracies differ between the two), then every other
feature evaluator on the GPU.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from fslab_plugins.methods.nca import centroid, squared_distances

from fslab.core.types import evaluator_traits
from fslab.training import evaluation
from fslab.training.build import to_input

sys.path.insert(0, str(Path(__file__).parent))
import options  # noqa: E402


def best_of(repeats: int, fn):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def legacy_sample_episodes(labels, ways, shots, queries, episodes, seed):
    """The episode sampler before stream 2: one random key per image of each
    chosen class (padded to the largest class) and topk."""
    labels = torch.as_tensor(labels, dtype=torch.long).flatten()
    per_class = shots + queries
    classes, counts = torch.unique(labels, return_counts=True)
    eligible = classes[counts >= per_class]
    order = torch.argsort(labels, stable=True)
    class_counts = counts[counts >= per_class]
    starts = torch.searchsorted(labels[order], eligible)
    width = int(class_counts.max())
    positions = torch.arange(width)
    table = order[(starts[:, None] + positions).clamp(max=labels.numel() - 1)]
    padding = positions[None, :] >= class_counts[:, None]
    generator = torch.Generator().manual_seed(int(seed))
    support, query = [], []
    for first in range(0, episodes, 500):
        block = min(500, episodes - first)
        chosen = torch.rand(block, eligible.numel(), generator=generator).topk(ways, dim=1, largest=False).indices
        keys = torch.rand(block, ways, width, generator=generator).masked_fill(padding[chosen], 2.0)
        picked = keys.topk(per_class, dim=2, largest=False, sorted=True).indices
        indices = table[chosen[:, :, None], picked]
        support.append(indices[:, :, :shots])
        query.append(indices[:, :, shots:])
    return torch.cat(support), torch.cat(query)


def legacy_scores(features, labels, ways, shots, queries, episodes, seed, center):
    """The previous core: gather with advanced indexing in 1,000-episode chunks,
    full squared-distance matrix, argmin."""
    features = torch.nn.functional.normalize(features - center, dim=1)
    support_idx, query_idx = legacy_sample_episodes(labels, ways, shots, queries, episodes, seed)
    truth = torch.arange(ways).repeat_interleave(queries)
    out = []
    for first in range(0, episodes, 1000):
        support = features[support_idx[first : first + 1000]]
        query = features[query_idx[first : first + 1000]].flatten(1, 2)
        out.append((squared_distances(query, support.mean(dim=2)).argmin(-1) == truth).float().mean(1))
    return torch.cat(out)


def cached_features(episodes: int, repeats: int) -> None:
    torch.manual_seed(0)
    labels = torch.arange(20).repeat_interleave(600)
    features = torch.randn(12000, 640) + 0.3 * torch.randn(20, 640)[labels]
    center = features.mean(0)
    evaluation.episode_scores(features, labels, centroid, 5, 5, 15, 100, 0, center=center)  # warm-up
    new_s, new = best_of(repeats, lambda: evaluation.episode_scores(features, labels, centroid, 5, 5, 15, episodes, 0,
                                                                    center=center))
    old_s, old = best_of(repeats, lambda: legacy_scores(features, labels, 5, 5, 15, episodes, 0, center))
    sample_s, _ = best_of(repeats, lambda: evaluation.sample_episodes(labels, 5, 5, 15, episodes, 0))
    old_sample_s, _ = best_of(repeats, lambda: legacy_sample_episodes(labels, 5, 5, 15, episodes, 0))
    # episode_scores draws its episodes block by block: the old stream as one block
    with mock.patch.object(evaluation, "episode_blocks", lambda *draw: iter([legacy_sample_episodes(*draw)])):
        on_old_episodes = evaluation.episode_scores(features, labels, centroid, 5, 5, 15, episodes, 0, center=center)
    differing = int((on_old_episodes != old).sum())
    (new_mean, new_ci), (old_mean, old_ci) = evaluation.ci95(new), evaluation.ci95(old)
    print(f"{episodes} episodes, 5-way 5-shot 15 queries, on cached 12,000 x 640 features (best of {repeats}):")
    print(f"  fslab now:       {new_s:6.3f} s ({1e6 * new_s / episodes:5.0f} us/episode; sampling {sample_s:.3f} s)  "
          f"accuracy {100 * new_mean:.2f} ± {100 * new_ci:.2f}%")
    print(f"  before (same run): {old_s:6.3f} s ({1e6 * old_s / episodes:5.0f} us/episode; "
          f"sampling {old_sample_s:.3f} s)  accuracy {100 * old_mean:.2f} ± {100 * old_ci:.2f}%")
    print(f"  speed-up {old_s / new_s:.1f}x; new code on the old episodes: {differing} of {episodes} episode "
          f"accuracies differ from before")
    for name, evaluator, shape in evaluators():
        seconds, scores = best_of(repeats, lambda evaluator=evaluator, shape=shape: evaluation.episode_scores(
            features, labels, evaluator, 5, *shape, episodes, 0, center=center))
        mean, ci = evaluation.ci95(scores)
        print(f"  {name:<14} {seconds:6.3f} s  {evaluator_traits(evaluator).metric} {100 * mean:.2f} ± {100 * ci:.2f}%"
              f"  ({shape[0]}-shot, {shape[1]} queries)")


def evaluators():
    from fslab_plugins.methods.map import RetrievalMAP, ap_classify
    from fslab_plugins.methods.nca_evaluators import knn, soft
    from fslab_plugins.methods.sen import sen_nearest

    return [("knn", knn, (5, 15)), ("soft", soft, (5, 15)), ("ap", ap_classify, (5, 15)),
            ("sen", sen_nearest, (5, 15)), ("retrieval-map", RetrievalMAP(), (1, 9))]


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
    fast = evaluation.episode_scores(features, data.labels, centroid, ways, shots, queries, episodes, 0, center=center)
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
    same = torch.equal(fast[:loop_episodes], torch.stack(slow))
    print(f"{backbone}, {len(data)} test images, {episodes} episodes:")
    print(f"  embed once + cached episodes: {fast_seconds:8.2f} s   "
          f"accuracy {100 * fast_mean:.2f} ± {100 * fast_ci:.2f}%")
    print(f"  backbone per episode (est.):  {loop_seconds:8.2f} s   "
          f"accuracy {100 * slow_mean:.2f} ± {100 * slow_ci:.2f}% (first {loop_episodes} episodes; "
          f"per-episode accuracies {'identical' if same else 'NOT identical'} to fslab's)")
    print(f"  speed-up: {loop_seconds / fast_seconds:.0f}x")


def synchronised(device: torch.device, fn):
    def run():
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out
    return run


def on_device(device: torch.device, episodes: int, repeats: int, backbone: str, eval_batch: int) -> None:
    """The test evaluation of one run on ``device``: embedding, then the episodes."""
    import fslab
    from fslab.training.numerics import Numerics, apply_backend_settings, embed

    torch.manual_seed(0)
    labels = torch.arange(20).repeat_interleave(600)
    images = torch.randint(0, 256, (12000, 3, 84, 84), dtype=torch.uint8)
    model = fslab.create("backbone", backbone, in_channels=3).to(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"test evaluation on {name}: {backbone}, 12,000 images of 84x84, eval.batch_size {eval_batch}")
    for precision in ("fp32", "bf16"):
        numerics = Numerics(device, precision, precision, device.type == "cuda", "off", True, False)
        apply_backend_settings(numerics)
        network = model.to(memory_format=torch.channels_last) if numerics.channels_last else model
        seconds, _ = best_of(repeats, synchronised(device, lambda network=network, numerics=numerics: embed(
            network, images, eval_batch, numerics)))
        print(f"  embed in {precision}: {seconds:6.3f} s ({len(images) / seconds:,.0f} images/s)")
    features = torch.randn(12000, 640) + 0.3 * torch.randn(20, 640)[labels]  # separable, as trained features are
    center = features.mean(0)

    def both_shots(where):
        return [evaluation.run_episodes(centroid, labels, 5, shots, 15, episodes, 0, features=features,
                                        device=where, center=center) for shots in (1, 5)]

    both_shots(device)  # warm-up
    gpu_s, gpu = best_of(repeats, synchronised(device, lambda: both_shots(device)))
    cpu_s, cpu = best_of(repeats, lambda: both_shots(torch.device("cpu")))
    differ = sum(int((a != b).sum()) for a, b in zip(gpu, cpu))
    print(f"  {episodes:,} episodes x (1-shot, 5-shot), centroid: {gpu_s:6.3f} s on {device.type}, "
          f"{cpu_s:6.3f} s on the CPU ({differ} of {2 * episodes:,} episode accuracies differ)")
    for label, evaluator, shape in evaluators():
        seconds, _ = best_of(repeats, synchronised(device, lambda evaluator=evaluator, shape=shape:
                             evaluation.run_episodes(evaluator, labels, 5, shape[0], shape[1], episodes, 0,
                                                     features=features, device=device, center=center)))
        print(f"  {label:<14} {seconds:6.3f} s for {episodes:,} episodes ({shape[0]}-shot, {shape[1]} queries)")


def main() -> None:
    parser = options.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10000)
    parser.add_argument("--backbone", default="resnet12")
    parser.add_argument("--loop-episodes", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu (the comparisons above) or cuda[:N] (a run's test "
                                                        "evaluation on the GPU)")
    parser.add_argument("--eval-batch-size", type=int, default=256, help="images per forward pass (--device cuda)")
    args = parser.parse_args()
    import fslab

    options.at_least(parser, args, episodes=1, loop_episodes=1, repeats=1, eval_batch_size=1)
    device = options.device(parser, args.device)
    options.known(parser, fslab.get_registry(), "backbone", [args.backbone], "--backbone")
    if device.type != "cpu":
        on_device(device, args.episodes, args.repeats, args.backbone, args.eval_batch_size)
        return
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads")
    cached_features(args.episodes, args.repeats)
    per_episode_vs_cached(args.backbone, args.episodes, min(args.loop_episodes, args.episodes))


if __name__ == "__main__":
    main()
