"""``synthetic``: a procedural few-shot dataset of stroke-drawn glyphs, built in.

Why it exists: fslab must be tried, tested and demonstrated without downloading
miniImageNet. Each class is a random glyph of two to four pen strokes (straight
segments or quadratic Bézier curves); each image redraws that glyph with the
jitter of a hand: control points wobble, the whole glyph is slightly rotated,
scaled and shifted, the pen width changes, and some pixel noise is added. Classes
are therefore defined by shape, not by pixels, and a network has to learn
stroke features that transfer to unseen glyphs — a small Omniglot in spirit.

Everything is derived from ``seed``: a class's glyph from ``(seed, class)``, its
images' jitter from ``(seed, class, 1)`` (drawn for all of the class's images
at once, so changing ``images_per_class`` redraws them), its colour from
``(seed, class, 2)`` and its images' colours from ``(seed, class, 3)``. Generating a split
never depends on which other splits were generated or in which order. Class indices run over
train, then validation, then test classes, which are therefore disjoint.

A split of at least :data:`CACHE_MIN_BYTES` (``synthetic-mini``'s, not the
default set's) is drawn once into ``$XDG_CACHE_HOME/fslab/synthetic/``
(default ``~/.cache/fslab/synthetic/``) through the on-disk datasets' cache
(:mod:`fslab_plugins.datasets.image_cache`) and memory-mapped by every later
run: its key holds the parameters and this file's size and modification
time, so a change to either draws it again.

numpy is imported inside functions so listing plugins does not load it.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fslab_plugins.datasets.image_cache import cached_split

from fslab.plugin import Split, UsageError, hookimpl, one_of

SPLITS = ("train", "val", "test")
COLOURS = ("class", "image")  # what the ink's colour follows when channels=3
# Splits of at least this many bytes are drawn once and cached on disk: synthetic-mini's take
# about 25 s to draw on 16 cores (an H100 machine's) and 80 s on 2 (1.6 s a class on one core of
# the 2-core CPU); the default set's 1 MB, 0.4 s.
CACHE_MIN_BYTES = 64 * 2**20
MAX_STROKES = 4
POINTS_PER_STROKE = 9  # a Bézier curve is drawn as an 8-segment polyline
GLYPH_EXTENT = 0.9  # the glyph box [-1, 1]² covers this fraction of half the image
# How much one drawing of a glyph differs from another (glyph units, radians,
# pixel intensity). Tuned so that nearest-centroid on raw pixels is far from
# perfect while a trained network separates unseen glyphs well.
JITTER = {"wobble": 0.12, "rotation": 0.4, "scale": (0.8, 1.15), "shift": 0.25, "noise": 0.1}


# The most classes a synthetic dataset draws (tieredImageNet has 608, Omniglot with rotations 6,492).
MAX_CLASSES = 100_000
# The most bytes its uint8 images may take together (synthetic-mini's take 1.3 GB): a mistyped image_size
# or images_per_class is refused before a run exists, not found out of memory by the worker.
MAX_BYTES = 64 * 2**30


class SyntheticDataset:
    """Stroke glyphs, ``classes`` of them with ``images_per_class`` images each.

    It takes no ``root``: it reads no files, so fslab hands it none and names, fills in or checks no
    data root for its runs (:func:`fslab.core.registry.reads_files`); a split at least
    :data:`CACHE_MIN_BYTES` is cached in the user's cache folder, not in a data root. Splits are
    generated on first ``load`` and kept in memory for the life of the instance, class by class on as many
    threads as there are cores (numpy releases the interpreter lock while it
    computes; every class draws from its own seeds, so the images do not depend
    on the threads). ``channels=3`` tints the ink, for networks with an RGB
    stem: with ``colour="class"`` every image of a class in the class's own
    colour (drawn from ``(seed, class, 2)``), so colour alone tells classes
    apart; with ``colour="image"`` every image in a colour of its own (drawn
    from ``(seed, class, 3)``), so colour says nothing of the class and only
    the glyph's shape does.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        classes: int = 200,
        images_per_class: int = 30,
        image_size: int = 16,
        val_classes: int = 40,
        test_classes: int = 40,
        channels: int = 1,
        colour: str = "class",
    ):
        if channels not in (1, 3):
            raise UsageError(f"synthetic: dataset.channels must be 1 (grey) or 3 (coloured ink), got {channels}")
        if colour not in COLOURS:
            raise UsageError(f"synthetic: colour must be one of {', '.join(COLOURS)}, got '{colour}'; "
                             "'class' gives each class its colour, 'image' each image its own")
        self.channels, self.colour = channels, colour
        if seed < 0:
            raise UsageError(f"synthetic: dataset.seed must be >= 0, got {seed}")
        if classes > MAX_CLASSES:  # split_sizes() lists every class before a run exists: 10**9 filled the memory
            raise UsageError(f"synthetic: dataset.classes must be at most {MAX_CLASSES:,}, got {classes:,}; "
                             f"real few-shot datasets have hundreds to thousands")
        if val_classes < 2 or test_classes < 2 or classes - val_classes - test_classes < 2:
            raise UsageError(
                f"synthetic: need at least 2 classes in each split, got dataset.classes={classes}, "
                f"dataset.val_classes={val_classes}, dataset.test_classes={test_classes}; dataset.classes counts "
                f"all three splits, so use dataset.classes >= {max(val_classes, 2) + max(test_classes, 2) + 2}"
            )
        if images_per_class < 2:
            raise UsageError(f"synthetic: dataset.images_per_class must be >= 2, got {images_per_class}")
        if image_size < 8:
            raise UsageError(f"synthetic: dataset.image_size must be >= 8 pixels, got {image_size}")
        if (size := classes * images_per_class * image_size**2 * channels) > MAX_BYTES:
            raise UsageError(f"synthetic: {classes:,} classes × {images_per_class:,} images × {image_size}² pixels "
                             f"× {channels} (channels) is {size / 2**30:,.0f} GiB of images, over the "
                             f"{MAX_BYTES // 2**30} GiB allowed; lower dataset.image_size or dataset.images_per_class")
        self.seed = seed
        self.classes = classes
        self.images_per_class = images_per_class
        self.image_size = image_size
        train_classes = classes - val_classes - test_classes
        self.class_ranges = {
            "train": range(0, train_classes),
            "val": range(train_classes, train_classes + val_classes),
            "test": range(train_classes + val_classes, classes),
        }
        self._cache: dict[str, Split] = {}

    def split_sizes(self) -> dict[str, list[int]]:
        """Images per class of each split, from the parameters alone (nothing is drawn)."""
        return {split: [self.images_per_class] * len(classes) for split, classes in self.class_ranges.items()}

    def load(self, split: str) -> Split:
        """Images ``uint8 [N, channels, H, W]``, labels ``0..C-1`` and names ``glyph-007``."""
        if split not in SPLITS:
            raise UsageError(f"synthetic: unknown split '{split}'. Allowed: {', '.join(SPLITS)}.")
        if split not in self._cache:
            classes = self.class_ranges[split]
            size = len(classes) * self.images_per_class * self.channels * self.image_size**2
            if size >= CACHE_MIN_BYTES:
                params = self.params()
                tag = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
                self._cache[split] = cached_split(synthetic_cache_folder(), f"synthetic-{split}-{tag}", params,
                                                  [Path(__file__)], lambda: self._draw(classes), verb="drawing")
            else:
                import numpy as np
                import torch

                labels, names, blocks = self._draw(classes)
                self._cache[split] = Split(images=torch.from_numpy(np.concatenate(list(blocks))),
                                           labels=torch.from_numpy(labels), classes=names)
        return self._cache[split]

    def params(self) -> dict:
        """Everything the images depend on."""
        return {"seed": self.seed, "classes": self.classes, "images_per_class": self.images_per_class,
                "image_size": self.image_size, "val_classes": len(self.class_ranges["val"]),
                "test_classes": len(self.class_ranges["test"]), "channels": self.channels, "colour": self.colour}

    def _draw(self, class_indices: range):
        """Labels ``0..C-1``, class names and the images as one uint8 block per
        class, in class order, drawn on as many threads as there are cores."""
        import numpy as np

        def render(c: int):
            ink = render_class(self.seed, c, self.images_per_class, self.image_size)[:, None]
            if self.channels == 1:
                return ink
            if self.colour == "class":
                return tint(ink, class_colour(self.seed, c)[None])
            return tint(ink, image_colours(self.seed, c, self.images_per_class))

        def blocks():
            with ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(class_indices)))) as pool:
                yield from pool.map(render, class_indices)  # in class order, whatever thread drew each

        labels = np.repeat(np.arange(len(class_indices), dtype=np.int64), self.images_per_class)
        return labels, [f"glyph-{c:03d}" for c in class_indices], blocks()


def synthetic_cache_folder() -> Path:
    """Where large synthetic splits are cached: ``$XDG_CACHE_HOME/fslab/synthetic``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "fslab" / "synthetic"


def class_colour(seed: int, class_index: int):
    """A class's ink colour: RGB weights in [0.35, 1], from ``(seed, class, 2)``."""
    import numpy as np

    return np.random.default_rng([seed, class_index, 2]).uniform(0.35, 1.0, 3)


def image_colours(seed: int, class_index: int, count: int):
    """A colour for each of a class's ``count`` images, ``[count, 3]`` in [0.35, 1], from ``(seed, class, 3)``."""
    import numpy as np

    return np.random.default_rng([seed, class_index, 3]).uniform(0.35, 1.0, (count, 3))


def tint(ink, colours):
    """``uint8 [K, 1, H, W]`` ink -> ``uint8 [K, 3, H, W]``: each channel the ink times its weight;
    ``colours`` is ``[1, 3]`` (one colour for every image) or ``[K, 3]``."""
    import numpy as np

    return np.round(ink.astype(np.float32) * colours.astype(np.float32)[:, :, None, None]).astype(np.uint8)


def glyph_strokes(rng):
    """One class's glyph: control points ``[MAX_STROKES, 3, 2]`` of quadratic
    Bézier strokes in the box [-1, 1]², and which strokes are drawn."""
    import numpy as np

    count = int(rng.integers(2, MAX_STROKES + 1))
    controls = np.zeros((MAX_STROKES, 3, 2))
    previous_end = None
    for s in range(count):
        # Half of the strokes continue from the previous one, as a pen would.
        start = previous_end if previous_end is not None and rng.random() < 0.5 else rng.uniform(-0.8, 0.8, 2)
        end = rng.uniform(-0.8, 0.8, 2)
        while np.linalg.norm(end - start) < 0.6:  # no dots: a stroke must be visible
            end = rng.uniform(-0.8, 0.8, 2)
        middle = (start + end) / 2
        if rng.random() < 0.6:  # a curve: push the middle control point sideways
            direction = end - start
            normal = np.array([-direction[1], direction[0]])
            middle = middle + normal * rng.uniform(0.3, 0.8) * rng.choice([-1.0, 1.0])
        controls[s] = np.stack([start, middle, end])
        previous_end = end
    present = np.arange(MAX_STROKES) < count
    return controls, present


def render_class(seed: int, class_index: int, count: int, size: int):
    """``count`` jittered renderings of class ``class_index``'s glyph, ``uint8 [count, size, size]``."""
    import numpy as np

    controls, present = glyph_strokes(np.random.default_rng([seed, class_index]))
    rng = np.random.default_rng([seed, class_index, 1])

    # Hand jitter: each control point wobbles, then a small similarity transform.
    points = controls[None] + rng.normal(0.0, JITTER["wobble"], (count, MAX_STROKES, 3, 2))
    angle = rng.uniform(-JITTER["rotation"], JITTER["rotation"], count)
    scale = rng.uniform(*JITTER["scale"], count)
    shift = rng.uniform(-JITTER["shift"], JITTER["shift"], (count, 2))
    cos, sin = np.cos(angle) * scale, np.sin(angle) * scale
    transform = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)  # [count, 2, 2]
    points = np.einsum("kij,ksej->ksei", transform, points) + shift[:, None, None, :]

    # Quadratic Bézier curves sampled as polylines: [count, strokes, points, 2].
    t = np.linspace(0.0, 1.0, POINTS_PER_STROKE)[:, None]
    p0, p1, p2 = points[:, :, 0:1], points[:, :, 1:2], points[:, :, 2:3]
    curve = (1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t**2 * p2
    pixels_per_unit = GLYPH_EXTENT * size / 2
    curve = curve * pixels_per_unit + (size - 1) / 2  # glyph units -> pixel coordinates

    pen_width = rng.uniform(0.06, 0.1, count) * size
    distance = distance_to_strokes(curve, present, size)  # [count, size*size]
    ink = np.clip(pen_width[:, None] / 2 + 0.5 - distance, 0.0, 1.0)  # anti-aliased edge
    ink = ink * rng.uniform(0.75, 1.0, (count, 1)) + rng.normal(0.0, JITTER["noise"], ink.shape)
    ink = np.clip(ink, 0.0, 1.0).reshape(count, size, size)
    return np.round(ink * 255).astype(np.uint8)


# Images whose distances are computed together: the [images, pixels, segments]
# temporaries of a block then stay small enough for the CPU's caches (at 84×84,
# 8 images are 7 MB a temporary, 600 would be 540 MB): 5× faster than drawing
# a class's images all at once, and the same bytes (each image is its own).
DISTANCE_BLOCK = 8


def distance_to_strokes(curve, present, size: int):
    """Distance from every pixel centre to the nearest drawn polyline segment:
    ``curve [K, S, P, 2]`` -> ``[K, size*size]``, :data:`DISTANCE_BLOCK` images at a time."""
    import numpy as np

    return np.concatenate([_block_distances(curve[i:i + DISTANCE_BLOCK], present, size)
                           for i in range(0, curve.shape[0], DISTANCE_BLOCK)])


def _block_distances(curve, present, size: int):
    """:func:`distance_to_strokes` for one block of images at once.

    x and y are kept as separate arrays: reductions over a trailing axis of
    length 2 are several times slower in numpy than elementwise arithmetic.
    """
    import numpy as np

    drawn = curve[:, present].astype(np.float32)  # only the class's strokes
    start = drawn[:, :, :-1].reshape(curve.shape[0], -1, 2)  # [K, segments, 2]
    along = drawn[:, :, 1:].reshape(curve.shape[0], -1, 2) - start
    length2 = np.maximum(along[..., 0] ** 2 + along[..., 1] ** 2, 1e-6)[:, None, :]  # [K, 1, G]
    rows, cols = np.meshgrid(np.arange(size, dtype=np.float32), np.arange(size, dtype=np.float32), indexing="ij")
    offset_x = cols.reshape(1, -1, 1) - start[:, None, :, 0]  # [K, pixels, G]
    offset_y = rows.reshape(1, -1, 1) - start[:, None, :, 1]
    along_x, along_y = along[:, None, :, 0], along[:, None, :, 1]
    t = np.clip((offset_x * along_x + offset_y * along_y) / length2, 0.0, 1.0)
    gap_x = offset_x - t * along_x
    gap_y = offset_y - t * along_y
    return np.sqrt((gap_x * gap_x + gap_y * gap_y).min(-1))


@hookimpl
def register_datasets(register):
    register(
        SyntheticDataset,
        name="synthetic",
        description="Procedural stroke-drawn glyphs: 16×16 grayscale, 120/40/40 classes × 30 images; no download.",
        paper="built in",
        allowed={"colour": one_of(*COLOURS)},
        check_early=True,  # cheap to construct (images are drawn on load): bad sizes fail in the CLI
        # The dataset's own recipe, sized for 2 CPU cores: full ResNet-12 runs
        # ~55 images/s at 16×16, so 5 epochs of 3,600 images (140 steps) take
        # about 6 minutes with validation. The learning rate is the NCA paper's
        # 0.1 at batch 512 scaled linearly to batch 128 (0.1 itself diverges
        # in the first epoch here). No crop or flip: every image is already a
        # jittered drawing, and a mirrored glyph is another glyph. Measured
        # with NCA, seed 0: test 5-way 1-shot 66.3 ± 0.5%, 5-shot 82.2 ± 0.3% (62% untrained).
        defaults={
            "train": {"epochs": 5, "batch_size": 128, "lr": 0.025, "milestones": [0.7],
                      "crop_padding": 0, "flip": False},
            "eval": {"test_episodes": 2000, "val_episodes": 300, "center_images": 1024},
        },
    )
    register(
        MiniImageNetStandIn,
        name="synthetic-mini",
        description="The glyphs at miniImageNet's size, for timing the papers' recipes without a download: "
                    "84×84 RGB (a colour per image, which says nothing of the class), 64/16/20 classes × 600 "
                    "images.",
        paper="built in; sized as miniImageNet (Vinyals et al. 2016; Ravi & Larochelle 2017 splits)",
        allowed={"colour": one_of(*COLOURS)},
        check_early=True,
        # miniImageNet's own defaults (plugins/datasets/miniimagenet.py), so a recipe runs here as it would there
        defaults={"train": {"crop_padding": 8, "flip": True}},
    )


class MiniImageNetStandIn(SyntheticDataset):
    """:class:`SyntheticDataset` with miniImageNet's shape: 100 classes split
    64/16/20, 600 images each, 84×84 with three channels. Drawing its 60,000
    images takes about 1.6 s a class on one core of a 2-core CPU, a class per core: 80 s.

    Each image has a colour of its own: with one colour per class, a ResNet-12
    scored 100.00% on both test shapes after 3 epochs as after 120 (on an H100,
    2026-11-25), which made the stand-in useless for comparing accuracies."""

    def __init__(self, *, seed: int = 0, classes: int = 100, images_per_class: int = 600,
                 image_size: int = 84, val_classes: int = 16, test_classes: int = 20, channels: int = 3,
                 colour: str = "image"):
        super().__init__(seed=seed, classes=classes, images_per_class=images_per_class, image_size=image_size,
                         val_classes=val_classes, test_classes=test_classes, channels=channels, colour=colour)
