"""Starting, following and stopping training workers (real subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from fslab.errors import UsageError
from fslab.runstore import ENDED, Run, create_run, pid_alive


def start_worker(run: Run, resume: bool = False, env: dict | None = None, pass_fds=()) -> subprocess.Popen:
    """Start ``python -m fslab.worker RUN_DIR`` in its own session, output to
    the run's log files, so closing the terminal does not stop it. With
    ``resume``, the worker continues from the run's last checkpoint; ``env``
    adds variables, ``pass_fds`` hands it open files (a scheduler's slot lock)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(run.path / "stdout.log", "ab") as out, open(run.path / "stderr.log", "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "fslab.worker", str(run.path), *(["--resume"] if resume else [])],
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
    from fslab.config import resolve

    config = resolve(method, registry=registry, settings=settings, overrides=overrides)
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


def stop_run(run: Run, grace: float = 30.0) -> str:
    """Ask the worker to stop (SIGTERM), wait for it to record ``killed``;
    after ``grace`` seconds, SIGKILL it and record ``killed`` ourselves."""
    state = run.state()
    if state in ENDED or state == "lost":
        return state
    if not run.status().get("pid") and run.claim():
        # still waiting in the queue: claiming it means no scheduler will start it
        run.write_status(state="killed", ended=time.time(), error="stopped while queued")
        return "killed"
    pid = run.status().get("pid") or wait_for_pid(run)
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
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        run.write_status(state="killed", ended=time.time(), exit_code=-signal.SIGKILL,
                         error="did not stop within the grace period; killed")
    return run.status()["state"]
