"""Runs on a SLURM cluster, submitted with submitit: ``--executor slurm``.

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

A ``--gpus N`` run's job starts torchrun on its node (:func:`run_ranks`),
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

from fslab.core.errors import ConfigError, FslabError, UsageError, did_you_mean
from fslab.core.files import atomic_write_text
from fslab.core.runstore import ENDED, Run, create_run, pid_alive

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


def job_options(settings, overrides: list[str] | None = None) -> dict:
    """``[slurm]`` from fslab.toml with ``--slurm key=value`` overrides (TOML values), checked."""
    from fslab.core.config import parse_assignment
    from fslab.core.settings import SLURM_KEYS

    options = dict(settings.slurm)
    for text in overrides or []:
        path, value = parse_assignment(text)
        key = ".".join(path)
        if key not in SLURM_KEYS:
            raise ConfigError(f"unknown --slurm key '{key}'.{did_you_mean(key, SLURM_KEYS)} "
                              f"Allowed: {', '.join(sorted(SLURM_KEYS))}.")
        check, what = SLURM_KEYS[key]
        if not check(value):
            raise ConfigError(f"--slurm {key} must be {what}, got {value!r}")
        options[key] = value
    return options


def make_executor(folder: Path, options: dict, name: str):
    """A submitit executor for one run: SLURM, or the local debug executor."""
    submitit = require_submitit()
    if options["cluster"] == "local":
        executor = submitit.LocalExecutor(folder, max_num_timeout=options["max_requeues"])
        executor.update_parameters(timeout_min=options["timeout_min"], gpus_per_node=options["gpus_per_job"],
                                   signal_delay_s=options["signal_delay_s"], setup=list(options["setup"]))
        return executor
    try:
        executor = submitit.AutoExecutor(folder, cluster="slurm", slurm_max_num_timeout=options["max_requeues"])
    except RuntimeError as exc:  # no srun on this machine
        raise FslabError(f"SLURM is not available here ({exc}); to try --executor slurm on this machine, "
                         f"set [slurm] cluster = \"local\" in fslab.toml") from None
    params = {"name": name, "timeout_min": options["timeout_min"], "gpus_per_node": options["gpus_per_job"],
              "cpus_per_task": options["cpus_per_task"], "slurm_signal_delay_s": options["signal_delay_s"],
              "slurm_setup": list(options["setup"]), "slurm_additional_parameters": dict(options["sbatch"])}
    if options["partition"]:
        params["slurm_partition"] = options["partition"]
    if options["mem_gb"]:
        params["mem_gb"] = options["mem_gb"]
    executor.update_parameters(**params)
    return executor


def submit(run: Run, options: dict) -> str:
    """Submit a claimed run as one job; record the job in its status; return the job id."""
    folder = run.path / "slurm"
    executor = make_executor(folder, options, name=f"fslab-{run.id}")
    job_call = TrainingJob(str(run.path.resolve()))
    run.write_status(executor="slurm", slurm_cluster=options["cluster"])
    try:
        if options["cluster"] == "local":
            job = _submit_detached(executor, job_call, folder)
        else:
            job = executor.submit(job_call)
    except Exception as exc:  # sbatch missing, refused or unreadable: say why in one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        run.write_status(state="failed", ended=time.time(), error=f"SLURM submission failed: {reason}")
        raise FslabError(f"could not submit run {run.id}: {reason}") from None
    run.write_status(slurm_job_id=str(job.job_id))
    return str(job.job_id)


def _submit_detached(executor, job_call, folder: Path):
    """The local executor's job controller inherits our stdout and stderr;
    point them at a log file while it starts, so it never holds the
    terminal's (or a caller's pipe) open after fslab has returned."""
    folder.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(folder / "controller.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        return executor.submit(job_call)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def launch(method: str, overrides: list[dict], *, settings, registry, options: dict) -> tuple[Run, str]:
    """``fslab run --executor slurm``: resolve, create the run, claim it (no
    local scheduler may start it) and submit it."""
    from fslab.core.config import resolve

    require_submitit()  # say how to install submitit before creating anything
    config = resolve(method, registry=registry, settings=settings, overrides=overrides)
    check_job_processes(config, options)
    run = create_run(settings.runs_dir, method, config)
    run.claim()
    return run, submit(run, options)


def check_job_processes(config: dict, options: dict) -> None:
    """``--gpus N`` in a job runs torchrun on the job's node, so SLURM must
    give the job N GPUs (``gpus_per_job``); with the local executor, this
    machine must have them. CPU (gloo) processes need no GPU."""
    processes = int(config["train"].get("processes") or 1)
    if processes == 1 or config["device"] == "cpu":
        return
    if options["cluster"] == "local":
        from fslab.execution.launcher import check_processes

        check_processes(config)
    elif options["gpus_per_job"] < processes:
        raise UsageError(f"--gpus {processes} in a SLURM job needs gpus_per_job >= {processes}, got "
                         f"{options['gpus_per_job']}; pass --slurm gpus_per_job={processes} or set it in [slurm] "
                         f"of fslab.toml")


def submit_queued(runs: list[Run], options: dict) -> list[tuple[Run, str]]:
    """Submit queued runs (a sweep's): each one a local scheduler has not
    already claimed."""
    require_submitit()
    submitted = []
    for run in runs:
        if run.claim():
            submitted.append((run, submit(run, options)))
    return submitted


def requeue_for_job(run: Run) -> None:
    """Mark a stopped run queued again before it is resubmitted to resume."""
    run.write_status(state="queued", pid=None, heartbeat=None, ended=None, exit_code=None, error=None)


def _cancel_job(run: Run, status: dict) -> None:
    """``scancel`` the run's job; for the local executor, SIGTERM to the job's
    controller, which passes it on."""
    job_id = status.get("slurm_job_id")
    if status.get("slurm_cluster") == "local":
        try:
            os.kill(int(job_id), signal.SIGTERM)
        except (ProcessLookupError, TypeError, ValueError):
            pass
    else:
        require_submitit().SlurmJob(run.path / "slurm", str(job_id)).cancel(check=False)


def cancel(run: Run, grace: float = 30.0) -> str:
    """``fslab stop`` for a submitted run: cancel its job; the job records
    ``killed``. A job that never started is marked killed here."""
    status = run.status()
    job_id = status.get("slurm_job_id")
    _cancel_job(run, status)
    deadline = time.time() + grace
    while time.time() < deadline:
        status = run.status()
        if status.get("state") in ENDED:
            return status["state"]
        pid = status.get("pid")
        if not pid or (status.get("slurm_cluster") == "local" and not pid_alive(int(pid))):
            break  # not started (or gone without a word): nothing will record the end
        time.sleep(0.05)
    if run.status().get("state") not in ENDED:
        run.write_status(state="killed", ended=time.time(), pid=None, error=f"job {job_id} cancelled")
    return run.status()["state"]


def stop_sweep_after_failure(run: Run) -> list[Run]:
    """Fail-fast for a sweep of jobs, called by the job of a run that failed:
    if the run's sweep is ``fail_fast``, its runs whose jobs have not started
    end ``killed`` and their jobs are cancelled; running jobs go on, as with
    the local scheduler. Marked first, then cancelled: a job that starts in
    between finds its run ended and exits at once."""
    from fslab.execution.sweep import SWEEP_STOPPED, load_sweep

    sweep_id = run.status().get("sweep")
    if not sweep_id:
        return []
    sweep = load_sweep(run.path.parent, sweep_id)
    if not sweep.get("fail_fast"):
        return []
    stopped = []
    for other in (Run(run.path.parent / run_id) for run_id in sweep["runs"]):
        status = other.status()
        if other.id == run.id or status.get("state") != "queued" or status.get("executor") != "slurm":
            continue
        other.write_status(state="killed", ended=time.time(), error=SWEEP_STOPPED.format(run=run.id))
        _cancel_job(other, status)
        stopped.append(other)
    return stopped


def _fail_fast(run: Run) -> None:
    """stop_sweep_after_failure, never hiding the job's own failure."""
    try:
        stopped = stop_sweep_after_failure(run)
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
        log = os.open(run.path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, fd)
        os.close(log)


def run_job(job: TrainingJob) -> str:
    """The job's body: the local worker's life cycle (status, heartbeat, end
    state), plus the preemption case, where the run goes back to ``queued``."""
    from fslab.execution.worker import StatusKeeper, Stopped, record_failure, record_stop, stop_on_signals

    run = Run(Path(job.run_dir))
    state = run.status().get("state")
    if state in ENDED:  # stopped or finished while the job waited
        return state
    _log_to_run(run)
    resume = run.checkpoint_path.exists()
    if not resume and run.metrics_path.exists():
        atomic_write_text(run.metrics_path, "")  # an earlier attempt stopped before its first checkpoint
    if int(run.config().get("train", {}).get("processes") or 1) > 1:
        return run_ranks(job, run, resume)
    keeper = StatusKeeper(run, float(run.config().get("train", {}).get("heartbeat", 5.0)))
    stop_on_signals()
    job_id = require_submitit().JobEnvironment().job_id
    keeper.start(resume)
    keeper.update(slurm_job_id=job_id, attempts=int(run.status().get("attempts") or 0) + 1)
    try:
        from fslab.training.train import train

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
    import subprocess

    from fslab.execution.launcher import worker_command

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
    status = run.status()
    if status.get("state") not in ENDED:  # the ranks died without a word (e.g. killed)
        status = run.write_status(state="failed", ended=time.time(), exit_code=job.ranks.returncode,
                                  error=f"torchrun exited with code {job.ranks.returncode}")
    if status["state"] == "failed":
        _fail_fast(run)
        raise FslabError(f"run {run.id} failed: {status.get('error')}")
    return status["state"]

