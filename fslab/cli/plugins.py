"""``fslab plugins`` and ``fslab tui``."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from fslab.cli.common import JsonFlag, WideFlag, app, console, err_console, settings, shown
from fslab.cli.tables import Col, fit, print_table
from fslab.core.assignments import assignment

# The plugins tables give way in this order when the width is short (fslab.cli.tables);
# descriptions and parameters wrap rather than being cut.
PLUGIN_COLUMNS = [Col("name", is_id=True), Col("description", wrap=True), Col("paper", wrap=True),
                  Col("parameters", wrap=True), Col("plugin")]
PLUGIN_STEPS = ["plugin", "paper"]
# fslab tui's shortest --tick: at 1e-5 s its timers left the dashboard no time to draw (it hung).
MIN_TICK_S = 0.1


def _kinds(incomplete: str) -> list[str]:
    from fslab.core.registry import KINDS

    return [k for k in KINDS if k.startswith(incomplete)]


@app.command()
def plugins(
    kind: Annotated[list[str] | None, typer.Option(
        "--kind", metavar="KIND",
        help="Only this kind: loss, backbone, sampler, evaluator, dataset, method, study or sink "
             "(repeatable: --kind loss --kind sampler).",
        autocompletion=lambda incomplete: _kinds(incomplete))] = None,
    as_json: JsonFlag = False,
    wide: WideFlag = False,
) -> None:
    """List every registered plugin component, grouped by kind, with its parameters and origin.

    Each parameter is shown with its default and, where the plugin declares them, the values it allows.
    A plugin that failed to load is named with its error, and the command then exits with 1.
    """
    from fslab.core.listing import plugin_listing
    from fslab.core.registry import failure_line

    # the listing, not the registry: read back from the cache while no plugin changed (fslab.core.listing)
    found = plugin_listing(settings(store=False).plugin_dirs)
    for plugin, error in found.failures:
        err_console.print(shown(failure_line(plugin, error)), highlight=False)
    kinds = found.kinds
    if kind:
        for k in kind:
            found.check_kind(k)
        kinds = list(dict.fromkeys(kind))  # in the order given, each once
    if as_json:
        for k in kinds:
            for c in found.of_kind(k):
                print(json.dumps(c))
        _fail_if_any(found.failures)
        return
    for k in kinds:
        rows = [[c["name"], c["description"], c["paper"], _parameters(c), c["version"] or c["plugin"]]
                for c in found.of_kind(k)]
        print_table(console, lambda width, rows=rows, k=k: fit(PLUGIN_COLUMNS, rows, width, PLUGIN_STEPS, title=k),
                    wide)
    for plugin, error in found.failures:
        console.print(f"[red]failed[/red] {shown(plugin)}: {shown(error)}")
    _fail_if_any(found.failures)


def _fail_if_any(failures) -> None:
    """Exit code 1 after a listing with a plugin that failed to load, so a script or a CI job
    checking a plugin package sees it (the listing itself is printed whole first)."""
    if failures:
        raise typer.Exit(1)


def _parameters(component: dict) -> str:
    """A method's recipe, or each parameter with its default and what it allows, each value
    as ``--set`` takes it (``distance=euclidean``; ``null`` for a default of None)."""
    if component["kind"] == "method" and isinstance(component.get("recipe"), dict):
        return recipe_text(component["recipe"])
    rules = component.get("allowed", {})
    return ", ".join(_pair(p, v) + (f" ({rules[p]})" if p in rules else "") for p, v in component["params"].items())


def _pair(key: str, value) -> str:
    try:
        return assignment(key, value)
    except TypeError:  # a third-party default no setting can hold (an object): as Python shows it
        return f"{key}={value!r}"


def recipe_text(recipe: dict) -> str:
    """A recipe's settings as ``key=value`` pairs, then what it states per
    dataset: ``..., on omniglot: sampler.ways=16, train.milestones=[]``, each pair as
    ``--set`` takes it (``loss.name=nca``)."""
    def pairs(layer: dict, prefix: str = "") -> list[str]:
        out = []
        for key, value in layer.items():
            if isinstance(value, dict):
                out += pairs(value, f"{prefix}{key}.")
            else:
                out.append(_pair(f"{prefix}{key}", value))
        return out

    per_dataset = recipe.get("per_dataset", {})
    text = ", ".join(pairs({k: v for k, v in recipe.items() if k != "per_dataset"}))
    return "".join([text, *(f"; on {name}: {', '.join(pairs(layer))}" for name, layer in per_dataset.items())])


@app.command()
def tui(
    tick: Annotated[float, typer.Option(help="Seconds between two reads of the run store (0.1 or more).")] = 1.0,
    web: Annotated[bool, typer.Option(
        "--web", help="Serve the dashboard to a browser instead (needs pip install 'fslab\\[web]').")] = False,
    host: Annotated[str | None, typer.Option(
        help="With --web: the address to listen on; loopback is this machine only (from another one: an SSH "
             "tunnel), any other requires a token; IPv6 bare or in brackets (default: 127.0.0.1).",
        show_default=False)] = None,
    port: Annotated[int | None, typer.Option(help="With --web: the port to listen on (default: 8000).",
                                             show_default=False)] = None,
    token: Annotated[str | None, typer.Option(
        help="With --web: require this token (made up when the host is not loopback and none is given).")] = None,
) -> None:
    """Open the live dashboard: every run, its charts and logs; stop, resume, delete and launch runs.

    With --web it is served over HTTP instead, one dashboard per browser tab, at the URL it prints
    (with the SSH tunnel that reaches it from another machine); Ctrl+C stops it.
    """
    if not MIN_TICK_S <= tick < float("inf"):  # also refuses nan, which compares false
        from fslab.core.errors import UsageError

        raise UsageError(f"--tick must be a number of seconds from {MIN_TICK_S} up, got {tick}; e.g. --tick 1")
    if web:
        _serve("127.0.0.1" if host is None else host, 8000 if port is None else port, token, tick)
        return
    if given := [name for name, value in (("--host", host), ("--port", port), ("--token", token)) if value is not None]:
        from fslab.core.errors import UsageError

        raise UsageError(f"{given[0]} applies only with --web (fslab tui --web {given[0]} ...); without --web the "
                         f"dashboard opens in this terminal")
    from fslab.tui import make_app

    if "web_driver" in os.environ.get("TEXTUAL_DRIVER", ""):  # a browser tab's dashboard, run by fslab tui --web:
        os.setpgrp()  # Ctrl+C in the server's terminal is the server's to handle (it ends its dashboards)
    project = settings()  # a broken fslab.toml is one line here; the dashboard reads it again for each launch
    app = make_app(project.runs_dir, tick=tick)
    app.run()
    if app.return_code:  # the dashboard stopped on an error (Textual printed it): say so to the shell
        raise typer.Exit(app.return_code)


def _serve(host: str, port: int, token: str | None, tick: float) -> None:
    """``fslab tui --web``: every mistake one line, before anything listens."""
    import errno
    import importlib.util
    import socket

    from fslab.core.errors import UsageError

    if importlib.util.find_spec("textual_serve") is None:
        raise UsageError("fslab tui --web needs textual-serve: pip install 'fslab[web]'")
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be from 1 to 65535, got {port}")
    if token is not None and (len(token) < 8 or not token.isprintable() or " " in token):
        raise UsageError("--token must be at least 8 printable characters without spaces")
    settings()  # a broken fslab.toml is said here once, not in every browser tab
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it: [::1]
        host = host[1:-1]
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        mend = ("give --host an address of this machine" if isinstance(exc, socket.gaierror)
                or exc.errno == errno.EADDRNOTAVAIL else "choose another --port (or --host)")
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {mend}") from None
    from fslab.tui.web import serve

    serve(host, port, token, tick)
