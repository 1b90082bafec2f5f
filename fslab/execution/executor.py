"""Starting, resuming and stopping runs and sweeps, on this machine or on SLURM.

This is the one entry to the execution layer: ``fslab run``, ``resume``,
``stop``, ``sweep`` and the dashboard's launch form, resume and stop keys all
call these functions, so a run is checked the same way (configuration, GPUs,
data files, state, checkpoint) whichever surface starts it. ``slurm`` is
``None`` for a local worker process, or the job options of
:func:`job_options` for a SLURM job.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fslab.core.commands import like_command, resume_there_command
from fslab.core.config import check_saved, naming_the_file, resolve
from fslab.core.errors import UsageError, interrupted_code
from fslab.core.runstore import Run, create_run, unstarted
from fslab.core.settings import SlurmSettings
from fslab.core.states import LIVE, RESUMABLE, UNREADABLE, unknown_state
from fslab.core.sweeps import load_sweep, sweep_runs
from fslab.execution import slurm as slurm_jobs
from fslab.execution.checks import check_resumable, check_run
from fslab.execution.data_roots import (
    check_root_option,
    check_same_data,
    moved_config,
    root_gone,
    save_data_root,
)
from fslab.execution.handover import LiveWorker, launch_lock
from fslab.execution.local import NotStoppableHere, start_worker, stop_worker
from fslab.execution.scheduler import handing_back, slots_needed, start_scheduler
from fslab.execution.slots import configured_slots, slot_env, take_slots
from fslab.execution.slurm_job import TrainingJob
from fslab.execution.studies import StudyRuns, queue_study
from fslab.execution.sweep import SweepInterrupted, create_sweep, queue_again, requeue


@dataclass
class Started:
    """A run that was started: its local worker process, or its SLURM job."""

    run: Run
    process: subprocess.Popen | None = None
    job_id: str | None = None
    queued: str | None = None  # a sweep's run handed back to the scheduler running: the line that says so


def job_options(settings, executor: str | None, overrides: list[str] | None = None) -> SlurmSettings | None:
    """None for ``local``; for ``slurm``, ``[slurm]`` of fslab.toml with the
    ``--slurm key=value`` overrides, checked (and submitit importable)."""
    if executor is not None:
        slurm_jobs.check_executor(executor)  # one line naming what is allowed
    if executor != "slurm":
        if overrides:
            raise UsageError("--slurm settings apply only with --executor slurm")
        return None
    slurm_jobs.require_submitit()  # say how to install submitit before anything is created
    options = slurm_jobs.job_options(settings, overrides)
    slurm_jobs.check_available(options)  # and that SLURM is here: a refused command creates nothing
    return options


def prepare(method: str, overrides: list[dict], *, settings, registry, slurm: SlurmSettings | None = None) -> dict:
    """The resolved configuration of a run, checked as far as it can be before
    the run exists (:func:`fslab.execution.checks.check_run`); nothing is created."""
    config = resolve(method, registry=registry, settings=settings, overrides=overrides)
    with naming_the_file(settings, overrides):
        check_run(config, registry, slurm)
    return config


def launch(method: str, overrides: list[dict], *, settings, registry, slurm: SlurmSettings | None = None,
           starting: Callable[[], None] = lambda: None) -> Started:
    """Resolve and check the configuration (:func:`prepare`), create the run
    folder and start the run here (or as a job). ``starting`` is called once the
    configuration is checked, before the folder is made (``fslab run`` holds Ctrl-C
    from there until it follows the worker, so that one pressed meanwhile stops it)."""
    config = prepare(method, overrides, settings=settings, registry=registry, slurm=slurm)
    starting()
    run = create_run(settings.runs_dir, method, config, claimed=True,  # started here: no scheduler may start it
                     slurm=slurm is not None)
    with launch_lock(run):
        return _start(run, resume=False, slurm=slurm)


def _start(run: Run, *, resume: bool, slurm: SlurmSettings | None, slots: list = ()) -> Started:
    """Start the run's worker here (holding the ``(slot, fd)`` locks of ``slots``, seeing only
    their GPUs, as a scheduler starts one), or submit its job."""
    if slurm is None and slots:
        env, fds = slot_env([slot for slot, _ in slots]), [fd for _, fd in slots]
        return Started(run, process=start_worker(run, resume=resume, env=env, pass_fds=fds))
    if slurm is None:
        return Started(run, process=start_worker(run, resume=resume))
    job_id = slurm_jobs.submit(run, slurm, TrainingJob(os.path.abspath(run.path)), requeue=resume)
    return Started(run, job_id=job_id)


def resume(run: Run, *, settings, registry, executor: str | None = None, overrides: list[str] | None = None,
           starting: Callable[[], None] = lambda: None, data_root: str | None = None) -> Started:
    """Continue a killed, lost or failed run from its last checkpoint, as a
    local worker or a SLURM job: ``executor``, or where the run last ran. Its
    saved configuration is checked again as a new run's is (the data, GPUs or
    plugins here may not be those it was created with). The checks and the
    start happen under the run's lock, so of two simultaneous resumes exactly
    one starts a worker; a run whose worker lives (even paused) is refused
    (:mod:`fslab.execution.handover`). A queued run that nobody holds (never claimed, or its
    claim stale: its starter, of this host, was killed before it started the worker,
    :meth:`Run.stale_claim`) is taken and started here, from its checkpoint if it has one; one of a
    sweep (or study), which waits for a slot of the local scheduler, only in free slots of this store
    (:func:`_take_slots`): never outside them, where the scheduler running starts it. So is one of a sweep
    resumed here: with its scheduler running, it is queued again for it (:func:`_hand_back`), else started
    only in free slots. Where every slot is busy and no scheduler runs, it is left queued (or queued again)
    and a scheduler is started that starts it when one frees (:func:`_hand_back`). ``starting`` is called
    once the run is checked, before its worker starts (as :func:`launch`'s). ``data_root`` (fslab resume
    --data-root): where its data lies now, checked as its own root is, then saved as its root once it holds
    the data the run started on (:func:`fslab.execution.data_roots.check_same_data`)."""
    if executor is not None:  # a value no resume takes is said first, whatever the run's state
        slurm_jobs.check_executor(executor)
    run.check_folder("resume")  # deleted since it was found (or since the dashboard asked): not its lock file's line
    freed = run.free() and run.waits() and run.claim()  # taken before the lock: held, it hides a waiting run
    try:
        with launch_lock(run):
            if not freed:
                check_resumable(run)
            check_resume_writes(run)
            executor = executor or ("slurm" if run.status().get("executor") == "slurm" else "local")
            slurm = job_options(settings, executor, overrides)
            if freed and slurm is not None:
                run.claim_for_slurm()
            in_slots = slurm is None and isinstance(run.status().get("sweep"), str)
            if freed and in_slots and (line := scheduler_takes(run, let_go=True)) is not None:
                freed = False  # let go of already, under the hand-back lock
                raise UsageError(line)
            if (move := checked_move(run, settings, registry, slurm, data_root)) is not None:
                save_data_root(run, *move)
            if in_slots and not freed and (line := _hand_back(run, freed=False)) is not None:
                return Started(run, queued=line)
            taken = _take_slots(run, settings) if in_slots else []
            if in_slots and not taken:  # every slot busy: it waits for one, and a scheduler is started for it
                waited, freed = freed, False  # let go of in the hand-back, under its lock
                return Started(run, queued=_hand_back(run, freed=waited, start=True))
            try:
                starting()
                return _start(run, resume=not freed or run.checkpoint_path.exists(), slurm=slurm, slots=taken)
            finally:
                for _, fd in taken:
                    os.close(fd)  # the worker's inherited copies hold the slots
    except BaseException:
        if freed:  # refused: the run waits, free, as it did
            run.unclaim()
        raise


def scheduler_takes(run: Run, *, let_go: bool = False) -> str | None:
    """Where the run, queued in a sweep (or a study) and free, waits for a slot of this store's local
    scheduler, and a scheduler of the store is running: the line that says it starts the run, which
    ``fslab resume`` and the dashboard's r say rather than start it outside the slots ([scheduler] of
    fslab.toml), where it would train beside as many runs as the slots hold. None otherwise. ``let_go``:
    the caller claimed the run, and its claim is let go of here, under the hand-back lock
    (:func:`fslab.execution.scheduler.handing_back`), where the scheduler is seen running: its last look
    before it exits comes after, and sees the run free."""
    status = run.status()
    sweep = status.get("sweep")
    if not isinstance(sweep, str):
        return None
    with handing_back(run.path.parent, run.id) as running:
        if running is not True:
            return None
        if let_go:
            run.unclaim()
    return (f"run {run.id} is queued in {sweep} and waits for a slot: the scheduler running starts it when one "
            f"frees, in queue order, and resume starts no queued run beside it, outside the slots ([scheduler] "
            f"in fslab.toml); follow it with: fslab queue")


def _hand_back(run: Run, *, freed: bool, start: bool = False) -> str | None:
    """Hand a run of a sweep (or a study) resumed locally to the store's scheduler, under the hand-back lock
    (:func:`fslab.execution.scheduler.handing_back`), so that the scheduler seen running starts it: one that
    failed, was killed or was lost queued again (:func:`fslab.execution.sweep.queue_again`), to resume from its
    last checkpoint, or one queued that this process ``freed`` (claimed) let go of. A worker started here would
    train beside as many runs as the slots hold ([scheduler] of fslab.toml). With ``start`` (every slot busy),
    a scheduler is started where none runs; without it, nothing is done where none runs (None). The line that
    says what was done otherwise."""
    with handing_back(run.path.parent, run.id) as running:
        if running is not True and not start:
            return None
        if freed:
            run.unclaim()
        else:
            queue_again(run, executor="local")
        if running is not True:
            start_scheduler(run.path.parent)
    sweep = run.status().get("sweep")
    where = f"is queued in {sweep} and waits for a slot" if freed else f"is queued again in {sweep}"
    does = "starts it" if freed else "resumes it from its last checkpoint"
    who = "the scheduler running" if running is True else \
        "every slot is busy and no scheduler was running, so one was started, which"
    return (f"run {run.id} {where}: {who} {does} when a slot frees, in queue order, never beside the slots "
            f"([scheduler] in fslab.toml); follow it with: fslab queue")


def _take_slots(run: Run, settings) -> list:
    """Free slots of the run's store for a run of a sweep that no scheduler runs to start (killed, or ended),
    queued in it or resumed, taken as a scheduler takes them (:func:`fslab.execution.slots.take_slots`);
    ``[]`` where they are busy (the run is then handed to a scheduler started for it: :func:`_hand_back`)."""
    return take_slots(run.path.parent, configured_slots(settings.scheduler), slots_needed(run))


def checked_again(run: Run, settings, registry, slurm: SlurmSettings | None, config: dict | None = None,
                  move: str | None = None, **check) -> dict:
    """The run's saved configuration (``config``: as read already), checked again as a new run's is (the data,
    GPUs or plugins here may not be those it was made with), as fslab resume, sweep resume and the dashboard's r
    before it asks check it; a data root that is gone is :func:`root_gone`'s line; it and a data change's name
    ``move`` (fslab sweep resume's --data-root) where given, else fslab resume RUN --data-root DIR."""
    config = check_saved(run.config() if config is None else config, registry, run.id)
    try:
        check_run(config, registry, slurm, again=like_command(run.id), move=move or resume_there_command(run.id),
                  **check)
    except UsageError as exc:
        raise root_gone(run, config, exc, settings, move) or exc from None
    return config


def check_resume_writes(run: Run, command: str = "fslab resume") -> None:
    """fslab resume's refusal of a run folder this user cannot write (a read-only copy of a store, another
    user's run), before any work; the dashboard's r says it before it asks, fslab sweep resume of each run
    it would queue again before it queues any."""
    run.check_writable(command, "the training's status, logs and checkpoints", "resume")


def not_stoppable_here(status: dict) -> str | None:
    """Why this fslab does not stop a run whose ``status`` names a state it does not know (a newer fslab's,
    in which its worker may live), as ``fslab stop`` and the dashboard say it; None for any other status."""
    if unknown := unknown_state(status):
        return f"cannot be stopped by this fslab: its {unknown}; if it is running, stop it with the fslab that wrote it"
    return None


def stop(run: Run, grace: float = 30.0) -> str:
    """Stop a queued or running run; it ends ``killed`` and keeps its last
    checkpoint. Returns the state it ended in. A SLURM job is cancelled; a
    worker of this host that is surely the run's own is signalled; any other
    (another host's, or a pid that cannot be verified) is sent a stop request
    through the run folder (:func:`fslab.execution.local.stop_worker`)."""
    run.check_folder("stop")
    state = run.state()
    if state not in LIVE and _launch_waited_out(run):  # a resume was starting a worker: it is recorded now
        state = run.state()
    if state == UNREADABLE and (why := not_stoppable_here(run.status())):
        raise UsageError(f"run {run.id} {why}")
    if state not in LIVE:
        raise UsageError(f"run {run.id} is {state}, not running; nothing to stop")
    status = run.status()
    if status.get("slurm_job_id"):  # a SLURM job: cancel it; the job records the end
        return slurm_jobs.cancel(run, grace)
    if not status.get("pid") and (run.claim() or run.lost_submission(status) is not None
                                  or run.damaged_claim(status) is not None):
        # still waiting in the queue: claiming it means no scheduler will start it; a SLURM submission
        # killed before recording its job holds it so, and the job, if one runs, ends on finding it killed;
        # a claim file that names no taker (damaged) holds it for good, no taker to record a worker.
        # Written only if nothing started it meanwhile (that job, say): else its worker is stopped.
        stopped = run.write_status(unstarted, state="killed", ended=time.time(), error="stopped while queued")
        if stopped.get("state") == "killed":
            return "killed"
    return stop_worker(run, grace)


def _launch_waited_out(run: Run) -> bool:
    """Whether the run's worker lock was held and has been let go (within the
    :data:`~fslab.execution.handover.EXIT_WAIT_S`, as a launcher waits): a
    launcher (``fslab resume``, the scheduler) holds it from its check of the
    run's state to its record of the worker it started, and a stop read the
    state of before, said 'nothing to stop', and the resumed run trained on."""
    from fslab.core.worklock import is_held, take
    from fslab.execution.handover import EXIT_WAIT_S

    if not is_held(run.path):
        return False
    fd = take(run.path, wait=EXIT_WAIT_S)
    if fd is None:
        return False
    os.close(fd)
    return True


def stop_sweep(runs_dir: Path, ref: str, grace: float = 30.0, *,
               skip: set[str] = frozenset()) -> tuple[dict, list[tuple[Run, str]], list[str]]:
    """Stop every queued or running run of a sweep (or of a study's run), as
    :func:`stop` stops one: the queued ones first, so that no scheduler starts
    them while the running ones stop. Returns the sweep's record, each run
    stopped with the state it ended in, and the line of each that cannot be
    stopped from here (:class:`~fslab.execution.local.NotStoppableHere`); runs
    that ended meanwhile, and those whose ids are in ``skip`` (stopped already),
    are passed over."""
    record = load_sweep(runs_dir, ref)
    runs = [(run, run.state()) for run in sweep_runs(runs_dir, record) if run.id not in skip]
    order = [run for run, state in runs if state == "queued"] + [run for run, state in runs
                                                                 if state in LIVE and state != "queued"]
    stopped, refused = [], []
    for run in order:
        try:
            stopped.append((run, stop(run, grace)))
        except NotStoppableHere as exc:  # another host's worker, this folder a copy: the others are stopped
            refused.append(str(exc))
        except UsageError:
            continue  # it ended between the listing and the stop
    return record, stopped, refused


def start_sweep(method: str, grid: dict, seeds: int, *, base: list[dict], settings, registry,
                fail_fast: bool = False, slurm: SlurmSettings | None = None) -> tuple[str, list[Run]]:
    """Queue one run per grid combination and seed, then start them: a local
    scheduler takes them as slots free up, or each becomes a SLURM job."""
    sweep_id, runs = create_sweep(method, grid, seeds, base=base, settings=settings, registry=registry,
                                  fail_fast=fail_fast, slurm_options=slurm)  # interrupted: nothing left queued
    try:
        return sweep_id, _start_queued(settings.runs_dir, runs, slurm)
    except KeyboardInterrupt as interrupt:  # while submitting: the sweep is recorded, its runs not yet submitted wait
        raise SweepInterrupted(sweep_id, terminated=interrupted_code(interrupt) == 143) from None


def sweep_executor(runs_dir: Path, ref: str) -> str:
    """Where ``fslab sweep resume`` starts a sweep's runs without ``--executor``:
    where those it queues again last ran, as :func:`resume` goes by a run's; with none
    to queue again but some never started (Ctrl-C while submitting), where its started
    runs went; ``local`` where none tells. Runs of both kinds are one
    line asking which."""
    record = load_sweep(runs_dir, ref)
    runs = sweep_runs(runs_dir, record)
    told = [run for run in runs if run.state() in RESUMABLE]
    if not told and any(run.state() == "queued" and run.free() for run in runs):  # never submitted
        told = [run for run in runs if run.status().get("executor")]  # go where its started runs went
    kinds = {"slurm" if run.status().get("executor") == "slurm" else "local" for run in told}
    if len(kinds) > 1:
        raise UsageError(f"runs of {record['id']} last ran both here and as SLURM jobs; say where they go on: "
                         f"fslab sweep resume {record['id']} --executor local (or --executor slurm)")
    return kinds.pop() if kinds else "local"


def resume_sweep(ref: str, *, settings, registry, slurm: SlurmSettings | None = None,
                 data_root: str | None = None) -> tuple[dict, list[Run], list[tuple[Run, str]], list[Run], bool]:
    """Queue again the sweep's failed, killed and lost runs (each resumes from
    its checkpoint) and start them as :func:`start_sweep` does; their
    configurations are checked first, as :func:`resume` checks one. Returns the
    sweep's record, the runs started, those passed over as unreadable, each with
    the file that cannot be read (``config.json``: what to train is unknown;
    ``status.json``: how it ended; never requeued), ``state`` for one whose status
    names a state this fslab does not know, or ``folder`` for one whose folder
    is gone (deleted by hand), and, where none was queued
    again, the runs still waiting for a local scheduler, and whether one was started
    for them: it is where none of the store lives (the one that queued them may be
    gone, killed or its machine rebooted); one that lives takes them. ``data_root`` (fslab sweep resume
    --data-root): each run queued again moved there as :func:`resume` moves one, and each still waiting that
    never started (it reads any data: :func:`_move_waiting`), all or none (every run is checked before any is
    moved or queued)."""
    check_root_option(data_root)
    record = load_sweep(settings.runs_dir, ref)
    sizes_seen: dict = {}
    unreadable, moves, waits = [], {}, {}
    for_sweep = {"move": f"fslab sweep resume {record['id']} --data-root DIR", "fileless": True}  # synthetic: left
    for run in sweep_runs(settings.runs_dir, record):
        if not run.path.is_dir():  # deleted by hand (fslab delete drops a run from its sweep's record too)
            unreadable.append((run, "folder"))
            continue
        state = run.state()
        if state == UNREADABLE:  # a sweep's run that may have failed, passed over without a word otherwise
            # its status.json damaged (put it back), or naming a state a newer fslab wrote (resume it there)
            unreadable.append((run, "state" if unknown_state(run.status()) else "status.json"))
        elif state in RESUMABLE:
            if not (config := run.config()):
                unreadable.append((run, "config.json"))
                continue
            check_resume_writes(run, "fslab sweep resume")
            if (move := checked_move(run, settings, registry, slurm, data_root, config, sizes_seen=sizes_seen,
                                     **for_sweep)) is not None:
                moves[run.id] = move
        elif data_root is not None and state == "queued" and run.waits() and run.free() and (config := run.config()):
            check_resume_writes(run, "fslab sweep resume")  # never started: it reads any data, moved as a resume's
            if (move := checked_move(run, settings, registry, slurm, data_root, config, sizes_seen=sizes_seen,
                                     **for_sweep)) is not None:
                waits[run.id] = (run, *move)
    for run, moved, was in waits.values():  # every run checked: those still waiting moved first
        _move_waiting(run, moved, was)
    # each moved as it is queued again, under its launch lock (not one resumed meanwhile)
    again = requeue(settings.runs_dir, record, before=lambda run: save_data_root(run, *moves[run.id])
                    if run.id in moves else None)
    requeued = {run.id for run in again}
    unstarted = [run for run in sweep_runs(settings.runs_dir, record)
                 if run.id not in requeued and run.state() == "queued" and run.free()]
    if slurm is not None:  # runs never submitted (Ctrl-C while submitting) are submitted with the rest
        return record, _start_queued(settings.runs_dir, again + unstarted, slurm), unreadable, [], False
    waiting = [] if again else unstarted
    started = bool(waiting) and scheduler_for_waiting(settings.runs_dir, record["id"], "its waiting runs")
    return record, _start_queued(settings.runs_dir, again, slurm), unreadable, waiting, started


def checked_move(run: Run, settings, registry, slurm: SlurmSettings | None, data_root: str | None,
                 config: dict | None = None, *, move: str | None = None, fileless: bool = False,
                 **check) -> tuple[dict, str | None] | None:
    """The run checked again as fslab resume (or sweep resume, its ``move`` command and ``fileless``:
    :func:`fslab.execution.data_roots.moved_config`) resumes it (:func:`checked_again`), on ``data_root``
    where given, once that holds the data the run started on: DIR's data is compared with the run's first
    (:func:`check_same_data`) before its settings are checked against it, so other data is told so, not as
    files "removed or moved since". Returns its moved configuration and the root it leaves, to save
    (:func:`save_data_root`), or None where it stays (no ``data_root``, its own, a dataset that reads no files)."""
    moved = moved_config(run, data_root, registry, fileless=fileless)
    was = check_same_data(run, moved, registry, move) if moved is not None else None
    checked_again(run, settings, registry, slurm, moved or config, move=move, **check)
    return None if moved is None else (moved, was)


def _move_waiting(run: Run, moved: dict, was: str | None) -> None:
    """A sweep's run still queued, never started, moved onto ``moved``'s root (fslab sweep resume --data-root):
    claimed, so no scheduler starts it meanwhile, and under its launch lock, still unstarted; one a scheduler took
    since it was checked is left to it."""
    if not run.claim():
        return
    try:
        with launch_lock(run):
            if run.status().get("state") == "queued" and unstarted(run.status()):
                save_data_root(run, moved, was)
    except LiveWorker:
        return  # started meanwhile: its worker reads the root it found
    finally:
        run.unclaim()


def scheduler_for_waiting(runs_dir: Path, name: str, what: str) -> bool:
    """For runs waiting in ``runs_dir`` that nobody holds (``what``, of a sweep or command ``name``): whether a
    scheduler was started for them, where none is running. Told under the hand-back lock
    (:func:`fslab.execution.scheduler.handing_back`), so a scheduler seen running looks at the queue again
    after this, and one about to exit is waited for and seen gone."""
    with handing_back(runs_dir, name, what) as running:
        if running is not True:
            start_scheduler(runs_dir)
    return running is not True


def start_study(study, scale: str, *, settings, registry, dataset: str | None = None, data_root: str | None = None,
                extra: tuple[dict, ...] = (), slurm: SlurmSettings | None = None,
                again: str | None = None) -> StudyRuns:
    """Queue a study's runs (:func:`fslab.execution.studies.queue_study`: runs
    done with the same settings are reused) and start them as :func:`start_sweep`
    does. Runs of an earlier invocation still queued are started too: locally by the
    scheduler, on SLURM those never taken for submitting (one interrupted while
    submitting left the rest queued, and the same command again submitted none)."""
    outcome = queue_study(study, scale, settings=settings, registry=registry, dataset=dataset,
                          data_root=data_root, extra=extra, slurm=slurm, again=again)
    waiting = [run for run in (Run(settings.runs_dir / i) for i in outcome.in_progress)
               if run.state() == "queued" and (slurm is None or run.free())]
    if outcome.to_start or waiting:
        if slurm is None:
            start_scheduler(settings.runs_dir)
        else:
            outcome.to_start = _start_queued(settings.runs_dir, outcome.to_start + waiting, slurm)
    return outcome


def _start_queued(runs_dir: Path, runs: list[Run], slurm: SlurmSettings | None) -> list[Run]:
    if not runs:
        return []
    if slurm is None:
        start_scheduler(runs_dir)
        return runs
    submitted = []
    for run in runs:
        if run.claim(slurm=True):  # not already taken by a local scheduler
            try:
                with launch_lock(run):
                    slurm_jobs.submit(run, slurm, TrainingJob(os.path.abspath(run.path)))
            except LiveWorker:
                continue  # requeued while a worker of it lived: that worker goes on
            submitted.append(run)
    return submitted
