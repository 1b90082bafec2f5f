"""``--set KEY=VALUE`` as text: a setting read from it and written back.

Values are TOML values, and a word TOML does not read is a string, so
``loss.name=nca`` and ``train.milestones=[0.5, 0.75]`` both work; so is one
that TOML reads as a date or a time (``dataset.root=2026-01-01``), which no
setting takes. Every
surface that names a setting (``fslab show``, study show and report, compare
and plot labels, hints) writes it with :func:`assignment`, so what it prints
can be pasted after ``--set``.
"""

from __future__ import annotations

import datetime
import re
import sys
from collections.abc import Iterable
from typing import Any

from fslab.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def parse_assignment(text: str, option: str = "--set") -> tuple[list[str], Any]:
    """``'train.lr=0.05'`` -> (['train', 'lr'], 0.05). Values are TOML values;
    anything that is not valid TOML is taken as a string (``loss.name=nca``).
    ``option`` names the option in the message about a malformed one."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        example = {"--slurm": "partition=gpu"}.get(option, "train.lr=0.05")
        raise ConfigError(f"{option} expects key=value (e.g. {example}), got '{text}'")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if raw and raw[0] in "[{\"'":  # meant as a list, table or quoted string: say what TOML found wrong
            raise ConfigError(f"{option} {key}: {raw!r} is not a TOML value ({str(exc).split(' (at ')[0]}); "
                              f"e.g. [0.5, 0.75] or \"text\"") from None
        value = raw
    if isinstance(value, datetime.date | datetime.time):  # no setting takes one: a folder named 2026-01-01
        value = raw
    return key.split("."), value


def assignment(key: str, value: Any) -> str:
    """``key=value`` as ``--set`` reads it back, the inverse of :func:`parse_assignment`:
    ``eval.center=false``, ``backbone.widths=[8, 16]``, ``loss.name=nca``. Every surface that
    names a setting (study show and report, compare and plot labels) writes it this way, so a
    label can be pasted after ``--set``. A JSON null, which ``--set`` cannot give, is ``null``."""
    return f"{key}={toml_value(value)}"


def toml_value(value: Any, bare: bool = True) -> str:
    """``value`` as a TOML value; with ``bare``, a string that TOML would not read as another
    value is left unquoted, as ``--set`` takes it (``nca``, not ``"nca"``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # 0.05, 1e-05, inf, nan: each a TOML number
    if isinstance(value, str):
        return value if bare and _reads_as_itself(value) else _quoted(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v, bare=False) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k if _BARE_KEY.fullmatch(k) else _quoted(k)} = {toml_value(v, bare=False)}"
                               for k, v in value.items()) + "}"
    raise TypeError(f"not a setting's value: {value!r}")


def shown(value: Any, width: int | None = None) -> str:
    """``value`` as an error message quotes what was given: in TOML's spelling, as it is
    written in a file or after ``--set`` (``true``, ``"maybe"``, ``{a = 1}``, not Python's
    ``True``, ``'maybe'``, ``{'a': 1}``), cut to ``width`` characters where given (the command line
    clips a long message itself, saying how much it left out)."""
    try:
        text = value.isoformat() if isinstance(value, datetime.date | datetime.time) else toml_value(value, bare=False)
    except TypeError:  # not a value TOML has (a Python caller's object): its Python spelling
        text = repr(value)
    return text if width is None or len(text) <= width else text[:width - 1] + "…"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _reads_as_itself(text: str) -> bool:
    """Whether ``--set key=TEXT`` gives the string ``text``: TOML reads no value from it, and
    it does not open as a list, table or quoted string (which --set refuses unfinished)."""
    if not text or text != text.strip() or text[0] in "[{\"'":
        return False
    try:
        tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return True
    return False


_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _quoted(text: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, a tab or line break as \\t, \\n, \\r,
    other control characters as \\uXXXX."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def nest(path: list[str], value: Any) -> dict:
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return out


def assignments_layer(texts: Iterable[str], option: str = "--set") -> dict:
    """Several ``KEY=VALUE`` given together (one command's ``--set``s) as one
    layer, a later value over an earlier one of the same key. So
    ``evaluator.k=3`` and ``evaluator.name=knn`` make one section in either
    order: as layers of their own, the name's would drop the ``k`` given before
    it, as a layer that changes a plugin drops what lower layers gave the old one."""
    return layer_of(parse_assignment(text, option) for text in texts)


def layer_of(settings: Iterable[tuple[list[str], Any]]) -> dict:
    """(key path, value) pairs as one configuration layer, a later value over an earlier one of the
    same key; unlike layers merged one over another, a plugin's name and its parameters given
    together stay together in any order."""
    layer: dict = {}
    for path, value in settings:
        here = layer
        for part in path[:-1]:
            if not isinstance(here.get(part), dict):
                here[part] = {}
            here = here[part]
        here[path[-1]] = value
    return layer
