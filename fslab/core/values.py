"""One setting's value checked against the type of its default, the first check every key gets.

``check_value("train.lr", "fast", 0.05)`` refuses text where a number belongs, in one line that
quotes the value as TOML writes it and, where it helps, says how to write what was meant (a list in
brackets, a text in quotes). A whole number is a valid float, a single number a valid one-element
list, and an untyped plugin parameter (default ``None``) takes any finite value. The ranges a key
allows are checked after this (:mod:`fslab.core.limits`).
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

from fslab.core.assignments import shown, toml_value
from fslab.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}


def is_number(value: Any) -> bool:
    """Whether ``value`` is a number as a setting or a saved file holds one: an int or a float, and not
    true/false (a bool is an int to Python: ``eval.center`` is no number to plot, sort or type-check)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_finite(key: str, value: Any) -> None:
    """A ConfigError for a NaN, an infinity or a whole number from 2**63 on anywhere in an
    untyped value (a list or table included)."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, (list, dict)):
            _check_finite(key, item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ConfigError(f"config key '{key}' must be a finite number, got {shown(value)}")
        elif type(item) is int and not -(2**63) <= item < 2**63:
            raise ConfigError(f"config key '{key}' must hold whole numbers below 2**63, got {shown(value)}")


def check_value(key: str, value: Any, default: Any) -> Any:
    """``value`` converted to the type of ``default``, or a ConfigError naming
    the key and the type expected. An int is a valid float; a single number is
    a valid one-element list (``--set eval.shots=5``)."""
    value = _plain_number(value)
    if default is None:  # an untyped plugin parameter (loss.margin=null): any value, but a finite one
        _check_finite(key, value)
        return value
    expected = type(default)
    if expected is list:
        if is_number(value):
            value = [value]
        elif isinstance(value, tuple):  # fslab.create("backbone", "resnet12", widths=(8, 16, 32, 64))
            value = list(value)
        if isinstance(value, list):
            if default and is_number(default[0]):
                return [check_value(f"{key}[{i}]", v, default[0]) for i, v in enumerate(value)]
            _check_finite(key, value)
            return value
    elif expected is float and is_number(value):
        try:
            number = float(value)
        except OverflowError:  # a whole number beyond float's range: TOML reads any size
            raise ConfigError(f"config key '{key}' must be a finite number (below 1.8e308), got a whole "
                              f"number of {len(str(abs(value)))} digits") from None
        if not math.isfinite(number):  # TOML and --lr take nan and inf; no setting means them
            raise ConfigError(f"config key '{key}' must be a finite number, got {shown(value)}")
        return number
    elif isinstance(value, expected) and (expected is bool or not isinstance(value, bool)):
        if expected is int and not -(2**63) <= value < 2**63:  # TOML reads any size; torch and JSON readers do not
            raise ConfigError(f"config key '{key}' must be a whole number below 2**63, got {value}")
        if expected is dict:
            _check_finite(key, value)
        return value
    raise ConfigError(f"config key '{key}' must be {TYPE_NAMES.get(expected, expected.__name__)}, got {shown(value)}"
                      + _as_list_hint(expected, value) + _as_text_hint(expected, value))


def _plain_number(value: Any) -> Any:
    """A number of another library (numpy's int64 or float32, from a notebook's fslab.create)
    as Python's own; TOML and JSON give Python's already."""
    if isinstance(value, numbers.Integral) and not isinstance(value, int):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (int, float)):
        return float(value)
    return value


def _as_list_hint(expected: type, value: Any) -> str:
    """A suggestion for a list written without its brackets (``eval.shots=1,5``, as ``--shots`` takes it)."""
    if expected is not list or not isinstance(value, str) or "," not in value:
        return ""
    try:
        tomllib.loads(f"v = [{value}]")
    except tomllib.TOMLDecodeError:
        return ""
    return f"; a list is written in brackets: [{value}]"


def _as_text_hint(expected: type, value: Any) -> str:
    """A suggestion for a text that TOML read as a number or a boolean (``--set log_dir=2024``)."""
    if expected is not str or not isinstance(value, (bool, int, float)):
        return ""
    text = toml_value(value)
    return (f"; a text TOML reads as {'true or false' if isinstance(value, bool) else 'a number'} is written in "
            f"quotes: \"{text}\" (on a command line, '\"{text}\"')")
