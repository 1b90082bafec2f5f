"""One worker per run: the run's worker lock and its stop request.

``runs/<id>/.worker.lock`` is held with an exclusive ``flock`` by the run's
worker (rank 0 under torchrun, the job under SLURM) from before it writes
``running`` until it exits; the kernel releases it however the worker ends,
SIGKILL included, so a held lock means a live worker and a free one (on the
worker's own host) means none. The file's one line names the holder (pid and
host), for messages. Launchers hold the same lock while they start a worker
(:mod:`fslab.execution.handover` says why that makes starting race-free).

``runs/<id>/.stop-request`` asks the worker to stop when no signal can reach
it (it runs on another host, or its pid cannot be verified): the worker looks
for it at each heartbeat and then stops exactly as on SIGTERM.

Readers probe the lock with a shared ``flock`` held for microseconds; a
worker or launcher that meets such a probe retries (:func:`take`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fslab.core.clocks import on_writer_clock
from fslab.core.files import atomic_write_json, read_json
from fslab.core.flocks import holder_line, open_kept_lock, read_holder, take_lock, unrecorded, write_holder
from fslab.core.flocks import is_held as lock_held
from fslab.core.slurm_queue import job_alive, waits_for_job
from fslab.core.states import HOST, lock_matters, process_named, run_state
from fslab.core.text import ascii_whole

LOCK_FILE = ".worker.lock"
STOP_REQUEST = ".stop-request"


def _lock_file(run_dir: str | Path) -> str:
    return os.path.join(os.fspath(run_dir), LOCK_FILE)


def take(run_dir: str | Path, wait: float = 0.0) -> int | None:
    """An open descriptor holding the run's lock exclusively, or None if
    someone else still holds it after ``wait`` seconds of retrying. Readers'
    probes hold it for microseconds, so a short wait tells them apart from a
    holder that stays. A lock file this user cannot write (another user's run, in
    a store a group shares) is locked read-only (:func:`open_kept_lock`): its line
    then is not this holder's (:func:`holder` tells)."""
    path = _lock_file(run_dir)
    return take_lock(path, wait, opener=lambda: open_kept_lock(path))


def name_holder(fd: int, pid: int | None = None) -> None:
    """Write who holds the lock (this process, or ``pid``) into the lock file."""
    write_holder(fd, holder_line(pid))


def holder(run_dir: str | Path) -> tuple[int | None, str | None]:
    """(pid, host) the lock file names, as far as it can be read; (None, None) where its line may not
    name its holder (:func:`fslab.core.flocks.unrecorded`: a file this user cannot write, which a
    holder locked read-only, writing no line, naming a process gone)."""
    path = Path(_lock_file(run_dir))
    words = read_holder(path)
    if unrecorded(path, words):
        return None, None
    pid = ascii_whole(words[0]) if words else None
    return pid, (words[1] if len(words) > 1 else None)


def is_held(run_dir: str | Path) -> bool | None:
    """True if a process holds the run's lock, False if none does, None if
    there is no lock file (a run that never started, or from before the lock)
    or on a filesystem without ``flock`` (the pid and the heartbeat decide)."""
    return lock_held(_lock_file(run_dir), exclusive=False, missing=None)


def observed_state(run_dir: str | Path, status: dict, now: float | None = None, *,
                   ahead: float | None = None) -> str:
    """:func:`fslab.core.states.run_state`, with the lock probed only for runs
    whose status says running, or queued with a pid (so listings of finished
    runs never touch a lock file), and SLURM asked only about runs queued for
    a job that has not started their worker. ``now``, this host's present, is
    taken to the clock that wrote the status (:func:`fslab.core.clocks.on_writer_clock`;
    ``ahead``, how far that clock is ahead, where the caller knows it)."""
    there = on_writer_clock(run_dir, status, now, ahead)
    if not waits_for_job(status):
        return run_state(status, there, is_held(run_dir) if lock_matters(status) else None)
    if job_alive(status, there) is not False:
        return run_state(status, there)
    # The job is gone: unless its worker wrote a new state meanwhile (between our reading and SLURM's answer), lost.
    again = read_json(os.path.join(os.fspath(run_dir), "status.json"))
    if isinstance(again, dict) and not waits_for_job(again):
        return observed_state(run_dir, again, now)
    return run_state(status, there, job_alive=False)


def request_stop(run_dir: str | Path) -> None:
    """Ask the run's worker, wherever it runs, to stop at its next heartbeat."""
    atomic_write_json(Path(run_dir) / STOP_REQUEST, {"host": HOST, "pid": os.getpid(), "time": time.time()})


def stop_requested(run_dir: str | Path) -> dict | None:
    """The stop request left in the run folder, if there is one."""
    path = os.path.join(os.fspath(run_dir), STOP_REQUEST)
    if not os.path.exists(path):
        return None
    return read_json(path) or {}


def clear_stop_request(run_dir: str | Path) -> None:
    try:
        os.unlink(os.path.join(os.fspath(run_dir), STOP_REQUEST))
    except FileNotFoundError:
        pass


def describe_holder(run_dir: str | Path, status: dict | None = None) -> str:
    """``pid P on host H`` for messages: the lock's holder, else the status's pid (that of the run's
    ``status.json`` where ``status`` is not given)."""
    pid, host = holder(run_dir)
    if pid is None and status is None:
        status = read_json(os.path.join(os.fspath(run_dir), "status.json"))
    if pid is None and isinstance(status, dict):
        pid, host = status.get("pid"), status.get("host")
    return process_named(pid, host)
