"""Starting a run's worker without ever starting two.

Every path that starts a worker or a job for a run (``fslab run`` and
``resume``, the dashboard, the scheduler, a SLURM submission) and ``fslab
sweep resume``'s requeue do so inside :func:`launch_lock`:

1. take the run's worker lock (:mod:`fslab.core.worklock`), waiting out
   readers' momentary probes (and the exit of a worker that has recorded
   its end state); if it stays held, a worker lives: refuse in one line
   (:class:`LiveWorker`);
2. under the lock, read the run's state (passing ``locked=False``: the lock
   is ours, so no worker holds it) and check it may start;
3. start the worker, then record it in ``status.json`` before letting go:
   ``queued`` with the child's pid, this host and a first heartbeat
   (:func:`fslab.execution.local.start_worker`), or the SLURM job;
4. release the lock; the worker takes it (retrying while a launcher or a
   probe holds it) before it writes ``running``, and keeps it until it exits.

Why this is race-free: steps 1-3 of two launchers cannot interleave, since
each needs the lock. Whoever gets the lock second reads the first one's
record of step 3: a queued run with a live pid of this host (or a recent
heartbeat, from another host), a running run whose worker now holds the lock,
or a queued SLURM job. None of these is resumable, so it refuses, and there
is no moment between the check and the record at which a second launcher
could see the run as startable. If the started process dies before it takes
the lock, its pid is gone and the run is ``lost``, which is the truth, and
can then be resumed. A worker that still finds the lock held after
:data:`WORKER_WAIT_S` (longer than any launcher holds it) is a second
worker by mistake: it exits without touching the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from fslab.core.errors import FslabError, UsageError
from fslab.core.runstore import Run
from fslab.core.states import ENDED, LIVE, process_named
from fslab.core.worklock import describe_holder, name_holder, take

# Readers' probes hold the lock for microseconds, a launcher for the few
# milliseconds of a start and a status write: waiting this long tells a live
# worker apart from both.
LAUNCH_WAIT_S = 0.5
# A worker that has recorded its end state still holds the lock while its
# interpreter shuts down (a second or two); a launcher waits that out.
EXIT_WAIT_S = 15.0
# How long a new worker waits for its launcher to let go (a SLURM submission
# can take seconds).
WORKER_WAIT_S = 30.0


class LiveWorker(UsageError):
    """The run has a live worker: nothing may start another one."""


def live_worker_line(run: Run, who: str) -> str:
    return f"run {run.id} still has a live worker ({who}); stop it with: fslab stop {run.id}"


@contextmanager
def launch_lock(run: Run) -> Iterator[None]:
    """Hold the run's worker lock while its state is checked and a worker is
    started and recorded (see the module's docstring); :class:`LiveWorker`
    if a worker holds it."""
    try:
        fd = take(run.path, wait=LAUNCH_WAIT_S)
        if fd is None and run.status().get("state") in ENDED:
            fd = take(run.path, wait=EXIT_WAIT_S)  # its worker recorded its end and is exiting
    except OSError as exc:  # e.g. someone else's read-only store
        run.check_folder("start")
        raise FslabError(f"cannot start run {run.id}: its lock file: {exc.strerror or exc}") from None
    if fd is None:
        raise LiveWorker(live_worker_line(run, f"{describe_holder(run.path)} holds its lock"))
    try:
        name_holder(fd)
        yield
    finally:
        os.close(fd)


def refuse_if_live(run: Run, state: str, status: dict) -> None:
    """Under the lock: a queued or running run has a worker on its way (or on
    another host whose lock is not visible here); say so in the same words."""
    if state in LIVE and status.get("pid"):
        raise LiveWorker(live_worker_line(run, f"{process_named(status['pid'], status.get('host'))}, {state}"))


def take_worker_lock(run: Run, wait: float = WORKER_WAIT_S) -> int | None:
    """For the worker itself: the run's lock, taken before it writes
    ``running`` and held until the process exits (the descriptor is never
    closed). None, with a line on stderr, if another worker holds it."""
    fd = take(run.path, wait=wait)
    if fd is None:
        print(f"fslab: run {run.id} already has a live worker ({describe_holder(run.path)} holds its lock); "
              f"this process exits without touching the run", file=sys.stderr, flush=True)
        return None
    name_holder(fd)
    return fd
