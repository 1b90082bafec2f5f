"""Who holds a queued run's claim (``runs/<id>/.claimed``), and when that claim is stale.

A queued run is claimed (``O_EXCL``: one taker only) by whoever will start its
worker or end it: ``fslab run``, a scheduler, a sweep or study while it writes
its record, ``fslab stop``. The file's one line names the holder::

    PID TIME HOST START [slurm]

``START`` is the holder's start time in clock ticks since boot (field 22 of
``/proc/PID/stat``; ``-`` where it cannot be read), so a pid reused by another
process is told from the holder. ``slurm`` marks a claim taken to submit a SLURM
job, which may exist although its submitter is gone: such a claim is never stale.
Files written before the holder was named hold ``PID TIME`` only; their host is
unknown, so they are never judged stale either.

A claim is stale when its holder was on this host and is gone (its pid not
alive, or alive with another start time) while the run still waits: queued,
with no worker's pid, no SLURM job, and no process holding its worker lock.
Such a run is free again: :func:`take_stale` hands it to exactly one new taker.

A claim file that holds no line (empty, or NUL bytes only: its taker was killed between making the file and
writing its line, a few system calls apart) names no holder to judge; it held its run for good, no scheduler
taking it. It is stale once it has stayed so for :data:`UNWRITTEN_GRACE_S` on the clock that stamps the
store's files (:func:`fslab.core.files.filesystem_now`, as :mod:`fslab.core.clocks` measures a heartbeat's
age) while the run still waits. A damaged line (words, but no pid), or a file that cannot be read, is left to
a person (:func:`damaged_claim` says what is wrong): whose it was cannot be told. ``fslab queue``, ``fslab runs``,
``fslab show``, ``fslab resume`` and the dashboard's run screen say so in one line
(:meth:`fslab.core.runstore.Run.claim_problem`), ``fslab stop`` stops it at once.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fslab.core.files import atomic_write_text, filesystem_now
from fslab.core.flocks import read_only
from fslab.core.states import HOST, pid_alive, process_named, process_start
from fslab.core.text import ascii_whole

CLAIM_FILE = ".claimed"
# How long a claim file may hold no line before it is taken for its taker's, killed before it wrote its line:
# a live taker writes it a few system calls after making the file.
UNWRITTEN_GRACE_S = 60.0


@dataclass(frozen=True)
class Holder:
    pid: int | None
    host: str | None  # None: a claim file from before the holder's host was written
    start: str | None  # None: its start time could not be read
    slurm: bool = False
    unwritten: bool = False  # its file has held no line for over UNWRITTEN_GRACE_S: its taker never wrote it

    def describe(self) -> str:
        if self.unwritten:
            return f"a process that never wrote its claim ({CLAIM_FILE} empty for over {UNWRITTEN_GRACE_S:g} s)"
        return process_named(self.pid, self.host)


def holder_line(slurm: bool = False) -> str:
    """The claim file's line naming this process."""
    pid = os.getpid()
    return f"{pid} {time.time()} {HOST} {process_start(pid) or '-'}{' slurm' if slurm else ''}\n"


def parse_holder(text: str) -> Holder:
    """The holder a claim file's line names (:func:`holder_line`); a field it cannot read is None, as in
    an older fslab's line (a pid: :func:`fslab.core.text.ascii_whole`)."""
    words = text.split()
    pid = ascii_whole(words[0]) if words else None
    host = words[2] if len(words) > 2 else None
    start = words[3] if len(words) > 3 and words[3] != "-" else None
    return Holder(pid, host, start, slurm="slurm" in words[4:])


def read_holder(run_dir: str | Path) -> Holder | None:
    """The holder the run's claim file names (:func:`unwritten_holder`: one that holds no line may be stale);
    None where there is no claim file or it cannot be read."""
    try:
        with open(os.path.join(os.fspath(run_dir), CLAIM_FILE), encoding="utf-8", errors="replace") as fh:
            return unwritten_holder(run_dir, fh.readline(), os.fstat(fh.fileno()).st_mtime)
    except OSError:
        return None


def damaged_claim(run_dir: str | Path) -> str | None:
    """What is wrong with the run's claim file where it names no taker and never will, so that no scheduler
    takes its run and no taker can be judged gone: ``holds 'x garbage', which names no process`` (a line of
    words and no pid: edited by hand, or damaged on disk) or ``cannot be read (...)``. None where there is no
    claim file, its line names a pid, or it holds no line (its taker may be writing it; one left so for
    :data:`UNWRITTEN_GRACE_S` is stale, :func:`unwritten_holder`)."""
    return read_claim(run_dir)[1]


def read_claim(run_dir: str | Path) -> tuple[Holder | None, str | None]:
    """The run's claim file read once: the holder it names (:func:`unwritten_holder`; None where there is no
    file, or it is damaged) and what is wrong with it where it names no taker and never will
    (:func:`damaged_claim`; else None)."""
    try:
        with open(os.path.join(os.fspath(run_dir), CLAIM_FILE), encoding="utf-8", errors="replace") as fh:
            line, written = fh.readline(4096), os.fstat(fh.fileno()).st_mtime
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    words = line.strip(" \t\r\n\0")
    if words and parse_holder(line).pid is None:
        return None, f"holds {(words if len(words) <= 40 else words[:40] + '...')!r}, which names no process"
    return unwritten_holder(run_dir, line, written), None


PROBLEM_MARK = "!"  # after the state of a queued run with a claim problem: queued!


def marked_state(state: str, problem: str | None) -> str:
    """A run's state as every table shows it (``fslab runs``, ``fslab queue``, the dashboard): ``queued!``
    where its claim will hold it until a person acts (``problem``: :meth:`fslab.core.runstore.Run.claim_problem`)."""
    return state + PROBLEM_MARK if problem else state


def unwritten_holder(run_dir: str | Path, line: str, written: float) -> Holder:
    """The holder a claim file's first ``line`` names (:func:`parse_holder`); one that holds nothing (empty, or
    NUL bytes only) is marked ``unwritten`` where the file (last written at ``written``, its modification time)
    was written over :data:`UNWRITTEN_GRACE_S` ago on the clock that stamps the store's files (this host's
    where no file can be made there). A damaged line (words, but no pid) is not: whose it was cannot be told."""
    holder = parse_holder(line)
    if line.strip(" \t\r\n\0"):
        return holder
    now = filesystem_now(os.path.dirname(os.path.abspath(os.fspath(run_dir))))
    return Holder(None, None, None, unwritten=(time.time() if now is None else now) - written > UNWRITTEN_GRACE_S)


def holder_gone(holder: Holder | None) -> bool:
    """Whether ``holder`` claimed on this host and is no longer running (a pid
    reused by another process counts as gone). Another host's holder, an old
    claim that names no host, and a claim taken to submit a SLURM job are never gone. A claim file left
    unwritten (:func:`unwritten_holder`) is its taker's, killed before it named itself: gone."""
    if holder is not None and holder.unwritten:
        return True
    if holder is None or holder.slurm or holder.host != HOST or holder.pid is None:
        return False
    if not pid_alive(holder.pid):
        return True
    return holder.start is not None and process_start(holder.pid) not in (None, holder.start)


def take_stale(run_dir: str | Path, still_waits, slurm: bool = False) -> Holder | None:
    """Take over the run's claim if its holder is gone (:func:`holder_gone`) and
    ``still_waits()`` (the run is queued, not started); the file is rewritten in
    place under an ``flock``, so of several takers exactly one wins, and a plain
    ``O_EXCL`` claim cannot slip in meanwhile. A claim file this user cannot write (another
    user's, in a store a group shares) is locked read-only and replaced by a new file
    (write-then-rename: another taker then finds it is no longer the file it locked).
    Returns the gone holder, or None where the claim was not taken. ``slurm``: taken to
    submit a SLURM job (:func:`holder_line`)."""
    path = os.path.join(os.fspath(run_dir), CLAIM_FILE)
    try:
        fd = os.open(path, os.O_RDWR)
    except PermissionError:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        here, mine = os.stat(path), os.fstat(fd)
        if (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
            return None  # let go (and maybe taken anew) meanwhile
        gone = unwritten_holder(run_dir, os.pread(fd, 4096, 0).decode(errors="replace").split("\n", 1)[0],
                                mine.st_mtime)
        if not holder_gone(gone) or not still_waits():
            return None
        line = holder_line(slurm)
        if read_only(fd):
            atomic_write_text(Path(path), line)
        else:  # the line first, then cut to it: a write the disk refuses leaves the gone holder's line
            os.pwrite(fd, line.encode(), 0)
            os.ftruncate(fd, len(line.encode()))
        return gone
    except OSError:
        return None
    finally:
        os.close(fd)


def lost_submission_line(ids: list[str], holders: list[Holder], again: str) -> str:
    """What to do about queued runs whose SLURM submission never recorded its job
    (:meth:`fslab.core.runstore.Run.lost_submission`), ending with the command, ``again``,
    to run once a run is freed. Their claims are never taken over by fslab: a job
    of the run may wait in SLURM's queue, and it starts the run when it runs."""
    one = len(ids) == 1
    named = ids[0] if one else "ID"
    runs = f"run {ids[0]} is queued," if one else f"{len(ids)} queued runs ({', '.join(ids)}) are"
    by = ", ".join(sorted({holder.describe() for holder in holders}))
    return (f"{runs} held by the SLURM submission of {by}, which was killed before it recorded the job: if "
            f"squeue --me --name fslab-{named} lists no job, remove runs/{named}/.claimed and run {again} again")


def stopped_submission_line(run_id: str, holder: Holder) -> str:
    """What ``fslab stop`` says of a queued run it stopped that a SLURM submission killed before it
    recorded the job held (:meth:`fslab.core.runstore.Run.lost_submission`): the job may wait in SLURM's queue."""
    return (f"run {run_id} was queued, held by the SLURM submission of {holder.describe()}, which was killed before "
            f"it recorded the job; stopped without waiting for it: if squeue --me --name fslab-{run_id} lists a job, "
            "scancel it (started, it would end at once, the run being stopped)")


def damaged_claim_line(run_dir: str | Path, damaged: str, *, stopped: bool = False) -> str:
    """What ``fslab queue`` says of a queued run whose claim names no taker and never will (``damaged``,
    :func:`damaged_claim`): no scheduler starts it until the file is removed; ``stopped``: what ``fslab stop``
    says of such a run, stopped at once (no taker will record a worker to wait for)."""
    run_id, path = os.path.basename(os.fspath(run_dir)), os.path.join(os.fspath(run_dir), CLAIM_FILE)
    if stopped:
        return (f"run {run_id} was queued and its claim file {path} {damaged} (damaged), so no scheduler would "
                f"have started it; stopped at once")
    return (f"run {run_id} will not start: its claim file {path} {damaged} (damaged, by hand or on disk); if no "
            f"fslab command is starting the run, remove the file and run fslab queue --start, or stop the run: "
            f"fslab stop {run_id}")


def held_elsewhere_line(run_dir: str | Path, holder: Holder) -> str:
    """What ``fslab queue`` says of a queued run whose claim names a taker this machine cannot tell gone
    (another host's, or a line cut short that names no host: :meth:`fslab.core.runstore.Run.held_elsewhere`)."""
    run_id, path = os.path.basename(os.fspath(run_dir)), os.path.join(os.fspath(run_dir), CLAIM_FILE)
    return (f"run {run_id} waits, held by {holder.describe()}, which this machine cannot tell gone: if it is, "
            f"remove {path} and run fslab queue --start")
