"""Configuration keys written with dots (``train.lr``), as ``--set``, study
files, comparisons and trackers name them."""

from __future__ import annotations


def dotted(table: dict, prefix: str = "") -> dict:
    """A nested table as dotted keys: ``{"train": {"lr": 0.1}, "eval.ways": 5}``
    -> ``{"train.lr": 0.1, "eval.ways": 5}``; lists and other values stay as they are."""
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
