"""The synthetic glyph dataset: reproducible, well split, varied, learnable."""

from __future__ import annotations

import pytest
import torch
from fslab_plugins.datasets.synthetic import SyntheticDataset, image_colours
from fslab_plugins.methods.nca import centroid

from fslab.core.errors import UsageError
from fslab.training.evaluation import episode_scores

SMALL = {"classes": 30, "images_per_class": 12, "val_classes": 5, "test_classes": 5}


def test_same_seed_gives_identical_bytes_and_another_seed_differs():
    first = SyntheticDataset(seed=3, **SMALL).load("val")
    again = SyntheticDataset(seed=3, **SMALL).load("val")
    other = SyntheticDataset(seed=4, **SMALL).load("val")
    assert first.images.numpy().tobytes() == again.images.numpy().tobytes()
    assert torch.equal(first.labels, again.labels)
    assert not torch.equal(first.images, other.images)


def test_splits_do_not_depend_on_generation_order():
    test_first = SyntheticDataset(seed=1, **SMALL)
    test_first.load("test")
    train_first = SyntheticDataset(seed=1, **SMALL)
    train_first.load("train")
    assert torch.equal(test_first.load("test").images, train_first.load("test").images)


def test_split_sizes_types_and_disjoint_classes():
    dataset = SyntheticDataset(seed=0, **SMALL)
    splits = {name: dataset.load(name) for name in ("train", "val", "test")}
    expected_classes = {"train": 20, "val": 5, "test": 5}
    for name, split in splits.items():
        classes = expected_classes[name]
        assert split.images.shape == (classes * 12, 1, 16, 16) and split.images.dtype == torch.uint8
        assert split.labels.dtype == torch.int64
        assert torch.equal(torch.bincount(split.labels), torch.full((classes,), 12))
        assert len(split) == classes * 12 and len(split.classes) == classes
    names = [set(split.classes) for split in splits.values()]
    assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])
    assert splits["train"].classes[0] == "glyph-000" and splits["test"].classes[-1] == "glyph-029"
    assert dataset.channels == 1 and dataset.image_size == 16
    assert dataset.load("train") is splits["train"]  # cached


def test_images_of_a_class_vary_and_contain_ink():
    split = SyntheticDataset(seed=0, **SMALL).load("train")
    images = split.images.float() / 255
    first, second = images[split.labels == 0][:2]
    assert (first - second).abs().mean() > 0.05  # two drawings of one glyph differ
    ink = (images > 0.5).flatten(1).float().mean(dim=1)
    assert (ink > 0.03).all() and (ink < 0.6).all()  # every image shows strokes, none is filled


def test_raw_pixels_separate_test_classes_somewhat_but_not_perfectly():
    dataset = SyntheticDataset(seed=0)
    test = dataset.load("test")
    pixels = test.images.flatten(1).float() / 255
    accuracy = episode_scores(pixels, test.labels, centroid, 5, 5, 15, 300, seed=0, center=pixels.mean(0))
    assert 0.35 < float(accuracy.mean()) < 0.9


def test_other_image_sizes():
    dataset = SyntheticDataset(seed=0, image_size=28, **SMALL)
    assert dataset.load("val").images.shape == (60, 1, 28, 28)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"classes": 10, "val_classes": 5, "test_classes": 5}, "at least 2 classes"),
        ({"images_per_class": 1}, "images_per_class"),
        ({"image_size": 4}, "image_size"),
        ({"seed": -1}, "seed"),
        # a typo of a class count was checked by listing every class: 10**9 of them filled the memory
        ({"classes": 10**9}, r"^synthetic: dataset\.classes must be at most 100,000, got 1,000,000,000; real few-shot "
                             r"datasets have hundreds to thousands$"),
        # a typo of a size was drawn by the worker until the memory ran out
        ({"image_size": 100_000}, r"^synthetic: 200 classes × 30 images × 100000² pixels × 1 \(channels\) is "
                                  r"55,879 GiB of images, over the 64 GiB allowed; lower dataset\.image_size or "
                                  r"dataset\.images_per_class$"),
    ],
)
def test_bad_parameters_are_usage_errors(params, message):
    with pytest.raises(UsageError, match=message):
        SyntheticDataset(**params)


def test_unknown_split_is_a_usage_error():
    with pytest.raises(UsageError, match="train, val, test"):
        SyntheticDataset(**SMALL).load("validation")


def test_registered_with_its_own_training_recipe(registry):
    component = registry.get("dataset", "synthetic")
    defaults = component.info["defaults"]
    assert defaults["train"]["batch_size"] == 128 and defaults["train"]["epochs"] >= 1
    assert component.params["image_size"] == 16
    dataset = registry.create("dataset", "synthetic", root=None, **SMALL)
    assert len(dataset.load("test")) == 60


def test_three_channels_tint_the_same_ink_with_one_colour_per_class():
    grey = SyntheticDataset(**SMALL).load("train")
    colour = SyntheticDataset(**SMALL, channels=3).load("train")
    assert colour.images.shape == (grey.images.shape[0], 3, *grey.images.shape[2:])
    first = colour.images[grey.labels == 0].float()
    ink = grey.images[grey.labels == 0].float()
    # Each channel is the grey ink times the class's weight (rounded to whole intensities).
    weights = [(first[:, c].sum() / ink[:, 0].sum()).item() for c in range(3)]
    assert all(0.35 - 0.01 <= w <= 1.0 + 0.01 for w in weights)
    for c in range(3):
        assert (first[:, c] - ink[:, 0] * weights[c]).abs().max() <= 1.0
    other = colour.images[grey.labels == 1].float()
    assert [round((other[:, c].sum() / grey.images[grey.labels == 1, 0].float().sum()).item(), 3) for c in range(3)] \
        != [round(w, 3) for w in weights]  # another class, another colour


def test_threads_draw_the_same_bytes_as_one_class_after_another():
    from fslab_plugins.datasets.synthetic import render_class

    dataset = SyntheticDataset(**SMALL)
    split = dataset.load("val")
    serial = torch.cat([torch.from_numpy(render_class(0, c, SMALL["images_per_class"], 16))
                        for c in dataset.class_ranges["val"]])
    assert torch.equal(split.images[:, 0], serial)


def test_the_miniimagenet_stand_in_has_its_shape_without_drawing_it(registry):
    component = registry.get("dataset", "synthetic-mini")
    dataset = registry.create("dataset", "synthetic-mini", root=None)
    assert dataset.channels == 3 and dataset.image_size == 84
    assert dataset.split_sizes() == {"train": [600] * 64, "val": [600] * 16, "test": [600] * 20}
    assert component.info["defaults"]["train"] == {"crop_padding": 8, "flip": True}  # miniImageNet's


def test_distances_match_a_point_by_point_computation():
    """Every pixel's distance to the nearest drawn segment, against float64
    arithmetic one pixel and one segment at a time (more images than a block)."""
    import math

    import numpy as np
    from fslab_plugins.datasets.synthetic import DISTANCE_BLOCK, distance_to_strokes

    rng = np.random.default_rng(7)
    size, images = 9, DISTANCE_BLOCK + 3
    curve = rng.uniform(0, size - 1, (images, 3, 4, 2))
    present = np.array([True, False, True])
    got = distance_to_strokes(curve, present, size)
    assert got.shape == (images, size * size)
    for k in range(images):
        segments = [(curve[k, s, p], curve[k, s, p + 1]) for s in range(3) if present[s] for p in range(3)]
        for row in range(size):
            for col in range(size):
                best = math.inf
                for (ax, ay), (bx, by) in segments:
                    dx, dy = bx - ax, by - ay
                    t = min(max(((col - ax) * dx + (row - ay) * dy) / max(dx * dx + dy * dy, 1e-6), 0.0), 1.0)
                    best = min(best, math.hypot(col - ax - t * dx, row - ay - t * dy))
                assert abs(got[k, row * size + col] - best) < 1e-4


def colour_only_accuracy(split, episodes: int = 400) -> float:
    """5-way 5-shot nearest-centroid accuracy on each image's mean colour alone (the ink's
    RGB proportions): how far colour, not shape, tells the split's classes apart."""
    rgb = split.images.float().sum(dim=(2, 3))
    proportions = rgb / rgb.sum(dim=1, keepdim=True)
    scores = episode_scores(proportions, split.labels, centroid, 5, 5, 10, episodes, seed=0, center=None,
                            normalize=False)
    return scores.mean().item()


def test_a_colour_per_image_says_nothing_of_the_class_where_a_colour_per_class_gives_it_away():
    """With colour="class" the ink's colour alone classifies the test glyphs almost perfectly (the
    stand-in scored 100% so on an H100); with colour="image" colour alone is near chance (20%)."""
    shape = {"classes": 30, "val_classes": 5, "test_classes": 10, "images_per_class": 20, "image_size": 16,
             "channels": 3}
    by_class = SyntheticDataset(**shape, colour="class").load("test")
    by_image = SyntheticDataset(**shape, colour="image").load("test")
    assert colour_only_accuracy(by_class) > 0.95
    assert colour_only_accuracy(by_image) < 0.35
    # the same glyphs in both: each channel is the grey ink times the image's weight for it, rounded
    grey = SyntheticDataset(**{**shape, "channels": 1}).load("test").images.float()
    weights = torch.cat([torch.from_numpy(image_colours(0, c, 20)) for c in range(20, 30)]).float()
    assert 0.35 <= weights.min() and weights.max() <= 1.0
    assert torch.equal(by_image.images.float(), torch.round(grey * weights[:, :, None, None]))


def test_the_stand_in_colours_each_image_and_refuses_an_unknown_colour(registry):
    assert registry.create("dataset", "synthetic-mini", root=None).colour == "image"
    assert registry.create("dataset", "synthetic", root=None).colour == "class"
    with pytest.raises(UsageError, match="colour must be one of class, image"):
        SyntheticDataset(colour="pixel")


def test_a_large_split_is_drawn_once_then_read_from_the_cache(tmp_path, monkeypatch):
    """Splits of at least CACHE_MIN_BYTES are drawn into $XDG_CACHE_HOME/fslab/synthetic once; a later
    dataset reads the same bytes back without drawing, and other parameters draw (and keep) their own."""
    import fslab_plugins.datasets.synthetic as synthetic

    shape = {**SMALL, "channels": 3, "colour": "image"}
    drawn = SyntheticDataset(**shape).load("val")  # under the threshold: drawn in memory, nothing written
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert not (tmp_path / "fslab").exists()
    monkeypatch.setattr(synthetic, "CACHE_MIN_BYTES", 0)
    first = SyntheticDataset(**shape).load("val")
    folder = tmp_path / "fslab" / "synthetic"
    assert len(list(folder.glob("synthetic-val-*.u8"))) == 1
    assert torch.equal(first.images, drawn.images) and torch.equal(first.labels, drawn.labels)
    assert first.classes == drawn.classes

    def no_drawing(*args, **kwargs):
        raise AssertionError("the cached split was drawn again")

    with monkeypatch.context() as patch:
        patch.setattr(synthetic, "render_class", no_drawing)
        again = SyntheticDataset(**shape).load("val")
    assert torch.equal(again.images, drawn.images) and again.classes == drawn.classes
    other = SyntheticDataset(**{**shape, "seed": 1}).load("val")  # its own files, beside the first
    assert not torch.equal(other.images, drawn.images)
    assert len(list(folder.glob("synthetic-val-*.u8"))) == 2
