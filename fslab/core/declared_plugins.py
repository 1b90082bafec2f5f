"""Entry points a ``pyproject.toml`` declares that the installed metadata lacks.

fslab finds plugins through the installed distributions' entry points, written when a package is
installed: one added to ``[project.entry-points.fslab]`` afterwards (a new plugin module of a package
installed with ``pip install -e .``, fslab's own ``plugins/`` included) is not loaded until the package
is installed again, and a run naming its component was told only ``Unknown loss 'x'``. The
``pyproject.toml`` of the current folder, and those of the packages installed editable, are read to
say so (:func:`stale_entry_point`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from fslab.core.module_source import files_of, spells

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GROUP = "fslab"


def stale_entry_point(name: str) -> str:
    """For a component ``name`` that no plugin registers: where an entry point declared in a
    ``pyproject.toml`` but missing from its installed distribution's metadata is named ``name``, or names a
    module whose source spells it, a sentence saying so, with the command that installs it again; else ''."""
    if not isinstance(name, str):
        return ""
    for folder, project, installed in _projects():
        declared = project.get("entry-points", {}).get(GROUP, {})
        have = {} if installed is None else {ep.name: ep.value for ep in installed.entry_points
                                             if ep.group == GROUP}
        for entry, value in declared.items() if isinstance(declared, dict) else ():
            if have.get(entry) == value or not isinstance(value, str):
                continue
            if entry == name or spells(files_of(value.partition(":")[0].strip()), name):
                return _sentence(folder, project, installed, entry, value)
    return ""


def _sentence(folder: Path, project: dict, installed: Any, entry: str, value: str) -> str:
    where = "." if folder == Path.cwd().resolve() else str(folder)
    line = f"the entry point '{entry} = \"{value}\"' of {folder / 'pyproject.toml'} may register it, but "
    if installed is None:
        return (f"{line[0].upper()}{line[1:]}{project.get('name', 'its project')} is not installed: install it "
                f"with: pip install -e {where}")
    label = f"{installed.metadata['Name']} {installed.metadata['Version']}"
    return (f"{line[0].upper()}{line[1:]}the installed {label} lacks it (installed before it was added): install "
            f"it again to refresh its entry points: pip install -e {where}")


def _projects() -> list[tuple[Path, dict, Any]]:
    """Each ``pyproject.toml`` to read, as (its folder, its ``[project]`` table, the installed distribution of
    that project or None): the current folder's, then those of the distributions installed editable."""
    from importlib import metadata

    found: dict[Path, tuple[Path, dict, Any]] = {}
    here = Path.cwd().resolve()
    if (project := _project(here)) is not None and isinstance(project.get("name"), str):
        try:
            found[here] = (here, project, metadata.distribution(project["name"]))
        except metadata.PackageNotFoundError:
            found[here] = (here, project, None)
    for dist in metadata.distributions():
        folder = _editable_folder(dist)
        if folder is not None and folder not in found and (project := _project(folder)) is not None:
            found[folder] = (folder, project, dist)
    return list(found.values())


def _project(folder: Path) -> dict | None:
    """The ``[project]`` table of ``folder/pyproject.toml``, or None (no file, or one that does not parse)."""
    try:
        with open(folder / "pyproject.toml", "rb") as file:
            project = tomllib.load(file).get("project")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    return project if isinstance(project, dict) else None


def _editable_folder(dist: Any) -> Path | None:
    """The source folder of a distribution installed editable (``pip install -e``, PEP 660), or None."""
    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):
        return None
    if not isinstance(url, dict) or not (url.get("dir_info") or {}).get("editable"):
        return None
    parsed = urlparse(str(url.get("url", "")))
    return Path(unquote(parsed.path)).resolve() if parsed.scheme == "file" else None
