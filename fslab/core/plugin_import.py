"""Importing a plugin's entry point, with a typo in it told as one: the entry point and the distribution
that declares it named, and the closest module or attribute there is (``Did you mean 'pkg.losses'?``).

``[project.entry-points.fslab] mine = "pkg.lossez"`` failed as ``No module named 'pkg.lossez'``, which
named neither the ``pyproject.toml`` line to fix nor the package that shipped it; a module the plugin
itself imports and lacks (``import wandb``) is not the entry point's typo, and keeps its own words.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable
from typing import Any

from fslab.core.errors import did_you_mean, exception_words
from fslab.core.module_source import defined_names, submodules


def load_entry_point(ep: Any, distribution: str | None) -> Any:
    """``ep.load()``; where the module or attribute ``ep.value`` names does not exist, the same exception
    type with a message that names the entry point, ``distribution`` (``"fslab-margin 0.3.0"``) and
    the closest name there is."""
    module_name, _, attr = (part.strip() for part in ep.value.partition(":"))
    try:
        return ep.load()
    except ModuleNotFoundError as exc:
        if not names_module(exc, module_name):
            raise  # a module the plugin imports, not the one its entry point names
        close = closest_module(exc.name)
        raise ModuleNotFoundError(f"No module named '{exc.name}'; {_declared(ep, distribution)}"
                                  + (f". Did you mean '{close}'?" if close else ""), name=exc.name) from exc
    except AttributeError as exc:
        if not attr or getattr(exc, "name", None) != attr.split(".")[0]:
            raise  # the module's own code failed on an attribute as it ran
        close = closest_attribute(importlib.import_module(module_name), attr)
        raise AttributeError(f"module '{module_name}' has no attribute '{attr}'; {_declared(ep, distribution)}"
                             + (f". Did you mean '{module_name}:{close}'?" if close else "")) from exc


def names_module(exc: ModuleNotFoundError, module_name: str) -> bool:
    """Whether ``exc`` is ``module_name`` (or a package above it) missing: a typo where a plugin names the
    module, not a module that module imports and lacks, which keeps its own words."""
    return bool(exc.name) and (module_name == exc.name or module_name.startswith(exc.name + "."))


def closest_module(missing: str) -> str | None:
    """The module of ``missing``'s package closest to it (``pkg.losses`` for ``pkg.lossez``), or None."""
    parent, _, last = missing.rpartition(".")
    close = _closest(last, submodules(parent))  # found, not run: a package's __init__ may import torch
    return f"{parent}.{close}" if close else None


def closest_attribute(module: Any, attr: str) -> str | None:
    """The public name of ``module`` closest to ``attr`` (``SmallConvNet`` for ``SmallConvnet``), or None."""
    return closest_name(attr, dir(module))


def closest_name(attr: str, names: Any) -> str | None:
    """The public one of ``names`` (a module's) closest to ``attr``, or None."""
    return _closest(attr, [n for n in names if not n.startswith("_")])


def _closest(word: str, choices: list[str]) -> str | None:
    """The closest of ``choices`` to ``word``, as every "did you mean" of fslab finds it, or None."""
    found = re.search(r"Did you mean '(.*)'\?", did_you_mean(word, choices))
    return found.group(1) if found else None


def hook_modules(package: str, hooks: Iterable[str], taken: set[str]) -> list[str]:
    """The modules of ``package`` whose source defines one of ``hooks``, found and read, not run, but for those
    in ``taken`` (another entry point names them): where an entry point names the package, the module it meant."""
    found = []
    for module in (f"{package}.{name}" for name in submodules(package)):
        try:
            names = defined_names(module)
        except (ImportError, ValueError):
            continue
        if module not in taken and names and not names.isdisjoint(hooks):
            found.append(module)
    return found


def entry_point_error(ep: Any, distribution: str | None, exc: BaseException) -> str:
    """What loading the entry point ``ep`` raised, as its load failure reads: the exception's type and words,
    then the entry point and the distribution that declares it, unless the words name them already (a typo's,
    :func:`load_entry_point`). ``RuntimeError: half-written plugin`` named neither the package nor the line
    that made fslab import it, and a notebook's warning named only the entry point's name."""
    text = exception_words(exc)
    where = _entry_point(ep.name, ep.value, distribution)
    return text if where in text else f"{text}; raised loading {where}"


def plugin_file_error(path: Any, exc: BaseException) -> str:
    """What loading a plugin folder's file ``path`` raised, as its load failure reads: the exception's type and
    words, then the file, unless the words name it already, as :func:`entry_point_error` names the entry point.
    ``fslab plugin 'local:boom' failed to load: RuntimeError: ...`` named the file only by its stem."""
    text, where = exception_words(exc), os.path.abspath(path)  # the same file whichever folder fslab runs in
    return text if where in text else f"{text}; raised loading {where} (a file of plugin_dirs in fslab.toml)"


def register_error(plugin: str, hook: str, origin: str, distribution: str | None, exc: BaseException) -> str:
    """What a plugin's hook ``hook`` raised as it registered (its module imported), as its load failure reads:
    the exception's type and words, then the hook and where it is, a plugin folder's file (``origin``, its path)
    or the entry point (``origin``: ``entry point pkg.mod``) and ``distribution``, as :func:`plugin_file_error`
    and :func:`entry_point_error` name them. It named the plugin only as ``local:NAME`` or the bare entry point.
    fslab's own refusal of a register() call names the component and the plugin already: its words alone."""
    text = exception_words(exc)
    if f"plugin '{plugin}'" in text:
        return text
    if origin.startswith("entry point "):
        where = _entry_point(plugin, origin.removeprefix("entry point "), distribution)
    else:
        where = f"{os.path.abspath(origin)} (a file of plugin_dirs in fslab.toml)"
    return f"{text}; raised by {hook}() of {where}"


def _entry_point(name: str, value: str, distribution: str | None) -> str:
    """``the entry point 'mine = "pkg.lossez"' of qa-bad 0.0.1 ([project.entry-points.fslab])``."""
    where = f" of {distribution}" if distribution else ""
    return f"the entry point '{name} = \"{value}\"'{where} ([project.entry-points.fslab])"


def _declared(ep: Any, distribution: str | None) -> str:
    """Where the entry point is declared: ``the entry point 'mine = "pkg.lossez"' of qa-bad 0.0.1 ... names it``."""
    return f"{_entry_point(ep.name, ep.value, distribution)} names it"
