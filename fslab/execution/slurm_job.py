"""What a SLURM job runs: the run's worker life cycle inside the job.

:class:`TrainingJob` is the picklable callable submitit sends to the cluster.
It trains the run in its own folder exactly as a local worker does (the same
status keeper and training), resuming from the last checkpoint if there is
one. On preemption or near the time limit submitit calls
:meth:`TrainingJob.checkpoint`, the run goes back to ``queued`` and the
requeued job resumes it. A job whose run fails stops its sweep when the sweep
is ``fail_fast`` (:func:`fslab.execution.sweep.stop_sweep_of`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fslab.core.errors import FslabError
from fslab.core.files import NEW_FILE_MODE, atomic_write_text
from fslab.core.runstore import Run
from fslab.core.states import ENDED
from fslab.execution.handover import WORKER_WAIT_S, take_worker_lock
from fslab.execution.local import worker_command
from fslab.execution.slurm import require_submitit
from fslab.execution.sweep import stop_sweep_of
from fslab.execution.worker import (
    StatusKeeper,
    Stopped,
    import_train,
    record_failure,
    record_stop,
    stop_on_signals,
    utf8_logs,
)


def _fail_fast(run: Run) -> None:
    """Stop the run's sweep if it is ``fail_fast``, never hiding the job's own failure."""
    try:
        stopped = stop_sweep_of(run)
    except (FslabError, OSError) as exc:
        print(f"fslab: fail-fast could not stop the sweep: {exc}", file=sys.stderr, flush=True)
        return
    if stopped:
        print(f"fslab: fail-fast: cancelled {len(stopped)} queued runs of the sweep: "
              f"{', '.join(r.id for r in stopped)}", file=sys.stderr, flush=True)


class TrainingJob:
    """What a SLURM job runs: train the run in ``run_dir``, resuming from its
    last checkpoint if it has one. Picklable (just the folder's path)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.preempted = False

    def __call__(self) -> str:
        return run_job(self)

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on preemption or near the time limit: the job is
        about to be requeued; the new submission resumes the same run. A
        torchrun the job started is stopped first (its rank 0 records the
        stop; the last end-of-epoch checkpoint is what the requeued job resumes)."""
        self.preempted = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a requeue is not `fslab stop`
        ranks = getattr(self, "ranks", None)
        if ranks is not None and ranks.returncode is None:
            ranks.send_signal(signal.SIGTERM)
            try:  # not ranks.wait(): this runs in a signal handler that may have interrupted a poll()
                _, code = os.waitpid(ranks.pid, 0)
                ranks.returncode = os.waitstatus_to_exitcode(code)
            except ChildProcessError:  # reaped already
                pass
        return require_submitit().helpers.DelayedSubmission(TrainingJob(self.run_dir))


def _log_to_run(run: Run) -> None:
    """The job's stdout and stderr go to the run's own log files, as a local worker's do."""
    for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
        (sys.stdout if fd == 1 else sys.stderr).flush()
        log = os.open(run.path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, NEW_FILE_MODE)
        os.dup2(log, fd)
        os.close(log)
    utf8_logs()


def run_job(job: TrainingJob) -> str:
    """The job's body: the local worker's life cycle (the run's lock, status,
    heartbeat, end state), plus the preemption case, where the run goes back
    to ``queued``."""
    run = Run(Path(job.run_dir))
    state = run.status().get("state")
    if state in ENDED:  # stopped or finished while the job waited
        return state
    _log_to_run(run)
    ranks = run.config()["train"]["processes"] > 1  # then rank 0 takes the lock, as under a local torchrun
    lock = take_worker_lock(run, WORKER_WAIT_S)  # the submitter lets go once it has recorded the job's id
    if lock is None:  # another worker of the run lives: leave the run to it
        return "refused"
    if ranks:  # rank 0 takes it, as under a local torchrun; the job's own status write comes after the submitter's
        os.close(lock)
        lock = None
    try:
        if run.status().get("state") in ENDED:  # stopped while the job waited for the lock
            return run.status()["state"]
        resume = run.checkpoint_path.exists()
        if not resume and run.metrics_path.exists():
            atomic_write_text(run.metrics_path, "")  # an earlier attempt stopped before its first checkpoint
        return run_ranks(job, run, resume) if ranks else train_in_job(job, run, resume)
    finally:
        if lock is not None:
            os.close(lock)  # after the end state (or queued, for a requeue) is written


def train_in_job(job: TrainingJob, run: Run, resume: bool) -> str:
    """The local worker's life cycle inside the job, holding the run's lock."""
    keeper = StatusKeeper(run, float(run.config()["train"]["heartbeat"]))
    stop_on_signals()
    job_id = require_submitit().JobEnvironment().job_id
    keeper.start(resume)
    keeper.update(slurm_job_id=job_id, attempts=int(run.status().get("attempts") or 0) + 1)
    try:
        train = import_train()
        train(run, resume=resume)
    except Stopped as stop:
        record_stop(keeper, stop)
        return "killed"
    except SystemExit:
        if not job.preempted:
            keeper.finish("failed", 1, "the job exited before training ended")
            _fail_fast(run)
            raise
        keeper.done.set()
        keeper.update(state="queued", pid=None, heartbeat=None, requeued=time.time(),
                      requeues=int(run.status().get("requeues") or 0) + 1)
        print(f"fslab: job {job_id} preempted or out of time; requeued to resume from the last checkpoint",
              file=sys.stderr, flush=True)
        raise
    except BaseException as exc:  # the run must record why it ended, whatever it was
        record_failure(keeper, exc)
        _fail_fast(run)
        raise
    keeper.finish("completed", 0)
    return "completed"


def run_ranks(job: TrainingJob, run: Run, resume: bool) -> str:
    """The job's body for ``--gpus N``: torchrun on this node, exactly as a
    local ``--gpus N`` run starts it, whose rank 0 keeps the run's status.
    The job waits for it, passes ``fslab stop`` (SIGTERM) on, and on
    preemption stops it before the requeue (:meth:`TrainingJob.checkpoint`).
    The ranks ignore SIGUSR2, which SLURM sends to every process of a job
    it preempts: the job alone decides how they stop."""
    job_id = require_submitit().JobEnvironment().job_id
    run.write_status(slurm_job_id=job_id, attempts=int(run.status().get("attempts") or 0) + 1)
    job.ranks = subprocess.Popen(worker_command(run, resume), stdin=subprocess.DEVNULL,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                 preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
    signal.signal(signal.SIGTERM, lambda signum, frame: job.ranks.send_signal(signal.SIGTERM))
    try:
        while job.ranks.poll() is None:  # a sleep loop, so a signal handler may reap the ranks itself
            time.sleep(0.2)
    except SystemExit:  # submitit's preemption handler, after checkpoint() stopped the ranks
        if not job.preempted:
            raise
        run.write_status(state="queued", pid=None, heartbeat=None, ended=None, exit_code=None, error=None,
                         requeued=time.time(), requeues=int(run.status().get("requeues") or 0) + 1)
        print(f"fslab: job {job_id} preempted or out of time; requeued to resume from the last checkpoint",
              file=sys.stderr, flush=True)
        raise
    except Exception as exc:  # submitit will not requeue (out of requeues): not the stop rank 0 recorded
        if not job.preempted:
            raise
        run.write_status(state="failed", ended=time.time(), exit_code=1, error=f"{type(exc).__name__}: {exc}")
        _fail_fast(run)
        raise
    status = run.status()
    if status.get("state") not in ENDED:  # the ranks died without a word (e.g. killed)
        status = run.write_status(state="failed", ended=time.time(), exit_code=job.ranks.returncode,
                                  error=f"torchrun exited with code {job.ranks.returncode}")
    if status["state"] == "failed":
        _fail_fast(run)
        raise FslabError(f"run {run.id} failed: {status.get('error')}")
    return status["state"]

