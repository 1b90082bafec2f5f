"""A run's state, told from its ``status.json`` and its worker lock.

The worker writes ``queued``, ``running`` and one end state; ``lost`` is what a
reader concludes when a queued or running run's worker is gone. The worker
holds the run's lock (:mod:`fslab.core.worklock`) for its whole life, so the
lock decides first: held, the run is live whatever its heartbeat says (a
paused worker is ``running``, its heartbeat merely stale); free on this host
while the status says ``running``, the worker is gone at once. Without that
knowledge (another host's run on a filesystem whose locks do not cross
machines, or a run from before the lock) the pid and the heartbeat decide.
Every surface (listings, the dashboard, resume and stop) asks
:func:`run_state`, so they never disagree about a run.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

STATES = ("queued", "running", "completed", "failed", "killed", "lost")
WRITTEN = ("queued", "running", "completed", "failed", "killed")  # what a status.json may say (lost: a reader's)
ENDED = ("completed", "failed", "killed")
LIVE = ("queued", "running")

RESUMABLE = ("killed", "lost", "failed")  # what fslab resume continues from its last checkpoint
# What a listing shows for a run whose configuration or status cannot be read
# (another user's folder, a damaged file); never written to a status.
UNREADABLE = "unreadable"
# A live run rewrites its heartbeat every few seconds; this long without one is lost.
LOST_AFTER_S = 120.0
HOST = socket.gethostname()


def unended(status: dict) -> bool:
    """Whether ``status`` records no end state: a stop writes ``killed`` only then
    (``Run.write_status(unended, ...)``), keeping an end its worker recorded meanwhile."""
    return status.get("state") not in ENDED


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs here and is not a zombie waiting to be reaped. A
    number no process can have (0 or less, beyond a pid's 32 bits) never runs."""
    if not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def process_named(pid: int | str | None, host: str | None) -> str:
    """``pid P on host H``: a process as every message names it, the holder of a lock or a claim, the
    writer of a temporary file (``?`` for what its file does not say). The host always: a runs folder
    or a data root may be shared between machines, where a pid alone names a different process on each."""
    return f"pid {pid if pid is not None else '?'} on host {host or '?'}"


def process_start(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of ``/proc/PID/stat``), as
    text; None where it cannot be read (no such process, no ``/proc``). A pid reused by a
    later process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def unknown_state(status: dict) -> str | None:
    """Why a run whose ``status.json`` names a state this fslab does not know (written by hand, or by a
    newer fslab) is unreadable, naming the file and the states it may say; None for any other status.
    Taken for ``lost`` it was resumable, and a ``fslab resume`` trained a completed run again."""
    state = status.get("state")
    if not isinstance(state, str) or state in STATES:
        return None
    shown = state if len(state) <= 40 else f"{state[:40]}..."
    return (f"status.json records the state {shown!r}, which this fslab does not know (a run's status says "
            f"{', '.join(WRITTEN[:-1])} or {WRITTEN[-1]}); a newer fslab may have written it, or an edit by hand")


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def lock_matters(status: dict) -> bool:
    """Whether the worker lock can change what :func:`run_state` says: only for
    a run whose status says running, or queued with a worker's pid. Finished
    runs and runs waiting for a slot (most of a listing) are never probed."""
    state = status.get("state")
    return state == "running" or (state == "queued" and bool(status.get("pid")))


def run_state(status: dict, now: float | None = None, locked: bool | None = None,
              job_alive: bool | None = None) -> str:
    """The state of a run whose status is ``status``: its recorded end state,
    or ``queued``/``running`` while its worker lives, else ``lost``;
    ``unreadable`` when the status records no state (a damaged status.json),
    or one this fslab does not know (:func:`unknown_state`), so no command
    resumes, requeues or stops a run it cannot read.

    ``locked`` is what a probe of the run's worker lock found (True: held,
    False: free, None: not probed or no lock file); ``job_alive`` what the
    scheduler said of the SLURM job a queued run waits for (False: it ended
    or is gone without starting the worker; :mod:`fslab.core.slurm_queue`).
    Both are passed in, so this stays a pure function of what the caller read."""
    state = status.get("state")
    if not isinstance(state, str) or unknown_state(status):  # missing, damaged, without a state or with one
        return UNREADABLE                                      # fslab does not know: nothing to act on
    if state in ENDED:
        return state
    pid = status.get("pid")
    if state == "queued" and not pid:  # waiting for a scheduler slot or a SLURM job, however long that takes
        return "lost" if job_alive is False else state
    if locked:  # a live worker holds the lock, even if paused and no longer beating
        return state if state in LIVE else "running"
    here = status.get("host") == HOST
    if isinstance(pid, int) and pid > 0 and here and not pid_alive(pid):
        return "lost"
    # A worker takes the lock before it writes running; the lock of a run of
    # this host is free only once that worker is gone (another host's lock
    # may not be visible from here, so there the heartbeat decides).
    if state == "running" and here and locked is False:
        return "lost"
    now = time.time() if now is None else now
    last_sign = _number(status.get("heartbeat")) or _number(status.get("created"))
    if now - last_sign > LOST_AFTER_S:
        return "lost"
    return state


def heartbeat_age(status: dict, now: float | None = None) -> float | None:
    """Seconds since the run's last heartbeat, or None if it has none."""
    beat = _number(status.get("heartbeat"))
    return None if not beat else (time.time() if now is None else now) - beat


def heartbeat_interval(config: dict) -> float:
    """``train.heartbeat`` of a run's saved configuration, or its default (5 s) where the
    file holds none that is a positive number (a damaged or hand-edited config.json)."""
    train = config.get("train")
    beat = _number(train.get("heartbeat")) if isinstance(train, dict) else None
    return float(beat) if beat and beat > 0 else 5.0


def heartbeat_stale(status: dict, interval: float, now: float | None = None) -> bool:
    """A running run whose worker missed three heartbeats of ``interval``
    seconds (``train.heartbeat``): paused (SIGSTOP) or stuck, while it still
    holds its lock, or about to be lost."""
    age = heartbeat_age(status, now)
    return status.get("state") == "running" and age is not None and age > max(3 * interval, 1.0)
