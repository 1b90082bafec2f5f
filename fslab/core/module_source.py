"""A plugin's module found, and read, without running it.

A lazy target (``"pkg.nets:BigNet"``) is imported only where its component is built, in the run's worker,
since importing it may import torch; a misspelt one failed the run after its folder was made. Where its
module lies (:func:`find_unrun`) and the names it defines at its top level (:func:`defined_names`) tell
most such typos before a run exists, with nothing of the module run: no package's ``__init__`` either.
A plugin that failed to load is read so too: whether its source names a component (:func:`spells`).
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path
from typing import Any

# What every module has without defining it.
IMPLICIT = {"__name__", "__doc__", "__file__", "__spec__", "__loader__", "__package__", "__path__",
            "__builtins__", "__cached__", "__dict__", "__annotations__"}
# Calls with which a module may define names its source does not spell (vars() with no arguments too).
DYNAMIC_CALLS = {"globals", "locals", "exec"}  # locals() at the top level is the module's namespace


def find_unrun(module_name: str) -> Any:
    """The spec of ``module_name`` as the import system finds it, its packages looked into, never run (a
    module already imported: its own spec). A ModuleNotFoundError, worded and named as Python's, where it or
    a package above it is nowhere: ``No module named 'pkg.lossez'``."""
    spec, path = None, None
    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__spec__", None) is not None:
            spec, path = loaded.__spec__, getattr(loaded, "__path__", None)
            continue
        if depth > 1 and path is None:
            parent = ".".join(parts[:depth - 1])
            raise ModuleNotFoundError(f"No module named '{name}'; '{parent}' is not a package", name=name)
        spec = _find(name, path)
        if spec is None:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        path = spec.submodule_search_locations
    return spec


def _find(name: str, path: Any) -> Any:
    """What the first finder of ``sys.meta_path`` that knows ``name`` (in ``path``, a package's) finds, or None;
    a top-level module in the current folder too."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None if path is None else list(path))
        except (ImportError, ValueError):  # a finder that cannot tell: the import would say
            continue
        if spec is not None:
            return spec
    if path is None:  # the worker runs as python -m, with this folder first on its sys.path, as `fslab` has not
        from importlib.machinery import PathFinder

        return PathFinder.find_spec(name, [os.getcwd()])
    return None


def submodules(package_name: str) -> list[str]:
    """The modules of the package ``package_name`` (none for '' or one that is nowhere), none of them run."""
    import pkgutil

    if not package_name:
        return []
    try:
        locations = find_unrun(package_name).submodule_search_locations
    except (ImportError, ValueError):
        return []
    return [m.name for m in pkgutil.iter_modules(list(locations or []))]


def defined_names(module_name: str) -> set[str] | None:
    """The names module ``module_name`` defines at its top level (a package's modules too), read from its
    source; None where they cannot be told so (no Python source, one that does not parse, or that defines
    names its text does not spell: ``from x import *``, ``globals()``, a module ``__getattr__``). A module
    already imported: its attributes. A ModuleNotFoundError as :func:`find_unrun`'s."""
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        return None if hasattr(loaded, "__getattr__") else set(dir(loaded))
    spec = find_unrun(module_name)
    source = _source(spec)
    if source is None:
        return None
    try:
        names = _bound(ast.parse(source))
    except (SyntaxError, ValueError, _Dynamic):
        return None
    return names | IMPLICIT | set(submodules(module_name) if spec.submodule_search_locations else ())


def _source(spec: Any) -> str | None:
    """The text of a spec's Python source, or None (an extension module, a zip without sources)."""
    get_source = getattr(spec.loader, "get_source", None)
    if get_source is None or not str(spec.origin or "").endswith(".py"):
        return None
    try:
        return get_source(spec.name)
    except (ImportError, OSError, UnicodeDecodeError):
        return None


class _Dynamic(Exception):
    """A module that may define names its source does not spell."""


def _bound(tree: ast.Module) -> set[str]:
    """The names bound at the module's top level (in its if, try, with and for blocks too, and those its
    functions declare ``global``); :class:`_Dynamic` for a module that may bind others (:func:`_dynamic`, a
    module ``__getattr__``)."""
    names: set[str] = set()
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif _dynamic(node):
            raise _Dynamic
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, scopes):
            if getattr(node, "name", "") == "__getattr__":  # a module's own __getattr__ answers any name
                raise _Dynamic
            names.update([node.name] if not isinstance(node, ast.Lambda) else [])
            continue  # what is bound inside is its own
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        todo.extend(ast.iter_child_nodes(node))
    return names


def _dynamic(node: ast.AST) -> bool:
    """Whether ``node`` may bind a module's names its source does not spell: ``from x import *``, ``globals()``,
    ``locals()``, ``vars()``, ``exec(...)``, ``sys.modules`` (a module replaced, or set an attribute of)."""
    if isinstance(node, ast.alias):
        return node.name == "*"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in DYNAMIC_CALLS or (node.func.id == "vars" and not node.args)
    return (isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def files_of(module_name: str, most: int = 200) -> list[Path]:
    """The Python files of module ``module_name``, found, not run: its own, or a package's (``most`` at most);
    none where it is nowhere or has no source."""
    try:
        spec = find_unrun(module_name)
    except (ImportError, ValueError):
        return []
    if spec.submodule_search_locations:
        return sorted(f for folder in spec.submodule_search_locations for f in Path(folder).rglob("*.py"))[:most]
    return [Path(spec.origin)] if str(spec.origin or "").endswith(".py") else []


def spells(files: list[Path], word: str) -> bool:
    """Whether one of ``files`` spells ``word`` in quotes (``name="margin"``, as a register call names a
    component): what a plugin that failed to load would have registered, read from its source."""
    quoted = re.compile(rf"""(['"]){re.escape(word)}\1""")
    for file in files:
        try:
            if quoted.search(file.read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False
