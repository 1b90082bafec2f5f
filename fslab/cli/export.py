"""``fslab export``: replay finished runs into a sink (TensorBoard, MLflow, W&B, ...)
through :mod:`fslab.execution.export`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from fslab.cli.common import (
    JsonFlag,
    app,
    console,
    err_console,
    names_of,
    registry,
    runs_or_sweeps,
    settings,
    shown,
)
from fslab.core.errors import UsageError, interrupted_code
from fslab.core.text import count


@app.command("export")
def export_(
    refs: Annotated[list[str], typer.Argument(
        metavar="RUN|SWEEP", help="Runs or sweeps (ids or unique parts of ids, or runs' folders: runs/ID); "
                                  "'all' for every run.",
        autocompletion=runs_or_sweeps)],
    to: Annotated[str, typer.Option(
        "--to", metavar="SINK", help="The sink to replay them into: tensorboard, mlflow, wandb or any installed sink "
                                     "(fslab plugins --kind sink).", autocompletion=names_of("sink"))],
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="A parameter of the sink, e.g. --set tracking_uri=http://mlflow.lab:5000 (repeatable); over the run's own "
             "and fslab.toml's \\[run.sinks.SINK].")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Replay finished runs into a sink, so runs made before it was chosen join it.

    Exporting a run again replaces what the earlier export (or the live run) wrote there, never adds a copy;
    two exports of one run to one sink at once (another shell, fslab eval's new scores) take turns, the second
    saying on stderr that it waits, as does an export of a run whose worker is still closing its own sinks.
    Runs still queued or running, or whose status.json cannot be read (they may not have ended), are left out,
    each said in one line. The command fails if it exported none,
    or if the sink failed on a run (that run's error: line; the others are still exported); a Ctrl-C keeps
    the runs said exported and the earlier record of the one it was exporting;
    a tracking server that does not answer within 10 s stops it at once, in one line, as does a sink's
    folder on a read-only file system (a copy of a store): point the sink elsewhere with --set. A sink that
    refuses where it is told to write (an MLflow store copied from elsewhere) is one line for the command,
    naming how many runs it concerns (exit code 2); the other runs are still exported. A run folder
    this user may not write (another user's store) is that run's line, naming the --set keys that point it
    elsewhere; the other runs are still tried.
    Scores of a run's network in another precision than its own (fslab eval --precision) are not sent:
    the tracker would show them in the place of its own.
    """
    from fslab.cli.launch import sigterm_as_interrupt
    from fslab.core.sweeps import select_runs
    from fslab.execution.export import checked_layers

    project = settings()
    found = registry(project)
    found.get("sink", to)  # an unknown sink: one line naming the installed ones
    # a wrong --set or [run.sinks.SINK] of fslab.toml: one line before any run is touched
    given_as: dict[str, str] = {}
    layers = checked_layers(found, project, to, _command_layer(found, to, set_ or [], given_as), given_as)
    chosen = select_runs(project.runs_dir, refs, "export")
    try:  # Ctrl-C, or a SIGTERM as Ctrl-C: one line, where it ended the command with no word
        with sigterm_as_interrupt():
            exported, skipped, failed, refused = _export_each(found, chosen, to, layers, as_json)
    except KeyboardInterrupt as interrupt:
        err_console.print(f"fslab export interrupted among {count(len(chosen), 'run')}: those said above were "
                          f"exported, the one it was exporting keeps its earlier record in {to}; the same command "
                          f"again exports them all", highlight=False)
        raise typer.Exit(interrupted_code(interrupt)) from None
    if not as_json and (exported or skipped or failed):  # every run refused alike: that one line alone
        console.print(f"exported {count(exported, 'run')} to {to}"
                      + (f"; {skipped} left out" if skipped else "")
                      + (f"; {failed} failed in the sink" if failed else "")
                      + (f"; {refused} refused by it" if refused else ""), highlight=False)
    if failed or (exported == 0 and not refused):
        raise typer.Exit(1)
    if refused:  # what the sink was told to write into, which --set changes: as any refusal of the command's
        raise typer.Exit(2)


def _export_each(found, chosen: list, to: str, layers: list[dict], as_json: bool) -> tuple[int, int, int, int]:
    """Export each run chosen, each said in a line as it is done; returns how many were exported, left out,
    failed in the sink and refused by it (:func:`_say_refused`)."""
    from fslab.execution.export import SinkCannotWrite, SinkFailed, SinkRefused, SinkUnavailable, export_run

    exported, skipped, failed = 0, 0, 0
    refused: dict[str, list[str]] = {}  # the sink's refusal, the same for each run it concerns: the runs
    for run in chosen:
        try:
            done = export_run(found, run, to, layers)
        except (SinkUnavailable, SinkCannotWrite):
            raise  # its package is missing, or its folder read-only: one line, and no other run is tried
        except SinkRefused as exc:  # its store or parameters: said once for the command, after the others
            refused.setdefault(str(exc), []).append(run.id)
            continue
        except SinkFailed as exc:  # an error, unlike a run left out: the command fails at its end
            failed += 1
            err_console.print(f"error: {shown(str(exc))}", highlight=False)
            continue
        except UsageError as exc:
            skipped += 1
            err_console.print(shown(str(exc)), highlight=False)
            continue
        exported += 1
        if as_json:
            print(json.dumps(done))
        else:
            console.print(f"{done['run']} ({done['state']}): {count(done['events'], 'event')} -> {to}", highlight=False)
    _say_refused(refused)
    return exported, skipped, failed, sum(map(len, refused.values()))


def _say_refused(refused: dict[str, list[str]]) -> None:
    """One ``error:`` line for each refusal of the sink (a copied MLflow store's experiment), naming the run
    it concerns or how many, where it was the same line again for every run."""
    for reason, run_ids in refused.items():
        runs = f"run {run_ids[0]}" if len(run_ids) == 1 else count(len(run_ids), "run")
        err_console.print(f"error: {runs} not exported: {shown(reason)}", highlight=False)


def _command_layer(found, to: str, assignments: list[str], given_as: dict[str, str]) -> dict:
    """``--set log_dir=/shared/tb`` (or ``sinks.tensorboard.log_dir=...``) -> ``{"log_dir": "/shared/tb"}``;
    anything else is one line naming the sink's parameters (not ``train.lr=0.05``, --set's example for a run).
    ``given_as`` gets each parameter's key as written, for the messages about it."""
    from fslab.core.assignments import parse_assignment
    from fslab.core.keys import SINKS

    command = {}
    for text in assignments:
        key, sep, _ = text.partition("=")
        path, value = parse_assignment(text) if sep and key.strip() else ([], None)
        if path[:2] == [SINKS, to]:
            path = path[2:]
        if len(path) != 1:
            allowed = ", ".join(sorted(found.get("sink", to).params)) or "none"
            raise UsageError(f"--set takes KEY=VALUE for a parameter of sink '{to}' ({allowed}), got '{text}'")
        command[path[0]] = value
        given_as[path[0]] = key.strip()
    return command
