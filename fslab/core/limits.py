"""The values a typed configuration key allows, declared next to its field.

A field of :class:`fslab.core.config.TrainConfig` (or ``EvalConfig``,
``RunConfig``) states its range in its metadata::

    epochs: int = field(default=120, metadata=at_least(1))

and :func:`check_fields` applies every such rule when a configuration is
resolved, so a key added to a section gets its check where it is defined.
The type of a value is checked before (:func:`fslab.core.values.check_value`);
a rule only says which values of that type are allowed. A list key's rule
applies to each of its values.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from fslab.core.assignments import shown
from fslab.core.errors import ConfigError, did_you_mean

RULE = "allowed"  # the metadata key of a field's rule


@dataclass(frozen=True)
class Allowed:
    """What a number, string or list key may hold; ``text`` says it in a message."""

    text: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # value > low rather than >= low
    pattern: str | None = None  # a string must match it whole
    choices: tuple[str, ...] = ()
    nonempty: bool = False  # a list needs at least one value
    distinct: bool = False  # a list names each value once

    def admits(self, value: Any) -> bool:
        if self.choices:  # True is no choice of one_of(0, 1), though True == 1
            return not isinstance(value, bool) and value in self.choices
        if self.pattern is not None:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False  # a range admits numbers only (a plugin parameter without a default is not typed)
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high


def _numbers(call: str, *values: Any) -> None:
    """A rule's bounds are numbers: at_least('0') failed on the first value checked against it
    ('<' not supported between 'int' and 'str'), a traceback from fslab run, not the plugin's loading."""
    for value in values:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise TypeError(f"{call} takes numbers (at_least(1), between(0, 1)), got {value!r}")


def at_least(low: int | float) -> dict:
    _numbers("at_least()", low)
    return {RULE: Allowed(f"at least {low}", low=low)}


def positive() -> dict:
    return {RULE: Allowed("> 0", low=0, low_open=True)}


def between(low: int | float, high: int | float, text: str = "") -> dict:
    _numbers("between()", low, high)
    if low > high:
        raise TypeError(f"between() takes the lower bound first, got between({low!r}, {high!r})")
    return {RULE: Allowed(text or f"between {low} and {high}", low=low, high=high)}


SEED = between(0, 2**63 - 1, "a whole number from 0 to 2**63 - 1")  # what torch.manual_seed takes


def one_of(*choices: str | int | float) -> dict:
    """The values a key allows, each text or a number: ``one_of("euclidean", "cosine")``, ``one_of(1, 5)``."""
    if not choices or not all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices):
        raise TypeError("one_of() takes the allowed values themselves, text or numbers (one_of('euclidean', "
                        f"'cosine'), one_of(1, 5)), got one_of({', '.join(map(repr, choices))})")
    return {RULE: Allowed(f"one of {', '.join(map(str, choices))}", choices=choices)}


def matching(pattern: str, text: str) -> dict:
    if not isinstance(pattern, str) or not isinstance(text, str):
        raise TypeError(f"matching() takes a regular expression and the words saying it, got matching({pattern!r}, "
                        f"{text!r})")
    try:
        re.compile(pattern)
    except re.error as error:
        raise TypeError(f"matching() takes a regular expression, got {pattern!r}: {error}") from None
    return {RULE: Allowed(text, pattern=pattern)}


def listing(rule: dict, *, nonempty: bool = False, distinct: bool = False) -> dict:
    """A list key: ``rule`` for each value, at least one value if ``nonempty``, and each once if ``distinct``."""
    return {RULE: dataclasses.replace(rule_of(rule), nonempty=nonempty, distinct=distinct)}


def rule_of(declared: Any) -> Allowed:
    """The rule in what :func:`at_least` and the others return (or an :class:`Allowed` itself)."""
    rule = declared.get(RULE) if isinstance(declared, dict) else declared
    if not isinstance(rule, Allowed):
        factories = ("at_least", "positive", "between", "one_of", "matching", "listing")
        named = getattr(declared, "__name__", None) if callable(declared) else declared
        hint = (f" (the rule is {named}({'' if named == 'positive' else '...'}), from fslab.plugin)"
                if named in factories else "")
        uncalled = callable(declared) and named in factories
        shown = f"the function {named} itself, not called" if uncalled else repr(declared)
        raise TypeError(f"expected a rule such as at_least(1) or one_of('a', 'b'), got {shown}{hint}")
    return rule


def check_fields(kind: type, values: dict, prefix: str = "") -> None:
    """A ConfigError for the first value of ``values`` (a section, by field
    name) that the rule of its field in dataclass ``kind`` does not allow."""
    for f in dataclasses.fields(kind):
        rule = f.metadata.get(RULE)
        if rule is not None and f.name in values:
            check_rule(f"{prefix}{f.name}", values[f.name], rule)


def check_rule(key: str, value: Any, rule: Allowed) -> None:
    """A ConfigError naming ``key`` if ``rule`` does not allow ``value`` (each
    value of a list). None, the "not set" of an optional plugin parameter, is allowed."""
    if isinstance(value, list):
        if rule.nonempty and not value:
            raise ConfigError(f"config key '{key}' needs at least one value, each {rule.text}, got []")
        for value_ in value:
            _check(key, value_, rule)
        if rule.distinct and (again := repeated_at(value)) is not None:
            raise ConfigError(f"config key '{key}' lists {shown(value[again])} twice; give each value once, "
                              f"got {shown(value)}")
    elif value is not None:
        _check(key, value, rule)


def repeated_at(values: list) -> int | None:
    """Where ``values`` first lists a value it listed before; None where each is listed once."""
    return next((i for i, v in enumerate(values) if v in values[:i]), None)


def _check(key: str, value: Any, rule: Allowed) -> None:
    if rule.admits(value):
        return
    hint = ""
    if value == "null":  # as fslab plugins writes a parameter unset by default; TOML has no null
        hint = (" null is no TOML value (fslab plugins writes an unset default so): "
                "leave the key out to keep the default")
    elif isinstance(value, str) and rule.choices:
        hint = did_you_mean(value, rule.choices)
    elif isinstance(value, str) and rule.admits(value.lower()):  # a pattern's word in capitals: CPU for cpu
        hint = f" Did you mean '{value.lower()}'?"
    raise ConfigError(f"config key '{key}' must be {rule.text}, got {shown(value)}" + (f".{hint}" if hint else ""))
