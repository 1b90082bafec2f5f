"""Starting queued runs as slots free up: ``python -m fslab.scheduler RUNS_DIR``.

A slot is a lock file, ``runs/.slots/<slot>.lock``, held with ``flock`` by the
worker that uses it: the scheduler locks the file, hands the open file to the
worker it starts, and closes its own copy. The kernel releases the lock when
that worker exits, however it exits (even ``kill -9``), so a slot is never
leaked and two schedulers never start runs on one slot. On a GPU machine there
are ``runs_per_gpu`` slots per GPU, and each run sees only its GPU
(``CUDA_VISIBLE_DEVICES``, PCI bus order); without GPUs, ``cpu_slots`` slots.

The scheduler runs in its own session (closing the terminal does not stop the
sweep) and exits when no queued run is waiting; started workers go on alone.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fslab.launcher import start_worker
from fslab.runstore import Run, list_runs
from fslab.settings import load_settings
from fslab.sweep import stop_failed_sweeps


@dataclass(frozen=True)
class Slot:
    name: str
    gpu: int | None = None


def visible_gpus() -> list[int]:
    """GPU indices this machine offers, without importing torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(g) for g in visible.split(",") if g.strip().isdigit()]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [i for i, line in enumerate(l for l in listing.splitlines() if l.startswith("GPU "))]


def configured_slots(scheduler: dict) -> list[Slot]:
    gpus = visible_gpus() if scheduler["gpus"] == "auto" else list(scheduler["gpus"])
    if gpus:
        return [Slot(f"gpu{g}-{k}", g) for g in gpus for k in range(scheduler["runs_per_gpu"])]
    return [Slot(f"cpu-{k}") for k in range(scheduler["cpu_slots"])]


def lock_slot(folder: Path, slot: Slot) -> int | None:
    """An open, locked descriptor of the slot's lock file, or None if taken."""
    fd = os.open(folder / f"{slot.name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def slot_in_use(folder: Path, slot: Slot) -> bool:
    fd = lock_slot(folder, slot)
    if fd is None:
        return True
    os.close(fd)
    return False


def waiting_runs(runs_dir: Path) -> list[Run]:
    """Queued runs that nobody has taken yet, oldest first."""
    return [r for r in list_runs(runs_dir) if r.status().get("state") == "queued" and not r.claimed()]


def start_in_slot(run: Run, slot: Slot, fd: int) -> subprocess.Popen:
    env = {"FSLAB_SLOT": slot.name}
    if slot.gpu is not None:
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(slot.gpu))
    try:
        return start_worker(run, resume=run.checkpoint_path.exists(), env=env, pass_fds=(fd,))
    finally:
        os.close(fd)  # the worker's inherited copy now holds the lock


def schedule(runs_dir: Path, slots: list[Slot], poll: float = 0.2) -> int:
    """Start waiting runs until none is left; returns how many were started."""
    folder = runs_dir / ".slots"
    folder.mkdir(parents=True, exist_ok=True)
    started, children = 0, []
    while True:
        stop_failed_sweeps(runs_dir)
        waiting = waiting_runs(runs_dir)
        if not waiting:
            return started
        for run in waiting:
            free = next(((s, fd) for s in slots if (fd := lock_slot(folder, s)) is not None), None)
            if free is None:
                break
            slot, fd = free
            if not run.claim():  # another scheduler took it first
                os.close(fd)
                continue
            children.append(start_in_slot(run, slot, fd))
            started += 1
        children = [c for c in children if c.poll() is None]  # reap finished workers
        time.sleep(poll)


def start_scheduler(runs_dir: Path) -> subprocess.Popen:
    """A scheduler in its own session, logging to ``runs/sweeps/scheduler.log``."""
    log_dir = runs_dir / "sweeps"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "scheduler.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "fslab.scheduler", str(runs_dir)], stdout=log,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fslab.scheduler RUNS_DIR", file=sys.stderr)
        return 2
    runs_dir = Path(argv[0])
    slots = configured_slots(load_settings().scheduler)
    started = schedule(runs_dir, slots)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} scheduler {os.getpid()}: started {started} runs; none waiting",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
