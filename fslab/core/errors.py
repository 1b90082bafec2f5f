"""One exception family for everything a user can get wrong.

The CLI prints an ``FslabError`` as a single line and exits with its ``exit_code``
(2 for a :class:`UsageError`, 1 otherwise), as it prints an ``OSError`` (a file the
system refused; exit code 1, :func:`fslab.cli.main`). Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import difflib
import linecache
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any


class FslabError(Exception):
    """A problem the user can fix; printed as one line, exit code 1."""

    exit_code = 1


class UsageError(FslabError):
    """Bad input on the command line or in a config file; exit code 2."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """A SIGTERM (``kill``, ``timeout``, a job's end), raised where fslab handles it as Ctrl-C: the
    command stops what it started and says how to go on, then exits 143 rather than 130."""


def interrupted_code(interrupt: BaseException) -> int:
    """The exit code of a command ended by ``interrupt``: 130 for Ctrl-C, as the shell's, 143 for a
    SIGTERM (:class:`Terminated`, or an interrupt raised over one and marked ``terminated``)."""
    return 143 if isinstance(interrupt, Terminated) or getattr(interrupt, "terminated", False) else 130


class ConfigError(UsageError):
    """A configuration value, key or file that cannot be used."""


class NewerConfig(ConfigError):
    """A configuration saved by a newer fslab than this one: left alone, never rewritten."""


class NotInstalled(UsageError):
    """A package a plugin needs is not installed here (``pip install 'fslab[wandb]'``): a fact of this
    machine, raised by a ``check=``, not of the plugin's parameters, so its defaults are not blamed for it
    when the plugin loads; a run that uses the plugin is refused with the line."""


class PluginError(FslabError):
    """A plugin that cannot be loaded, registered or created."""


class UnknownName(UsageError):
    """A name that is none of the choices (a plugin, a plugin kind, a state):
    :func:`unknown`'s message, what was asked for in ``what`` (a plugin's kind,
    say) and the name itself in ``word``."""

    def __init__(self, what: str, word: str, choices: Iterable[str]) -> None:
        super().__init__(unknown(what, word, choices))
        self.what, self.word = what, word


class RunNotFound(UsageError):
    """A run id or prefix that matches no run (or more than one)."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choice, or ''."""
    if not isinstance(word, str):
        return ""
    choices = list(choices)
    same = [c for c in choices if isinstance(c, str) and c.lower() == word.lower()]  # NCA for nca
    close = same or difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def unknown_format(fmt: str, formats: Iterable[str]) -> str:
    """The message for a ``--format`` that is none of a command's ``formats`` (in the order its help gives
    them), with the closest (``tex``: Did you mean 'latex'?)."""
    formats = list(formats)
    return f"unknown format '{fmt}'.{did_you_mean(fmt, formats)} Allowed: {', '.join(formats)}."


def unknown(what: str, word: str, choices: Iterable[str]) -> str:
    """The standard message for a name that is not one of ``choices``."""
    choices = sorted(choices)
    allowed = ", ".join(choices) if choices else "(none)"
    return f"Unknown {what} '{word}'.{did_you_mean(word, choices)} Allowed: {allowed}."


def plugin_call(call: Callable[[], Any], failed: str, passes: tuple[type[BaseException], ...] = ()) -> Any:
    """``call()``, a plugin's code run by fslab: what fslab raises (a value the plugin refuses)
    and ``passes`` go on as they are; any other exception, a bug in the plugin, becomes one
    line, ``{failed}: {Type}: {message}`` (``failed`` names the plugin), not a traceback."""
    try:
        return call()
    except (FslabError, *passes):
        raise
    except Exception as exc:
        raise PluginError(f"{failed}: {exception_words(exc)}") from exc


def _newer_api(exc: BaseException) -> str:
    """For ``from fslab.plugin import NAME`` of a name this fslab's plugin API lacks (a plugin written for a newer
    fslab, or a typo), what the API has and how to get a newer one: ``cannot import name 'one_at_a_time' from
    'fslab.plugin'`` said neither. The API is read where the plugin's import left it, not imported here."""
    found = re.match(r"cannot import name '(\w+)' from 'fslab\.plugin'", str(exc))
    api = sys.modules.get("fslab.plugin")
    if not isinstance(exc, ImportError) or found is None or api is None:
        return ""
    name = found.group(1)
    return (f"; fslab.plugin of this fslab (API_VERSION {getattr(api, 'API_VERSION', '?')}) has no '{name}'."
            f"{did_you_mean(name, getattr(api, '__all__', ()))} A plugin written for a newer fslab needs it: "
            f"pip install -U fslab")


def exception_words(exc: BaseException) -> str:
    """An exception of a plugin's code in words, ``Type: message``; one with no message (a bare ``assert``, as
    a plugin checks ``API_VERSION`` at import) with where it was raised, the file, line and statement: it read
    ``AssertionError: `` (or ``AssertionError:.`` in a run's line), naming no check and no file."""
    if str(exc).strip():
        return f"{type(exc).__name__}: {exc}{_newer_api(exc)}"
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:  # never raised: nothing to say where
        return type(exc).__name__
    file = frame.tb_frame.f_code.co_filename
    source = linecache.getline(file, frame.tb_lineno).strip()
    return f"{type(exc).__name__} at {file} line {frame.tb_lineno}" + (f": {source}" if source else "")


def exception_line(exc: BaseException, limit: int = 300) -> str:
    """:func:`exception_words` on one line (each run of whitespace one space), what follows ``Type: `` cut at
    ``limit`` characters: a sink's failure as its line and its record say it."""
    return " ".join(exception_words(exc).split())[: len(type(exc).__name__) + 2 + limit]
