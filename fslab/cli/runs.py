"""Commands that read the run store: ``runs``, ``show``, ``logs``, and ``delete``, which
removes ended runs from it. What they show of a run comes from :mod:`fslab.core.summary`, as the
dashboard's does."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from typing import Annotated

import typer

from fslab.cli.common import (
    JsonFlag,
    RunRef,
    WideFlag,
    app,
    check_evaluator,
    comma_choices,
    console,
    ended_line,
    err_console,
    names_of,
    registry,
    runs_or_sweeps,
    settings,
    shown,
    sweep_ids,
)
from fslab.cli.tables import SHORT_IDS, Col, fit, print_table
from fslab.core.claims import PROBLEM_MARK, marked_state
from fslab.core.errors import FslabError, UsageError
from fslab.core.events import logged_evaluator, precision_note, table_score
from fslab.core.settings import project_above
from fslab.core.text import count, loss_text

DEFAULT_LIMIT = 50


def _states(text: str | None) -> tuple[str, ...]:
    from fslab.core.errors import UnknownName
    from fslab.core.states import STATES, UNREADABLE

    if text is None:
        return ()
    states = tuple(s.strip() for s in text.split(","))
    if not all(states):  # an empty item (completed,,failed) is a typo, as in --grid and --shots
        raise UsageError(f"--state takes states separated by commas (e.g. killed,failed), got '{text}'")
    for state in states:
        if state not in (*STATES, UNREADABLE):
            raise UnknownName("state", state, (*STATES, UNREADABLE))
    return states


def _no_runs_yet() -> str:
    """What an empty store's listing says: how to start, and a project's fslab.toml above this folder."""
    return "no runs yet; start one with: fslab run nca" + project_above()


def _none_match(runs_dir, states: tuple[str, ...], method: str | None, sweep: str | None) -> str:
    """Why no run is listed: each filter that no run meets even alone, with the
    values the runs have (a mistyped sweep id or method shows at once), or that
    only their combination leaves none."""
    from fslab.core.summary import list_summaries, sweep_members, unmet_filters

    every = list_summaries(runs_dir, limit=None)
    if not every:
        return _no_runs_yet()
    given = {"state": ",".join(states), "method": method, "sweep": sweep}
    have = {"state": sorted({s.state for s in every}), "method": sorted({s.method for s in every if s.method}),
            "sweep": sorted({s.sweep for s in every if s.sweep})}
    members = sweep_members(runs_dir, sweep)
    if _only_gone(runs_dir, sweep, every):  # each of its runs rm -r'd: its record is all there is
        ids = shown(", ".join(sorted(members)[:3])) + (", ..." if len(members) > 3 else "")  # as compare says them
        return (f"no runs match --sweep {sweep}: the {count(len(members), 'run')} its record names "
                f"{'is' if len(members) == 1 else 'are all'} gone, deleted by hand ({ids}); remove the record with: "
                f"fslab delete {sweep}")
    failed = [unmet_filters(s, states, method, sweep, members) for s in every]  # each filter is met or not on its own
    met_alone = {name for name in given if any(name not in names for names in failed)}
    unmet = [f"--{name} {given[name]} "
             f"({'the runs have ' + ', '.join(have[name]) if have[name] else 'no run belongs to a sweep'})"
             for name in given if given[name] and name not in met_alone]
    if unmet:
        return f"no runs match {'; '.join(unmet)}"
    return f"no runs match {' and '.join(f'--{n}' for n in given if given[n])} together (each matches some runs alone)"


def _only_gone(runs_dir, sweep: str | None, every: list) -> bool:
    """Whether every run the records of --sweep name is gone, deleted by hand, and no run left names the sweep
    (``every``: all the runs there are): the record is all there is of it."""
    from fslab.core.summary import sweep_members

    members = sweep_members(runs_dir, sweep) if sweep else []
    return bool(members) and not any((runs_dir / run_id).is_dir() for run_id in members) and not any(
        sweep in (s.sweep or "") for s in every)


def _sweep_filter(runs_dir, sweep: str | None) -> str | None:
    """--sweep as the listing filters by it: ``last`` the newest sweep's id (as RUN's last is the newest
    run), a record's path (runs/sweeps/<id>.json) its sweep's id, anything else as given."""
    from fslab.core.sweeps import record_named, refuse_records_folder, sweep_name

    if sweep is None:
        return None
    refuse_records_folder(runs_dir, sweep)
    return sweep_name(runs_dir, "last") if sweep == "last" else record_named(runs_dir, sweep) or sweep


def _check_sweep(runs_dir, sweep: str | None, listed: list) -> None:
    """Where no run is ``listed``, a UsageError for a --sweep that is part of no sweep's id, its record's or
    its runs': a mistyped id, not a sweep whose runs the other filters leave out (exit code 2, as fslab
    compare says it)."""
    from fslab.core.runstore import SWEEPS
    from fslab.core.summary import list_summaries
    from fslab.core.sweeps import load_sweep, no_sweep, sweep_records

    if listed or sweep is None:
        return
    names = sorted({str(record.get("id")) for record in sweep_records(runs_dir)}
                   | {s.sweep for s in list_summaries(runs_dir, limit=None) if s.sweep})
    if not any(sweep in name for name in names):
        if any(sweep in record.stem for record in (runs_dir / SWEEPS).glob("sweep-*.json")):
            load_sweep(runs_dir, sweep)  # a record that cannot be read: the line that says how to remove it
        raise no_sweep(f"--sweep {sweep}", sweep, names)


def _say_gone(runs_dir, sweep: str | None) -> None:
    """On stderr, for --sweep: the runs its sweeps' records name whose folders are gone (deleted by hand), which
    no listing can show, as fslab compare says them."""
    from fslab.core.summary import sweep_members

    gone = sorted(run_id for run_id in sweep_members(runs_dir, sweep) if not (runs_dir / run_id).is_dir())
    if gone:
        err_console.print(f"{count(len(gone), 'run')} left out, each one whose folder is gone, though its sweep's "
                          f"record names it: {shown(', '.join(gone[:5]))}{', ...' if len(gone) > 5 else ''}",
                          highlight=False)


@app.command()
def runs(
    as_json: JsonFlag = False,
    all_: Annotated[bool, typer.Option("--all", help="Every run, not only the newest 50.")] = False,
    limit: Annotated[int | None, typer.Option(
        help=f"How many of the newest runs to list (default {DEFAULT_LIMIT}; not with --all).")] = None,
    state: Annotated[str | None, typer.Option(
        help="Only runs in these states, comma-separated: queued, running, completed, failed, killed, lost, "
             "unreadable.",
        autocompletion=comma_choices("queued", "running", "completed", "failed", "killed", "lost", "unreadable"))]
    = None,
    method: Annotated[str | None, typer.Option(help="Only runs of this method recipe, e.g. nca.",
                                               autocompletion=names_of("method"))] = None,
    sweep: Annotated[str | None, typer.Option(
        help="Only runs of the sweeps whose id contains this, or of the newest sweep: last (the runs their "
             "records list, too; those whose folders are gone named on stderr, or, all gone, in the one line that "
             "says so), with a column for each key their "
             "grids vary; one that no sweep's id contains is refused.",
        autocompletion=sweep_ids)] = None,
    evaluator: Annotated[str | None, typer.Option(
        help="Test accuracies saved under this evaluator label, e.g. knn\\[k=3] (default: each run's own), "
             "of the run's latest checkpoint (at another query count than the run's, '(5q)' says so).",
        autocompletion=names_of("evaluator"))] = None,
    wide: WideFlag = False,
    ids: Annotated[bool, typer.Option(
        "--ids", "-q", help="Only the run ids, one per line (none: no line; runs the limit leaves out said on "
                            "stderr), to hand to another command: "
                            "fslab delete $(fslab runs --state failed --all -q) --yes.")] = False,
) -> None:
    """List runs, newest first: state, progress, loss, pairs, best validation and test accuracy.

    A queued run that will not start until a person acts (its claim file, runs/ID/.claimed, names no process, or
    a taker this machine cannot tell gone) is marked queued!, and fslab queue's line under the table says why and
    what to do ("problem" with --json, null for every other run)."""
    from fslab.core.runstore import short_ids
    from fslab.core.summary import list_summaries

    limit = _checked_limit(all_, limit, as_json, ids, {"--state": state, "--method": method, "--sweep": sweep})
    runs_dir = settings().runs_dir
    sweep = _sweep_filter(runs_dir, sweep)
    summaries = list_summaries(runs_dir, limit=None if all_ else limit + 1, states=_states(state), method=method,
                               sweep=sweep)  # one more than shown: whether the limit left any out
    more = not all_ and len(summaries) > limit
    summaries = summaries[:limit] if more else summaries
    _check_sweep(runs_dir, sweep, summaries)
    if summaries or as_json or ids or not _only_gone(runs_dir, sweep, list_summaries(runs_dir, limit=None)):
        _say_gone(runs_dir, sweep)  # else the one line below names them all gone, and the command that goes on
    _check_scored(summaries, evaluator)
    problems = {} if ids else claim_problems(runs_dir, summaries)
    if as_json or ids:
        _print_lines(summaries, ids, evaluator, limit if more else None, problems)
        return
    if not summaries:
        states = _states(state)
        console.print(_none_match(runs_dir, states, method, sweep) if states or method or sweep
                      else _no_runs_yet())
        return
    keys, values = _swept(runs_dir, sweep, summaries)
    rows = [_row(s, s.test_of(evaluator), values[s.id], problems.get(s.id)) for s in summaries]
    columns = [*RUN_COLUMNS[:SWEPT_AT], *(Col(key) for key in keys), *RUN_COLUMNS[SWEPT_AT:]]
    title = f"test: {shown(evaluator)}" if evaluator else None  # knn[k=3] is not markup
    print_table(console, lambda width: fit(columns, rows, width, _steps(keys, summaries),
                                           lambda ids: short_ids(runs_dir, ids), title), wide)
    _say_after_table(summaries, list(problems.values()))
    if more:
        console.print(f"the newest {limit} shown; --all or --limit N for more", highlight=False)


def _check_scored(summaries: list, evaluator: str | None) -> None:
    """With --evaluator that no listed run has test scores by: a typo is refused; where they have them by the
    same evaluator with other parameters, stderr names those labels."""
    if evaluator is not None and not any(s.test_of(evaluator) for s in summaries):
        check_evaluator(evaluator)  # a typo, not an evaluator no run was tested with yet
        if others := _other_labels(summaries, evaluator):  # knn asked, the runs scored by knn[k=3]: say so
            err_console.print(shown(f"no run listed has test scores by {evaluator}; they have them by "
                                    f"{', '.join(others)} (--evaluator '{others[0]}')"), highlight=False)


def _print_lines(summaries: list, ids: bool, evaluator: str | None, cut_at: int | None, problems: dict) -> None:
    """--ids or --json: a line per run on stdout (with --json, its claim's ``problem``, as fslab queue --json
    gives it); where the limit ``cut_at`` left runs out, a line on stderr, so a $(fslab runs -q) is told that it
    lacks some."""
    sys.stdout.write("".join((s.id if ids else json.dumps({**s.to_dict(), "test": s.test_of(evaluator),
                                                           "problem": problems.get(s.id)})) + "\n"
                             for s in summaries))
    if cut_at is not None:
        err_console.print(f"the newest {cut_at} listed; --all or --limit N for more", highlight=False)


def claim_problems(runs_dir, summaries: list) -> dict[str, str]:
    """The line of each listed run that will not start unless a person acts, by id
    (:meth:`fslab.core.runstore.Run.claim_problem`, as fslab queue says it). Only a queued run can have one:
    the claim files, and status files, of the others are not read, so a listing of ended runs costs no more."""
    from fslab.core.runstore import Run

    return {s.id: problem for s in summaries
            if s.state == "queued" and (problem := Run(runs_dir / s.id).claim_problem()) is not None}


PROBLEMS_SHOWN = 5  # the claim problems fslab runs says after its table; fslab queue says every one


def _say_after_table(summaries: list, problems: list[str]) -> None:
    """Under fslab runs' table: why the unreadable runs listed cannot be read, and the claim problems."""
    for s in [s for s in summaries if s.state == "unreadable"][:5]:
        console.print(f"{shown(s.id)} cannot be read: {shown(s.error)}", highlight=False)
    for problem in problems[:PROBLEMS_SHOWN]:
        console.print(shown(problem), highlight=False)
    if len(problems) > PROBLEMS_SHOWN:
        console.print(f"{len(problems) - PROBLEMS_SHOWN} more queued runs marked {PROBLEM_MARK} will not start "
                      f"unless a person acts; fslab queue says why for each", highlight=False)


# The runs table, and the order it gives way in when the width is short (fslab.cli.tables):
# at 80 columns id, method, state, epoch and the test accuracies are left.
RUN_COLUMNS = [Col("id", is_id=True), Col("method"), Col("loss fn"), Col("backbone"), Col("dataset"),
               Col("seed", "right"), Col("state"), Col("epoch", "right"), Col("loss", "right"),
               Col("pairs +/-", "right"), Col("best val", "right"), Col("test 1-shot", "right"),
               Col("test 5-shot", "right")]
RUN_STEPS = ["pairs +/-", "loss fn", "seed", "dataset", SHORT_IDS, "backbone", "loss", "best val"]
SWEPT_AT = 6  # with --sweep, the keys its grid varies come after seed


def _steps(swept: list[str], summaries: list) -> list[str]:
    """The order the runs table gives way in: with --sweep, a seed that tells the listed runs apart (a sweep of
    several seeds) is kept as its grid's keys are, where two rows of one grid point looked alike."""
    if swept and len({s.seed for s in summaries}) > 1:
        return [step for step in RUN_STEPS if step != "seed"]
    return RUN_STEPS


def _checked_limit(all_: bool, limit: int | None, as_json: bool, ids: bool, filters: dict) -> int:
    """fslab runs' options checked together; the number of runs to list."""
    if ids and as_json:
        raise UsageError("give --ids or --json, not both: --ids prints only the ids, --json every field")
    if all_ and limit is not None:
        raise UsageError(f"give --all or --limit N, not both: --all lists every run, --limit {limit} the newest "
                         f"{limit}")
    for option, value in filters.items():
        if value is not None and not value.replace(",", "").strip():
            raise UsageError(f"{option} needs a value, got {value!r}; leave the option out to list every run")
    limit = DEFAULT_LIMIT if limit is None else limit
    if limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}; use --all for every run")
    return limit


def _other_labels(summaries: list, evaluator: str) -> list[str]:
    """The labels of the evaluator ``evaluator`` names (other parameters: ``knn[k=3]`` for ``knn``)
    that the listed runs have test scores by."""
    from fslab.core.events import canonical_evaluator

    name = canonical_evaluator(evaluator).partition("[")[0]
    found = {label for s in summaries for label, scores in [(s.evaluator, s.test), *s.test_by_evaluator.items()]
             if scores and label and label.partition("[")[0] == name}
    return sorted(found)


def _swept(runs_dir, sweep: str | None, summaries: list) -> tuple[list[str], dict[str, list[str]]]:
    """With ``--sweep``: the keys the grids of the sweeps it names vary, and each run's values of them as
    --set writes them ("-" where its configuration has none, or cannot be read)."""
    from fslab.core.assignments import toml_value
    from fslab.core.keys import grid_leaves
    from fslab.core.runstore import Run
    from fslab.core.sweeps import sweep_records

    records = [r for r in sweep_records(runs_dir) if sweep is not None and sweep in str(r.get("id", ""))]
    keys = list(dict.fromkeys(k for r in records if isinstance(r.get("grid"), dict) for k in grid_leaves(r["grid"])))
    values = {}
    for summary in summaries:
        config = Run(runs_dir / summary.id).config() if keys else {}
        values[summary.id] = [toml_value(value) if (value := _at(config, key)) is not None else "-" for key in keys]
    return keys, values


def _at(config, key: str):
    for part in key.split("."):
        config = config.get(part) if isinstance(config, dict) else None
    return config


def _row(s, test: dict, swept: list[str] = (), problem: str | None = None) -> list[str]:
    known = lambda value: "-" if value is None else str(value)  # an unreadable run's: "-", as in the dashboard
    return [s.id, *map(known, (s.method, s.loss_fn, s.backbone, s.dataset, s.seed)), *swept,
            marked_state(s.state, problem),
            f"{s.epoch or 0}/{s.epochs if s.epochs is not None else '?'}",
            loss_text(s.loss),
            f"{s.positives}/{s.negatives}" if s.positives is not None else "-",
            table_score(s.best_val), table_score(test.get("1-shot")), table_score(test.get("5-shot"))]


@app.command()
def show(ref: RunRef, as_json: JsonFlag = False, wide: WideFlag = False) -> None:
    """Show one run: state, settings other than the defaults, progress, evaluations and where its time went.

    Also how its steps computed (device, precision, channels-last, TF32, compile mode, deterministic
    algorithms), as its latest start resolved them for its device (train.precision=auto: bf16 on a GPU that has it,
    else fp16; fp32 on the CPU). An evaluation of the network in another precision than the run's (fslab eval
    --precision) says which beside its evaluator: centroid, network in fp32.

    A queued run that will not start until a person acts (its claim file damaged, or held by a taker this machine
    cannot tell gone) says so under its state, in fslab queue's line ("problem" with --json).

    A data root that is no folder on this machine (the data moved, or the store was copied from another machine)
    is marked so: dataset.root=/lab/data (not on this machine) ("data_root_gone" with --json).

    And each sink that failed as the run trained (its tracker lacks the rest), fell behind and lost events, or had
    not finished when the run ended: at which epoch and step, why, and the fslab export RUN --to SINK that catches it
    up."""
    from fslab.core.events import numerics_text
    from fslab.core.runstore import find_run
    from fslab.core.sinks import failure_line, failures
    from fslab.core.summary import read_summary
    from fslab.core.timing import time_line, time_split

    run_ = find_run(settings().runs_dir, ref)
    summary = read_summary(run_.path)
    status = run_.status()
    events = run_.events()
    evaluations = [e for e in events if e.get("event") == "eval"]
    spent = time_split(events, status.get("started"), status.get("ended"), status.get("resumed"))
    stale = _stale_heartbeat(run_, summary, status)
    sinks = failures(run_.path)
    problem = run_.claim_problem(status) if summary.state == "queued" else None  # as fslab queue says it
    if as_json:
        print(json.dumps({**summary.to_dict(), "path": str(run_.path), "status": status, **_config_keys(run_),
                          "heartbeat_stale": stale is not None, "problem": problem, "evaluations": evaluations,
                          "results": run_.results(), "time": spent, "sink_failures": sinks}))
        return
    console.print(f"[bold]{shown(run_.id)}[/bold]  {summary.state}  ({shown(str(run_.path))})")
    for line in filter(None, (stale, problem)):  # its heartbeat's, then its claim's (fslab queue's line)
        console.print(shown(line), highlight=False)
    if summary.error:
        console.print(f"error: {shown(summary.error)}")
    for name, failure in sinks.items():  # the tracker stopped receiving: said here, not only in stderr.log
        console.print(shown(failure_line(run_.id, name, failure, summary.state)), highlight=False)
    console.print(_identity_line(summary, status))
    if status.get("slurm_job_id"):
        console.print(_slurm_line(run_, status, summary.state), highlight=False)
    changed, filled = _settings_line(run_)
    if changed:
        console.print(f"settings (those not fslab's defaults, as --set takes them): {shown(changed)}", highlight=False)
    if filled:
        console.print(shown(filled), highlight=False)
    starts = [e for e in events if e.get("event") == "start"]
    if starts and (computed := numerics_text(starts[-1])):  # resolved where it last started, not as asked
        console.print(f"computed {shown(computed)}", highlight=False)
    if summary.step:
        console.print(f"epoch {summary.epoch}/{summary.epochs}, step {summary.step}, loss {loss_text(summary.loss)}, "
                      f"pairs +{summary.positives}/-{summary.negatives}")
    if spent["total_s"] > 0:
        console.print(time_line(spent), highlight=False)
    rows = [[str(e.get("split")), *(str(e.get(k, "-")) for k in ("ways", "shots", "queries", "episodes", "epoch")),
             logged_evaluator(e) + precision_note(e), _score(e)] for e in evaluations]
    if rows:
        print_table(console, lambda width: fit(EVAL_COLUMNS, rows, width, EVAL_STEPS), wide)


def _config_keys(run_) -> dict:
    """fslab show --json's ``config``, and ``data_root_gone``: whether the run's data root is no folder on this
    machine (:func:`fslab.core.config.root_not_here`, which marks it in fslab show's lines too)."""
    from fslab.core.config import root_not_here

    config = run_.config()
    return {"config": config, "data_root_gone": root_not_here(config.get("dataset"), registry(settings())) is not None}


# fslab show's evaluations table, and the order it gives way in (fslab.cli.tables).
EVAL_COLUMNS = [Col("split"), *(Col(h, "right") for h in ("ways", "shots", "queries", "episodes", "epoch")),
                Col("evaluator", wrap=True), Col("accuracy (%)", "right")]
EVAL_STEPS = ["queries", "episodes", "ways"]


def _identity_line(summary, status: dict) -> str:
    """fslab show's line naming the run's method, backbone, dataset, seed, sweep and, where it tells, its pid
    (markup: its values are escaped)."""
    from fslab.core.states import LIVE

    known = lambda value: "-" if value is None else shown(str(value))  # as the runs table shows what is unknown
    return (f"method {known(summary.method)}, backbone {known(summary.backbone)}, "
            f"dataset {known(summary.dataset)}, seed {known(summary.seed)}"
            + (f", sweep {shown(summary.sweep)}" if summary.sweep else "")  # fslab runs --sweep lists its peers
            # its worker's pid while it lives, or where it died unrecorded (a run stopped while queued had
            # none; an ended run's is a process long gone, maybe another's now)
            + (f", pid {status['pid']}" if status.get("pid") and summary.state in (*LIVE, "lost") else ""))


def _slurm_line(run_, status: dict, state: str) -> str:
    """``SLURM job 1234, requeued 2 times; submitit's files and SLURM's logs: runs/<id>/slurm/``,
    saying so where the job ended without starting the run's worker."""
    from fslab.core.slurm_queue import waits_for_job
    from fslab.core.text import count

    requeues = status.get("requeues") or 0
    gone = (", which ended (or SLURM forgot it) before it started the run's worker"
            if state == "lost" and waits_for_job(status) else "")
    return (f"SLURM job {shown(str(status['slurm_job_id']))}" + (f", requeued {count(requeues, 'time')}" if requeues
                                                                  else "")
            + f"{gone}; submitit's files and SLURM's logs: {shown(str(run_.slurm_path))}/")


def _settings_line(run_) -> tuple[str, str]:
    """The run's settings that differ from fslab's defaults and from its
    plugins' (what its recipe, dataset, fslab.toml and command line set),
    method and seed aside; and where its data root is the one fslab fills in
    (:func:`_filled_root`), a line saying so, that root left out of the first. A dataset that reads no
    files (Registry.reads_files: synthetic) has no data root, named in neither. A root that is no folder
    on this machine is marked so, where either names it (:func:`fslab.core.config.root_not_here`)."""
    from fslab.core.assignments import assignment
    from fslab.core.config import DEFAULTS, NOT_HERE, outside_settings, root_not_here
    from fslab.core.keys import PLUGIN_SECTIONS, dotted

    try:
        config = run_.config()
    except FslabError:
        return "", ""  # the error line above says why
    plugins = registry(settings())
    dataset = config.get("dataset")
    # a dataset that reads no files (synthetic) has no data root: an earlier fslab saved one all the same
    rootless = isinstance(dataset, dict) and isinstance(dataset.get("name"), str) and not plugins.reads_files(
        dataset["name"])
    mark = f" {NOT_HERE}" if root_not_here(dataset, plugins) else ""
    filled = "" if rootless else _filled_root(dataset, mark)
    defaults = dotted(DEFAULTS)
    for section in PLUGIN_SECTIONS:
        chosen = config.get(section)
        try:  # a section that is not a table (a damaged config.json) names no plugin
            component = plugins.get(section, chosen.get("name") if isinstance(chosen, dict) else None)
        except FslabError:
            continue  # a plugin not installed here: its parameters are all shown
        defaults |= {f"{section}.{k}": v for k, v in component.params.items()}
    return ", ".join(assignment(k, v) + (mark if k == "dataset.root" else "") for k, v in dotted(config).items()
                     if k not in ("method", "seed", "config_version") and not outside_settings(k)
                     and (k not in defaults or defaults[k] != v)
                     and not ((filled or rootless) and k == "dataset.root")), filled


def _filled_root(dataset, mark: str = "") -> str:
    """``data root ROOT (as fslab fills it in ...)`` where the run's dataset.root is the one fslab fills in
    for its dataset in this project where none is set ([data_roots] of fslab.toml, else data/<dataset>);
    '' where it is another (set by the run's options, recipe or [run]: a setting like the others). ``mark``
    follows the root (`` (not on this machine)``)."""
    from fslab.core.config import filled_root, filled_root_source

    name, root = (dataset.get("name"), dataset.get("root")) if isinstance(dataset, dict) else (None, None)
    if not isinstance(name, str) or not isinstance(root, str):
        return ""
    project = settings()
    if root != os.path.abspath(os.path.expanduser(filled_root(project, name))):
        return ""
    return f"data root {root}{mark} (as fslab fills it in where none is set: {filled_root_source(project, name)})"


def _score(evaluation: dict) -> str:
    from fslab.core.events import score_cell

    return score_cell(evaluation)


def _stale_heartbeat(run_, summary, status: dict) -> str | None:
    """A line for a running run whose worker missed three heartbeats, else None; its age on the clock of
    the run's host (:attr:`fslab.core.summary.RunSummary.clock_ahead`), which wrote it."""
    from fslab.core.states import LOST_AFTER_S, heartbeat_age, heartbeat_interval, heartbeat_stale
    from fslab.core.worklock import is_held

    now = time.time() + summary.clock_ahead
    if summary.state != "running" or not heartbeat_stale(status, heartbeat_interval(run_.config()), now):
        return None
    why = ("its worker still holds the run's lock: paused or stuck" if is_held(run_.path)
           else f"the run is lost after {LOST_AFTER_S:.0f} s without one")
    return f"heartbeat stale: the last one was {heartbeat_age(status, now):.0f} s ago ({why})"


@app.command()
def logs(
    ref: RunRef,
    follow_: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing new lines until the run ends (and say on stderr how it ended, "
                                "if it did not complete, or why its status.json cannot tell).")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="Show the worker's stderr instead of stdout.")] = False,
    last: Annotated[int | None, typer.Option(
        "--tail", "-n", metavar="N",
        help="Only the last N lines (with --follow, then the new ones); default: the whole log.")] = None,
) -> None:
    """Print a run's output log."""
    from fslab.core.files import Tail, last_lines_start
    from fslab.core.runstore import find_run
    from fslab.core.states import LIVE
    from fslab.core.text import printable

    if last is not None and last < 0:
        raise UsageError(f"--tail must be 0 or more lines, got {last}; leave it out for the whole log")
    run_ = find_run(settings().runs_dir, ref)
    path = run_.path / ("stderr.log" if stderr else "stdout.log")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a folder, a FIFO, a device: nothing a worker wrote
            raise FslabError(f"cannot read {path}: it is not a regular file")
    except FileNotFoundError:  # not written yet: followed until it is, or said
        if not follow_:
            job = run_.status().get("slurm_job_id")
            err_console.print(shown(f"{run_.id} has no {path.name} yet (its worker has not started, or wrote "
                                    f"nothing there" + (f"; its SLURM job {job} writes its own logs in "
                                                        f"{run_.slurm_path}/" if job else "") + ")"),
                              highlight=False)
            return
    except OSError as exc:
        raise FslabError(f"cannot read {path}: {exc.strerror or exc}") from None
    tail = Tail(path, 0 if last is None else last_lines_start(path, last))
    while True:
        live = run_.state() in LIVE  # before the read, so the last lines a run writes are read below
        chunk, _ = tail.read(partial=True)
        if chunk:
            sys.stdout.write(printable(chunk.decode("utf-8", errors="replace"), lines=True))
            sys.stdout.flush()
        if not follow_ or (not chunk and not live):
            if follow_:
                _say_how_it_ended(run_, stderr)
            return
        time.sleep(0.25)


def _say_how_it_ended(run_, stderr: bool) -> None:
    """``fslab logs --follow``'s last word, on stderr, for a run that did not complete: how it
    ended and how it goes on, as ``fslab run`` says it. A worker killed outright (SIGKILL)
    writes no line of its own, and following it ended as quietly as a completed run."""
    from fslab.core.rerun import after_stop
    from fslab.core.states import UNREADABLE, unknown_state

    state = run_.state()
    if state == "completed":
        return
    status = run_.status()
    if state == UNREADABLE:  # its status.json is the reason: its worker's stderr would not say it
        why = unknown_state(status) or "its status.json is missing or cannot be read, so how it ended cannot be told"
        err_console.print(ended_line(run_.id, state, why, see_stderr=False), highlight=False)
        return
    error = status.get("error") or ("its worker died without recording an end (killed outright, "
                                    "or its machine went down)" if state == "lost" else "no error recorded")
    again = after_stop(run_) if state in ("killed", "lost") else ""
    err_console.print(ended_line(run_.id, state, str(error), see_stderr=not stderr, again=again), highlight=False)


@app.command()
def delete(
    refs: Annotated[list[str], typer.Argument(
        metavar="RUN|SWEEP", help="Runs or sweeps (ids, unique parts of ids, 'last', or runs' folders: runs/ID, "
                                  "whole, not a file in one); 'all' for every run.",
        autocompletion=runs_or_sweeps)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking (needed where no one can answer: "
                                                          "a script, a pipe).")] = False,
) -> None:
    """Delete ended runs for good: their folders, and their ids in the sweep records (a sweep left with none goes too).

    Queued and running runs are refused (stop them first with fslab stop); if any named run is one, nothing is
    deleted. Asks first, naming the runs, unless --yes is given (or every run named is gone already, deleted by
    hand). A sweep whose record cannot be read (not JSON, or not listing run ids) goes with the runs it still names
    and those whose status names the sweep, record included.

    Each run is said (ID: deleted) as its folder leaves the store; a Ctrl-C midway keeps the lines and the sweep
    records of those deleted by then, says how many were, and exits with 130.
    """
    from fslab.core.deletion import check_deletable, delete_records, delete_runs
    from fslab.core.sweeps import select_runs

    runs_dir, damaged = settings().runs_dir, []
    chosen = select_runs(runs_dir, refs, "delete", whole=True, damaged=damaged)  # a file's path: not its run
    check_deletable(chosen)
    present = [run for run in chosen if run.path.is_dir()]  # a sweep's runs deleted by hand: nothing to ask about
    if not yes and (present or damaged):
        named = ", ".join(run.id for run in present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        if damaged:  # a sweep whose record cannot be read: the record goes too
            named = (f"{named}; " if present else "") + "the damaged record " + ", ".join(map(str, damaged))
        if not sys.stdin.isatty():
            raise UsageError(f"fslab delete asks before it deletes {count(len(present), 'run')} ({named}), and no one "
                             "can answer here (stdin is not a terminal); add --yes to delete "
                             f"{'it' if len(present) + len(damaged) == 1 else 'them'}")
        try:  # the question inside: a Ctrl-C just after it shows, before the read begins, is the same no
            err_console.print(f"Delete {count(len(present), 'run')} for good ({named})? [y/N] ", end="",
                              highlight=False, markup=False)
            answer = sys.stdin.readline()
        except KeyboardInterrupt:  # Ctrl-C at the question: on a line of its own, as a no
            err_console.print("\nnothing deleted", highlight=False)
            raise typer.Exit(130) from None
        if answer.strip().lower() not in ("y", "yes"):  # stdout keeps only the ids deleted
            err_console.print("nothing deleted", highlight=False)
            raise typer.Exit(1)
    done = []

    def said(run_id: str, outcome: str) -> None:  # as each is deleted: a later failure or Ctrl-C keeps the lines
        done.append(run_id)
        console.print(f"{run_id}: {'deleted' if outcome == 'deleted' else 'gone already (its folder was deleted)'}",
                      highlight=False)

    try:
        delete_runs(runs_dir, chosen, said)
    except KeyboardInterrupt:  # the runs said are gone, from the sweep records too; the others untouched
        err_console.print(f"fslab delete interrupted after {len(done)} of {count(len(chosen), 'run')}: those said "
                          f"above are deleted, the others are as they were (fslab runs lists them)", highlight=False)
        raise typer.Exit(130) from None
    delete_records(damaged)
    for path in damaged:
        console.print(f"{path.stem}: damaged sweep record deleted", highlight=False)
