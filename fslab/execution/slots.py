"""Scheduler slots: where queued runs may run, one run per slot at a time.

A slot is a lock file, ``runs/.slots/<slot>.lock``, held with ``flock`` by the
worker that uses it: the kernel releases it when that worker exits, however it
exits, so a slot is never leaked and two schedulers never share one. On a GPU
machine there are ``runs_per_gpu`` slots per GPU; without GPUs, ``cpu_slots``.
"""

from __future__ import annotations

import errno
import itertools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fslab.core.errors import UsageError
from fslab.core.files import REFUSED
from fslab.core.flocks import is_held, open_kept_lock, take_lock
from fslab.core.settings import SchedulerSettings
from fslab.core.text import ascii_whole, count


@dataclass(frozen=True)
class Slot:
    name: str
    gpu: int | None = None


def visible_gpus() -> list[int]:
    """GPU indices this machine offers, without importing torch: those ``CUDA_VISIBLE_DEVICES`` lists where it
    is set, up to its first entry that is not an index (CUDA ignores it and those after it: ``0,2,x,3`` is
    GPUs 0 and 2; a GPU's UUID is not taken), else those ``nvidia-smi -L`` lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        indices = [ascii_whole(g.strip()) for g in visible.split(",")]
        return list(itertools.takewhile(lambda g: g is not None, indices))
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [i for i, _ in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))]


def configured_slots(scheduler: SchedulerSettings) -> list[Slot]:
    gpus = visible_gpus() if scheduler.gpus == "auto" else list(scheduler.gpus)
    if gpus:
        return [Slot(f"gpu{g}-{k}", g) for g in gpus for k in range(scheduler.runs_per_gpu)]
    return [Slot(f"cpu-{k}") for k in range(scheduler.cpu_slots)]


def check_gpus_here(scheduler: SchedulerSettings) -> None:
    """A UsageError (before a sweep or study queues anything) for GPU indices in
    ``[scheduler] gpus`` that this machine does not show: a run started on such
    a slot saw no GPU and trained on the CPU, or failed there."""
    if scheduler.gpus == "auto" or not scheduler.gpus:
        return
    here = visible_gpus()
    missing = [g for g in scheduler.gpus if g not in here]
    if missing:
        named = f"GPU{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        if here:
            shown = f"GPU{'s' if len(here) > 1 else ''} {', '.join(map(str, here))}"
            what = f"this machine shows {shown}; list only those, or set gpus = \"auto\" (every visible GPU)"
        else:
            what = "no GPU is visible here; set gpus = [] to run on CPU slots (or \"auto\")"
        raise UsageError(f"[scheduler] gpus in fslab.toml names {named}, but {what} "
                         f"(GPUs seen through CUDA_VISIBLE_DEVICES, else nvidia-smi)")


def check_local_queue(settings, processes: int) -> None:
    """Before a sweep or a study queues runs for the local scheduler: the GPUs
    ``[scheduler] gpus`` names are here, the slots can hold a run of ``processes``,
    and their lock files open. Each a UsageError in one line."""
    check_gpus_here(settings.scheduler)
    slots = configured_slots(settings.scheduler)
    check_fits(processes, slots)
    check_slot_files(settings.runs_dir, slots)


def capacity(slots: list[Slot]) -> int:
    """The most slots one run can hold together: one per GPU, or every CPU slot."""
    gpus = {s.gpu for s in slots if s.gpu is not None}
    return len(gpus) if gpus else len(slots)


def pick_slots(free: list, need: int) -> list | None:
    """``need`` of the ``(slot, fd)`` pairs in ``free``, on distinct GPUs, or
    None if they are not there."""
    picked, gpus = [], set()
    for slot, fd in free:
        if slot.gpu is None or slot.gpu not in gpus:
            picked.append((slot, fd))
            gpus.add(slot.gpu)
            if len(picked) == need:
                return picked
    return None


def slot_env(slots: list[Slot]) -> dict:
    """The variables a worker started in ``slots`` runs with: ``FSLAB_SLOT`` (recorded in its status)
    and, on GPU slots, only their GPUs visible (``CUDA_VISIBLE_DEVICES``, PCI bus order)."""
    env = {"FSLAB_SLOT": ",".join(slot.name for slot in slots)}
    if slots[0].gpu is not None:
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(str(slot.gpu) for slot in slots))
    return env


def free_slots(folder: Path, slots: list[Slot], unusable_slots: dict | None = None) -> list:
    """The ``(slot, fd)`` pairs of ``slots`` free now, each with its lock held (:func:`lock_slot`): which slots
    are free, for a scheduler's loop and for :func:`take_slots` alike. A slot whose lock file cannot be opened
    (``folder``, or the lock, replaced by something else) is passed over, its OSError kept in ``unusable_slots``
    by the slot's name where that is given (for :func:`unusable` to say it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a file in its place: each slot's open below says so
        pass
    free = []
    for slot in slots:
        try:
            fd = lock_slot(folder, slot)
        except OSError as error:
            if unusable_slots is not None:
                unusable_slots[slot.name] = error
            continue
        if fd is not None:
            free.append((slot, fd))
    return free


def take_slots(runs_dir: Path, slots: list[Slot], need: int) -> list:
    """``need`` of ``slots`` free now (:func:`free_slots`), each ``(slot, fd)`` with its lock held, on distinct
    GPUs (:func:`pick_slots`), for a run started outside a scheduler's loop (``fslab resume`` of a queued run
    whose scheduler is gone); ``[]``, nothing left locked, where they are not free."""
    free = free_slots(runs_dir / ".slots", slots)
    taken = pick_slots(free, need) or []
    for pair in free:
        if pair not in taken:
            os.close(pair[1])
    return taken


def check_fits(processes: int, slots: list[Slot]) -> None:
    """A UsageError (at sweep creation) for runs no slot set here can hold."""
    most = capacity(slots)
    if processes > most:
        what = count(most, "GPU") if any(s.gpu is not None for s in slots) \
            else f"{count(most, 'CPU slot')} (scheduler.cpu_slots in fslab.toml)"
        raise UsageError(f"--gpus {processes} (train.processes) needs {processes} slots on different GPUs (or CPU "
                         f"slots), but the scheduler has {what}; use --gpus {max(most, 1)} or fewer")


def open_slot(folder: Path, slot: Slot) -> int:
    """A descriptor of the slot's lock file, made if missing; read-only where this user
    cannot write it (another user's, in a store a group shares: :func:`open_kept_lock`,
    which ``flock`` locks the same); an OSError where it cannot be opened (:func:`unusable` says why)."""
    return open_kept_lock(folder / f"{slot.name}.lock")


def unusable(folder: Path, error: OSError) -> str:
    """What a slot ``error`` (from :func:`lock_slot`, or making ``folder``) means, in one line."""
    mend = "remove it (no run keeps anything there): fslab makes it again"
    if isinstance(error, (NotADirectoryError, FileExistsError)):
        return f"{folder} is not a folder, where the scheduler keeps its slots' lock files; {mend}"
    return f"{error.filename or folder} cannot be opened as a scheduler slot's lock file ({error.strerror}); {mend}"


def check_slot_files(runs_dir: Path, slots: list[Slot]) -> None:
    """A UsageError, before anything is queued, where a slot's lock file cannot
    be opened: the folder or a lock replaced by something else, or unwritable."""
    folder = runs_dir / ".slots"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for slot in slots:
            os.close(open_slot(folder, slot))
    except OSError as error:
        if error.errno in REFUSED:
            raise  # the store refused, not a lock file: one line naming the file, exit 1, as for a run
        raise UsageError(unusable(folder, error)) from None


def lock_slot(folder: Path, slot: Slot) -> int | None:
    """An open, locked descriptor of the slot's lock file, or None if taken
    (an OSError as :func:`open_slot`'s)."""
    return take_lock(folder / f"{slot.name}.lock", opener=lambda: open_slot(folder, slot))


def slot_in_use(folder: Path, slot: Slot) -> bool:
    fd = lock_slot(folder, slot)
    if fd is None:
        return True
    os.close(fd)
    return False


def slot_state(folder: Path, slot: Slot) -> dict:
    """``busy``: whether a worker holds the slot; None where its lock file
    cannot be opened, with the ``problem`` in one line (else None: every slot has both keys).
    On a store this user cannot write (a read-only copy, another user's), the
    lock is probed through a read-only descriptor, as a run's is."""
    try:
        return {"busy": folder.exists() and slot_in_use(folder, slot), "problem": None}
    except OSError as error:
        if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            busy = is_held(folder / f"{slot.name}.lock")
            if busy is not None:
                return {"busy": busy, "problem": None}
        return {"busy": None, "problem": unusable(folder, error)}
