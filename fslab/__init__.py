"""fslab's Python API: the plugins' components listed, described and built by name.

fslab is a few-shot-learning lab on the command line.

Public Python API::

    import fslab
    fslab.available("loss")                 # ['nca', 'protonet', ...]
    loss = fslab.create("loss", "nca", temperature=0.9)
    out = loss(z, labels)                   # LossOutput(loss, positives, negatives, extra)

Importing fslab does not import torch; building a component may. What a
plugin may use is :mod:`fslab.plugin`.
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from typing import Any

__version__ = "0.1.0"
__all__ = ["available", "create", "describe", "get_registry"]

_registry = None
_registry_dirs = None  # the plugin folders _registry was loaded with, as absolute paths
_registry_here = False  # loaded from the settings of the folder it was asked in (none given): asked again each time


def _warn(message: str) -> None:
    """Warn at the caller's line (a notebook cell, a test), however deep in fslab the registry was asked for."""
    level, frame, here = 1, sys._getframe(), os.path.dirname(__file__) + os.sep
    while frame is not None and frame.f_code.co_filename.startswith(here):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, stacklevel=level)


_warned: set[str] = set()  # the plugin failures warned of: each once a process, however often the plugins load


def _warn_once(line: str) -> None:
    """A plugin's load failure as one warning a process: the plugins load again for other settings (another
    project's folders), and the same broken entry point was warned of again at every load."""
    if line not in _warned:
        _warned.add(line)
        _warn(line)


def get_registry(settings=None, report=_warn_once):
    """The process-wide registry: entry-point plugins plus the plugin folders
    named in ``fslab.toml`` (or in ``settings``), loaded on first use, and
    again when ``settings`` names other plugin folders than it was loaded
    with: folders as the paths they are, so a notebook that moves to another
    project (``os.chdir``), whose ``fslab.toml`` names a folder of the same
    name, gets that project's plugins. With no ``settings``, the registry of
    the settings given last, or where none were given, of the fslab.toml of
    the folder it is asked in. Each plugin that failed to load is passed to
    ``report`` as one line (by default a warning, once a process for each
    failure)."""
    global _registry, _registry_dirs, _registry_here
    if settings is not None and not hasattr(settings, "plugin_dirs"):  # a path was "no attribute 'plugin_dirs'"
        from fslab.core.errors import UsageError

        raise UsageError(f"fslab.get_registry takes the settings fslab.core.settings.load_settings(path) reads from "
                         f"a fslab.toml, not {settings!r:.100}; give get_registry(load_settings(Path(...)))")
    from fslab.core.settings import load_settings, plugin_folders

    if _registry is not None and settings is None and not _registry_here:
        return _registry  # the settings given last still stand
    given = (settings or load_settings()).plugin_dirs
    dirs = plugin_folders(given)  # "mine" of two projects is two folders
    if _registry is None or dirs != _registry_dirs:
        from fslab.core.registry import load_registry

        _registry_dirs, _registry = dirs, load_registry(given)
        for failure in _registry.failures:
            report(failure.line)
    _registry_here = settings is None
    return _registry


def available(kind: str, pattern: str = "*") -> list[str]:
    """Names of registered components of ``kind`` matching a glob ``pattern``."""
    return get_registry().names(kind, pattern)


def create(kind: str, name: str, **params: Any) -> Any:
    """Build a registered component. ``params`` are checked as a run's
    configuration is (the names the component declares, their types, its
    ``allowed`` rules, then its own ``check=`` with no run to read: context
    None) before anything is built, and the ones not given take its defaults;
    the values a run fills in itself (a backbone's ``in_channels``, a
    sampler's ``labels``) are passed as given."""
    from fslab.core.errors import PluginError
    from fslab.core.plugin_params import plugin_params, run_check
    from fslab.core.registry import FILLED_IN

    registry = get_registry()
    if kind == "study":  # a study is a file, not a callable: its parsed, checked contents
        from fslab.core.errors import UsageError
        from fslab.core.studies import find_study

        if params:
            raise UsageError(f"study '{name}' takes no parameters, got {', '.join(sorted(params))}")
        return find_study(registry, name)
    component = registry.get(kind, name)  # a kind or name that is no text is an unknown one: one line
    if kind == "method":
        return registry.create(kind, name, **params)
    if kind == "dataset" and not registry.reads_files(name):  # synthetic: a root given it is none of its business
        params = {k: v for k, v in params.items() if k != "root"}
    filled_in = tuple(p for p in FILLED_IN.get(kind, ()) if registry.accepts(kind, name, p))
    checked = plugin_params(registry, kind, name, params, filled_in=filled_in)
    try:
        run_check(component, {p: copy.deepcopy(checked[p]) for p in component.params}, None)
    except PluginError as exc:  # a check written before create ran checks (it reads the run): the run applies it
        warnings.warn(f"{exc}; fslab.create built it unchecked (outside a run, a check gets context None: "
                      "plugin API 1.8)", stacklevel=2)
    return registry.create(kind, name, **checked)


def describe(kind: str, name: str) -> dict:
    """Name, description, paper, parameters and provider of one component."""
    return get_registry().get(kind, name).describe()
