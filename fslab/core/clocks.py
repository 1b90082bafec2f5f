"""How far the clock of the host that wrote a run's status is from this host's.

A run's times (its heartbeat; when it was created, started, resumed, ended; its events') are its
host's clock's. Machines that share one runs folder (NFS) may keep clocks seconds to minutes apart,
and a clock may jump (an NTP step, a VM restored from a snapshot). So a reader never compares
another host's written times with its own clock: the filesystem stamps ``status.json`` with its own
clock as it is written, and this host reads that clock's present from a file it makes there itself
(:func:`fslab.core.files.filesystem_now`). The status's last written time against its stamp gives the
writer's clock against the filesystem's, and the filesystem's present against this host's gives the
rest: :func:`clock_ahead`. A heartbeat's age, an ETA and an elapsed time of another host's live run
are then measured on the clock its times were written with (this host's present plus the
difference), and a heartbeat's age is just how long the filesystem has kept the status unwritten.
This host's runs need none of it: their times are this clock's own.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from fslab.core.files import filesystem_now
from fslab.core.states import HOST, LIVE

# Clocks closer than this are taken for one: a file's stamp may trail the clock by a few milliseconds
# (the kernel stamps files from a coarse copy of it), and this host's own precision is kept.
AGREE_WITHIN_S = 1.0
# The status fields a writer sets to its clock's present as it writes them. The worker and its launcher
# write the heartbeat with each write; a status without one was last written with the latest of the others.
WRITTEN_TIMES = ("created", "started", "resumed", "ended", "requeued", "slurm_submitted")


def written_at(status: dict) -> float | None:
    """When ``status`` was last written, on its writer's clock: its heartbeat, else the latest finite time it
    records (:data:`WRITTEN_TIMES`); None where it records none. The heartbeat first: a clock set back
    since the run started leaves a later ``started``, which no write since has set."""
    def finite(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if finite(beat := status.get("heartbeat")):
        return float(beat)
    return max((float(v) for k in WRITTEN_TIMES if finite(v := status.get(k))), default=None)


def clock_ahead(run_dir: str | Path, status: dict, written: float | None = None) -> float:
    """Seconds the clock of the host that wrote ``status`` (read from ``run_dir``'s ``status.json``, whose
    modification time is ``written``: stat'ed where not given) is ahead of this host's (negative:
    behind). 0 for a status of this host, one that records an end or waits for nothing live (whose times
    no one compares with the present), and where the file's time cannot be read. Where this host cannot
    make a file in the store (read-only, another user's) the filesystem's clock is taken for its own."""
    if status.get("host") == HOST or status.get("state") not in LIVE or (last := written_at(status)) is None:
        return 0.0
    if written is None:
        try:
            written = os.stat(os.path.join(os.fspath(run_dir), "status.json")).st_mtime
        except OSError:
            return 0.0
    store_now = filesystem_now(os.path.dirname(os.path.abspath(os.fspath(run_dir))))
    ahead = (last - written) + (0.0 if store_now is None else store_now - time.time())
    return ahead if abs(ahead) >= AGREE_WITHIN_S else 0.0


def on_writer_clock(run_dir: str | Path, status: dict, now: float | None = None, ahead: float | None = None) -> float:
    """This host's present (``now``, :func:`time.time` where None) on the clock that wrote ``status``:
    what its times are compared with. ``ahead``: :func:`clock_ahead`, found where not given."""
    now = time.time() if now is None else now
    return now + (clock_ahead(run_dir, status) if ahead is None else ahead)
