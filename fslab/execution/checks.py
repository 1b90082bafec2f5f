"""What is checked before a run is created, started or resumed, so that a
mistake is one line at the prompt rather than a run that fails later.

The same checks serve ``fslab run``, ``fslab sweep``, ``fslab resume`` and the
dashboard (all through :mod:`fslab.execution.executor`).
"""

from __future__ import annotations

import zipfile

from fslab.core.errors import UsageError
from fslab.core.registry import create_dataset
from fslab.core.runstore import Run
from fslab.core.settings import SlurmSettings
from fslab.execution.handover import refuse_if_live
from fslab.execution.slots import visible_gpus

RESUMABLE = ("killed", "lost", "failed")


def check_dataset(config: dict, registry) -> None:
    """Build the run's dataset once here when it registered ``check_early=True``:
    its constructor only checks its parameters and looks for its files, so a
    wrong root, a missing file or impossible sizes are one line now, not a
    failed run. Lazy targets are left to the worker (importing them could pull
    in torch)."""
    component = registry.get("dataset", config["dataset"]["name"])
    if component.info.get("check_early") and not isinstance(component.target, str):
        create_dataset(registry, config)


def check_processes(config: dict) -> None:
    """A UsageError unless this machine can run ``train.processes`` (--gpus):
    as many visible GPUs, or any number of CPU processes with device cpu."""
    processes, device = config["train"]["processes"], config["device"]
    if processes == 1 or device == "cpu":
        return
    if device not in ("auto", "cuda"):
        raise UsageError(
            f"--gpus {processes} trains on the first {processes} visible GPUs, but device is '{device}'; "
            f"use --device cuda (or auto) and choose GPUs with CUDA_VISIBLE_DEVICES"
        )
    have = len(visible_gpus())
    if have < processes:
        raise UsageError(
            f"--gpus {processes} needs {processes} GPUs but {have} {'is' if have == 1 else 'are'} visible here; "
            f"use --gpus {max(have, 1)}, or --device cpu --gpus {processes} for {processes} gloo processes "
            f"on the CPU (slow; for testing)"
        )


def check_job_processes(config: dict, options: SlurmSettings) -> None:
    """``--gpus N`` in a job runs torchrun on the job's node, so SLURM must
    give the job N GPUs (``gpus_per_job``); with the local executor, this
    machine must have them. CPU (gloo) processes need no GPU."""
    processes = config["train"]["processes"]
    if processes == 1 or config["device"] == "cpu":
        return
    if options.cluster == "local":
        check_processes(config)
    elif options.gpus_per_job < processes:
        raise UsageError(f"--gpus {processes} in a SLURM job needs gpus_per_job >= {processes}, got "
                         f"{options.gpus_per_job}; pass --slurm gpus_per_job={processes} or set it in [slurm] "
                         f"of fslab.toml")


def check_resumable(run: Run) -> None:
    """A run can resume if it stopped (killed, lost or failed) after at least
    one checkpoint; otherwise say why not. Called holding the run's lock
    (:func:`fslab.execution.handover.launch_lock`), so no worker holds it."""
    status = run.status()
    state = run.state(status, locked=False)
    refuse_if_live(run, state, status)
    if state not in RESUMABLE:
        raise UsageError(f"run {run.id} is {state}; only killed, lost or failed runs can resume")
    if not run.checkpoint_path.exists():
        raise UsageError(
            f"run {run.id} has no checkpoint (it stopped before its first epoch ended); "
            f"start it again with: fslab run {run.config().get('method') or 'METHOD'}"
        )
    if not zipfile.is_zipfile(run.checkpoint_path):  # torch's format is a zip archive; its end is read only
        raise UsageError(f"the checkpoint of run {run.id} is damaged ({run.checkpoint_path} is not a complete "
                         f"checkpoint file); it cannot resume")
