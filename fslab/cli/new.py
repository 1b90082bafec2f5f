"""``fslab new plugin``: the start of a plugin package (the templates are in :mod:`fslab.kit`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from fslab.cli.common import app, console, shown

new_app = typer.Typer(no_args_is_help=True, rich_markup_mode="rich",
                      help="Start something new from a template: [bold]fslab new plugin NAME[/bold].")
app.add_typer(new_app, name="new")


def _kinds(incomplete: str) -> list[str]:
    from fslab.kit import KINDS

    return [k for k in KINDS if k.startswith(incomplete)]


@new_app.command()
def plugin(
    name: Annotated[str, typer.Argument(metavar="NAME",
                                        help="Package name (lowercase letters, digits and _, from a letter, not ending "
                                             "in _), also the folder ./NAME; its components are named NAME with - "
                                             "for _, a name no installed component of their kind may have.")],
    kind: Annotated[list[str] | None, typer.Option(
        "--kind", metavar="KIND",
        help="A component to include: loss, backbone, sampler, evaluator, dataset, method, sink or study (repeatable; "
             "default: loss).", autocompletion=lambda incomplete: _kinds(incomplete))] = None,
) -> None:
    """Write a pip-installable fslab plugin package into ./NAME, with tests that run fslab's contracts.

    The package has a pyproject.toml with fslab's entry points, one working example module per --kind, a
    README and tests (fslab.testing). Then: pip install -e './NAME\\[test]' && (cd NAME && pytest); the test
    extra installs pytest, which fslab itself does not need."""
    from fslab.core.errors import UnknownName
    from fslab.kit import KINDS, check_free, check_name, write_plugin

    kinds = kind or ["loss"]
    for k in kinds:
        if k not in KINDS:
            raise UnknownName("plugin kind", k, KINDS)
    folder = Path(name)
    check_name(name, folder)
    installed = _installed()
    if installed is not None:
        check_free(name, kinds, installed)
    paths = write_plugin(folder, name, kinds)
    for path in paths:
        console.print(f"wrote {shown(path)}", highlight=False)
    # the package's test extra brings pytest, which an fslab installed without its own test extra lacks
    console.print(f"next: pip install -e './{name}[test]' && (cd {name} && pytest)", markup=False, highlight=False)


def _installed():
    """The components installed now, whose names a new package's must not take: every plugin's,
    those FSLAB_PLUGINS leaves out too (installed, the package's would meet them once it is unset).
    A plugin that fails to load is no concern here, nor is a broken fslab.toml: then the entry points'
    components are read without its plugin folders, so the built-ins still count."""
    from fslab.core.errors import FslabError
    from fslab.core.registry import load_registry
    from fslab.core.settings import load_settings

    only = os.environ.pop("FSLAB_PLUGINS", None)
    try:
        try:
            folders = load_settings().plugin_dirs
        except FslabError:
            folders = ()
        return load_registry(folders, strict=False)
    except FslabError:  # two plugins registering one name: every command says so
        return None
    finally:
        if only is not None:
            os.environ["FSLAB_PLUGINS"] = only
