"""A saved configuration read by a newer fslab: :func:`migrate` fills each key
added since the version it was saved with, with the value its run actually used.

``config_version`` in ``config.json`` names the layout of the keys; bump
:data:`CONFIG_VERSION` and add a step to :data:`MIGRATIONS` whenever a key is
added, renamed or changes meaning.
"""

from __future__ import annotations

import copy
from typing import Any

from fslab.core.errors import ConfigError, NewerConfig
from fslab.core.keys import PLUGIN_SECTIONS, SINKS

CONFIG_VERSION = 5  # the layout of the keys fslab saves today


# Keys a configuration saved before config_version existed (version 0: fslab 0.1
# and its development versions) may lack, each with what such a run trained
# with: the code's behaviour before the key existed, which is not always what
# today's default would be. heartbeat and the evaluator section were there from
# the first version, but readers took them as optional.
ADDED_BEFORE_VERSION_1: dict[str, Any] = {
    "evaluator": {"name": "centroid"},  # the nearest-centroid classifier
    "train": {
        "optimizer": "sgd",  # the only optimiser before train.optimizer
        "projection_dim": 0,  # no projection head
        "heartbeat": 5.0,  # the worker's interval when the key was missing
        "processes": 1,  # training in one process, before --gpus
    },
    "eval": {
        "before_training": False,  # no evaluation of the untrained network
        "feature_stages": 1,  # the backbone's output
    },
}


# Keys added in version 2, each with what a version-1 run computed with: fp32
# without autocast, the default memory format, no compilation, PyTorch's
# default of no TF32 for matrix products, and no deterministic algorithms.
ADDED_IN_VERSION_2: dict[str, Any] = {
    "train": {"precision": "fp32", "channels_last": "off", "compile": "off", "tf32": False, "deterministic": False},
    "eval": {"precision": "fp32"},
}

# Version 3 added the sinks; a run saved before had none.
ADDED_IN_VERSION_3: dict[str, Any] = {SINKS: {}}

# Version 4 added eval.val_every; a run saved before validated after every epoch.
ADDED_IN_VERSION_4: dict[str, Any] = {"eval": {"val_every": 1}}

# Version 5 added eval.final_val and eval.extra_ways; a run saved before tested the final network
# on the test split only, at eval.ways only.
ADDED_IN_VERSION_5: dict[str, Any] = {"eval": {"final_val": False, "extra_ways": []}}

MIGRATIONS = {0: ADDED_BEFORE_VERSION_1, 1: ADDED_IN_VERSION_2, 2: ADDED_IN_VERSION_3,
              3: ADDED_IN_VERSION_4, 4: ADDED_IN_VERSION_5}  # version -> what came next


def migrate(config: dict) -> dict:
    """``config`` as the current version would have saved it (``config_version``
    == :data:`CONFIG_VERSION`). Every key added since the version it was saved
    with is filled with the value its run actually used. A current configuration
    is returned as it is; an older one as a migrated copy (``config`` is never
    modified). A configuration from a newer fslab is a ConfigError."""
    version = config.get("config_version", 0)  # version 0 predates the key
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ConfigError(f"config_version must be a whole number >= 0, got {version!r}")
    if version > CONFIG_VERSION:
        raise NewerConfig(f"configuration version {version} was written by a newer fslab "
                          f"(this one reads versions up to {CONFIG_VERSION}); upgrade fslab")
    if version == CONFIG_VERSION:
        return config
    migrated = config
    for step in range(version, CONFIG_VERSION):  # 0 -> 1 -> 2 ...
        migrated = _with_missing(migrated, MIGRATIONS[step])
    migrated = dict(migrated)
    migrated["config_version"] = CONFIG_VERSION
    return migrated


def _with_missing(config: dict, added: dict) -> dict:
    """A copy of ``config`` with the keys of ``added`` it lacks. Only the
    dicts on the way to a filled key are copied (listing 10,000 runs written by
    fslab 0.1 migrates 10,000 configurations), the rest is shared."""
    out = dict(config)
    for key, value in added.items():
        if key not in out:
            out[key] = copy.deepcopy(value)
        elif key not in PLUGIN_SECTIONS and key != SINKS and isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _with_missing(out[key], value)
    return out
