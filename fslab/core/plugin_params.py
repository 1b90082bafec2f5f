"""A plugin's parameters: the names and types it declares, its ``allowed`` rules and its own check.

:func:`plugin_params` is the one check of what a component is given, for a run's plugin sections,
its sinks, ``fslab export`` and ``fslab.create``; it also fills in the defaults of the parameters
not given, so a saved configuration is complete. :func:`check_plugins` runs each section's declared
rules and the plugin's own ``check=`` function, once without the splits' sizes when a configuration
is resolved and again with them before a run exists (fslab.execution.checks).
"""

from __future__ import annotations

import copy
import numbers
import operator
import os
import re
from typing import Any

from fslab.core.errors import ConfigError, did_you_mean, plugin_call
from fslab.core.keys import PLUGIN_SECTIONS, SECTION_KEYS, SINKS
from fslab.core.limits import SEED, at_least, check_rule, rule_of
from fslab.core.types import CheckContext, SinkRun, SplitSizes
from fslab.core.values import check_value

CALL_ARGUMENTS = {"loss": 3, "evaluator": 2}  # what each call passes a loss (z, labels, support) or an evaluator


def _positional_hint(component, param: str) -> str:
    """Where ``param`` is in the component's signature but not keyword-only (``def f(z, labels,
    support=None, margin=1.0)``), a sentence saying that fslab sets keyword-only ones; else ''."""
    import inspect

    target = component.target
    if isinstance(target, (str, os.PathLike)):
        return ""
    try:
        params = inspect.signature(target.__init__ if inspect.isclass(target) else target).parameters
    except (TypeError, ValueError):
        return ""
    passed = 1 if inspect.isclass(target) else CALL_ARGUMENTS.get(component.kind, 0)  # self, or a call's arguments
    found = params.get(param)
    if (found is None or found.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD
            or found.default is inspect.Parameter.empty or list(params).index(param) < passed):
        return ""
    return (f" ('{param}' is in its signature but not after a *: fslab sets keyword-only parameters only, "
            f"so the plugin should declare it as def f(..., *, {param}=...))")


def _named(component, param: str) -> bool:
    """Whether the component's own signature names ``param`` (one it takes only through ``**kwargs`` is not
    named: a loss function with ``**kw`` was said to allow num_classes and out_dim, which it never wrote)."""
    import inspect

    target = component.resolve()
    try:
        return param in inspect.signature(target.__init__ if inspect.isclass(target) else target).parameters
    except (TypeError, ValueError):  # no signature to read: what it takes is not known, so nothing is listed
        return False


def sink_params(registry, name: str, given: dict) -> dict:
    """Sink ``name``'s parameters, checked and complete (:func:`plugin_params`)."""
    return plugin_params(registry, "sink", name, given, f"{SINKS}.{name}")


# The values fslab fills in (fslab.core.registry.FILLED_IN) that are whole
# numbers: a caller of fslab.create who passes one gets the check a run's would.
FILLED_IN_COUNTS = {"out_dim": at_least(1), "num_classes": at_least(1), "in_channels": at_least(1),
                    "batch_size": at_least(1), "seed": SEED}


def plugin_params(registry, kind: str, name: str, given: dict, key: str | None = None,
                  filled_in: tuple[str, ...] = (), choose: str | None = None) -> dict:
    """The parameters of component ``name`` of ``kind``: ``given`` checked against
    what it declares (the names, the types of their defaults, its ``allowed``
    rules), with its defaults for the rest. The one check of a plugin's
    parameters, for a run's sections, its sinks, ``fslab export`` and
    ``fslab.create``; ``key`` names them in messages (``loss``, ``sinks.mlflow``).
    The names in ``filled_in`` (values fslab fills in at run time, such as a
    backbone's ``in_channels``) are accepted too and passed on; the whole numbers
    among them (FILLED_IN_COUNTS) are checked first. An unknown parameter that another plugin of ``kind``
    declares is said with that plugin, and ``choose``, how the command chooses it (``--set evaluator.name=``,
    :func:`fslab.core.config.choosing_option`; ``--evaluator `` for fslab eval), up to its name."""
    component = registry.get(kind, name)
    key = key or kind
    known = [*component.params, *filled_in]
    for param in given:
        if param not in known:  # a target's **kwargs takes what fslab fills in, but the author wrote no such name
            listed = [*component.params, *(p for p in filled_in if _named(component, p))]
            raise ConfigError(unknown_param_line(registry, kind, name, param, listed, key, choose))
    params = {param: check_value(f"{key}.{param}", given[param], default) if param in given
              else copy.deepcopy(default) for param, default in component.params.items()}
    _check_declared_rules(component, params, key)
    given = dict(given)
    for param in filled_in:
        if param in given and param in FILLED_IN_COUNTS:
            given[param] = check_value(f"{key}.{param}", given[param], 0)
            check_rule(f"{key}.{param}", given[param], rule_of(FILLED_IN_COUNTS[param]))
    if "image_size" in filled_in and "image_size" in given:
        given["image_size"] = _check_image_size(f"{key}.image_size", given["image_size"])
    _check_filled_in_kinds(key, {param: given[param] for param in filled_in if param in given})
    return {**params, **{param: given[param] for param in filled_in if param in given}}


def unknown_param_line(registry, kind: str, name: str, param: str, listed, key: str | None = None,
                       choose: str | None = None) -> str:
    """Why component ``name`` of ``kind`` refuses ``param``, the one line every caller says it in (a run's
    sections, fslab.create, the registry's own create): ``unknown parameter 'evaluator.k' for evaluator
    'centroid'``, then the closest of the ``listed`` names it takes and all of them, or that it takes none, the
    plugin of ``kind`` that declares ``param`` (:func:`_owners_hint`, with ``choose``) and, where its signature
    has ``param`` before a ``*``, that fslab sets keyword-only parameters only."""
    allowed = (f".{did_you_mean(param, listed)} Allowed: {', '.join(sorted(listed))}." if listed
               else ", which takes no parameters.")
    return (f"unknown parameter '{key or kind}.{param}' for {kind} '{name}'{allowed}"
            + _owners_hint(registry, kind, name, param, choose) + _positional_hint(registry.get(kind, name), param))


def _owners_hint(registry, kind: str, name: str, param: str, choose: str | None) -> str:
    """`` Evaluator 'knn' has it: --set evaluator.name=knn`` where plugins of ``kind`` other than ``name``
    declare ``param`` (the first named, and how ``choose`` chooses it); else ''."""
    owners = sorted(other for other in registry.names(kind)
                    if other != name and param in registry.get(kind, other).params)
    if not owners:
        return ""
    others = f"{', '.join(repr(o) for o in owners[1:3])}{', ...' if len(owners) > 3 else ''}"
    also = f" (so do{'es' if len(owners) == 2 else ''} {others})" if owners[1:] else ""
    # the option last, with no period after it: copied as printed, it is taken as it is
    return f" {kind.capitalize()} '{owners[0]}' has it{also}" + (f": {choose}{owners[0]}" if choose else ".")


def _whole_numbers(value: Any) -> bool:
    """A sampler's labels as a run gives them (a list of ints) or as a notebook has them (a tuple,
    a 1-d integer tensor or array): one whole number per image. Text, floats and nested lists were
    passed on and failed inside the sampler (int() of 'a', of a list), or drew batches from floats."""
    if isinstance(value, (str, bytes, dict)) or not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        return False
    if hasattr(value, "dtype") and hasattr(value, "ndim"):  # a tensor or an array: its dtype says
        return value.ndim == 1 and re.fullmatch(r"(torch\.)?u?int\d+", str(value.dtype)) is not None
    try:
        return all(not isinstance(v, bool) and operator.index(v) is not None for v in value)
    except TypeError:  # operator.index takes ints, numpy's and 0-d integer tensors only
        return False


# The other values fslab fills in: what each must be, in words, and the test of it.
FILLED_IN_KINDS = {
    "labels": ("the training split's labels, one whole number per image (a list, tensor or array)", _whole_numbers),
    "training_loss": ("the run's loss section, a dict such as {'name': 'sen', 'eps_pos': 1.0}, or None",
                      lambda v: v is None or isinstance(v, dict)),
    "run": ("a fslab.plugin.SinkRun, the run the sink is told of", lambda v: isinstance(v, SinkRun)),
    "root": ("the dataset's folder, as text or a pathlib.Path, or None",
             lambda v: v is None or isinstance(v, (str, os.PathLike))),
}


def _check_filled_in_kinds(key: str, given: dict) -> None:
    """What fslab.create is given for a value a run fills in that is no whole number (a sampler's
    labels, an evaluator's training_loss, a sink's run, a dataset's root): one line, not the
    component's TypeError (or, for a root of 5, a folder './5' that is not there)."""
    for param, value in given.items():
        if param in FILLED_IN_KINDS and not FILLED_IN_KINDS[param][1](value):
            shown = " ".join(repr(value).split())  # one line, however long a split's labels or a tensor's repr
            shown = shown if len(shown) <= 80 else f"{shown[:76].rstrip()} ..."
            raise ConfigError(f"config key '{key}.{param}' must be {FILLED_IN_KINDS[param][0]}, got {shown}")


def _check_image_size(key: str, value: Any) -> tuple[int, int]:
    """A backbone is told the images' ``(height, width)``, as a run tells it: two whole numbers
    at least 1 (a single number, as a dataset's own ``image_size`` is, is refused here), given
    back as Python ints (numpy's, from an array's shape, were refused)."""
    pair = isinstance(value, (tuple, list)) and len(value) == 2
    if not pair or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ConfigError(f"config key '{key}' must be the images' (height, width), two whole numbers at "
                          f"least 1, got {value!r}")
    return int(value[0]), int(value[1])


def _check_declared_rules(component, params: dict, key: str) -> None:
    """The rules ``component`` declares for its parameters (``register(..., allowed={...})``)
    against ``params``; ``key`` names them in the message (``loss``, ``sinks.mlflow``)."""
    for param, rule in component.info.get("allowed", {}).items():
        check_rule(f"{key}.{param}", params.get(param), rule)


def check_plugins(config: dict, registry, sizes: dict[str, SplitSizes] | None = None) -> None:
    """The rules each plugin declares for its parameters (``register(...,
    allowed={...})``), then its own check of them (``register(..., check=f)``):
    ``f(params, CheckContext(config, sizes))`` raises a UsageError for values
    the plugin cannot use. :func:`fslab.core.config.resolve` runs them without split sizes; the
    executor runs them again with the sizes the dataset tells, before a run exists."""
    for section in PLUGIN_SECTIONS:
        values = config[section]
        component = registry.get(section, values["name"])
        fixed = SECTION_KEYS.get(section, ("name",))
        # A run saved before a parameter existed lacks it, and the plugin gets its default.
        params = copy.deepcopy({**component.params, **{k: v for k, v in values.items() if k not in fixed}})
        _check_declared_rules(component, params, section)
        run_check(component, params, CheckContext(copy.deepcopy(config), sizes))


def run_check(component, params: dict, context: CheckContext | None) -> None:
    """The plugin's own check of ``params`` (``register(..., check=f)``), if it
    registered one: ``f(params, context)``, where ``context`` is None outside a
    run (``fslab.create``). Its UsageError is the user's; any other exception is
    a bug in the check, one line naming the component and its plugin."""
    check = component.info.get("check")
    if check is None:
        return
    plugin_call(lambda: check(params, context),
                f"the check of {component.named} failed")
