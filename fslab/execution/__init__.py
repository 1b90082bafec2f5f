"""The execution layer: starting, stopping and resuming runs as processes,
locally (worker subprocesses, sweeps and their scheduler) or as SLURM jobs."""
