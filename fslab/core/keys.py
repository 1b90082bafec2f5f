"""Configuration keys written with dots (``train.lr``), as ``--set``, study
files, comparisons and trackers name them."""

from __future__ import annotations

import datetime
import re

# The sections of a configuration that name a plugin and hold its parameters.
PLUGIN_SECTIONS = ("dataset", "backbone", "loss", "sampler", "evaluator")
SECTION_KEYS = {"dataset": ("name", "root")}  # the keys a section holds besides its plugin's parameters
# Where a run's events are also sent: {sink name: its parameters} (fslab.core.sinks).
# It never changes what a run computes, so comparisons and studies do not tell runs apart by it.
SINKS = "sinks"


def dotted(table: dict, prefix: str = "") -> dict:
    """A nested table as dotted keys: ``{"train": {"lr": 0.1}, "eval.ways": 5}``
    -> ``{"train.lr": 0.1, "eval.ways": 5}``; lists and other values stay as they are."""
    return dict(_leaves(table, prefix))


TWICE = "is given twice (once dotted, once in a nested table); keep one"


def grid_leaves(grid: dict[str, list]) -> list[str]:
    """The dotted keys a grid ({dotted key: values}) sets: its keys, and for a key whose values are
    tables (``loss = [{name = "nca"}, {name = "supcon", temperature = 0.5}]``) the keys inside them."""
    leaves: dict = {}
    for key, values in grid.items():
        for value in values if isinstance(values, list) else []:
            leaves.update(dict.fromkeys(dotted(value, f"{key}.") if isinstance(value, dict) else [key]))
    return list(leaves)


def names_key(message: str, key: str) -> bool:
    """Whether an error ``message`` is about the dotted ``key``: names it whole (not ``train.lr`` in
    ``train.lr_decay``), before its suggestions ("Did you mean 'device'? Allowed: method, seed, device,
    ..." names keys the message is not about). What a refusal of a merged configuration is read by, to
    say which layer gave the key: ``[run]`` of fslab.toml, a study file's key, a sweep's grid point."""
    subject = re.split(r" Did you mean | Allowed: ", message, maxsplit=1)[0]
    return re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", subject) is not None


def repeated_key(table: dict) -> str | None:
    """A dotted key that a table a person wrote (a sweep or study file) gives twice,
    dotted and nested (``"train.lr" = [0.3]`` beside ``[grid.train] lr = ...``), of
    which :func:`dotted` would silently keep one; None if there is none."""
    keys = [key for key, _ in _leaves(table, "")]
    return next((key for i, key in enumerate(keys) if key in keys[:i]), None)


def repeated_value(values: list):
    """The first value a grid a person wrote lists twice (it would train the same
    runs twice), as a one-item tuple, or None if each value is there once. ``true``
    is not 1, though Python finds them equal; 1 and 1.0 are one value."""
    seen = []
    for value in values:
        same = (isinstance(value, bool), value)
        if same in seen:
            return (value,)
        seen.append(same)
    return None


def dated(table: dict) -> str | None:
    """Why a table a person wrote in TOML (a sweep or study file's grid or set, ``[run]`` of
    fslab.toml) cannot be a configuration: a value, or an item of a list, that TOML reads as a date
    or a time (``root = 2026-01-01``), which no setting takes and no run's ``config.json`` can hold;
    None if there is none."""
    for key, value in _leaves(table, ""):
        for item in _items(value):
            if isinstance(item, datetime.date | datetime.time):  # a datetime is a date
                text = item.isoformat()
                return (f"{key} = {text} is a TOML date or time, which no setting takes; "
                        f"quote it to give the text: \"{text}\"")
    return None


def _items(value):
    if isinstance(value, list):
        for item in value:
            yield from _items(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _items(item)
    else:
        yield value


def _leaves(table: dict, prefix: str):
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
