"""Commands that evaluate and compare finished runs: ``eval``, ``compare``, ``plot``."""

from __future__ import annotations

import contextlib
import gc
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from fslab.cli.common import (
    JsonFlag,
    ReadPrecision,
    WideFlag,
    app,
    check_evaluator,
    choices,
    console,
    err_console,
    names_of,
    parse_shots,
    registry,
    runs_or_sweeps,
    say_damaged,
    settings,
    shown,
)
from fslab.cli.tables import Col, fit, print_table
from fslab.core.config import EPISODES_MAX, EPISODES_MIN, PRECISIONS, check_option, uninstalled
from fslab.core.errors import FslabError, UsageError, interrupted_code, unknown_format
from fslab.core.events import accuracy_text, canonical_evaluator, label_params, other_precision, table_score
from fslab.core.limits import repeated_at
from fslab.core.text import count, percent, queries_text

# fslab eval --precision
PrecisionOption = Annotated[str, typer.Option(
    help="The precision the network embeds the features in: auto (the one the run's start recorded for "
         "evaluation), fp32, bf16 or fp16. Scores of another than the run's own go beside its own.",
    autocompletion=choices(*PRECISIONS))]


# fslab eval --episodes
EPISODES_HELP = ("Episodes per number of shots, at least 2 (default 10000, the protocol's, not the run's own "
                 "eval.test_episodes; 100 for the slow finetune evaluator). Scores of another count go beside the "
                 "run's own test scores, which fslab runs still shows; compare, plot and study report read each run "
                 "on its first N episodes, N the most every run they pool reaches.")


@app.command("eval")
def eval_(
    refs: Annotated[list[str], typer.Argument(
        metavar="RUN|SWEEP", help="Runs or sweeps: run ids, unique parts of them or 'last'; sweep ids (each run of "
                                  "the sweep); 'all' for every run.", autocompletion=runs_or_sweeps)],
    split: Annotated[str, typer.Option(help="test or val.", autocompletion=choices("test", "val"))] = "test",
    ways: Annotated[int | None, typer.Option(
        help="Classes per episode (default: the run's eval.ways, 5 unless it set another).",
        show_default=False)] = None,
    shots: Annotated[str, typer.Option(help="Comma-separated shots, e.g. 1,5.")] = "1,5",
    queries: Annotated[int | None, typer.Option(
        help="Queries per class (default: the run's eval.queries, 15 unless it set another).",
        show_default=False)] = None,
    episodes: Annotated[int | None, typer.Option(help=EPISODES_HELP)] = None,
    evaluator: Annotated[str | None, typer.Option(
        help="Evaluator plugin: centroid, knn, soft, ap, retrieval-map, sen, finetune... "
             "(default: the run's); its name alone, its parameters with --set (knn\\[k=3], as fslab runs and "
             "compare show scores, is --evaluator knn --set evaluator.k=3).",
        autocompletion=names_of("evaluator"))] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", help="An evaluator parameter, e.g. --set evaluator.k=3 (repeatable).")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda (a GPU) or cuda:N (default: the run's).",
                                               autocompletion=choices("auto", "cpu", "cuda"))] = None,
    data_root: Annotated[Path | None, typer.Option(
        help="Where the run's dataset lies now, if it moved since the run trained (default: the run's root; "
             "where that is gone, the error names this project's folder for the dataset, if it has one); the "
             "runs named must have trained on one dataset and root (synthetic has none).")] = None,
    precision: PrecisionOption = "auto",
    sinks: Annotated[bool, typer.Option(
        "--sinks/--no-sinks", help="Send the new scores to the sinks the run was sent to as it trained (--sink, "
                                   "\\[run] sinks), so its trackers show them too.")] = True,
    as_json: JsonFlag = False,
) -> None:
    """Evaluate a run's last checkpoint on fixed-seed episodes (features embedded once and cached).

    The network runs in the precision the run's start recorded for evaluation (auto: bf16 on a GPU), whatever
    the device, or in --precision's (the same episodes: what the precision costs), whose scores go beside the
    run's own (..._fp32.json), which fslab runs, compare, plot and study report read alone, and no sink gets.
    Several runs or a sweep are scored one after the other in one process; where several are named, one that
    cannot be (no checkpoint yet, an unreadable configuration, episodes its evaluator refuses, its folder
    deleted meanwhile) is left out with its reason on stderr (the command fails if every one is).

    retrieval-map scores each episode by its mAP (10 images per class, whatever --shots and --queries say).
    A run sent to sinks as it trained sends each the new scores, added to its record (TensorBoard, MLflow), else
    the whole run exported again (W&B, a record lacking part of the run); a sink that fails is a warning, the scores
    stay saved (a server that does not answer is not tried again for the next runs); a fslab export of the run to one of
    them meanwhile waits until they are sent, then exports the whole run. A second fslab eval of the run
    at once waits for the one embedding a split, then reads its features. A Ctrl-C (or SIGTERM) midway says how
    many runs were scored (their scores are saved); the same command again scores the rest."""
    from fslab.core.sweeps import select_runs

    shot_list = episode_options(split, shots, ways, queries, episodes)
    check_option("eval.precision", precision, "--precision")  # as fslab run --set eval.precision=... is checked
    if evaluator and "[" in evaluator:  # a label as fslab runs and compare show it: knn[k=3]
        raise UsageError(_label_given(evaluator))
    if data_root is not None and not data_root.is_dir():  # said once, not once for each run named
        raise UsageError(f"--data-root {data_root} is not a folder")
    chosen = select_runs(settings().runs_dir, refs, "evaluate")
    # an unknown evaluator, a wrong parameter or a device this machine lacks fails before torch loads
    found = registry()
    params = _given_options(evaluator, set_ or [], device, found)
    plans = _eval_plans(chosen, found, evaluator, params, set_ or [], device, ways, queries)
    if data_root is not None:
        _one_data_root(plans, found)
    _score_all(plans, len(chosen), data_root, found, sinks, as_json, split=split, shots=shot_list,
               episodes=episodes, evaluator=evaluator, device=device, precision=precision)


def _given_options(evaluator: str | None, assignments: list[str], device: str | None, found) -> dict | None:
    """``--evaluator``, its ``--set`` parameters and ``--device``, checked before torch loads; returns the
    parameters (None where no evaluator is named: each run's own are checked with it, :func:`_eval_plan`)."""
    if evaluator is not None and not evaluator.strip():  # --evaluator "" (an unset variable): not the run's own
        raise UsageError(f"--evaluator needs an evaluator's name, one of {', '.join(found.names('evaluator'))}; "
                         f"leave the option out to evaluate each run by its own, got '{evaluator}'")
    params = _evaluator_params(assignments, found, evaluator) if evaluator else None
    if device:
        _check_device(device)
    return params


def _label_given(label: str) -> str:
    """The line that refuses a label (``knn[k=3]``, as ``fslab runs --evaluator`` and ``fslab compare
    --evaluator`` take it) given to ``fslab eval --evaluator``, with the options that evaluate by it."""
    name, params = label.partition("[")[0], label_params(label)
    sets = (" ".join(f"--set {shlex.quote(f'evaluator.{k}={v}')}" for k, v in params) if params
            else "--set evaluator.KEY=VALUE")
    return (f"--evaluator takes an evaluator's name, and --set its parameters: '{label}' is a label, as fslab runs "
            f"and fslab compare show scores; evaluate by it with --evaluator {shlex.quote(name)} {sets}")


def _score_all(plans: list[tuple], named: int, data_root: Path | None, found, sinks: bool, as_json: bool,
               **kwargs) -> None:
    """:func:`_scored`'s runs, their scores printed, and sent to each run's sinks (``sinks``). A Ctrl-C
    (or a SIGTERM) midway is one line on stderr saying which runs were scored and saved, and how to go on,
    exit code 130 (143): it ended the command with no word, or killed it outright."""
    from fslab.cli.launch import sigterm_as_interrupt

    out_of_reach: dict[str, FslabError] = {}  # sinks whose server did not answer, or whose store is read-only
    done: list[str] = []
    try:
        with sigterm_as_interrupt(), contextlib.closing(_scored(plans, named, data_root, sinks, **kwargs)) as runs:
            for run_, results, options, added, names in runs:  # its sinks held until sent (closing: a Ctrl-C)
                done.append(run_.id)
                for result in results:
                    _print_score(run_, result, kwargs["split"], options["ways"], as_json)
                _send_to_sinks(found, run_, names, added, out_of_reach)
    except KeyboardInterrupt as interrupt:
        saved = (f"the scores of {count(len(done), 'run')} printed above are saved" if done else
                 "the scores printed above, if any, are saved")
        err_console.print(f"fslab eval interrupted after {len(done)} of {count(named, 'run')}: {saved}; the same "
                          f"command again scores the rest (and those again, from the features they cached)",
                          highlight=False)
        raise typer.Exit(interrupted_code(interrupt)) from None


def _scored(plans: list[tuple], named: int, data_root: Path | None, sinks: bool, **kwargs):
    """Each plan's run with its results, its options, the events its evaluation logged and the sinks they
    are to be sent to (none without ``sinks``), evaluated in turn; where several runs are named, one whose
    evaluation is refused (knn's k above the support points of its episodes), or whose folder is deleted
    before or while it is scored, is left out in a line on stderr, and none scored at all is a UsageError.
    The run's export lock of each of those sinks is held from before its scores are appended to its log
    until the next run is asked for (:func:`fslab.execution.export.sending`): they are sent meanwhile."""
    from fslab.execution.export import sending
    from fslab.training.run_eval import evaluate_run

    scored = 0
    for run_, cfg, options in plans:
        added: list[dict] = []
        names = _sink_names(run_) if sinks else []
        with contextlib.ExitStack() as held:
            hold = (lambda run_=run_, names=names: held.enter_context(sending(run_, names))) if names else None
            try:
                results = _evaluate(evaluate_run, run_, cfg, data_root, **kwargs, **options, logged=added,
                                    recording=hold)
            except FslabError as exc:  # refused (a UsageError), or the run deleted meanwhile
                if named == 1 or (not isinstance(exc, UsageError) and run_.path.is_dir()):
                    raise
                err_console.print(shown(f"left out: {_naming(run_, exc)}"), highlight=False)
                continue
            scored += 1
            yield run_, results, options, added, names
    if not scored:
        raise UsageError(f"none of the {named} runs named can be evaluated (each is said above)")


def _naming(run_, exc: Exception) -> str:
    """``exc``'s message, beginning with the run it is about where it does not name it."""
    return str(exc) if run_.id in str(exc) else f"run {run_.id}: {exc}"


def _eval_plans(chosen: list, found, *options) -> list[tuple]:
    """:func:`_eval_plan` of each run; where several are named, one that cannot be evaluated is left out
    in a line on stderr (a UsageError if all are)."""
    plans = []
    for run_ in chosen:
        try:
            plans.append(_eval_plan(run_, found, *options))
        except UsageError as exc:
            if len(chosen) == 1:
                raise
            err_console.print(shown(f"left out: {_naming(run_, exc)}"), highlight=False)
    if not plans:
        raise UsageError(f"none of the {len(chosen)} runs named can be evaluated (each is said above)")
    return plans


def _one_data_root(plans: list[tuple], found) -> None:
    """A UsageError where the runs to evaluate trained on more than one dataset or root: --data-root,
    one folder, would stand for each of them, and a run would be scored on another run's images. A dataset
    that reads no files (synthetic) has no root, whatever an earlier fslab saved as one."""
    trained_on: dict[tuple[str, str | None], list[str]] = {}
    for run_, cfg, _ in plans:
        name = cfg.dataset["name"]
        root = str(cfg.dataset.get("root") or "") if found.reads_files(name) else None
        trained_on.setdefault((name, root), []).append(run_.id)
    if len(trained_on) > 1:
        named = "; ".join(f"{name}{'' if root is None else f' in {root or chr(63)}'}: "
                          f"{', '.join(ids[:2])}{', ...' if len(ids) > 2 else ''}"
                          for (name, root), ids in trained_on.items())
        raise UsageError(f"--data-root gives one dataset's folder, but the runs named trained on {len(trained_on)} "
                         f"({named}); evaluate the runs of each apart, each with its own --data-root")


def _eval_plan(run_, found, evaluator: str | None, params: dict | None, assignments: list[str], device: str | None,
               ways: int | None, queries: int | None) -> tuple:
    """What ``fslab eval`` does with one run, checked before torch loads: its configuration, the
    evaluator (the run's own where none is named) and its parameters, the device, the checkpoint."""
    from fslab.core.rerun import check_evaluable

    cfg = run_.run_config()  # a missing or damaged config.json: one line
    if (line := uninstalled(found, run_.id, "dataset", cfg.dataset["name"])) is not None:
        # read for every score (its labels), before the evaluator: "name another evaluator" mended nothing
        raise UsageError(f"{line} to evaluate the run: fslab eval reads its images through it")
    name = evaluator or _own_evaluator(found, run_.id, cfg.evaluator["name"])
    found.get("evaluator", name)
    if params is None:
        params = _evaluator_params(assignments, found, name)
    if not device:
        _check_device(cfg.device)
    check_evaluable(run_)  # no checkpoint, or a damaged one: said before torch loads
    # the run's own episodes where not given, as compare reads them
    return run_, cfg, {"ways": ways or cfg.eval.ways, "queries": queries or cfg.eval.queries, "params": params}


def _print_score(run_, result: dict, split: str, ways: int, as_json: bool) -> None:
    result = {**result, "evaluator": canonical_evaluator(result["evaluator"])}  # as fslab runs takes it
    if as_json:
        record = dict(result)
        if result["metric"] != "accuracy":  # e.g. "map": the score under its own name
            record[result["metric"]] = record.pop("accuracy")
        print(json.dumps({"run": run_.id, **record}))
    else:
        console.print(f"{run_.id} {split} {ways}-way {result['shots']}-shot, {queries_text(result['queries'])}, "
                      f"{count(result['episodes'], 'episode')} "
                      f"({shown(result['evaluator'])}, checkpoint of epoch {result['epoch']}{_embedded(result)}): "
                      f"{accuracy_text(result)}",
                      highlight=False)


def _embedded(result: dict) -> str:
    """The precision the network ran in (embedding the features, or fine-tuned), as the line says it:
    ``, network in bf16``; ``, network in fp32, not the run's bf16`` for another than the run's."""
    if not result.get("precision"):
        return ""
    return f", network in {result['precision']}" + (f", not the run's {result['run_precision']}"
                                                    if other_precision(result) else "")


def _evaluate(evaluate_run, run_, cfg, data_root: Path | None, **options) -> list[dict]:
    """``evaluate_run`` on --data-root, which must be a folder, or on the run's own root. Where that
    root is gone the dataset's line pointed at [data_roots] of fslab.toml, which a run made before
    does not read: the line then says that the data may have moved, and how to name where it lies
    (:func:`fslab.execution.data_roots.data_root_gone`, the line every command says of a gone root). Its
    warnings (a feature cache the disk refused) are said once the scores are saved, and never before the
    line of a failure: on the same full disk, that one line is all."""
    if data_root is not None and not data_root.is_dir():
        raise UsageError(f"--data-root {data_root} is not a folder")
    if not run_.path.is_dir():  # deleted since the command began: fslab delete of a run a sweep's eval had yet to score
        raise FslabError(f"run {run_.id} was deleted before fslab eval scored it (its folder {run_.path} is gone)")
    # a read-only copy of a store: before any image is embedded
    run_.check_writable("fslab eval", "the features it embeds and the scores it measures", "evaluate")
    gc.freeze()  # torch's objects (imported by now), walked by no collection again: as in the worker, a quicker exit
    warnings: list[str] = []  # said once the scores are saved: a failure after them (the same full disk) is one line
    try:
        results = evaluate_run(run_, **options, data_root=str(data_root.resolve()) if data_root else None,
                               warn=warnings.append)
        for line in warnings:
            print(line, file=sys.stderr, flush=True)
        return results
    except OSError:
        if not run_.path.is_dir():  # rm -rf while it was scored: "No such file or directory: .../evaluations"
            raise FslabError(f"run {run_.id} was deleted while fslab eval scored it (its folder {run_.path} is "
                             f"gone, and the scores with it)") from None
        raise
    except UsageError as exc:
        from fslab.execution.data_roots import data_root_gone

        gone = None if data_root is not None else data_root_gone(f"run {run_.id}", cfg.dataset, exc, settings(),
                                                                  move="--data-root DIR")
        raise gone or exc from None


def _own_evaluator(found, run_id: str, name: str) -> str:
    """The run's own evaluator ``name``, where a plugin registers it; else a UsageError saying to name one."""
    try:
        found.get("evaluator", name)
    except UsageError as exc:
        failed = found.missing_names()  # a plugin that failed to load may register it
        raise UsageError(f"run {run_id} was tested by evaluator '{name}', which no installed plugin registers"
                         + (f" (not among them: {failed})" if failed else "")
                         + f"; evaluate it with --evaluator NAME, one of {', '.join(found.names('evaluator'))}"
                         ) from exc
    return name


def _send_to_sinks(found, run_, names: list[str], added: list[dict], out_of_reach: dict[str, FslabError]) -> None:
    """Send the events ``added`` (the new scores) to each sink of ``names`` (those the configuration of
    ``run_`` names, whose export locks this process holds: :func:`_scored`), so a tracker shows what
    ``fslab eval`` just saved: added to the sink's record where it can add to it, else the whole run
    exported again (:func:`fslab.execution.export.export_run`). Each outcome
    is one line on stderr, and a failure is a warning: the evaluation is saved either way, and
    ``fslab export`` sends it later (fslab show says so). A sink whose server did not answer (10 s
    each time) or whose store is read-only is not tried again for the next runs (``out_of_reach``:
    its error, by the sink's name), where no run would fare better."""
    from fslab.execution.export import SinkCannotWrite, SinkUnreachable, checked_layers, export_run, missed

    for name in names:
        later = f"send the scores later with: fslab export {run_.id} --to {name}"
        if name in out_of_reach:
            missed(run_, name, added, out_of_reach[name])
            err_console.print(f"warning: {shown(str(out_of_reach[name]))} (not tried again); the scores are saved; "
                              f"{later}", highlight=False)
            continue
        try:
            done = export_run(found, run_, name, checked_layers(found, settings(), name, {}), added, held=True)
        except FslabError as exc:  # the sink's package missing, the tracker failing or unreachable, the run running
            missed(run_, name, added, exc)
            if isinstance(exc, (SinkUnreachable, SinkCannotWrite)):
                out_of_reach[name] = exc
            err_console.print(f"warning: {shown(str(exc))}; the scores are saved; {later}", highlight=False)
            continue
        err_console.print(_sent_line(run_.id, name, done), highlight=False)


def _sink_names(run_) -> list[str]:
    """The sinks the configuration of ``run_`` names (``sinks``), which ``fslab eval`` sends its scores to."""
    from fslab.core.keys import SINKS

    names = run_.config().get(SINKS) or {}
    return list(names) if isinstance(names, dict) else []


def _sent_line(run_id: str, name: str, done: dict) -> str:
    """What fslab eval says of a sink it sent a run's new scores to (``done``: what was exported)."""
    if not done["added"]:
        return f"{run_id}: sent again to {name} with the new scores ({done['events']} events)"
    if not done["events"]:  # every new score of another precision than the run's: none is sent
        return (f"{run_id}: nothing sent to {name}: the new scores, of the network in another precision than the "
                f"run's, stay in its folder")
    return f"{run_id}: the new scores added to {name}'s record of the run ({count(done['events'], 'event')})"


def _evaluator_params(assignments: list[str], found, name: str) -> dict:
    """``--set evaluator.k=3`` -> ``{"k": 3}``, checked as a run's evaluator
    section is (names, types, the evaluator's declared rules)."""
    from fslab.core.assignments import parse_assignment
    from fslab.core.plugin_params import plugin_params

    given = {}
    for text in assignments:
        path, value = parse_assignment(text)
        if len(path) != 2 or path[0] != "evaluator":
            raise UsageError(f"fslab eval --set takes evaluator parameters (evaluator.NAME=VALUE), got '{text}'")
        if path[1] == "name":  # the section's name key, not a parameter
            raise UsageError(f"fslab eval names its evaluator with --evaluator, not --set: "
                             f"--evaluator {value}" if isinstance(value, str) else
                             f"fslab eval names its evaluator with --evaluator NAME, not --set (got '{text}')")
        given[path[1]] = value
    checked = plugin_params(found, "evaluator", name, given, choose="--evaluator ")
    return {key: checked[key] for key in given}  # the others stay the run's own


def _check_device(device: str) -> None:
    """The device ``fslab eval`` would use, checked as ``fslab run --device`` is."""
    from fslab.execution.checks import check_device

    check_option("device", device, "--device")  # named as given, as fslab run names it
    check_device({"device": device, "train": {"processes": 1}})


def config_keys(text: str | None, option: str) -> list[str] | None:
    """``--group-by``/``--series`` as keys (None where not given); an empty one is refused in one line
    (``--group-by ''`` was read as not given, ``train.lr,,`` said that key '' was in no configuration)."""
    if text is None:
        return None
    keys = [key.strip() for key in text.split(",")]
    if not all(keys):
        raise UsageError(f"{option} takes config keys separated by commas (e.g. train.lr,loss.name), got '{text}'")
    if (again := repeated_at(keys)) is not None:
        raise UsageError(f"{option} lists {keys[again]} twice; each key is one part of a group's label: list it once")
    return keys


def episode_options(split: str, shots: str, ways: int | None, queries: int | None,
                    episodes: int | None = None) -> list[int]:
    """The shots of ``--shots``, after ``--split``, ``--ways``, ``--queries`` and ``--episodes`` are
    checked: the one check of the episode options of eval, compare and plot, each mistake one line."""
    if split not in ("test", "val"):
        raise UsageError(f"--split must be test or val, got '{split}'")
    shot_list = parse_shots(shots)
    if not shot_list or min(shot_list) < 1:
        raise UsageError(f"--shots takes whole numbers of at least 1 separated by commas (e.g. 1,5), got '{shots}'")
    if (again := repeated_at(shot_list)) is not None:
        raise UsageError(f"--shots lists {shot_list[again]} twice; each number of shots is scored once: list it once")
    for option, value, least in (("--ways", ways, 2), ("--queries", queries, 1)):
        if value is not None and value < least:
            raise UsageError(f"{option} must be at least {least}, got {value}")
    if episodes is not None and not EPISODES_MIN <= episodes <= EPISODES_MAX:  # 10**11 at once would fill the memory
        raise UsageError(f"--episodes must be from {EPISODES_MIN} to {EPISODES_MAX:,} (one episode gives no 95% CI), "
                         f"got {episodes:,}")
    return shot_list


def shape_options(verb: str) -> tuple:
    """The --ways and --queries options of ``fslab compare`` and ``fslab plot`` (``verb``): each reads the
    runs' own shape where it is not given (:func:`fslab.reports.compare.scored_shape`)."""
    ways = Annotated[int | None, typer.Option(
        help=f"Ways of the evaluations to {verb} (default: the runs' own: of the shape their scores share, else "
             "the ways their scores, then their configurations (eval.ways), all have; else 5).",
        show_default=False)]
    queries = Annotated[int | None, typer.Option(
        help=f"Queries per class of the evaluations to {verb} (default: the runs' own: of the shape their scores "
             "share, else the queries their scores, then their configurations (eval.queries), all have: --ways 20 "
             "reads those fslab eval --ways 20 scores; else 15).", show_default=False)]
    return ways, queries


CompareWays, CompareQueries = shape_options("compare")
PlotWays, PlotQueries = shape_options("plot")


_FORMAT_TEXT = {"md": "a Markdown table", "latex": "a LaTeX table", "csv": "CSV rows",
                "json": "the whole report as one JSON document"}


@app.command("compare")
def compare_(
    refs: Annotated[list[str], typer.Argument(
        metavar="RUN|SWEEP", help="Runs or sweeps (ids or unique parts of ids, or runs' folders: runs/ID) to "
                                  "compare; 'all' for every run.",
        autocompletion=runs_or_sweeps)],
    group_by: Annotated[str | None, typer.Option(
        help="Comma-separated config keys to group by (default: every setting but the seed and those that leave "
             "the test as it is: device, data root...); runs pair by seed and the settings not grouped by.")] = None,
    fmt: Annotated[str, typer.Option(
        "--format", help="table, md, latex, csv or json; md, latex and csv add a row per paired "
                         "difference (csv: its baseline named, in difference columns of its own), and say the "
                         "split, episode shape and evaluator (md: in a first line, latex: a % comment, csv: columns).",
        autocompletion=choices("table", "md", "latex", "csv", "json"))] = "table",
    split: Annotated[str, typer.Option(help="test or val.", autocompletion=choices("test", "val"))] = "test",
    shots: Annotated[str, typer.Option(help="Comma-separated shots.")] = "1,5",
    ways: CompareWays = None,
    queries: CompareQueries = None,
    evaluator: Annotated[str | None, typer.Option(
        help="Scores saved by this evaluator, e.g. knn or knn\\[k=3] (default: each run's own).",
        autocompletion=names_of("evaluator"))] = None,
    precision: ReadPrecision = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines: one object per group (\"type\": \"group\") "
                                                         "and per paired difference (\"type\": \"paired\"); "
                                                         "not with a --format other than table.")] = False,
    wide: WideFlag = False,
) -> None:
    ("Group runs that differ only by seed; pooled accuracy ± 95% CI per group, and paired differences to the first "
     "group with scores (runs scored on different data are neither pooled nor paired). Each run is read on its "
     "first N episodes, N the most every run reaches; the title names the runs scored on more, so cut.\n\n"
     "A saved evaluation that cannot be read (a score of NaN, say) is left out and named on stderr. "
     "--precision fp32 (bf16, fp16) compares the scores of the networks run in that precision, each run's own where "
     "it is its precision, else those fslab eval RUN --precision fp32 saved: fslab compare R1 R2 --precision fp32 "
     "beside fslab compare R1 R2 checks what the precision changes; a run without them is named with the fslab eval "
     "that scores it on the episodes the others are read on (fslab eval RUN --episodes 50 --precision fp32), "
     "one fslab eval cannot score (no checkpoint yet, none ever written, a damaged one) with its line instead.")
    from fslab.core.sweeps import select_runs
    from fslab.reports.compare import FORMATS, compare, render

    if fmt not in FORMATS:
        raise UsageError(unknown_format(fmt, FORMATS))
    if as_json and fmt != "table":  # --json printed its lines whatever --format asked for
        raise UsageError(f"give --json or --format {fmt}, not both: --json prints a JSON line per group and per "
                         f"paired difference, --format {fmt} {_FORMAT_TEXT[fmt]}")
    shot_list = episode_options(split, shots, ways, queries)
    check_option("eval.precision", precision, "--precision")  # as fslab eval --precision is checked
    read_in = None if precision == "auto" else precision
    runs = select_runs(settings().runs_dir, refs, "compare")
    report = compare(runs, split=split, shots=shot_list, ways=ways, queries=queries,
                     group_by=config_keys(group_by, "--group-by"), evaluator=evaluator, precision=read_in)
    _say_left_out(report, split, shot_list, evaluator, (ways, queries), runs)
    if as_json:
        sys.stdout.write("".join(json.dumps(item) + "\n" for item in compare_lines(report, evaluator)))
        return
    if fmt != "table":
        sys.stdout.write(render(report, fmt))
        return
    _compare_table(report, shot_list, wide)


def _compare_table(report: dict, shot_list: list[int], wide: bool) -> None:
    """fslab compare's table: a row per group, a column per shots, under the report's caption; then a line
    per paired difference to the first group."""
    from fslab.reports.compare import caption

    columns = [f"{n}-shot" for n in shot_list]
    rows = [[row["group"], str(row["seeds"]),
             *[f"{table_score(r)} ({r['episodes']})" if (r := row["results"].get(c)) else "-" for c in columns]]
            for row in report["groups"]]
    title = shown(caption(report))  # md's and latex's first line
    print_table(console, lambda width: fit([Col("group", wrap=True), Col("seeds", "right"),
                                            *(Col(c, "right") for c in columns)], rows, width, [], title=title), wide)
    for p in report["paired"]:
        console.print(f"{shown(p['group'])} − {shown(p['baseline'])}, {p['shots']}-shot: "
                      f"{percent(p['difference'], sign=True)} ± {percent(p['ci95'])} points "
                      f"(paired over {count(p['episodes'], 'episode')})",
                      highlight=False)


def _say_data_split(labels: list[str] | None, what: str) -> None:
    """On stderr: the groups (compare) or lines (plot) split by the data their runs were scored on."""
    if labels:
        err_console.print(f"{count(len(labels), what)} split by the data its runs were scored on (the "
                          f"fingerprints saved with their scores differ; runs on different data are neither pooled "
                          f"nor paired): {shown('; '.join(labels))}", highlight=False)


def _say_left_out(report: dict, split: str, shots: list[int], evaluator: str | None, asked: tuple,
                  runs: list) -> None:
    """The runs compare left out, each kind said once on stderr so the report itself stays clean;
    a UsageError where no run has scores of the shape asked for (naming the shapes they have, the
    evaluators they have them by where --evaluator asked for another, and the fslab eval of the
    ``asked`` --ways and --queries that makes them)."""
    from fslab.reports.compare import (
        RunFiles,
        damaged_line,
        left_out_lines,
        no_results,
        no_scores_at_all,
        other_labels,
        shapes_text,
        unscored_line,
    )
    from fslab.reports.eval_commands import fewest_test_episodes

    elsewhere, ways, queries, precision = (report[k] for k in ("other_shapes", "ways", "queries", "precision"))
    shapes = {shape for found in elsewhere.values() for shape in found}
    said = left_out_lines(report, runs)
    if not any(row["results"] for row in report["groups"]):  # one line, bad input's: the left out said in it
        labels = []
        if evaluator is not None:
            check_evaluator(evaluator)
            labels = other_labels(runs, split, shots, ways, queries, evaluator, precision)
        unscored = [run for run in runs if run.id in report["unscored"]]
        files = RunFiles(precision)
        never = no_scores_at_all(unscored, split, files)
        raise UsageError(no_results(split, ways, ",".join(map(str, shots)), queries, evaluator, shapes, asked, labels,
                                    never, also=[*said, damaged_line(report["damaged"])], precision=precision,
                                    runs=runs, episodes=fewest_test_episodes(runs, files.config)))
    for line in said:
        err_console.print(shown(line), highlight=False)
    _say_data_split(report.get("data_split"), "group")
    say_damaged(report["damaged"])
    if unscored := unscored_line(report):
        err_console.print(shown(unscored), highlight=False)
    if elsewhere:
        err_console.print(f"{count(len(elsewhere), 'run')} without {split} scores for {ways}-way, "
                          f"{queries_text(queries)} (left out): {shown(', '.join(list(elsewhere)[:5]))}"
                          f"{', ...' if len(elsewhere) > 5 else ''};"
                          f" they have them for {shapes_text(shapes)}", highlight=False)


def _say_empty_panels(data: dict, asked: tuple, runs: list) -> None:
    """On stderr: each panel drawn empty, no run having scores of its shots, and the fslab eval that fills it, on
    the episodes the other panels are read on (the most of them, as a run left out is scored: read_on_command),
    of the ``runs`` plotted fslab eval scores (for the others, its line: unevaluable_runs)."""
    from fslab.reports.compare import no_results, unevaluable_runs

    read_on = max((point["episodes_per_run"] for panel in data["panels"] for line in panel["series"]
                   for point in line["points"]), default=None)
    lacking = unevaluable_runs(runs) if not all(panel["series"] for panel in data["panels"]) else {}
    for panel in data["panels"]:
        if not panel["series"]:
            why = no_results(data["split"], data["ways"], str(panel["shots"]), data["queries"], asked=asked,
                             precision=data["precision"], episodes=read_on, runs=runs, lacking=lacking)
            err_console.print(f"the {panel['shots']}-shot panel is empty: {shown(why)}", highlight=False)


def compare_lines(report: dict, evaluator: str | None) -> list[dict]:
    """``fslab compare --json``: one object per group, then one per paired difference; ``evaluator`` is
    --evaluator's (null: each run's own), ``evaluators`` the labels whose scores were read, as the table says."""
    where = {"split": report["split"], "ways": report["ways"], "queries": report["queries"],
             "evaluator": evaluator and canonical_evaluator(evaluator), "evaluators": report["evaluators"],
             "precision": report.get("precision")}
    groups = [{"type": "group", **where, **{k: row[k] for k in ("group", "runs", "seeds", "seed_values", "results")}}
              for row in report["groups"]]
    return groups + [{"type": "paired", **where, **p} for p in report["paired"]]


def _say_plot_left_out(data: dict) -> None:
    """On stderr, so --json's output stays one object: the runs fslab plot left out, with why, and those it
    read on their first episodes only (:func:`fslab.reports.plot.cut_line`)."""
    from fslab.reports.plot import cut_line

    for item in data["left_out"][:5]:
        err_console.print(f"left out {shown(item['run'])}: {shown(item['why'])}", highlight=False)
    if len(data["left_out"]) > 5:
        err_console.print(f"left out {count(len(data['left_out']) - 5, 'more run')} (fslab plot --json lists them all)",
                          highlight=False)
    if line := cut_line(data):
        err_console.print(shown(line), highlight=False)


@app.command("plot")
def plot_(
    x: Annotated[str, typer.Argument(
        metavar="X", help="batch-size (paper Fig. 2), pairs (Fig. 3) or any config key, e.g. train.lr.",
        autocompletion=choices("batch-size", "pairs"))],
    refs: Annotated[list[str], typer.Argument(
        metavar="RUN|SWEEP", help="Runs or sweeps (ids or unique parts of ids, or runs' folders: runs/ID); "
                                  "'all' for every run.",
        autocompletion=runs_or_sweeps)],
    series: Annotated[str | None, typer.Option(
        help="Comma-separated config keys that make a line, x not among them "
             "(default: every setting but the seed, x and those fslab compare does not group by).")] = None,
    out: Annotated[Path | None, typer.Option(help="PNG file to write, its name ending in .png (default: X.png); "
                                                "written whole, then renamed into place.")]
    = None,
    size: Annotated[str | None, typer.Option(
        help="WIDTHxHEIGHT in pixels (default: 500x420 per panel); one that leaves the panels no room is refused.")
    ] = None,
    title: Annotated[str | None, typer.Option(help="Title above the panels, drawn as written ($ is no math).")] = None,
    split: Annotated[str, typer.Option(help="test or val.", autocompletion=choices("test", "val"))] = "test",
    shots: Annotated[str, typer.Option(help="Comma-separated shots, one panel each.")] = "1,5",
    ways: PlotWays = None,
    queries: PlotQueries = None,
    precision: ReadPrecision = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Also print the plotted numbers as JSON.")] = False,
) -> None:
    """Write a PNG of accuracy against a setting: one line per configuration, one panel per shots, 95% CI error bars.

    A run that gives no point (no x, a repeat of another's settings and seed, no saved scores yet) is named on
    stderr with why; one scored only at other episode shapes, with the --ways/--queries that read its scores.
    A saved evaluation that cannot be read (a score of NaN, say) is left out and named on stderr, as is a run
    scored on more episodes than every run of its panel reaches, read on its first as many as compare reads it.
    --precision fp32 (bf16, fp16) plots the scores of the networks run in that precision, as fslab compare
    --precision reads them; a run without them is named with the fslab eval that scores it on the episodes
    the others are read on (fslab eval RUN --episodes 50 --precision fp32), one fslab eval cannot score (no
    checkpoint yet, none ever written, a damaged one) with its line instead.
    """
    from fslab.core.sweeps import select_runs
    from fslab.reports.plot import draw, parse_size, png_path, series_data

    pixels = parse_size(size) if size else None
    out = png_path(out, x)
    shot_list = episode_options(split, shots, ways, queries)
    check_option("eval.precision", precision, "--precision")  # as fslab compare --precision is checked
    runs = select_runs(settings().runs_dir, refs, "plot")
    data = series_data(runs, x, series=config_keys(series, "--series"), split=split, shots=shot_list, ways=ways,
                       queries=queries, precision=None if precision == "auto" else precision)
    _say_plot_left_out(data)
    _say_data_split(data["data_split"], "line")
    say_damaged(data["damaged"])
    _say_empty_panels(data, (ways, queries), runs)
    try:
        width, height = draw(data, out, pixels, title)
    except OSError as exc:  # a read-only folder (a store's copy), a full disk: what to do instead
        raise FslabError(f"cannot write {out} ({exc.strerror or exc}); name a file in a folder this user can "
                         f"write with --out FILE.png") from None
    if as_json:
        print(json.dumps({"out": str(out), "width": width, "height": height, **data}))
        return
    points = sum(len(s["points"]) for panel in data["panels"] for s in panel["series"])
    panels = len(data["panels"])
    console.print(f"wrote {shown(str(out))} ({width}x{height} px, {count(panels, 'panel')}, "
                  f"{count(points, 'point')})", highlight=False)
