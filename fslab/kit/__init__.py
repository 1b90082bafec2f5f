"""The plugin author kit: ``fslab new plugin NAME`` writes a package that
installs with pip and passes its own tests (fslab's contracts) at once.

The files are templates in ``templates/`` (package data), filled in by
:func:`write_plugin`; ``{{key}}`` marks a value. No torch is imported here.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import keyword
import re
import sys
import unicodedata
from importlib.resources import files
from pathlib import Path

from fslab import __version__
from fslab.core.errors import UsageError
from fslab.core.registry import KINDS  # every kind the kit writes a template for

# Names --set reads as TOML values (a boolean, a number), not as the component a package names so.
VALUES = ("true", "false", "inf", "nan")
# What a recipe uses where the package has no component of that kind.
BUILT_IN = {"loss": "nca", "sampler": "iid", "evaluator": "centroid"}
USE = {
    "loss": "fslab run nca --set loss.name={c}",
    "backbone": "fslab run nca --backbone {c}",
    "sampler": "fslab run nca --set sampler.name={c}",
    "evaluator": "fslab eval last --evaluator {c}",
    "dataset": "fslab run nca --dataset {c}",
    "method": "fslab run {c}",
    "sink": "fslab run nca --sink {c}",
    "study": "fslab study show {c}",
}


LONGEST = 100  # characters of a package's name: its files' names (the wheel's is about 30 more) stay under 255


def check_name(name: str, folder: Path) -> None:
    """A UsageError unless ``name`` can be a Python package that no importable
    module already has (``fslab``, ``torch``, the standard library's ``test``),
    nor an installed distribution (``pillow``, whose module is ``PIL``), and
    ``folder`` is free."""
    if len(name) > LONGEST:  # a file name of the package (NAME.egg-info, the wheel's) past what a file system takes
        raise UsageError(f"'{name[:40]}...' is {len(name)} characters long; a package name may have at most "
                         f"{LONGEST}: choose a shorter one")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise UsageError(f"'{name}' is not a valid package name: use lowercase letters, digits and _, "
                         f"starting with a letter (e.g. {_spelt(name)})")
    if name.endswith("_"):  # pip refuses the distribution's name, NAME with - for _, ending in -
        raise UsageError(f"'{name}' is not a valid package name: its distribution would be named "
                         f"'{name.replace('_', '-')}', and pip refuses a name ending in -; end it with a letter "
                         f"or digit (e.g. {_spelt(name)})")
    if name in VALUES:
        raise UsageError(f"'{name}' cannot name a plugin's components: --set loss.name={name} reads it as a TOML "
                         f"{'boolean' if name in ('true', 'false') else 'number'}, not a name; choose another "
                         f"(e.g. fslab_{name})")
    if keyword.iskeyword(name):
        raise UsageError(f"'{name}' is not a valid package name: it is a Python keyword; choose another "
                         f"(e.g. fslab_{name})")
    if folder.exists() or folder.is_symlink():  # a link to nothing is there too: mkdir would fail on it
        raise UsageError(f"{folder} already exists; choose another name or remove it")
    if name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None:
        raise UsageError(f"'{name}' is already the name of an importable module (the standard library's or an "
                         f"installed one); a plugin package of that name would hide it or be hidden by it: "
                         f"choose another (e.g. {_another(name)})")
    installed = _distribution(name.replace("_", "-"))
    if installed is not None:  # pillow: the module is PIL, and pip install -e ./pillow would uninstall Pillow
        raise UsageError(f"'{name}' would be installed as the distribution '{name.replace('_', '-')}', the name of "
                         f"the installed {installed}, which pip would uninstall for it: choose another "
                         f"(e.g. {_another(name)})")


def _distribution(dist: str) -> str | None:
    """``Pillow 11.0.0``: the installed distribution named ``dist`` (as pip compares names), or None."""
    import importlib.metadata

    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    return f"{found.metadata['Name']} {found.version}"


def _spelt(name: str) -> str:
    """``name`` as a package name (``My-Loss``: ``my_loss``, ``Café``: ``cafe``), or an example where
    nothing of it is one."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    words = re.sub(r"[^a-z0-9]+", "_", ascii_name.lower()).strip("_")
    if not words:
        return "fslab_margin"
    if not words[0].isalpha() or keyword.iskeyword(words) or words in VALUES:
        return f"fslab_{words}"
    return _another(words) if words in sys.stdlib_module_names or importlib.util.find_spec(words) else words


def check_free(name: str, kinds: list[str], registry) -> None:
    """A UsageError if a component the package ``name`` would register (each of ``kinds``, named
    ``name`` with ``-`` for ``_``) is registered already: once both were installed, every fslab
    command would fail on the name registered twice."""
    component = name.replace("_", "-")
    for kind in kinds:
        if component in registry.names(kind):
            raise UsageError(f"'{name}' would register the {kind} '{component}', which plugin "
                             f"'{registry.get(kind, component).plugin}' registers already; installed beside it, "
                             f"every fslab command would fail on the name: choose another (e.g. {_another(name)})")


def _another(name: str) -> str:
    return f"{name}_plugin" if name.startswith("fslab_") else f"fslab_{name}"


def write_plugin(folder: Path, name: str, kinds: list[str]) -> list[Path]:
    """Write the package ``name`` with one module per kind into ``folder``; the paths written."""
    kinds = [k for k in KINDS if k in kinds]  # fslab's order, each once
    values = _values(name, kinds)
    written = {
        "pyproject.toml": "pyproject.toml",
        "README.md": "README.md",
        f"{name}/__init__.py": "init.py",
        "tests/test_contracts.py": "test_contracts.py",
        **{f"{name}/{kind}.py": f"{kind}.py" for kind in kinds},
        # the backbone's network, imported only when a run builds it (backbone.py names it lazily)
        **({f"{name}/network.py": "network.py"} if "backbone" in kinds else {}),
        **({f"{name}/studies/{values['component']}.toml": "study.toml"} if "study" in kinds else {}),
    }
    folder.mkdir(parents=True)
    paths = []
    for relative, template in written.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_fill(template, values))
        paths.append(path)
    return paths


def _values(name: str, kinds: list[str]) -> dict[str, str]:
    component = name.replace("_", "-")
    plugins = [f"{name}_{kind}" for kind in kinds]
    recipe = {kind: {"name": component if kind in kinds else BUILT_IN[kind]} for kind in BUILT_IN}
    for kind in ("backbone", "dataset"):
        if kind in kinds:
            recipe[kind] = {"name": component}
    return {
        "name": name,
        "dist": component,
        # the fslab it was written for, at least (docs/plugins.md, "Publishing")
        "requires_fslab": "fslab>=" + ".".join(__version__.split(".")[:2]),
        "component": component,
        "kinds": ", ".join(kinds),
        "entry_points": "\n".join(f'{plugin} = "{name}.{kind}"' for plugin, kind in zip(plugins, kinds)),
        "plugins": repr(plugins),
        "recipe": repr(recipe),
        # what it trains, fslab's built-ins named where the package has no component of their kind
        "recipe_description": ", ".join(f"{kind} {section['name']}" for kind, section in recipe.items()),
        "module_table": "\n".join(f"| `{name}/{kind}.py` | {kind} `{component}` |" for kind in kinds)
        + (f"\n| `{name}/network.py` | the backbone's network, imported only when a run builds it |"
           if "backbone" in kinds else ""),
        "use_lines": "\n".join("    " + USE[kind].format(c=component) for kind in kinds),
        # the study's sweep trains the package's own recipe where it has one
        "study_method": component if "method" in kinds else "nca",
        "year": str(datetime.date.today().year),
        # study files are data: a wheel carries them only when the package says so (their folder
        # listed as a package too, or setuptools warns about it at every install)
        "packages": json.dumps([name, f"{name}.studies"] if "study" in kinds else [name]),
        "package_data": (f'\n[tool.setuptools.package-data]\n"{name}.studies" = ["*.toml"]\n'
                         if "study" in kinds else ""),
    }


def _fill(template: str, values: dict[str, str]) -> str:
    text = files("fslab.kit").joinpath("templates", f"{template}.tmpl").read_text()
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], text)
