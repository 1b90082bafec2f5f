"""Worker processes on this machine: starting them, and stopping them.

A run's worker is ``python -m fslab.execution.worker RUN_DIR``, or for a run of
N processes the same worker under torchrun. It runs in a session of its own,
writing to the run's log files, so closing the terminal does not stop it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from fslab.core.runstore import Run
from fslab.core.states import ENDED, HOST, pid_alive


def worker_command(run: Run, resume: bool = False) -> list[str]:
    """``python -m fslab.execution.worker RUN_DIR``; for a run with
    ``train.processes`` N > 1, the same worker under torchrun (the venv's, as
    ``python -m torch.distributed.run``), standalone on a free port, one
    process per GPU (or per gloo CPU process with device cpu)."""
    worker = ["-m", "fslab.execution.worker", str(run.path), *(["--resume"] if resume else [])]
    processes = run.config()["train"]["processes"]
    if processes > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={processes}", *worker]
    return [sys.executable, *worker]


def start_worker(run: Run, resume: bool = False, env: dict | None = None, pass_fds=()) -> subprocess.Popen:
    """Start the run's worker (:func:`worker_command`) in its own session,
    output to the run's log files, and record it: ``queued`` with its pid,
    this host and a first heartbeat. Call it holding the run's lock
    (:func:`fslab.execution.handover.launch_lock`), which makes that record
    the proof that a worker is on its way; and a worker that dies before it
    writes its own status shows as ``lost`` (its pid is gone) rather than
    queued for ever. With ``resume``, the worker continues from the run's
    last checkpoint; ``env`` adds variables, ``pass_fds`` hands it open files
    (a scheduler's slot locks)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if run.status().get("slurm_job_id"):  # once a SLURM job, now resumed here: stop must not scancel
        run.write_status(executor="local", slurm_job_id=None)
    with open(run.path / "stdout.log", "ab") as out, open(run.path / "stderr.log", "ab") as err:
        process = subprocess.Popen(
            worker_command(run, resume),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            pass_fds=tuple(pass_fds),
        )
    run.write_status(state="queued", pid=process.pid, host=HOST, heartbeat=time.time(), ended=None,
                     exit_code=None, error=None)
    return process


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


def stop_worker(run: Run, grace: float = 30.0) -> str:
    """Stop a run whose worker runs (or is starting) here: SIGTERM, then wait
    for it to record ``killed``; after ``grace`` seconds, SIGKILL it and
    record ``killed`` here. For a run of several processes the pid is
    torchrun's, which forwards SIGTERM to every rank; SIGKILL, which it
    cannot forward, goes to the ranks (its children) too."""
    processes = run.config()["train"]["processes"]
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
