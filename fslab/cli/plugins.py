"""``fslab plugins`` and ``fslab tui``."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from fslab.cli.common import JsonFlag, app, console, registry, settings, shown


@app.command()
def plugins(
    kind: Annotated[str | None, typer.Option(
        help="Only this kind: loss, backbone, sampler, evaluator, dataset, method or study.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List every registered plugin component, grouped by kind, with its origin; each parameter with
    its default and, where the plugin declares them, the values it allows."""
    from fslab.core.registry import KINDS, check_kind

    found = registry()
    kinds = KINDS
    if kind is not None:
        check_kind(kind)
        kinds = (kind,)
    components = [found.get(k, n) for k in kinds for n in found.names(k)]
    if as_json:
        for c in components:
            print(json.dumps(c.describe(), default=str))
        return
    for k in kinds:
        table = Table("name", "description", "paper", "parameters", "plugin", title=f"{k}", title_justify="left")
        for c in components:
            if c.kind == k:
                rules = c.allowed_text()
                params = recipe_text(c.target) if k == "method" and isinstance(c.target, dict) else ", ".join(
                    f"{p}={v!r}" + (f" ({rules[p]})" if p in rules else "") for p, v in c.params.items())
                table.add_row(shown(c.name), shown(c.description), shown(c.paper), shown(params),
                              shown(c.version or c.plugin))
        console.print(table)
    for failure in found.failures:
        console.print(f"[red]failed[/red] {shown(failure.plugin)}: {shown(failure.error)}")


def recipe_text(recipe: dict) -> str:
    """A recipe's settings as ``key=value`` pairs, then what it states per
    dataset: ``..., on omniglot: sampler.ways=16, train.milestones=[]``."""
    def pairs(layer: dict, prefix: str = "") -> list[str]:
        out = []
        for key, value in layer.items():
            if isinstance(value, dict):
                out += pairs(value, f"{prefix}{key}.")
            else:
                out.append(f"{prefix}{key}={value!r}")
        return out

    per_dataset = recipe.get("per_dataset", {})
    text = ", ".join(pairs({k: v for k, v in recipe.items() if k != "per_dataset"}))
    return "".join([text, *(f"; on {name}: {', '.join(pairs(layer))}" for name, layer in per_dataset.items())])


@app.command()
def tui(
    tick: Annotated[float, typer.Option(help="Seconds between two reads of the run store.")] = 1.0,
) -> None:
    """Open the live dashboard: every run, its charts and logs; stop, resume and launch runs."""
    from fslab.tui import make_app

    project = settings()
    app = make_app(project.runs_dir, settings=project, tick=tick)
    app.run()
    if app.return_code:  # the dashboard stopped on an error (Textual printed it): say so to the shell
        raise typer.Exit(app.return_code)
