"""Worker processes on this machine: starting them, and stopping them.

A run's worker is ``python -m fslab.execution.worker RUN_DIR``, or for a run of
N processes the same worker under torchrun. It runs in a session of its own,
writing to the run's log files, so closing the terminal does not stop it.

A stop signals a pid only when it is surely this run's worker: the status
names this host and ``/proc/<pid>/cmdline`` runs the worker on this run's
folder. Otherwise (another host, a pid that may have been reused) it leaves
a stop request in the run folder, which the worker reads at its next
heartbeat and obeys as it would SIGTERM; where another host's worker has
written no heartbeat into the folder for three beats (a copy of it), none
would, and the stop says so rather than wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fslab.core.errors import FslabError, UsageError
from fslab.core.runstore import Run
from fslab.core.states import ENDED, HOST, LIVE, pid_alive, unended
from fslab.core.worklock import clear_stop_request, describe_holder, request_stop
from fslab.execution.torchrun import LOG_DIR as TORCHRUN_LOG_DIR

WORKER_MODULE = "fslab.execution.worker"
TORCHRUN_MODULE = "fslab.execution.torchrun"  # torch's torchrun, quiet on a stop


def worker_command(run: Run, resume: bool = False) -> list[str]:
    """``python -m fslab.execution.worker RUN_DIR``; for a run with
    ``train.processes`` N > 1, the same worker under torchrun (the venv's, as
    ``python -m fslab.execution.torchrun``: torch's, quiet on a stop), standalone
    on a free port, one process per GPU (or per gloo CPU process with device cpu), its log folder in the run's
    (``.torchrun``, removed when torchrun ends: given none, it made one in the user's ``/tmp`` and left it there)."""
    # The absolute folder, so that a stop can tell this run's worker by its command line.
    worker = ["-m", WORKER_MODULE, os.path.abspath(run.path), *(["--resume"] if resume else [])]
    processes = run.config()["train"]["processes"]
    if processes > 1:
        return [sys.executable, "-m", TORCHRUN_MODULE, "--standalone", f"--nproc-per-node={processes}",
                f"--log-dir={os.path.join(os.path.abspath(run.path), TORCHRUN_LOG_DIR)}", *worker]
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
    clear_stop_request(run.path)  # one left from an earlier life of the run must not stop this worker
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


def reap(process: subprocess.Popen) -> int:
    """Wait for a worker this process started to exit; its exit code. Not ``process.wait()``: a Ctrl-C
    that came inside ``process.poll()`` (a follower polls its worker four times a second) can be raised
    between its lock's acquire and the ``try`` that releases it, and every ``wait()`` after blocks for
    ever on that lock, the worker long gone (seen once in CI: a follower stopped by Ctrl-C never exited)."""
    if process.returncode is None:
        try:
            _, status = os.waitpid(process.pid, 0)
        except ChildProcessError:  # reaped already, by a poll() that then set returncode
            pass
        else:
            process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode


def wait_for_pid(run: Run, timeout: float = 10.0) -> int | None:
    """The worker's pid once it has marked the run running (or ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
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


def is_worker_of(pid: int, run: Run) -> bool:
    """Whether process ``pid`` (of this host) is this run's worker, or the
    torchrun that runs it: its command line runs :data:`WORKER_MODULE` on the
    run's folder. False where ``/proc`` cannot tell (another user's process,
    no ``/proc``): the caller then asks rather than signals."""
    try:
        words = [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if w]
        cwd = os.readlink(f"/proc/{pid}/cwd")  # for a folder given relative to it
    except OSError:
        return False
    target = os.path.realpath(run.path)
    return WORKER_MODULE in words and any(os.path.realpath(os.path.join(cwd, w)) == target for w in words)


def stop_worker(run: Run, grace: float = 30.0) -> str:
    """Stop a run whose worker runs, or is starting, on this host or another
    one: signal it if it is surely this run's worker here
    (:func:`signal_worker`), else leave it a stop request (:func:`ask_worker`).
    Returns the state the run ended in."""
    pid = run.status().get("pid") or wait_for_pid(run, 30.0 if _processes(run) > 1 else 10.0)  # torchrun: slower
    status = run.status()
    if status.get("state") in ENDED:
        return status["state"]
    if not pid:  # killed, unless under the status lock it shows a worker started, or its end, meanwhile
        now = run.write_status(lambda now: unended(now) and not now.get("pid"), state="killed", ended=time.time(),
                               error="stopped before the worker started")
        return now["state"] if now.get("state") in ENDED else stop_worker(run, grace)
    if status.get("host") != HOST or not is_worker_of(pid, run):
        return ask_worker(run, grace)
    return signal_worker(run, pid, grace)


def _processes(run: Run) -> int:
    """How many processes the run's worker runs (``train.processes``), or where its config.json cannot be
    read (missing, damaged, a newer fslab's), as its worker recorded them in its status (else 1): a stop
    goes by the status, which names the worker, whatever became of the configuration."""
    try:
        train = run.config().get("train")
    except FslabError:
        train = None
    processes = train.get("processes") if isinstance(train, dict) else None
    if isinstance(processes, int) and not isinstance(processes, bool):
        return processes
    recorded = run.status().get("processes")
    return recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else 1


def signal_worker(run: Run, pid: int, grace: float = 30.0) -> str:
    """SIGTERM, then wait for the worker to record ``killed``; after ``grace``
    seconds, SIGKILL it and record ``killed`` here. SIGCONT follows the
    SIGTERM, since a paused (SIGSTOP) worker cannot act on it. For a run of
    several processes the pid is torchrun's, which forwards SIGTERM to every
    rank; SIGCONT and SIGKILL, which it does not forward, go to the ranks (its
    children) too."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return run.state()
    _signal_all([pid, *child_pids(pid)], signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):  # until it exits: a resume may follow at once
        time.sleep(0.05)
    if run.status().get("state") not in ENDED:  # unended checked again under the status lock, then written
        if pid_alive(pid):
            _signal_all([pid, *child_pids(pid)], signal.SIGKILL)
            run.write_status(unended, state="killed", ended=time.time(), exit_code=-signal.SIGKILL,
                             error="did not stop within the grace period; killed")
        else:  # e.g. SIGTERM arrived before the worker could handle it
            run.write_status(unended, state="killed", ended=time.time(), exit_code=-signal.SIGTERM,
                             error="stopped before the worker could record it")
    return run.status()["state"]


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class NotStoppableHere(UsageError):
    """Another host's worker that no stop request in this folder would reach (:func:`not_beating_here`)."""


def ask_worker(run: Run, grace: float = 30.0) -> str:
    """Stop through the run folder: leave a stop request, which the worker
    reads at its next heartbeat (it then stops as on SIGTERM), and wait up to
    ``grace`` seconds for the run to end. Nothing is signalled here. Another
    host's worker that writes no heartbeat into this folder (:func:`not_beating_here`:
    a copy of the run's folder, made while it trained) is :class:`NotStoppableHere`, said as
    soon as that is known, the request taken back: it waited the whole grace."""
    if why := not_beating_here(run, run.status()):
        raise NotStoppableHere(why)
    request_stop(run.path)
    deadline, first = time.monotonic() + grace, run.status()
    while time.monotonic() < deadline:
        status = run.status()
        state = run.state(status)
        if state not in LIVE:
            return state
        if status.get("heartbeat") == first.get("heartbeat") and (why := not_beating_here(run, first)):
            clear_stop_request(run.path)  # nothing reads it here; copied back, it would stop the run there
            raise NotStoppableHere(why)
        time.sleep(0.05)
    status = run.status()
    raise FslabError(f"run {run.id}: its worker ({describe_holder(run.path, status)}) was asked to stop but has "
                     f"not within {grace:.0f} s; if it is alive it stops at its next heartbeat "
                     f"(check: fslab show {run.id})")


def not_beating_here(run: Run, status: dict) -> str | None:
    """Why another host's worker cannot be stopped from here, where ``status`` names one on another host that
    holds no lock visible here and whose heartbeat is, now, older than three of its beats (``train.heartbeat``,
    as ``fslab runs`` calls one stale): no worker would read a stop request in this folder, a copy of the run's
    (rsync while it trained); else None."""
    from fslab.core.clocks import on_writer_clock
    from fslab.core.states import heartbeat_age, heartbeat_interval
    from fslab.core.worklock import is_held

    if status.get("host") in (HOST, None) or is_held(run.path):
        return None
    try:
        interval = heartbeat_interval(run.config())
    except FslabError:  # a damaged configuration: stopped as its status says, at the default beat
        interval = heartbeat_interval({})
    age = heartbeat_age(status, on_writer_clock(run.path, status))  # on its host's clock
    if age is None or age <= max(3 * interval, 1.0):
        return None
    return (f"run {run.id} cannot be stopped from here: its worker ({describe_holder(run.path, status)}) runs on "
            f"another host and has written no heartbeat into this folder for {age:.0f} s (a copy of the run's "
            f"folder made while it trained, or a worker paused there), so it would never read a stop request; "
            f"stop it on host {status.get('host')}: fslab stop {run.id}")
