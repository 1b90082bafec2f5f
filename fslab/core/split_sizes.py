"""What a run's evaluation episodes need from the dataset's splits, checked
against the sizes the dataset tells (``split_sizes()``, no image decoded).

An episode of w ways, n shots and q queries needs w classes with at least
n + q images each; validation draws ``eval.val_shots`` shots after every epoch,
the test ``eval.shots`` at the end, at ``eval.ways`` and each of
``eval.extra_ways`` (on the validation split too, with ``eval.final_val``).
Checked here, a shape a split cannot give is one line before the run exists
instead of a failure after hours of training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fslab.core.assignments import shown
from fslab.core.config import tested_ways
from fslab.core.errors import ConfigError, PluginError, plugin_call
from fslab.core.types import SplitSizes

SPLITS = ("train", "val", "test")


def read_split_sizes(dataset: Any, name: str) -> dict[str, SplitSizes] | None:
    """``dataset.split_sizes()`` as :class:`SplitSizes` by split, or None when
    the dataset cannot tell them; a malformed answer is the plugin's error."""
    method = getattr(dataset, "split_sizes", None)
    if not callable(method):
        return None
    # a file the system refused goes on as it is, as what the dataset refuses does
    told = plugin_call(method, f"dataset '{name}': split_sizes() failed", passes=(OSError,))
    if not isinstance(told, Mapping) or any(split not in SPLITS for split in told):
        raise PluginError(f"dataset '{name}': split_sizes() must map train, val and/or test to lists of "
                          f"image counts per class, got {shown(told, 200)}")
    sizes = {}
    for split, counts in told.items():
        counts = list(counts)
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts):
            raise PluginError(f"dataset '{name}': split_sizes()['{split}'] must list whole numbers of images, "
                              f"one per class, got {shown(counts, 200)}")
        sizes[split] = SplitSizes(tuple(counts))
    return sizes


def describe(size: SplitSizes) -> str:
    """``40 classes of 30 images`` or ``6 classes of 2 to 40 images``."""
    largest = max(size.images_per_class, default=0)
    images = f"{size.smallest}" if size.smallest == largest else f"{size.smallest} to {largest}"
    return f"{size.classes} class{'' if size.classes == 1 else 'es'} of {images} image{'' if images == '1' else 's'}"


def check_training(config: dict, sizes: Mapping[str, SplitSizes]) -> None:
    """A ConfigError when the training split holds fewer than 2 classes: every loss learns by telling
    classes apart, and with one class it is 0 at every step, so the run would train nothing."""
    size = sizes.get("train")
    if size is not None and size.classes < 2:
        raise ConfigError(f"{config['dataset']['name']}'s train split ({describe(size)}) cannot train a network: "
                          f"a loss learns by telling classes apart, so the split needs 2 classes at least")


def check_evaluation(config: dict, sizes: Mapping[str, SplitSizes],
                     fixed_shape: tuple[int, int] | None = None) -> None:
    """A ConfigError when the validation or test split cannot give the
    configuration's episodes. ``fixed_shape``: the evaluator's own
    ``(shots, queries)``, which replaces the configured ones."""
    ecfg = config["eval"]
    checked = [("val", "eval.val_shots", [ecfg["val_shots"]], ecfg["ways"])]
    for ways in tested_ways(ecfg["ways"], ecfg.get("extra_ways", ())):
        checked.append(("test", "eval.shots", ecfg["shots"], ways))
        if ecfg.get("final_val"):  # the validation split is also tested as the test split is
            checked.append(("val", "eval.shots", ecfg["shots"], ways))
    for split, shots_key, shots, ways in checked:
        if split not in sizes:
            continue
        size = sizes[split]
        where = f"{config['dataset']['name']}'s {split} split ({describe(size)})"
        ways_key = "eval.ways" if ways == ecfg["ways"] else "eval.extra_ways"
        if ways > size.classes:
            # A dataset that draws its classes (the built-in ones) can give the split more of them.
            more = (f"; --set dataset.{split}_classes={ways} gives the split that many"
                    if f"{split}_classes" in config["dataset"] else "")
            if size.classes < 2:  # no eval.ways fits: an episode has 2 classes at least
                raise ConfigError(f"{where} cannot give an episode: one needs 2 classes at least (eval.ways is at "
                                  f"least 2), so the split needs more classes{more}")
            raise ConfigError(f"config key '{ways_key}' must be at most {size.classes} for {where}, got {ways}{more}")
        for n in shots:
            shape = fixed_shape or (n, ecfg["queries"])
            _check_shape(config, split, shape, (ways_key, ways), shots_key, where, size,
                         fixed=fixed_shape is not None)


def _check_shape(config: dict, split: str, shape: tuple[int, int], ways_set: tuple[str, int], shots_key: str,
                 where: str, size: SplitSizes, *, fixed: bool) -> None:
    ways_key, ways = ways_set
    shots, queries = shape
    need = shots + queries
    room = size.images_in(ways)  # the most images per class that `ways` classes all have
    if need <= room:
        return
    episodes = (f"{ways}-way {split} episodes of {shots} + {queries} images per class (shots + queries) need "
                f"{ways} classes of {need} images ({ways_key}: {ways}), but {where} has {size.classes_with(need)}")
    if fixed:
        raise ConfigError(f"evaluator '{config['evaluator']['name']}' draws its own episode shape: {episodes}; "
                          f"use a smaller {ways_key}, other evaluator parameters, or another evaluator")
    key, value = ("eval.queries", queries) if queries >= room else (shots_key, shots)
    raise ConfigError(f"config key '{key}' is too large here, got {value}: {episodes}; "
                      f"shots + eval.queries must be at most {room}")
