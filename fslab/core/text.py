"""Text from run files, plugins and users, made safe to show in a terminal.

Everything the CLI and the dashboard show that they did not write themselves
(an error from a status file, a log line, a method name, a value typed on the
command line) goes through :func:`printable` (the CLI also escapes Rich markup
on top), so no file can clear the screen, move the cursor or retitle the
terminal, and through :func:`clip` where it could be long.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal, localcontext

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps tab and newline


def printable(text: object, *, lines: bool = False) -> str:
    """``text`` with its control characters (escape sequences, carriage
    returns, bells) written out as ``\\x1b``-style escapes. ``lines=True``
    keeps newlines and tabs, for log files shown line by line."""
    pattern = _CONTROL_BUT_LINES if lines else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def clip(text: str, most: int = 400) -> str:
    """At most ``most`` characters of ``text``, saying how many were left out: its start and its
    last fifth, where a line's suggestion or command is."""
    if len(text) <= most:
        return text
    tail = most // 5
    return f"{text[:most - tail]}… ({len(text) - most} more characters) …{text[-tail:]}"


def ascii_whole(text: str, most_digits: int = 19) -> int | None:
    """``text`` as the whole number it writes in ASCII digits, at most ``most_digits`` of them (a pid, a
    job id, a font size: ``"2385"`` is 2385); None for any other text. ``str.isdigit()`` takes ``²``, which
    int() refuses, and ``٣``, which int() reads as 3, and int() refuses more than 4,300 digits: read so,
    a damaged file's field or an address's parameter is none, never a traceback."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= most_digits else None


def count(n: int, noun: str, plural: str = "") -> str:
    """``count(1, "run")`` -> ``"1 run"``, ``count(3, "run")`` -> ``"3 runs"``; a noun whose plural is not
    the noun and an s is given it: ``count(2, "class", "classes")`` -> ``"2 classes"``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def queries_text(queries: int) -> str:
    """``15 queries``, ``1 query`` (an episode's queries per class)."""
    return f"{queries} {'query' if queries == 1 else 'queries'}"


def percent(fraction: float, *, sign: bool = False) -> str:
    """A fraction (an accuracy, its 95% CI, a paired difference) in percent to two decimals, as every
    table, line and chart shows it: ``0.35125`` is ``35.13``. A tie rounds away from zero, as papers
    round, on the fraction's decimal value: ``f"{100 * x:.2f}"`` rounded the binary product, so that
    0.35125 printed as 35.12. The fraction is first taken to 13 decimals, which drops the noise of
    binary sums (0.35124999999999995, the float mean of scores whose decimal mean is 0.35125, is
    that tie) and keeps apart every mean of up to 1,000,000 six-decimal scores that is not a tie
    (those lie 1e-12 or more from one). ``sign``: with its sign, ``+0.00`` where it rounds to zero.
    A value that is not finite prints as Python writes it; a finite one of any size is computed with
    all its digits (decimal's default 28 raised InvalidOperation from 1e15 up)."""
    if not math.isfinite(fraction):
        return f"{100 * fraction:{'+' if sign else ''}.2f}"
    with localcontext() as digits:
        digits.prec = _FLOAT_DIGITS
        exact = Decimal(repr(float(fraction))).quantize(Decimal("1e-13"))
        value = (exact * 100).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
        value = value + 0 if value else Decimal("0.00")  # never -0.00
    return f"{value:{'+' if sign else ''}.2f}"


_FLOAT_DIGITS = 330  # a float's integer digits (309 at most) and 13 decimals, with room to spare


def unsigned_zero(text: str) -> str:
    """A number as a format wrote it, without the minus of a zero: ``-0.0000`` (-0.0, or a small
    negative rounded to zero) is ``0.0000``, ``-0.00e+00`` is ``0.00e+00``; ``-0.0001`` and ``-inf``
    keep theirs."""
    if text.startswith("-") and set(text[1:].split("e")[0]) <= set("0.,"):
        return text[1:]
    return text


def loss_text(loss: float | None) -> str:
    """A training loss as every line, table and progress bar shows it: four decimals, ``-`` where none
    was logged, never ``-0.0000`` (a run logged before the train event wrote -0.0 as 0.0 holds -0.0)."""
    return "-" if loss is None else unsigned_zero(f"{loss:.4f}")


def split_outside(text: str, is_separator) -> list[str]:
    """``text`` cut at each character ``is_separator`` accepts that lies outside brackets,
    braces and quotes: ``[0.5,0.7],[0.3]`` at its commas is two lists, ``k=[1, 2] j="a b"`` at
    its spaces two assignments. Inside double quotes a backslash escapes the next character, as in
    a TOML string: ``"a\\",b"`` is one piece (its ``\\"`` no closing quote). Every piece is returned,
    empty ones included."""
    pieces, depth, quote, start, escaped = [], 0, "", 0, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif quote:
            escaped = quote == '"' and char == "\\"
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif depth <= 0 and is_separator(char):
            pieces.append(text[start:i])
            start = i + 1
    return [*pieces, text[start:]]


def duration(seconds: float | None) -> str:
    """``75`` -> ``"1:15"``, ``3675`` -> ``"1:01:15"``; ``"-"`` for an unknown or impossible time."""
    if seconds is None or seconds < 0 or not math.isfinite(seconds):
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
