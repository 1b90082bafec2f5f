"""Starting queued runs as slots free up: ``python -m fslab.execution.scheduler RUNS_DIR``.

The scheduler locks a slot's file (:mod:`fslab.execution.slots`), hands the
open file to the worker it starts, and closes its own copy, so the lock lives
exactly as long as the worker. Each run sees only its slot's GPU
(``CUDA_VISIBLE_DEVICES``, PCI bus order). A run of N processes (``--gpus N``) takes N slots at once, each on a
different GPU; runs start in queue order, so a large run is not passed over
indefinitely by smaller ones behind it.

The scheduler runs in its own session (closing the terminal does not stop the
sweep) and exits when no queued run is waiting; started workers go on alone.
Its last look at the queue, and its presence let go, happen under the lock a
command takes to hand it a run (:func:`handing_back`): a run handed back is
seen by that last look, or finds the scheduler gone (and starts it, or a scheduler). Either side waits for
that lock as long as a live process holds it, saying so once: one that went on without it would guess.
While every slot is busy it only waits: it wakes as soon as one of its workers
exits (a pidfd per worker), or after ``poll`` seconds for a slot another
scheduler's worker freed (``benchmarks/bench_scheduler.py`` times the hand-over).
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fslab.core.claims import holder_gone, read_holder
from fslab.core.errors import ConfigError, NewerConfig
from fslab.core.flocks import hold_shared, is_held, lockers, one_at_a_time
from fslab.core.flocks import read_holder as lock_holder
from fslab.core.runstore import SWEEPS, Run, run_names, start_order
from fslab.core.settings import load_settings
from fslab.core.states import HOST
from fslab.core.text import ascii_whole, count
from fslab.execution.handover import LiveWorker, launch_lock
from fslab.execution.local import start_worker
from fslab.execution.slots import Slot, capacity, configured_slots, free_slots, pick_slots, slot_env, unusable
from fslab.execution.sweep import stop_failed_sweeps


def slots_needed(run: Run) -> int:
    """How many slots the run takes (``train.processes``); a ConfigError when
    its ``config.json`` cannot say (a NewerConfig when a newer fslab wrote it)."""
    processes = run.run_config().train.processes
    if processes < 1:
        raise ConfigError(f"run {run.id}: config.json: train.processes must be at least 1, got {processes}")
    return processes


def fail_unstartable(run: Run, why: str) -> bool:
    """Fail a queued run that can never start, unless another scheduler took it first."""
    if not run.claim():
        return False
    run.write_status(state="failed", ended=time.time(), exit_code=None, error=why)
    return True


# How often a scheduler looks for runs freed by a stale claim (fslab.core.claims): that costs a read of
# each claimed run's claim and of the status of those whose taker is gone, most of a store of finished runs.
FREEING_EVERY_S = 30.0


def waiting_runs(runs_dir: Path, *, freeing: bool = True) -> list[Run]:
    """Queued runs that nobody has taken yet, oldest first (the time each was
    queued, then id: :func:`fslab.core.runstore.start_order`). Every run that
    was ever started is claimed; a claim is passed over unless its holder, of
    this host, is gone (its line read, and the status only then), and a run so
    freed is left alone where its status names a sweep whose record is not there
    (killed before writing it: a run of no recorded sweep is never started).
    Without ``freeing``, every claimed run is passed over (one ``stat`` each)."""
    found = []
    for name in run_names(runs_dir):  # an unreadable folder is skipped, never fatal
        run = Run(runs_dir / name)
        if not os.path.exists(run.path / "config.json"):
            continue
        status = run.status() if not run.claimed() else _freed(runs_dir, run) if freeing else None
        if status and status.get("state") == "queued":
            found.append((start_order(status, run.id), run))
    return [run for _, run in sorted(found, key=lambda f: f[0])]


def _freed(runs_dir: Path, run: Run) -> dict | None:
    """The status of a claimed run whose claim is stale (:meth:`Run.stale_claim`) and
    whose sweep, if it names one, is recorded; None otherwise."""
    if not holder_gone(read_holder(run.path)):  # most claimed runs: one small read
        return None
    status = run.status()
    sweep = status.get("sweep")
    if not run.waits(status) or (isinstance(sweep, str) and not (runs_dir / SWEEPS / f"{sweep}.json").exists()):
        return None
    return status


def start_in_slots(run: Run, taken: list) -> subprocess.Popen | None:
    """Start the run's worker (torchrun for several processes) holding the
    ``(slot, fd)`` locks in ``taken``, seeing only their GPUs; under the run's
    lock, and only if it still waits (see :mod:`fslab.execution.handover`).
    None, with a line in the scheduler's log, if it does not: the slots are
    freed again."""
    slots, fds = [slot for slot, _ in taken], [fd for _, fd in taken]
    env = slot_env(slots)
    try:
        with launch_lock(run):
            status = run.status()
            if status.get("state") != "queued" or status.get("pid"):
                _log(f"not started: run {run.id} is {run.state(status, locked=False)}, no longer waiting")
                return None
            return start_worker(run, resume=run.checkpoint_path.exists(), env=env, pass_fds=tuple(fds))
    except LiveWorker as refused:
        _log(f"not started: {refused}")
        return None
    finally:
        for fd in fds:
            os.close(fd)  # the worker's inherited copies now hold the locks


def _log(line: str) -> None:
    print(_logged(line), flush=True)


def _logged(line: str) -> str:
    """``line`` as the scheduler's log says it: the time, then who says it."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} scheduler {os.getpid()}: {line}"


def schedule(runs_dir: Path, slots: list[Slot], poll: float = 0.2, presence: Presence | None = None) -> int:
    """Start waiting runs until none is left; returns how many were started.

    The store is listed only when a slot is free, so a scheduler waiting on
    busy slots costs next to nothing however many runs the store holds; it
    wakes the moment one of its own workers exits (``pidfd``), and every
    ``poll`` seconds for slots freed by other schedulers' workers. It exits
    only after a last look under the hand-back lock, letting go of its
    ``presence`` there (:func:`_leave_if_idle`)."""
    folder = runs_dir / ".slots"
    started, children = 0, []
    newer: set[str] = set()  # queued by a newer fslab: passed over, once told in the log
    broken: set[str] = set()  # slots whose lock file cannot be opened: passed over, once told in the log
    next_freeing = 0.0  # stale claims are looked for at the first listing, every FREEING_EVERY_S, and before exiting
    while True:
        free = _free_slots(folder, slots, broken)
        if not free and not children and len(broken) == len(slots):
            _log("no slot can be used; the queued runs wait for a scheduler started once the slots are mended")
            return started
        if free:
            stop_failed_sweeps(runs_dir)
            freeing = time.monotonic() >= next_freeing
            next_freeing = time.monotonic() + FREEING_EVERY_S if freeing else next_freeing
            waiting = [run for run in waiting_runs(runs_dir, freeing=freeing) if run.id not in newer]
            for process in _start_waiting(waiting, free, slots, newer):
                children.append(Child(process))
                started += 1
            if all(run.id in newer for run in waiting):
                if _leave_if_idle(runs_dir, newer, presence):
                    for child in children:
                        child.close()
                    return started
                next_freeing = 0.0  # a run handed back (or freed) meanwhile: looked for again, at once
                continue
        children = wait_for_exit(children, poll)


def _start_waiting(waiting: list[Run], free: list, slots: list[Slot], newer: set[str]) -> list[subprocess.Popen]:
    """Start the ``waiting`` runs, in order, in the ``free`` ``(slot, fd)`` pairs (each run's worker holds
    those it takes; the fds of the rest are closed): up to the first that does not fit, which the runs
    behind it wait for. A run of a newer fslab is passed over (named in ``newer``), a damaged one failed."""
    processes = []
    for run in waiting:
        try:
            need = slots_needed(run)
        except NewerConfig as error:  # a newer fslab's scheduler starts it
            newer.add(run.id)
            _log(f"not started: {error}")
            continue
        except ConfigError as error:  # damaged: it can never start, and must not hold up the queue
            if fail_unstartable(run, f"not started: {error}"):
                _log(f"not started: {error}")
            continue
        if need > capacity(slots):  # e.g. fslab.toml changed since the sweep was queued
            fail_unstartable(run, f"needs {need} slots on different GPUs; this scheduler has {capacity(slots)}")
            continue
        taken = pick_slots(free, need)
        if taken is None:
            break  # it waits for more slots, and the runs behind it wait for it
        if not run.claim():  # another scheduler took it first
            continue
        free = [pair for pair in free if pair not in taken]
        process = start_in_slots(run, taken)
        if process is not None:
            processes.append(process)
    for _, fd in free:  # slots this round left unused
        os.close(fd)
    return processes


def _leave_if_idle(runs_dir: Path, newer: set[str], presence: Presence | None) -> bool:
    """Whether no run waits for this scheduler (but those of a newer fslab, ``newer``), told by a last look
    under the hand-back lock (:func:`handing_back`), stale claims looked for too; where none does, its
    ``presence`` is let go under that same lock, so that a command handing a run back either did so before
    this look, which sees the run, or finds no scheduler running after it."""
    with _handback_held(runs_dir, lambda held: _logged(f"waiting for the hand-back lock {held}; its last look at "
                                                       f"the queue comes once it is let go")):
        if any(run.id not in newer for run in waiting_runs(runs_dir)):
            return False
        if presence is not None:
            presence.leave()
    return True


def _free_slots(folder: Path, slots: list[Slot], broken: set[str]) -> list[tuple[Slot, int]]:
    """The slots free now, each with its locked descriptor (:func:`fslab.execution.slots.free_slots`). A slot
    whose lock file cannot be opened (replaced by a folder, say) is left out and named in ``broken``, and in
    the log the first time; the other slots go on."""
    errors: dict[str, OSError] = {}
    free = free_slots(folder, slots, errors)
    for name, error in errors.items():
        if name not in broken:
            _log(f"slot {name} not used: {unusable(folder, error)}")
    broken.clear()  # the slots unusable now: one usable again is told again should it break
    broken.update(errors)
    return free


class Child:
    """A started worker and, where the OS offers one, a descriptor that
    becomes readable when it exits."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        try:
            self.fd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3
            self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def wait_for_exit(children: list[Child], timeout: float) -> list[Child]:
    """Sleep until one of ``children`` exits or ``timeout`` passes; return
    those still running (finished ones are reaped)."""
    fds = [c.fd for c in children if c.fd is not None]
    if fds:
        select.select(fds, [], [], timeout)
    else:
        time.sleep(timeout)
    running = []
    for child in children:
        if child.process.poll() is None:
            running.append(child)
        else:
            child.close()
    return running


def presence_path(runs_dir: Path) -> Path:
    """The file every living scheduler of ``runs_dir`` holds a shared lock on."""
    return runs_dir / ".slots" / "schedulers.lock"


def handback_path(runs_dir: Path) -> Path:
    """The lock file of :func:`handing_back`, which a scheduler's last look holds too."""
    return runs_dir / ".slots" / "handback.lock"


class Presence:
    """A scheduler's shared lock on :func:`presence_path`, held from its start until it leaves
    (:meth:`leave`): ``fslab queue``, ``fslab resume`` and ``fslab sweep resume`` tell from it that a
    scheduler lives (:func:`scheduler_running`). Where no lock can be had, none is seen."""

    def __init__(self, runs_dir: Path) -> None:
        self.fd = hold_shared(presence_path(runs_dir))

    def leave(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def scheduler_running(runs_dir: Path) -> bool | None:
    """Whether a scheduler of ``runs_dir`` is alive (one started by an fslab that held no such
    lock is not seen); None where it cannot be told."""
    return is_held(presence_path(runs_dir))


@contextlib.contextmanager
def handing_back(runs_dir: Path, name: str, what: str = "the run") -> Iterator[bool | None]:
    """Held while a run is handed to the store's scheduler (queued again, or a queued run let go of), yielding
    whether one is running (:func:`scheduler_running`). A scheduler takes its last look at the queue and lets
    go of its presence under the same lock (:func:`_leave_if_idle`), so one seen running here looks again
    after this is let go, and starts a run handed to it inside; one seen gone starts nothing more. The lock
    is waited for as long as a live process holds it (:func:`_handback_held`), never taken as let go after a
    while (a scheduler then seen running may be on its way out); the wait is said once on stderr, beginning
    with ``name`` (the run's id, or the sweep's) and naming ``what`` is handed. Where the lock cannot be had
    (no ``flock``, no ``.slots`` folder: no scheduler ever ran), it goes on without it."""
    with _handback_held(runs_dir, lambda held: f"{name}: waiting for the hand-back lock {held}, to tell whether a "
                                               f"scheduler will start {what}"):
        yield scheduler_running(runs_dir)


@contextlib.contextmanager
def _handback_held(runs_dir: Path, waiting: Callable[[str], str]) -> Iterator[None]:
    """The hand-back lock, ``runs/.slots/handback.lock``, held (:func:`fslab.core.flocks.one_at_a_time`): where
    another process holds it, ``waiting(HELD)`` is said once on stderr, HELD naming the file, its holder and what
    the holder does there (:func:`_holding`), and the lock is waited for in the kernel, for as long as that
    process lives and holds it (a Ctrl-C stops the wait)."""
    path = handback_path(runs_dir)
    with one_at_a_time(path, lambda pid: waiting(f"{path}{pid}, held by {_holding(runs_dir)}")):
        yield


def _holding(runs_dir: Path) -> str:
    """What the holder of the hand-back lock does, as the file names it: a scheduler of this host (it holds
    :func:`presence_path`) takes its last look at the queue; another process hands a run to the scheduler."""
    words = lock_holder(handback_path(runs_dir))
    pid = ascii_whole(words[0]) if len(words) >= 2 and words[1] == HOST else None
    schedulers = lockers(presence_path(runs_dir)) if pid is not None else None
    if schedulers is None:
        return "a scheduler taking its last look at the queue or a command handing a run to it"
    if pid in schedulers:
        return "the scheduler taking its last look at the queue"
    return "a command handing a run to the scheduler"


def start_scheduler(runs_dir: Path) -> subprocess.Popen:
    """A scheduler in its own session, logging to ``runs/sweeps/scheduler.log``."""
    log_dir = runs_dir / "sweeps"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "scheduler.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "fslab.execution.scheduler", str(runs_dir)], stdout=log,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fslab.execution.scheduler RUNS_DIR", file=sys.stderr)
        return 2
    runs_dir = Path(argv[0])
    slots = configured_slots(load_settings().scheduler)
    (runs_dir / ".slots").mkdir(parents=True, exist_ok=True)
    presence = Presence(runs_dir)  # fslab queue and resume tell from it whether a scheduler lives
    try:
        started = schedule(runs_dir, slots, presence=presence)
    finally:
        presence.leave()
    _log(f"started {count(started, 'run')}; none waiting")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
