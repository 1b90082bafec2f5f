"""Episode sampling, per-episode accuracy and the confidence interval."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fslab_plugins.methods.nca import centroid

from fslab.core.errors import UsageError
from fslab.training.evaluation import (
    EPISODE_BLOCK,
    EPISODE_CHUNK,
    ci95,
    episode_scores,
    episode_shapes,
    extract_features,
    sample_episodes,
)


def uneven_labels():
    """12 classes of 8 to 30 images, shuffled; classes 0 and 1 have only 8."""
    sizes = [8, 8] + [12 + 2 * c for c in range(10)]
    labels = torch.cat([torch.full((size,), c) for c, size in enumerate(sizes)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]


def test_ci95_on_known_values():
    mean, ci = ci95([0.0, 1.0, 0.0, 1.0])
    assert mean == pytest.approx(0.5)
    assert ci == pytest.approx(1.96 * 0.5 / 2)  # population std of 0/1 halves is 0.5
    assert ci95(torch.full((10,), 0.8)) == pytest.approx((0.8, 0.0))
    with pytest.raises(UsageError):
        ci95([])


def test_sampled_episodes_have_distinct_classes_and_images():
    labels = uneven_labels()
    episodes = EPISODE_BLOCK + 200  # more than one block
    support, query = sample_episodes(labels, ways=5, shots=3, queries=6, episodes=episodes, seed=1)
    assert support.shape == (episodes, 5, 3) and query.shape == (episodes, 5, 6)
    both = torch.cat([support, query], dim=2)  # [E, w, n+q]
    for episode in both:
        assert episode.unique().numel() == episode.numel()  # no image twice
        classes = labels[episode]
        assert (classes == classes[:, :1]).all()  # one class per way
        assert classes[:, 0].unique().numel() == 5  # distinct ways
    drawn = labels[both].unique().tolist()
    assert 0 not in drawn and 1 not in drawn  # 8 images < shots + queries
    assert len(drawn) == 10


def test_same_seed_same_episodes():
    labels = uneven_labels()
    first = sample_episodes(labels, 5, 1, 4, 300, seed=7)
    again = sample_episodes(labels.tolist(), 5, 1, 4, 300, seed=7)
    other = sample_episodes(labels, 5, 1, 4, 300, seed=8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


def test_the_first_episodes_do_not_depend_on_how_many_are_drawn():
    labels = uneven_labels()
    few = sample_episodes(labels, 5, 2, 3, 40, seed=4)
    many = sample_episodes(labels, 5, 2, 3, EPISODE_BLOCK + 40, seed=4)
    assert all(torch.equal(a, b[:40]) for a, b in zip(few, many))


def test_floyd_subsets_are_distinct_and_uniform():
    from fslab.training.evaluation import floyd_subsets

    g = torch.Generator().manual_seed(0)
    sizes = torch.tensor([7, 20, 5] * 4000)
    picked = floyd_subsets(sizes, torch.rand(len(sizes), 5, generator=g, dtype=torch.float64))
    assert bool((picked >= 0).all()) and bool((picked < sizes[:, None]).all())
    assert all(len(set(row)) == 5 for row in picked.tolist())
    assert bool((picked[2::3].sort(dim=1).values == torch.arange(5)).all())  # size 5: all of them
    # each of the 7 items is in a 5-subset with probability 5/7: 4000 rows, std ~ 29
    counts = torch.bincount(picked[0::3].flatten(), minlength=7).float()
    assert bool(((counts - 4000 * 5 / 7).abs() < 120).all())
    counts = torch.bincount(picked[1::3].flatten(), minlength=20).float()  # 5/20 each, std ~ 27
    assert bool(((counts - 1000).abs() < 110).all())


def test_support_and_query_split_is_uniform():
    # One class of 6 images, 1 shot + 5 queries: every image is the shot 1/6 of the time.
    labels = torch.arange(2).repeat_interleave(6)
    support, _ = sample_episodes(labels, 2, 1, 5, 6000, seed=0)
    first_class = torch.where(labels[support[:, 0, 0]] == 0, support[:, 0, 0], support[:, 1, 0])
    counts = torch.bincount(first_class, minlength=6).float()
    assert bool(((counts - 1000).abs() < 120).all())  # std ~ 29


def test_too_few_large_enough_classes_is_a_usage_error():
    with pytest.raises(UsageError, match="need 11 classes"):
        sample_episodes(uneven_labels(), ways=11, shots=1, queries=9, episodes=5, seed=0)
    with pytest.raises(UsageError):
        sample_episodes(uneven_labels(), ways=1, shots=1, queries=1, episodes=5, seed=0)


def brute_force_accuracies(features, labels, ways, shots, queries, episodes, seed, center):
    """Nearest centroid, one episode and one query at a time."""
    features = F.normalize(features - center, dim=1)
    support_idx, query_idx = sample_episodes(labels, ways, shots, queries, episodes, seed)
    accuracies = []
    for support_rows, query_rows in zip(support_idx, query_idx):
        centroids = [features[rows].mean(dim=0) for rows in support_rows]
        correct = 0
        for true_way, rows in enumerate(query_rows):
            for row in rows:
                distances = [float(((features[row] - c) ** 2).sum()) for c in centroids]
                correct += distances.index(min(distances)) == true_way
        accuracies.append(correct / (ways * queries))
    return torch.tensor(accuracies)


@pytest.mark.parametrize("shots", [1, 5])
def test_centroid_accuracy_matches_a_brute_force_loop(torch_seed, shots):
    labels = uneven_labels()
    # Class-dependent means so accuracies are neither 0 nor 1.
    features = torch.randn(len(labels), 16) + 0.7 * torch.randn(12, 16)[labels]
    center = features[:40].mean(dim=0)
    fast = episode_scores(features, labels, centroid, 5, shots, 5, 60, seed=3, center=center, chunk=7)
    slow = brute_force_accuracies(features, labels, 5, shots, 5, 60, 3, center)
    assert fast.shape == (60,)
    assert torch.allclose(fast, slow)
    assert 0.2 < float(fast.mean()) < 0.95


def test_many_episodes_are_drawn_and_scored_block_by_block_not_all_at_once(monkeypatch):
    """fslab eval --episodes 1000000 --ways 40 drew every episode's images before scoring any
    (tens of GB, killed by the kernel); a block's draws at a time give the same scores."""
    from fslab.training import evaluation

    labels = uneven_labels()
    features = torch.randn(len(labels), 8, generator=torch.Generator().manual_seed(1)) + labels[:, None]
    episodes = 2 * EPISODE_BLOCK + 30
    center = features.mean(dim=0)
    expected = brute_force_accuracies(features, labels, 5, 2, 3, episodes, 4, center)
    widest, drawn = [], evaluation.floyd_subsets
    monkeypatch.setattr(evaluation, "floyd_subsets", lambda sizes, u: widest.append(len(sizes)) or drawn(sizes, u))
    for chunk in (7, 100, episodes):  # chunks across the blocks' bounds, and one chunk of every block
        widest.clear()
        scores = episode_scores(features, labels, centroid, 5, 2, 3, episodes, seed=4, center=center, chunk=chunk)
        assert torch.allclose(scores, expected)
        assert max(widest) == EPISODE_BLOCK * 5  # rows of one block, never of all the episodes


def test_separable_features_are_always_right():
    labels = uneven_labels()
    features = F.one_hot(labels, 12).float() * 10 + 0.01 * torch.randn(len(labels), 12)
    accuracies = episode_scores(features, labels, centroid, 5, 1, 5, 200, seed=0)
    assert torch.equal(accuracies, torch.ones(200))


def test_accuracy_is_measured_against_the_way_order():
    # A classifier that always answers way 0 is right on exactly 1/w of the queries.
    labels = uneven_labels()
    always_first = lambda support, query: torch.zeros(query.shape[:2], dtype=torch.long)
    accuracies = episode_scores(torch.randn(len(labels), 4), labels, always_first, 4, 2, 3, 20, seed=0)
    assert torch.allclose(accuracies, torch.full((20,), 0.25))


def test_extract_features_runs_in_eval_mode_and_restores_training(torch_seed):
    from fslab_plugins.backbones.networks import Conv4

    model = Conv4(1, hidden=8)
    model.train()
    images = torch.randint(0, 256, (10, 1, 12, 12), dtype=torch.uint8)
    normalize = lambda x: (x.float() / 255 - 0.5) / 0.5
    features = extract_features(model, images, 4, "cpu", normalize)
    assert features.shape == (10, 8) and not features.requires_grad
    assert model.training
    model.eval()
    with torch.no_grad():
        expected = model(normalize(images))
    assert torch.allclose(features, expected, atol=1e-6)
    assert torch.allclose(extract_features(model, images, 10, "cpu", normalize), features, atol=1e-6)


def test_evaluator_is_registered(registry):
    classify = registry.create("evaluator", "centroid")
    support = torch.tensor([[[[0.0, 0.0]], [[5.0, 5.0]]]])  # one episode, 2 ways, 1 shot
    query = torch.tensor([[[4.0, 4.5], [0.5, -1.0]]])
    assert classify(support, query).tolist() == [[1, 0]]
    assert math.isclose(ci95([1.0])[0], 1.0)


# (ways, shots, queries): the 1- and 5-shot tests of the papers, and other ways and queries
PREFIX_SHAPES = [(5, 1, 15), (5, 5, 15), (3, 2, 4), (10, 5, 1)]


@pytest.mark.parametrize("ways,shots,queries", PREFIX_SHAPES)
def test_every_evaluators_first_n_scores_are_its_n_episode_scores(registry, ways, shots, queries):
    """The fact comparisons rest on when they cut a longer evaluation to the count another run has: the first
    N scores of an N'-episode evaluation are, to the bit, those of an N-episode one (the seeded stream draws
    whole blocks, and an evaluator scores each episode alone, whatever the chunk it comes in), for every
    feature evaluator, across a block's and a chunk's bounds."""
    from fslab.training.evaluation import run_episodes

    gen = torch.Generator().manual_seed(3)
    labels = torch.arange(12).repeat_interleave(25)
    features = torch.randn(len(labels), 16, generator=gen) + F.one_hot(labels, 16).float() * 0.5
    from fslab.core.types import evaluator_traits

    evaluators = {n: registry.create("evaluator", n) for n in registry.names("evaluator")}
    evaluators = {n: e for n, e in evaluators.items() if not evaluator_traits(e).needs_model}
    assert {"centroid", "knn", "soft", "sen", "ap", "retrieval-map"} <= set(evaluators)
    for name, classify in evaluators.items():
        for n, q in episode_shapes(classify, [shots], queries):
            few, many = (run_episodes(classify, labels, ways, n, q, count, seed=11, features=features)
                         for count in (EPISODE_CHUNK + 30, EPISODE_BLOCK + 70))
            assert torch.equal(few, many[: EPISODE_CHUNK + 30]), (name, ways, n, q)


def test_finetunes_first_n_scores_are_its_n_episode_scores(registry):
    """finetune adapts a copy of the network on each episode, reset before the next: its first N scores
    of N' episodes are its N-episode scores too (the count its 100-episode default is cut to)."""
    from fslab.training.evaluation import run_episodes

    torch.manual_seed(0)
    labels = torch.arange(8).repeat_interleave(6)
    images = torch.randint(0, 256, (len(labels), 1, 4, 4), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(5))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8))
    finetune = registry.create("evaluator", "finetune")

    def scores(count, ways=3, shots=2, queries=2):
        return run_episodes(finetune, labels, ways, shots, queries, count, seed=2, model=model, images=images,
                            to_input=lambda x: x.float() / 255)

    assert torch.equal(scores(4), scores(7)[:4])
    assert torch.equal(scores(3, ways=5, shots=3, queries=1), scores(6, ways=5, shots=3, queries=1)[:3])
