"""The ``fslab`` command line. Heavy modules (torch) are never imported here."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fslab import __version__
from fslab.core.errors import FslabError, UsageError

app = typer.Typer(
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="fslab: few-shot learning runs from the command line. Start with [bold]fslab run nca[/bold].",
)
# Piped output is not cut to 80 columns: tables stay whole for grep and files.
console = Console(width=None if sys.stdout.isatty() else 250)
err_console = Console(stderr=True, soft_wrap=True)

RunRef = Annotated[str, typer.Argument(help="Run id, a unique part of it, or 'last'.")]
# The options of `fslab run`, shared with `fslab sweep`.
BackboneOpt = Annotated[Optional[str], typer.Option(help="Backbone plugin, e.g. resnet12 or conv4.")]
DatasetOpt = Annotated[Optional[str], typer.Option(help="Dataset plugin (default: synthetic, built in).")]
DataRootOpt = Annotated[Optional[str], typer.Option(
    help="Folder the dataset reads from (each dataset's layout: README, Datasets); its first run caches the decoded images in ROOT/.fslab-cache.")]
EpochsOpt = Annotated[Optional[int], typer.Option(help="Training epochs.")]
BatchSizeOpt = Annotated[Optional[int], typer.Option(help="Images per training batch.")]
LrOpt = Annotated[Optional[float], typer.Option(help="Initial learning rate.")]
SeedOpt = Annotated[Optional[int], typer.Option(help="Random seed.")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N.")]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", help="Train on N GPUs at once (torchrun + DistributedDataParallel): each GPU embeds 1/N of every "
                   "batch and the loss sees the whole batch. With --device cpu: N gloo CPU processes (testing).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Any config key, e.g. --set loss.temperature=0.9 (repeatable).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ExecutorOpt = Annotated[str, typer.Option(help="local (a worker process here) or slurm (a SLURM job through submitit, settings in \\[slurm] of fslab.toml).")]
SlurmOpt = Annotated[Optional[list[str]], typer.Option("--slurm", help="With --executor slurm: override a \\[slurm] setting, e.g. --slurm partition=gpu (repeatable).")]


def _settings():
    from fslab.core.settings import load_settings

    return load_settings()


def _registry(settings=None):
    import fslab

    return fslab.get_registry(settings, report=lambda line: err_console.print(escape(line), highlight=False))


def _version(value: bool) -> None:
    if value:
        console.print(f"fslab {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
) -> None:
    """fslab: few-shot learning runs from the command line."""


@app.command()
def run(
    method: Annotated[str, typer.Argument(help="Method recipe, e.g. nca or protonet (see fslab plugins --kind method).")],
    backbone: BackboneOpt = None,
    dataset: DatasetOpt = None,
    data_root: DataRootOpt = None,
    epochs: EpochsOpt = None,
    batch_size: BatchSizeOpt = None,
    lr: LrOpt = None,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    set_: SetOpt = None,
    gpus: GpusOpt = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Start the run and return at once, printing its id.")] = False,
    executor: ExecutorOpt = "local",
    slurm: SlurmOpt = None,
) -> None:
    """Start a training run in a new worker process and follow it (or submit it as a SLURM job)."""
    from fslab.execution.launcher import launch

    settings = _settings()
    registry = _registry(settings)
    overrides = _overrides(backbone, dataset, data_root, epochs, batch_size, lr, seed, device, set_, gpus)
    if _check_executor(executor, slurm):
        from fslab.execution import slurm as slurm_

        run_, job_id = slurm_.launch(method, overrides, settings=settings, registry=registry,
                                     options=slurm_.job_options(settings, slurm))
        console.print(run_.id if detach else f"run {run_.id}: submitted as SLURM job {job_id}; "
                      f"follow it with: fslab logs {run_.id} --follow", highlight=False)
        return
    run_, process = launch(method, overrides, settings=settings, registry=registry)
    if detach:
        console.print(run_.id, highlight=False)
        return
    _follow_to_end(run_, process)


def _check_executor(executor: str, slurm: Optional[list[str]]) -> bool:
    """True for --executor slurm; --slurm settings without it are a mistake."""
    from fslab.execution.slurm import check_executor

    if not check_executor(executor) and slurm:
        raise UsageError("--slurm settings apply only with --executor slurm")
    return executor == "slurm"


def _overrides(backbone, dataset, data_root, epochs, batch_size, lr, seed, device, set_, gpus=None) -> list[dict]:
    """Config layers from the options of `fslab run` (then --set, in order)."""
    from fslab.core.config import nest, parse_assignment

    options = {
        ("backbone", "name"): backbone, ("dataset", "name"): dataset, ("dataset", "root"): data_root,
        ("train", "epochs"): epochs, ("train", "batch_size"): batch_size, ("train", "lr"): lr,
        ("seed",): seed, ("device",): device, ("train", "processes"): gpus,
    }
    overrides = [nest(list(path), value) for path, value in options.items() if value is not None]
    return overrides + [nest(*parse_assignment(text)) for text in set_ or []]


def _follow_to_end(run_, process) -> None:
    """Follow a started worker; print the test accuracies, or why it ended."""
    from fslab.core.events import accuracy_text
    from fslab.cli.follow import follow
    from fslab.execution.launcher import stop_run

    console.print(f"run [bold]{run_.id}[/bold] in {escape(str(run_.path))}", highlight=False)
    try:
        state = follow(run_, console, process)
    except KeyboardInterrupt:
        console.print("stopping ...")
        state = stop_run(run_)
        process.wait()
        console.print(f"{run_.id}: {state}; last checkpoint kept in {run_.checkpoint_path}", highlight=False)
        raise typer.Exit(130)
    process.wait()
    results = run_.results()
    if state == "completed" and results:
        for shots, value in results["test"].items():
            console.print(f"test {results['ways']}-way {shots}: {accuracy_text(value)} "
                          f"({results['episodes']} episodes)", highlight=False)
        return
    status = run_.status()
    err_console.print(f"{run_.id}: {state}: {escape(str(status.get('error') or 'no error recorded'))}. "
                      f"See: fslab logs {run_.id} --stderr", highlight=False)
    raise typer.Exit(1)


@app.command()
def resume(
    ref: RunRef,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Resume and return at once.")] = False,
    executor: ExecutorOpt = "local",
    slurm: SlurmOpt = None,
) -> None:
    """Continue a killed, lost or failed run from its last checkpoint, in the same folder
    (a --gpus N run resumes with N processes again)."""
    from fslab.execution.launcher import check_processes, check_resumable, start_worker
    from fslab.core.runstore import find_run

    run_ = find_run(_settings().runs_dir, ref)
    check_resumable(run_)
    if _check_executor(executor, slurm):
        from fslab.execution import slurm as slurm_

        options = slurm_.job_options(_settings(), slurm)
        slurm_.check_job_processes(run_.config(), options)
        slurm_.requeue_for_job(run_)
        console.print(f"run {run_.id}: resuming as SLURM job {slurm_.submit(run_, options)}", highlight=False)
        return
    check_processes(run_.config())
    process = start_worker(run_, resume=True)
    if detach:
        console.print(run_.id, highlight=False)
        return
    _follow_to_end(run_, process)


@app.command()
def tui(
    tick: Annotated[float, typer.Option(help="Seconds between two reads of the run store.")] = 1.0,
) -> None:
    """Open the live dashboard: every run, its charts and logs; stop, resume and launch runs."""
    from fslab.tui import make_app

    settings = _settings()
    make_app(settings.runs_dir, settings=settings, tick=tick).run()


def _pct(value: Optional[dict]) -> str:
    return f"{100 * value['accuracy']:.2f}±{100 * value['ci95']:.2f}" if value else "-"


@app.command()
def runs(as_json: JsonFlag = False) -> None:
    """List the runs in the run store."""
    from fslab.core.runstore import list_runs

    summaries = [r.summary() for r in list_runs(_settings().runs_dir)]
    if as_json:
        for s in summaries:
            print(json.dumps(s))
        return
    table = Table("id", "method", "backbone", "dataset", "seed", "state", "epoch", "loss", "pairs +/-",
                  "best val", "test 1-shot", "test 5-shot")
    for s in summaries:
        test = s["test"] or {}
        table.add_row(
            escape(s["id"]), escape(str(s["method"])), escape(str(s["backbone"])), escape(str(s["dataset"])),
            str(s["seed"]), s["state"], f"{s['epoch'] or 0}/{s['epochs']}",
            f"{s['loss']:.4f}" if s["loss"] is not None else "-",
            f"{s['positives']}/{s['negatives']}" if s["positives"] is not None else "-",
            _pct(s["best_val"]), _pct(test.get("1-shot")), _pct(test.get("5-shot")),
        )
    console.print(table if summaries else "no runs yet; start one with: fslab run nca")


@app.command()
def show(ref: RunRef, as_json: JsonFlag = False) -> None:
    """Show one run: state, configuration, progress and every evaluation."""
    from fslab.core.runstore import find_run

    run_ = find_run(_settings().runs_dir, ref)
    summary = run_.summary()
    detail = {**summary, "path": str(run_.path), "status": run_.status(), "config": run_.config(),
              "evaluations": run_.events_of("eval"), "results": run_.results()}
    if as_json:
        print(json.dumps(detail, indent=2))
        return
    status = detail["status"]
    console.print(f"[bold]{escape(run_.id)}[/bold]  {summary['state']}  ({escape(str(run_.path))})")
    if summary["error"]:
        console.print(f"error: {escape(summary['error'])}")
    console.print(f"method {escape(str(summary['method']))}, backbone {escape(str(summary['backbone']))}, "
                  f"dataset {escape(str(summary['dataset']))}, seed {summary['seed']}, pid {status.get('pid')}")
    if summary["step"]:
        console.print(f"epoch {summary['epoch']}/{summary['epochs']}, step {summary['step']}, loss {summary['loss']:.4f}, "
                      f"pairs +{summary['positives']}/-{summary['negatives']}")
    table = Table("split", "ways", "shots", "queries", "episodes", "epoch", "evaluator", "accuracy (%)")
    for e in detail["evaluations"]:
        metric = e.get("metric", "accuracy")  # retrieval mAP is labelled as such
        table.add_row(e["split"], str(e["ways"]), str(e["shots"]), str(e["queries"]), str(e["episodes"]),
                      str(e.get("epoch", "-")), escape(e.get("evaluator", "-")),
                      _pct(e) if metric == "accuracy" else f"{metric.replace('map', 'mAP')} {_pct(e)}")
    if detail["evaluations"]:
        console.print(table)


@app.command()
def logs(
    ref: RunRef,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="Show the worker's stderr instead of stdout.")] = False,
) -> None:
    """Print a run's output log."""
    from fslab.core.runstore import ENDED, find_run

    run_ = find_run(_settings().runs_dir, ref)
    path = run_.path / ("stderr.log" if stderr else "stdout.log")
    offset = 0
    while True:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            sys.stdout.write(chunk.decode("utf-8", errors="replace"))
            sys.stdout.flush()
            offset += len(chunk)
        if not follow_ or (not chunk and run_.state() in (*ENDED, "lost")):
            return
        time.sleep(0.25)


@app.command()
def stop(ref: RunRef) -> None:
    """Stop a queued or running run (it ends as 'killed', keeping its last checkpoint)."""
    from fslab.execution.launcher import stop_run
    from fslab.core.runstore import find_run

    run_ = find_run(_settings().runs_dir, ref)
    before = run_.state()
    if before not in ("queued", "running"):
        raise UsageError(f"run {run_.id} is {before}, not running; nothing to stop")
    console.print(f"{run_.id}: {stop_run(run_)}", highlight=False)


@app.command()
def plugins(
    kind: Annotated[Optional[str], typer.Option(help="Only this kind: loss, backbone, sampler, evaluator, dataset or method.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List every registered plugin component, grouped by kind, with its origin."""
    from fslab.core.registry import KINDS, check_kind

    registry = _registry()
    kinds = KINDS
    if kind is not None:
        check_kind(kind)
        kinds = (kind,)
    components = [registry.get(k, n) for k in kinds for n in registry.names(k)]
    if as_json:
        for c in components:
            print(json.dumps(c.describe(), default=str))
        return
    for k in kinds:
        table = Table("name", "description", "paper", "parameters", "plugin", title=f"{k}", title_justify="left")
        for c in components:
            if c.kind == k:
                params = ", ".join(f"{p}={v!r}" for p, v in c.params.items())
                table.add_row(escape(c.name), escape(c.description), escape(c.paper), escape(params),
                              escape(c.version or c.plugin))
        console.print(table)
    for failure in registry.failures:
        console.print(f"[red]failed[/red] {escape(failure.plugin)}: {escape(failure.error)}")


def _parse_shots(shots: str) -> list[int]:
    try:
        return [int(s) for s in shots.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--shots takes whole numbers separated by commas (e.g. 1,5), got '{shots}'") from None


@app.command("eval")
def eval_(
    ref: RunRef,
    split: Annotated[str, typer.Option(help="test or val.")] = "test",
    ways: Annotated[int, typer.Option(help="Classes per episode.")] = 5,
    shots: Annotated[str, typer.Option(help="Comma-separated shots, e.g. 1,5.")] = "1,5",
    queries: Annotated[int, typer.Option(help="Queries per class.")] = 15,
    episodes: Annotated[Optional[int], typer.Option(help="Episodes per number of shots (default 10000; 100 for the slow finetune evaluator).")] = None,
    evaluator: Annotated[Optional[str], typer.Option(help="Evaluator plugin: centroid, knn, soft, ap, retrieval-map, sen, finetune... (default: the run's).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="An evaluator parameter, e.g. --set evaluator.k=3 (repeatable).")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N (default: the run's).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Evaluate a run's last checkpoint on fixed-seed episodes (features embedded once and cached).

    retrieval-map scores each episode by its mAP (10 images per class, whatever --shots and --queries say)."""
    from fslab.core.runstore import find_run

    if split not in ("test", "val"):
        raise UsageError(f"--split must be test or val, got '{split}'")
    shot_list = _parse_shots(shots)
    if not shot_list or min(shot_list) < 1 or ways < 2 or queries < 1 or (episodes is not None and episodes < 1):
        raise UsageError("episodes need --ways >= 2, --shots >= 1, --queries >= 1 and --episodes >= 1")
    run_ = find_run(_settings().runs_dir, ref)
    # an unknown evaluator or parameter fails before torch loads
    component = _registry().get("evaluator", evaluator or run_.config().get("evaluator", {}).get("name", "centroid"))
    params = _evaluator_params(set_ or [], component)
    from fslab.core.events import accuracy_text
    from fslab.training.run_eval import evaluate_run

    results = evaluate_run(run_, split=split, ways=ways, shots=shot_list, queries=queries, episodes=episodes,
                           evaluator=evaluator, params=params, device=device)
    for result in results:
        if as_json:
            shown = dict(result)
            if result["metric"] != "accuracy":  # e.g. "map": the score under its own name
                shown[result["metric"]] = shown.pop("accuracy")
            print(json.dumps({"run": run_.id, **shown}))
        else:
            console.print(f"{run_.id} {split} {ways}-way {result['shots']}-shot, {result['episodes']} episodes "
                          f"({escape(result['evaluator'])}, checkpoint of epoch {result['epoch']}): {accuracy_text(result)}",
                          highlight=False)


def _evaluator_params(assignments: list[str], component) -> dict:
    """``--set evaluator.k=3`` -> ``{"k": 3}``, checked against the evaluator's
    parameters and the types of their defaults."""
    from fslab.core.config import parse_assignment
    from fslab.core.errors import did_you_mean

    params = {}
    for text in assignments:
        path, value = parse_assignment(text)
        if len(path) != 2 or path[0] != "evaluator":
            raise UsageError(f"fslab eval --set takes evaluator parameters (evaluator.NAME=VALUE), got '{text}'")
        key = path[1]
        if key not in component.params:
            allowed = ", ".join(sorted(component.params)) or "(none)"
            raise UsageError(f"evaluator '{component.name}' has no parameter '{key}'.{did_you_mean(key, component.params)} "
                             f"Allowed: {allowed}.")
        default = component.params[key]
        numbers = (int, float) if isinstance(default, float) else (int,)
        if isinstance(default, bool) != isinstance(value, bool) or (
                isinstance(default, (int, float)) and not isinstance(value, numbers)):
            raise UsageError(f"evaluator.{key} must be like its default {default!r}, got {value!r}")
        params[key] = float(value) if isinstance(default, float) else value
    return params


@app.command("compare")
def compare_(
    refs: Annotated[list[str], typer.Argument(help="Runs or sweeps (ids or unique parts of ids) to compare; 'all' for every run.")],
    group_by: Annotated[Optional[str], typer.Option(help="Comma-separated config keys to group by (default: every setting but the seed).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, md, latex, csv or json.")] = "table",
    split: Annotated[str, typer.Option(help="test or val.")] = "test",
    shots: Annotated[str, typer.Option(help="Comma-separated shots.")] = "1,5",
    ways: Annotated[int, typer.Option(help="Ways of the evaluations to compare.")] = 5,
    queries: Annotated[int, typer.Option(help="Queries per class of the evaluations to compare.")] = 15,
    evaluator: Annotated[Optional[str], typer.Option(help="Scores saved by this evaluator, e.g. knn or knn[k=3] (default: each run's own).")] = None,
) -> None:
    """Group runs that differ only by seed; pooled accuracy ± 95% CI per group, and paired differences to the first group."""
    from fslab.reports.compare import FORMATS, compare, render, select_runs

    if fmt not in FORMATS:
        raise UsageError(f"unknown format '{fmt}'. Allowed: {', '.join(FORMATS)}.")
    runs = select_runs(_settings().runs_dir, refs)
    shot_list = _parse_shots(shots)
    report = compare(runs, split=split, shots=shot_list, ways=ways, queries=queries,
                     group_by=[k.strip() for k in group_by.split(",")] if group_by else None, evaluator=evaluator)
    if not any(row["results"] for row in report["groups"]):
        raise UsageError(f"none of these runs has saved {split} accuracies for {ways}-way {shots}-shot, "
                         f"{queries} queries; finish them or run: fslab eval RUN")
    if fmt != "table":
        sys.stdout.write(render(report, fmt))
        return
    columns = [f"{n}-shot" for n in shot_list]
    table = Table("group", "seeds", *columns, title=f"{split}, {ways}-way, {queries} queries, mean ± 95% CI over pooled episodes")
    for row in report["groups"]:
        table.add_row(escape(row["group"]), str(row["seeds"]),
                      *[f"{_pct(r)} ({r['episodes']})" if (r := row["results"].get(c)) else "-" for c in columns])
    console.print(table)
    for p in report["paired"]:
        console.print(f"{escape(p['group'])} − {escape(p['baseline'])}, {p['shots']}-shot: "
                      f"{100 * p['difference']:+.2f} ± {100 * p['ci95']:.2f} points (paired over {p['episodes']} episodes)",
                      highlight=False)


@app.command("plot")
def plot_(
    x: Annotated[str, typer.Argument(help="batch-size (paper Fig. 2), pairs (Fig. 3) or any config key, e.g. train.lr.")],
    refs: Annotated[list[str], typer.Argument(help="Runs or sweeps (ids or unique parts of ids); 'all' for every run.")],
    series: Annotated[Optional[str], typer.Option(help="Comma-separated config keys that make a line (default: every setting but the seed and x).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="PNG file to write (default: X.png).")] = None,
    size: Annotated[Optional[str], typer.Option(help="WIDTHxHEIGHT in pixels (default: 500x420 per panel).")] = None,
    title: Annotated[Optional[str], typer.Option(help="Title above the panels.")] = None,
    split: Annotated[str, typer.Option(help="test or val.")] = "test",
    shots: Annotated[str, typer.Option(help="Comma-separated shots, one panel each.")] = "1,5",
    ways: Annotated[int, typer.Option(help="Ways of the evaluations to plot.")] = 5,
    queries: Annotated[int, typer.Option(help="Queries per class of the evaluations to plot.")] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Also print the plotted numbers as JSON.")] = False,
) -> None:
    """Write a PNG of accuracy against a setting: one line per configuration, one panel per shots, 95% CI error bars."""
    from fslab.reports.compare import select_runs
    from fslab.reports.plot import draw, parse_size, series_data

    pixels = parse_size(size) if size else None
    runs = select_runs(_settings().runs_dir, refs)
    data = series_data(runs, x, series=[k.strip() for k in series.split(",")] if series else None, split=split,
                       shots=_parse_shots(shots), ways=ways, queries=queries)
    out = out or Path(f"{x}.png")
    width, height = draw(data, out, pixels, title)
    if as_json:
        print(json.dumps({"out": str(out), "width": width, "height": height, **data}))
        return
    points = sum(len(s["points"]) for panel in data["panels"] for s in panel["series"])
    panels = len(data["panels"])
    console.print(f"wrote {escape(str(out))} ({width}x{height} px, {panels} panel{'s' * (panels != 1)}, "
                  f"{points} points)", highlight=False)


@app.command(context_settings={"allow_interspersed_args": True})
def sweep(
    targets: Annotated[Optional[list[str]], typer.Argument(help="METHOD, or: resume SWEEP.")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per combination (0, 1, ... or from --seed).")] = 1,
    grid: Annotated[Optional[list[str]], typer.Option("--grid", help="key=v1,v2,... (repeatable); keys as in --set, or backbone/dataset/epochs/batch_size/lr.")] = None,
    file: Annotated[Optional[Path], typer.Option("--file", help="A sweep file in TOML: method, seeds, fail_fast, a grid table and a set table.")] = None,
    backbone: BackboneOpt = None,
    dataset: DatasetOpt = None,
    data_root: DataRootOpt = None,
    epochs: EpochsOpt = None,
    batch_size: BatchSizeOpt = None,
    lr: LrOpt = None,
    seed: Annotated[Optional[int], typer.Option(help="First seed.")] = None,
    device: DeviceOpt = None,
    set_: SetOpt = None,
    gpus: GpusOpt = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="At the first failed run, cancel the runs still queued (with --executor slurm: the jobs not yet started).")] = False,
    executor: ExecutorOpt = "local",
    slurm: SlurmOpt = None,
) -> None:
    """Queue one run per grid combination and seed, and start them as slots free up (or submit each as a SLURM job).

    [bold]fslab sweep nca --seeds 5 --grid batch_size=128,256,512[/bold];
    [bold]fslab sweep resume SWEEP[/bold] queues again what failed or was lost.
    """
    from fslab.execution.scheduler import start_scheduler
    from fslab.execution.sweep import create_sweep, load_sweep, parse_grid, read_sweep_file, requeue

    settings = _settings()
    targets = targets or []
    on_slurm = _check_executor(executor, slurm)
    if on_slurm:
        from fslab.execution import slurm as slurm_

        options = slurm_.job_options(settings, slurm)
        slurm_.require_submitit()  # say how to install submitit before anything is queued
    if targets[:1] == ["resume"]:
        if len(targets) != 2:
            raise UsageError("usage: fslab sweep resume SWEEP")
        record = load_sweep(settings.runs_dir, targets[1])
        again = requeue(settings.runs_dir, record)
        if again and on_slurm:
            submitted = slurm_.submit_queued(again, options)
            console.print(f"{record['id']}: {len(submitted)} runs submitted again as SLURM jobs", highlight=False)
            return
        if again:
            start_scheduler(settings.runs_dir)
        console.print(f"{record['id']}: {len(again)} runs queued again", highlight=False)
        return
    fixed = []
    if file is not None:
        spec = read_sweep_file(file)
        method, seeds = spec["method"], spec.get("seeds", seeds)
        fail_fast = spec.get("fail_fast", fail_fast)
        grid_values = {k: list(v) for k, v in spec.get("grid", {}).items()}
        fixed = [f"{k}={json.dumps(v)}" for k, v in spec.get("set", {}).items()]
    elif len(targets) == 1:
        method, grid_values = targets[0], {}
    else:
        raise UsageError("usage: fslab sweep METHOD [--seeds N] [--grid key=v1,v2] ..., or fslab sweep --file SWEEP.toml")
    grid_values.update(parse_grid(grid or []))
    base = _overrides(backbone, dataset, data_root, epochs, batch_size, lr, seed, device, [*fixed, *(set_ or [])],
                      gpus)
    sweep_id, runs = create_sweep(method, grid_values, seeds, base=base, settings=settings,
                                  registry=_registry(settings), fail_fast=fail_fast,
                                  slurm_options=options if on_slurm else None)
    if on_slurm:
        submitted = slurm_.submit_queued(runs, options)
        console.print(f"{sweep_id}: {len(submitted)} runs submitted as SLURM jobs; follow them with: fslab runs",
                      highlight=False)
        return
    start_scheduler(settings.runs_dir)
    console.print(f"{sweep_id}: {len(runs)} runs queued; follow them with: fslab queue", highlight=False)


@app.command()
def queue(as_json: JsonFlag = False) -> None:
    """Runs waiting for a slot, and where each running run went."""
    from fslab.core.runstore import list_runs
    from fslab.execution.scheduler import configured_slots, slot_in_use

    settings = _settings()
    rows = []
    for run_ in list_runs(settings.runs_dir):
        status = run_.status()
        state = run_.state(status)
        if state in ("queued", "running"):
            rows.append({"id": run_.id, "state": state, "sweep": status.get("sweep"), "slot": status.get("slot"),
                         "gpus": status.get("gpus"), "pid": status.get("pid")})
    folder = settings.runs_dir / ".slots"
    slots = [{"slot": s.name, "gpu": s.gpu, "busy": folder.is_dir() and slot_in_use(folder, s)}
             for s in configured_slots(settings.scheduler)]
    if as_json:
        print(json.dumps({"runs": rows, "slots": slots}))
        return
    table = Table("id", "state", "sweep", "slot", "GPU", "pid")
    for r in rows:
        table.add_row(escape(r["id"]), r["state"], escape(str(r["sweep"] or "-")), escape(str(r["slot"] or "-")),
                      escape(str(r["gpus"] or "-")), str(r["pid"] or "-"))
    console.print(table)
    console.print("slots: " + ", ".join(f"{s['slot']} {'busy' if s['busy'] else 'free'}" for s in slots))


def main() -> None:
    """Console entry point: an FslabError is one line on stderr and an exit code."""
    try:
        app()
    except FslabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
