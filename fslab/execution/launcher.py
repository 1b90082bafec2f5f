"""Starting, following and stopping training workers (real subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from fslab.core.errors import UsageError
from fslab.core.runstore import ENDED, Run, create_run, pid_alive


def worker_command(run: Run, resume: bool = False) -> list[str]:
    """``python -m fslab.execution.worker RUN_DIR``; for a run with ``train.processes``
    N > 1, the same worker under torchrun (the venv's, as ``python -m
    torch.distributed.run``), standalone on a free port, one process per GPU
    (or per gloo CPU process with device cpu)."""
    worker = ["-m", "fslab.execution.worker", str(run.path), *(["--resume"] if resume else [])]
    processes = run.config().get("train", {}).get("processes", 1)
    if processes > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={processes}", *worker]
    return [sys.executable, *worker]


def check_dataset(config: dict, registry) -> None:
    """Build the run's dataset once here when it registered ``check_early=True``:
    its constructor only checks its parameters and looks for its files, so a
    wrong root, a missing file or impossible sizes are one line now, not a
    failed run. Lazy targets are left to the worker (importing them could pull
    in torch)."""
    from fslab.core.registry import create_dataset

    component = registry.get("dataset", config["dataset"]["name"])
    if component.info.get("check_early") and not isinstance(component.target, str):
        create_dataset(registry, config)


def check_processes(config: dict) -> None:
    """A UsageError unless this machine can run ``train.processes`` (--gpus):
    as many visible GPUs, or any number of CPU processes with device cpu."""
    processes, device = config["train"].get("processes", 1), config["device"]
    if processes == 1 or device == "cpu":
        return
    if device not in ("auto", "cuda"):
        raise UsageError(
            f"--gpus {processes} trains on the first {processes} visible GPUs, but device is '{device}'; "
            f"use --device cuda (or auto) and choose GPUs with CUDA_VISIBLE_DEVICES"
        )
    from fslab.execution.scheduler import visible_gpus

    have = len(visible_gpus())
    if have < processes:
        raise UsageError(
            f"--gpus {processes} needs {processes} GPUs but {have} {'is' if have == 1 else 'are'} visible here; "
            f"use --gpus {max(have, 1)}, or --device cpu --gpus {processes} for {processes} gloo processes "
            f"on the CPU (slow; for testing)"
        )


def start_worker(run: Run, resume: bool = False, env: dict | None = None, pass_fds=()) -> subprocess.Popen:
    """Start the run's worker (:func:`worker_command`) in its own session,
    output to the run's log files, so closing the terminal does not stop it.
    With ``resume``, the worker continues from the run's last checkpoint;
    ``env`` adds variables, ``pass_fds`` hands it open files (a scheduler's
    slot lock)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if run.status().get("slurm_job_id"):  # once a SLURM job, now resumed here: stop must not scancel
        run.write_status(executor="local", slurm_job_id=None)
    with open(run.path / "stdout.log", "ab") as out, open(run.path / "stderr.log", "ab") as err:
        return subprocess.Popen(
            worker_command(run, resume),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            pass_fds=tuple(pass_fds),
        )


def check_resumable(run: Run) -> None:
    """A run can resume if it stopped (killed, lost or failed) after at least
    one checkpoint; otherwise say why not."""
    state = run.state()
    if state not in ("killed", "lost", "failed"):
        raise UsageError(f"run {run.id} is {state}; only killed, lost or failed runs can resume")
    if not run.checkpoint_path.exists():
        raise UsageError(
            f"run {run.id} has no checkpoint (it stopped before its first epoch ended); "
            f"start it again with: fslab run {run.config().get('method', 'METHOD')}"
        )


def launch(method: str, overrides: list[dict], *, settings, registry) -> tuple[Run, subprocess.Popen]:
    """Resolve the configuration, create the run folder and start its worker:
    what ``fslab run`` and the dashboard's launch form both do."""
    from fslab.core.config import resolve

    config = resolve(method, registry=registry, settings=settings, overrides=overrides)
    check_processes(config)
    check_dataset(config, registry)
    run = create_run(settings.runs_dir, method, config)
    run.claim()  # started here, so no scheduler may start it too
    return run, start_worker(run)


def wait_for_pid(run: Run, timeout: float = 10.0) -> int | None:
    """The worker's pid once it has marked the run running (or ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = run.status()
        if status.get("pid") or status.get("state") in ENDED:
            return status.get("pid")
        time.sleep(0.02)
    return None


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from ``/proc``; none elsewhere)."""
    children = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return children


def stop_run(run: Run, grace: float = 30.0) -> str:
    """Ask the worker to stop (SIGTERM), wait for it to record ``killed``;
    after ``grace`` seconds, SIGKILL it and record ``killed`` ourselves.
    For a run of several processes the pid is torchrun's, which forwards
    SIGTERM to every rank; SIGKILL, which it cannot forward, goes to the
    ranks (its children, in sessions of their own) too."""
    state = run.state()
    if state in ENDED or state == "lost":
        return state
    if run.status().get("slurm_job_id"):  # submitted with --executor slurm: cancel its job
        from fslab.execution.slurm import cancel

        return cancel(run, grace)
    if not run.status().get("pid") and run.claim():
        # still waiting in the queue: claiming it means no scheduler will start it
        run.write_status(state="killed", ended=time.time(), error="stopped while queued")
        return "killed"
    processes = run.config().get("train", {}).get("processes", 1)
    pid = run.status().get("pid") or wait_for_pid(run, 30.0 if processes > 1 else 10.0)  # torchrun starts slower
    if not pid:
        run.write_status(state="killed", ended=time.time(), error="stopped before the worker started")
        return "killed"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return run.state()
    deadline = time.time() + grace
    while time.time() < deadline:
        if run.status().get("state") in ENDED:
            return run.status()["state"]
        if not pid_alive(pid):
            break
        time.sleep(0.05)
    if run.status().get("state") not in ENDED:
        for victim in [pid, *child_pids(pid)]:
            if pid_alive(victim):
                os.kill(victim, signal.SIGKILL)
        run.write_status(state="killed", ended=time.time(), exit_code=-signal.SIGKILL,
                         error="did not stop within the grace period; killed")
    return run.status()["state"]
