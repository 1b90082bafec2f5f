"""Commands that start and stop work: ``run``, ``resume``, ``stop``, ``sweep``, ``queue``.
Each is a thin front to :mod:`fslab.execution.executor`, which the dashboard calls too."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from fslab.cli.common import (
    BackboneOpt,
    BatchSizeOpt,
    DataRootOpt,
    DatasetOpt,
    DeviceOpt,
    EpochsOpt,
    ExecutorOpt,
    GpusOpt,
    JsonFlag,
    LrOpt,
    SeedOpt,
    SetOpt,
    SinkOpt,
    SlurmOpt,
    WideFlag,
    app,
    choices,
    config_keys,
    console,
    ended_line,
    err_console,
    live_run_or_sweep,
    names_of,
    overrides,
    registry,
    run_ids,
    runs_in,
    same_value,
    settings,
    shown,
    sweep_ids,
)
from fslab.cli.tables import SHORT_IDS, Col, fit, print_table
from fslab.core.claims import marked_state
from fslab.core.errors import Terminated, UsageError, interrupted_code
from fslab.core.states import RESUMABLE
from fslab.core.text import count


@app.command()
def run(
    method: Annotated[str | None, typer.Argument(
        metavar="METHOD", help="Method recipe, e.g. nca or protonet (see fslab plugins --kind method); "
                                 "not with --like.", autocompletion=names_of("method"))] = None,
    like: Annotated[str | None, typer.Option(
        "--like", metavar="RUN", autocompletion=run_ids,
        help="Start a new run with RUN's saved configuration, every key of it; the other options given go on top "
             "(e.g. --like RUN --seed 1).")] = None,
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
    sink: SinkOpt = None,
    detach: Annotated[bool, typer.Option("--detach", "-d",
                                         help="Start the run and return at once, printing its id "
                                              "(on stderr where stdout has no reader).")] = False,
    executor: ExecutorOpt = "local",
    slurm: SlurmOpt = None,
) -> None:
    """Start a training run in a new worker process and follow it (or submit it as a SLURM job).

    Following it shows a progress bar in a terminal; into a file or a pipe, one plain line per epoch.

    The whole configuration is checked first (ranges, device, episodes against the data, plugin parameters).

    A mistake is one line and exit code 2, and no run folder is created.

    Ctrl-C (or a SIGTERM) stops the worker, one pressed while it starts included: the run ends killed, exit code
    130 (143 for SIGTERM).

    A reader of the output that goes away (| head -2) leaves the run training, as --detach does: stderr says so,
    with how to follow or stop it (exit code 141).
    """
    from fslab.execution import executor as executors

    project = settings()
    options = executors.job_options(project, executor, slurm)
    layers = overrides(backbone, dataset, data_root, epochs, batch_size, lr, seed, device, set_, gpus, sink)
    method, layers = _method_and_layers(method, like, layers, project)
    held = HeldSignals()
    try:
        started = executors.launch(method, layers, settings=project, registry=registry(project), slurm=options,
                                   starting=held.hold)
    except UsageError as exc:
        held.release(raise_held=False)
        raise _like_root_gone(like, layers, exc, project) or exc from None
    except BaseException:
        held.release(raise_held=False)
        raise
    line = started.run.id if detach else None  # else followed to its end
    if started.job_id is not None and not detach:
        line = (f"run {started.run.id}: submitted as SLURM job {started.job_id}; "
                f"follow it with: fslab logs {started.run.id} --follow")
    _go_on(started, held, line)


def _go_on(started, held: HeldSignals, line: str | None, until_replaced: int | None = None) -> None:
    """After a start: ``line`` (the id, with --detach; a SLURM job's line), or, where there is none, the
    worker followed to its end. A Ctrl-C or SIGTERM held while the worker started (:class:`HeldSignals`)
    stops it, as one while following does; a SLURM job, submitted, is left to its line, and the command
    exits as interrupted (130, or 143 for SIGTERM)."""
    if line is None:
        _follow_to_end(started.run, started.process, until_replaced=until_replaced, held=held)
        return
    with _trains_on_unread(started.run, started.process):  # fslab run --detach | true: the id said on stderr
        console.print(line, highlight=False, markup=False)
    try:
        held.release()
    except KeyboardInterrupt as interrupt:
        if started.process is not None:
            _stop_started(started.run, started.process, interrupt)
        raise typer.Exit(interrupted_code(interrupt)) from None


def _like_root_gone(like: str | None, layers: list[dict], exc: UsageError, project) -> UsageError | None:
    """With --like RUN, where ``exc`` is the dataset's line for RUN's saved data root and that root is
    gone: a line that says only --data-root moves it (the saved root is a layer above [data_roots] of
    fslab.toml, which the dataset's own line also suggests), naming this project's folder for the dataset."""
    from fslab.execution.data_roots import like_root_gone

    return None if like is None else like_root_gone(f"--like {like}: that run", layers, exc, "--data-root DIR",
                                                    project)


def _method_and_layers(method: str | None, like: str | None, layers: list[dict], project) -> tuple[str, list[dict]]:
    """METHOD and the options' layers, or with ``--like RUN`` that run's
    method and saved configuration with the options on top (:func:`fslab.core.rerun.like`)."""
    if like is None:
        if method is None:
            raise UsageError("fslab run needs a METHOD (e.g. fslab run nca) or --like RUN")
        return method, layers
    if method is not None:
        raise UsageError(f"give either METHOD or --like RUN, not both (got {method!r} and --like {like!r})")
    from fslab.core.rerun import like as like_run
    from fslab.core.runstore import find_run

    return like_run(find_run(project.runs_dir, like), layers, registry(project))


def _follow_to_end(run_, process, until_replaced: int | None = None, held: HeldSignals | None = None) -> None:
    """Follow a started worker (a resumed run's once it has cut its events back to the checkpoint:
    ``until_replaced``, :func:`fslab.cli.follow.follow`); print the test accuracies, or why it ended."""
    from fslab.cli.follow import follow
    from fslab.core.rerun import after_stop
    from fslab.execution.local import reap

    try:  # from the first line on, Ctrl-C (or a SIGTERM: kill, timeout) stops the worker it started
        if held is not None:  # one pressed while the worker started: now, where it stops the worker
            held.release()
        with sigterm_as_interrupt(), _trains_on_unread(run_, process):
            console.print(f"run [bold]{run_.id}[/bold] in {shown(str(run_.path))}", highlight=False)
            state = follow(run_, console, process, until_replaced=until_replaced)
    except KeyboardInterrupt as interrupt:
        state = _stop_started(run_, process, interrupt)
    reap(process)
    results = run_.results()
    if state == "completed" and results:
        for line in _test_lines(results):
            console.print(line, highlight=False)
        return
    status = run_.status()
    error = status.get("error") or _signal_text(process.returncode) or "no error recorded"
    if state == "killed":  # stopped from elsewhere (fslab stop, the dashboard): as after Ctrl-C here
        err_console.print(f"{run_.id}: killed ({shown(str(error))}); {after_stop(run_)}", highlight=False)
        raise typer.Exit(130)
    again = after_stop(run_) if state == "lost" else ""  # its worker died: what it kept, how to go on
    err_console.print(ended_line(run_.id, state, str(error), again=again), highlight=False)
    raise typer.Exit(1)


@contextlib.contextmanager
def _trains_on_unread(run_, process):
    """A reader of the progress that went away (``fslab run nca | head -2``, a pager quit) stops the following,
    not the run: the worker trains on, as after --detach, and one line on stderr says so with the commands that
    follow and stop it; the exit code is that of any command cut short, 141. It used to say nothing, and the run
    trained on unseen. A worker that has ended by then leaves nothing to say; a SLURM job's (no ``process``)
    is said as submitted."""
    from fslab.cli import cut_short, end_cut_short

    try:
        yield
    except (BrokenPipeError, SystemExit) as exc:  # rich ends a console whose pipe broke with SystemExit(1)
        if isinstance(exc, SystemExit) and not cut_short(exc):
            raise
        if process is not None and process.poll() is not None:
            end_cut_short()
        goes_on = "trains on" if process is not None else "was submitted to SLURM"
        end_cut_short(f"run {run_.id} {goes_on}: the reader of this output went away; follow it with: "
                      f"fslab logs {run_.id} --follow; stop it with: fslab stop {run_.id}")


def _test_lines(results: dict) -> list[str]:
    """The final network's test scores as results.json holds them: at eval.ways (``test``), then at each of
    eval.extra_ways (``test_20way``), which the lines printed as the run went (validations) do not show."""
    from fslab.core.events import accuracy_text
    from fslab.core.schemas import SCORE, complete

    extra = sorted((int(key[5:-3]), key) for key, value in results.items()
                   if re.fullmatch(r"test_\d+way", key) and isinstance(value, dict))
    return [f"test {ways}-way {shots}: {accuracy_text(score)} ({results['episodes']} episodes)"
            for ways, key in [(results["ways"], "test"), *extra] for shots, score in results[key].items()
            if complete(score, SCORE)]


def _stop_started(run_, process, interrupt: KeyboardInterrupt) -> str:
    """Stop the worker this command started, on a Ctrl-C or SIGTERM (``interrupt``): where it ends killed,
    what it kept and how it goes on, and exit 130 (143 for SIGTERM); else the state it ended in by itself."""
    from fslab.core.rerun import after_stop
    from fslab.execution.executor import stop as stop_run
    from fslab.execution.local import reap

    console.print("stopping ...")
    try:
        state = stop_run(run_)
    except UsageError:  # it ended on its own meanwhile
        state = run_.state()
    reap(process)
    if state == "killed":  # else it completed or failed before the stop: said as it ended
        console.print(f"{run_.id}: {state}; {after_stop(run_)}", highlight=False)
        raise typer.Exit(interrupted_code(interrupt)) from None
    return state


class HeldSignals:
    """Ctrl-C and SIGTERM held from just before a worker starts until it is followed, then raised there, where
    the worker is stopped. Raised at once, one that came after the worker started but before it was followed
    ended ``fslab run`` (exit 130, not a word) and left the worker training with no one following it."""

    def __init__(self) -> None:
        self.held: int | None = None
        self.previous: dict = {}

    def hold(self) -> None:
        import signal

        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is signal.SIG_IGN:  # ignored (a background job's Ctrl-C): so it stays
                continue
            try:
                self.previous[signum] = signal.signal(signum, self._note)
            except ValueError:  # not the main thread (an embedding caller): signals stay as they are
                return

    def _note(self, signum, frame) -> None:
        self.held = self.held or signum

    def release(self, raise_held: bool = True) -> None:
        """The handlers as they were; a signal held meanwhile raised now (SIGTERM as :class:`Terminated`)."""
        import signal

        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}
        held, self.held = self.held, None
        if raise_held and held == signal.SIGTERM:
            raise Terminated
        if raise_held and held is not None:
            raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises :class:`Terminated` inside the block, so it is handled as Ctrl-C (and exits 143,
    :func:`fslab.core.errors.interrupted_code`). A follower killed (``kill``, ``timeout``, a job's end)
    used to die at once and leave its worker training on with no one to stop it; a sweep or study, the
    runs it had begun to queue, unrecorded."""
    import signal

    def terminated(signum, frame):
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread (an embedding caller): leave SIGTERM as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _signal_text(returncode: int | None) -> str:
    """``the worker was killed by SIGKILL`` for a worker a signal ended (a negative exit code)."""
    import signal

    if returncode is None or returncode >= 0:
        return ""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"the worker was killed by {name} (out of memory, or another program)" if name == "SIGKILL" \
        else f"the worker was ended by {name}"


@app.command()
def resume(
    ref: Annotated[str, typer.Argument(
        metavar="RUN", help="Run id, a unique part of it (such as the short ids tables show), 'last', "
                            "or its folder's path (runs/ID).",
        autocompletion=runs_in(*RESUMABLE))],
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Resume and return at once.")] = False,
    executor: Annotated[str | None, typer.Option(
        help="local or slurm (default: where the run last ran).", autocompletion=choices("local", "slurm"))] = None,
    slurm: SlurmOpt = None,
    data_root: Annotated[Path | None, typer.Option(
        help="Where the run's data lies now, if it moved (its root is gone, or a store was copied to a machine "
             "whose data lies elsewhere): saved as its root (fslab show reads it) once it holds the data the run "
             "started on (a resume takes no other setting).")] = None,
) -> None:
    """Continue a killed, lost or failed run from its last checkpoint, in its folder (a --gpus N run on N again).

    A run whose worker still lives, even paused, is refused: one worker per run.
    A queued run nobody holds is started here: one whose starter (fslab run, a scheduler, a sweep) was killed on this
    host before starting it is said on stderr. One held by a SLURM submission killed before it recorded the job is
    refused, saying how to free it, and so is one whose claim file (runs/ID/.claimed) names no process (damaged) or a
    taker this machine cannot tell gone, in fslab queue's line. One queued in a sweep (or a study) never trains beside
    the slots: it is left to the scheduler running, said in one line, or with none running started in a free slot only.
    Nor does a sweep's failed, killed or lost run: with the scheduler running it is queued again for it, said in one
    line (nothing followed), and with none running started in a free slot only. With every slot busy and no scheduler
    running, either is left queued (or queued again) and a scheduler is started for it, said in one line. A hand-back to
    the scheduler first waits for a scheduler's last look at the queue under way, as long as it lasts (said on stderr,
    naming who holds the hand-back lock; Ctrl-C stops the wait, the run left as it was).

    Its configuration is checked again first, as fslab run checks one; a plugin it was
    trained with that none installed registers is named, with how the run goes on.

    It reads its data from the root it was created with; --data-root DIR moves it there for good (the root it
    leaves kept in a data_root event of metrics.jsonl), refused in one line, nothing changed, where DIR's splits
    differ from those the run started on (their images, classes or labels).

    Ctrl-C (or a SIGTERM) stops the worker again, one pressed while it starts included (exit code 130, or 143).
    A reader of the output that goes away (| head -2) leaves it training, said on stderr (exit code 141).
    """
    from fslab.cli.follow import events_file
    from fslab.core.runstore import find_run
    from fslab.execution import executor as executors

    project = settings()
    run = find_run(project.runs_dir, ref)
    holder = run.stale_claim() if run.claimed() else None
    before = events_file(run)  # the file the worker replaces by its cut
    held = HeldSignals()
    try:
        started = executors.resume(run, settings=project, registry=registry(project), executor=executor,
                                   overrides=slurm, starting=held.hold,
                                   data_root=None if data_root is None else str(data_root))
    except BaseException:
        held.release(raise_held=False)
        raise
    if holder is not None:
        err_console.print(f"run {run.id} was queued, held by {holder.describe()}, which is gone (killed before it "
                          f"started the run); started here", highlight=False)
    line = started.run.id if detach else None  # else followed to its end
    if started.job_id is not None:
        line = f"run {started.run.id}: resuming as SLURM job {started.job_id}"
    line = started.queued or line  # a sweep's run handed back to the scheduler running: nothing to follow
    _go_on(started, held, line, until_replaced=before)


@app.command()
def stop(refs: Annotated[list[str], typer.Argument(
        metavar="RUN|SWEEP", help="Run ids, unique parts of them (such as the short ids tables show), 'last' or "
                                  "runs' folders (runs/ID); "
                                  "or sweep ids (sweep-...) or parts of them that no run id holds: each of its queued "
                                  "and running runs.",
        autocompletion=live_run_or_sweep)]) -> None:
    """Stop queued or running runs: each ends as 'killed' and keeps its last checkpoint, if it wrote one.

    Only the run's own worker is signalled; one on another host gets a stop request (read at its next heartbeat).
    One on another host that has written no heartbeat into the run's folder for three beats (a copy of the folder
    made while it trained) would never read it: that is said at once in one line naming the host (exit code 2).
    A run whose worker fslab resume is starting is stopped once that worker is recorded.
    A queued run held by a process of this host killed before starting it is stopped at once (said on stderr), as is
    one held by a SLURM submission killed before it recorded its job (stderr names the squeue that finds the job).
    A run whose config.json is missing or damaged (listed unreadable) is stopped as its status.json says, said on
    stderr with the file to put back before it goes on.
    A sweep id stops every queued and running run of the sweep (or of a study's run), the queued ones first.
    Several given (fslab stop $(fslab runs --state running --all -q)): each is found before any is stopped, and one
    that ended meanwhile is said on stderr and passed over (the command fails only if none was stopped).
    'all' is refused: name the runs, as that $(...) does.
    """
    from fslab.core.sweeps import names_sweep, run_or_sweep

    runs_dir = settings().runs_dir
    if "all" in refs:  # every run of the project, another user's included: too much for one word
        raise UsageError("fslab stop takes no 'all': name the runs or sweeps to stop, as in: "
                         "fslab stop $(fslab runs --state queued,running --all -q)")
    targets = [(ref, True) if names_sweep(runs_dir, ref) else (run_or_sweep(runs_dir, ref), False) for ref in refs]
    if len(targets) == 1:  # one run or sweep: one that has nothing to stop is the command's error
        target, sweep = targets[0]
        (_stop_sweep if sweep else _stop_run)(runs_dir, target, seen=set())
        return
    seen: set[str] = set()
    stopped = 0
    for target, sweep in targets:
        try:
            stopped += (_stop_sweep if sweep else _stop_run)(runs_dir, target, seen=seen)
        except UsageError as exc:  # ended between the listing and the stop: passed over, said
            err_console.print(shown(f"not stopped: {exc}"), highlight=False)
    if not stopped:
        raise UsageError(f"none of the {count(len(refs), 'run or sweep', 'runs or sweeps')} given was queued or "
                         "running; nothing was stopped")


def _stop_run(runs_dir, run_, *, seen: set[str]) -> int:
    """Stop one run (``fslab stop RUN``), said on stdout with its hint on stderr; how many were stopped (0: given
    twice, as an id and as a part of one)."""
    from fslab.core.claims import damaged_claim_line, stopped_submission_line
    from fslab.core.rerun import after_stop
    from fslab.execution.executor import stop as stop_run

    if run_.id in seen:
        return 0
    seen.add(run_.id)
    claimed = run_.path.is_dir() and run_.claimed()
    holder = run_.stale_claim() if claimed else None
    submitted = run_.lost_submission() if claimed else None  # a SLURM job of it may be queued
    damaged = run_.damaged_claim() if claimed else None  # no taker named: none to wait for
    state = stop_run(run_)
    if holder is not None:
        err_console.print(f"run {run_.id} was queued, held by {holder.describe()}, which is gone (killed before it "
                          f"started the run); stopped without waiting for it", highlight=False)
    elif submitted is not None and state == "killed":
        err_console.print(stopped_submission_line(run_.id, submitted), highlight=False)
    elif damaged is not None and state == "killed":
        err_console.print(shown(damaged_claim_line(run_.path, damaged, stopped=True)), highlight=False)
    console.print(f"{run_.id}: {state}", highlight=False)
    if state == "killed":  # a hint, on stderr: stdout stays the one line scripts read
        err_console.print(shown(after_stop(run_)), highlight=False)
    return 1


def _stop_sweep(runs_dir, ref: str, *, seen: set[str]) -> int:
    """Stop a sweep's queued, then running, runs (``fslab stop SWEEP``), each said on stdout, then the command
    that goes on; how many were stopped. A sweep with none to stop is a UsageError."""
    from fslab.core.claims import damaged_claim_line, stopped_submission_line
    from fslab.core.sweeps import sweep_runs
    from fslab.execution.executor import stop_sweep

    before = _sweep_record(runs_dir, ref)  # None: stop_sweep says why the sweep cannot be read
    freed = [(run_, holder) for run_, holder in _stale_claims(runs_dir, before) if run_.id not in seen]
    # held by a SLURM submission killed before it recorded the job: a job may be queued
    submitted = {run_.id: holder for run_, holder in _lost_submissions(runs_dir, before)}
    damaged = {run_.id: what for run_ in (sweep_runs(runs_dir, before) if before is not None else [])
               if run_.path.is_dir() and (what := run_.damaged_claim()) is not None}
    record, stopped, refused = stop_sweep(runs_dir, ref, skip=seen)
    for line in refused[:-1] if not stopped else refused:  # another host's worker, this store a copy
        err_console.print(shown(f"not stopped: {line}"), highlight=False)
    if not stopped:
        raise UsageError(refused[-1] if refused else f"sweep {record['id']} has no queued or running run; "
                                                     f"nothing to stop")
    for run_, state in stopped:
        seen.add(run_.id)
        console.print(f"{run_.id}: {state}", highlight=False)
    freed = [pair for pair in freed if pair[0].id in {run_.id for run_, _ in stopped}]
    _say_freed(freed, record["id"], f"stopped without waiting for {'them' if len(freed) > 1 else 'it'}")
    for run_, state in stopped:
        if run_.id in submitted and state == "killed":
            err_console.print(stopped_submission_line(run_.id, submitted[run_.id]), highlight=False)
        elif run_.id in damaged and state == "killed":
            err_console.print(shown(damaged_claim_line(run_.path, damaged[run_.id], stopped=True)), highlight=False)
    again = record.get("again") if isinstance(record.get("again"), str) else (  # a study's: as it was run
        f"fslab study run {record['study']} --scale {record.get('scale', 'paper')}" if record.get("study")
        else f"fslab sweep resume {record['id']}")
    said = (f"{count(len(stopped), 'run')} of {record['id']} stopped; each that had started "
            f"keeps its last checkpoint; go on with: {again}")
    err_console.print(shown(said), highlight=False)
    return len(stopped)


def _sweep_words(ctx: typer.Context, incomplete: str) -> list[str]:
    """Completion of fslab sweep's words: a method or ``resume``, and after ``resume`` a sweep id."""
    given = list(ctx.params.get("targets") or [])
    if given == ["resume"]:
        return sweep_ids(incomplete)
    return [] if given else names_of("method")(incomplete) + choices("resume")(incomplete)


@app.command(context_settings={"allow_interspersed_args": True})
def sweep(
    targets: Annotated[list[str] | None, typer.Argument(
        metavar="METHOD | resume SWEEP", help="METHOD, or: resume SWEEP.", autocompletion=_sweep_words)] = None,
    seeds: Annotated[int | None, typer.Option(
        help="Seeds per combination (0, 1, ... or from --seed); default 1, or seeds of the --file.")] = None,
    grid: Annotated[list[str] | None, typer.Option(
        "--grid", metavar="KEY=V1,V2", autocompletion=config_keys(grid=True),
        help="key=v1,v2,... (repeatable); keys as in --set, "
                       "or backbone/dataset/epochs/batch_size/lr.")] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", help="A sweep file in TOML: method, seeds, fail_fast, a grid table and a set table.")] = None,
    backbone: BackboneOpt = None,
    dataset: DatasetOpt = None,
    data_root: DataRootOpt = None,
    epochs: EpochsOpt = None,
    batch_size: BatchSizeOpt = None,
    lr: LrOpt = None,
    seed: Annotated[int | None, typer.Option(help="First seed.")] = None,
    device: DeviceOpt = None,
    set_: SetOpt = None,
    gpus: GpusOpt = None,
    sink: SinkOpt = None,
    fail_fast: Annotated[bool, typer.Option(
        "--fail-fast", help="At the first failed run, cancel the runs still queued "
                            "(with --executor slurm: the jobs not yet started).")] = False,
    executor: Annotated[str | None, typer.Option(
        help="local (worker processes here) or slurm (SLURM jobs through submitit, settings in \\[slurm] of "
             "fslab.toml); default: local, and for resume where the sweep's runs last ran.",
        autocompletion=choices("local", "slurm"))] = None,
    slurm: SlurmOpt = None,
) -> None:
    """Queue one run per grid combination and seed, and start them as slots free up (or submit each as a SLURM job).

    Every combination is checked as fslab run checks one, and against the scheduler's slots, before anything is
    queued; a refusal begins with its grid point (grid point train.processes=5: ...).

    \b
    [bold]fslab sweep nca --seeds 5 --grid batch_size=128,256,512[/bold]: 15 runs;
    [bold]fslab sweep resume SWEEP[/bold] queues again what failed, was killed or was lost.

    A resume takes only --executor, --slurm and --data-root DIR: each run it queues again, or that waits unstarted,
    moves onto DIR as fslab resume RUN --data-root DIR moves one, all or none: every run is checked before any moves.

    With nothing to queue again, it starts a scheduler for the runs still waiting (SLURM: submits them), freeing any
    held by a killed process of this host (one held by a killed SLURM submission is passed over, saying how to free
    it). Runs start once the record names them; Ctrl-C (or a SIGTERM) before removes them.
    """
    from fslab.execution import executor as executors

    project = settings()
    targets = targets or []
    if targets[:1] == ["resume"]:
        _refuse_new_sweep_options(seeds, grid, file, backbone, dataset, epochs, batch_size, lr, seed,
                                  device, set_, gpus, sink, fail_fast)
        return _resume_sweep(targets, project, executor, slurm, data_root)
    options = executors.job_options(project, executor, slurm)
    where = "submitted as SLURM jobs" if options is not None else "queued"
    method, seeds, fail_fast, grid_values, fixed = _sweep_spec(targets, file, seeds, fail_fast, grid or [])
    _options_against_the_file(file, fixed, backbone=backbone, dataset=dataset, data_root=data_root, epochs=epochs,
                              batch_size=batch_size, lr=lr, seed=seed, device=device, gpus=gpus)
    base = overrides(backbone, dataset, data_root, epochs, batch_size, lr, seed, device, set_, gpus, sink,
                     file_set=fixed)
    sweep_id, runs = _start_sweep(executors, method, grid_values, seeds, base, project, fail_fast, options)
    follow = "fslab runs" if options is not None else "fslab queue"
    console.print(f"{sweep_id}: {count(len(runs), 'run')} {where}; follow them with: {follow}", highlight=False)


def _start_sweep(executors, method: str, grid_values: dict, seeds: int, base: list[dict], project, fail_fast: bool,
                 options) -> tuple:
    """:func:`fslab.execution.executor.start_sweep`, a Ctrl-C or SIGTERM meanwhile said in one line."""
    try:  # a SIGTERM (timeout, a job's end) as Ctrl-C: killed outright, it left the runs begun queued unrecorded
        with sigterm_as_interrupt():
            return executors.start_sweep(method, grid_values, seeds, base=base, settings=project,
                                         registry=registry(project), fail_fast=fail_fast, slurm=options)
    except KeyboardInterrupt as interrupt:
        _interrupted_sweep(getattr(interrupt, "sweep", None), options is not None, interrupted_code(interrupt))


def _interrupted_sweep(sweep: str | None, on_slurm: bool, code: int = 130) -> NoReturn:
    """The line for Ctrl-C (or SIGTERM) while ``fslab sweep`` queued (``sweep`` None: before its record
    was saved, so its runs were removed) or submitted its runs; exit ``code``: 130 as the shell's, 143 for
    SIGTERM."""
    if sweep is None:
        err_console.print("sweep interrupted while queueing: the runs it had created were removed, so nothing of it "
                          "is left to train; the same command again queues it all", highlight=False)
    else:
        err_console.print(f"{sweep} interrupted while {'submitting' if on_slurm else 'starting'} its runs; those "
                          f"not yet started go on with: fslab sweep resume {sweep}", highlight=False)
    raise typer.Exit(code)


def _sweep_for_word(word: str, given: list[str]) -> str:
    """The sweep to name in the command that does ``word`` for it: ``last`` is the newest sweep in fslab runs
    --sweep, but the newest run in fslab stop, eval and delete, so there it is the newest sweep's id."""
    from fslab.core.sweeps import sweep_name

    if given and (given[0] != "last" or word in ("show", "list", "ls", "status")):
        return given[0]
    with contextlib.suppress(UsageError):  # no sweep yet: SWEEP
        return sweep_name(settings().runs_dir, "last") if given else "SWEEP"
    return "SWEEP"


def _sweep_spec(targets: list[str], file: Path | None, seeds: int | None, fail_fast: bool, grid: list[str]):
    """What `fslab sweep` runs, from METHOD and the options or from a sweep file:
    (method, seeds, fail_fast, {grid key: values}, the file's [set] as key=value texts).
    An option that contradicts the file (--seeds 3 against seeds = 5) is refused, not
    silently overruled by either."""
    from fslab.core.assignments import assignment, toml_value
    from fslab.execution.sweep import parse_grid, read_sweep_file

    fixed = []
    if file is None and len(targets) <= 2 and (elsewhere := SWEEP_WORDS.get(targets[0] if targets else "")) \
            and targets[0] not in registry().names("method"):  # a subcommand another command is: say which
        raise UsageError(f"fslab sweep has no '{targets[0]}' (it takes METHOD, or resume SWEEP); "
                         + elsewhere.format(sweep=_sweep_for_word(targets[0], targets[1:])))
    if file is not None:
        spec = read_sweep_file(file)
        if targets and targets != [spec["method"]]:
            raise UsageError(f"{file} sweeps method '{spec['method']}', but the command names "
                             f"{' '.join(targets)}; leave METHOD out with --file")
        for option, given, key in (("--seeds", seeds, "seeds"), ("--fail-fast", fail_fast or None, "fail_fast")):
            if given is not None and key in spec and spec[key] != given:
                shown_given = f"{option} {given}" if option == "--seeds" else option
                raise UsageError(f"{shown_given} contradicts {key} = {toml_value(spec[key])} in {file}; "
                                 f"give it in one of the two")
        method, seeds = spec["method"], spec.get("seeds", seeds)
        fail_fast = spec.get("fail_fast", fail_fast)
        grid_values = {k: list(v) for k, v in spec.get("grid", {}).items()}
        fixed = [assignment(k, v) for k, v in spec.get("set", {}).items()]
    elif len(targets) == 1:
        method, grid_values = targets[0], {}
    else:
        raise UsageError("usage: fslab sweep METHOD [--seeds N] [--grid key=v1,v2] ..., "
                         "or fslab sweep --file SWEEP.toml")
    for key, values in parse_grid(grid).items():
        if key in grid_values:
            raise UsageError(f"--grid {key} is also in {file}'s [grid]; give its values in one of the two")
        grid_values[key] = values
    return method, 1 if seeds is None else seeds, fail_fast, grid_values, fixed


# Words taken for subcommands of fslab sweep that other commands are, with the command that does it.
SWEEP_WORDS = {word: "a sweep's runs are listed by: fslab runs --sweep {sweep} (last: the newest sweep)"
               for word in ("show", "list", "ls", "status")} | {
    "stop": "a sweep's queued and running runs are stopped by: fslab stop {sweep}",
    "eval": "a sweep's runs are evaluated by: fslab eval {sweep}"} | {
    word: "a sweep's ended runs are deleted, its record with them, by: fslab delete {sweep}"
    for word in ("delete", "rm")}

# The options of fslab sweep that set a key, by the key they set.
OPTION_KEYS = {"backbone": "backbone.name", "dataset": "dataset.name", "data_root": "dataset.root",
               "epochs": "train.epochs", "batch_size": "train.batch_size", "lr": "train.lr", "seed": "seed",
               "device": "device", "gpus": "train.processes"}


def _options_against_the_file(file: Path | None, fixed: list[str], **given) -> None:
    """An option that gives a key another value than the sweep file's [set] does is refused, as --seeds
    against seeds = N is: the file's [set] is a layer above the options, and won over them unsaid."""
    from fslab.core.assignments import assignments_layer, toml_value
    from fslab.core.keys import dotted

    in_file = dotted(assignments_layer(fixed))
    for name, value in given.items():
        key = OPTION_KEYS[name]
        if value is not None and key in in_file and not same_value(key, in_file[key], value):
            written = toml_value(in_file[key], bare=False)  # as the file has it
            raise UsageError(f"--{name.replace('_', '-')} {value} contradicts {key} = {written} in [set] of {file}; "
                             f"give it in one of the two")


# The options of fslab sweep that make a new sweep, in the order _refuse_new_sweep_options takes their values.
NEW_SWEEP_OPTIONS = ("seeds", "grid", "file", "backbone", "dataset", "epochs", "batch-size", "lr", "seed",
                     "device", "set", "gpus", "sink", "fail-fast")


def _refuse_new_sweep_options(*values) -> None:
    """The options that make a new sweep, given to ``fslab sweep resume``, were dropped without a word
    (``--epochs 3`` resumed the runs as they were): refused, naming what resume takes."""
    given = zip(NEW_SWEEP_OPTIONS, values, strict=True)
    if names := [f"--{name}" for name, value in given if value not in (None, False, [])]:
        raise UsageError(f"fslab sweep resume takes only --executor, --slurm and --data-root, not {', '.join(names)}: "
                         f"the runs resume with the settings they were queued with; a new sweep takes "
                         f"{'them' if len(names) > 1 else 'it'}: fslab sweep METHOD {names[0]} ...")


def _resume_sweep(targets: list[str], project, executor: str | None, slurm: list[str] | None,
                  data_root: str | None = None) -> None:
    """``fslab sweep resume SWEEP``: where ``executor`` says, else where its runs last ran; ``data_root``: where
    the data of the runs it queues again, or that still wait unstarted, lies now (fslab resume --data-root's
    move, for each)."""
    from fslab.execution import executor as executors

    options = executors.job_options(project, executor, slurm) if executor is not None else None
    if len(targets) != 2:
        got = f"got {len(targets) - 1}: {' '.join(targets[1:])}" if len(targets) > 2 else "got none"
        raise UsageError(f"fslab sweep resume takes one SWEEP (a sweep id, a unique part of one, its record's path "
                         f"or last), {got}; the newest sweep is: fslab sweep resume last")
    _refuse_a_run_for_a_sweep(project.runs_dir, targets[1])
    if executor is None:
        options = executors.job_options(project, executors.sweep_executor(project.runs_dir, targets[1]), slurm)
    freed = _stale_claims(project.runs_dir, _sweep_record(project.runs_dir, targets[1]))
    record, again, unreadable, waiting, started = executors.resume_sweep(targets[1], settings=project,
                                                                         registry=registry(project), slurm=options,
                                                                         data_root=data_root)
    _say_freed(freed, record["id"], "free again")
    if not again and not waiting:
        raise UsageError(_nothing_to_resume(project.runs_dir, record, unreadable))
    if lost := _lost_submissions(project.runs_dir, record):  # passed over: said, as what to do about them
        err_console.print(shown(_lost_line(lost, record["id"])), highlight=False)
    for file in UNREADABLE_FILES:
        if ids := [run.id for run, named in unreadable if named == file]:
            err_console.print(f"{count(len(ids), 'run')} left as {'it is' if len(ids) == 1 else 'they are'}, "
                              f"{_unreadable_file(file, ids)}: {shown(', '.join(ids))}", highlight=False)
    if waiting:
        them = "it" if len(waiting) == 1 else "them"
        console.print(f"{record['id']}: no run to queue again; {count(len(waiting), 'queued run')} of it "
                      f"{'waits' if len(waiting) == 1 else 'wait'} for a slot, and "
                      f"{f'a scheduler was started for {them}' if started else f'the scheduler running takes {them}'}; "
                      f"follow {them} with: fslab queue", highlight=False)
        return
    where = "submitted again as SLURM jobs" if options is not None else "queued again"
    console.print(f"{record['id']}: {count(len(again), 'run')} {where}", highlight=False)


def _say_freed(freed: list, sweep: str, done: str) -> None:
    """One line on stderr for the sweep's runs whose stale claims (:func:`_stale_claims`) were passed over."""
    if freed:
        holders = sorted({holder.describe() for _, holder in freed})
        err_console.print(f"{count(len(freed), 'queued run')} of {sweep} {'was' if len(freed) == 1 else 'were'} "
                          f"held by {', '.join(holders)}, which is gone (killed before it started "
                          f"{'it' if len(freed) == 1 else 'them'}); {done}: "
                          f"{shown(', '.join(run.id for run, _ in freed))}", highlight=False)


def _sweep_record(runs_dir: Path, ref: str) -> dict | None:
    """The record of sweep ``ref``, read before a command acts on it; None where it cannot be read (the
    command itself then says why)."""
    from fslab.core.sweeps import load_sweep

    try:
        return load_sweep(runs_dir, ref)
    except UsageError:
        return None


def _stale_claims(runs_dir: Path, record: dict | None) -> list:
    """The sweep's queued runs whose claim is stale (:meth:`fslab.core.runstore.Run.stale_claim`),
    each with the gone holder; none where the sweep could not be read (``record`` None)."""
    from fslab.core.sweeps import sweep_runs

    runs = sweep_runs(runs_dir, record) if record is not None else []
    return [(run, holder) for run in runs if run.path.is_dir() and run.claimed()
            and (holder := run.stale_claim()) is not None]


def _lost_submissions(runs_dir: Path, record: dict | None) -> list:
    """The sweep's queued runs held by a SLURM submission that never recorded its job
    (:meth:`fslab.core.runstore.Run.lost_submission`), each with its holder: fslab sweep resume
    passes them over, as a job of each may be in SLURM's queue; none where ``record`` is None."""
    from fslab.core.sweeps import sweep_runs

    runs = sweep_runs(runs_dir, record) if record is not None else []
    return [(run, holder) for run in runs if run.path.is_dir() and (holder := run.lost_submission()) is not None]


def _lost_line(lost: list, sweep: str) -> str:
    from fslab.core.claims import lost_submission_line

    return lost_submission_line([run.id for run, _ in lost], [holder for _, holder in lost],
                                f"fslab sweep resume {sweep}")


def _refuse_a_run_for_a_sweep(runs_dir: Path, ref: str) -> None:
    """A part of one run's id given to ``fslab sweep resume``, and no sweep's: say
    which run it names and the commands that resume it or its sweep."""
    from fslab.core.errors import RunNotFound
    from fslab.core.runstore import Run, find_run, is_path, matching_names, run_names, sweeps_named

    if is_path(ref):  # a run's folder, as the commands taking RUN take it
        try:
            names = [find_run(runs_dir, ref).id]
        except RunNotFound:
            return
    else:
        names = [] if sweeps_named(runs_dir, ref) else matching_names(ref, run_names(runs_dir))
    if len(names) != 1:
        return
    from fslab.core.commands import like_command
    from fslab.core.rerun import stopped_when
    from fslab.core.states import RESUMABLE

    run = Run(runs_dir / names[0])
    sweep = run.status().get("sweep")
    sweep = sweep if isinstance(sweep, str) else None
    state = run.state()
    if state == "completed" or (state in RESUMABLE and not run.checkpoint_path.exists()):  # fslab resume refuses
        where = f" of sweep {sweep}; resume the sweep with: fslab sweep resume {sweep}" if sweep else ""
        why = "is completed" if state == "completed" else f"has no checkpoint (it stopped {stopped_when(run)})"
        raise UsageError(f"'{ref}' names no sweep but run {names[0]}{where}; the run {why}: start a run "
                         f"like it with: {like_command(names[0])}")
    where = (f" of sweep {sweep}; resume the sweep with: fslab sweep resume {sweep}, or the run alone with: "
             if sweep else "; resume it with: ")
    raise UsageError(f"'{ref}' names no sweep but run {names[0]}{where}fslab resume {names[0]}")


# The files whose loss makes fslab sweep resume pass a run over: config.json (what to train is unknown)
# and status.json (how it ended); a status.json naming a state this fslab does not know (a newer fslab's);
# and the run's whole folder, deleted by hand
UNREADABLE_FILES = ("config.json", "status.json", "state", "folder")


def _unreadable_file(file: str, ids: list[str], named: bool = False) -> str:
    """``its config.json missing or unreadable (put it back from a copy, then resume it)``, for one
    run or more, ``named`` in the parentheses."""
    one = len(ids) == 1
    its, it = ("its", "it") if one else ("their", "they")
    if file == "state":  # written whole, by a newer fslab or by hand: no copy to put back
        return (f"{its} status.json naming a state this fslab does not know ({', '.join(ids) + ': ' if named else ''}"
                f"a newer fslab may have written it, or an edit by hand; resume {'it' if one else 'them'} with the "
                f"fslab that wrote {'it' if one else 'them'}, or put back a status.json this fslab writes)")
    if file == "folder":  # deleted, not damaged: nothing to put back unless by mistake
        return (f"{its} folder deleted ({', '.join(ids) + ': ' if named else ''}the sweep's record still names "
                f"{'it' if one else 'them'}; fslab delete drops a run from its record too)")
    why = (f"{', '.join(ids)}: " if named else "") + (f"how {it} ended cannot be told: " if file == "status.json"
                                                      else "")
    return (f"{its} {file} missing or unreadable ({why}put it back from a copy, then resume "
            f"{'it' if one else 'them'})")


def _nothing_to_resume(runs_dir: Path, record: dict, unreadable: list) -> str:
    """Why ``fslab sweep resume`` queued nothing: what the sweep's runs are."""
    from collections import Counter

    from fslab.core.sweeps import sweep_runs

    passed_over = {run.id for run, _ in unreadable}
    states = Counter(run.state() for run in sweep_runs(runs_dir, record) if run.id not in passed_over)
    said = [f"{n} {state}" for state, n in sorted(states.items())]
    for file in UNREADABLE_FILES:
        if ids := [run.id for run, named in unreadable if named == file]:
            said.append(f"{len(ids)} with {_unreadable_file(file, ids, named=True)}")
    held = [(run, holder) for run in sweep_runs(runs_dir, record)
            if run.id not in passed_over and (holder := run.held_elsewhere()) is not None]
    hint = "" if not held else (
        f"; {count(len(held), 'queued run')} {'is' if len(held) == 1 else 'are'} held by "
        f"{', '.join(sorted({holder.describe() for _, holder in held}))}, which this machine cannot tell gone: "
        f"if it is, remove {'its' if len(held) == 1 else 'their'} runs/ID/.claimed ({shown(held[0][0].id)}"
        f"{', ...' if len(held) > 1 else ''}) and run fslab sweep resume {record['id']} again")
    if lost := [(run, holder) for run, holder in _lost_submissions(runs_dir, record) if run.id not in passed_over]:
        return f"sweep {record['id']} has nothing to resume: {', '.join(said)}; {_lost_line(lost, record['id'])}{hint}"
    return (f"sweep {record['id']} has nothing to resume: {', '.join(said) or 'it has no runs'}; only its failed, "
            f"killed or lost runs are queued again{hint}")


# The queue table gives way in this order when the width is short (fslab.cli.tables).
QUEUE_COLUMNS = [Col("id", is_id=True), Col("state"), Col("sweep"), Col("slot"), Col("GPU"), Col("pid", "right")]
QUEUE_STEPS = ["pid", SHORT_IDS, "GPU", "slot"]


SLOT_WORDS = {True: "busy", False: "free", None: "unusable"}


@app.command()
def queue(as_json: JsonFlag = False, wide: WideFlag = False, start: Annotated[bool, typer.Option(
        "--start", help="First start a scheduler for the runs waiting, where none is alive (it was killed, or its "
                        "machine rebooted), and nothing more: unlike fslab sweep resume, no failed, killed or lost "
                        "run is queued again.")] = False) -> None:
    """Runs waiting for a slot (in the order they start), where each running run went, and the slots.

    A last line says when runs wait but no scheduler is alive to start them (it was killed, or its
    machine rebooted), with the command that starts one: fslab queue --start.

    A queued run whose claim file (runs/ID/.claimed) is damaged, naming no process, never starts (nor, until a
    person acts, one held by a taker this machine cannot tell gone): its state is marked queued!, as fslab runs
    marks it, and a line after the table says so, the file, and what to do (its "problem" with --json).

    With --json: one object per line, each with "type": "run" (id, state, sweep, slot, gpus, pid, problem:
    null unless the run will not start until a person acts, as that line says) or
    "slot" (slot, gpu, busy, problem; problem is null unless the slot's lock file cannot be opened, and busy
    is null then)."""
    from fslab.core.runstore import Run, short_ids, start_order
    from fslab.core.settings import project_above
    from fslab.core.states import LIVE
    from fslab.core.summary import list_summaries
    from fslab.execution.slots import configured_slots, slot_state

    project = settings()
    started = start and _start_for_waiting(project.runs_dir)
    rows, order = [], {}
    for summary in reversed(list_summaries(project.runs_dir, limit=None, states=LIVE)):
        status = Run(project.runs_dir / summary.id).status()
        order[summary.id] = (summary.state == "queued", start_order(status, summary.id))  # running ones first
        rows.append({"type": "run", "id": summary.id, "state": summary.state, "sweep": status.get("sweep"),
                     "slot": status.get("slot"), "gpus": status.get("gpus"), "pid": status.get("pid"),
                     "problem": Run(project.runs_dir / summary.id).claim_problem(status)})
    rows.sort(key=lambda row: order[row["id"]])  # waiting runs in the order a scheduler starts them
    folder = project.runs_dir / ".slots"
    slots = [{"type": "slot", "slot": s.name, "gpu": s.gpu, **slot_state(folder, s)}
             for s in configured_slots(project.scheduler)]
    if as_json:
        sys.stdout.write("".join(json.dumps(item) + "\n" for item in [*rows, *slots]))
        return
    cells = [[r["id"], marked_state(r["state"], r["problem"]),  # queued! as fslab runs marks it; the line after
              *(str(r[k] or "-") for k in ("sweep", "slot", "gpus", "pid"))] for r in rows]  # the table says why
    if cells:
        print_table(console, lambda width: fit(QUEUE_COLUMNS, cells, width, QUEUE_STEPS,
                                               lambda ids: short_ids(project.runs_dir, ids)), wide)
    else:
        above = "" if project.runs_dir.exists() else project_above()  # run in a project's subfolder
        console.print(shown("no runs queued or running" + above), highlight=False)
    console.print("slots: " + ", ".join(f"{s['slot']} {SLOT_WORDS[s['busy']]}" for s in slots), highlight=False)
    for problem in [r["problem"] for r in rows if r["problem"]] + list(dict.fromkeys(s["problem"] for s in slots
                                                                                  if s["problem"])):
        console.print(problem, highlight=False, markup=False)
    if not started:  # one just started may not hold its lock yet
        _say_if_no_scheduler(project.runs_dir)


def _waiting_here(runs_dir: Path) -> list:
    """The runs waiting for this store's local scheduler (a SLURM run's is SLURM's queue)."""
    from fslab.execution.scheduler import waiting_runs

    return [run for run in waiting_runs(runs_dir) if run.status().get("executor") != "slurm"]


def _say_if_no_scheduler(runs_dir: Path) -> None:
    """Runs waiting for a local scheduler when none is alive (killed, or its machine rebooted):
    they would wait for good; the line says so and the command that starts one."""
    from fslab.execution.scheduler import scheduler_running

    waiting = _waiting_here(runs_dir)
    if waiting and scheduler_running(runs_dir) is False:
        console.print(f"no scheduler is running: {count(len(waiting), 'waiting run')} will not start until one "
                      f"does; start one with: fslab queue --start", highlight=False, markup=False)


def _start_for_waiting(runs_dir: Path) -> bool:
    """``fslab queue --start``: a scheduler started for the runs waiting where none is alive, said on stderr;
    whether one was."""
    from fslab.execution.executor import scheduler_for_waiting

    waiting = _waiting_here(runs_dir)
    started = bool(waiting) and scheduler_for_waiting(runs_dir, "fslab queue --start", "the waiting runs")
    if not waiting:
        line = "no runs are waiting: no scheduler started"
    elif started:
        line = (f"started a scheduler for {count(len(waiting), 'waiting run')}; it logs to "
                f"{shown(str(runs_dir / 'sweeps' / 'scheduler.log'))}")
    else:
        line = f"a scheduler is running already: it starts the {count(len(waiting), 'waiting run')} as slots free"
    err_console.print(line, highlight=False, markup=False)
    return started
