"""``fslab study list | show | run | report``: a paper's table or figure in one command.

The logic lives in :mod:`fslab.core.studies` (files) and :mod:`fslab.core.study_plan` (planning),
:mod:`fslab.execution.studies` (queueing, reuse) and :mod:`fslab.reports.studies`
(the side-by-side report); these commands only call them and print.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fslab.cli.common import (
    ExecutorOpt,
    JsonFlag,
    ReadPrecision,
    SetOpt,
    SlurmOpt,
    WideFlag,
    app,
    choices,
    console,
    err_console,
    names_of,
    overrides,
    registry,
    say_damaged,
    settings,
    shown,
)
from fslab.cli.tables import Col, fit, print_table
from fslab.core.text import count

# The study tables, and what they leave out first when the width is short (fslab.cli.tables).
LIST_COLUMNS = [Col("name", is_id=True), Col("table/figure", wrap=True), Col("paper", wrap=True),
                Col("runs", "right"), Col("quick", "right"), Col("published cells", "right"), Col("plugin")]
SWEEP_COLUMNS = [Col("sweep", is_id=True), Col("method"), Col("datasets", wrap=True), Col("grid", wrap=True),
                 Col("settings", wrap=True), Col("seeds", "right"), Col("runs", "right")]
# The sweep table's columns that move under it, a line a sweep, when the table is too wide.
SWEEP_DETAILS = ("grid", "settings")

study_app = typer.Typer(rich_markup_mode="rich", no_args_is_help=True,
                        help="Reproduce a paper's table or figure: list, show, run and report studies.")
app.add_typer(study_app, name="study")

def _studies(incomplete: str) -> list[str]:
    """Completion of STUDY: the registered studies' names, then the study files (.toml) where one is being typed."""
    from glob import escape as glob_escape
    from glob import glob

    files = sorted(glob(f"{glob_escape(incomplete)}*.toml")) if incomplete else []
    return names_of("study")(incomplete) + files


StudyRef = Annotated[str, typer.Argument(
    metavar="STUDY", help="Study name (see fslab study list), or the path of a study .toml file.",
    autocompletion=lambda incomplete: _studies(incomplete))]
StudyDatasetOpt = Annotated[str | None, typer.Option(
    "--dataset", help="Train and test every sweep on this dataset instead of the study's own "
                      "(the report then marks the numbers not comparable).", autocompletion=names_of("dataset"))]
StudyDataRootOpt = Annotated[str | None, typer.Option(
    "--data-root", help="The folder of the study's one dataset; a study on several datasets takes each "
                        "one's root from \\[data_roots] in fslab.toml.")]
ScaleOpt = Annotated[str, typer.Option(
    help="paper (the paper's seeds, datasets and budgets) or quick (the study's small CPU override: "
         "1 seed, 1 epoch, a narrow network on the synthetic dataset; minutes, for trying the path).",
    autocompletion=choices("paper", "quick"))]

NOT_HERE = ("not estimated from this store: no completed GPU run in it has the settings of these runs "
            "(seed and epochs aside)")


def gpu_hours_note(estimate: dict, costs, scale: str = "paper") -> str:
    """The GPU-hours line of ``fslab study show``: the estimate from this store's runs
    (:func:`fslab.execution.studies.gpu_hours`) and the costs the study file records, which
    are the paper scale's (said so at another scale)."""
    recorded = "; ".join(cost.text() for cost in costs) + (" for the paper scale" if costs and scale != "paper" else "")
    if estimate["hours"] is None:
        if recorded:
            return f"GPU-hours: {recorded}, as the study records; {NOT_HERE}."
        return f"GPU-hours: {NOT_HERE}, and the study records no measured cost."
    left = estimate["runs"] - estimate["estimated_runs"]
    here = (f"GPU-hours: about {estimate['hours']:.1f} for {estimate['estimated_runs']} of the {estimate['runs']} "
            f"runs, from the wall time per epoch of {count(len(estimate['measured_runs']), 'completed GPU run')} in "
            f"this store with the same settings (seed and epochs aside)"
            + (f"; the other {count(left, 'run')} {'has' if left == 1 else 'have'} no such run to measure "
               f"{'it' if left == 1 else 'them'} by." if left else "."))
    return f"{here} The study records: {recorded}." if recorded else here


def _load(ref: str):
    from fslab.core.errors import UnknownName
    from fslab.core.studies import find_study

    found = registry()
    try:
        return find_study(found, ref)
    except UnknownName as exc:  # a study whose package was uninstalled after its runs were made: say so
        if exc.what == "study" and not found.failures and (sweep := _recorded_study(ref)) is not None:
            allowed = str(exc).partition(" Allowed: ")[2]
            exc.args = (f"Unknown study '{ref}': this store has its runs (sweep {sweep}), but no plugin installed "
                        f"now registers its file; install again the package that ships it. Allowed: {allowed}",)
        raise


def _recorded_study(name: str) -> str | None:
    """The latest sweep of this store recorded by ``fslab study run NAME`` with NAME registered (not a file)."""
    from fslab.core.sweeps import sweep_records

    found = [r.get("id") for r in sweep_records(settings().runs_dir) if r.get("study") == name and not r.get("file")]
    return str(found[-1]) if found else None


@study_app.command("list")
def list_(as_json: JsonFlag = False, wide: WideFlag = False) -> None:
    """Every registered study: its paper, table or figure, and how many runs it takes.

    The runs are counted as fslab study run trains them: places alike in every setting (at quick scale, two
    datasets both trained on synthetic) are one run; --json also gives the places (places, quick_places).

    A study whose file cannot be read (registered by hand, not through register_study_files, which checks
    each) or whose runs cannot be resolved, or a plugin that failed to load (its studies among what is
    missing), is named with its error after the others, and the command then exits with 1, as fslab plugins
    does."""
    from fslab.core.errors import UsageError
    from fslab.core.studies import read_study
    from fslab.core.study_plan import resolve_study

    project = settings(store=False)
    found = registry(project)
    rows, broken = [], []
    for name in found.names("study"):
        component = found.get("study", name)
        try:
            study = read_study(component.target)
            (runs, places), (quick, quick_places) = (_run_count(resolve_study(
                study, scale, settings=project, registry=found)) for scale in ("paper", "quick"))
        except UsageError as exc:  # one plugin's broken or missing file hid every study
            broken.append(f"study '{name}' of plugin '{component.plugin}' left out: {exc}")
            continue
        rows.append({"name": name, "what": study.what, "title": study.title, "paper": study.paper.cite(),
                     "runs": runs, "quick_runs": quick, "places": places, "quick_places": quick_places,
                     "published": len(study.published), "plugin": component.version or component.plugin})
    if as_json:
        for row in rows:
            print(json.dumps(row))
    else:
        cells = [[r["name"], f"{r['what']}: {r['title']}", r["paper"], str(r["runs"]), str(r["quick_runs"]),
                  str(r["published"]), r["plugin"]] for r in rows]
        print_table(console, lambda width: fit(LIST_COLUMNS, cells, width, ["plugin", "published cells", "quick"]),
                    wide)
    for line in broken:
        err_console.print(shown(line), highlight=False)
    if broken or found.failures:  # a plugin that failed to load was named as the registry loaded
        raise typer.Exit(1)


def _run_count(resolved: list) -> tuple[int, int]:
    """The runs a study's ``resolved`` places take and how many places they serve (a place: a sweep, dataset,
    grid point and seed), as ``fslab study run`` counts them (:func:`fslab.core.study_plan.distinct_runs`)."""
    from fslab.core.study_plan import distinct_runs

    return len(distinct_runs(resolved)), len(resolved)


def _sweeps_shown(study, scale: str, resolved: list, dataset: str | None, set_: list[str] | None) -> list[dict]:
    """Each sweep of ``study`` as ``fslab study show`` gives it, at ``scale``, trained on ``dataset``
    (--dataset's; None: the study's own) with the settings of ``set_`` (--set's, as typed) on top of its own."""
    from fslab.core.assignments import parse_assignment
    from fslab.core.study_plan import run_dataset

    given = {".".join(path): value for path, value in map(parse_assignment, set_ or [])}
    seeds = study.seeds(scale)
    sweeps = []
    for s in study.sweeps:
        own = [(planned, config) for planned, config in resolved if planned.sweep == s.name]
        sweeps.append({"name": s.name, "label": s.label, "method": s.method, "seeds": seeds[s.name],
                       "datasets": {d: run_dataset(study, scale, d, dataset) for d in s.datasets},
                       "grid": {k: (study.quick.grid if scale == "quick" else {}).get(k, v) for k, v in s.grid.items()},
                       "set": {**s.set, **(study.quick.set if scale == "quick" else {}), **given},
                       "runs": _run_count(own)[0], "places": len(own)})
    return sweeps


@study_app.command()
def show(ref: StudyRef, scale: ScaleOpt = "paper", dataset: StudyDatasetOpt = None,
         data_root: StudyDataRootOpt = None, set_: SetOpt = None, as_json: JsonFlag = False,
         wide: WideFlag = False) -> None:
    """What a study runs: each sweep's method, datasets, grid, settings and seeds, and the run count.

    --dataset, --data-root and --set are fslab study run's: the study is planned (counted, priced, refused) as
    that command runs it. The run count is fslab study run's: places (sweep, dataset, grid point, seed) alike
    in every setting share one run, and the title says so ("5 runs for 10 places").

    GPU-hours are estimated for each run it trains (places that share a run priced once) only from completed
    GPU runs in this store with the same settings (seed and epochs aside), never resumed, and not ended before
    they started by their host's clock (set back as they trained); without any, the estimate is left out, never
    guessed. The costs the study file records (its cost tables: the paper scale's GPU-hours measured on a
    named GPU) are shown beside it.
    """
    from fslab.core.assignments import assignment
    from fslab.core.study_plan import resolve_study, run_options, runs_text, study_command
    from fslab.execution.studies import gpu_hours

    study = _load(ref)
    project = settings()
    extra = tuple(overrides(None, None, None, None, None, None, None, None, set_))
    resolved = resolve_study(study, scale, settings=project, registry=registry(project), dataset=dataset,
                             data_root=data_root, extra=extra)
    estimate = gpu_hours(resolved, project.runs_dir)
    runs, places = _run_count(resolved)
    sweeps = _sweeps_shown(study, scale, resolved, dataset, set_)
    info = {"name": study.name, "what": study.what, "title": study.title, "paper": study.paper.cite(),
            "description": study.description, "split": study.split, "scale": scale, "runs": runs, "places": places,
            "sweeps": sweeps, "published": len(study.published), "gpu_hours": estimate,
            "costs": [vars(cost) for cost in study.costs],
            "gpu_hours_note": gpu_hours_note(estimate, study.costs, scale),
            "command": study_command("run", ref, *run_options(scale, dataset=dataset, data_root=data_root,
                                                                set_=set_))}
    if as_json:
        print(json.dumps(info))
        return
    console.print(f"[bold]{shown(study.name)}[/bold]: {shown(study.what)} of {shown(info['paper'])}", highlight=False)
    console.print(shown(study.title), highlight=False)
    if study.description:
        console.print(shown(study.description), highlight=False)
    if study.split == "val":
        console.print("Scored on the validation classes: every run also tests its final network there "
                      "(eval.final_val=true), as the paper measured.", highlight=False)
    cells = [[s["name"], s["method"], ", ".join(d if d == t else f"{d} -> {t}" for d, t in s["datasets"].items()),
              "; ".join(assignment(k, v) for k, v in s["grid"].items()) or "-",
              ", ".join(assignment(k, v) for k, v in s["set"].items()) or "-", str(s["seeds"]), str(s["runs"])]
             for s in sweeps]
    title = f"scale {scale}: {runs_text(runs, places)}"
    headers = [c.header for c in SWEEP_COLUMNS]
    below = tuple(h for h in SWEEP_DETAILS if any(row[headers.index(h)] != "-" for row in cells))  # said under it
    table = print_table(console, lambda width: fit(SWEEP_COLUMNS, cells, width, list(SWEEP_DETAILS), title=title,
                                                   moved=below), wide)
    # What the table left out to fit stands under it, a line a sweep: squeezed into the table, a
    # sweep's settings would wrap a few letters a line.
    kept = {column.header for column in table.columns}
    moved = [(header, headers.index(header)) for header in SWEEP_DETAILS if header not in kept]
    for row in cells:
        details = [f"{header} {row[at]}" for header, at in moved if row[at] != "-"]
        if details:
            console.print(f"  {row[0]}: {'; '.join(details)}", highlight=False)
    console.print(f"{info['published']} published cells. {info['gpu_hours_note']}", highlight=False)
    if dataset is not None or data_root or set_:  # what was shown is what this command runs
        console.print(shown(f"planned as: {info['command']}"), highlight=False)


@study_app.command()
def run(
    ref: StudyRef,
    scale: ScaleOpt = "paper",
    dataset: StudyDatasetOpt = None,
    data_root: StudyDataRootOpt = None,
    set_: SetOpt = None,
    executor: ExecutorOpt = "local",
    slurm: SlurmOpt = None,
) -> None:
    """Queue every run of a study and start them (a local scheduler, or SLURM jobs).

    Runs already in the store with the same resolved settings are reused: completed ones count as done, queued
    or running ones are left to finish, failed, killed or lost ones resume from their checkpoints. So the same
    command again picks up where an interrupted study stopped (Ctrl-C, or a SIGTERM, while queueing removes the runs it
    created and had not yet recorded). Two started at once in one project queue each
    run once: the second waits for the first to finish queueing (runs/.study-queue.lock), then reuses its runs.

    --dataset trains every sweep on that dataset instead (the report then says the numbers are not comparable).
    --set changes a setting the study fixes (not comparable either); a key the study varies, the seed and the
    dataset are the study's own and are refused, as are eval.ways or eval.shots that score no published cell.
    A study file whose grid varies only what is no setting to a study (train.processes, device) is refused: its
    points would be one run.
    """
    from fslab.core.study_plan import run_options, study_command
    from fslab.execution import executor as executors

    study = _load(ref)
    project = settings()
    options = executors.job_options(project, executor, slurm)
    extra = tuple(overrides(None, None, None, None, None, None, None, None, set_))
    again = study_command("run", ref, *run_options(scale, dataset=dataset, data_root=data_root, set_=set_,
                                                    executor=executor, slurm=slurm))
    from fslab.cli.launch import sigterm_as_interrupt
    from fslab.core.errors import interrupted_code

    try:  # Ctrl-C, or a SIGTERM (timeout, a job's end) as Ctrl-C
        with sigterm_as_interrupt():
            outcome = executors.start_study(study, scale, settings=project, registry=registry(project),
                                            dataset=dataset, data_root=data_root, extra=extra, slurm=options,
                                            again=again)
    except KeyboardInterrupt as interrupt:  # the runs created and not yet recorded are removed (queue_study)
        err_console.print(shown(f"study {study.name}: interrupted while queueing; no run was left queued "
                                f"unrecorded, and the same command again picks up where it stopped: {again}"),
                          highlight=False)
        raise typer.Exit(interrupted_code(interrupt)) from None
    total = len(outcome.reused) + len(outcome.in_progress) + len(outcome.requeued) + len(outcome.created)
    console.print(f"study {study.name} (scale {scale}): {count(total, 'run')}: {len(outcome.reused)} done already, "
                  f"{len(outcome.in_progress)} queued or running, {len(outcome.requeued)} queued again, "
                  f"{len(outcome.created)} new; recorded as {outcome.sweep_id}", highlight=False)
    if outcome.project:
        from fslab.core.assignments import assignment

        changes = ", ".join(assignment(k, v) for k, v in outcome.project.items())
        err_console.print(shown(f"note: [run] of fslab.toml changes what the study fixes: {changes}; its report "
                                f"calls these numbers not comparable to the paper's"), highlight=False)
    report_it = study_command("report", ref)
    if len(outcome.reused) == total:  # nothing to train: no queue to follow
        console.print(shown(f"every run is done; see the report: {report_it}"), highlight=False)
        return
    follow = "fslab runs" if options is not None else "fslab queue"
    console.print(shown(f"follow them with: {follow}; then: {report_it}"), highlight=False)


@study_app.command()
def report(
    ref: StudyRef,
    fmt: Annotated[str, typer.Option("--format", help="md, latex, csv or json.",
                                     autocompletion=choices("md", "latex", "csv", "json"))] = "md",
    out_text: Annotated[str | None, typer.Option(  # text: typer makes --out '' Path('.'), the current folder
        "--out", metavar="DIR",
        help="A folder: write STUDY.md/.tex/.csv/.json there (and a PNG per dataset for a figure study) "
             "instead of printing.")]
    = None,
    scale: Annotated[str | None, typer.Option(
        help="Report the latest run of the study at this scale (default: the latest at any scale).",
        autocompletion=choices("paper", "quick"))] = None,
    precision: ReadPrecision = "auto",
) -> None:
    """The published numbers and fslab's side by side: mean ± 95% CI pooled over seeds, difference, verdict.

    reproduced: the published value lies inside fslab's CI widened by the published CI; not reproduced;
    pending: runs missing or unfinished, or completed without the cell's scores (the fslab eval that scores
    each, on the episode count every scored run of the cell reaches, else the count the run's own test drew (at
    most 100 for finetune), else its eval.test_episodes, is named
    under the title and on stderr, or, for a run fslab eval refuses (its checkpoint gone or damaged), its line;
    json: to_score, unevaluable); not comparable: another scale or dataset
    than the paper's, settings the study fixes changed by --set or by \\[run] of fslab.toml, or a cell whose
    seeds were scored on different data (another root of a folder dataset, files changed on disk), which are
    never pooled into one mean. A cell read on more episodes than the runs' own eval.test_episodes (fslab
    eval --episodes of every run), or whose runs were scored on different counts (each then read on its first
    N, N the most every run of the cell reaches), says so under the title.
    A cell whose runs another place of the study shares (places alike in every setting are one run) is
    marked, "(2/2 runs) [1]", and the note under the table names those places (a sweep by its label, and name
    where two share one; csv: shared_note, shared_with; json: shared_note, shared_with, shared_notes).

    csv and json give every accuracy, CI and difference in percent (points), in columns and fields
    named so: published_pct, published_ci95_pct, accuracy_pct, ci95_pct, difference_pct.
    A saved evaluation that cannot be read (a score of NaN, say) is left out and named on stderr.
    --precision fp32 (bf16, fp16) pools the scores of the networks run in that precision, as fslab compare
    --precision reads them, and says so under the title (csv and json: precision); a completed run without
    them is named on stderr (one line for all, as fslab compare says it) with the fslab eval RUN --episodes N
    --precision fp32 that scores it on its cells' count, and its cells stay pending.
    """
    from fslab.core.errors import FslabError
    from fslab.reports.studies import render, study_report, write_report

    out = _report_options(fmt, scale, precision, out_text)
    study = _load(ref)
    if out is not None:
        _check_out(out, study.name)
    runs_dir = settings().runs_dir
    result = study_report(study, runs_dir, scale, None if precision == "auto" else precision)
    _say_on_stderr(result, runs_dir, study.name)
    if out is None:
        print(render(result, fmt), end="")
        return
    try:
        written = write_report(result, study, fmt, out, runs_dir)
    except OSError as exc:  # a full disk, a read-only folder: which folder, and what to do instead
        raise FslabError(f"cannot write the report into {out} ({exc.strerror or exc}); name a folder this user "
                         f"can write with --out DIR") from None
    for path in written:
        console.print(f"wrote {shown(str(path))}", highlight=False)


def _say_on_stderr(result: dict, runs_dir: Path, name: str) -> None:
    """What fslab study report says on stderr above the report: the evaluations it could not read, where it
    runs in a project's subfolder with no run of the study the project above, and the fslab eval that
    scores the runs its cells lack."""
    from fslab.core.settings import project_above
    from fslab.reports.compare import unscored_line
    from fslab.reports.studies import to_score_line

    say_damaged(result["damaged"])
    if result["sweep"] is None and (above := project_above()):  # run in a project's subfolder: not its runs/
        err_console.print(shown(f"note: {runs_dir}/ holds no run of study {name}{above}"), highlight=False)
    for line in (unscored_line(result), to_score_line(result)):  # with the fslab eval that scores them
        if line:
            err_console.print(shown(line), highlight=False)


def _report_options(fmt: str, scale: str | None, precision: str, out_text: str | None) -> Path | None:
    """fslab study report's options checked before the study is read, each in one line: the --out folder, if any."""
    from fslab.core.config import check_option
    from fslab.core.errors import UsageError, unknown_format
    from fslab.core.studies import scale_option
    from fslab.reports.studies import FORMATS

    if fmt not in FORMATS:
        raise UsageError(unknown_format(fmt, FORMATS))
    if scale is not None:
        scale_option(scale)
    check_option("eval.precision", precision, "--precision")  # as fslab compare --precision is checked
    if out_text is not None and not out_text.strip():  # an unset $DIR: the report would land in the current folder
        raise UsageError("--out is empty; give the folder to write the report into (made if missing), or leave "
                         "--out out to print the report")
    return None if out_text is None else Path(out_text)


def _check_out(out: Path, name: str) -> None:
    """--out names a folder, or where one can be made: an existing file at it or above it is refused in
    one line (the report's files go inside it)."""
    from fslab.core.errors import UsageError

    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                raise UsageError(f"--out {out}: {folder} is a file, not a folder; give a folder, where the report "
                                 f"is written as {name}.md, .tex, .csv or .json (and a PNG per dataset for a figure)")
            return
