"""Exclusive ``flock`` locks on lock files, and the line naming their holder;
shared ones that say a process is alive (:func:`hold_shared`, :func:`is_held`).

One helper for the run's worker lock (:mod:`fslab.core.worklock`), the
scheduler's slots (:mod:`fslab.execution.slots`), the study queue's lock
(:mod:`fslab.execution.studies`), a run's status rewrites (:func:`briefly_held`),
and the work one process does that a second would only repeat or spoil
(:func:`one_at_a_time`: an export, an embedding, a dataset's decode). The kernel releases an
``flock`` however its holder ends, SIGKILL included, so a lock is never left
behind by a dead process.

A filesystem without ``flock`` raises an OSError other than BlockingIOError
from :func:`take_lock` (its descriptor closed): each caller says what that means.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fslab.core import states
from fslab.core.files import NEW_FILE_MODE, process_gone
from fslab.core.text import ascii_whole


def open_lock(path: str | Path) -> int:
    """A read-write descriptor of the lock file at ``path``, made if missing."""
    return os.open(path, os.O_CREAT | os.O_RDWR, NEW_FILE_MODE)


def open_lock_or_read(path: str | Path) -> int | None:
    """:func:`open_lock`, or where that is refused (a lock file left by an earlier fslab, which kept
    it, owned by another user) a read-only descriptor of it: ``flock`` locks one just the same, so two
    processes still exclude each other, though the holder's line cannot be written
    (:func:`write_holder`). None where the file went between the two opens (its holder removed it:
    try again); the refusal itself where it cannot be read either or the folder cannot be written."""
    try:
        return open_lock(path)
    except PermissionError as refused:
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if os.access(Path(path).parent, os.W_OK):
                return None
            raise refused from None


def open_kept_lock(path: str | Path) -> int:
    """:func:`open_lock_or_read` for a lock file that no holder removes (a run's, a slot's): one removed
    between its two opens (by hand) is made again, by :func:`open_lock`."""
    fd = open_lock_or_read(path)
    return open_lock(path) if fd is None else fd


def _try(fd: int) -> bool:
    """Whether ``fd`` is now locked exclusively (False: another process holds
    it). Any other OSError (no ``flock`` on this filesystem) closes ``fd``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        os.close(fd)
        raise
    return True


def _is_at(fd: int, path: str | Path) -> bool:
    """Whether the open file is still the one at ``path`` (a holder may remove it when done)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def take_lock(path: str | Path, wait: float = 0.0, poll: float = 0.005, *, holder: str | None = None,
              reopen: bool = False, opener: Callable[[], int | None] | None = None) -> int | None:
    """An open descriptor holding ``path`` locked exclusively, or None (nothing
    left open) if another process still holds it after ``wait`` seconds of
    retrying every ``poll`` s. Once taken, ``holder`` (if given) becomes the
    file's line (:func:`write_holder`).

    ``opener`` opens the file (:func:`open_lock` by default); its OSErrors are
    the caller's. Without ``reopen`` the file is opened once and its lock
    retried; with it, the file is opened anew at each try (``opener`` may then
    return None: not there now, try again) and kept only while it is still the
    file at ``path``: for a lock file that its holder removes when done."""
    opener = opener or (lambda: open_lock(path))
    fd = None if reopen else opener()
    deadline = time.monotonic() + wait
    while True:
        if reopen:
            fd = opener()
        if fd is not None:
            if _try(fd) and (not reopen or _is_at(fd, path)):
                if holder is not None:
                    write_holder(fd, holder)
                return fd
            if reopen:
                os.close(fd)
        if time.monotonic() >= deadline:
            if fd is not None and not reopen:
                os.close(fd)
            return None
        time.sleep(poll)


def holder_line(pid: int | None = None, *more: str) -> str:
    """``PID HOST`` (then ``more``): who holds a lock, as its file's one line names it, this process
    (or ``pid``) on this host; :func:`read_holder` reads it back."""
    return " ".join([str(pid or os.getpid()), states.HOST, *more])


def read_holder(path: str | Path, maxsplit: int = -1) -> list[str]:
    """The words of the :func:`holder_line` in the lock file at ``path``, pid and host first (split
    as ``str.split`` splits, at most ``maxsplit`` times); ``[]`` where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().strip().split(maxsplit=maxsplit)
    except OSError:
        return []


def read_only(fd: int) -> bool:
    """Whether ``fd`` was opened to read only (:func:`open_lock_or_read`'s fallback): it writes nothing."""
    return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY


def write_holder(fd: int, line: str) -> None:
    """Make ``line`` (who holds the lock) the lock file's one line; nothing where ``fd`` is read-only
    (:func:`open_lock_or_read`): the line there is not this holder's (:func:`held_by` says so)."""
    if read_only(fd):
        return
    data = f"{line}\n".encode()
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))  # after the write: a reader never sees the file empty



@contextlib.contextmanager
def one_at_a_time(path: Path, waiting: Callable[[str], str],
                  opener: Callable[[], int | None] | None = None) -> Iterator[None]:
    """Held while this process does a piece of work that a second one must not do at the same time
    (export a run to a sink, embed a split): the second prints ``waiting(" (pid N on host H)")`` (the
    holder, as :func:`held_by` names it, or ``""``) as one line on stderr, waits, then goes on. The lock
    file, ``path``, names its holder's pid and host (a store may be shared between machines) and goes when it
    is let go, so a store keeps no trace of it; where no lock can be had (no ``flock``, a folder that
    cannot be written) the work goes on without one. A lock file this user cannot write (an earlier
    fslab's, another user's) is locked read-only (:func:`open_lock_or_read`), and stays where it
    cannot be removed either."""
    opener = opener or (lambda: open_lock_or_read(path))
    fd = None
    try:
        mine = holder_line()
        fd = take_lock(path, reopen=True, opener=opener, holder=mine)
        if fd is None:
            holder = held_by(path)
            print(waiting(f" ({holder})" if holder else ""), file=sys.stderr, flush=True)
            fd = _wait_for(path, opener, mine)
    except OSError:
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):  # another user's file in a sticky folder stays: waiters lock it
                path.unlink(missing_ok=True)  # still held: a waiter finds the file gone and opens the next one
            os.close(fd)


def _wait_for(path: Path, opener: Callable[[], int | None], holder: str) -> int:
    """A descriptor holding the :func:`one_at_a_time` lock file ``path``, waited for in the kernel (a
    blocked ``flock``, as ``/proc/locks`` shows it: no polling, and taken the moment it is let go); a file
    its holder removed meanwhile is opened anew. ``holder`` becomes its line (:func:`write_holder`)."""
    while True:
        fd = opener()
        if fd is None:  # not there this moment: the holder removed it, the next is not made yet
            time.sleep(0.005)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:  # no flock here, or a Ctrl-C while waiting
            os.close(fd)
            raise
        if _is_at(fd, path):
            write_holder(fd, holder)
            return fd
        os.close(fd)


def held_by(path: Path) -> str:
    """The holder a :func:`one_at_a_time` lock file names, for a waiting line: ``pid P on host H``
    (:func:`fslab.core.states.process_named`), ``, another machine`` after it where H is not this
    host (its pid is no process of this one's), ``pid P`` for a file of earlier versions (which named
    no host); ``""`` where the file names no one (gone meanwhile, being written). A line that may not be
    the holder's (:func:`unrecorded`: an earlier holder's, left in a file the holder locked read-only)
    is not taken at its word: the line says the holder is not recorded (:func:`not_recorded`)."""
    words = read_holder(path)
    if unrecorded(path, words):
        return not_recorded(path, words)
    if not words or ascii_whole(words[0]) is None:
        return ""
    if len(words) < 2:
        return f"pid {words[0]}"
    return states.process_named(words[0], words[1]) + (", another machine" if words[1] != states.HOST else "")


def unrecorded(path: Path, words: list[str]) -> bool:
    """Whether the line of the lock file at ``path``, ``words`` (:func:`read_holder`'s), may not name
    its holder, who may have locked the file read-only and written nothing (:func:`open_lock_or_read`),
    the line left by an earlier holder. A line naming a process of this host is the holder's only where
    that process holds a lock on the file (:func:`lockers`), or, where that cannot be told, lives; one of
    another host (or none) only where this user could write the file too, or the process it names may
    still run (:func:`fslab.core.files.process_gone`)."""
    pid = ascii_whole(words[0]) if words else None
    if pid is not None and (len(words) < 2 or words[1] == states.HOST):
        holding = lockers(path)
        if holding:
            return pid not in holding
        if not states.pid_alive(pid):
            return True
    return not _writable(path) and (pid is None or process_gone(pid, (words + [None])[1], path))


def lockers(path: Path) -> set[int] | None:
    """The pids holding an ``flock`` on the file at ``path``, as the kernel lists them (``/proc/locks``):
    empty where it lists none; None where it cannot tell (no ``/proc/locks``, the file gone, a holder
    of another pid namespace, listed without its pid)."""
    try:
        found = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            listing = fh.read()
    except OSError:
        return None
    key = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    pids = set()
    for line in listing.splitlines():
        words = line.split()
        if len(words) < 6 or words[1] != "FLOCK" or words[5] != key:  # "N: -> FLOCK ...": a waiter, not a holder
            continue
        pid = ascii_whole(words[4])
        if not pid:  # 0, or no number: a holder of another pid namespace
            return None
        pids.add(pid)
    return pids


def not_recorded(path: Path, words: list[str] | None = None) -> str:
    """What a waiting line says of an :func:`unrecorded` holder; ``words``, the file's line, where it names
    a process that does not hold the lock in a file this user could write."""
    if _writable(path) and words and ascii_whole(words[0]) is not None:
        named = states.process_named(words[0], (words + [states.HOST])[1])
        return f"its holder is not recorded: {path} names {named}, an earlier holder, which does not hold it"
    return f"its holder is not recorded: {path} cannot be written by this user"


def _writable(path: Path) -> bool:
    """Whether this user may open the file at ``path`` for writing, as :func:`open_lock` does (True where it
    is gone)."""
    try:
        os.close(os.open(path, os.O_WRONLY))
    except PermissionError:
        return False
    except OSError:
        return True
    return True


@contextlib.contextmanager
def briefly_held(path: str | Path, wait: float = 10.0) -> Iterator[bool]:
    """Held around a read-modify-write of a small file that several processes update (a run's
    ``status.json``): a second holder waits for the first, so neither's fields are lost. The lock
    file stays (removing it would let a waiter lock a file no longer at ``path``). Yields whether
    the lock is held: where it cannot be (a folder that cannot be written, a full disk, no
    ``flock``), or its holder keeps it past ``wait`` seconds (a process paused with SIGSTOP in the
    middle of its update), the update goes on without it, as before locks: an end state recorded
    is worth more. A lock file this user cannot write (another user's, in a store a group shares) is
    locked read-only (:func:`open_kept_lock`). The descriptor is closed however the update ends, a
    signal's exception included."""
    try:
        fd = open_kept_lock(path)
    except OSError:
        yield False
        return
    try:
        yield _locked_within(fd, wait)
    finally:
        os.close(fd)


def _locked_within(fd: int, wait: float) -> bool:
    """Whether ``fd`` could be locked exclusively within ``wait`` seconds (False too where ``flock`` fails)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        except OSError:
            return False
        time.sleep(0.002)


def hold_shared(path: str | Path) -> int | None:
    """A descriptor holding a shared lock on ``path`` for as long as it stays open (the
    process's life): any number of holders at once, each seen by :func:`is_held`. A lock file
    this user cannot write (another user's) is locked read-only (:func:`open_kept_lock`). None
    where the lock cannot be taken (no ``flock`` on this filesystem, a file it cannot read either)."""
    try:
        fd = open_kept_lock(path)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an is_held() probe holds it, a moment
    except OSError:
        os.close(fd)
        return None
    return fd


def is_held(path: str | Path, *, exclusive: bool = True, missing: bool | None = False) -> bool | None:
    """Whether a live process holds a lock on ``path`` (``missing`` where there is no file); None
    where it cannot be told (no ``flock`` here, no permission). The probe tries a lock of its own and
    lets it go at once: an exclusive one sees shared holders too; a shared one (``exclusive=False``)
    sees only an exclusive holder, and never makes one that is trying to take it fail."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return missing
    except OSError:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # the probe's own lock, if taken, goes with it
    return False
