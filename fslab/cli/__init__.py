"""The ``fslab`` command line: one module per group of commands.

- :mod:`fslab.cli.launch`: run, resume, stop, sweep, queue (through :mod:`fslab.execution.executor`);
- :mod:`fslab.cli.runs`: runs, show, logs (through :mod:`fslab.core.summary`);
- :mod:`fslab.cli.reports`: eval, compare, plot;
- :mod:`fslab.cli.plugins`: plugins, and tui (the dashboard).

A new command goes in the module of its group (or a new one imported below)
and registers on :data:`fslab.cli.common.app`. Heavy modules (torch) are
imported inside the commands that need them, never here.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

# Each module registers its commands; `fslab --help` lists them in this order.
from fslab.cli import launch  # noqa: F401

# isort: split
from fslab.cli import runs  # noqa: F401

# isort: split
from fslab.cli import reports  # noqa: F401

# isort: split
from fslab.cli import plugins  # noqa: F401
from fslab.cli.common import app, version_callback
from fslab.core.errors import FslabError
from fslab.core.text import clip, printable


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                          help="Show the version.")] = False,
) -> None:
    """fslab: few-shot learning runs from the command line."""


def main() -> None:
    """Console entry point: an FslabError is one line on stderr and an exit
    code; so is a file the system refused (a full disk, a read-only store,
    another user's folder), naming the file."""
    try:
        app()
    except FslabError as exc:
        fail(str(exc), exc.exit_code)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        fail(f"{exc.strerror or exc}{where}", 1)


def fail(message: str, code: int) -> None:
    """One line on stderr, with nothing in it that could drive the terminal, and the exit code."""
    print(f"error: {clip(printable(message))}", file=sys.stderr)
    sys.exit(code)
