"""The iid and episodic samplers yield what they promise."""

from __future__ import annotations

import math
import pickle
import random
from collections import Counter

import pytest
from fslab_plugins.methods.nca import IIDSampler
from fslab_plugins.methods.protonet import EpisodicSampler

from fslab.core.errors import UsageError


def uneven_labels(classes=40):
    """Classes of 10 to 30 images, labels in a shuffled order."""
    labels = [c for c in range(classes) for _ in range(10 + (c * 7) % 21)]
    random.Random(0).shuffle(labels)
    return labels


def all_indices(sampler, epoch):
    return [i for batch in sampler.batches(epoch) for i in batch.indices]


# -- iid -------------------------------------------------------------------------


def test_iid_visits_each_image_once_per_epoch():
    sampler = IIDSampler(list(range(103)), 10, seed=0, drop_last=False)
    batches = list(sampler.batches(0))
    assert len(batches) == len(sampler) == 11
    assert sorted(all_indices(sampler, 0)) == list(range(103))
    assert all(batch.support is None for batch in batches)


def test_iid_drop_last_keeps_full_batches_without_repeats():
    sampler = IIDSampler(list(range(103)), 10, seed=0)
    batches = list(sampler.batches(3))
    assert len(batches) == len(sampler) == 10
    assert all(len(batch.indices) == 10 for batch in batches)
    assert len(set(all_indices(sampler, 3))) == 100


def test_iid_order_depends_only_on_seed_and_epoch():
    labels = list(range(50))
    first, again = IIDSampler(labels, 8, seed=5), IIDSampler(labels, 8, seed=5)
    assert all_indices(first, 2) == all_indices(again, 2)
    assert all_indices(first, 2) != all_indices(first, 3)
    assert all_indices(first, 2) != all_indices(IIDSampler(labels, 8, seed=6), 2)


def test_iid_survives_pickling():
    sampler = IIDSampler(list(range(40)), 8, seed=1)
    assert all_indices(pickle.loads(pickle.dumps(sampler)), 4) == all_indices(sampler, 4)


def test_iid_rejects_a_batch_larger_than_the_dataset():
    with pytest.raises(UsageError, match="drop_last"):
        IIDSampler(list(range(10)), 16, seed=0)
    assert len(IIDSampler(list(range(10)), 16, seed=0, drop_last=False)) == 1


# -- episodic --------------------------------------------------------------------


def check_episode(batch, labels, ways, shots, queries):
    """Distinct classes, distinct images, n + m rows per class, class by class."""
    rows = shots + queries
    assert len(batch.indices) == ways * rows == len(batch.support)
    assert len(set(batch.indices)) == len(batch.indices)
    episode_labels = [labels[i] for i in batch.indices]
    blocks = [episode_labels[c * rows : (c + 1) * rows] for c in range(ways)]
    assert all(len(set(block)) == 1 for block in blocks)
    assert len({block[0] for block in blocks}) == ways
    assert list(batch.support) == ([True] * shots + [False] * queries) * ways


def test_episodes_have_distinct_classes_and_images():
    labels = uneven_labels()
    sampler = EpisodicSampler(labels, 128, seed=0, ways=5, shots=2, queries=3)
    assert (sampler.ways, sampler.shots, sampler.queries) == (5, 2, 3)
    episodes = list(sampler.batches(0))
    assert len(episodes) == len(sampler) == math.ceil(len(labels) / 25)
    for batch in episodes:
        check_episode(batch, labels, 5, 2, 3)
        assert sum(batch.support) == 10


@pytest.mark.parametrize(
    "shots, per_class, ways, queries",
    [(5, 16, 32, 11), (5, 8, 64, 3), (5, 32, 16, 27), (1, 8, 64, 7)],
)
def test_episode_shape_from_the_nca_paper_parameterisation(shots, per_class, ways, queries):
    labels = [c for c in range(70) for _ in range(32)]
    sampler = EpisodicSampler(labels, 512, seed=0, shots=shots, per_class=per_class)
    assert (sampler.ways, sampler.shots, sampler.queries) == (ways, shots, queries)
    batch = next(iter(sampler.batches(0)))
    check_episode(batch, labels, ways, shots, queries)
    assert sum(batch.support) == ways * shots


def test_classes_too_small_for_an_episode_are_never_drawn():
    labels = [c for c in range(6) for _ in range(10)] + [100 + c for c in range(4) for _ in range(3)]
    sampler = EpisodicSampler(labels, 0, seed=2, ways=3, shots=2, queries=2)
    drawn = {labels[i] for epoch in range(5) for i in all_indices(sampler, epoch)}
    assert drawn <= set(range(6)) and len(drawn) == 6


def test_episodes_depend_only_on_seed_and_epoch_and_survive_pickling():
    labels = uneven_labels()
    sampler = EpisodicSampler(labels, 0, seed=9, ways=4, shots=1, queries=5)
    clone = pickle.loads(pickle.dumps(sampler))
    assert all_indices(clone, 1) == all_indices(sampler, 1)
    assert all_indices(EpisodicSampler(labels, 0, seed=9, ways=4, shots=1, queries=5), 1) == all_indices(sampler, 1)
    assert all_indices(sampler, 1) != all_indices(sampler, 2)
    assert all_indices(sampler, 1) != all_indices(EpisodicSampler(labels, 0, seed=10, ways=4, shots=1, queries=5), 1)


def test_episodes_spread_over_the_classes():
    labels = [c for c in range(10) for _ in range(20)]
    sampler = EpisodicSampler(labels, 0, seed=0, ways=2, shots=1, queries=1)
    counts = Counter(labels[i] for epoch in range(20) for i in all_indices(sampler, epoch))
    assert len(counts) == 10 and min(counts.values()) > 0.5 * max(counts.values())


@pytest.mark.parametrize(
    "batch_size, params, message",
    [
        (500, {"shots": 5, "per_class": 16}, "not divisible"),
        (512, {"shots": 5, "per_class": 5}, "must exceed shots"),
        (512, {"shots": 5, "per_class": 16, "ways": 32}, "not both"),
        (128, {"shots": 5}, "set ways and queries"),
        (128, {"ways": 5, "shots": 5, "queries": 0}, "set ways and queries"),
        (128, {"ways": 1, "shots": 5, "queries": 5}, "at least 2 ways"),
        (128, {"ways": 5, "shots": 0, "queries": 5}, "shots must be"),
        (128, {"ways": 50, "shots": 5, "queries": 5}, "50 classes"),
        (1024, {"shots": 5, "per_class": 16}, "64 classes"),
    ],
)
def test_bad_episode_shapes_are_usage_errors(batch_size, params, message):
    labels = [c for c in range(40) for _ in range(20)]
    with pytest.raises(UsageError, match=message):
        EpisodicSampler(labels, batch_size, seed=0, **params)


def test_samplers_are_registered_with_their_kind(registry):
    assert registry.get("sampler", "iid").info["episodic"] is False
    assert registry.get("sampler", "episodic").info["episodic"] is True
    assert registry.get("sampler", "episodic").params == {"ways": 0, "shots": 5, "queries": 0, "per_class": 0}
    sampler = registry.create("sampler", "episodic", labels=[c for c in range(4) for _ in range(4)],
                              batch_size=8, seed=0, shots=1, per_class=4)
    assert (sampler.ways, sampler.shots, sampler.queries) == (2, 1, 3)


# -- iid with replacement and fixed composition (NCA paper Fig. 4) ---------------

from fslab_plugins.methods.nca import FixedCompositionSampler, IIDReplacementSampler  # noqa: E402


def test_iid_replacement_batches_are_distinct_inside_but_repeat_across_the_epoch():
    sampler = IIDReplacementSampler(list(range(200)), 20, seed=3)
    batches = list(sampler.batches(0))
    assert len(batches) == len(sampler) == 10
    assert all(len(set(b.indices)) == len(b.indices) == 20 and b.support is None for b in batches)
    seen = Counter(all_indices(sampler, 0))
    # with replacement: about e^-1 of the images are missed, some appear twice
    assert max(seen.values()) > 1 and 40 < 200 - len(seen) < 110


def test_iid_replacement_depends_only_on_seed_and_epoch_and_pickles():
    sampler = IIDReplacementSampler(list(range(90)), 16, seed=4)
    assert all_indices(pickle.loads(pickle.dumps(sampler)), 2) == all_indices(sampler, 2)
    assert all_indices(IIDReplacementSampler(list(range(90)), 16, seed=4), 2) == all_indices(sampler, 2)
    assert all_indices(sampler, 2) != all_indices(sampler, 3)
    with pytest.raises(UsageError, match="batch_size"):
        IIDReplacementSampler(list(range(10)), 11, seed=0)


def check_fixed_batch(batch, labels, ways, per_class):
    assert len(batch.indices) == ways * per_class and batch.support is None
    assert len(set(batch.indices)) == len(batch.indices)
    batch_labels = [labels[i] for i in batch.indices]
    blocks = [batch_labels[c * per_class : (c + 1) * per_class] for c in range(ways)]
    assert all(len(set(block)) == 1 for block in blocks)
    assert len({block[0] for block in blocks}) == ways


@pytest.mark.parametrize("batch_size, params, ways, per_class", [
    (256, {"per_class": 8}, 32, 8),
    (128, {"ways": 16, "per_class": 8}, 16, 8),  # the mAP paper's 16 classes x 8 (batch_size ignored)
    (0, {"ways": 5, "per_class": 3}, 5, 3),
])
def test_fixed_composition_batches(batch_size, params, ways, per_class):
    labels = uneven_labels()
    sampler = FixedCompositionSampler(labels, batch_size, seed=0, **params)
    assert (sampler.ways, sampler.per_class) == (ways, per_class)
    batches = list(sampler.batches(1))
    assert len(batches) == len(sampler) == math.ceil(len(labels) / (ways * per_class))
    for batch in batches:
        check_fixed_batch(batch, labels, ways, per_class)


def test_fixed_composition_is_deterministic_picklable_and_skips_small_classes():
    labels = [c for c in range(8) for _ in range(10)] + [50 + c for c in range(5) for _ in range(3)]
    sampler = FixedCompositionSampler(labels, 0, seed=5, ways=4, per_class=4)
    assert all_indices(pickle.loads(pickle.dumps(sampler)), 0) == all_indices(sampler, 0)
    assert all_indices(FixedCompositionSampler(labels, 0, seed=5, ways=4, per_class=4), 0) == all_indices(sampler, 0)
    assert all_indices(sampler, 0) != all_indices(sampler, 1)
    drawn = {labels[i] for epoch in range(6) for i in all_indices(sampler, epoch)}
    assert drawn == set(range(8))


@pytest.mark.parametrize("batch_size, params, message", [
    (100, {"per_class": 8}, "not divisible"),
    (128, {"per_class": 1}, "per_class must be >= 2"),
    (8, {"per_class": 8}, "at least 2 classes"),
    (0, {"ways": 50, "per_class": 8}, "50 classes"),
])
def test_bad_fixed_compositions_are_usage_errors(batch_size, params, message):
    labels = [c for c in range(40) for _ in range(20)]
    with pytest.raises(UsageError, match=message):
        FixedCompositionSampler(labels, batch_size, seed=0, **params)


def test_new_samplers_are_registered_as_plain_batches(registry):
    for name in ("iid-replacement", "fixed"):
        assert registry.get("sampler", name).info["episodic"] is False
    assert registry.get("sampler", "fixed").params == {"ways": 0, "per_class": 8}


def test_a_sampler_built_on_too_small_classes_says_what_fits():
    from fslab_plugins.methods.nca import FixedCompositionSampler

    # classes of 3, 3 and 5 images: no class holds 8, and 4 ways are more than the 3 classes
    labels = [0] * 3 + [1] * 3 + [2] * 5
    with pytest.raises(UsageError, match=r"must be at most 3 \(its classes\) and sampler\.per_class at most 3$"):
        FixedCompositionSampler(labels, 32, 0, ways=4, per_class=8)
    with pytest.raises(UsageError, match=r"sampler\.shots \+ sampler\.queries must be at most 3 \(what 2 of"):
        EpisodicSampler(labels, 32, 0, ways=2, shots=5, queries=1)
