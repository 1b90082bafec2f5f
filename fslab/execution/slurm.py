"""Runs on a SLURM cluster, submitted with submitit: ``--executor slurm``.
This module submits and cancels jobs; :mod:`fslab.execution.slurm_job` is
what a job runs.

Each run becomes one SLURM job that trains in the run's own folder on the
shared filesystem, exactly as a local worker does (the same status keeper and
:func:`fslab.training.train.train`); submitit's files (the pickled job, SLURM's logs)
go to ``runs/<id>/slurm/``. The job's settings come from ``[slurm]`` in
``fslab.toml``, overridden per command by ``--slurm key=value``.

Preemption and time limits use submitit's checkpointing protocol: SLURM
signals the job (USR2, ``signal_delay_s`` before its time limit, or when it is
preempted), submitit calls :meth:`TrainingJob.checkpoint`, which hands back a
new submission of the same run, and requeues the job. The run's status goes
back to ``queued`` meanwhile, and the requeued job resumes from the run's last
checkpoint (``train(run, resume=True)``), so it ends exactly where an
uninterrupted run would. ``fslab stop`` cancels the job (``scancel``).

A ``--gpus N`` run's job starts torchrun on its node (:func:`fslab.execution.slurm_job.run_ranks`),
exactly as a local ``--gpus N`` run does, and stops it on ``fslab stop`` or
before a requeue.

``[slurm] cluster = "local"`` sends the same jobs to submitit's local executor
on this machine instead: the whole path, preemption included, can be tried
(and is tested) without a cluster.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from fslab.core.assignments import parse_assignment, shown
from fslab.core.errors import ConfigError, FslabError, UsageError, did_you_mean
from fslab.core.files import NEW_FILE_MODE
from fslab.core.runstore import Run
from fslab.core.settings import SLURM_KEYS, SlurmSettings
from fslab.core.slurm_queue import user
from fslab.core.states import ENDED, pid_alive, unended
from fslab.core.worklock import clear_stop_request

EXECUTORS = ("local", "slurm")
INSTALL = "--executor slurm needs submitit; install it with: pip install 'fslab[slurm]' (or: pip install submitit)"


def check_executor(name: str) -> bool:
    """True for ``slurm``, False for ``local``; anything else is a usage error."""
    if name not in EXECUTORS:
        raise UsageError(f"unknown executor '{name}'.{did_you_mean(name, EXECUTORS)} Allowed: local, slurm.")
    return name == "slurm"


def require_submitit():
    """The submitit module, or one line saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise UsageError(INSTALL) from None
    return submitit


def job_options(settings, overrides: list[str] | None = None) -> SlurmSettings:
    """``[slurm]`` from fslab.toml with ``--slurm key=value`` overrides (TOML values), checked."""
    options = {}
    for text in overrides or []:
        path, value = parse_assignment(text, "--slurm")
        key = ".".join(path)
        if key not in SLURM_KEYS:
            raise ConfigError(f"unknown --slurm key '{key}'.{did_you_mean(key, SLURM_KEYS)} "
                              f"Allowed: {', '.join(sorted(SLURM_KEYS))}.")
        check, what = SLURM_KEYS[key]
        if not check(value):
            raise ConfigError(f"--slurm {key} must be {what}, got {shown(value)}")
        options[key] = value
    checked = settings.slurm.with_overrides(options)
    if checked.signal_delay_s >= checked.timeout_min * 60:  # SLURM would signal the job as it starts
        where = " and ".join(f"--slurm {k}" for k in ("timeout_min", "signal_delay_s") if k in options) \
            or f"[slurm] of {settings.path}"
        raise ConfigError(f"slurm signal_delay_s = {checked.signal_delay_s} must be less than the job's time limit, "
                          f"timeout_min = {checked.timeout_min} ({checked.timeout_min * 60} s; set by {where}): "
                          f"each job would be told to checkpoint and requeue as it starts; raise timeout_min or "
                          f"lower signal_delay_s")
    return checked


def check_available(options: SlurmSettings) -> None:
    """SLURM's ``srun`` must be on this machine (as submitit finds it), unless
    ``[slurm] cluster = "local"`` runs the jobs here: ``--executor slurm`` where it is not is an option this
    machine cannot take, exit code 2, as ``--device cuda`` where no GPU is."""
    if options.cluster == "local":
        return
    from submitit.slurm.slurm import SlurmExecutor

    if SlurmExecutor.affinity() < 0:
        raise UsageError("SLURM is not available here (no srun on the PATH); to try --executor slurm on this "
                         "machine, set [slurm] cluster = \"local\" in fslab.toml")


def make_executor(folder: Path, options: SlurmSettings, name: str):
    """A submitit executor for one run: SLURM, or the local debug executor."""
    submitit = require_submitit()
    if options.cluster == "local":
        executor = submitit.LocalExecutor(folder, max_num_timeout=options.max_requeues)
        executor.update_parameters(timeout_min=options.timeout_min, gpus_per_node=options.gpus_per_job,
                                   signal_delay_s=options.signal_delay_s, setup=list(options.setup))
        return executor
    check_available(options)
    executor = submitit.AutoExecutor(folder, cluster="slurm", slurm_max_num_timeout=options.max_requeues)
    params = {"name": name, "timeout_min": options.timeout_min, "gpus_per_node": options.gpus_per_job,
              "cpus_per_task": options.cpus_per_task, "slurm_signal_delay_s": options.signal_delay_s,
              "slurm_setup": list(options.setup), "slurm_additional_parameters": dict(options.sbatch)}
    if options.partition:
        params["slurm_partition"] = options.partition
    if options.mem_gb:
        params["mem_gb"] = options.mem_gb
    executor.update_parameters(**params)
    return executor


def submit(run: Run, options: SlurmSettings, job_call, *, requeue: bool = False) -> str:
    """Submit a claimed run as one job running ``job_call`` (a picklable
    callable: :class:`fslab.execution.slurm_job.TrainingJob`); record the job in
    the run's status; return the job id. With ``requeue`` (a resume), the run
    is marked queued again once SLURM is known to be there, just before the
    job goes in (a job that finds its run ended exits at once). Called
    holding the run's lock (:func:`fslab.execution.handover.launch_lock`);
    the job takes it when it starts."""
    folder = run.slurm_path
    executor = make_executor(folder, options, name=f"fslab-{run.id}")  # no SLURM here: nothing changed yet
    if requeue:
        run.write_status(state="queued", pid=None, heartbeat=None, ended=None, exit_code=None, error=None,
                         slot=None, gpus=None, slurm_job_id=None)  # the ended job must not make it look lost
    run.write_status(executor="slurm", slurm_cluster=options.cluster)
    clear_stop_request(run.path)  # one left from an earlier life of the run must not stop the job
    try:
        if options.cluster == "local":
            job = _submit_detached(executor, job_call, folder)
        else:
            job = executor.submit(job_call)
    except Exception as exc:  # sbatch missing, refused or unreadable: say why in one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        run.write_status(state="failed", ended=time.time(), error=f"SLURM submission failed: {reason}")
        raise FslabError(f"could not submit run {run.id}: {reason}") from None
    # who submitted it and when: fslab.core.slurm_queue asks squeue about this user's jobs only, after a grace
    run.write_status(slurm_job_id=str(job.job_id), slurm_user=user(), slurm_submitted=time.time())
    return str(job.job_id)


def _submit_detached(executor, job_call, folder: Path):
    """The local executor's job controller inherits our stdout and stderr;
    point them at a log file while it starts, so it never holds the
    terminal's (or a caller's pipe) open after fslab has returned."""
    folder.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(folder / "controller.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, NEW_FILE_MODE)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        return executor.submit(job_call)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def cancel_job(run: Run, status: dict) -> None:
    """``scancel`` the run's job; for the local executor, SIGTERM to the job's
    controller, which passes it on."""
    job_id = status.get("slurm_job_id")
    if status.get("slurm_cluster") == "local":
        try:
            pid = int(job_id)
        except (TypeError, ValueError):
            return
        if is_local_job_of(pid, run):  # status.json is a plain file: signal only what it truly names
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    else:
        require_submitit().SlurmJob(run.slurm_path, str(job_id)).cancel(check=False)


def is_local_job_of(pid: int, run: Run) -> bool:
    """Whether ``pid`` is submitit's local controller of a job of ``run``: its
    command line runs ``submitit.local._local`` on a folder of this run. A pid
    of 0 or below (a process group, or every process) never is."""
    if pid <= 0:
        return False
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "submitit.local._local" in text and run.id in text


def cancel(run: Run, grace: float = 30.0) -> str:
    """``fslab stop`` for a submitted run: cancel its job; the job records
    ``killed``. A job that never started is marked killed here."""
    status = run.status()
    job_id = status.get("slurm_job_id")
    cancel_job(run, status)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        status = run.status()
        if status.get("state") in ENDED:
            return status["state"]
        pid = status.get("pid")
        if not pid or (status.get("slurm_cluster") == "local" and not pid_alive(int(pid))):
            break  # not started (or gone without a word): nothing will record the end
        time.sleep(0.05)
    # unless the job recorded its own end meanwhile, checked under the status lock (not read, then written)
    return run.write_status(unended, state="killed", ended=time.time(), pid=None,
                            error=f"job {job_id} cancelled")["state"]
