"""The run configuration: defaults, layering and validation (``--set`` text: fslab.core.assignments;
a value's type: fslab.core.values; a plugin's parameters: fslab.core.plugin_params).

A run's configuration is a nested dict. Layers, lowest first:

1. ``DEFAULTS`` below (the NCA paper's training recipe, Sec. 4.1 and App. A);
2. the dataset's own defaults (epochs, batch size, learning rate it is meant for);
3. the method recipe (``fslab run METHOD``), then what it states for the
   run's dataset (its ``per_dataset`` entry, e.g. the mAP paper's batch
   composition differs between Omniglot and miniImageNet);
4. ``[run]`` in ``fslab.toml``;
5. command-line options and ``--set key=value``.

A recipe sits above the dataset because what it states is part of the method:
``protonet-best`` *is* 5-shot episodes of 512 images, the mAP recipes train with
Adam at lr 0.001. The dataset's defaults still size everything a recipe leaves
unsaid (``fslab run nca`` states no training keys, so it trains with the
dataset's epochs, batch size and learning rate).

Plugin sections (``dataset``, ``backbone``, ``loss``, ``sampler``, ``evaluator``)
hold ``name`` plus that plugin's parameters. A layer that changes a section's
``name`` drops the parameters lower layers gave the previous plugin.

The resolved configuration is a plain nested dict, saved as ``config.json`` with
its ``config_version``. :func:`fslab.core.migrations.migrate` brings a configuration
saved by an older fslab to the current version, and :func:`run_config` gives the typed,
read-only view (:class:`RunConfig`) the training code reads.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import typing
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fslab.core.assignments import layer_of, shown, toml_value
from fslab.core.commands import like_command
from fslab.core.errors import ConfigError, UnknownName, UsageError, did_you_mean, plugin_call
from fslab.core.keys import PLUGIN_SECTIONS, SECTION_KEYS, SINKS, dated, dotted, names_key
from fslab.core.limits import (
    RULE,
    SEED,
    Allowed,
    at_least,
    between,
    check_fields,
    check_rule,
    listing,
    matching,
    one_of,
    positive,
)
from fslab.core.migrations import CONFIG_VERSION, migrate
from fslab.core.plugin_params import check_plugins, plugin_params, run_check, sink_params
from fslab.core.settings import Settings
from fslab.core.types import CheckContext
from fslab.core.values import check_value


def outside_settings(key: str) -> bool:
    """Whether a dotted key is bookkeeping of where a run reports, not a setting of what it computes."""
    return key == SINKS or key.startswith(SINKS + ".")


PER_DATASET = "per_dataset"  # a recipe's layers for runs on one dataset: {"omniglot": {...}, ...}


OPTIMIZERS = ("sgd", "adam")  # train.optimizer; fslab.training.build makes them
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # train.precision, eval.precision
COMPILE_MODES = ("off", "default", "max-autotune")  # train.compile: torch.compile's mode, or none


# Each field's metadata says which values it allows (fslab.core.limits), checked by resolve().
# A count of episodes: 100 times the papers' 10,000 at most, whose episodes' indices alone take about 600 MB
# (a mistyped 10**11 would exhaust the memory as the episodes are drawn).
EPISODES_MAX = 1_000_000
# One episode has no spread: its 95% CI would print as ±0.00, which is no interval at all.
EPISODES_MIN = 2
EPISODES = between(EPISODES_MIN, EPISODES_MAX, f"a whole number from {EPISODES_MIN} to {EPISODES_MAX:,} (a 95% CI "
                   f"needs two episodes at least)")
# A rate or a decay is a Python float until the optimiser applies it to float32 parameters: above
# float32's largest number (about 3.4e38) it cannot be converted, and the worker failed at its first step.
FLOAT32_MAX = 3.4028234663852886e38
RATE = {RULE: Allowed("> 0 and at most 3.4e38 (float32's largest)", low=0, low_open=True, high=FLOAT32_MAX)}
DECAY = between(0, FLOAT32_MAX, "from 0 to 3.4e38 (float32's largest)")


@dataclass(frozen=True)
class TrainConfig:
    """The ``train`` section: optimisation, schedule, augmentation, logging."""

    epochs: int = field(default=120, metadata=between(1, 1_000_000, "a whole number from 1 to 1,000,000"))
    batch_size: int = field(default=512, metadata=at_least(2))
    # sgd (with momentum and nesterov below) or adam (default betas)
    optimizer: str = field(default="sgd", metadata=one_of(*OPTIMIZERS))
    lr: float = field(default=0.1, metadata=RATE)
    momentum: float = field(default=0.9, metadata=between(0, 1))
    nesterov: bool = True
    weight_decay: float = field(default=5e-4, metadata=DECAY)
    # fractions of training after which lr is multiplied by gamma
    milestones: tuple[float, ...] = field(default=(0.7,), metadata=listing(between(0, 1), distinct=True))
    gamma: float = field(default=0.1, metadata=positive())
    # random crop after padding by this many pixels (0 = off); the padded batch is held at once, so a
    # mistyped 10**6 would exhaust the memory (the papers pad 84-pixel images by 4 to 8)
    crop_padding: int = field(default=4, metadata=between(0, 256, "a whole number from 0 to 256"))
    flip: bool = True  # random horizontal flip
    # >0: a linear head of this size used only in training (NCA paper App. A.4); a head wider than
    # 100,000 features (64 million weights after a ResNet-12) is a typo, not a setting
    projection_dim: int = field(default=0, metadata=between(0, 100_000, "a whole number from 0 to 100,000"))
    log_every: int = field(default=10, metadata=at_least(1))  # training steps between two logged events
    heartbeat: float = field(default=5.0, metadata=positive())  # seconds between two status.json heartbeats
    # >1: data-parallel over this many GPUs (--gpus N), or gloo CPU processes with device cpu
    processes: int = field(default=1, metadata=at_least(1))
    # How the step computes (fslab.training.numerics): autocast precision (auto: bf16 on a CUDA GPU
    # that has it, else fp16 there; fp32 on the CPU), channels-last memory format (auto: on for
    # CUDA), torch.compile of the training forward, TF32 for fp32 matrix products on CUDA, and
    # deterministic algorithms (slower on CUDA; cudnn autotuning is on when this is off).
    precision: str = field(default="auto", metadata=one_of(*PRECISIONS))
    channels_last: str = field(default="auto", metadata=one_of("auto", "on", "off"))
    compile: str = field(default="off", metadata=one_of(*COMPILE_MODES))
    tf32: bool = True
    deterministic: bool = False


@dataclass(frozen=True)
class EvalConfig:
    """The ``eval`` section: the few-shot protocol (NCA paper Sec. 3.4 and 4.1) and feature extraction."""

    ways: int = field(default=5, metadata=at_least(2))
    shots: tuple[int, ...] = field(default=(1, 5), metadata=listing(at_least(1), nonempty=True, distinct=True))
    queries: int = field(default=15, metadata=at_least(1))
    val_shots: int = field(default=5, metadata=at_least(1))
    val_episodes: int = field(default=500, metadata=EPISODES)  # per validation, on the validation classes
    val_every: int = field(default=1, metadata=at_least(1))  # epochs between validations; the last is always validated
    before_training: bool = False  # also evaluate the untrained network (logged as epoch 0)
    test_episodes: int = field(default=10000, metadata=EPISODES)
    # also score the final network on the validation classes as it is tested (eval.shots,
    # eval.test_episodes, per-episode scores kept): the NCA paper's Fig. 2 and 4 report these
    final_val: bool = False
    # also test the final network on episodes of these numbers of classes (one model tested
    # 5- and 20-way, as the mAP and large-margin papers report); validation stays eval.ways
    extra_ways: tuple[int, ...] = field(default=(), metadata=listing(at_least(2)))
    seed: int = field(default=0, metadata=SEED)  # fixed, so every run is evaluated on the same episodes
    center: bool = True  # subtract the mean training feature (SimpleShot)
    normalize: bool = True  # then L2-normalise
    center_images: int = field(default=4096, metadata=at_least(0))  # training images used for that mean; 0 = all
    batch_size: int = field(default=256, metadata=at_least(1))  # images per forward pass when extracting features
    # >1: concatenate the pooled outputs of the backbone's last k stages (NCA paper App. A.1)
    feature_stages: int = field(default=1, metadata=at_least(1))
    # autocast precision of feature extraction (auto: train.precision's); features are then
    # centred and normalised in float32
    precision: str = field(default="auto", metadata=one_of(*PRECISIONS))


@dataclass(frozen=True)
class RunConfig:
    """A run's whole configuration, typed: what the training code reads.

    The plugin sections stay plain dicts (``name`` plus the plugin's parameters):
    their schema is the plugin's signature, checked by :func:`resolve`. Lists
    of the saved form are tuples here, so the view is immutable.
    """

    method: str = ""
    seed: int = field(default=0, metadata=SEED)
    device: str = field(default="auto", metadata=matching(r"auto|cpu|cuda(:[0-9]+)?",
                                                                   "auto, cpu, cuda (a GPU) or cuda:N"))
    dataset: dict = field(default_factory=lambda: {"name": "synthetic", "root": ""})
    backbone: dict = field(default_factory=lambda: {"name": "resnet12"})
    loss: dict = field(default_factory=lambda: {"name": "nca"})
    sampler: dict = field(default_factory=lambda: {"name": "iid"})
    evaluator: dict = field(default_factory=lambda: {"name": "centroid"})
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sinks: dict = field(default_factory=dict)  # {sink name: parameters}: where the events are also sent
    config_version: int = CONFIG_VERSION

    def as_dict(self) -> dict:
        """The saved form (``config.json``): nested dicts, lists for tuples."""
        return _saved_form(dataclasses.asdict(self))


def tested_ways(ways: int, extra_ways) -> list[int]:
    """The numbers of classes a run's final network is tested at: ``eval.ways``
    first, then each of ``eval.extra_ways`` not already there."""
    return list(dict.fromkeys([ways, *extra_ways]))


def _saved_form(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _saved_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_saved_form(v) for v in value]
    return value


# Every key a user may set, with its default; derived from the dataclasses, so
# a field added there is a valid, type-checked ``--set`` key. The version is
# not a setting: resolve() stamps it.
DEFAULTS: dict[str, Any] = {k: v for k, v in RunConfig().as_dict().items() if k != "config_version"}


def _list_items() -> dict[str, list]:
    """Each list key with a one-item list of its item type (``eval.extra_ways``:
    ``[0]``), so values given for a key whose default is empty are typed too."""
    out = {}
    for prefix, section in (("train.", TrainConfig), ("eval.", EvalConfig)):
        for name, hint in typing.get_type_hints(section).items():
            if typing.get_origin(hint) is tuple:
                out[prefix + name] = [typing.get_args(hint)[0]()]
    return out


LIST_ITEMS = _list_items()

def merge(base: dict, layer: dict) -> dict:
    """Deep-merge ``layer`` over ``base`` (neither is modified)."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        current = out.get(key)
        if key == SINKS and not value:  # sinks = [] (or {}): none, whatever a lower layer chose
            out[key] = {}
        elif key in PLUGIN_SECTIONS and isinstance(value, dict) and isinstance(current, dict):
            if "name" in value and value["name"] != current.get("name"):
                keep = SECTION_KEYS.get(key, ("name",))
                current = {k: v for k, v in current.items() if k in keep}
            out[key] = {**current, **copy.deepcopy(value)}
        elif isinstance(value, dict) and isinstance(current, dict):
            out[key] = merge(current, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def type_error(table: dict, grid: bool = False) -> tuple[str, str] | None:
    """The first value ``table`` (``{dotted key: value}``; a grid's ``{key: [values]}``) gives one of
    fslab's own keys that is not of the key's type, as ``(key, what is wrong)``: the key as the check
    names it (``eval.shots[1]``), the rest of its line (`` must be an integer, got "x"``). None where all
    are. Sweep and study files are checked so when read, before a scale or a layer can replace a value;
    a plugin's parameters wait for the plugin the configuration names."""
    defaults = dotted(DEFAULTS)
    for key, value in table.items():
        if defaults.get(key) is None:
            continue
        for each in value if grid else [value]:
            try:
                check_value(key, each, defaults[key])
            except ConfigError as exc:
                said = re.match(r"config key '([^']*)'", str(exc))
                return (said[1], str(exc)[said.end():]) if said else (key, f": {exc}")
    return None


def point_layer(below: Iterable[dict], point: dict) -> dict:
    """A grid point ({dotted key: value}) as one configuration layer over the layers ``below`` it (a
    sweep's options and settings), so that its runs train as the same values given with those
    settings would: a plugin's name and parameters in the grid make one section in any order, and a
    plugin the point chooses keeps the parameters ``below`` gives its section (``--set
    loss.temperature=0.5`` with a grid of ``loss.name`` trains every loss at 0.5, as ``fslab run``
    with both ``--set``s does); what a recipe, a dataset or fslab.toml gave the plugin it replaces
    is dropped, as by any layer that changes a plugin."""
    layer = layer_of((key.split("."), copy.deepcopy(value)) for key, value in point.items())
    given: dict = {}
    for lower in below:
        given = merge(given, lower)
    for section in PLUGIN_SECTIONS:
        chosen, lower = layer.get(section), given.get(section)
        if isinstance(chosen, dict) and "name" in chosen and isinstance(lower, dict) and "name" not in lower:
            layer[section] = {**lower, **chosen}
    return layer


def resolve(
    method: str,
    *,
    registry,
    settings: Settings,
    overrides: Iterable[dict] = (),
) -> dict:
    """The full configuration of a run of ``method``, validated."""
    recipe = registry.create("method", method)
    per_dataset = recipe.pop(PER_DATASET, {})
    _check_shape(recipe, f"method '{method}': ")  # a recipe's {"loss": "nca"} was an AttributeError at the merge
    _check_recipe_components(method, recipe, registry)
    overrides = list(overrides)
    toml_layer = settings.run
    # the file's [run] is named; the other layers (--set, --like's saved run, a grid point, a study's
    # settings) are the command's own, and what the command gave needs no prefix
    for layer, source in [(toml_layer, f"{settings.path}: [run]: "), *((layer, "") for layer in overrides)]:
        if (why := dated(layer)) is not None:  # a TOML file's date: config.json could not hold it
            raise ConfigError(f"{source}{why}")
    _check_shape(toml_layer, f"{settings.path}: [run]: ")
    for layer in overrides:
        _check_shape(layer, "")
    for layer, source in [(toml_layer, f"{settings.path}: [run]: "), *((layer, "") for layer in overrides)]:
        if "method" in layer:
            raise ConfigError(f"{source}'method' is not a setting; name the method as the command's "
                              f"argument instead (fslab run {layer['method']})")

    # The dataset must be known before its defaults can be layered in.
    dataset_name = DEFAULTS["dataset"]["name"]
    for layer in [recipe, toml_layer, *overrides]:
        dataset_name = layer.get("dataset", {}).get("name", dataset_name)
    toml_dataset = toml_layer.get("dataset", {})
    if "root" in toml_dataset and toml_dataset.get("name", dataset_name) != dataset_name:
        # [run] gives that root with the dataset it names; an option that chose another leaves it behind
        toml_layer = {**toml_layer, "dataset": {k: v for k, v in toml_dataset.items() if k != "root"}}
    with naming_the_file(settings, overrides):  # an unknown dataset set in [run] names the file
        dataset_defaults = registry.get("dataset", dataset_name).info.get("defaults", {})
    for_dataset = recipe_for_dataset(method, per_dataset, dataset_name)
    _check_recipe_components(method, for_dataset, registry, f"method '{method}', per_dataset.{dataset_name}")

    config = copy.deepcopy(DEFAULTS)
    for layer in [dataset_defaults, recipe, for_dataset, toml_layer, *overrides]:  # lowest first (module docstring)
        config = merge(config, layer)
    config["method"] = method
    if not config["dataset"].get("root") and registry.reads_files(dataset_name):  # synthetic reads no files
        config["dataset"]["root"] = filled_root(settings, dataset_name)
        _check_data_root_key(settings, dataset_name, config["dataset"]["root"], registry.names("dataset"))
    for key in ("root", "cache_dir"):  # absolute: a worker or a resume may start elsewhere
        if isinstance(config["dataset"].get(key), str) and config["dataset"][key]:
            config["dataset"][key] = os.path.abspath(os.path.expanduser(config["dataset"][key]))
    with naming_the_file(settings, overrides):
        _check_types(config, DEFAULTS, "")
        if not registry.reads_files(dataset_name):  # synthetic: a root given it is refused or dropped
            _refuse_unread_root(dataset_name, [toml_layer, *overrides], registry)
            config["dataset"]["root"] = ""
        _check_ranges(config)
        _fill_plugin_params(config, registry)
        _fill_sink_params(config, registry)
        _check_compatible(config, registry)
        check_plugins(config, registry)
        _batch_of_sampler(config, registry, {key for layer in overrides for key in dotted(layer)})
    config["config_version"] = CONFIG_VERSION
    return config


def filled_root(settings: Settings, dataset: str) -> str:
    """The root fslab fills in for a run of ``dataset`` that sets none: ``[data_roots]`` of fslab.toml,
    else ``data/<dataset>`` (as given: a run's configuration saves it absolute)."""
    return settings.data_roots.get(dataset, f"data/{dataset}")


NOT_HERE = "(not on this machine)"  # the mark beside a run's data root that root_not_here() finds


def root_not_here(dataset: Any, registry) -> str | None:
    """The data root of a run's ``dataset`` section where it is no folder on this machine (the data moved, or
    the store was copied from a machine whose data lies elsewhere), for a dataset that reads files
    (:meth:`fslab.core.registry.Registry.reads_files`); else None. fslab show marks it :data:`NOT_HERE`
    (``data_root_gone`` in its --json), as the dashboard's config tab does."""
    if not isinstance(dataset, dict) or not isinstance(dataset.get("name"), str):
        return None
    root = dataset.get("root")
    if not isinstance(root, str) or not root or not registry.reads_files(dataset["name"]) or os.path.isdir(root):
        return None
    return root


def filled_root_source(settings: Settings, dataset: str) -> str:
    """Where :func:`filled_root` takes the root of ``dataset`` from, as lines name it."""
    return "[data_roots] of fslab.toml" if dataset in settings.data_roots else f"fslab's default, data/{dataset}"


def _refuse_unread_root(dataset: str, layers: list[dict], registry) -> None:
    """A data root given for ``dataset``, which reads no files, after the last layer that chose the dataset
    (``fslab run nca --data-root DIR`` with --dataset forgotten: DIR would go unused while the run trains on
    generated images) is refused. One given with the dataset's choice or below it is not for it and is
    dropped: --like's saved configuration of a run an earlier fslab saved with a filled-in root, or a
    sweep's --data-root under a grid whose point chose ``synthetic``."""
    root, given_at, chosen_at = None, -1, -1
    for at, layer in enumerate(layers):
        section = layer.get("dataset")
        if not isinstance(section, dict):
            continue
        if section.get("root"):
            root, given_at = section["root"], at
        if "name" in section:
            chosen_at = at
    if given_at > chosen_at:
        reading = [name for name in registry.names("dataset") if registry.reads_files(name)]
        raise ConfigError(f"dataset.root {root}: dataset '{dataset}' is generated and reads no files, so nothing in "
                          f"that folder would be used; name the dataset stored there with --dataset (one of: "
                          f"{', '.join(reading)})")


def _check_data_root_key(settings: Settings, dataset: str, root: str, datasets: list[str]) -> None:
    """A ConfigError for a dataset whose root fslab.toml seems to give under a
    misspelt name ([data_roots] minimagenet = ...), when the default root it
    falls back to is not there either (``datasets``: the registered names)."""
    if dataset in settings.data_roots or os.path.isdir(root):
        return
    strays = [name for name in settings.data_roots if name not in datasets]
    close = difflib.get_close_matches(dataset, strays, n=1, cutoff=0.6)
    if close:
        raise ConfigError(f"{settings.path}: [data_roots] has no root for dataset '{dataset}', but one for "
                          f"'{close[0]}', which is no dataset's name: rename it to {dataset} (or give --data-root)")


def sampler_rows(registry, sampler: dict, batch_size: int) -> int:
    """The rows a batch of ``sampler`` (a run's sampler section) holds, asked for ``batch_size``: those
    its own parameters fix (``register(..., batch=f)``: an episode's ways × (shots + queries)), else
    ``batch_size``."""
    component = registry.get("sampler", sampler["name"])
    batch = component.info.get("batch")
    if batch is None:
        return batch_size
    params = {k: v for k, v in sampler.items() if k != "name"}
    return plugin_call(lambda: batch(params, batch_size), f"the batch= function of {component.named} failed")


def _batch_of_sampler(config: dict, registry, given: set[str]) -> None:
    """``train.batch_size`` made the rows a batch holds where the sampler's own
    parameters fix them (``register(..., batch=f)``: an episode's ways × (shots +
    queries)), so the saved configuration says what trained. A batch size given
    for this run (``given``: the dotted keys of the options) that the sampler
    would ignore is refused; fslab.toml's [run] holds defaults for every method,
    so a batch size from there is replaced."""
    batch_size = config["train"]["batch_size"]
    rows = sampler_rows(registry, config["sampler"], batch_size)
    if rows == batch_size:
        return
    if "train.batch_size" in given:
        name, shape = config["sampler"]["name"], ", ".join(f"{k}={v}" for k, v in config["sampler"].items()
                                                           if k != "name")
        raise ConfigError(f"config key 'train.batch_size' is {batch_size}, but sampler '{name}' draws "
                          f"batches of {rows} rows from its own parameters ({shape}); change those instead, "
                          f"or leave train.batch_size out")
    config["train"]["batch_size"] = rows


def recipe_for_dataset(method: str, per_dataset: Any, dataset: str) -> dict:
    """The layer a recipe states for runs on ``dataset`` (its ``per_dataset``
    entry, or nothing), checked like any layer; it cannot change the dataset."""
    if not isinstance(per_dataset, dict) or not all(isinstance(v, dict) for v in per_dataset.values()):
        raise ConfigError(f"method '{method}': per_dataset must map dataset names to configuration layers, "
                          f"got {shown(per_dataset, 200)}")
    layer = per_dataset.get(dataset, {})
    _check_shape(layer, f"method '{method}', per_dataset.{dataset}: ")
    if "name" in layer.get("dataset", {}):
        raise ConfigError(f"method '{method}', per_dataset.{dataset}: a per-dataset layer cannot choose the dataset")
    return layer


@contextmanager
def naming_the_file(settings: Settings, overrides: Iterable[dict] = ()) -> Iterator[None]:
    """A UsageError about a key whose value came from ``[run]`` of fslab.toml
    (and no option replaced it) says so and names the file, so the user knows
    where to fix it: the checks see only the merged configuration."""
    try:
        yield
    except UsageError as exc:
        from_options = {key for layer in overrides for key in dotted(layer)}
        message = str(exc)
        keys = list(dotted(settings.run).items())
        if isinstance(settings.run.get(SINKS), dict):  # {name: {}} once read: an empty table has no dotted key
            keys.append((SINKS, list(settings.run[SINKS])))
        for key, value in keys:
            if key in from_options:
                continue
            # a message about the key by name, or about the plugin a [run] name key chose
            # (loss.name: "Unknown loss 'ncaa'"; sinks: "Unknown sink 'nope'"), which does not name the key
            chosen = (isinstance(exc, UnknownName) and key in (f"{exc.what}.name", f"{exc.what}s")
                      and exc.word in (value if isinstance(value, list) else [value]))
            # [run] sinks = ["tensorboard"] gives names only: what a message says of sinks.mlflow.x is the options'
            names_only = key == SINKS and isinstance(value, list)
            if (not names_only and names_key(message, key)) or chosen:
                exc.args = (f"{message} (set by {key} in [run] of {settings.path})",)
                break
        raise


def run_config(config: dict) -> RunConfig:
    """The typed view of a saved or resolved configuration, after :func:`migrate`.
    Every core key must be there with a value of its type (ints are accepted
    as floats, lists become tuples); a missing or unknown key is a ConfigError."""
    config = migrate(config)
    _check_keys(config, [f.name for f in dataclasses.fields(RunConfig)], "")
    values = {}
    for name, default in DEFAULTS.items():
        if name in PLUGIN_SECTIONS:
            if not isinstance(config[name], dict) or not isinstance(config[name].get("name"), str):
                raise ConfigError(f"config section '{name}' must hold a plugin name, got {shown(config[name])}")
            values[name] = copy.deepcopy(config[name])
        elif name == SINKS:
            values[name] = copy.deepcopy(_sinks_shape(config[name], "config: "))
        elif isinstance(default, dict):
            values[name] = _typed_section(name, config[name])
        else:
            values[name] = _checked(name, config[name], default)
    return RunConfig(**values, config_version=config["config_version"])


def _typed_section(name: str, section: Any) -> TrainConfig | EvalConfig:
    kind = {"train": TrainConfig, "eval": EvalConfig}[name]
    if not isinstance(section, dict):
        raise ConfigError(f"config section '{name}' must be a table of keys, got {shown(section)}")
    _check_keys(section, [f.name for f in dataclasses.fields(kind)], f"{name}.")
    values = {}
    for key, default in DEFAULTS[name].items():
        value = _checked(f"{name}.{key}", section[key], default)
        values[key] = tuple(value) if isinstance(value, list) else value
    return kind(**values)


def _checked(key: str, value: Any, default: Any) -> Any:
    """:func:`check_value`, except that a word key of the run, ``train`` or ``eval`` given another
    type names the words it takes, as for a wrong word (``train.channels_last=true``: auto, on or
    off), not only "a string"."""
    section, _, name = key.rpartition(".")
    kind = {"": RunConfig, "train": TrainConfig, "eval": EvalConfig}.get(section)
    rule = next((f.metadata.get(RULE) for f in dataclasses.fields(kind) if f.name == name), None) if kind else None
    if rule is not None and isinstance(default, str) and not isinstance(value, str):
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as TOML and --set write it
        raise ConfigError(f"config key '{key}' must be {rule.text}, got {shown}")
    return check_value(key, value, default)


def check_option(key: str, value: Any, option: str) -> None:
    """``value`` for ``key`` given by a command's ``option`` (``--gpus`` sets ``train.processes``): a
    ConfigError naming the option, as the command line wrote it, where the key's type or range refuses it."""
    section, _, name = key.rpartition(".")
    kind = {"": RunConfig, "train": TrainConfig, "eval": EvalConfig}[section]
    rule = next((f.metadata.get(RULE) for f in dataclasses.fields(kind) if f.name == name), None)
    try:
        _checked(key, value, dotted(DEFAULTS)[key])
        if rule is not None:
            check_rule(key, value, rule)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f"config key '{key}'", option, 1)) from None


def _check_keys(values: dict, expected: list[str], prefix: str) -> None:
    missing = [k for k in expected if k not in values]
    unknown_keys = [k for k in values if k not in expected]
    if missing:
        raise ConfigError(f"the configuration has no '{prefix}{missing[0]}'" +
                          (f" (nor {', '.join(prefix + k for k in missing[1:])})" if missing[1:] else ""))
    if unknown_keys:
        raise ConfigError(f"unknown config key '{prefix}{unknown_keys[0]}'.{did_you_mean(unknown_keys[0], expected)} "
                          f"Allowed: {', '.join(prefix + k for k in expected)}.")


def _sinks_shape(value: Any, source: str) -> dict:
    """``sinks`` as ``{name: {parameters}}``; a list of names (``[run] sinks =
    ["tensorboard"]`` in fslab.toml) is the same with no parameters."""
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return {name: {} for name in value}
    if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        return value
    raise ConfigError(f"{source}'sinks' must be a list of sink names (sinks = [\"tensorboard\"]) or a table of "
                      f"each sink's parameters ([run.sinks.mlflow]), got {shown(value, 80)}")


def _check_recipe_components(method: str, recipe: dict, registry, where: str = "") -> None:
    """Each component a recipe (or its layer for the run's dataset, named in ``where``) names, and the
    parameters it gives that component, as the recipe's own mistake: ``Unknown loss 'ncaa'`` and
    ``unknown parameter 'loss.temp'`` read as if the user had set them, naming no method. A section
    that names no component (its parameters for the default's) is checked with the rest of the
    configuration."""
    for section in PLUGIN_SECTIONS:
        values = recipe.get(section)
        if not isinstance(values, dict) or "name" not in values:
            continue
        fixed = SECTION_KEYS.get(section, ("name",))
        try:
            registry.get(section, values["name"])
            plugin_params(registry, section, values["name"], {k: v for k, v in values.items() if k not in fixed})
        except UsageError as error:
            raise ConfigError(f"{where or f'method {method!r} (its recipe)'}: {error}") from None


def _check_shape(layer: dict, source: str) -> None:
    """Unknown keys in the core sections, with the closest match; ``source`` begins each message."""
    for key, value in layer.items():
        section, _, sub = key.partition(".")
        if sub and isinstance(DEFAULTS.get(section), dict):  # "train.lr" = 0.5 in fslab.toml's [run]
            raise ConfigError(f"{source}'{key}' is one key with a dot in its name (quoted, in TOML), not {sub} "
                              f"in {section}; write it without the quotes ({key} = ...)")
        if key not in DEFAULTS:
            raise ConfigError(
                f"{source}unknown config key '{key}'.{_meant_elsewhere(key) or did_you_mean(key, DEFAULTS)} "
                f"Allowed: {', '.join(DEFAULTS)}."
            )
        if key == SINKS:
            layer[key] = _sinks_shape(value, source)
            continue
        if isinstance(DEFAULTS[key], dict) and key not in PLUGIN_SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}'{key}' is a section; set its keys, "
                                  f"e.g. {key}.{next(iter(DEFAULTS[key]))}=...")
            for sub in value:
                if sub not in DEFAULTS[key]:
                    raise ConfigError(
                        f"{source}unknown config key '{key}.{sub}'."
                        f"{did_you_mean(sub, DEFAULTS[key]) or _meant_elsewhere(sub, key)} "
                        f"Allowed: {', '.join(f'{key}.{k}' for k in DEFAULTS[key])}."
                    )
        if key in PLUGIN_SECTIONS and not isinstance(value, dict):
            raise ConfigError(f"{source}'{key}' is a section; choose the plugin with {key}.name=...")


def _meant_elsewhere(key: str, section: str | None = None) -> str:
    """`` Did you mean 'train.lr'?`` for a key given in the wrong place: without its section (``lr``, as
    ``--lr`` and a ``--grid`` alias name it; a sweep file's grid takes no alias), or in ``section`` where
    it belongs to another (``eval.lr``) or is a key of its own (``train.seed``: ``seed``); else ''."""
    found = [key] if section and not isinstance(DEFAULTS.get(key, {}), dict) else []
    found += [f"{name}.{key}" for name, keys in DEFAULTS.items()
              if isinstance(keys, dict) and name not in PLUGIN_SECTIONS and name != section and key in keys]
    if not found and "-" in key:  # batch-size, as the option --batch-size spells it
        return _meant_elsewhere(key.replace("-", "_"), section)
    return f" Did you mean {' or '.join(map(repr, found))}?" if found else ""


def _check_types(config: dict, defaults: dict, prefix: str) -> None:
    for key, default in defaults.items():
        if key == SINKS and not prefix:
            continue  # each sink's parameters are checked against the sink (_fill_sink_params)
        if key in PLUGIN_SECTIONS:
            if not isinstance(config[key].get("name"), str) or not config[key]["name"]:
                raise ConfigError(f"config key '{key}.name' must be a plugin name (a string)")
            if key == "dataset" and not isinstance(root := config[key].get("root"), str):  # --set dataset.root=2024
                raise ConfigError(f"config key 'dataset.root' must be a folder's path (text), got {toml_value(root)}; "
                                  f"a name TOML reads as another value is given quoted, or with --data-root")
            for name in ("root", "cache_dir"):  # no file system has a NUL in a name: the run saved it, then failed
                if isinstance(value := config[key].get(name), str) and "\0" in value:
                    raise ConfigError(f"config key 'dataset.{name}' must be a path without NUL characters "
                                      f"(\\u0000), got {toml_value(value, bare=False)}")
            continue
        if isinstance(default, dict):
            _check_types(config[key], default, f"{prefix}{key}.")
        else:
            name = f"{prefix}{key}"
            config[key] = _checked(name, config[key], default or LIST_ITEMS.get(name, default))


def _fill_plugin_params(config: dict, registry) -> None:
    """Each plugin section checked against its plugin (:func:`plugin_params`), with the
    defaults of the parameters not given written in, so the saved config is complete."""
    for section in PLUGIN_SECTIONS:
        values = config[section]
        fixed = SECTION_KEYS.get(section, ("name",))
        given = {key: value for key, value in values.items() if key not in fixed}
        values.update(plugin_params(registry, section, values["name"], given,  # given keys keep their place
                                    choose=choosing_option(section)))


def _fill_sink_params(config: dict, registry) -> None:
    """Each sink a registered one, with its parameters complete (:func:`sink_params`), and its own
    ``check=`` passed (the built-ins': their tracker's package is installed)."""
    for name, values in config[SINKS].items():
        config[SINKS][name] = sink_params(registry, name, values)
        run_check(registry.get("sink", name), copy.deepcopy(config[SINKS][name]),
                  CheckContext(copy.deepcopy(config), None))


def _check_ranges(config: dict) -> None:
    """Every typed key against the rule its field declares (fslab.core.limits),
    then the rules that tie two keys together."""
    check_fields(RunConfig, config)
    check_fields(TrainConfig, config["train"], "train.")
    check_fields(EvalConfig, config["eval"], "eval.")
    train = config["train"]
    if train["optimizer"] == "sgd" and train["nesterov"] and train["momentum"] == 0:
        raise ConfigError("config key 'train.momentum' must be > 0 with train.nesterov=true (Nesterov needs "
                          "momentum), got 0.0; set train.nesterov=false for plain SGD")


def _check_compatible(config: dict, registry) -> None:
    loss = registry.get("loss", config["loss"]["name"])
    sampler = registry.get("sampler", config["sampler"]["name"])
    if loss.info.get("episodic") and not sampler.info.get("episodic"):
        episodic = [n for n in registry.names("sampler") if registry.get("sampler", n).info.get("episodic")]
        raise ConfigError(
            f"loss '{loss.name}' needs episodes (support and query rows) but sampler "
            f"'{sampler.name}' draws plain batches. Use an episodic sampler: "
            f"{', '.join(episodic) or '(none installed)'} "
            f"(e.g. --set sampler.name={episodic[0] if episodic else 'episodic'}, with its episode shape)"
            f"{_recipes_of(loss.name, registry)}."
        )


def _recipes_of(loss: str, registry) -> str:
    """``, or a recipe that trains it on episodes: fslab run protonet (or ...)`` for the
    method recipes whose loss is ``loss`` and whose sampler gives episodes; "" for none."""
    recipes = []
    for name in registry.names("method"):
        recipe = registry.create("method", name)
        sampler = (recipe.get("sampler") or {}).get("name")
        if (recipe.get("loss") or {}).get("name") == loss and sampler in registry.names("sampler") \
                and registry.get("sampler", sampler).info.get("episodic"):
            recipes.append(name)
    if not recipes:
        return ""
    others = f" (or {', '.join(recipes[1:4])}{', ...' if len(recipes) > 4 else ''})" if len(recipes) > 1 else ""
    return f", or a recipe that trains it on episodes: fslab run {recipes[0]}{others}"


def _check_installed(config: dict, registry, run_id: str) -> None:
    """A UsageError naming the run, for a saved plugin (its loss, sampler...) that no installed
    plugin registers now (its package uninstalled, its plugin folder moved): the registry's own
    "Unknown loss 'x'. Allowed: ..." reads as if the command line had named it, and says
    neither whose it is nor how the run goes on."""
    for section in PLUGIN_SECTIONS:
        name = config[section]["name"]
        if (line := uninstalled(registry, run_id, section, name)) is not None:
            raise ConfigError(f"{line} to resume the run, or start a run like it with another: "
                              f"{like_command(run_id)} {choosing_option(section)}NAME")


def choosing_option(section: str) -> str:
    """How a command line chooses another plugin of ``section``, up to its name:
    ``--dataset ``, ``--set loss.name=``."""
    return "--dataset " if section == "dataset" else f"--set {section}.name="


def uninstalled(registry, run_id: str, section: str, name: str) -> str | None:
    """How a command that needs run ``run_id``'s ``section`` ``name`` says that no installed plugin registers
    it now, up to the deed it is needed for, which the caller adds (``... install its plugin`` + `` to resume
    the run``); None where one does. A plugin that failed to load and whose source names it is named, with why."""
    if name in registry.names(section):
        return None
    if (owner := registry.failed_owner(name)) is not None:  # its source names it: that plugin, and why
        return (f"run {run_id} was trained with {section} '{name}' of plugin '{owner.plugin}' (whose source names "
                f"it), which failed to load: {owner.error}; put it right")
    failed = registry.missing_names()  # a plugin that failed to load may register it
    return (f"run {run_id} was trained with {section} '{name}', which no installed plugin registers"
            + (f" (not among them: {failed})" if failed else f" (fslab plugins --kind {section} lists those that are)")
            + "; install its plugin")


def check_saved(config: dict, registry, run_id: str) -> dict:
    """A saved configuration (run ``run_id``'s, about to resume) checked as :func:`resolve`
    checks a new one, after :func:`migrate`; returns the migrated configuration."""
    config = migrate(config)
    run_config(config)  # every key there, with a value of its type
    _check_installed(config, registry, run_id)
    _check_ranges(config)
    _check_compatible(config, registry)
    check_plugins(config, registry)
    return config
